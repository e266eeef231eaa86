"""Exact checks of the imputation sampler (DESIGN 13) against the enumerated posterior of the
complete counts.

At tiny m and K the posterior of the complete counts z given the observed counts o is
P(z | o) proportional to P(o | z) P(z), where P(o | z) is the law of the perturbed counts given
the true counts (each true cell x sends its z_x records to Multinomial(z_x, A[:, x]); enumerated
by convolution) and P(z) the prior predictive: the Dirichlet-multinomial DM(z; alpha) under the
saturated Dirichlet(alpha) prior, and under the 2 x 2 independence model with the constrained
Dirichlet prior of Bayesian IPF (margins Dirichlet(2 alpha, 2 alpha), independent; see
:func:`independence_prior_predictive`) the product of two Dirichlet-multinomials of the margins
times the multinomial coefficient.

The sampler is run as N independent chains in lockstep (``chains = num_imputations = N``, one
imputation per chain after a long burn-in), so the N draws are independent, each after 150
sweeps (the per-sweep autocorrelation measured in these cases is at most 0.75, and
0.75^150 < 1e-18). The empirical law is compared with the exact one by Pearson's chi-square
test (cells with an expected count below 5 merged).

False-failure rate: every test fixes its seed and rejects at p < 1e-6 / (number of checks in the
test) (Bonferroni), so each test falsely fails with probability at most 1e-6. The planted wrong
samplers (the keep step using the diagonal a + b instead of the keep a; the records that were not
kept drawn uniformly instead of from theta; the saturated sampler against the independence
posterior) must be rejected by the same check, which shows the check has power.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from scipy import special, stats

from secure_release.mechanism.estimation import loglinear_draws
from secure_release.mechanism.estimation.imputation import impute
from secure_release.mechanism.primitives.pram import PramChannel

DRAWS = 10_000
BURN_IN = 150
FALSE_FAILURE = 1e-6

Composition = tuple[int, ...]


def compositions(total: int, parts: int) -> Iterator[Composition]:
    """Every vector of ``parts`` non-negative integers summing to ``total``."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in compositions(total - first, parts - 1):
            yield (first, *rest)


def multinomial_pmf(counts: Composition, probabilities: list[float]) -> float:
    log = math.lgamma(sum(counts) + 1) + sum(c * math.log(p) - math.lgamma(c + 1) if c else -math.lgamma(1)
                                             for c, p in zip(counts, probabilities, strict=True))  # fmt: skip
    return math.exp(log)


def perturbed_law(complete: Composition, channel: PramChannel) -> dict[Composition, float]:
    """P(o | z): the convolution over true cells x of Multinomial(z_x, A[:, x])."""
    K = len(complete)
    a, b = channel.keep, channel.off_diagonal
    law: dict[Composition, float] = {(0,) * K: 1.0}
    for x, records in enumerate(complete):
        column = [b + (a if y == x else 0.0) for y in range(K)]
        sent = {c: multinomial_pmf(c, column) for c in compositions(records, K)}
        new: dict[Composition, float] = {}
        for o, p in law.items():
            for c, q in sent.items():
                key = tuple(u + v for u, v in zip(o, c, strict=True))
                new[key] = new.get(key, 0.0) + p * q
        law = new
    return law


def log_dirichlet_multinomial(counts: Composition, alpha: float) -> float:
    """log DM(z; alpha): the prior predictive of counts under a symmetric Dirichlet(alpha)."""
    m, K = sum(counts), len(counts)
    cells = sum(math.lgamma(c + alpha) - math.lgamma(alpha) - math.lgamma(c + 1) for c in counts)
    return math.lgamma(m + 1) + math.lgamma(K * alpha) - math.lgamma(m + K * alpha) + cells


def independence_prior_predictive(counts: Composition, alpha: float) -> float:
    """log P(z) for a 2 x 2 table (codes 0..3 = (row, col) with the row most significant) under the
    independence model theta = u (x) v whose Bayesian IPF posterior draws u ~ Dirichlet(z_row +
    2 alpha) and v ~ Dirichlet(z_col + 2 alpha) independently: the prior is u ~ Dirichlet(2 alpha,
    2 alpha), v likewise, independent, so P(z) = multinomial coefficient x E[prod u^z_row] x
    E[prod v^z_col] = m!/prod z! x B(z_row + 2 alpha)/B(2 alpha) x B(z_col + 2 alpha)/B(2 alpha)."""
    table = np.asarray(counts).reshape(2, 2)
    coefficient = math.lgamma(table.sum() + 1) - sum(math.lgamma(c + 1) for c in counts)
    margins = 0.0
    for margin in (table.sum(axis=1), table.sum(axis=0)):
        prior = np.full(2, 2 * alpha)
        margins += float(np.sum(special.gammaln(margin + prior)) - special.gammaln(margin.sum() + prior.sum())
                         - np.sum(special.gammaln(prior)) + special.gammaln(prior.sum()))  # fmt: skip
    return coefficient + margins


def exact_posterior(
    observed: Composition, channel: PramChannel, log_prior: Callable[[Composition], float]
) -> dict[Composition, float]:
    """P(z | o) by enumeration of every complete table z with the same m."""
    K, m = len(observed), sum(observed)
    weights = {z: perturbed_law(z, channel).get(observed, 0.0) * math.exp(log_prior(z)) for z in compositions(m, K)}
    total = sum(weights.values())
    return {z: w / total for z, w in weights.items() if w > 0}


def chi_square_p(draws: np.ndarray, exact: dict[Composition, float]) -> float:
    """Pearson's chi-square p-value of the drawn complete tables against the exact law (cells with
    expected count < 5 pooled into one; a draw outside the exact support counts there too)."""
    n = draws.shape[0]
    observed_tables: dict[Composition, int] = {}
    for row, count in zip(*np.unique(draws, axis=0, return_counts=True), strict=True):
        observed_tables[tuple(int(v) for v in row)] = int(count)
    big = [z for z, p in exact.items() if n * p >= 5]
    expected = [n * exact[z] for z in big]
    counts = [observed_tables.get(z, 0) for z in big]
    pooled_expected = n - sum(expected)
    pooled_count = n - sum(counts)
    if pooled_expected > 1e-9:
        expected.append(pooled_expected)
        counts.append(pooled_count)
    elif pooled_count:
        return 0.0
    exp_arr, cnt_arr = np.asarray(expected), np.asarray(counts)
    statistic = float(np.sum((cnt_arr - exp_arr) ** 2 / exp_arr))
    return float(stats.chi2.sf(statistic, len(expected) - 1))


def draw_complete(observed: Composition, channel: PramChannel, seed: int, **options: object) -> np.ndarray:
    result = impute(np.asarray(observed), channel, DRAWS, np.random.default_rng(seed), chains=DRAWS,
                    burn_in=BURN_IN, spacing=1, **options)  # type: ignore[arg-type]  # fmt: skip
    assert np.all(result.imputations.sum(axis=1) == sum(observed))
    return result.imputations


SATURATED_CASES = [
    ((3, 1), 3.0, 0.5),
    ((5, 0), 3.0, 0.5),
    ((2, 1, 1), 3.0, 0.5),
    ((0, 4, 1), 3.0, 0.5),
    ((1, 1, 2), 6.0, 1.0),
]


def test_saturated_sampler_matches_the_enumerated_posterior() -> None:
    threshold = FALSE_FAILURE / len(SATURATED_CASES)
    for i, (observed, gamma, alpha) in enumerate(SATURATED_CASES):
        channel = PramChannel(gamma, len(observed))
        exact = exact_posterior(observed, channel, functools.partial(log_dirichlet_multinomial, alpha=alpha))
        draws = draw_complete(observed, channel, 100 + i, alpha=alpha)
        p = chi_square_p(draws, exact)
        assert p >= threshold, (observed, gamma, alpha, p)


def _keep_with_the_diagonal(theta: np.ndarray, keep: float, off_diagonal: float) -> np.ndarray:
    """Planted bug: pi_y built with the diagonal a + b where the keep a belongs."""
    weighted = (keep + off_diagonal) * theta
    return np.asarray(weighted / (off_diagonal + weighted))


def _rest_uniform(
    observed: np.ndarray, theta: np.ndarray, keep: float, off_diagonal: float, rng: np.random.Generator
) -> np.ndarray:
    """Planted bug: the records not kept get uniform cells instead of draws from theta."""
    kept = rng.binomial(observed[None, :], loglinear_draws.kept_probabilities(theta, keep, off_diagonal))
    rest = int(observed.sum()) - kept.sum(axis=1)
    uniform = np.full(theta.shape, 1.0 / theta.shape[1])
    return np.asarray(kept + rng.multinomial(rest, uniform), dtype=np.int64)


@pytest.mark.parametrize(
    ("name", "replacement"),
    [("kept_probabilities", _keep_with_the_diagonal), ("impute_complete_counts", _rest_uniform)],
)
def test_a_planted_wrong_sampler_is_rejected(
    monkeypatch: pytest.MonkeyPatch, name: str, replacement: Callable[..., np.ndarray]
) -> None:
    observed, gamma, alpha = (2, 1, 1), 3.0, 0.5
    channel = PramChannel(gamma, 3)
    exact = exact_posterior(observed, channel, lambda z: log_dirichlet_multinomial(z, alpha))
    monkeypatch.setattr(loglinear_draws, name, replacement)
    p = chi_square_p(draw_complete(observed, channel, 7, alpha=alpha), exact)
    assert p < FALSE_FAILURE, p


INDEPENDENCE_CASES = [((2, 0, 1, 1), 4.0, 0.5), ((0, 3, 0, 2), 4.0, 0.5)]


def test_independence_sampler_matches_the_enumerated_posterior() -> None:
    threshold = FALSE_FAILURE / len(INDEPENDENCE_CASES)
    for i, (observed, gamma, alpha) in enumerate(INDEPENDENCE_CASES):
        channel = PramChannel(gamma, 4)
        exact = exact_posterior(observed, channel, functools.partial(independence_prior_predictive, alpha=alpha))
        draws = draw_complete(observed, channel, 200 + i, alpha=alpha, model=[(0,), (1,)], sizes=(2, 2))
        p = chi_square_p(draws, exact)
        assert p >= threshold, (observed, p)


def test_the_saturated_sampler_is_rejected_against_the_independence_posterior() -> None:
    observed, gamma, alpha = INDEPENDENCE_CASES[1]
    channel = PramChannel(gamma, 4)
    exact = exact_posterior(observed, channel, lambda z: independence_prior_predictive(z, alpha))
    p = chi_square_p(draw_complete(observed, channel, 9, alpha=alpha), exact)
    assert p < FALSE_FAILURE, p


def test_the_enumeration_is_a_law() -> None:
    """The enumerated P(o | z) sums to 1 over o, and the posterior over z sums to 1."""
    channel = PramChannel(3.0, 3)
    for z in itertools.islice(compositions(4, 3), 6):
        assert math.isclose(sum(perturbed_law(z, channel).values()), 1.0, rel_tol=1e-12)
    posterior = exact_posterior((2, 1, 1), channel, lambda z: log_dirichlet_multinomial(z, 0.5))
    assert math.isclose(sum(posterior.values()), 1.0, rel_tol=1e-12)
