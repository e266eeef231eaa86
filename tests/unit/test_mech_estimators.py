"""Estimators: closed-form A^-1, marginals, simplex projection, MLE; unbiasedness and exact MSE."""

from __future__ import annotations

import hashlib
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from secure_release.mechanism.errors import EmptySampleError, NonFiniteInputError, ShapeMismatchError
from secure_release.mechanism.estimation import estimators as est
from secure_release.mechanism.estimation import reference
from secure_release.mechanism.primitives.keys import PramKey, Seed
from secure_release.mechanism.primitives.pram import PramChannel, perturb
from secure_release.mechanism.primitives.sampling import sample_positions
from secure_release.mechanism.privacy.accounting import expected_squared_error, gamma_from_epsilon
from secure_release.mechanism.schema import joint_codes, split_joint

ADULT_CSV = Path(__file__).resolve().parents[2] / "app" / "data" / "adult_counts.csv"


def _matrix(ch: PramChannel) -> np.ndarray:
    K = ch.joint_size
    return ch.keep * np.eye(K) + ch.off_diagonal * np.ones((K, K))


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 9), st.floats(1.01, 100.0), st.lists(st.integers(0, 50), min_size=9, max_size=9)
)
def test_invert_channel_equals_solve(K: int, gamma: float, raw_counts: list[int]) -> None:
    counts = np.array(raw_counts[:K], dtype=float)
    counts[0] += 1  # non-empty
    ch = PramChannel(gamma, K)
    t_obs = counts / counts.sum()
    expected = np.linalg.solve(_matrix(ch), t_obs)
    assert np.allclose(
        est.invert_channel(t_obs, ch.keep, ch.off_diagonal),
        expected,
        rtol=0,
        atol=1e-12 * max(1, np.abs(expected).max()),
    )
    assert np.allclose(
        est.estimate_joint(counts, ch),
        expected,
        rtol=0,
        atol=1e-12 * max(1, np.abs(expected).max()),
    )
    # sums to one (A^-1 preserves total mass)
    assert math.isclose(est.estimate_joint(counts, ch).sum(), 1.0, abs_tol=1e-9)


def test_estimate_joint_errors() -> None:
    ch = PramChannel(3.0, 4)
    with pytest.raises(ShapeMismatchError):
        est.estimate_joint(np.ones(5), ch)
    with pytest.raises(EmptySampleError, match="no observed rows"):
        est.estimate_joint(np.zeros(4), ch)
    with pytest.raises(NonFiniteInputError):
        est.invert_channel(np.array([np.nan, 1.0]), 0.5, 0.25)
    with pytest.raises(ShapeMismatchError):
        est.observed_counts(np.array([0, 4]), 4)
    assert est.observed_counts(np.array([0, 3, 3]), 4).tolist() == [1, 0, 0, 2]


def _marginal_matrix(sizes: tuple[int, ...], keep: tuple[int, ...]) -> np.ndarray:
    """M with M[s, c] = 1 when joint cell c projects to sub-cell s (sub-cell code in keep order)."""
    cells = list(itertools.product(*(range(k) for k in sizes)))
    sub_sizes = [sizes[j] for j in keep]
    M = np.zeros((math.prod(sub_sizes), len(cells)))
    for c, digits in enumerate(cells):
        s = 0
        for j in keep:
            s = s * sizes[j] + digits[j]
        M[s, c] = 1
    return M


@pytest.mark.parametrize("keep", [(0,), (1,), (2,), (2, 0), (0, 1), (1, 2, 0)])
def test_marginal_estimator_is_inverse_of_a_s(keep: tuple[int, ...]) -> None:
    sizes, gamma = (2, 3, 2), 4.0
    K = math.prod(sizes)
    ch = PramChannel(gamma, K)
    M = _marginal_matrix(sizes, keep)
    K_S = M.shape[0]
    a = ch.keep
    A_S = a * np.eye(K_S) + (1 - a) / K_S * np.ones((K_S, K_S))
    # the joint channel seen on the marginal is exactly A_S: M A = A_S M
    assert np.allclose(M @ _matrix(ch), A_S @ M, atol=1e-14)
    rng = np.random.default_rng(3)
    joint = rng.integers(0, 40, K)
    sub = est.marginal_counts(joint, sizes, keep)
    assert np.array_equal(sub, (M @ joint).astype(np.int64))
    got = est.estimate_marginal(sub, ch)
    assert np.allclose(got, np.linalg.solve(A_S, sub / sub.sum()), atol=1e-12)
    # the same counts from decrypted columns
    codes = rng.integers(0, K, 500)
    cols = split_joint(codes, sizes)
    sub_codes = reference.marginal_codes(cols, sizes, keep)
    assert np.array_equal(
        est.observed_counts(sub_codes, K_S),
        est.marginal_counts(est.observed_counts(codes, K), sizes, keep),
    )
    with pytest.raises(ShapeMismatchError):
        est.marginal_counts(joint, sizes, (0, 0))
    with pytest.raises(ShapeMismatchError):
        est.marginal_counts(joint, sizes, (3,))


def _brute_projection(v: np.ndarray) -> np.ndarray:
    best, best_d = None, math.inf
    for r in range(1, v.size + 1):
        for support in itertools.combinations(range(v.size), r):
            idx = list(support)
            p = np.zeros_like(v)
            p[idx] = v[idx] - (v[idx].sum() - 1) / r
            if np.all(p >= -1e-15):
                d = float(np.sum((p - v) ** 2))
                if d < best_d:
                    best, best_d = p, d
    assert best is not None
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=7))
def test_project_to_simplex(values: list[float]) -> None:
    v = np.array(values)
    p = est.project_to_simplex(v)
    assert np.all(p >= 0)
    assert math.isclose(p.sum(), 1.0, abs_tol=1e-12)
    # KKT: p = max(v - theta, 0) for one theta
    pos = p > 0
    theta = float(np.mean((v - p)[pos]))
    assert np.allclose((v - p)[pos], theta, atol=1e-12)
    assert np.all(v[~pos] <= theta + 1e-12)
    assert np.allclose(p, _brute_projection(v), atol=1e-9)  # brute force is exact only to ~1e-10


def test_project_to_simplex_fixed_points_and_errors() -> None:
    p = np.array([0.2, 0.3, 0.5])
    assert np.allclose(est.project_to_simplex(p), p)
    assert est.project_to_simplex(np.array([5.0])).tolist() == [1.0]
    assert np.allclose(est.project_to_simplex(np.array([2.0, 0.0])), [1.0, 0.0])
    for bad in (np.array([]), np.array([np.nan, 1.0]), np.array([np.inf])):
        with pytest.raises(NonFiniteInputError):
            est.project_to_simplex(bad)


def test_projection_large_k() -> None:
    rng = np.random.default_rng(5)
    v = rng.normal(1e-6, 1e-3, 10**6)
    p = est.project_to_simplex(v)
    assert math.isclose(p.sum(), 1.0, abs_tol=1e-9) and p.min() >= 0


@pytest.mark.parametrize("K,gamma", [(4, 5.0), (24, 21.0), (6, 1.5)])
def test_mle_monotone_and_on_simplex(K: int, gamma: float) -> None:
    ch = PramChannel(gamma, K)
    rng = np.random.default_rng(K)
    counts = rng.integers(0, 30, K)
    counts[0] = 0
    counts[1] += 1
    lls = [reference.estimate_mle(counts, ch.keep, max_iterations=t).log_likelihood for t in range(1, 30)]
    assert all(b >= a - 1e-9 * abs(a) for a, b in itertools.pairwise(lls))
    res = reference.estimate_mle(counts, ch.keep, tolerance=1e-12, max_iterations=200_000)
    assert res.converged and res.iterations >= 1
    assert np.all(res.estimate >= 0) and math.isclose(res.estimate.sum(), 1.0, abs_tol=1e-9)
    assert res.log_likelihood >= lls[-1] - 1e-9
    # no simplex point has larger likelihood: compare with random points and the projection
    a, bg = ch.keep, (1 - ch.keep) / K
    loglik = lambda p: float(np.sum(counts * np.log(a * p + bg)))  # noqa: E731
    assert math.isclose(loglik(res.estimate), res.log_likelihood, rel_tol=1e-12)
    for p in rng.dirichlet(np.ones(K), 200):
        assert loglik(p) <= res.log_likelihood + 1e-9
    proj = est.project_to_simplex(est.estimate_joint(counts, ch))
    assert loglik(proj) <= res.log_likelihood + 1e-9


def test_mle_equals_inverse_when_interior() -> None:
    K, gamma = 5, 6.0
    ch = PramChannel(gamma, K)
    counts = np.array([120, 90, 80, 60, 150])
    raw = est.estimate_joint(counts, ch)
    assert np.all(raw > 0)  # interior
    res = reference.estimate_mle(counts, ch.keep, tolerance=1e-13, max_iterations=200_000)
    assert res.converged
    assert np.allclose(res.estimate, est.project_to_simplex(raw), atol=1e-6)
    assert np.allclose(res.estimate, raw, atol=1e-6)
    with pytest.raises(NonFiniteInputError):
        reference.estimate_mle(np.zeros(3), 0.5)
    with pytest.raises(NonFiniteInputError):
        reference.estimate_mle(np.array([1.0, -1.0, 2.0]), 0.5)


def test_standard_errors_and_intervals() -> None:
    ch = PramChannel(5.0, 4)
    t = np.array([0.1, 0.2, 0.3, 0.4])
    se = est.standard_errors(t, 1000, 100, ch)
    from secure_release.mechanism.privacy.accounting import cell_variance

    assert np.allclose(se**2, cell_variance(1000, 100, 4, 5.0, t))
    lo, hi = reference.confidence_intervals(t, se)
    assert np.allclose((hi - lo) / 2, est.Z_95 * se)
    assert math.isclose(est.Z_95, stats.norm.isf(0.025), rel_tol=1e-12)
    # marginal SE with K_S = K equals the joint SE (b_S = (1-a)/K = b)
    assert np.allclose(est.marginal_standard_errors(t, 1000, 100, ch), se)


# ------------------------------------------------------------------ Adult: unbiasedness, exact MSE


def _adult_population() -> tuple[np.ndarray, np.ndarray]:
    rows = ADULT_CSV.read_text().strip().splitlines()[1:]
    counts = np.array([int(r.rsplit(",", 1)[1]) for r in rows], dtype=np.int64)
    population = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    # a fixed shuffled order (the canonical order is by keyed tag, i.e. pseudo-random)
    np.random.default_rng(0).shuffle(population)
    return counts, population


def test_adult_unbiased_and_exact_mse() -> None:
    """Real sampling + real PRAM + estimate_joint on the Adult table at eps 0.5, m = m* = 1472,
    TRIALS fixed-seed releases.
    (1) mean squared l2 error vs expected_squared_error: z-test with the sample sd of the per-trial
        squared errors, |z| < 5.33 (two-sided alpha 1e-7, CLT).
    (2) each cell's mean estimate vs the truth: Bonferroni over 24 cells at total alpha 1e-6,
        |z| < norm.isf(1e-6 / 48) = 5.6.
    """
    counts, population = _adult_population()
    n, K, sizes, eps, m, trials = int(counts.sum()), 24, (6, 4), 0.5, 1472, 2000
    truth = counts / n
    gamma = gamma_from_epsilon(n, m, eps)
    ch = PramChannel(gamma, K)
    estimates = np.empty((trials, K))
    for t in range(trials):
        digest = hashlib.sha256(b"adult-trial-%d" % t).digest()
        positions = sample_positions(Seed(digest), n, m, "adult")
        cols = split_joint(population[positions], sizes)
        noisy = perturb(cols, sizes, ch, PramKey(hashlib.sha256(digest).digest()))
        estimates[t] = est.estimate_joint(est.observed_counts(joint_codes(noisy, sizes), K), ch)
    sq = ((estimates - truth) ** 2).sum(axis=1)
    expected = expected_squared_error(n, m, K, gamma, float((truth**2).sum()))
    z = (sq.mean() - expected) / (sq.std(ddof=1) / math.sqrt(trials))
    assert abs(z) < float(stats.norm.isf(0.5e-7)), (sq.mean(), expected, z)
    cell_z = (estimates.mean(axis=0) - truth) / (estimates.std(axis=0, ddof=1) / math.sqrt(trials))
    assert np.all(np.abs(cell_z) < float(stats.norm.isf(1e-6 / (2 * K)))), cell_z
