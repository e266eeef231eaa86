"""The lower end of Cramer's V's interval by inverting the printed test of independence (DESIGN 11).

A V interval and the test of independence printed beside it must agree: 0 lies outside the
interval at level 1 - alpha exactly when the test rejects at alpha. Here the interval's lower end
is read off the family of tests that the printed test begins:

- at t = 0 (independence) the test IS the printed one (:func:`~secure_release.mechanism.analysis.
  association.independence_test`: its statistic G, its calibration, its p-value), at level alpha:
  V cannot be below 0, so the whole of alpha goes to this one side;
- at a point t > 0 of a path of true tables p(t) (V(p(t)) rising from 0), the same statistic G
  (the likelihood ratio against independence) is calibrated by simulating the channel at p(t):
  p(t) = (1 + #{G* >= G}) / (B + 1), an exact Monte Carlo p-value, at level alpha/2 (the other
  alpha/2 is the upper end's).

The lower end is the smallest V the tests keep: 0 when the printed test keeps independence (p >
alpha), else the first crossing of p(t) - alpha/2 >= 0 after t = 0, found by linear interpolation
between simulated points (the bracket bisected five times), which is strictly above 0. Each point's
test has level at most alpha, so the set covers at its nominal rate (a Neyman construction with the
nuisance at plug-in values; measured in docs/analysis.md). G* grows with the association, so p(t)
rises with t and the kept set is one piece.

Conditional questions (A ~ B | C) use the conditional test and the pooled within-stratum
:func:`conditional_cramers_v`, zero exactly under conditional independence.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.analysis import association as assoc
from secure_release.mechanism.errors import TooFewLevelsError

FloatArray = npt.NDArray[np.float64]
Path = Callable[[FloatArray], FloatArray]

#: Points of the path simulated in the first pass (spaced evenly in t over [0, 1]).
COARSE_POINTS = 6
#: Bisections of the bracket of the lower end (each one simulated point): the bracket's width in t
#: falls from 1/6 to 1/192, so at a V of 0.3 the end is read within 0.002 of the crossing.
REFINE_ROUNDS = 5


def alpha_of(level: float) -> float:
    """The test's level alpha = 1 - ``level``, rounded to 12 digits (1 - 0.95 is 0.05, not
    0.050000000000000044: a Monte Carlo p-value of exactly 0.05 is then judged as printed)."""
    return round(1.0 - level, 12)


def rejects(p_value: float, level: float) -> bool:
    """Whether a test with ``p_value`` rejects at alpha = 1 - ``level``: p <= alpha (the printed
    verdict's rule, ``app/analysis.test_lines``)."""
    return bool(p_value <= alpha_of(level))


def conditional_cramers_v(shares: npt.ArrayLike) -> float | FloatArray:
    """Pooled within-stratum Cramer's V of (..., I, J, L) shares: sqrt(sum_l s_l phi_l^2 /
    (min(I, J) - 1)), phi_l^2 of the stratum's conditional table (Cramer 1946, Sec. 21.9), s_l the
    stratum shares; the ordinary V when L = 1. Zero exactly when A and B are independent in every
    stratum that holds mass (the null of the conditional test), and equal to chi^2 / (n (min - 1))
    summed over strata of the counts."""
    p = np.asarray(shares, dtype=np.float64)
    if p.ndim < 3 or p.shape[-3] < 2 or p.shape[-2] < 2:
        raise TooFewLevelsError(f"a conditional V needs shares (..., I, J, L), I, J >= 2, got shape {p.shape}")
    p = p / p.sum(axis=(-3, -2, -1), keepdims=True)
    strata = p.sum(axis=(-3, -2), keepdims=True)
    expected = np.divide(p.sum(axis=-2, keepdims=True) * p.sum(axis=-3, keepdims=True), strata,
                         out=np.zeros(np.broadcast_shapes(p.shape, strata.shape)), where=strata > 0)  # fmt: skip
    terms = np.divide((p - expected) ** 2, expected, out=np.zeros_like(p), where=expected > 0)
    value = np.sqrt(terms.sum(axis=(-3, -2, -1)) / (min(p.shape[-3], p.shape[-2]) - 1))
    return float(value) if value.ndim == 0 else np.asarray(value, dtype=np.float64)


def linear_path(centre: FloatArray) -> Path:
    """p(t) = p0 + t (q - p0), 0 <= t <= 1: from q's conditional-independence table p0 (the
    same stratum shares and within-stratum margins) to ``centre`` q (I, J, L); every cell stays
    in [0, 1] and conditional_cramers_v(p(t)) = t conditional_cramers_v(q) (each stratum's phi^2
    scales by t^2)."""
    independent = assoc.independence_fit(centre)

    def path(t: FloatArray) -> FloatArray:
        mix = np.clip(np.asarray(t, dtype=np.float64), 0.0, 1.0)[:, None, None, None]
        return np.asarray(independent[None] + mix * (centre - independent)[None], dtype=np.float64)

    return path


def g_test_p_values(
    tables: FloatArray, keep: float, m: int, statistic: float, draws: int, rng: np.random.Generator
) -> FloatArray:
    """For each true table (k, I, J, L): the Monte Carlo p-value (1 + #{G* >= G}) / (draws + 1)
    of the observed G among ``draws`` tables simulated through the channel at it, G* by the
    printed test's own rule (:func:`~secure_release.mechanism.analysis.association.exceedances`)."""
    out = np.empty(tables.shape[0])
    for i, table in enumerate(tables):
        source = table / table.sum()
        hits = assoc.exceedances(assoc.bootstrap_tables(source, keep, m, draws, rng), keep, statistic)
        out[i] = (1.0 + float(hits.sum())) / (draws + 1.0)
    return out


def _first_kept(t_points: FloatArray, gap: FloatArray) -> float:
    """The smallest t at which the piecewise-linear gap(t) is >= 0 (gap(0) < 0 here), or NaN."""
    inside = np.flatnonzero(gap >= 0)
    if inside.size == 0:
        return math.nan
    j = int(inside[0])
    g0, g1 = gap[j - 1], gap[j]
    return float(t_points[j - 1] + (t_points[j] - t_points[j - 1]) * g0 / (g0 - g1))


def lower_end(
    path: Path,
    effect: Callable[[FloatArray], FloatArray],
    keep: float,
    m: int,
    statistic: float,
    p_value: float,
    level: float,
    draws: int,
    rng: np.random.Generator,
) -> float:
    """The lower end of the effect's interval (module text): 0 when ``p_value`` > alpha = 1 -
    ``level`` (:func:`rejects`); else effect(path(t_L)) > 0, t_L the first t in (0, 1] where the
    Monte Carlo p-value of ``statistic`` (G) at path(t) reaches alpha/2, read by linear
    interpolation of p(t) - alpha/2 from gap(0) = ``p_value`` - alpha (-1e-12 at p = alpha);
    effect(path(1)) when no t <= 1 keeps.
    ``path``: t (k,) -> tables (k, I, J, L); ``effect``: tables -> (k,) effect values."""
    alpha = alpha_of(level)
    if not rejects(p_value, level):
        return 0.0
    t_points = np.linspace(0.0, 1.0, COARSE_POINTS + 1)
    simulated = g_test_p_values(path(t_points[1:]), keep, m, statistic, draws, rng)
    gap = np.concatenate([[min(p_value - alpha, -1e-12)], simulated - alpha / 2.0])
    for _ in range(REFINE_ROUNDS):
        kept = np.flatnonzero(gap >= 0)
        if kept.size == 0:
            break
        mid = 0.5 * (t_points[kept[0] - 1] + t_points[kept[0]])  # bisect the bracket of the first crossing
        more = g_test_p_values(path(np.asarray([mid])), keep, m, statistic, draws, rng) - alpha / 2.0
        order = np.argsort(np.append(t_points, mid), kind="stable")
        t_points, gap = np.append(t_points, mid)[order], np.append(gap, more)[order]
    where = _first_kept(t_points, gap)
    at = 1.0 if not math.isfinite(where) else where
    return float(effect(path(np.asarray([at])))[0])
