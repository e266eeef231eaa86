"""The epsilon of a release of several tables from disjoint samples: one function per formula.

Setting and proofs: docs/privacy.md, "A release of several tables from disjoint samples", whose
Eq. (T1)-(T4) the docstrings cite. One uniform ordered tuple of M = m_1 + ... + m_T distinct
positions of the n aligned records: its first m_1 slots are group 1, the next m_2 group 2, ...; a
record in group t contributes table t's attributes only, and the server applies gamma_t-diagonal
PRAM to table t's joint. A record is in group t with probability q_t = m_t/n, in no group with
q_0 = 1 - sum_t q_t. Replace-one neighbours, n public, as for Theorem 3.2, to which every function
here reduces at T = 1. Figures are exact rationals, rounded up (epsilon) or down (gamma): never in
the adversary's favour. Arguments are checked at their exact boundaries: at least one table,
integers m_t >= 1 with sum_t m_t <= n, finite gamma_t > 1, one gamma (and weight) per table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from secure_release.mechanism.errors import (
    InvalidEpsilonError,
    InvalidGammaError,
    InvalidSampleSizeError,
    NonFiniteInputError,
    ShapeMismatchError,
)
from secure_release.mechanism.primitives.pram import check_gamma
from secure_release.mechanism.primitives.sampling import check_sample_size
from secure_release.mechanism.privacy.accounting import check_epsilon, compare_with_exp, gamma_from_epsilon

_FLOAT_MAX = 1.7976931348623157e308


def check_sample_sizes(n: int, sample_sizes: Sequence[int]) -> tuple[int, ...]:
    """Raise unless there is at least one group, each m_t is an integer >= 1 and sum_t m_t <= n."""
    sizes = tuple(sample_sizes)
    if not sizes:
        raise InvalidSampleSizeError("a release of several tables needs at least one table (T >= 1), got none")
    for m in sizes:
        check_sample_size(n, m)
    if sum(sizes) > n:
        raise InvalidSampleSizeError(
            f"the groups are disjoint: their sizes must sum to at most n = {n}, got {' + '.join(map(str, sizes))} "
            f"= {sum(sizes)}"
        )
    return tuple(int(m) for m in sizes)


def _check(n: int, sample_sizes: Sequence[int], gammas: Sequence[float]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    sizes = check_sample_sizes(n, sample_sizes)
    if len(gammas) != len(sizes):
        raise ShapeMismatchError(f"one gamma per table: {len(sizes)} sample sizes but {len(gammas)} gammas")
    return sizes, tuple(check_gamma(g) for g in gammas)


def _order(gammas: Sequence[float]) -> list[int]:
    """The tables by gamma, largest first (ties in table order)."""
    return sorted(range(len(gammas)), key=lambda t: gammas[t], reverse=True)


def _ratios(n: int, sizes: Sequence[int], gammas: Sequence[float]) -> list[tuple[Fraction, int]]:
    """(Eq. T1's ratio for S = the k largest gammas, k), k = 0..T, exactly (Eq. T2)."""
    q = [Fraction(m, n) for m in sizes]
    g = [Fraction(x) for x in gammas]
    order = _order(gammas)
    num = Fraction(1)  # q_0 + sum_t q_t
    den = 1 - sum((qt * (1 - 1 / gt) for qt, gt in zip(q, g, strict=True)), Fraction(0))  # q_0 + sum q_t/g_t > 0
    out = [(num / den, 0)]
    for k, t in enumerate(order, 1):
        num += q[t] * (g[t] - 1)
        den += q[t] * (1 - 1 / g[t])
        out.append((num / den, k))
    return out


def subset_bound_base(n: int, sample_sizes: Sequence[int], gammas: Sequence[float]) -> Fraction:
    """e^epsilon of Eq. (T1), exactly: the max over subsets S of the tables of

        (q_0 + sum_{t in S} q_t gamma_t + sum_{t not in S} q_t)
        / (q_0 + sum_{t in S} q_t + sum_{t not in S} q_t / gamma_t),

    found by Eq. (T2) without enumerating the 2^T subsets: a maximizing S is a set of the largest
    gammas, so only the T + 1 prefixes of the gammas sorted downwards are compared. At T = 1 it is
    Theorem 3.2's 1 + (m/n)(gamma - 1)."""
    sizes, gs = _check(n, sample_sizes, gammas)
    return max(r for r, _ in _ratios(n, sizes, gs))


def worst_subset(n: int, sample_sizes: Sequence[int], gammas: Sequence[float]) -> frozenset[int]:
    """The indices of the tables in a maximizing S of Eq. (T1) (Eq. T2: the k largest gammas,
    the smallest such k): the tables whose output the changed record pushes up in the worst case;
    the others it pushes down."""
    sizes, gs = _check(n, sample_sizes, gammas)
    ratios = _ratios(n, sizes, gs)
    best = max(r for r, _ in ratios)
    k = min(k for r, k in ratios if r == best)
    return frozenset(_order(gs)[:k])


def _ln_rounded_up(base: Fraction) -> float:
    """The smallest float eps with e^eps >= base > 1, decided exactly by :func:`compare_with_exp`
    (the rounding of :func:`accounting.epsilon_from_gamma`)."""
    small = base - 1 < 2**1000  # else float(base - 1) would overflow
    eps = math.log1p(float(base - 1)) if small else math.log(base.numerator) - math.log(base.denominator)
    while compare_with_exp(base, Fraction(eps)) > 0:  # e^eps < base: eps too small
        eps = math.nextafter(eps, math.inf)
    while eps > 0 and compare_with_exp(base, Fraction(math.nextafter(eps, 0.0))) < 0:
        eps = math.nextafter(eps, 0.0)  # the next float below is still >= the exact value
    return eps


def subset_bound_epsilon(n: int, sample_sizes: Sequence[int], gammas: Sequence[float]) -> float:
    """Eq. (T1): epsilon = ln of :func:`subset_bound_base`, rounded up; Theorem 3.2, Eq. (1), at
    T = 1 (the same float as ``accounting.epsilon_from_gamma``). Tight whenever a maximizing S can
    be realised by three records (docs/privacy.md), e.g. always when the tables' attribute sets
    are pairwise disjoint."""
    return _ln_rounded_up(subset_bound_base(n, sample_sizes, gammas))


def sequential_epsilon(n: int, sample_sizes: Sequence[int], gammas: Sequence[float]) -> float:
    """Eq. (T3): sequential composition of Theorem 3.2 per table, sum_t ln(1 + q_t (gamma_t - 1)),
    as the ln of the exact product, rounded up. A valid bound for this joint sampling only because
    it is never below Eq. (T1) (docs/privacy.md): the composition theorem alone does not give it,
    since group t's positions are drawn from those the other groups left."""
    sizes, gs = _check(n, sample_sizes, gammas)
    base = Fraction(1)
    for m, g in zip(sizes, gs, strict=True):
        base *= 1 + Fraction(m, n) * (Fraction(g) - 1)
    return _ln_rounded_up(base)


def release_epsilon(n: int, sample_sizes: Sequence[int], gammas: Sequence[float]) -> float:
    """What the ledger charges for the release: min(Eq. T1, Eq. T3), both rounded up.

    Sequential composition (T3) is valid here because Eq. (T1) is a valid bound and is never
    above it (docs/privacy.md proves Eq. (T1) <= Eq. (T3)), so the minimum is always Eq. (T1);
    it is taken anyway so that the charge is never above the sequential figure. Theorem 3.2 at
    T = 1."""
    return min(subset_bound_epsilon(n, sample_sizes, gammas), sequential_epsilon(n, sample_sizes, gammas))


def gammas_for_epsilon(
    n: int, sample_sizes: Sequence[int], epsilon: float, weights: Sequence[float] | None = None
) -> tuple[float, ...]:
    """Eq. (T4): gamma_t = 1 + w_t s with the largest float s whose exact Eq. (T1) is <= epsilon.

    ``weights`` (default all 1) are the tables' relative weights of gamma_t - 1, each finite and
    > 0. Eq. (T1) increases in every gamma_t, so s is found by bisection, each step decided with
    exact rationals (:func:`compare_with_exp`): :func:`release_epsilon` of the result is at most
    ``epsilon`` (never rounded in the adversary's favour) and within a few float steps of it. At
    T = 1 it is Eq. (2) (``accounting.gamma_from_epsilon``; the weight is then irrelevant).
    :class:`InvalidEpsilonError` if epsilon is so large that a gamma overflows a float, or so
    small that a gamma rounds to 1."""
    sizes = check_sample_sizes(n, sample_sizes)
    eps = check_epsilon(epsilon)
    ws = _check_weights(weights, len(sizes))
    if len(sizes) == 1:
        return (gamma_from_epsilon(n, sizes[0], eps),)
    target = Fraction(eps)

    def gammas_at(s: float) -> tuple[float, ...]:
        return tuple(1.0 + w * s for w in ws)

    def fits(s: float) -> bool:
        gs = gammas_at(s)
        if not all(math.isfinite(g) for g in gs):
            return False
        return compare_with_exp(max(r for r, _ in _ratios(n, sizes, gs)), target) <= 0

    lo, hi = 0.0, 1.0
    if fits(hi):
        while fits(hi) and hi < _FLOAT_MAX:
            lo, hi = hi, min(hi * 2.0, _FLOAT_MAX)
    else:
        lo = 0.5
        while lo > 0.0 and not fits(lo):
            lo, hi = lo / 2.0, lo
    while True:
        mid = lo + (hi - lo) / 2.0
        if not lo < mid < hi:
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    if fits(hi) or not all(math.isfinite(g) for g in gammas_at(hi)):  # overflow, not epsilon, stopped s
        raise InvalidEpsilonError(
            f"epsilon = {eps!r} is too large: a gamma_t would exceed the largest float for n = {n}, m = {sizes}, "
            f"weights {ws} (and far below that, nobody is protected)"
        )
    gs = gammas_at(lo)
    if min(gs) <= 1.0:
        raise InvalidEpsilonError(
            f"epsilon = {eps!r} is too small: a gamma_t rounds to 1 (no release) for n = {n}, m = {sizes}, weights {ws}"
        )
    return gs


def _check_weights(weights: Sequence[float] | None, tables: int) -> tuple[float, ...]:
    if weights is None:
        return (1.0,) * tables
    ws = tuple(weights)
    if len(ws) != tables:
        raise ShapeMismatchError(f"one weight per table: {tables} sample sizes but {len(ws)} weights")
    for w in ws:
        if isinstance(w, bool) or not isinstance(w, int | float):
            raise InvalidGammaError(f"a table's weight of gamma - 1 must be a number > 0, got {w!r}")
        if not math.isfinite(w):
            raise NonFiniteInputError(f"a table's weight of gamma - 1 must be finite, got {w!r}")
        if w <= 0:
            raise InvalidGammaError(f"a table's weight of gamma - 1 must be > 0 (0 would make gamma 1), got {w!r}")
    return tuple(float(w) for w in ws)
