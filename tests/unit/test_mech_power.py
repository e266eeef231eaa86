"""mechanism/analysis/power.py: the power of the independence test planned from public inputs. Exact checks
of each formula (the channel on the pair, the noncentrality, m a^2's maximum, the marginal
efficiency), then the claim itself checked by simulation with an LRT written here, independently
of the module's: at the planned V the chi-square LRT's power is near 0.8, also at small m where
the plain asymptotic V falls short."""

from __future__ import annotations

import json
import math

import numpy as np
import numpy.typing as npt
import pytest
from scipy import linalg, stats

from secure_release.mechanism.analysis import power as pw
from secure_release.mechanism.errors import (
    InvalidLevelError,
    RepeatedAttributeError,
    ShapeMismatchError,
    TooFewLevelsError,
    UnknownAttributeError,
)
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.schema import Attribute, CuratorSchema

FloatArray = npt.NDArray[np.float64]


# ----------------------------------------------- an LRT of our own (not the module's), for the claim
def _saturated(f: FloatArray, g: float) -> FloatArray:
    """max sum f log q over q >= g, sum q = 1: q = max(g, f/lam), lam by bisection (sum falls in lam)."""
    lo = np.full(f.shape[0], 1e-12)
    hi = np.full(f.shape[0], 1.0 / (1.0 - g * f.shape[1]) + 1.0)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        big = np.maximum(g, f / mid[:, None]).sum(axis=1) > 1.0
        lo, hi = np.where(big, mid, lo), np.where(big, hi, mid)
    return np.asarray(np.maximum(g, f / hi[:, None]))


def _null(f: FloatArray, a: float, n_i: int, n_j: int, cycles: int = 600) -> FloatArray:
    """EM on the full table of true shares, M-step = product of the expected table's margins; from uniform."""
    g = (1.0 - a) / (n_i * n_j)
    p = np.full((f.shape[0], n_i, n_j), 1.0 / (n_i * n_j))
    F = f.reshape(-1, n_i, n_j)
    for _ in range(cycles):
        q = a * p + g
        e = p * (a * F / q + g * (F / q).sum(axis=(1, 2), keepdims=True))
        e /= e.sum(axis=(1, 2), keepdims=True)
        p = e.sum(axis=2, keepdims=True) * e.sum(axis=1, keepdims=True)
    return np.asarray((a * p + g).reshape(-1, n_i * n_j))


def _lrt(counts: FloatArray, a: float, n_i: int, n_j: int) -> FloatArray:
    o = counts.reshape(-1, n_i * n_j).astype(np.float64)
    f = o / o.sum(axis=1, keepdims=True)
    q_sat, q_null = _saturated(f, (1.0 - a) / (n_i * n_j)), _null(f, a, n_i, n_j)
    return np.asarray(np.maximum(2 * np.where(o > 0, o * (np.log(q_sat) - np.log(q_null)), 0).sum(axis=1), 0))


def _chi2_rejections(v: float, m: int, a: float, n_i: int, n_j: int, tables: int, seed: int) -> int:
    q = (a * pw.dependent_table(n_i, n_j, v) + (1 - a) / (n_i * n_j)).ravel()
    counts = np.random.default_rng(seed).multinomial(m, q / q.sum(), size=tables).astype(np.float64)
    return int(np.sum(stats.chi2.sf(_lrt(counts, a, n_i, n_j), (n_i - 1) * (n_j - 1)) < 0.05))


# ------------------------------------------------------------------------------ exact checks
def test_the_joint_channel_summed_onto_a_pair_keeps_a_else_uniform() -> None:
    # alphabets (3 x 2) and (2 x 2): K = 24; the pair is the first attribute of each curator (3 x 2)
    sizes, gamma = (6, 4), 7.5
    channel = PramChannel(gamma, 24)
    a, b = channel.keep, channel.off_diagonal
    A = a * np.eye(24) + b  # A[o, x]: observed joint cell o given true x
    joint = np.arange(24)
    c1, c2 = joint // sizes[1], joint % sizes[1]  # curator codes (mixed radix, curator 1 first)
    pair = (c1 // 2) * 2 + c2 // 2  # attribute 1 of curator 1 (radix 3 x 2), attribute 1 of curator 2 (2 x 2)
    summed = np.stack([A[pair == c].sum(axis=0) for c in range(6)])  # (observed pair cell, true joint cell)
    expected = a * (pair[None, :] == np.arange(6)[:, None]) + (1 - a) / 6
    assert np.abs(summed - expected).max() < 1e-15
    n, m, eps = 45222, 239, 0.1
    c = math.expm1(eps)
    assert pw.keep_probability(n, m, 24, eps) == pytest.approx(n * c / (n * c + m * 24), rel=1e-12)


def test_with_uniform_marginals_the_noncentrality_is_m_a2_v2_times_min_levels_minus_1() -> None:
    rng = np.random.default_rng(5)
    for n_i, n_j in ((2, 2), (3, 2), (4, 6), (5, 3)):
        d = rng.normal(size=(n_i, n_j))
        d -= d.mean(axis=0, keepdims=True)
        d -= d.mean(axis=1, keepdims=True)  # zero row and column sums
        p = 1.0 / (n_i * n_j) + 0.2 * d / (n_i * n_j * np.abs(d).max())
        v = pw.cramers_v(p)
        lam = pw.noncentrality(300, 0.37, p)
        assert lam == pytest.approx(pw.uniform_noncentrality(300, 0.37, v, min(n_i, n_j)), rel=1e-12)


def test_the_required_noncentrality_and_the_power_formula() -> None:
    assert pw.required_noncentrality(1) == pytest.approx(7.8489, abs=1e-4)  # the classic 7.85 (alpha .05, power .8)
    for df in (1, 2, 6, 15):
        lam = pw.required_noncentrality(df)
        assert stats.ncx2.sf(stats.chi2.isf(0.05, df), df, lam) == pytest.approx(0.8, abs=1e-9)
    for m, keep, n_i, n_j in ((3899, 0.454, 3, 2), (500, 0.8, 4, 6), (10**5, 0.1, 2, 2)):
        df, low = (n_i - 1) * (n_j - 1), min(n_i, n_j)
        v = pw.min_detectable_cramers_v(m, keep, df, low)
        assert pw.test_power(v, m, keep, df, low) == pytest.approx(0.8, abs=1e-9)
        assert pw.test_power(0.0, m, keep, df, low) == pytest.approx(0.05, abs=1e-12)
    assert pw.min_detectable_cramers_v(10, 0.3, 1, 2) == math.inf  # V would have to exceed 1
    with pytest.raises(ShapeMismatchError, match="no I x J table has df = 5"):
        pw.min_detectable_cramers_v(100, 0.5, 5, 3)
    with pytest.raises(InvalidLevelError, match="must exceed alpha"):
        pw.required_noncentrality(2, alpha=0.05, power=0.04)


@pytest.mark.parametrize(("n", "K", "eps"), [(45222, 24, 0.1), (45222, 24, 1.0), (300, 144, 1.0), (50, 4, 8.0),
                                             (1000, 24, 0.001), (7919, 36, 0.37)])  # fmt: skip
def test_the_best_m_maximises_m_a2_over_every_integer(n: int, K: int, eps: float) -> None:
    c = math.expm1(eps)
    ms = np.arange(1, n + 1, dtype=np.float64)
    score = ms * (n * c / (n * c + ms * K)) ** 2
    best = pw.power_maximizing_sample_size(n, K, eps)
    assert best * (n * c / (n * c + best * K)) ** 2 == pytest.approx(score.max(), rel=1e-9)
    assert 1 <= best <= n


def test_m_star_costs_the_test_a_factor_sqrt_1_plus_1_over_4k_plus_4_sqrt_k() -> None:
    for K in (4, 24, 144):
        plan = pw.power_plan(10**8, [K // 2, 2], 1.0, 2, 2)  # unclamped, asymptotic (m a^2 / 4 in the millions)
        assert plan.method == plan.method_at_best_m == "asymptotic"
        assert plan.best_keep == pytest.approx(0.5, abs=1e-6)
        theory = math.sqrt(1 + 1 / (4 * K + 4 * math.sqrt(K)))
        assert plan.ratio_m_star_to_best_m == pytest.approx(theory, rel=1e-6)  # m* and best m are ~10^6: rounding
    clamped = pw.power_plan(50, [2, 2], 8.0, 2, 2)  # n c / K >> n: both clamp to n
    assert clamped.best_m == clamped.m_star == 50 and "also maximises" in clamped.note


def test_marginal_efficiency_is_1_when_uniform_or_noiseless_and_bounds_every_direction() -> None:
    assert pw.marginal_efficiency(0.3, [0.25] * 4, [1 / 3] * 3) == pytest.approx((1.0, 1.0), abs=1e-12)
    r, s = np.array([0.6, 0.3, 0.1]), np.array([0.7, 0.2, 0.05, 0.05])
    assert pw.marginal_efficiency(1.0, r, s) == pytest.approx((1.0, 1.0), abs=1e-10)  # no noise: classic m phi^2
    a = 0.4
    worst, best = pw.marginal_efficiency(a, r, s)
    assert 0 < worst < 1 - 1e-3 < best  # a rare cell drowns in the uniform noise; a common one stands out of it
    # random dependences with these margins: the LRT noncentrality (least squares against the null's
    # tangent, written out here) over m a^2 phi^2 lies in [worst, best]; Pearson's form without the
    # projection is never below it
    g = (1 - a) / 12
    q0 = a * np.outer(r, s).ravel() + g
    tangent = np.stack([a * np.kron(np.eye(3)[i], s) for i in range(3)] + [a * np.kron(r, np.eye(4)[j])
                                                                          for j in range(4)], axis=1)  # fmt: skip
    w = 1 / np.sqrt(q0)
    basis = np.kron(linalg.null_space(np.ones((1, 3))), linalg.null_space(np.ones((1, 4))))  # zero-margin d
    rng = np.random.default_rng(3)
    for _ in range(200):
        d = basis @ rng.normal(size=basis.shape[1])
        d *= 1e-3 / np.abs(d).max()
        coef = np.linalg.lstsq(w[:, None] * tangent, w * a * d, rcond=None)[0]
        lam = float(np.sum((w * (a * d - tangent @ coef)) ** 2))
        phi2 = float(np.sum(d**2 / np.outer(r, s).ravel()))
        assert worst - 1e-9 <= lam / (a * a * phi2) <= best + 1e-9
        p = np.outer(r, s) + d.reshape(3, 4)
        assert pw.noncentrality(1, a, p) >= lam - 1e-15


def test_dependent_tables_have_uniform_marginals_and_the_asked_v() -> None:
    for n_i, n_j, top in ((2, 2, 1.0), (2, 4, 1.0), (3, 6, 1.0), (3, 3, 1.0), (3, 2, math.sqrt(2 / 3))):
        assert pw.max_uniform_cramers_v(n_i, n_j) == pytest.approx(top, abs=1e-12)
        for v in (0.0, 0.13, top):
            p = pw.dependent_table(n_i, n_j, v)
            assert np.allclose(p.sum(axis=1), 1 / n_i) and np.allclose(p.sum(axis=0), 1 / n_j)
            assert pw.cramers_v(p) == pytest.approx(v, abs=1e-12)


def test_the_modules_lrt_agrees_with_the_one_written_here() -> None:
    """The plan simulates the researcher's own statistic (association.likelihood_ratio_statistics):
    it agrees with an EM fit written here to within 5e-3 on these tables (each fit stops at its
    own rule: a fixed budget of scoring steps there, a tolerance of EM's moves here)."""
    rng = np.random.default_rng(8)
    for n_i, n_j, m, a in ((2, 2, 40, 0.8), (3, 2, 239, 0.45), (4, 3, 60, 0.5)):
        q = (a * pw.dependent_table(n_i, n_j, 0.3) + (1 - a) / (n_i * n_j)).ravel()
        counts = rng.multinomial(m, q / q.sum(), size=50).astype(np.float64)
        ours, module = _lrt(counts, a, n_i, n_j), pw.lrt_statistics(counts, a, n_i, n_j)
        assert np.all(np.abs(module - ours) < 5e-3)


# ---------------------------------------------------------------------- the claim, simulated
def test_at_small_m_the_plan_holds_where_the_asymptotic_v_falls_short() -> None:
    # 6 x 4 pair of the Adult release at epsilon 0.1 (m* = 239, a = 0.453, m a^2/(I J) = 2): measured with
    # 4000 tables, the chi-square LRT's power is 0.71 at the asymptotic V, 0.79 at the planned one.
    n, K, eps, m = 45222, 24, 0.1, 239
    a = pw.keep_probability(n, m, K, eps)
    v_asym = pw.min_detectable_cramers_v(m, a, 15, 4)
    v_plan, how = pw.planned_min_detectable_cramers_v(m, a, 6, 4, replicates=1000, seed=4)
    assert how.startswith("simulated") and v_plan > v_asym
    tables = 1500
    # binomial tails at 1500 tables (sd <= 0.0118): 0.71 -> >= 0.77 is 5.1 sd; 0.79 -> <= 0.72 is 5.9 sd and
    # >= 0.87 is 6.8 sd (allowing the plan's own noise, 0.02): each false failure < 1e-6
    assert _chi2_rejections(v_asym, m, a, 6, 4, tables, seed=21) < 0.77 * tables
    assert 0.72 * tables < _chi2_rejections(v_plan, m, a, 6, 4, tables, seed=22) < 0.87 * tables


def test_at_large_m_the_asymptotic_v_holds() -> None:
    # 3 x 2 pair at m* = 3899 (epsilon 1): asymptotic; measured power 0.80 (4000 tables); at 1500 tables
    # (sd 0.0103) the band [0.74, 0.86] leaves > 5.8 sd on each side even for a true power of 0.80 +- 0.01
    plan = pw.power_plan(45222, [6, 4], 1.0, 3, 2)
    assert plan.method == "asymptotic" and plan.m == 3899
    hits = _chi2_rejections(plan.min_detectable_cramers_v, plan.m, plan.keep, 3, 2, 1500, seed=23)
    assert 0.74 * 1500 < hits < 0.86 * 1500


def test_the_simulated_figures_are_seeded() -> None:
    first = pw.simulated_min_detectable_cramers_v(30, 0.83, 2, 2, replicates=400, seed=9)
    assert first == pw.simulated_min_detectable_cramers_v(30, 0.83, 2, 2, replicates=400, seed=9)
    assert 0 < first < 1


# ------------------------------------------------------------------------------ power_plan
ALICE = CuratorSchema("alice", (Attribute("education", ("a", "b", "c")), Attribute("marital", ("m", "s"))))
BOB = CuratorSchema("bob", (Attribute("sex", ("f", "m")), Attribute("salary", ("lo", "hi"))))


def test_power_plan_from_schemas_and_from_level_counts_agree() -> None:
    named = pw.power_plan(45222, [ALICE, BOB], 1.0, "education", "sex")
    counted = pw.power_plan(45222, [6, 4], 1.0, 3, 2)
    assert named.attributes == ("education", "sex") and named.levels == (3, 2) and named.df == 2
    assert named.same_curator is False and counted.same_curator is None
    assert named.min_detectable_cramers_v == counted.min_detectable_cramers_v
    assert named.m == named.m_star == 3899 and named.best_m == 3238
    out = named.to_dict()
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    assert "uniform marginals" in out["assumption"] and out["ratio_m_star_to_best_m"] > 1
    same = pw.power_plan(45222, [ALICE, BOB], 1.0, "education", "marital")
    assert same.same_curator is True and "needs no cross-curator release" in same.note
    none = pw.power_plan(300, [ALICE, BOB], 1.0, "education", "sex").to_dict()  # m* = 26, a = 0.45: V > 1 needed
    assert none["min_detectable_cramers_v"] is None and "dependent enough" in none["note"]


def test_power_plan_with_public_marginals_is_never_better_than_uniform() -> None:
    uniform = pw.power_plan(45222, [ALICE, BOB], 1.0, "education", "sex")
    skewed = pw.power_plan(45222, [ALICE, BOB], 1.0, "education", "sex", marginals=([0.6, 0.3, 0.1], [0.7, 0.3]))
    assert skewed.min_detectable_cramers_v > uniform.min_detectable_cramers_v
    assert "worst direction" in skewed.assumption


@pytest.mark.parametrize(
    ("alphabets", "a", "b", "error", "message"),
    [
        ([ALICE, BOB], "educ", "sex", UnknownAttributeError, r"no attribute 'educ'.*\['education', 'marital', 'sex'"),
        ([ALICE, BOB], "sex", "sex", RepeatedAttributeError, "two different attributes, got 'sex' twice"),
        ([ALICE, CuratorSchema("bob", (Attribute("sex", ("f", "m")), Attribute("education", ("x", "y"))))],
         "education", "sex", RepeatedAttributeError, "'education' is in more than one schema"),
        ([6, 4], "education", "sex", UnknownAttributeError, "alphabet sizes alone there are no attribute names"),
        ([6, 4], 5, 2, ShapeMismatchError, "I J = 10 must divide K = 24"),
        ([6, 4], 1, 2, TooFewLevelsError, ">= 2 levels"),
    ],
)
def test_power_plan_names_what_is_wrong(alphabets: list[object], a: object, b: object, error: type[Exception],
                                        message: str) -> None:  # fmt: skip
    with pytest.raises(error, match=message):
        pw.power_plan(45222, alphabets, 1.0, a, b)  # type: ignore[arg-type]


def test_alpha_and_power_are_checked() -> None:
    with pytest.raises(InvalidLevelError, match="alpha must be a number strictly between 0 and 1"):
        pw.power_plan(45222, [6, 4], 1.0, 3, 2, alpha=0.0)
    with pytest.raises(InvalidLevelError, match="power must be a number strictly between 0 and 1"):
        pw.power_plan(45222, [6, 4], 1.0, 3, 2, power=1.0)
    with pytest.raises(ShapeMismatchError, match="marginal shares of sizes 2, 2"):
        pw.power_plan(45222, [6, 4], 1.0, 3, 2, marginals=([0.5, 0.5], [0.5, 0.5]))
