"""Accounting: Theorem 3.2 / Eq. 2 / Cor. 3.6 / Thm 3.4 and the exact MSE, at exact boundaries."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_release.mechanism.errors import (
    AlphabetOverflowError,
    EmptyDomainError,
    GammaAboveClaimError,
    GammaMismatchError,
    InvalidEpsilonError,
    InvalidGammaError,
    InvalidSampleSizeError,
    NonFiniteInputError,
)
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy import accounting as acc
from secure_release.mechanism.schema import MAX_JOINT_ALPHABET

N_ADULT, K_ADULT = 45222, 24
ADULT_CSV = Path(__file__).resolve().parents[2] / "app" / "data" / "adult_counts.csv"


def adult_counts() -> np.ndarray:
    rows = ADULT_CSV.read_text().strip().splitlines()[1:]
    return np.array([int(r.rsplit(",", 1)[1]) for r in rows], dtype=np.int64)


# docs/design.md section 3 reference numbers (rounded to 3 decimals there).
REFERENCE = [
    (0.1, 239, 0.139, 0.764),
    (0.5, 1472, 0.056, 0.308),
    (1.0, 3899, 0.034, 0.189),
]


@pytest.mark.parametrize("eps,m_star,rmse,bound", REFERENCE)
def test_design_reference_numbers(eps: float, m_star: int, rmse: float, bound: float) -> None:
    assert acc.optimal_sample_size_int(N_ADULT, K_ADULT, eps) == m_star
    assert abs(acc.optimal_sample_size(N_ADULT, K_ADULT, eps) - m_star) <= 0.5
    counts = adult_counts()
    assert counts.size == K_ADULT and counts.sum() == N_ADULT
    sum_sq = float(((counts / N_ADULT) ** 2).sum())
    gamma = acc.gamma_from_epsilon(N_ADULT, m_star, eps)
    # "RMSE from the exact formula at m*" with the Adult table's sum_c T_c^2
    assert abs(acc.predicted_rmse(N_ADULT, m_star, K_ADULT, gamma, sum_sq) - rmse) < 5e-4
    assert abs(acc.rmse_at_epsilon(N_ADULT, m_star, K_ADULT, eps, sum_sq) - rmse) < 5e-4
    # the worst case (sum_sq = 1/K) is slightly larger
    assert acc.predicted_rmse(N_ADULT, m_star, K_ADULT, gamma) > acc.predicted_rmse(
        N_ADULT, m_star, K_ADULT, gamma, sum_sq
    )
    assert abs(acc.error_bound(m_star, K_ADULT, gamma) - bound) < 5e-4
    # the tightened bound is about sqrt(K) tighter and still above the exact RMSE
    tight = acc.error_bound_tight(m_star, K_ADULT, gamma)
    assert rmse < tight < bound
    assert math.isclose(acc.epsilon_from_gamma(N_ADULT, m_star, gamma), eps, rel_tol=1e-12)


def test_formulas_against_hand_computation() -> None:
    n, m, K, g = 1000, 100, 6, 5.0
    assert math.isclose(acc.epsilon_from_gamma(n, m, g), math.log(1 + 0.1 * 4.0), rel_tol=1e-15)
    assert math.isclose(
        acc.gamma_from_epsilon(n, m, 0.5), 1 + 10 * (math.e**0.5 - 1), rel_tol=1e-14
    )
    c = 1 + K / (g - 1)
    assert math.isclose(acc.condition_number(K, g), c)
    assert math.isclose(acc.error_bound(m, K, g), (c * math.sqrt(K) + 1) / 10)
    assert math.isclose(acc.error_bound_tight(m, K, g), (c + 1) / 10)
    q = g + K - 1
    a, b = (g - 1) / q, 1 / q
    assert math.isclose(
        acc.pram_mse(m, K, g), ((a + b) * (1 - a - b) + (K - 1) * b * (1 - b)) / (m * a * a)
    )
    assert math.isclose(acc.sampling_mse(n, m, 0.3), (n - m) / (m * (n - 1)) * 0.7)
    assert acc.sampling_mse(1, 1, 0.3) == 0.0
    assert acc.sampling_mse(n, n, 0.3) == 0.0
    shares = np.array([0.5, 0.25, 0.25, 0, 0, 0])
    per_cell = acc.cell_variance(n, m, K, g, shares)
    # the per-cell variances sum to the exact MSE
    assert math.isclose(
        per_cell.sum(),
        acc.expected_squared_error(n, m, K, g, float((shares**2).sum())),
        rel_tol=1e-12,
    )
    m_star = n * (1 + math.sqrt(K)) * math.expm1(0.5) / K**1.5
    assert math.isclose(acc.optimal_sample_size(n, K, 0.5), m_star)
    assert math.isclose(
        acc.amplified_epsilon(math.log(g), m / n), acc.epsilon_from_gamma(n, m, g), rel_tol=1e-12
    )


def test_optimal_sample_size_clamped() -> None:
    assert acc.optimal_sample_size(10, 10**6, 0.01) == 1.0  # tiny m* -> 1
    assert acc.optimal_sample_size(10, 2, 20.0) == 10.0  # huge m* -> n
    assert acc.optimal_sample_size_int(10, 10**6, 0.01) == 1
    assert acc.optimal_sample_size_int(10, 2, 20.0) == 10


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 10**7), st.integers(2, 10**6), st.floats(1e-4, 10.0))
def test_optimal_sample_size_in_range(n: int, K: int, eps: float) -> None:
    ms = acc.optimal_sample_size(n, K, eps)
    assert 1.0 <= ms <= n
    assert 1 <= acc.optimal_sample_size_int(n, K, eps) <= n


def _brute_mse(n: int, K: int, eps: float, m: int) -> float:
    return acc.expected_squared_error(n, m, K, acc.gamma_from_epsilon(n, m, eps), 1.0 / K)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 1500), st.integers(2, 200), st.floats(0.01, 5.0))
def test_error_minimizing_sample_size_is_brute_force_argmin(n: int, K: int, eps: float) -> None:
    got = acc.error_minimizing_sample_size(n, K, eps)
    assert 1 <= got <= n
    values = [_brute_mse(n, K, eps, m) for m in range(1, n + 1)]
    best = min(values)
    assert values[got - 1] <= best * (1 + 1e-12)


@pytest.mark.parametrize(
    "n,K,eps", [(45222, 24, 0.1), (45222, 24, 0.5), (45222, 24, 1.0), (5000, 1000, 2.0)]
)
def test_error_minimizing_sample_size_large_n(n: int, K: int, eps: float) -> None:
    got = acc.error_minimizing_sample_size(n, K, eps)
    ms = np.arange(1, n + 1)
    vals = np.array([_brute_mse(n, K, eps, int(m)) for m in ms[:: max(1, n // 3000)]])
    assert _brute_mse(n, K, eps, got) <= vals.min() * (1 + 1e-12)
    for m in (got - 1, got + 1):
        if 1 <= m <= n:
            assert _brute_mse(n, K, eps, got) <= _brute_mse(n, K, eps, m)


@pytest.mark.parametrize("K", [2, 24, 1000])
@pytest.mark.parametrize("gamma", [1.001, 3.0, 21.0, 1e5])
def test_randomized_response_parameters_consistent(K: int, gamma: float) -> None:
    ch = PramChannel(gamma, K)
    q = gamma + K - 1
    keep = acc.krr_keep_probability(K, gamma)
    assert math.isclose(keep, gamma / q, rel_tol=1e-14)
    assert math.isclose(keep, ch.diagonal, rel_tol=1e-14)
    assert acc.opendp_prob(K, gamma) == keep
    p = acc.dp_accounting_noise_parameter(K, gamma)
    assert 0 < p < 1
    assert math.isclose(1 - p + p / K, gamma / q, rel_tol=1e-12)
    assert math.isclose(p, 1 - ch.keep, rel_tol=1e-9)
    # k-RR with this keep probability is ln(gamma)-DP: truth / other = gamma
    assert math.isclose(keep / ((1 - keep) / (K - 1)), gamma, rel_tol=1e-9)


# ------------------------------------------------------------------ boundaries


def test_gamma_boundary() -> None:
    with pytest.raises(InvalidGammaError):
        acc.epsilon_from_gamma(10, 5, 1.0)
    with pytest.raises(InvalidGammaError):
        acc.epsilon_from_gamma(10, 5, 0.999)
    assert acc.epsilon_from_gamma(10, 5, 1 + 1e-12) > 0
    for f in (acc.condition_number, acc.krr_keep_probability, acc.dp_accounting_noise_parameter):
        with pytest.raises(InvalidGammaError):
            f(24, 1.0)
        assert f(24, 1 + 1e-12) > 0
    with pytest.raises(InvalidGammaError):
        acc.error_bound(10, 24, 1.0)
    with pytest.raises(InvalidGammaError):
        acc.pram_mse(10, 24, 1.0)


def test_sample_size_boundary() -> None:
    for m in (0, 11, -1, 2.5, True):
        with pytest.raises(InvalidSampleSizeError):
            acc.epsilon_from_gamma(10, m, 3.0)  # type: ignore[arg-type]
        with pytest.raises(InvalidSampleSizeError):
            acc.gamma_from_epsilon(10, m, 0.5)  # type: ignore[arg-type]
    for m in (1, 10):
        assert acc.epsilon_from_gamma(10, m, 3.0) > 0
        assert acc.gamma_from_epsilon(10, m, 0.5) > 1
    with pytest.raises(InvalidSampleSizeError):
        acc.optimal_sample_size(0, 24, 0.5)
    with pytest.raises(EmptyDomainError):
        acc.optimal_sample_size(10, 1, 0.5)  # K must be >= 2: K = 1 is an empty-domain error
    with pytest.raises(InvalidSampleSizeError):
        acc.amplified_epsilon(1.0, 0.0)
    with pytest.raises(InvalidSampleSizeError):
        acc.amplified_epsilon(1.0, 1.5)
    assert acc.amplified_epsilon(1.0, 1.0) == pytest.approx(1.0, rel=1e-15)


def test_epsilon_boundary() -> None:
    for eps in (0, 0.0, -0.1, -1e-300, True, "0.5", None):
        with pytest.raises(InvalidEpsilonError):
            acc.gamma_from_epsilon(10, 5, eps)  # type: ignore[arg-type]
        with pytest.raises(InvalidEpsilonError):
            acc.optimal_sample_size(10, 24, eps)  # type: ignore[arg-type]
    assert acc.gamma_from_epsilon(10, 5, 5e-324) >= 1.0
    assert acc.check_epsilon(1e-300) == 1e-300


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite(bad: float) -> None:
    with pytest.raises(NonFiniteInputError):
        acc.gamma_from_epsilon(10, 5, bad)
    with pytest.raises(NonFiniteInputError):
        acc.epsilon_from_gamma(10, 5, bad)
    with pytest.raises(NonFiniteInputError):
        acc.optimal_sample_size(10, 24, bad)
    with pytest.raises(NonFiniteInputError):
        acc.expected_squared_error(10, 5, 24, 3.0, bad)
    with pytest.raises(NonFiniteInputError):
        acc.condition_number(24, bad)


def test_sum_sq_range_and_joint_overflow() -> None:
    for bad in (-0.1, 1.1):
        with pytest.raises(NonFiniteInputError):
            acc.expected_squared_error(10, 5, 24, 3.0, bad)
    assert acc.expected_squared_error(10, 5, 24, 3.0, 0.0) > 0
    assert acc.condition_number(MAX_JOINT_ALPHABET, 3.0) > 1
    with pytest.raises(AlphabetOverflowError):
        acc.condition_number(MAX_JOINT_ALPHABET + 1, 3.0)
    with pytest.raises(AlphabetOverflowError):
        PramChannel(3.0, MAX_JOINT_ALPHABET + 1)
    assert PramChannel(3.0, MAX_JOINT_ALPHABET).joint_size == MAX_JOINT_ALPHABET


# --- exact privacy checks: never round in the adversary's favour ----------------------------


def _exact_epsilon_exceeds(n: int, m: int, gamma: float, eps: float) -> bool:
    """Independent check with 80-digit decimals: 1 + (m/n)(gamma - 1) > e^eps."""
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 80
        base = 1 + Decimal(m) / Decimal(n) * (Decimal(gamma) - 1)
        return bool(base > Decimal(eps).exp())


@pytest.mark.parametrize(
    ("n", "m", "eps"),
    [(45222, 239, 0.1), (45222, 1472, 0.5), (45222, 3899, 1.0), (100000, 177, 1.0), (10, 10, math.log(9))],
)
def test_declared_gamma_exact_boundary(n: int, m: int, eps: float) -> None:
    """OpenDP style: Eq. 2's value (rounded down) passes, the next float above it fails."""
    gamma = acc.gamma_from_epsilon(n, m, eps)
    assert acc.check_declared_gamma(n, m, eps, gamma) == gamma
    assert not _exact_epsilon_exceeds(n, m, gamma, eps)
    above = math.nextafter(gamma, math.inf)
    assert _exact_epsilon_exceeds(n, m, above, eps)
    with pytest.raises(GammaAboveClaimError, match="Allowed: gamma <="):
        acc.check_declared_gamma(n, m, eps, above)
    # the old check accepted up to 1e-9 relative above; that is refused now
    with pytest.raises(GammaAboveClaimError):
        acc.check_declared_gamma(n, m, eps, gamma * (1 + 5e-10))
    # below Eq. 2 is more private; within the tolerance it passes, beyond it is a mismatch
    assert acc.check_declared_gamma(n, m, eps, math.nextafter(gamma, 0.0)) < gamma
    with pytest.raises(GammaMismatchError, match="never above"):
        acc.check_declared_gamma(n, m, eps, 1 + (gamma - 1) * 0.5)


def test_plain_pram_boundary_ln9() -> None:
    """m = n: epsilon = ln gamma. gamma = 9 at epsilon = float(ln 9) passes iff ln 9's float
    rounding is at or above the exact value; the exact comparison decides, not a tolerance."""
    eps = math.log(9.0)
    exceeds = _exact_epsilon_exceeds(1, 1, 9.0, eps)
    if exceeds:
        with pytest.raises(GammaAboveClaimError):
            acc.check_declared_gamma(1, 1, eps, 9.0)
    else:
        assert acc.check_declared_gamma(1, 1, eps, 9.0) == 9.0
    assert acc.check_declared_gamma(1, 1, math.nextafter(eps, math.inf), 9.0) == 9.0
    with pytest.raises(GammaAboveClaimError):
        acc.check_declared_gamma(1, 1, math.nextafter(eps, 0.0) if not exceeds else eps, 9.0)


@given(
    n=st.integers(1, 10**9),
    frac=st.floats(1e-6, 1.0),
    eps=st.floats(1e-6, 20.0),
)
@settings(max_examples=60, deadline=None)
def test_eq2_rounds_down_and_eq1_rounds_up(n: int, frac: float, eps: float) -> None:
    m = max(1, min(n, round(n * frac)))
    gamma = acc.gamma_from_epsilon(n, m, eps)
    if gamma <= 1.0:
        return
    assert not _exact_epsilon_exceeds(n, m, gamma, eps)
    assert _exact_epsilon_exceeds(n, m, math.nextafter(gamma, math.inf), eps)
    realised = acc.epsilon_from_gamma(n, m, gamma)
    assert realised <= eps  # gamma was rounded down, so its (rounded-up) epsilon stays below
    assert not _exact_epsilon_exceeds(n, m, gamma, realised)  # rounded up: >= the exact value
    assert _exact_epsilon_exceeds(n, m, gamma, math.nextafter(realised, 0.0))


def test_compare_with_exp_is_exact_near_ties() -> None:
    from fractions import Fraction

    x = Fraction(0.5)
    # a rational within 1e-60 of e^0.5 on either side
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 120
        e = Fraction(Decimal("0.5").exp())
    assert acc.compare_with_exp(e + Fraction(1, 10**60), x) == 1
    assert acc.compare_with_exp(e - Fraction(1, 10**60), x) == -1
    assert acc.compare_with_exp(Fraction(1), Fraction(0)) == 0
    assert acc.compare_with_exp(Fraction(0), Fraction(3)) == -1


def test_channel_based_accounting_matches_formulas() -> None:
    ch = PramChannel(7.5, 24)
    q = 7.5 + 23
    a, b = 6.5 / q, 1 / q
    assert acc.channel_pram_mse(100, ch) == pytest.approx(
        ((a + b) * (1 - a - b) + 23 * b * (1 - b)) / (100 * a * a), rel=1e-14
    )
    assert acc.pram_mse(100, 24, 7.5) == acc.channel_pram_mse(100, ch)
    assert acc.krr_keep_probability(24, 7.5) == pytest.approx(7.5 / q, rel=1e-15)
    assert acc.dp_accounting_noise_parameter(24, 7.5) == pytest.approx(24 / q, rel=1e-15)


def test_single_cell_domain_is_an_empty_domain_error() -> None:
    for f in (
        lambda: acc.optimal_sample_size(100, 1, 1.0),
        lambda: acc.pram_mse(10, 1, 3.0),
        lambda: acc.error_minimizing_sample_size(100, 1, 1.0),
        lambda: acc.condition_number(1, 3.0),
    ):
        with pytest.raises(EmptyDomainError, match="K = 1 has a single cell"):
            f()


# --- plan warns when the predicted error swamps a typical cell ------------------------------


def test_plan_warning_absent_on_adult_and_present_at_huge_k() -> None:
    from secure_release.mechanism.privacy.plan import plan_release

    for eps in (0.1, 0.5, 1.0):
        plan = plan_release(N_ADULT, (6, 4), eps)
        rep = plan.report()
        assert rep["warning"] is None
        assert rep["predicted_rmse_per_cell"] <= 1 / 24
    huge = plan_release(100_000, (2**20, 2**20), 1.0)
    warning = huge.report()["warning"]
    assert warning is not None and "exceeds the typical cell share" in warning
    assert "No m in [1, 100000]" in warning


def test_plan_warning_names_an_m_or_epsilon_that_works() -> None:
    from secure_release.mechanism.privacy.plan import plan_release

    # a bad m at an epsilon where a better m exists
    plan = plan_release(N_ADULT, (6, 4), 0.5, m=3)
    warning = plan.utility_warning()
    assert warning is not None
    m_best, best = acc.best_rmse_at_epsilon(N_ADULT, 24, 0.5)
    assert f"m = {m_best} would not" in warning and best / math.sqrt(24) <= 1 / 24
    # K = 1000 at epsilon 0.1: no m works; the named epsilon does, 0.2% less does not
    wide = plan_release(N_ADULT, (40, 25), 0.1)
    assert "epsilon >=" in (wide.utility_warning() or "")
    target = math.sqrt(1000) / 1000
    eps = acc.smallest_epsilon_for_rmse(N_ADULT, 1000, target)
    assert eps is not None
    assert acc.best_rmse_at_epsilon(N_ADULT, 1000, eps)[1] <= target
    assert acc.best_rmse_at_epsilon(N_ADULT, 1000, eps / 1.002)[1] > target
    assert acc.smallest_epsilon_for_rmse(10, 2**40, 1e-12) is None


def test_plan_refuses_a_single_cell_domain() -> None:
    from secure_release.mechanism.privacy.plan import plan_release

    with pytest.raises(EmptyDomainError, match="need K >= 2"):
        plan_release(100, (1, 1), 1.0)
