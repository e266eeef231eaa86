"""Unified (likelihood-ratio-ordered) intervals with the physical boundary (Feldman & Cousins 1998).

A cell's observed count N is (up to sampling without replacement, which only narrows it)
Binomial(m, p) with p = a T + b, and T in [0, 1] restricts the rate to the physical range
P = [b, a + b]. Clopper-Pearson ignores P: when N is below what the replacement noise alone gives
(N < b m) its rate interval can lie entirely below b, and the share interval collapses to
[0, 0], excluding the estimate. The unified construction is a Neyman belt over P whose acceptance
set at p ranks the counts k by the likelihood ratio

    R(k | p) = L(k | p) / L(k | p_best(k)),   p_best(k) = clip(k/m, b, a + b),

(the best physically allowed rate) and accepts them in that order until their probability is
>= 1 - alpha. The interval of an observed k is the set of p whose acceptance set holds k. Because
R(k | p_best(k)) = 1 is the largest ratio any count can have, every count is accepted at its own
p_best(k): the interval is never empty and always holds p_best(k), i.e. the share
clip(raw, 0, 1). Coverage is >= 1 - alpha at every p by construction (Neyman).

Computation here (derived here, exact up to floating point; no per-cell loop):

* ln R(x | p) is concave and C^1 in a real x in [0, m] (-m KL(x/m || p) inside P, its tangent
  lines where p_best is clipped), so each acceptance set is an interval of counts [k1, k2];
  it is found by integer bisections (:func:`unified_acceptance`).
* The belt is evaluated on a lattice in theta = arcsin(sqrt(p)) (Var(theta_hat) ~ 1/(4 m)) with
  step ``resolution``/(2 sqrt(m)); for p between two lattice points p_i < p_j the acceptance set
  is the union of theirs, widened until F(k2; p_j) - F(k1 - 1; p_i) >= 1 - alpha (F, the binomial
  CDF, falls as p grows, so this bounds the set's probability at every p in between). The
  interval is then the hull of the lattice cells that accept k: coverage >= 1 - alpha holds at
  every p in P, not only on the lattice, at the price of about ``resolution`` standard errors of
  width.
* Only the lattice near each distinct observed count is evaluated: R(k | p) <= exp(-m (theta(k)
  - theta(p))^2) (KL >= -2 ln of the Bhattacharyya coefficient cos(theta(k) - theta(p)) >=
  (theta(k) - theta(p))^2), while a threshold t with 2 e^t <= alpha already gives probability
  >= 1 - alpha (Chernoff), so k is never accepted beyond 2 sqrt(ln(2/alpha)) standard errors of
  its own theta; the window adds three more.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy import special

from secure_release.mechanism.errors import (
    InvalidCountsError,
    InvalidLevelError,
    NonFiniteInputError,
    ShapeMismatchError,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Lattice step of the belt, in standard errors of theta = arcsin(sqrt(p)): the intervals are at
#: most about this many standard errors wider than the exact (continuous-p) unified interval.
DEFAULT_RESOLUTION = 0.05
#: Two log-likelihood ratios closer than this count as tied (ties are accepted together, which
#: only widens the sets).
_TIE = 1e-7


def physical_rate_range(keep: float, off_diagonal: float) -> tuple[float, float]:
    """The rates p = a T + b that a share T in [0, 1] can produce: [b, a + b] (Sec. III-A)."""
    if not (0.0 < keep <= 1.0 and off_diagonal >= 0.0 and keep + off_diagonal <= 1.0 + 1e-12):
        raise NonFiniteInputError(
            f"keep must be in (0, 1] and 0 <= off-diagonal <= 1 - keep, got {keep!r}, {off_diagonal!r}"
        )
    return float(off_diagonal), float(min(keep + off_diagonal, 1.0))


def best_physical_rate(counts: npt.ArrayLike, m: int, low: float, high: float) -> FloatArray:
    """p_best(k) = clip(k/m, low, high): the maximum-likelihood rate of a count k within the
    physical range (the binomial likelihood is unimodal at k/m)."""
    return np.asarray(np.clip(np.asarray(counts, dtype=np.float64) / m, low, high), dtype=np.float64)


def log_likelihood_ratio(counts: npt.ArrayLike, m: int, rate: npt.ArrayLike, low: float, high: float) -> FloatArray:
    """ln R(k | p) = ln L(k | p) - ln L(k | p_best(k)) for Binomial(m, p) (Feldman & Cousins 1998,
    eq. 4.1 with the binomial likelihood):
    k ln(p / q) + (m - k) ln((1 - p)/(1 - q)), q = p_best(k); <= 0, and 0 at p = q."""
    k = np.asarray(counts, dtype=np.float64)
    p = np.asarray(rate, dtype=np.float64)
    q = np.clip(k / m, low, high)
    rest = m - k
    with np.errstate(divide="ignore", invalid="ignore"):
        up = np.where(k > 0, k * np.log1p((p - q) / q), 0.0)
        down = np.where(rest > 0, rest * np.log1p((q - p) / (1.0 - q)), 0.0)
    return np.asarray(up + down, dtype=np.float64)


def binomial_interval_probability(k1: npt.ArrayLike, k2: npt.ArrayLike, m: int, rate: npt.ArrayLike) -> FloatArray:
    """P(k1 <= N <= k2) for N ~ Binomial(m, p) (scipy's bdtr, the regularized incomplete beta)."""
    lo = np.asarray(k1, dtype=np.float64) - 1.0
    hi = np.asarray(k2, dtype=np.float64)
    p = np.asarray(rate, dtype=np.float64)
    upper = np.where(hi >= m, 1.0, np.where(hi < 0, 0.0, special.bdtr(np.clip(hi, 0, m), m, p)))
    lower = np.where(lo >= m, 1.0, np.where(lo < 0, 0.0, special.bdtr(np.clip(lo, 0, m), m, p)))
    return np.asarray(np.clip(upper - lower, 0.0, 1.0), dtype=np.float64)


Pred = Callable[[IntArray, IntArray], npt.NDArray[np.bool_]]


def _last_true(lo: IntArray, hi: IntArray, pred: Pred) -> IntArray:
    """Vectorized bisection: for each i the largest k in [lo_i, hi_i] with pred (monotone: true
    then false; lo_i itself is taken as true). ``pred(k, idx)`` sees only the unfinished entries
    ``idx``, so an entry costs log2 of its own bracket."""
    lo, hi = lo.copy(), hi.copy()
    active = np.nonzero(lo < hi)[0]
    while active.size:
        mid = (lo[active] + hi[active] + 1) // 2
        ok = pred(mid, active)
        lo[active] = np.where(ok, mid, lo[active])
        hi[active] = np.where(ok, hi[active], mid - 1)
        active = active[lo[active] < hi[active]]
    return lo


def _first_true(lo: IntArray, hi: IntArray, pred: Pred) -> IntArray:
    """Vectorized bisection: the smallest k in [lo_i, hi_i] with pred (monotone: false then
    true; hi_i itself is taken as true); as :func:`_last_true`."""
    lo, hi = lo.copy(), hi.copy()
    active = np.nonzero(lo < hi)[0]
    while active.size:
        mid = (lo[active] + hi[active]) // 2
        ok = pred(mid, active)
        hi[active] = np.where(ok, mid, hi[active])
        lo[active] = np.where(ok, lo[active], mid + 1)
        active = active[lo[active] < hi[active]]
    return hi


def _bracket(guess: IntArray, width: IntArray, lo: IntArray, hi: IntArray, pred: Pred, last: bool) -> IntArray:
    """Bisect in [guess - width, guess + width] where two evaluations of ``pred`` confirm that
    the answer lies there, else in the whole [lo, hi] (same answer, fewer evaluations)."""
    a = np.clip(guess - width, lo, hi)
    b = np.clip(guess + width, lo, hi)
    everything = np.arange(guess.size)
    if last:  # need pred(a) true (or a = lo, the sentinel) and pred(b + 1) false (or b = hi)
        ok_a = (a == lo) | pred(np.maximum(a, 0), everything)
        ok_b = (b == hi) | ~pred(np.minimum(b + 1, hi), everything)
        good = ok_a & ok_b
        return _last_true(np.where(good, a, lo), np.where(good, b, hi), pred)
    ok_a = (a == lo) | ~pred(np.maximum(a - 1, lo), everything)
    ok_b = (b == hi) | pred(b, everything)
    good = ok_a & ok_b
    return _first_true(np.where(good, a, lo), np.where(good, b, hi), pred)


def unified_acceptance(
    rate: npt.ArrayLike, m: int, keep: float, off_diagonal: float, alpha: float
) -> tuple[IntArray, IntArray]:
    """The unified acceptance set [k1, k2] at each rate p in [b, a + b]: the counts with the
    largest ratio R(k | p) (:func:`log_likelihood_ratio`), in that order, until their binomial
    probability is >= 1 - alpha; ties are accepted together.

    ln R is concave in k with its top at c = floor(m p) or c + 1, so every set {ln R >= t} is an
    interval; its probability falls as t rises. The set's threshold t* is the largest ratio value
    ln R(k) whose set still holds 1 - alpha: bisect over k <= c (threshold ln R(k), left end k)
    and over k > c (right end k), each with an inner bisection for the other end, and take the
    higher of the two thresholds. The outer bisections start from the normal approximation's
    ends m p -+ z sqrt(m p (1 - p)) and fall back to the whole range when it misses."""
    low, high = physical_rate_range(keep, off_diagonal)
    p = np.asarray(rate, dtype=np.float64).reshape(-1)
    if p.size and (np.any(~np.isfinite(p)) or p.min() < low - 1e-12 or p.max() > high + 1e-12):
        raise NonFiniteInputError(f"rates must lie in the physical range [{low}, {high}]")
    target = 1.0 - alpha
    c = np.clip(np.floor(m * p), 0, m).astype(np.int64)

    def ratio(k: IntArray, idx: IntArray) -> FloatArray:
        return log_likelihood_ratio(k, m, p[idx], low, high)

    def right_end(t: FloatArray, idx: IntArray) -> IntArray:
        # the largest k in [c + 1, m] with ln R(k) >= t (c when there is none)
        return _last_true(c[idx], np.full(idx.size, m), lambda k, j: ratio(k, idx[j]) >= t[j] - _TIE)

    def left_end(t: FloatArray, idx: IntArray) -> IntArray:
        # the smallest k in [0, c] with ln R(k) >= t (c + 1 when there is none)
        cap = c[idx]

        def holds(k: IntArray, j: IntArray) -> npt.NDArray[np.bool_]:
            return ratio(np.minimum(k, cap[j]), idx[j]) >= t[j] - _TIE

        return _first_true(np.zeros(idx.size, dtype=np.int64), cap + 1, holds)

    def left_holds(k1: IntArray, idx: IntArray) -> npt.NDArray[np.bool_]:
        k = np.maximum(k1, 0)
        return binomial_interval_probability(k, right_end(ratio(k, idx), idx), m, p[idx]) >= target

    def right_holds(k2: IntArray, idx: IntArray) -> npt.NDArray[np.bool_]:
        k = np.minimum(k2, m)
        return binomial_interval_probability(left_end(ratio(k, idx), idx), k, m, p[idx]) >= target

    z = float(special.ndtri(1.0 - alpha / 2.0))
    sd = np.sqrt(m * p * (1.0 - p))
    width = (2.0 + 0.01 * sd).astype(np.int64)  # the normal ends miss by <= 2 counts in trials here
    mean = m * p
    # -1: no threshold set by a left count holds; m + 1: none by a right count
    k1 = _bracket(np.floor(mean - z * sd).astype(np.int64), width, np.full_like(c, -1), c, left_holds, True)
    k2 = _bracket(np.ceil(mean + z * sd).astype(np.int64), width, np.minimum(c + 1, m), np.full_like(c, m + 1),
                  right_holds, False)
    every = np.arange(p.size)
    t_left = np.where(k1 >= 0, ratio(np.maximum(k1, 0), every), -np.inf)
    t_right = np.where(k2 <= m, ratio(np.minimum(k2, m), every), -np.inf)
    t_star = np.maximum(t_left, t_right)
    return left_end(t_star, every), right_end(t_star, every)


def _theta(rate: npt.ArrayLike) -> FloatArray:
    return np.asarray(np.arcsin(np.sqrt(np.clip(rate, 0.0, 1.0))), dtype=np.float64)


def unified_rate_interval(
    counts: npt.ArrayLike,
    m: int,
    keep: float,
    off_diagonal: float,
    alpha: float,
    resolution: float = DEFAULT_RESOLUTION,
) -> tuple[FloatArray, FloatArray]:
    """The unified interval for each cell's rate p = a T + b, within [b, a + b], from its count
    (any array shape; computed once per distinct count). See the module docstring for the
    lattice, the widening that keeps coverage between lattice points, and the window."""
    if not 0.0 < alpha < 1.0:
        raise InvalidLevelError(f"per-cell miss probability must be in (0, 1), got {alpha!r}")
    if not (isinstance(resolution, int | float) and 0.0 < resolution <= 1.0):
        raise InvalidLevelError(f"the lattice resolution must be in (0, 1], got {resolution!r}")
    if isinstance(m, bool) or int(m) != m or m < 1:
        raise InvalidCountsError(f"the sample size m must be an integer >= 1, got {m!r}")
    m = int(m)
    raw = np.asarray(counts)
    if raw.size == 0 or not np.all(np.isfinite(raw.astype(np.float64))):
        raise NonFiniteInputError("cell counts must be a non-empty array of finite numbers")
    k_all = raw.astype(np.int64)
    if np.any(k_all != raw) or k_all.min() < 0 or k_all.max() > m:
        raise InvalidCountsError(f"cell counts must be integers in [0, m] = [0, {m}]")
    low, high = physical_rate_range(keep, off_diagonal)
    values, inverse = np.unique(k_all, return_inverse=True)
    best = best_physical_rate(values, m, low, high)
    if high - low <= 0.0:
        lo_r = hi_r = best
    else:
        lo_r, hi_r = _belt_hull(values, best, m, keep, off_diagonal, alpha, resolution)
    shape = raw.shape
    return lo_r[inverse].reshape(shape), hi_r[inverse].reshape(shape)


def _belt_hull(
    values: IntArray, best: FloatArray, m: int, keep: float, off_diagonal: float, alpha: float, resolution: float
) -> tuple[FloatArray, FloatArray]:
    low, high = physical_rate_range(keep, off_diagonal)
    th_lo, th_hi = float(_theta(low)), float(_theta(high))
    step = resolution / (2.0 * math.sqrt(m))
    last = max(1, math.ceil((th_hi - th_lo) / step))
    # the lattice points within the window of some distinct count (difference array, O(lattice))
    half = (2.0 * math.sqrt(math.log(2.0 / alpha)) + 3.0) / (2.0 * math.sqrt(m))
    centre = _theta(best)
    first_i = np.clip(np.floor((centre - half - th_lo) / step).astype(np.int64) - 1, 0, last)
    last_i = np.clip(np.ceil((centre + half - th_lo) / step).astype(np.int64) + 1, 0, last)
    marks = np.zeros(last + 2, dtype=np.int64)
    np.add.at(marks, first_i, 1)
    np.add.at(marks, last_i + 1, -1)
    index = np.nonzero(np.cumsum(marks)[: last + 1] > 0)[0]
    grid = np.sin(np.minimum(th_lo + index * step, th_hi)) ** 2
    grid[index == 0] = low
    grid[index == last] = high
    grid = np.clip(grid, low, high)
    k1, k2 = unified_acceptance(grid, m, keep, off_diagonal, alpha)
    # cells between consecutive lattice points (both evaluated)
    cell = np.nonzero(np.diff(index) == 1)[0]
    p_a, p_b = grid[cell], grid[cell + 1]
    c1 = np.minimum(k1[cell], k1[cell + 1])
    c2 = np.maximum(k2[cell], k2[cell + 1])
    _widen(c1, c2, m, p_a, p_b, 1.0 - alpha)
    # hull of the cells that accept each count (running envelopes: a superset of the hull)
    env2 = np.maximum.accumulate(c2) if c2.size else c2
    env1 = np.minimum.accumulate(c1[::-1])[::-1] if c1.size else c1
    first = np.searchsorted(env2, values, side="left")  # first cell with c2 >= k
    stop = np.searchsorted(env1, values, side="right")  # cells [0, stop) have env1 <= k
    if cell.size == 0:
        return best.copy(), best.copy()
    lo_r = np.where(first < cell.size, p_a[np.minimum(first, cell.size - 1)], best)
    hi_r = np.where(stop > 0, p_b[np.maximum(stop - 1, 0)], best)
    return np.minimum(lo_r, best), np.maximum(hi_r, best)


def _widen(c1: IntArray, c2: IntArray, m: int, p_a: FloatArray, p_b: FloatArray, target: float) -> None:
    """Grow each cell's count interval [c1, c2] in place until F(c2; p_b) - F(c1 - 1; p_a) >=
    target, a lower bound of its probability at every p in [p_a, p_b] (one count per side and
    round, on the side with the larger shortfall)."""
    todo = np.arange(c1.size)
    for _ in range(m + 1):
        hi, lo = c2[todo], c1[todo]
        upper = np.where(hi >= m, 1.0, special.bdtr(np.clip(hi, 0, m), m, p_b[todo]))
        lower = np.where(lo <= 0, 0.0, special.bdtr(np.clip(lo - 1, 0, m), m, p_a[todo]))
        short = upper - lower < target
        if not short.any():
            return
        # the mass lost above c2 at p_b versus below c1 at p_a: extend the heavier tail
        grow_up = (1.0 - upper) >= lower
        up = short & ((grow_up & (hi < m)) | (lo <= 0))
        down = short & ~up & (lo > 0)
        c2[todo[up]] += 1
        c1[todo[down]] -= 1
        todo = todo[short]


def hold_estimate(
    low: npt.ArrayLike, high: npt.ArrayLike, estimate: npt.ArrayLike
) -> tuple[FloatArray, FloatArray, int]:
    """The smallest interval holding both [low, high] and the estimate (clipped to [0, 1]):
    [min(low, e), max(high, e)], and how many cells it moved. A superset of a confidence
    interval keeps its coverage, so a headline (e.g. the simplex projection, which depends on
    every cell and can fall below a cell's unified interval) is never printed outside its own
    interval. Derived here."""
    lo = np.asarray(low, dtype=np.float64)
    hi = np.asarray(high, dtype=np.float64)
    e = np.clip(np.asarray(estimate, dtype=np.float64), 0.0, 1.0)
    if lo.shape != hi.shape or lo.shape != e.shape:
        raise ShapeMismatchError(f"interval ends {lo.shape}, {hi.shape} and estimate {e.shape} differ in shape")
    with np.errstate(invalid="ignore"):
        moved = int(np.sum((e < lo) | (e > hi)))
        return np.fmin(lo, e), np.fmax(hi, e), moved
