"""Fast count-level simulator: unbiasedness, exact MSE, batched estimators, per-record agreement."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from secure_release.mechanism.estimation.estimators import project_to_simplex
from secure_release.mechanism.estimation.reference import estimate_mle, estimate_mle_batch
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.simulation.datasets import synthetic_counts
from secure_release.mechanism.simulation.monte_carlo import (
    fast_observed_counts,
    per_record_observed_counts,
    project_to_simplex_batch,
    simulate_point,
)
from secure_release.tables import adult

ALPHA = 1e-6  # family-wise significance level of every statistical test in this file


def _z_bound(tests: int) -> float:
    """Two-sided normal quantile with a Bonferroni correction over ``tests`` tests."""
    return float(stats.norm.isf(ALPHA / (2 * tests)))


@pytest.mark.parametrize("eps,m", [(0.1, 239), (1.0, 3899), (0.5, 20000)])
def test_fast_path_unbiased_and_mse_matches_formula(eps: float, m: int) -> None:
    table = adult()
    c, n, K = table.counts, table.n, table.joint_size
    rng = np.random.default_rng(12345)
    gamma = accounting.gamma_from_epsilon(n, m, eps)
    ch = PramChannel(gamma, K)
    trials = 4000
    obs = fast_observed_counts(c, m, ch.keep, trials, rng)
    est = (obs / m - ch.off_diagonal) / ch.keep
    truth = c / n
    # per-cell mean: z-test against the exact per-cell variance, Bonferroni over K cells
    var = accounting.cell_variance(n, m, K, gamma, truth)
    z = (est.mean(axis=0) - truth) / np.sqrt(var / trials)
    assert np.max(np.abs(z)) < _z_bound(K)
    # mean squared l2 error vs the exact formula: z-test with the empirical sd of ||e||^2
    sq = np.sum((est - truth) ** 2, axis=1)
    expected = accounting.expected_squared_error(n, m, K, gamma, float(np.sum(truth**2)))
    z_mse = (sq.mean() - expected) / (sq.std(ddof=1) / math.sqrt(trials))
    assert abs(z_mse) < _z_bound(1)


def test_batched_projection_equals_row_by_row() -> None:
    v = np.random.default_rng(3).normal(0.04, 0.1, size=(200, 24))
    batch = project_to_simplex_batch(v)
    for i in range(v.shape[0]):
        np.testing.assert_allclose(batch[i], project_to_simplex(v[i]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("m", [239, 3000])
def test_batched_mle_equals_estimate_mle_row_by_row(m: int) -> None:
    table = adult()
    gamma = accounting.gamma_from_epsilon(table.n, m, 0.1)
    ch = PramChannel(gamma, 24)
    obs = fast_observed_counts(table.counts, m, ch.keep, 40, np.random.default_rng(7))
    batch = estimate_mle_batch(obs, ch.keep, max_iterations=3000)
    for i in range(obs.shape[0]):
        ref = estimate_mle(obs[i], ch.keep, max_iterations=3000)
        np.testing.assert_array_equal(batch.estimate[i], ref.estimate)
        assert batch.iterations[i] == ref.iterations
        assert batch.converged[i] == ref.converged


def test_fast_path_and_per_record_path_same_distribution() -> None:
    """Per cell: Welch z-test of the means of the raw estimate (Bonferroni over K cells) and
    a two-sample KS test of the l2 error, all at family-wise level ALPHA = 1e-6."""
    counts = synthetic_counts("linear", 8, 2000)
    n, K, m, eps = 2000, 8, 300, 1.0
    gamma = accounting.gamma_from_epsilon(n, m, eps)
    ch = PramChannel(gamma, K)
    rng = np.random.default_rng(99)
    trials = 300
    slow = per_record_observed_counts(counts, [4, 2], m, ch, trials, rng)
    fast = fast_observed_counts(counts, m, ch.keep, 3000, rng)
    assert np.all(slow.sum(axis=1) == m)
    est_s = (slow / m - ch.off_diagonal) / ch.keep
    est_f = (fast / m - ch.off_diagonal) / ch.keep
    truth = counts / n
    se = np.sqrt(est_s.var(axis=0, ddof=1) / trials + est_f.var(axis=0, ddof=1) / fast.shape[0])
    z = (est_s.mean(axis=0) - est_f.mean(axis=0)) / se
    tests = K + 1
    assert np.max(np.abs(z)) < _z_bound(tests)
    err_s = np.linalg.norm(est_s - truth, axis=1)
    err_f = np.linalg.norm(est_f - truth, axis=1)
    assert stats.ks_2samp(err_s, err_f).pvalue > ALPHA / tests
    # and the per-record mean squared error matches the exact formula (chi-square-free z-test)
    sq = np.sum((est_s - truth) ** 2, axis=1)
    expected = accounting.expected_squared_error(n, m, K, gamma, float(np.sum(truth**2)))
    assert abs(sq.mean() - expected) / (sq.std(ddof=1) / math.sqrt(trials)) < _z_bound(1)


def test_simulate_point_summary_keys_and_marginals() -> None:
    table = adult()
    pt = simulate_point(table.counts, 0.5, 1472, 200, np.random.default_rng(1), table.alphabet_sizes)
    s = pt.summary()
    for key in ("mean_l2_error", "mean_l2_error_projected", "mean_l2_error_mle", "se_mean_l2_error",
                "predicted_rmse", "bound", "bound_tight", "mean_l2_error_marginals"):
        assert s[key] is not None
    assert s["mean_l2_error_projected"] <= s["mean_l2_error"] + 1e-12
    assert len(s["mean_l2_error_marginals"]) == 2
    assert s["mean_l2_error"] < s["bound_tight"] < s["bound"]
