"""Per-cell confidence intervals: the numerical pieces against scipy, exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from secure_release.mechanism.errors import (
    InvalidCountsError,
    InvalidLevelError,
    NonFiniteInputError,
    ShapeMismatchError,
    UnknownIntervalMethodError,
)
from secure_release.mechanism.estimation import estimators as est
from secure_release.mechanism.estimation import reference
from secure_release.mechanism.primitives.pram import PramChannel


def test_log_gamma_matches_scipy() -> None:
    x = np.concatenate([np.geomspace(1e-3, 1e8, 200), np.arange(1, 60)])
    ref = special.gammaln(x)
    assert np.allclose(est.log_gamma(x), ref, rtol=1e-13, atol=1e-13)
    with pytest.raises(NonFiniteInputError):
        est.log_gamma([0.0])


@pytest.mark.parametrize("m", [1, 2, 10, 177, 3899, 100_000])
def test_incomplete_beta_and_quantile_match_scipy(m: int) -> None:
    """Relative error grows like m * 3e-15 (the cancellation in ln B(a, b)); documented."""
    k = np.unique(np.r_[1, 2, 3, np.linspace(1, m, 25).astype(int)])
    k = k[k <= m]
    a, b = k.astype(float), m - k + 1.0
    x = np.clip(k / (m + 1.0), 1e-9, 1 - 1e-9)
    rtol = 1e-12 + 5e-15 * m
    ours = est.regularized_incomplete_beta(x, a, b)
    assert np.allclose(ours, special.betainc(a, b, x), rtol=rtol, atol=1e-15)
    for prob in (0.025, 0.975, 1e-8):
        q = est.beta_quantile(prob, a, b)
        assert np.allclose(q, stats.beta.ppf(prob, a, b), rtol=rtol, atol=0)


def test_clopper_pearson_matches_scipy_and_covers_exactly() -> None:
    m = 50
    k = np.arange(m + 1)
    lo, hi = est.clopper_pearson_rate_interval(k, m, 0.05)
    ref = stats.binomtest(7, m).proportion_ci(0.95, method="exact")
    assert lo[7] == pytest.approx(ref.low, rel=1e-12)
    assert hi[7] == pytest.approx(ref.high, rel=1e-12)
    assert lo[0] == 0.0 and hi[m] == 1.0
    # Clopper-Pearson's guarantee, enumerated exactly: coverage >= 95% at every p
    for p in np.linspace(0.001, 0.999, 97):
        pmf = stats.binom.pmf(k, m, p)
        assert pmf[(lo <= p) & (p <= hi)].sum() >= 0.95 - 1e-12


def test_score_interval_solves_its_quadratic() -> None:
    """The ends satisfy (x - m p)^2 = z^2 m V(p) with V from the finite-population variance."""
    n, m, a, b = 1000, 200, 0.4, 0.01
    k = np.array([1, 5, 40, 150])
    z = est.normal_quantile(0.975)
    c2, c1, c0 = est.observed_rate_variance_coefficients(n, m, a, b)
    for cc in (False, True):
        lo, hi = est.score_rate_interval(k, n, m, a, b, 0.05, continuity=cc)
        half = 0.5 if cc else 0.0
        for x, p in ((k - half, lo), (k + half, hi)):
            v = c2 * p * p + c1 * p + c0
            inner = p > 0  # a root below 0 is clipped to 0
            assert inner.sum() >= 3
            assert np.allclose((x - m * p)[inner] ** 2, (z * z * m * v)[inner], rtol=1e-9)
    # V(p) at p = a T + b equals a^2 times DESIGN 3's per-cell variance times m
    t = np.array([0.0, 0.1, 0.5, 1.0])
    p = a * t + b
    design = est.channel_cell_variance(n, m, a, b, t) * m * a * a
    assert np.allclose(c2 * p * p + c1 * p + c0, design, rtol=1e-12)


def test_share_mapping_and_clipping() -> None:
    lo, hi = est.rate_to_share_interval([0.0, 0.3], [0.005, 0.9], keep=0.5, off_diagonal=0.01)
    assert lo.tolist() == [0.0, pytest.approx(0.58)]
    assert hi.tolist() == [0.0, 1.0]


def test_cell_intervals_methods_levels_and_labels() -> None:
    ch = PramChannel(40.0, 24)
    counts = np.r_[np.arange(24) * 3]
    n = 10_000
    per = est.joint_intervals(counts, n, ch)
    assert per.method == "unified" and per.label == "unified, 95% per cell"
    assert np.all((per.low >= 0) & (per.low <= per.high) & (per.high <= 1))
    sim = est.joint_intervals(counts, n, ch, simultaneous=True)
    assert sim.per_cell_level == pytest.approx(1 - 0.05 / 24)
    assert "simultaneous (Bonferroni over 24 cells)" in sim.label
    assert np.all(sim.low <= per.low) and np.all(sim.high >= per.high)
    for method in est.INTERVAL_METHODS:
        iv = est.joint_intervals(counts, n, ch, method=method, level=0.9)
        assert iv.method == method and iv.description
        raw = est.estimate_joint(counts, ch)
        inside = (iv.low <= np.clip(raw, 0, 1)) & (np.clip(raw, 0, 1) <= iv.high)
        assert inside[counts > 5].all()
    marg = est.marginal_intervals(counts.reshape(6, 4).sum(axis=1), n, ch)
    assert marg.low.size == 6
    with pytest.raises(UnknownIntervalMethodError, match="choose one of"):
        est.joint_intervals(counts, n, ch, method="wald")
    for bad in (0.0, 1.0, 1.5, float("nan"), True):
        with pytest.raises(InvalidLevelError):
            est.joint_intervals(counts, n, ch, level=bad)
    with pytest.raises(ShapeMismatchError):
        est.joint_intervals(counts[:5], n, ch)
    with pytest.raises(InvalidCountsError, match=r"integers in \[0, m\]"):
        est.cell_intervals([3, 200], n, 100, ch.keep, ch.off_diagonal)


def test_normal_method_is_the_old_interval_clipped() -> None:
    ch = PramChannel(40.0, 24)
    counts = np.arange(24) * 4
    n, m = 10_000, int(counts.sum())
    raw = est.estimate_joint(counts, ch)
    lo, hi = reference.confidence_intervals(raw, est.standard_errors(raw, n, m, ch))
    iv = est.joint_intervals(counts, n, ch, method="normal")
    assert np.allclose(iv.low, np.clip(lo, 0, 1)) and np.allclose(iv.high, np.clip(hi, 0, 1))
    assert math.isclose(est.normal_quantile(0.975), est.Z_95, rel_tol=1e-12)


def test_report_fields_name_the_method() -> None:
    ch = PramChannel(40.0, 24)
    fields = est.joint_intervals(np.arange(24), 10_000, ch, simultaneous=True).report_fields()
    assert fields["interval_method"] == "unified"
    assert fields["interval_simultaneous"] is True and fields["interval_level"] == 0.95
    assert "Bonferroni" in str(fields["interval_label"]) and "Feldman-Cousins" in str(
        fields["interval_description"]
    )
