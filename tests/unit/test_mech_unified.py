"""The unified (Feldman-Cousins) intervals of mechanism/estimation/unified.py: the acceptance sets against a
brute-force ranking, never empty, always holding the estimate, exact coverage (binomial at every
rate, and under sampling without replacement by enumeration), and the two boundary cases of the
issue in miniature. Every check is exact (enumeration, no Monte Carlo): no false-failure rate."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from secure_release.mechanism.errors import (
    InvalidCountsError,
    InvalidLevelError,
    NonFiniteInputError,
    ShapeMismatchError,
)
from secure_release.mechanism.estimation import estimators as est
from secure_release.mechanism.estimation import marginals, unified
from secure_release.mechanism.estimation.report import build_report
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy import accounting as acc
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol import in_memory as protocol
from secure_release.mechanism.schema import Attribute, CuratorSchema, JointSchema
from secure_release.mechanism.simulation.monte_carlo import exact_cell_coverage

# (m, keep a, off-diagonal b, alpha): small and large m, b m below and above 1, a + b near 1,
# a Bonferroni alpha
SETTINGS = [(1, 0.5, 0.1, 0.05), (13, 0.2, 0.01, 0.05), (50, 0.4, 0.05, 0.05), (72, 0.4965, 0.126, 0.05),
            (200, 0.9, 0.001, 0.05 / 24), (156, 0.036, 0.00056, 0.05), (400, 0.998, 0.002, 0.05)]  # fmt: skip


def _brute_force_acceptance(p: float, m: int, a: float, b: float, alpha: float) -> tuple[int, int]:
    """Feldman & Cousins' recipe literally: rank all counts by the ratio, accumulate."""
    k = np.arange(m + 1)
    ratio = unified.log_likelihood_ratio(k, m, p, b, a + b)
    pmf = stats.binom.pmf(k, m, p)
    order = np.argsort(-ratio, kind="stable")
    taken = order[: int(np.searchsorted(np.cumsum(pmf[order]), 1 - alpha)) + 1]
    return int(taken.min()), int(taken.max())


@pytest.mark.parametrize(("m", "a", "b", "alpha"), SETTINGS)
def test_acceptance_sets_are_feldman_cousins(m: int, a: float, b: float, alpha: float) -> None:
    rates = np.random.default_rng(m).uniform(b, a + b, 40)  # generic rates: no ties in the ranking
    k1, k2 = unified.unified_acceptance(rates, m, a, b, alpha)
    for p, lo, hi in zip(rates, k1, k2, strict=True):
        assert (lo, hi) == _brute_force_acceptance(float(p), m, a, b, alpha)
        assert stats.binom.pmf(np.arange(lo, hi + 1), m, p).sum() >= 1 - alpha - 1e-12


@pytest.mark.parametrize(("m", "a", "b", "alpha"), SETTINGS)
def test_never_empty_always_holds_the_estimate_and_covers_every_rate(m: int, a: float, b: float, alpha: float) -> None:
    k = np.arange(m + 1)
    lo, hi = unified.unified_rate_interval(k, m, a, b, alpha)
    best = unified.best_physical_rate(k, m, b, a + b)
    assert np.all((b <= lo) & (lo <= best) & (best <= hi) & (hi <= a + b))
    # the share interval holds the clipped raw estimate, for every count
    t_lo, t_hi = est.share_intervals(k, 10**6, m, a, b, "unified", alpha)
    clipped = np.clip((k / m - b) / a, 0, 1)
    assert np.all((t_lo <= clipped + 1e-12) & (clipped <= t_hi + 1e-12))
    # Neyman: coverage >= 1 - alpha at EVERY rate, so also between the belt's lattice points
    k_col = k[:, None]
    rates = np.linspace(b, a + b, 4001)
    pmf = stats.binom.pmf(k_col, m, rates[None, :])
    inside = (lo[:, None] <= rates[None, :]) & (rates[None, :] <= hi[:, None])
    assert (pmf * inside).sum(axis=0).min() >= 1 - alpha - 1e-12


def test_exact_coverage_under_sampling_without_replacement_at_the_boundary() -> None:
    """A table of mostly tiny cells (K = 400, n = 4000) at epsilon 0.5, m = 2000: b m = 5 records
    of pure noise per cell, so most observed counts fall near or below b m, where Clopper-Pearson
    collapses; the unified interval's exact coverage (hypergeometric sample, then PRAM) is >= 95%
    in every cell and it is narrower on average."""
    counts = np.r_[np.full(390, 2), np.full(9, 0), 3220]
    n, K, m = 4000, counts.size, 2000
    ch = PramChannel(acc.gamma_from_epsilon(n, m, 0.5), K)
    assert 4.9 < ch.off_diagonal * m < 5.0
    uni, cp = exact_cell_coverage(counts, m, ch.keep, ch.off_diagonal, ("unified", "clopper-pearson"))
    assert uni.coverage.min() >= 0.95 and cp.coverage.min() >= 0.95
    assert uni.mean_width.mean() < cp.mean_width.mean()
    # here a count of 0 gives Clopper-Pearson's empty [0, 0]; the unified interval has width
    lo_cp, hi_cp = est.share_intervals([0], n, m, ch.keep, ch.off_diagonal, "clopper-pearson", 0.05)
    lo_u, hi_u = est.share_intervals([0], n, m, ch.keep, ch.off_diagonal, "unified", 0.05)
    assert lo_cp[0] == hi_cp[0] == 0.0 and lo_u[0] == 0.0 and hi_u[0] > 0.0


def _adult_like_channel() -> tuple[int, int, PramChannel]:
    n = 28_802
    m = acc.optimal_sample_size_int(n, 2592, 2.0)
    return n, m, PramChannel(acc.gamma_from_epsilon(n, m, 2.0), 2592)


def test_issue_case_a_marginal_cell_with_one_record() -> None:
    """K = 2592, m = 72: a 4-category marginal has b_S m = 9.1 records of pure noise per cell. One
    observed record: Clopper-Pearson's rate interval lies below b_S, the share interval collapses
    to [0, 0]; the unified one is [0, > 0] and holds the estimate (clip(raw) = 0)."""
    n, m, ch = _adult_like_channel()
    assert m == 72
    b_s = (1 - ch.keep) / 4
    counts = np.array([1, 20, 25, 26])
    assert counts[0] < b_s * m
    cp = est.cell_intervals(counts, n, m, ch.keep, b_s, method="clopper-pearson")
    assert cp.low[0] == cp.high[0] == 0.0  # the issue, reproduced
    iv = est.cell_intervals(counts, n, m, ch.keep, b_s)  # the default
    assert iv.method == "unified" and iv.low[0] == 0.0 and iv.high[0] > 0.01
    raw = est.estimate_marginal(counts, ch)
    assert np.all((iv.low <= np.clip(raw, 0, 1)) & (np.clip(raw, 0, 1) <= iv.high))
    # the same through a marginal table of the joint (4 x 648 cells): the headline is inside
    labels = [(f"x{i}", f"y{j}") for i in range(4) for j in range(648)]
    joint = np.zeros((4, 648), dtype=np.int64)
    joint[:, 0] = counts
    t = marginals.marginal(("X", "Y"), labels, est.estimate_joint(joint.ravel(), ch), ["X"], n, m, ch.keep,
                           joint.ravel())  # fmt: skip
    assert t.ci_high[0] > t.ci_low[0] == 0.0
    assert np.all((t.ci_low <= t.projected) & (t.projected <= t.ci_high))


def test_issue_case_b_headline_outside_its_cell_interval_is_held() -> None:
    """The projection (the joint's headline) subtracts a common shift from every cell, so in a
    large sparse table a cell's headline can fall below its own interval (the held-out Adult
    release: 1 of 1,720 rows). The report widens that interval to hold it and says so."""
    n, m = 28_802, 156
    plan = plan_release(n, (4, 430), 0.3, m=m)
    counts = np.zeros(1720, dtype=np.int64)
    counts[[0, 1, 2, 3]] = [40, 30, 20, 10]
    counts[4 : 4 + 56] = 1
    assert counts.sum() == m
    estimate = protocol.estimate_from_counts(counts, plan)
    outside = (estimate.projected < estimate.ci_low) | (estimate.projected > estimate.ci_high)
    assert outside.any()  # the case, reproduced: some headline lies outside its interval
    schema = JointSchema((CuratorSchema("alice", (Attribute("x", tuple("abcd")),)),
                          CuratorSchema("bob", (Attribute("y", tuple(f"y{j}" for j in range(430))),))))  # fmt: skip
    report = build_report("r", plan, ["alice", "bob"], estimate, schema)
    assert np.all((report.ci_low <= report.projected) & (report.projected <= report.ci_high))
    assert np.all(report.ci_low <= estimate.ci_low) and np.all(report.ci_high >= estimate.ci_high)
    assert f"widened to hold the headline estimate in {int(outside.sum())} cell" in report.interval_method
    assert report.interval_method.startswith("unified, 95% per cell")


@pytest.mark.parametrize(("m", "a", "b", "alpha"), SETTINGS[1:4])
def test_a_counts_interval_does_not_depend_on_the_other_counts(m: int, a: float, b: float, alpha: float) -> None:
    """The belt is evaluated only near the observed counts (the window of the module docstring):
    alone or among all m + 1 counts, a count gets the same interval."""
    lo, hi = unified.unified_rate_interval(np.arange(m + 1), m, a, b, alpha)
    for k in np.unique(np.linspace(0, m, 12).astype(int)):
        alone = unified.unified_rate_interval([k], m, a, b, alpha)
        assert (alone[0][0], alone[1][0]) == (lo[k], hi[k])


def test_hold_estimate_is_the_smallest_superset() -> None:
    lo, hi, moved = unified.hold_estimate([0.1, 0.2, 0.0], [0.3, 0.4, 0.5], [0.05, 0.5, 0.2])
    assert lo.tolist() == [0.05, 0.2, 0.0] and hi.tolist() == [0.3, 0.5, 0.5] and moved == 2
    with pytest.raises(ShapeMismatchError):
        unified.hold_estimate([0.1], [0.2, 0.3], [0.1])


def test_large_m_and_many_cells() -> None:
    """m = 10^6, K = 2592 (about 2,000 distinct counts): every interval has width, holds the
    estimate and stays within the physical range."""
    rng = np.random.default_rng(5)
    K, m = 2592, 10**6
    ch = PramChannel(1e4, K)
    counts = rng.multinomial(m, ch.keep * rng.dirichlet(np.full(K, 0.3)) + ch.off_diagonal)
    lo, hi = unified.unified_rate_interval(counts, m, ch.keep, ch.off_diagonal, 0.05)
    best = unified.best_physical_rate(counts, m, ch.off_diagonal, ch.keep + ch.off_diagonal)
    assert np.all((lo <= best) & (best <= hi) & (lo < hi))
    assert lo.min() >= ch.off_diagonal and hi.max() <= ch.keep + ch.off_diagonal


def test_named_errors() -> None:
    with pytest.raises(InvalidLevelError):
        unified.unified_rate_interval([1], 10, 0.5, 0.1, 0.0)
    with pytest.raises(InvalidCountsError):
        unified.unified_rate_interval([11], 10, 0.5, 0.1, 0.05)
    with pytest.raises(InvalidCountsError):
        unified.unified_rate_interval([1], 0, 0.5, 0.1, 0.05)
    with pytest.raises(NonFiniteInputError):
        unified.unified_rate_interval([1], 10, 1.5, 0.1, 0.05)
    with pytest.raises(NonFiniteInputError):
        unified.unified_acceptance([0.05], 10, 0.5, 0.1, 0.05)  # below the physical range
