"""The interval of a conditional question's effect: the pooled within-stratum Cramer's V (DESIGN 11).

``A ~ B | C`` is answered by the conditional test of independence; its effect is the conditional
V (:func:`~secure_release.mechanism.analysis.v_interval.conditional_cramers_v`), zero exactly under
the test's null. The interval's lower end inverts that test
(:func:`~secure_release.mechanism.analysis.v_interval.lower_end`), so it excludes 0 exactly when
the test rejects; the upper end inverts a parametric-bootstrap test on the MLE's conditional V.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.analysis import association as assoc
from secure_release.mechanism.analysis import v_interval
from secure_release.mechanism.analysis.effects import tilt_path
from secure_release.mechanism.estimation.estimators import mle_water_filling

FloatArray = npt.NDArray[np.float64]
Path = v_interval.Path


def _stratum_directions(counts: FloatArray) -> FloatArray:
    """Each stratum's log-linear interaction (half a count added, double-centred, max |S| = 1;
    the linear-by-linear pattern where a stratum has none), (I, J, L)."""
    logs = np.log(counts + 0.5)
    s = (
        logs
        - logs.mean(axis=0, keepdims=True)
        - logs.mean(axis=1, keepdims=True)
        + logs.mean(axis=(0, 1), keepdims=True)
    )
    scale = np.max(np.abs(s), axis=(0, 1), keepdims=True)
    rows = np.arange(counts.shape[0]) - (counts.shape[0] - 1) / 2.0
    cols = np.arange(counts.shape[1]) - (counts.shape[1] - 1) / 2.0
    plain = np.outer(rows, cols)[:, :, None] / np.max(np.abs(np.outer(rows, cols)))
    return np.asarray(np.where(scale > 1e-12, s / np.where(scale > 1e-12, scale, 1.0), plain), dtype=np.float64)


def _upper_end(t_points: FloatArray, gap: FloatArray, path: Path, estimate: float) -> float:
    """The largest effect value the upper-side tests keep (gap = estimate - q_low(t) >= 0),
    crossings read by linear interpolation; the estimate when none keeps."""
    kept = np.flatnonzero(gap >= 0)
    if kept.size == 0:
        return estimate
    j = int(kept[-1])
    if j == t_points.size - 1:
        at = float(t_points[j])
    else:
        g0, g1 = gap[j], gap[j + 1]
        at = float(t_points[j] + (t_points[j + 1] - t_points[j]) * g0 / (g0 - g1))
    return max(estimate, float(np.asarray(v_interval.conditional_cramers_v(path(np.asarray([at]))))[0]))


def conditional_v_interval(
    observed: npt.ArrayLike,
    keep: float,
    statistic: float,
    p_value: float,
    *,
    level: float = 0.95,
    draws: int = 199,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(estimate, low, high) of the pooled within-stratum Cramer's V of an observed (I, J, L)
    table at level ``level`` (DESIGN 11). Estimate: at the MLE p_hat. Low: ``lower_end`` along
    ``linear_path`` to p_hat (both of :mod:`~secure_release.mechanism.analysis.v_interval`),
    inverting the conditional test whose ``statistic`` and ``p_value`` are given (0 exactly when
    p > 1 - level). High: the largest V of the path (the linear part, then each stratum of p_hat
    tilted by t - 1 times its observed interaction, margins kept) at which the estimate is not
    below the k-th smallest of ``draws`` simulated estimates, k = floor((1 - level)/2 (draws + 1))."""
    counts = assoc.check_table(observed).astype(np.float64)
    shape = counts.shape
    m = int(counts.sum())
    rng = np.random.default_rng(seed)
    p_hat = mle_water_filling(counts.reshape(1, -1), keep).reshape(shape)
    estimate = float(v_interval.conditional_cramers_v(p_hat))
    straight = v_interval.linear_path(p_hat)
    directions = _stratum_directions(counts)

    def path(t: FloatArray) -> FloatArray:
        t = np.asarray(t, dtype=np.float64)
        out = straight(t)
        beyond = t > 1
        if beyond.any():
            for stratum in range(shape[2]):  # strata, not records: L small tables
                q = p_hat[:, :, stratum]
                mass = float(q.sum())
                if mass > 0:
                    out[beyond, :, :, stratum] = mass * tilt_path(q.sum(axis=1) / mass, q.sum(axis=0) / mass,
                                                                  directions[:, :, stratum], t[beyond] - 1.0,
                                                                  base=q / mass)  # fmt: skip
        return out

    def effect(tables: FloatArray) -> FloatArray:
        return np.asarray(v_interval.conditional_cramers_v(tables), dtype=np.float64).reshape(-1)

    low = min(v_interval.lower_end(straight, effect, keep, m, statistic, p_value, level, draws, rng), estimate)
    rank = math.floor((1.0 - level) / 2.0 * (draws + 1) + 1e-9)
    if rank == 0:
        return estimate, low, 1.0
    t_points = np.concatenate(
        [np.linspace(0.0, 1.0, v_interval.COARSE_POINTS + 1), 1.0 + 12.0 * np.linspace(0.1, 1.0, 6) ** 2]
    )
    truths = path(t_points)
    cells = counts.size
    lows = np.empty(t_points.size)
    for i, table in enumerate(truths):
        simulated = assoc.bootstrap_tables(table / table.sum(), keep, m, draws, rng)
        fitted = mle_water_filling(simulated.reshape(draws, cells), keep).reshape(draws, *shape)
        lows[i] = np.sort(effect(fitted))[rank - 1]
    high = min(_upper_end(t_points, estimate - lows, path, estimate), 1.0)
    return estimate, low, max(high, low)
