"""Tests of (conditional) independence on PRAM-perturbed counts (mechanism/analysis/association.py).

Exact checks first (closed forms at keep = 1, scipy's G-test, the multinomial log-pmf, the null
fit's optimality), then bounded calibration under H0 by simulation with fixed seeds and stated
false-failure rates (Bonferroni-split, 1e-6 per test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from secure_release.mechanism.analysis import association as assoc
from secure_release.mechanism.errors import (
    EmptySampleError,
    EmptyStratumError,
    InvalidCountsError,
    InvalidDrawsError,
    InvalidKeepError,
    TooFewLevelsError,
    UnknownTestMethodError,
)
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy.accounting import gamma_from_epsilon


def _product(rng: np.random.Generator, shape: tuple[int, int, int], concentration: float = 4.0) -> np.ndarray:
    """A random point of the null model: p_ijl = s_l u_il v_jl."""
    n_i, n_j, n_l = shape
    s = rng.dirichlet(np.full(n_l, concentration))
    u = rng.dirichlet(np.full(n_i, concentration), size=n_l).T
    v = rng.dirichlet(np.full(n_j, concentration), size=n_l).T
    return s[None, None, :] * u[:, None, :] * v[None, :, :]


def _observe(rng: np.random.Generator, p: np.ndarray, m: int, keep: float, size: int | None = None) -> np.ndarray:
    """Draw m records i.i.d. from p, then the channel (keep w.p. a, else a uniform cell)."""
    shape = p.shape if size is None else (size, *p.shape)
    cells = rng.choice(p.size, size=(1 if size is None else size, m), p=p.reshape(-1) / p.sum())
    kept = rng.random(cells.shape) < keep
    cells = np.where(kept, cells, rng.integers(0, p.size, cells.shape))
    offsets = np.arange(cells.shape[0])[:, None] * p.size
    return np.bincount((cells + offsets).reshape(-1), minlength=cells.shape[0] * p.size).reshape(shape)


# ----------------------------------------------------------------------------- exact checks


def test_keep_one_fit_is_the_closed_form_independence_fit() -> None:
    rng = np.random.default_rng(1)
    for shape in [(2, 2, 1), (3, 4, 1), (2, 3, 5)]:
        table = rng.integers(1, 40, size=shape)
        n = table.astype(float)
        expected = n.sum(axis=1, keepdims=True) * n.sum(axis=0, keepdims=True) / n.sum(axis=(0, 1)) / n.sum()
        np.testing.assert_allclose(assoc.fit_conditional_independence(table, 1.0), expected, rtol=1e-12)
        np.testing.assert_allclose(assoc.independence_fit(n), expected, rtol=1e-12)


def test_keep_one_statistic_is_scipys_g_test() -> None:
    rng = np.random.default_rng(2)
    for shape in [(2, 2), (3, 2), (4, 5)]:
        table = rng.integers(50, 400, size=shape)
        result = assoc.independence_test(table, 1.0, method="chi2")
        g, p, dof, _ = stats.chi2_contingency(table, lambda_="log-likelihood", correction=False)
        assert result.df == dof
        assert result.statistic == pytest.approx(g, rel=1e-10)
        assert result.p_value == pytest.approx(p, rel=1e-8)
        assert result.draws == 0 and "chi-square" in result.method


def test_log_likelihood_is_the_multinomial_log_pmf_up_to_its_constant() -> None:
    rng = np.random.default_rng(3)
    for keep in [0.05, 0.4, 1.0]:
        p = _product(rng, (3, 2, 2))
        o = rng.integers(0, 9, size=p.shape)
        m = int(o.sum())
        q = keep * p + (1 - keep) / p.size
        constant = math.lgamma(m + 1) - sum(math.lgamma(x + 1) for x in o.reshape(-1))
        reference = stats.multinomial.logpmf(o.reshape(-1), m, q.reshape(-1))
        assert assoc.observed_log_likelihood(o, p, keep) + constant == pytest.approx(reference, rel=1e-12)


def _em_gain(o: np.ndarray, p: np.ndarray, keep: float) -> float:
    """How much one (monotone) EM step from p raises l: 0 at a stationary point."""
    s = p.sum(axis=(0, 1))
    u, v = p.sum(axis=1) / s, p.sum(axis=0) / s
    s2, u2, v2, before = assoc.em_map(s[None], u[None], v[None], o[None].astype(float), keep)
    after = assoc.observed_log_likelihood(o, s2[0] * u2[0][:, None, :] * v2[0][None, :, :], keep)
    return float(after - before[0])


def test_null_fit_is_the_maximum_over_the_null_model() -> None:
    # exact optimality checks on well-posed tables: the fit beats 300 random null-model points
    # and the fit from a random start, and EM (which never lowers l) cannot improve on it
    rng = np.random.default_rng(4)
    for shape, m, keep in [((3, 2, 1), 400, 0.5), ((2, 3, 3), 900, 0.3), ((4, 4, 1), 2000, 0.15)]:
        o = _observe(rng, _product(rng, shape), m, keep)
        fit = assoc.fit_conditional_independence(o, keep)
        best = assoc.observed_log_likelihood(o, fit, keep)
        assert fit.min() >= 0 and fit.sum() == pytest.approx(1, abs=1e-12)
        others = np.array([_product(rng, shape, 1.0) for _ in range(300)])
        assert np.all(assoc.observed_log_likelihood(o[None], others, keep) <= best)
        restart = assoc.fit_null_batch(o[None].astype(float), keep, others[:1], tolerance=1e-12)
        assert restart.log_likelihood[0] <= best + 1e-6
        # EM never lowers l in exact arithmetic; in floating point l (about -3,000 here) carries
        # a rounding error of a few ulps (numpy 2.4's pairwise sums gave -9e-13)
        assert -1e-14 * abs(best) <= _em_gain(o, fit, keep) <= 1e-7
        # the saturated MLE is at least as likely (G >= 0)
        result = assoc.independence_test(o, keep, method="chi2")
        assert result.statistic >= 0
        assert result.statistic == pytest.approx(
            2 * (assoc.observed_log_likelihood(o, result.saturated_fit, keep) - best), abs=1e-6
        )


def test_statistic_is_never_negative() -> None:
    rng = np.random.default_rng(5)
    tables = rng.integers(0, 6, size=(100, 3, 3, 2))
    tables[:, 0, 0, :] += 1  # no empty stratum
    for keep in [0.02, 0.3, 1.0]:
        g, null, saturated = assoc.likelihood_ratio_statistics(tables, keep)
        assert np.all(g >= 0)
        assert np.all(null >= 0) and np.allclose(null.sum(axis=(1, 2, 3)), 1)
        assert np.allclose(saturated.sum(axis=(1, 2, 3)), 1)


def test_bootstrap_p_value_is_seeded_and_on_its_grid() -> None:
    rng = np.random.default_rng(6)
    o = _observe(rng, _product(rng, (3, 2, 1)), 60, 0.4)
    first = assoc.independence_test(o, 0.4, method="bootstrap", draws=199, seed=11)
    again = assoc.independence_test(o, 0.4, method="bootstrap", draws=199, seed=11)
    assert (first.p_value, first.statistic, first.draws) == (again.p_value, again.statistic, again.draws)
    np.testing.assert_array_equal(first.null_fit, again.null_fit)
    assert "seed 11" in first.method and "Besag & Clifford" in first.method and f"{first.draws} drawn" in first.method
    h = assoc.SEQUENTIAL_EXCEEDANCES
    # Besag-Clifford's grid: h / l when stopped at draw l, else (e + 1) / 200 after all 199 draws
    stopped = first.draws < 199 and first.p_value == h / first.draws
    assert stopped or (first.draws == 199 and round(first.p_value * 200) == pytest.approx(first.p_value * 200))
    assert 1 / 200 <= first.p_value <= 1
    assert first.df == 2 and first.null_fit.shape == (3, 2, 1) and first.saturated_fit.shape == (3, 2, 1)
    assert assoc.bootstrap_p_value(5.0, [1.0, 5.0, 7.0]) == 3 / 4
    assert assoc.bootstrap_p_value(9.0, [1.0, 5.0, 7.0]) == 1 / 4


def test_sequential_p_value_is_besag_clifford() -> None:
    hits = np.zeros(99, dtype=bool)
    hits[[3, 10, 40]] = True
    assert assoc.sequential_p_value(hits, 99, stop_after=3) == (3 / 41, 41)  # stopped at draw 41
    assert assoc.sequential_p_value(hits, 99, stop_after=4) == (4 / 100, 99)  # never stopped: (3 + 1)/100
    assert assoc.sequential_p_value(hits[:41], 99, stop_after=3) == (3 / 41, 41)  # later draws not needed
    assert assoc.sequential_p_value(np.ones(5, dtype=bool), 5, stop_after=20) == (1.0, 5)
    # the batch sizes (cost only): 64, as many again while no exceedance, then 1.25 x the estimate
    sizes = [assoc.next_batch(drawn, hits) for drawn, hits in [(0, 0), (64, 0), (64, 5), (400, 19)]]
    assert sizes == [64, 64, 240, 32]  # 240 = ceil(1.25 (20 - 5) 64 / 5)
    # exact validity: with G* exchangeable with G (here i.i.d. uniform ranks), P(p <= u) <= u
    rng = np.random.default_rng(12)
    values = rng.random((20_000, 100))  # column 0 plays G, the rest 99 draws
    p = np.array([assoc.sequential_p_value(row[1:] >= row[0], 99, stop_after=5)[0] for row in values])
    for u in (0.05, 0.1, 0.5):
        # P(p <= u) <= u exactly; the count exceeds the binomial bound with probability <= 1e-7
        assert np.count_nonzero(p <= u) <= stats.binom.isf(1e-7, p.size, u)


def test_interior_null_moves_only_shares_near_the_boundary() -> None:
    rng = np.random.default_rng(13)
    p = _product(rng, (4, 3, 2))
    np.testing.assert_allclose(assoc.interior_null(p, 1.0, 100), p, rtol=1e-12)  # keep 1: every share > 2/m
    np.testing.assert_allclose(assoc.interior_null(p, 0.9, 10**9), p, rtol=1e-12)  # far from 0
    boundary = p.copy()
    boundary[0] = 0.0  # a row share at 0
    boundary /= boundary.sum()
    moved = assoc.interior_null(boundary, 0.3, 500)
    assert moved.sum() == pytest.approx(1) and moved.min() > 0
    # still a null-model point: p_ijl = p_l p_i|l p_j|l
    np.testing.assert_allclose(assoc.independence_fit(moved[None])[0], moved, rtol=1e-12)
    # the floor: FLOOR_STANDARD_ERRORS standard errors of a row share near 0
    se_row = assoc.FLOOR_STANDARD_ERRORS * math.sqrt((0.3 / 500 + 0.7 * 3 / 24) / 500) / 0.3
    strata = boundary.sum(axis=(0, 1))  # far from 0: not moved
    np.testing.assert_allclose(moved.sum(axis=(0, 1)), strata, rtol=1e-12)
    # row 0's share of each stratum raised to se_row, then the stratum's rows renormalised
    np.testing.assert_allclose(moved[0].sum(axis=0) / strata, se_row / (strata + se_row), rtol=1e-12)
    # no information: the floor is capped at the uniform share (larger shares stay larger)
    flat = assoc.interior_null(boundary, 0.01, 10)
    # keep 1: a share at 0 is still one record in m from the data, so it is floored at 2/m
    at_one = assoc.interior_null(boundary, 1.0, 1000)
    np.testing.assert_allclose(at_one[0].sum(axis=0) / strata, (2 / 1000) / (strata + 2 / 1000), rtol=1e-12)
    rows = np.maximum(boundary.sum(axis=1) / strata, 1 / 4)
    np.testing.assert_allclose(flat.sum(axis=1) / flat.sum(axis=(0, 1)), rows / rows.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(flat.sum(axis=(0, 1)), np.maximum(strata, 0.5) / np.maximum(strata, 0.5).sum())


def test_exceedances_agree_with_the_finished_fits() -> None:
    rng = np.random.default_rng(14)
    for shape, m, keep in [((3, 3, 1), 200, 0.3), ((4, 5, 2), 400, 0.1), ((10, 10, 1), 500, 0.2)]:
        tables = _observe(rng, _product(rng, shape), m, keep, size=80).astype(float)
        g = assoc.likelihood_ratio_statistics(tables, keep)[0]
        for statistic in np.quantile(g, [0.1, 0.5, 0.9]):
            fast = assoc.exceedances(tables, keep, float(statistic))
            np.testing.assert_array_equal(fast, g >= statistic - 1e-9 * max(1.0, statistic))


def test_auto_picks_chi_square_only_with_ample_information() -> None:
    rng = np.random.default_rng(7)
    p = _product(rng, (2, 2, 1), 50.0)
    big = _observe(rng, p, 20_000, 0.9)
    assert assoc.independence_test(big, 0.9).draws == 0
    small = _observe(rng, p, 60, 0.3)
    assert 0 < assoc.independence_test(small, 0.3, draws=99).draws <= 99


def test_a_strong_dependence_is_rejected() -> None:
    rng = np.random.default_rng(8)
    p = np.array([[0.45, 0.05], [0.05, 0.45]])[:, :, None]
    o = _observe(rng, p, 300, 0.5)
    # deterministic given the seeds; under this alternative E[G] is ~ 60 (df 1)
    assert assoc.independence_test(o, 0.5, method="bootstrap", draws=199).p_value == 1 / 200
    assert assoc.independence_test(o, 0.5, method="chi2").p_value < 1e-6


def test_errors_are_named() -> None:
    good = np.array([[3, 4], [5, 6]])
    with pytest.raises(TooFewLevelsError):
        assoc.independence_test(np.array([[3, 4]]), 0.5)
    with pytest.raises(InvalidCountsError):
        assoc.independence_test(np.array([[3, -1], [5, 6]]), 0.5)
    with pytest.raises(InvalidCountsError):
        assoc.independence_test(np.array([[3, 1.5], [5, 6]]), 0.5)
    with pytest.raises(InvalidCountsError):
        assoc.independence_test(np.array([[3, np.nan], [5, 6]]), 0.5)
    for keep in [0.0, -0.1, 1.0000001, math.nan, math.inf]:
        with pytest.raises(InvalidKeepError):
            assoc.independence_test(good, keep)
    with pytest.raises(EmptySampleError):
        assoc.independence_test(np.zeros((2, 2, 1), dtype=int), 0.5)
    stratified = np.stack([good, np.zeros((2, 2), dtype=int), good], axis=2)
    with pytest.raises(EmptyStratumError, match=r"stratum 1 .*merge levels.*or test without it"):
        assoc.independence_test(stratified, 0.5)
    with pytest.raises(UnknownTestMethodError):
        assoc.independence_test(good, 0.5, method="wald")
    for draws in [0, -5, 2.5, True]:
        with pytest.raises(InvalidDrawsError):
            assoc.independence_test(good, 0.5, draws=draws)  # type: ignore[arg-type]


def test_rappor_wald_baseline_is_zero_on_an_independent_table() -> None:
    table = np.array([[10, 20], [30, 60], [5, 10]])
    result = assoc.rappor_wald_test(table, 1.0)
    assert result.statistic == pytest.approx(0, abs=1e-9) and result.df == 2
    assert "not calibrated" in result.method


# ----------------------------------------------------------------------------- calibration

REPLICATIONS = 160
DRAWS = 99
ALPHAS = (0.05, 0.01)


def _keep_for(n: int, m: int, epsilon: float, joint: int) -> float:
    """The project's formulas: gamma = 1 + (n/m)(e^eps - 1), then a = (gamma - 1)/(gamma + K - 1)."""
    return PramChannel(gamma_from_epsilon(n, m, epsilon), joint).keep


CALIBRATION_POINTS = [
    # (true table shape, m, keep): marginal and conditional, small m, small keep
    ((3, 2, 1), 30, 0.3),
    ((3, 2, 1), 60, _keep_for(4000, 60, 1.0, 6)),
    ((2, 2, 3), 60, 0.2),
    ((3, 3, 1), 100, 0.1),
    # large sparse: 100 cells at m a^2 = 20, where the null fit is on the boundary; bootstrapping
    # from the null fit itself (interior_null's floor 0) fails this test: 33 rejections at 5%
    # against the bound 26, 9 at 1%, KS distance 0.295 against 0.282 (floor 2: 11, 2, 0.072)
    ((10, 10, 1), 500, 0.2),
]
CHECKS = len(CALIBRATION_POINTS) * (len(ALPHAS) + 1)
FAILURE_PER_CHECK = 1e-6 / CHECKS  # Bonferroni: the whole test fails falsely with prob <= 1e-6


def _bootstrap_p_values(tables: np.ndarray, keep: float, seeds: range) -> np.ndarray:
    """independence_test(table, keep, method="bootstrap", draws=DRAWS, seed=s) for every table,
    with every bootstrap table of every replication fitted in one batch."""
    g, null, _ = assoc.likelihood_ratio_statistics(tables, keep)
    m = int(tables[0].sum())
    boot = np.concatenate(
        [
            assoc.bootstrap_tables(assoc.interior_null(null[r], keep, m), keep, m, DRAWS, np.random.default_rng(s))
            for r, s in enumerate(seeds)
        ]
    )
    # G* >= G (tie rule of bootstrap_p_value) as independence_test decides it; that this equals
    # the finished fits' decision is test_exceedances_agree_with_the_finished_fits
    hits = assoc.exceedances(boot, keep, np.repeat(g, DRAWS)).reshape(len(seeds), DRAWS)
    return np.array([assoc.sequential_p_value(hits[r], DRAWS)[0] for r in range(len(seeds))])


def test_batched_bootstrap_helper_matches_independence_test() -> None:
    rng = np.random.default_rng(9)
    tables = _observe(rng, _product(rng, (3, 2, 1)), 40, 0.3, size=3)
    batched = _bootstrap_p_values(tables, 0.3, range(3))
    single = [
        assoc.independence_test(t, 0.3, method="bootstrap", draws=DRAWS, seed=s).p_value for s, t in enumerate(tables)
    ]
    np.testing.assert_allclose(batched, single, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("shape", "m", "keep"), CALIBRATION_POINTS)
def test_type_one_error_and_p_value_uniformity_under_h0(shape: tuple[int, int, int], m: int, keep: float) -> None:
    rng = np.random.default_rng([m, *shape])
    p0 = _product(rng, shape, 6.0)
    tables = _observe(rng, p0, m, keep, size=REPLICATIONS)
    usable = tables.sum(axis=(1, 2)).min(axis=1) > 0  # a table with an empty stratum is refused
    p_values = _bootstrap_p_values(tables[usable], keep, range(int(usable.sum())))
    count = p_values.size
    for alpha in ALPHAS:
        # a calibrated test rejects Binomial(count, <= alpha) times; the bound is exceeded with
        # probability <= FAILURE_PER_CHECK
        bound = int(stats.binom.isf(FAILURE_PER_CHECK, count, alpha))
        assert int(np.count_nonzero(p_values <= alpha)) <= bound, (alpha, np.count_nonzero(p_values <= alpha), bound)
    # uniformity: KS distance to U(0, 1) of the sequential Monte Carlo p-values within the KS bound
    # at FAILURE_PER_CHECK, plus their grid's widest gap (h/l for l = h..DRAWS, then 1/(DRAWS + 1)
    # steps: at most 1/h, between 1 and h/(h + 1)), which even an exact test shows
    distance = stats.kstest(p_values, "uniform").statistic
    critical = math.sqrt(math.log(2 / FAILURE_PER_CHECK) / (2 * count))
    assert distance <= critical + 1 / assoc.SEQUENTIAL_EXCEEDANCES, (distance, critical)
