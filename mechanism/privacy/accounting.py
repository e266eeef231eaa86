"""Privacy and utility accounting: one small pure function per formula.

References are to Lin, Wang, Rane 2013 (docs/references.md) and docs/design.md section 3. Arguments are checked
at their exact boundaries: gamma > 1, epsilon > 0, integers 1 <= m <= n, all finite.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import (
    AlphabetOverflowError,
    EmptyDomainError,
    GammaAboveClaimError,
    GammaMismatchError,
    InvalidEpsilonError,
    InvalidSampleSizeError,
    NonFiniteInputError,
)
from secure_release.mechanism.primitives.pram import PramChannel, check_gamma
from secure_release.mechanism.primitives.sampling import check_sample_size
from secure_release.mechanism.schema import MAX_JOINT_ALPHABET


def check_epsilon(epsilon: float) -> float:
    """Raise unless epsilon is a finite number > 0."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise InvalidEpsilonError(f"epsilon must be a number > 0, got {epsilon!r}")
    if not math.isfinite(epsilon):
        raise NonFiniteInputError(f"epsilon must be finite, got {epsilon!r}")
    if epsilon <= 0:
        raise InvalidEpsilonError(f"epsilon must be > 0, got {epsilon!r}")
    return float(epsilon)


def _check_joint_size(joint_size: int) -> int:
    if isinstance(joint_size, bool) or int(joint_size) != joint_size or joint_size < 2:
        raise EmptyDomainError(
            f"the joint alphabet K must be an integer >= 2 (K = 1 has a single cell: its "
            f"share is 1 by definition and there is nothing to release), got {joint_size!r}"
        )
    if joint_size > MAX_JOINT_ALPHABET:
        raise AlphabetOverflowError(
            f"joint alphabet K = {joint_size} exceeds {MAX_JOINT_ALPHABET} (joint codes are int64)"
        )
    return int(joint_size)


def compare_with_exp(value: Fraction, exponent: Fraction) -> int:
    """Sign of value - e^exponent, exactly (derived here; used by every privacy check).

    e^x is irrational for rational x != 0 (Lindemann), so for x != 0 the sign is never 0. The
    decimal module rounds exp correctly (half-even, error <= 1/2 ulp), so a decimal e^x at
    precision p decides the sign as soon as |value - e^x| exceeds one ulp; otherwise the
    precision doubles. Exact for every finite float input.
    """
    if exponent == 0:
        return (value > 1) - (value < 1)
    if value <= 0:
        return -1
    decided = _compare_by_magnitude(value, exponent)
    if decided:
        return decided
    precision = 40
    while True:
        approx, slack = _exp_with_error(exponent.numerator, exponent.denominator, precision)
        if value > approx + slack:
            return 1
        if value < approx - slack:
            return -1
        precision *= 2


def _compare_by_magnitude(value: Fraction, exponent: Fraction) -> int:
    """Sign of value - e^exponent when their sizes alone decide it, else 0; keeps the decimal
    exp of :func:`compare_with_exp` in range (no overflow for any finite float exponent).

    With b = bits(numerator) - bits(denominator), 2^(b-1) < value < 2^(b+1); ln 2 < 0.7 and
    ln 2 > 0.69, so exponent > 0.7 (|b| + 2) puts e^exponent above value, and exponent below
    -0.7 (|b| + 2) puts it below."""
    bits = value.numerator.bit_length() - value.denominator.bit_length()
    reach = Fraction(7, 10) * (abs(bits) + 2)
    if exponent > reach:
        return -1
    if exponent < -reach:
        return 1
    return 0


@functools.lru_cache(maxsize=256)
def _exp_with_error(numerator: int, denominator: int, precision: int) -> tuple[Fraction, Fraction]:
    """(e^x rounded to ``precision`` digits, a bound on its error), x = numerator/denominator.

    The division and exp each round by <= 1/2 ulp (relative 10^(1-p)/2); the division's error
    is amplified by |x| in exp, so |approx - e^x| < 10 (1 + |x|) ulp(approx) < the bound."""
    with localcontext() as ctx:
        ctx.prec = precision
        approx = (Decimal(numerator) / Decimal(denominator)).exp()
        ulp = Decimal(1).scaleb(approx.adjusted() - precision + 1)
    return Fraction(approx), 16 * Fraction(ulp) * (1 + abs(Fraction(numerator, denominator)))


def _amplified_base(n: int, m: int, gamma: float) -> Fraction:
    """1 + (m/n)(gamma - 1) as an exact rational (the argument of the log in Eq. 1)."""
    return 1 + Fraction(m, n) * (Fraction(gamma) - 1)


def epsilon_from_gamma(n: int, m: int, gamma: float) -> float:
    """Theorem 3.2, Eq. (1): epsilon = ln(1 + (m/n)(gamma - 1)); tight (Example 3.3).

    Rounded up (never below the exact value): a reported epsilon must not understate the loss.
    """
    check_sample_size(n, m)
    gamma = check_gamma(gamma)
    base = _amplified_base(n, m, gamma)
    eps = math.log1p(m / n * (gamma - 1.0))
    while compare_with_exp(base, Fraction(eps)) > 0:  # e^eps < base: eps too small
        eps = math.nextafter(eps, math.inf)
    while eps > 0 and compare_with_exp(base, Fraction(math.nextafter(eps, 0.0))) < 0:
        eps = math.nextafter(eps, 0.0)  # the next float below is still >= the exact value
    return eps


def gamma_from_epsilon(n: int, m: int, epsilon: float) -> float:
    """Eq. (2): gamma = 1 + (n/m)(e^epsilon - 1), the PRAM level that gives epsilon.

    Rounded down to the largest float whose exact epsilon (Eq. 1) is <= ``epsilon``, so the
    value a curator declares always passes :func:`check_declared_gamma`.
    """
    check_sample_size(n, m)
    epsilon = check_epsilon(epsilon)
    target = Fraction(epsilon)
    gamma = _float_gamma(n, m, epsilon)
    while gamma > 1.0 and compare_with_exp(_amplified_base(n, m, gamma), target) > 0:
        gamma = math.nextafter(gamma, 0.0)
    while compare_with_exp(_amplified_base(n, m, math.nextafter(gamma, math.inf)), target) < 0:
        gamma = math.nextafter(gamma, math.inf)
    return gamma


def _float_gamma(n: int, m: int, epsilon: float) -> float:
    """1 + (n/m)(e^epsilon - 1) in floats; :class:`InvalidEpsilonError` if it is not finite."""
    try:
        gamma = 1.0 + n / m * math.expm1(epsilon)
    except OverflowError:
        gamma = math.inf
    if not math.isfinite(gamma):
        raise InvalidEpsilonError(
            f"epsilon = {epsilon!r} is too large: gamma = 1 + (n/m)(e^epsilon - 1) exceeds the largest float "
            f"for n = {n}, m = {m}; epsilon must stay below about {math.log(1.7e308 * m / n):.1f} here (and far "
            "below that to protect anyone)"
        )
    return gamma


def check_declared_gamma(n: int, m: int, epsilon: float, gamma: float, rel_tol_below: float = 1e-9) -> float:
    """Refuse a declared gamma whose exact epsilon (Eq. 1) exceeds the declared epsilon.

    Exact: ln(1 + (m/n)(gamma - 1)) <= epsilon  <=>  1 + (m/n)(gamma - 1) <= e^epsilon, compared
    with exact rationals by :func:`compare_with_exp` (no rounding in anyone's favour). A gamma
    below Eq. 2's value is more private than claimed, but one more than ``rel_tol_below``
    (relative) below it does not follow from the release parameters and is refused as a
    mismatch. Returns gamma.
    """
    check_sample_size(n, m)
    eps = check_epsilon(epsilon)
    gamma = check_gamma(gamma)
    if compare_with_exp(_amplified_base(n, m, gamma), Fraction(eps)) > 0:
        allowed = gamma_from_epsilon(n, m, eps)
        raise GammaAboveClaimError(
            f"gamma {gamma!r} gives epsilon above the declared {eps!r} for n = {n}, m = {m}: "
            f"Eq. 1 makes the realised loss ln(1 + (m/n)(gamma - 1)) > epsilon. Allowed: "
            f"gamma <= {allowed!r} (Eq. 2, rounded down)"
        )
    expected = gamma_from_epsilon(n, m, eps)
    if gamma < expected * (1.0 - rel_tol_below):
        raise GammaMismatchError(
            f"gamma {gamma!r} does not follow from epsilon {eps!r}, n = {n}, m = {m}: Eq. 2 "
            f"gives {expected!r}; allowed: within a relative {rel_tol_below:g} below it, "
            "never above"
        )
    return gamma


def optimal_sample_size(n: int, joint_size: int, epsilon: float) -> float:
    """Corollary 3.6, Eq. (5): m* = n (1 + sqrt K)(e^eps - 1) / K^(3/2), clamped to [1, n]."""
    check_sample_size(n, 1)
    K = _check_joint_size(joint_size)
    epsilon = check_epsilon(epsilon)
    m_star = n * (1.0 + math.sqrt(K)) * math.expm1(min(epsilon, 700.0)) / K**1.5  # clamped to n anyway
    return float(min(max(m_star, 1.0), float(n)))


def optimal_sample_size_int(n: int, joint_size: int, epsilon: float) -> int:
    """m* of Eq. (5) rounded to the nearest integer in [1, n]."""
    return min(max(round(optimal_sample_size(n, joint_size, epsilon)), 1), n)


def condition_number(joint_size: int, gamma: float) -> float:
    """Theorem 3.4: c = 1 + K/(gamma - 1), the condition number of A."""
    K = _check_joint_size(joint_size)
    return 1.0 + K / (check_gamma(gamma) - 1.0)


def error_bound(m: int, joint_size: int, gamma: float) -> float:
    """Theorem 3.4, Eq. (3): E||T_hat - T||_2 <= (c sqrt K + 1)/sqrt m."""
    check_sample_size(m, m)
    c = condition_number(joint_size, gamma)
    return (c * math.sqrt(joint_size) + 1.0) / math.sqrt(m)


def error_bound_tight(m: int, joint_size: int, gamma: float) -> float:
    """Sec. IV, the paper's tightened bound: (c + 1)/sqrt m."""
    check_sample_size(m, m)
    return (condition_number(joint_size, gamma) + 1.0) / math.sqrt(m)


def sampling_mse(n: int, m: int, sum_sq: float) -> float:
    """DESIGN 3, first term: (n - m)/(m (n - 1)) (1 - sum_c T_c^2) (hypergeometric)."""
    check_sample_size(n, m)
    if n == 1:
        return 0.0
    return (n - m) / (m * (n - 1)) * (1.0 - sum_sq)


def pram_mse(m: int, joint_size: int, gamma: float) -> float:
    """DESIGN 3, second term: [(a+b)(1-a-b) + (K-1) b (1-b)] / (m a^2)."""
    _check_joint_size(joint_size)
    return channel_pram_mse(m, PramChannel(check_gamma(gamma), int(joint_size)))


def channel_pram_mse(m: int, channel: PramChannel) -> float:
    """DESIGN 3, second term, with a and b from the channel: [(a+b)(1-a-b) + (K-1) b (1-b)]/(m a^2)."""
    check_sample_size(m, m)
    a, b, K = channel.keep, channel.off_diagonal, channel.joint_size
    return ((a + b) * (1.0 - a - b) + (K - 1.0) * b * (1.0 - b)) / (m * a * a)


def expected_squared_error(n: int, m: int, joint_size: int, gamma: float, sum_sq: float) -> float:
    """DESIGN 3: E||T_hat - T||^2 = sampling_mse + pram_mse (exact for the A^-1 estimator)."""
    if not math.isfinite(sum_sq) or not 0.0 <= sum_sq <= 1.0:
        raise NonFiniteInputError(f"sum of squared cell shares must be in [0, 1], got {sum_sq!r}")
    return sampling_mse(n, m, sum_sq) + pram_mse(m, joint_size, gamma)


def predicted_rmse(n: int, m: int, joint_size: int, gamma: float, sum_sq: float | None = None) -> float:
    """sqrt of :func:`expected_squared_error`; ``sum_sq=None`` takes the worst case 1/K."""
    worst = 1.0 / joint_size if sum_sq is None else sum_sq
    return math.sqrt(expected_squared_error(n, m, joint_size, gamma, worst))


def predicted_rmse_per_cell(
    n: int, m: int, joint_size: int, gamma: float, sum_sq: float | None = None
) -> float:
    """The l2 RMSE of :func:`predicted_rmse` spread over the K cells, RMSE / sqrt K (DESIGN 3):
    what a plan compares with the typical cell share 1/K."""
    return predicted_rmse(n, m, joint_size, gamma, sum_sq) / math.sqrt(joint_size)


def cell_variance(n: int, m: int, joint_size: int, gamma: float, shares: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """DESIGN 3, per cell variance of T_hat_c:
    T_c(1-T_c)(n-m)/(m(n-1)) + [T_c(a+b)(1-a-b) + (1-T_c) b(1-b)]/(m a^2)."""
    K = _check_joint_size(joint_size)
    channel = PramChannel(check_gamma(gamma), K)
    return channel_cell_variance(n, m, channel.keep, channel.off_diagonal, shares)


def channel_cell_variance(
    n: int, m: int, keep: float, off_diagonal: float, shares: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """DESIGN 3 per-cell variance for any "keep w.p. a, else uniform" channel with off-diagonal
    b: the joint (b = 1/q) or a curator subset's marginal (b = (1 - a)/K_S, DESIGN 3.5)."""
    check_sample_size(n, m)
    t = np.clip(np.asarray(shares, dtype=np.float64), 0.0, 1.0)
    a, b = keep, off_diagonal
    sampling = t * (1.0 - t) * ((n - m) / (m * (n - 1)) if n > 1 else 0.0)
    pram = (t * (a + b) * (1.0 - a - b) + (1.0 - t) * b * (1.0 - b)) / (m * a * a)
    return np.asarray(sampling + pram, dtype=np.float64)


def rmse_at_epsilon(n: int, m: int, joint_size: int, epsilon: float, sum_sq: float | None = None) -> float:
    """Predicted RMSE of a release at privacy epsilon with m samples (gamma from Eq. 2)."""
    return predicted_rmse(n, m, joint_size, gamma_from_epsilon(n, m, epsilon), sum_sq)


def error_minimizing_sample_size(n: int, joint_size: int, epsilon: float, sum_sq: float | None = None) -> int:
    """The integer m in [1, n] minimizing the exact predicted error at fixed epsilon.

    The predicted MSE is unimodal in m here; it is evaluated on a geometric grid and then
    refined exactly over the integers around the grid minimum (vectorized, no loop over m).
    """
    check_sample_size(n, 1)
    K = _check_joint_size(joint_size)
    eps = check_epsilon(epsilon)
    worst = 1.0 / K if sum_sq is None else sum_sq

    def mse(ms: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        gamma = 1.0 + n / ms * math.expm1(min(eps, 700.0))  # past e^700 gamma only grows: no overflow
        q = gamma + K - 1.0
        a, b = (gamma - 1.0) / q, 1.0 / q
        samp = (n - ms) / (ms * (n - 1)) * (1.0 - worst) if n > 1 else 0.0 * ms
        return np.asarray(samp + ((a + b) * (1 - a - b) + (K - 1) * b * (1 - b)) / (ms * a * a))

    grid = np.unique(np.round(np.geomspace(1, n, num=min(n, 2000))))
    best = int(grid[int(np.argmin(mse(grid)))])
    idx = int(np.searchsorted(grid, best))
    lo = int(grid[max(idx - 1, 0)])
    hi = int(grid[min(idx + 1, grid.size - 1)])
    fine = np.arange(lo, hi + 1, dtype=np.float64)
    return int(fine[int(np.argmin(mse(fine)))])


def best_rmse_at_epsilon(
    n: int, joint_size: int, epsilon: float, sum_sq: float | None = None
) -> tuple[int, float]:
    """(m, RMSE) at the error-minimizing m for this epsilon (DESIGN 3 exact MSE; derived here)."""
    m = error_minimizing_sample_size(n, joint_size, epsilon, sum_sq)
    return m, rmse_at_epsilon(n, m, joint_size, epsilon, sum_sq)


def smallest_epsilon_for_rmse(
    n: int,
    joint_size: int,
    target: float,
    sum_sq: float | None = None,
    max_epsilon: float = 50.0,
) -> float | None:
    """The smallest epsilon (to 0.1% relative) at which some m in [1, n] predicts an RMSE <=
    ``target``, or None if not even ``max_epsilon`` does (derived here: the best RMSE over m
    falls as epsilon grows, so bisection in log epsilon)."""
    if not math.isfinite(target) or target <= 0:
        raise NonFiniteInputError(f"target RMSE must be a finite number > 0, got {target!r}")
    if best_rmse_at_epsilon(n, joint_size, max_epsilon, sum_sq)[1] > target:
        return None
    lo, hi = 1e-6, max_epsilon
    if best_rmse_at_epsilon(n, joint_size, lo, sum_sq)[1] <= target:
        return lo
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if best_rmse_at_epsilon(n, joint_size, mid, sum_sq)[1] <= target:
            hi = mid
        else:
            lo = mid
    return hi


def krr_keep_probability(joint_size: int, gamma: float) -> float:
    """k-ary randomized response with epsilon_0 = ln gamma: P(report = truth) = gamma/q."""
    K = _check_joint_size(joint_size)
    return PramChannel(check_gamma(gamma), K).diagonal


def opendp_prob(joint_size: int, gamma: float) -> float:
    """OpenDP ``make_randomized_response(categories, prob)``: prob = P(truth) = gamma/q."""
    return krr_keep_probability(joint_size, gamma)


def dp_accounting_noise_parameter(joint_size: int, gamma: float) -> float:
    """dp_accounting ``RandomizedResponseDpEvent(noise_parameter, num_buckets=K)``.

    There the true bucket is replaced, with probability noise_parameter, by a uniform bucket:
    P(truth) = 1 - p + p/K. Setting it to gamma/q gives p = K/q = K b = 1 - a.
    """
    K = _check_joint_size(joint_size)
    channel = PramChannel(check_gamma(gamma), K)
    return channel.joint_size * channel.off_diagonal


def amplified_epsilon(base_epsilon: float, sampling_rate: float) -> float:
    """Amplification by sampling without replacement: ln(1 + rate (e^eps0 - 1)) (= Thm 3.2)."""
    eps0 = check_epsilon(base_epsilon)
    if not math.isfinite(sampling_rate) or not 0.0 < sampling_rate <= 1.0:
        raise InvalidSampleSizeError(f"sampling rate must be in (0, 1], got {sampling_rate!r}")
    if eps0 > 700.0:  # e^eps0 overflows: ln(1 + r(e^x - 1)) = x + ln(r + (1 - r) e^-x), exactly
        return eps0 + math.log(sampling_rate + (1.0 - sampling_rate) * math.exp(-eps0))
    return math.log1p(sampling_rate * math.expm1(eps0))


# ------------------------------------------------------------------ many releases on one budget (issue 23)
#: dp_accounting's PLD grid: losses are rounded up to a multiple of this (pessimistic), so a
#: composed epsilon is never below the exact one and at most about k times this above it.
PLD_DISCRETIZATION = 1e-4


def kov_optimal_delta(epsilon: float, k: int, epsilon_total: float) -> float:
    """The exact delta of the k-fold composition of pure epsilon-DP mechanisms at epsilon_total
    (Kairouz, Oh, Viswanath, "The composition theorem for differential privacy", ICML 2015,
    Theorem 3.3 and its proof: the worst case is k-fold binary randomized response, whose
    hockey-stick divergence is)

        delta(eps') = sum_{l=0}^{k} C(k, l) max(0, e^{(k-l) eps} - e^{eps'} e^{l eps}) / (1 + e^eps)^k.

    At eps' = (k - 2i) eps it equals the theorem's delta_i. Evaluated in log space (small k)."""
    epsilon = check_epsilon(epsilon)
    if k < 1:
        raise InvalidSampleSizeError(f"the number of releases must be >= 1, got {k}")
    log_norm = k * math.log1p(math.exp(epsilon)) if epsilon < 700 else k * epsilon
    total = 0.0
    for lo in range(k + 1):
        a, b = (k - lo) * epsilon, epsilon_total + lo * epsilon
        if a <= b:
            continue
        log_c = math.lgamma(k + 1) - math.lgamma(lo + 1) - math.lgamma(k - lo + 1)
        total += math.exp(log_c + a - log_norm) * -math.expm1(b - a)
    return total


def kov_optimal_epsilon(epsilon: float, k: int, delta: float) -> float:
    """The smallest epsilon_total with :func:`kov_optimal_delta` <= delta (bisection to 1e-12):
    the optimal composition of k pure epsilon-DP mechanisms at target delta (KOV 2015, Thm 3.3)."""
    if not 0.0 <= delta < 1.0:
        raise InvalidEpsilonError(f"delta must be in [0, 1), got {delta!r}")
    lo, hi = -k * epsilon, k * epsilon
    if kov_optimal_delta(epsilon, k, lo) <= delta:
        return 0.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        if kov_optimal_delta(epsilon, k, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return max(hi, 0.0)


def pld_composed_epsilon(epsilon: float, k: int, delta: float) -> float:
    """The epsilon of k releases, each pure epsilon-DP, at target delta, by dp_accounting's
    privacy-loss-distribution accountant (the PLD of a generic (epsilon, 0)-DP mechanism,
    ``from_privacy_parameters``, self-composed k times, pessimistic discretisation
    :data:`PLD_DISCRETIZATION`). Never below the optimal :func:`kov_optimal_epsilon`; capped at
    k epsilon, which basic composition gives with delta = 0 (the grid can overshoot it)."""
    try:
        from dp_accounting.pld import privacy_loss_distribution as pld
        from dp_accounting.pld.common import DifferentialPrivacyParameters
    except ImportError as exc:  # an optional dependency: the accounting (or test/dev) extra
        raise InvalidEpsilonError(
            "the PLD accounting policy needs dp_accounting: pip install 'secure-release[accounting]'"
        ) from exc

    epsilon = check_epsilon(epsilon)
    if k < 1:
        raise InvalidSampleSizeError(f"the number of releases must be >= 1, got {k}")
    if not 0.0 < delta < 1.0:
        raise InvalidEpsilonError(f"the target delta must be in (0, 1), got {delta!r}")
    one = pld.from_privacy_parameters(
        DifferentialPrivacyParameters(epsilon, 0.0), value_discretization_interval=PLD_DISCRETIZATION
    )
    composed = one if k == 1 else one.self_compose(k)
    return min(float(composed.get_epsilon_for_delta(delta)), k * epsilon)


def pld_max_releases(total_epsilon: float, delta: float, per_release_epsilon: float) -> int:
    """The largest k whose PLD composition (:func:`pld_composed_epsilon`) of k pure
    ``per_release_epsilon``-DP releases stays within (total_epsilon, delta); at least the basic
    count floor(total / per release) (0 if one release does not fit). Exponential then binary
    search (the composed epsilon grows with k)."""
    total, eps = check_epsilon(total_epsilon), check_epsilon(per_release_epsilon)
    if eps > total:
        return 0

    def fits(k: int) -> bool:
        return k * eps <= total * (1 + 1e-12) or pld_composed_epsilon(eps, k, delta) <= total

    lo = max(1, math.floor(total / eps * (1 + 1e-12)))
    hi = lo * 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class AccountingPolicy:
    """How a data set's budget counts releases, fixed when the budget is set (issue 23).

    ``pld``: every release has exactly ``per_release_epsilon`` (pure DP, Theorem 3.2); the budget
    (total_epsilon, delta) allows ``max_releases`` = :func:`pld_max_releases` of them (optimal
    composition by dp_accounting's PLD). A release with another epsilon is refused. The ledger's
    additive view charges each release its epsilon against max_releases x per_release_epsilon
    (:attr:`additive_budget`), so both views count the same releases. Make one with
    :func:`pld_policy`; :meth:`from_dict` re-derives max_releases and refuses a mismatch."""

    total_epsilon: float
    delta: float
    per_release_epsilon: float
    max_releases: int
    kind: str = "pld"

    @property
    def additive_budget(self) -> float:
        """The ledger's additive budget: max_releases x per_release_epsilon."""
        return self.max_releases * self.per_release_epsilon

    def composed_epsilon(self, releases: int) -> float:
        """The PLD epsilon at :attr:`delta` of ``releases`` releases (0 for none)."""
        return 0.0 if releases < 1 else pld_composed_epsilon(self.per_release_epsilon, releases, self.delta)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "total_epsilon": self.total_epsilon,
            "delta": self.delta,
            "per_release_epsilon": self.per_release_epsilon,
            "max_releases": self.max_releases,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AccountingPolicy:
        """Parse (e.g. a ledger's budget entry) and check max_releases against the PLD."""
        if data.get("kind") != "pld":
            raise InvalidEpsilonError(f"unknown accounting policy {data.get('kind')!r}")
        policy = pld_policy(float(data["total_epsilon"]), float(data["delta"]), float(data["per_release_epsilon"]))
        if int(data["max_releases"]) != policy.max_releases:
            raise InvalidEpsilonError(
                f"the policy records {data['max_releases']} releases, but dp_accounting allows {policy.max_releases}"
            )
        return policy


def pld_policy(total_epsilon: float, delta: float, per_release_epsilon: float) -> AccountingPolicy:
    """The ``pld`` policy of a budget (total_epsilon, delta) for releases of per_release_epsilon
    each; :class:`InvalidEpsilonError` if delta is outside (0, 1) or not even one release fits."""
    total, eps = check_epsilon(total_epsilon), check_epsilon(per_release_epsilon)
    if not (math.isfinite(delta) and 0.0 < delta < 1.0):
        raise InvalidEpsilonError(f"the target delta must be in (0, 1), got {delta!r}")
    k = pld_max_releases(total, delta, eps)
    if k < 1:
        raise InvalidEpsilonError(f"a per-release epsilon of {eps} does not fit a total budget of {total}")
    return AccountingPolicy(total, float(delta), eps, k)
