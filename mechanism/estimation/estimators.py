"""Estimating the joint type from decrypted, perturbed rows (Sec. III-A release; DESIGN 3.5-3.6).

Every estimator here is O(K) time and memory: the gamma-diagonal structure A = a I + b J makes
A^-1 closed-form, so no K x K matrix is ever built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import (
    EmptySampleError,
    InvalidCountsError,
    InvalidLevelError,
    NonFiniteInputError,
    ShapeMismatchError,
    UnknownIntervalMethodError,
)
from secure_release.mechanism.estimation import unified
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.primitives.sampling import check_sample_size
from secure_release.mechanism.privacy.accounting import cell_variance, channel_cell_variance
from secure_release.mechanism.schema import check_joint_alphabet

FloatArray = npt.NDArray[np.float64]
Z_95 = 1.959963984540054


def observed_counts(codes: npt.ArrayLike, joint_size: int) -> npt.NDArray[np.int64]:
    """Histogram of joint codes over Z_K (bincount; codes must lie in [0, K))."""
    arr = np.asarray(codes, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= joint_size):
        raise ShapeMismatchError(f"joint codes must lie in [0, {joint_size})")
    return np.bincount(arr, minlength=joint_size).astype(np.int64)


def invert_channel(observed_type: npt.ArrayLike, keep: float, off_diagonal: float) -> FloatArray:
    """A^-1 T_obs in closed form (Sec. III-A, T_hat = A^-1 T): (T_obs - b)/a.

    For A = a I + b J and sum(T_obs) = 1: A^-1 = (I - b/(a + K b) J)/a, and a + K b = 1, so
    A^-1 T_obs = (T_obs - b)/a.
    """
    t = np.asarray(observed_type, dtype=np.float64)
    if not np.all(np.isfinite(t)):
        raise NonFiniteInputError("the observed type has non-finite entries")
    return np.asarray((t - off_diagonal) / keep, dtype=np.float64)


def estimate_joint(counts: npt.ArrayLike, channel: PramChannel) -> FloatArray:
    """The paper's estimator T_hat = A^-1 T_obs from observed joint counts (O(K))."""
    c = np.asarray(counts, dtype=np.float64)
    if c.size != channel.joint_size:
        raise ShapeMismatchError(f"{c.size} counts for a joint alphabet of {channel.joint_size}")
    total = c.sum()
    if total <= 0:
        raise EmptySampleError("no observed rows: cannot estimate from an empty sample")
    return invert_channel(c / total, channel.keep, channel.off_diagonal)


def marginal_counts(
    counts: npt.ArrayLike, alphabet_sizes: Sequence[int], keep_curators: Sequence[int]
) -> npt.NDArray[np.int64]:
    """Counts of the joint table summed onto the curators in ``keep_curators`` (in that order)."""
    c = np.asarray(counts)
    check_joint_alphabet(alphabet_sizes)
    if c.size != int(np.prod(alphabet_sizes)):
        raise ShapeMismatchError(f"{c.size} counts for alphabets {list(alphabet_sizes)}")
    _check_subset(keep_curators, len(alphabet_sizes))
    table = c.reshape(tuple(int(k) for k in alphabet_sizes))
    drop = tuple(j for j in range(len(alphabet_sizes)) if j not in keep_curators)
    summed = table.sum(axis=drop) if drop else table
    kept_sorted = sorted(keep_curators)
    order = [kept_sorted.index(j) for j in keep_curators]
    return np.asarray(np.transpose(summed, order).reshape(-1), dtype=np.int64)



def estimate_marginal(counts_on_subset: npt.ArrayLike, channel: PramChannel) -> FloatArray:
    """DESIGN 3.5: on a sub-alphabet of size K_S the channel is "keep w.p. a, else uniform",
    so T_hat_S = (T_obs_S - (1 - a)/K_S)/a."""
    c = np.asarray(counts_on_subset, dtype=np.float64)
    total = c.sum()
    if total <= 0:
        raise EmptySampleError("no observed rows: cannot estimate from an empty sample")
    sub_size = c.size
    a = channel.keep
    return np.asarray((c / total - (1.0 - a) / sub_size) / a, dtype=np.float64)


def _check_subset(keep_curators: Sequence[int], num_curators: int) -> None:
    if (
        not keep_curators
        or len(set(keep_curators)) != len(keep_curators)
        or any(not 0 <= j < num_curators for j in keep_curators)
    ):
        raise ShapeMismatchError(
            f"curator subset {list(keep_curators)} must be distinct indices in [0, {num_curators})"
        )


def standard_errors(estimate: npt.ArrayLike, n: int, m: int, channel: PramChannel) -> FloatArray:
    """Per-cell standard errors: sqrt of DESIGN 3's per-cell variance at the estimate
    (clipped to [0, 1] as the plug-in share)."""
    t = np.clip(np.asarray(estimate, dtype=np.float64), 0.0, 1.0)
    return np.sqrt(cell_variance(n, m, channel.joint_size, channel.gamma, t))


def marginal_standard_errors(estimate: npt.ArrayLike, n: int, m: int, channel: PramChannel) -> FloatArray:
    """Per-cell standard errors on a sub-alphabet: the same formula with K_S and the channel
    keep a, replace-uniform on K_S (b_S = (1 - a)/K_S)."""
    t = np.asarray(estimate, dtype=np.float64)
    a = channel.keep
    return np.sqrt(channel_cell_variance(n, m, a, (1.0 - a) / t.size, t))



def project_to_simplex(vector: npt.ArrayLike) -> FloatArray:
    """Euclidean projection onto {p >= 0, sum p = 1} (sort-based; Held et al. 1974,
    Duchi et al. 2008). Post-processing, so free under DP; it never increases the l2 error."""
    v = np.asarray(vector, dtype=np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise NonFiniteInputError("projection needs a non-empty finite vector")
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1.0
    ranks = np.arange(1, v.size + 1)
    rho = int(np.nonzero(u - cumulative / ranks > 0)[0][-1])
    theta = cumulative[rho] / (rho + 1)
    return np.asarray(np.maximum(v - theta, 0.0), dtype=np.float64)


@dataclass(frozen=True)
class MleResult:
    """An EM / iterative Bayesian update result with its stopping information."""

    estimate: FloatArray
    iterations: int
    converged: bool
    log_likelihood: float



def mle_water_filling(counts: npt.ArrayLike, keep: float) -> FloatArray:
    """The exact maximum-likelihood estimate under the gamma-diagonal channel, in closed form.

    Maximize L(p) = sum_o N_o log(a p_o + g), g = (1 - a)/K, over the simplex. L is concave;
    its KKT conditions are a N_o/(a p_o + g) = lambda where p_o > 0 and a N_o/g <= lambda where
    p_o = 0. So p_o = max(0, N_o/lambda' - r) with r = g/a and lambda' = lambda/a, and on the
    active set S (the cells with the largest counts) sum p = 1 gives
    lambda' = N_S / (1 + |S| r). S has size s*, the largest s with N_(s) (1 + s r) > r N_(1..s)
    (counts sorted in decreasing order) -- water filling, like the simplex projection.
    Interior case (S = all cells): lambda' = N a and p = (T_obs - g)/a, the A^-1 estimate.
    Works row-wise on a (rows, K) array; O(K log K) per row, no iteration.
    """
    n_obs = np.asarray(counts, dtype=np.float64)
    if n_obs.size == 0 or not np.all(np.isfinite(n_obs)) or np.any(n_obs < 0):
        raise NonFiniteInputError("MLE needs non-negative finite counts")
    if not 0.0 < keep <= 1.0:
        raise NonFiniteInputError(f"keep probability must be in (0, 1], got {keep!r}")
    rows = n_obs.reshape(-1, n_obs.shape[-1])
    if np.any(rows.sum(axis=1) <= 0):
        raise NonFiniteInputError("MLE needs a positive total count")
    K = rows.shape[1]
    r = (1.0 - keep) / K / keep
    ordered = -np.sort(-rows, axis=1)
    cumulative = np.cumsum(ordered, axis=1)
    sizes = np.arange(1, K + 1, dtype=np.float64)
    active = ordered * (1.0 + sizes * r) > r * cumulative
    s_star = K - np.argmax(active[:, ::-1], axis=1)  # last True (s = 1 is always active)
    lam = cumulative[np.arange(rows.shape[0]), s_star - 1] / (1.0 + s_star * r)
    p = np.maximum(rows / lam[:, None] - r, 0.0)
    p /= p.sum(axis=1, keepdims=True)  # exact up to rounding; removes the last ulp drift
    return np.asarray(p.reshape(n_obs.shape), dtype=np.float64)


def estimate_mle_exact(counts: npt.ArrayLike, keep: float) -> MleResult:
    """:func:`mle_water_filling` with its log-likelihood, as an :class:`MleResult`
    (``iterations`` 0: no iteration is needed)."""
    n_obs = np.asarray(counts, dtype=np.float64)
    p = mle_water_filling(n_obs, keep)
    mixed = keep * p + (1.0 - keep) / n_obs.size
    positive = n_obs > 0
    log_lik = float(np.sum(n_obs[positive] * np.log(mixed[positive])))
    return MleResult(p, 0, True, log_lik)


def l2_error(estimate: npt.ArrayLike, truth: npt.ArrayLike) -> float:
    """||estimate - truth||_2."""
    return float(np.linalg.norm(np.asarray(estimate, dtype=np.float64) - np.asarray(truth, dtype=np.float64)))



# --- confidence intervals whose coverage holds at every m ----------------------------------

INTERVAL_METHODS = ("unified", "clopper-pearson", "score-cc", "score", "normal")
DEFAULT_INTERVAL_METHOD = "unified"
INTERVAL_METHOD_DESCRIPTIONS = {
    "unified": "Feldman-Cousins unified (likelihood-ratio-ordered) interval for the cell's observed rate "
    "within the physical range [b, a + b], mapped through the channel's affine inverse: never empty and "
    "always holding the clipped A^-1 estimate (mechanism/estimation/unified.py)",
    "clopper-pearson": "Clopper-Pearson exact binomial interval for the cell's observed rate, "
    "mapped through the channel's affine inverse and intersected with [0, 1]",
    "score-cc": "Wilson score interval with continuity correction and the finite-population "
    "variance of the observed rate, mapped through the affine inverse, intersected with [0, 1]",
    "score": "Wilson score interval (no continuity correction) with the finite-population "
    "variance, mapped through the affine inverse; under-covers at small expected counts",
    "normal": "normal approximation (Wald) around the A^-1 estimate; under-covers when a "
    "cell's expected observed count is small (comparison only)",
}


def check_level(level: float) -> float:
    """Raise unless the confidence level is a finite number in (0, 1)."""
    if isinstance(level, bool) or not isinstance(level, int | float) or not math.isfinite(level):
        raise InvalidLevelError(f"confidence level must be a finite number in (0, 1), got {level!r}")
    if not 0.0 < level < 1.0:
        raise InvalidLevelError(f"confidence level must lie strictly between 0 and 1, got {level!r}")
    return float(level)


def check_interval_method(method: str) -> str:
    """Raise unless ``method`` is one of :data:`INTERVAL_METHODS`."""
    if method not in INTERVAL_METHODS:
        raise UnknownIntervalMethodError(f"unknown interval method {method!r}; choose one of {list(INTERVAL_METHODS)}")
    return method


def per_cell_alpha(level: float, cells: int, simultaneous: bool) -> float:
    """Two-sided miss probability per cell: 1 - level, or (1 - level)/cells with Bonferroni
    (simultaneous coverage of all cells >= level by the union bound; derived here)."""
    alpha = 1.0 - check_level(level)
    return alpha / cells if simultaneous else alpha


def normal_quantile(prob: float) -> float:
    """The standard normal quantile Phi^-1(prob) (statistics.NormalDist, Wichura's AS241)."""
    return NormalDist().inv_cdf(prob)


_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def log_gamma(x: npt.ArrayLike) -> FloatArray:
    """ln Gamma(x) for x > 0, vectorized: recurrence up to x >= 15, then Stirling's series
    (truncation error < 3e-14 there)."""
    y = np.array(x, dtype=np.float64, copy=True)
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise NonFiniteInputError("log_gamma needs finite arguments > 0")
    shift = np.zeros_like(y)
    for _ in range(15):
        small = y < 15.0
        if not small.any():
            break
        shift[small] += np.log(y[small])
        y[small] += 1.0
    inv = 1.0 / y
    inv2 = inv * inv
    series = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 / 1680)))
    return np.asarray((y - 0.5) * np.log(y) - y + _HALF_LOG_2PI + series - shift)


def _log_beta(a: FloatArray, b: FloatArray) -> FloatArray:
    return np.asarray(log_gamma(a) + log_gamma(b) - log_gamma(a + b))


def _beta_continued_fraction(x: FloatArray, a: FloatArray, b: FloatArray) -> FloatArray:
    """The continued fraction of I_x(a, b) (modified Lentz; Numerical Recipes betacf),
    vectorized; converges in O(sqrt(max(a, b))) steps at worst (< 100 at a = b = 5e6 here)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
    h = d.copy()
    active = np.ones(x.shape, dtype=bool)
    for step in range(1, 100_000):
        m2 = 2.0 * step
        for aa in (
            step * (b - step) * x / ((qam + m2) * (a + m2)),
            -(a + step) * (qab + step) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
            c = 1.0 + aa / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            delta = d * c
            h = np.where(active, h * delta, h)
        active &= np.abs(delta - 1.0) >= 1e-15
        if not active.any():
            break
    return h


def regularized_incomplete_beta(
    x: npt.ArrayLike,
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    log_beta: npt.ArrayLike | None = None,
) -> FloatArray:
    """I_x(a, b) = P(Beta(a, b) <= x), vectorized, for a, b > 0 and x in [0, 1].

    For integers, I_p(k, m - k + 1) = P(Binomial(m, p) >= k), the tail Clopper-Pearson inverts.
    Continued fraction on the side x < (a + 1)/(a + b + 2), symmetry I_x(a,b) = 1 - I_{1-x}(b,a)
    otherwise (Numerical Recipes 6.4).
    """
    xs, aa, bb = np.broadcast_arrays(
        np.asarray(x, dtype=np.float64), np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    )
    if np.any(~np.isfinite(xs)) or np.any((xs < 0) | (xs > 1)) or np.any(aa <= 0) or np.any(bb <= 0):
        raise NonFiniteInputError("incomplete beta needs x in [0, 1] and a, b > 0")
    out = np.where(xs >= 1.0, 1.0, 0.0)
    inner = (xs > 0.0) & (xs < 1.0)
    if inner.any():
        x, a_, b_ = xs[inner], aa[inner], bb[inner]
        lb = _log_beta(a_, b_) if log_beta is None else np.broadcast_to(log_beta, xs.shape)[inner]
        log_front = a_ * np.log(x) + b_ * np.log1p(-x) - lb
        direct = x < (a_ + 1.0) / (a_ + b_ + 2.0)
        cf = _beta_continued_fraction(np.where(direct, x, 1.0 - x), np.where(direct, a_, b_), np.where(direct, b_, a_))
        tail = np.exp(log_front) * cf / np.where(direct, a_, b_)
        out[inner] = np.where(direct, tail, 1.0 - tail)
    return np.asarray(np.clip(out, 0.0, 1.0), dtype=np.float64)


def beta_quantile(prob: float, a: npt.ArrayLike, b: npt.ArrayLike, start: npt.ArrayLike | None = None) -> FloatArray:
    """x with I_x(a, b) = prob: safeguarded Newton (bisection whenever a step leaves the
    bracket) from ``start`` (default the mean), vectorized. Accuracy: relative about
    (a + b) * 3e-15 (the cancellation in ln B(a, b)): 1e-12 at a + b = 4e3, 1e-8 at 1e7."""
    if not 0.0 < prob < 1.0:
        raise InvalidLevelError(f"a quantile's probability must be in (0, 1), got {prob!r}")
    aa, bb = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    aa, bb = aa.astype(np.float64), bb.astype(np.float64)
    lo, hi = np.zeros_like(aa), np.ones_like(aa)
    guess = aa / (aa + bb) if start is None else np.broadcast_to(start, aa.shape)
    x = np.clip(np.asarray(guess, dtype=np.float64), 1e-300, 1.0 - 1e-16)
    log_b = _log_beta(aa, bb)
    done = np.zeros(aa.shape, dtype=bool)
    for _ in range(400):
        f = regularized_incomplete_beta(x, aa, bb, log_b) - prob
        lo = np.where(f < 0, x, lo)
        hi = np.where(f >= 0, x, hi)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            pdf = np.exp((aa - 1.0) * np.log(x) + (bb - 1.0) * np.log1p(-x) - log_b)
            newton = x - f / pdf
        ok = np.isfinite(newton) & (newton >= lo) & (newton <= hi)
        new = np.where(ok, newton, 0.5 * (lo + hi))
        step_small = (np.abs(new - x) <= 1e-12 * np.abs(x)) | (hi - lo <= 1e-12 * hi)
        x = np.where(done | (f == 0), x, new)  # a last small Newton step is still taken
        done |= step_small | (f == 0)
        if done.all():
            break
    return np.asarray(x, dtype=np.float64)


def clopper_pearson_rate_interval(counts: npt.ArrayLike, m: int, alpha: float) -> tuple[FloatArray, FloatArray]:
    """Clopper-Pearson (1934) exact interval for a binomial rate p from k successes in m:
    lower = Beta quantile alpha/2 of (k, m - k + 1) (0 if k = 0), upper = quantile 1 - alpha/2
    of (k + 1, m - k) (1 if k = m). Computed once per distinct count."""
    k = _check_cell_counts(counts, m)
    values, inverse = np.unique(k, return_inverse=True)
    # Newton starts at the Wilson score bounds with continuity correction (close to CP)
    start_lo, start_hi = score_rate_interval(values, m, m, 1.0, 0.0, alpha, continuity=True)
    v = values.astype(np.float64)
    lo = np.zeros(values.size)
    hi = np.ones(values.size)
    pos = values > 0
    if pos.any():
        lo[pos] = beta_quantile(alpha / 2.0, v[pos], m - v[pos] + 1.0, start_lo[pos])
    below = values < m
    if below.any():
        hi[below] = beta_quantile(1.0 - alpha / 2.0, v[below] + 1.0, m - v[below], start_hi[below])
    shape = np.shape(counts)
    return lo[inverse].reshape(shape), hi[inverse].reshape(shape)


def observed_rate_variance_coefficients(n: int, m: int, keep: float, off_diagonal: float) -> tuple[float, float, float]:
    """Derived here: Var(N_c/m) = V(p)/m with p = a T_c + b the expected observed rate and
    V(p) = p(1 - p) - f (p - b)(a + b - p), f = (m - 1)/(n - 1) (sampling without replacement
    makes the m rows' indicators negatively correlated: Cov = -a^2 T(1 - T)/(n - 1)).
    Equals DESIGN 3's per-cell variance times a^2. Returns V's coefficients (c2, c1, c0) of
    V(p) = c2 p^2 + c1 p + c0."""
    check_sample_size(n, m)
    f = (m - 1.0) / (n - 1.0) if n > 1 else 0.0
    a, b = keep, off_diagonal
    return -(1.0 - f), 1.0 - f * (a + 2.0 * b), f * b * (a + b)


def score_rate_interval(
    counts: npt.ArrayLike,
    n: int,
    m: int,
    keep: float,
    off_diagonal: float,
    alpha: float,
    continuity: bool = True,
) -> tuple[FloatArray, FloatArray]:
    """Wilson (1927) score interval for the observed rate p with the finite-population
    variance V(p) of :func:`observed_rate_variance_coefficients` (derived here): the p with
    (x - m p)^2 <= z^2 m V(p), a quadratic in p. With ``continuity`` the lower end uses
    x = k - 1/2 and the upper x = k + 1/2 (lower 0 at k = 0, upper 1 at k = m)."""
    k = _check_cell_counts(counts, m).astype(np.float64)
    z = normal_quantile(1.0 - alpha / 2.0)
    c2, c1, c0 = observed_rate_variance_coefficients(n, m, keep, off_diagonal)
    quad = m - z * z * c2  # m^2 p^2 - z^2 m c2 p^2, divided by m
    half = 0.5 if continuity else 0.0

    def roots(x: FloatArray) -> tuple[FloatArray, FloatArray]:
        lin = 2.0 * x + z * z * c1
        const = x * x / m - z * z * c0
        disc = np.sqrt(np.maximum(lin * lin - 4.0 * quad * const, 0.0))
        return (lin - disc) / (2.0 * quad), (lin + disc) / (2.0 * quad)

    lo = np.where(k <= 0, 0.0, roots(np.maximum(k - half, 0.0))[0])
    hi = np.where(k >= m, 1.0, roots(np.minimum(k + half, float(m)))[1])
    return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)


def rate_to_share_interval(
    low_rate: npt.ArrayLike, high_rate: npt.ArrayLike, keep: float, off_diagonal: float
) -> tuple[FloatArray, FloatArray]:
    """The channel's affine inverse T = (p - b)/a (Sec. III-A) applied to both ends, then
    intersected with [0, 1]. Monotone, so p in [lo, hi] iff T in the mapped interval."""
    lo = (np.asarray(low_rate, dtype=np.float64) - off_diagonal) / keep
    hi = (np.asarray(high_rate, dtype=np.float64) - off_diagonal) / keep
    return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)


def normal_share_interval(
    counts: npt.ArrayLike, n: int, m: int, keep: float, off_diagonal: float, alpha: float
) -> tuple[FloatArray, FloatArray]:
    """The old interval (DESIGN 3 per-cell variance at the clipped A^-1 estimate, estimate -+ z
    se), intersected with [0, 1]. Labelled "normal": it under-covers at small counts."""
    k = _check_cell_counts(counts, m).astype(np.float64)
    est = (k / m - off_diagonal) / keep
    se = np.sqrt(channel_cell_variance(n, m, keep, off_diagonal, np.clip(est, 0.0, 1.0)))
    z = normal_quantile(1.0 - alpha / 2.0)
    return np.clip(est - z * se, 0.0, 1.0), np.clip(est + z * se, 0.0, 1.0)


@dataclass(frozen=True)
class CellIntervals:
    """Per-cell confidence intervals for the cell shares, with the method that made them."""

    low: FloatArray
    high: FloatArray
    method: str
    level: float
    simultaneous: bool
    per_cell_level: float

    @property
    def label(self) -> str:
        """E.g. "clopper-pearson, 95% per cell" or "... 95% simultaneous (Bonferroni, 24 cells)"."""
        pct = f"{100 * self.level:g}%"
        if self.simultaneous:
            return f"{self.method}, {pct} simultaneous (Bonferroni over {self.low.size} cells)"
        return f"{self.method}, {pct} per cell"

    @property
    def description(self) -> str:
        return INTERVAL_METHOD_DESCRIPTIONS[self.method]

    def report_fields(self) -> dict[str, object]:
        """The fields a researcher report / API carries next to ci_low and ci_high."""
        return {
            "interval_method": self.method,
            "interval_level": self.level,
            "interval_simultaneous": self.simultaneous,
            "interval_per_cell_level": self.per_cell_level,
            "interval_label": self.label,
            "interval_description": self.description,
        }


def cell_intervals(
    counts: npt.ArrayLike,
    n: int,
    m: int,
    keep: float,
    off_diagonal: float,
    method: str = DEFAULT_INTERVAL_METHOD,
    level: float = 0.95,
    simultaneous: bool = False,
) -> CellIntervals:
    """Confidence intervals for every cell share T_c from the observed counts N_c of a
    "keep w.p. a, else uniform" channel with off-diagonal b (joint: b = 1/q; a marginal on
    K_S cells: b = (1 - a)/K_S). Each interval depends on N_c alone. O(K) after deduplicating
    counts; no scipy.

    Every one of the m rows lands in cell c with probability p = a T_c + b, and the rows'
    indicators are exchangeable and negatively correlated (sampling without replacement), so N_c
    is below Binomial(m, p) in convex order (Hoeffding 1963); the exact binomial intervals
    ("unified", "clopper-pearson") are built for Binomial(m, p), and their exact coverage under
    the real (hypergeometric, then PRAM) law is enumerated in tests/unit/test_mech_coverage_exact.py:
    >= 95% for every cell of Adult at m* and of a K = 1000 Zipf table at m*.

    Why "unified" by default (issue: intervals at the boundary): Clopper-Pearson ignores that
    T in [0, 1] confines p to [b, a + b]; a count below b m then gives a rate interval below b and
    the share interval [0, 0], excluding the estimate. The unified interval
    (:mod:`~secure_release.mechanism.estimation.unified`, Feldman & Cousins 1998) is never empty and always
    holds clip(raw, 0, 1). ``simultaneous`` applies Bonferroni over the cells.
    """
    check_interval_method(method)
    k = np.asarray(counts)
    alpha = per_cell_alpha(level, max(int(k.size), 1), simultaneous)
    lo, hi = share_intervals(k, n, m, keep, off_diagonal, method, alpha)
    return CellIntervals(lo, hi, method, float(level), bool(simultaneous), 1.0 - alpha)


def share_intervals(
    counts: npt.ArrayLike,
    n: int,
    m: int,
    keep: float,
    off_diagonal: float,
    method: str,
    alpha: float,
) -> tuple[FloatArray, FloatArray]:
    """The (low, high) share intervals of :func:`cell_intervals` at a given per-cell miss
    probability ``alpha`` (any array shape of counts; used by the coverage studies)."""
    check_interval_method(method)
    if not 0.0 < alpha < 1.0:
        raise InvalidLevelError(f"per-cell miss probability must be in (0, 1), got {alpha!r}")
    if method == "normal":
        return normal_share_interval(counts, n, m, keep, off_diagonal, alpha)
    if method == "unified":
        rlo, rhi = unified.unified_rate_interval(_check_cell_counts(counts, m), m, keep, off_diagonal, alpha)
    elif method == "clopper-pearson":
        rlo, rhi = clopper_pearson_rate_interval(counts, m, alpha)
    else:
        rlo, rhi = score_rate_interval(counts, n, m, keep, off_diagonal, alpha, continuity=method == "score-cc")
    return rate_to_share_interval(rlo, rhi, keep, off_diagonal)


def joint_intervals(
    counts: npt.ArrayLike,
    n: int,
    channel: PramChannel,
    method: str = DEFAULT_INTERVAL_METHOD,
    level: float = 0.95,
    simultaneous: bool = False,
) -> CellIntervals:
    """:func:`cell_intervals` on the joint cells (m = the counts' total; b = 1/q)."""
    c = np.asarray(counts)
    if c.size != channel.joint_size:
        raise ShapeMismatchError(f"{c.size} counts for a joint alphabet of {channel.joint_size}")
    m = int(c.sum())
    return cell_intervals(c, n, m, channel.keep, channel.off_diagonal, method, level, simultaneous)


def marginal_intervals(
    counts_on_subset: npt.ArrayLike,
    n: int,
    channel: PramChannel,
    method: str = DEFAULT_INTERVAL_METHOD,
    level: float = 0.95,
    simultaneous: bool = False,
) -> CellIntervals:
    """:func:`cell_intervals` on a curator subset's K_S cells: keep a, b_S = (1 - a)/K_S
    (DESIGN 3.5)."""
    c = np.asarray(counts_on_subset)
    a = channel.keep
    return cell_intervals(c, n, int(c.sum()), a, (1.0 - a) / c.size, method, level, simultaneous)


def _check_cell_counts(counts: npt.ArrayLike, m: int) -> npt.NDArray[np.int64]:
    k = np.asarray(counts)
    if k.size == 0 or not np.all(np.isfinite(k.astype(np.float64))):
        raise NonFiniteInputError("cell counts must be a non-empty array of finite numbers")
    ki = k.astype(np.int64)
    if np.any(ki != k) or np.any(ki < 0) or np.any(ki > m):
        raise InvalidCountsError(f"cell counts must be integers in [0, m] = [0, {m}]")
    return ki


#: The estimate a report headlines (issue 23). The rule, from the simulation table in
#: docs/estimators.md (bench/bench_estimators.py): take the estimate whose error is never far
#: from the best one's in any setting simulated (minimax regret), not the one that is best most
#: often. The Euclidean projection onto the simplex never moves an estimate further from the
#: truth, which lies in the simplex (a projection onto a closed convex set is non-expansive), so
#: it beats the raw A^-1 estimate in every trial; the MLE is best or tied on spread-out tables
#: (Adult, uniform, linear, Zipf) but up to 5.4x the projection's error when one cell is large
#: and K is large (peaky data; a single large cell at K = 96, 384), while the projection is
#: within 19% of the best estimate in every setting. A data-driven switch between the two (by
#: the projected sum of squared shares) was rejected: on tables with one cell of 20-60% it was
#: up to 2x the best. The raw A^-1 estimate (unbiased, may be negative) stays in every report.
DEFAULT_ESTIMATOR = "projected"
