"""Effect sizes of a two-attribute association on PRAM-perturbed counts, with intervals (DESIGN 11).

The researcher holds the observed counts o of m perturbed records on an I x J table (C = I J
cells). The channel keeps the true cell with probability a, else draws a uniform cell of the C,
so o ~ Multinomial(m, a p + (1 - a)/C) with p the true shares (DESIGN 3.4, 11).

Point estimates are plug-in: each effect evaluated at the unconstrained maximum-likelihood
estimate p_hat (:func:`~secure_release.mechanism.estimation.estimators.mle_water_filling`). The MLE is on
the simplex (never negative shares, unlike A^-1 T_obs), so every effect is defined on it, and a
function of an MLE is the MLE of the function (invariance).

Intervals invert a parametric-bootstrap test along a one-parameter path of true tables (a
Neyman construction with the nuisance fixed at plug-in values, see :func:`association_effects`).
Cramer's V and the mutual information are biased by PRAM noise and by the MLE's clipping at 0;
inverting a test whose null distribution is simulated through the same channel and the same
estimator carries that bias into the interval, where a percentile bootstrap around p_hat does
not - provided the path's tables have the bias the truth has near the truth's effect value.

That is where the path matters. At small m the bias is upward (noise inflates V); on large
sparse tables it is downward: the MLE puts mass on the truth's near-empty cells, making the table
more uniform (10 x 10, V = 0.4, m = 10^4, a = 0.3: E V_hat = 0.385, E MI_hat = 0.669 against
0.400 and 0.727). A path that tilts independence along the observed interaction reaches V = 0.4
through tables without those empty cells, whose simulated estimates are barely biased, so the
intervals sat too low (V missed 11, MI 31 times in 60). The path is therefore routed through the
data (:func:`mle_path`): linear from independence to a centre, then tilted beyond it. The centre
is the MLE after one cell-wise bootstrap bias correction (:func:`bias_corrected_table`), nearer
the truth's sparsity than the MLE. Its bias is still about 80% of the truth's on such tables, so
on tables with more than one interaction degree of freedom the end the correction moved is
extended by twice the change of bias the correction made (:func:`bias_step`); on a 2 x 2 table
the path is the whole family with the margins of p_hat and no centre is chosen.

Coverage measured by simulation (95% intervals; truths with uneven margins and a linear-by-linear
interaction, as in the unit test's ``_truth``) on I x J in {2 x 2, 3 x 4, 10 x 10}, m in {30, 100,
1000, 10^4}, a in {0.05, 0.3, 1}, V in {0, 0.1, 0.4}, all 108 points: every 10 x 10 point at
V = 0.4 missed V and MI at most 4 times in 100 (at m = 10^4, a = 0.3: 2 and 4; another 100: 6 and
6); 2 x 2 at m = 10^4: at most 8 in 200 for every effect; the other points at most 5 in 60 but
3 x 4, V = 0.4, m = 1000, a = 1 (7 in 60; 9 and 10 in 200 on a rerun, where the tilt path
alone missed 12 and 11 on the same data). Over all points and effects 1.9% missed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism import printing
from secure_release.mechanism.analysis import v_interval
from secure_release.mechanism.analysis.association import IndependenceTest, independence_test
from secure_release.mechanism.analysis.association import check_draws as _check_draws
from secure_release.mechanism.errors import (
    InvalidCountsError,
    ShapeMismatchError,
    TooFewLevelsError,
)
from secure_release.mechanism.estimation.estimators import check_level, mle_water_filling
from secure_release.mechanism.primitives.pram import check_keep as _check_keep

FloatArray = npt.NDArray[np.float64]

DEFAULT_DRAWS = 199
"""Bootstrap draws per point of the path: with 199 the Monte Carlo test at 2.5% a side is exact
(rank 5 of 200), see :func:`_order_statistic_ranks`."""

_PATH_END = 12.0  # largest |t| of the tilt path; max|S| = 1 so cell ratios reach e^24: saturated
_FINE = 201  # points of the deterministic grid along the path
_COARSE = 6  # bootstrap points a side in the first pass, evenly spaced in V along the path
_SINKHORN_STEPS = 200  # most sweeps of iterative proportional fitting (it stops at 1e-10)
_RECORDS_PER_CELL = 4  # draw by records when 4 m < C, by conditional binomials otherwise
_REFINE_ROUNDS = 2  # simulated points added where the interval ends were read, per round
_WEAK_MARGINS = 400.0  # a^2 m below this: margins barely identified, add the uniform-margin path
_LOG_OR_CAP = 30.0  # |log odds ratio| is clipped here inside the interval machinery
_STEP_FACTOR = 2.0  # the end a bias correction moved is extended by this many times its step

METHOD = (
    "parametric-bootstrap test inversion: each effect's MLE simulated through the PRAM channel ({draws} draws a "
    "point) along true tables from independence through the bias-corrected MLE; interval = effect values a "
    "two-sided test at {alpha:g} keeps; Cramer's V's lower end inverts the printed test of independence "
    "(p-value {p}): it is 0 exactly when that test keeps independence at {alpha:g}"
)


@dataclass(frozen=True)
class Effect:
    """One effect size: plug-in estimate and its interval at the result's ``level``."""

    name: str
    estimate: float
    low: float
    high: float

    @property
    def label(self) -> str:
        """The effect's reading name (``Cramer's V``)."""
        return printing.effect_name(self.name)

    def __str__(self) -> str:
        return f"{self.label} = {printing.fixed(self.estimate)}, interval {printing.interval(self.low, self.high)}"

    def __repr__(self) -> str:
        return printing.short_repr("Effect", f"{self.label} {printing.fixed(self.estimate)} "
                                             f"{printing.interval(self.low, self.high)}")  # fmt: skip

    def _repr_html_(self) -> str:
        return printing.Block(
            self.label, header=("effect", "estimate", "ci_low", "ci_high"),
            rows=((self.label, printing.fixed(self.estimate), printing.fixed(self.low), printing.fixed(self.high)),),
        ).html()  # fmt: skip


@dataclass(frozen=True)
class AssociationEffects:
    """Effect sizes of the association of a two-attribute table (DESIGN 11).

    ``odds_ratio`` and ``risk_difference`` are set only for a 2 x 2 table, ``kendall_tau_b`` only
    when both attributes are ordered; otherwise they are None.
    """

    cramers_v: Effect
    mutual_information: Effect  # in nats, of the true-cell distribution
    odds_ratio: Effect | None
    risk_difference: Effect | None
    kendall_tau_b: Effect | None
    level: float
    method: str
    draws: int
    #: the p-value of the test of independence whose inversion gives V's lower end (V's interval
    #: excludes 0 exactly when it is at most 1 - ``level``)
    test_p_value: float = math.nan

    # ------------------------------------------------------------------- reading the effects
    def measures(self) -> list[Effect]:
        """Every effect the table has, Cramer's V first (those that are None left out)."""
        optional = [self.odds_ratio, self.risk_difference, self.kendall_tau_b]
        return [self.cramers_v, self.mutual_information, *[x for x in optional if x is not None]]

    def columns(self) -> dict[str, list[Any]]:
        """The effects as named columns (for a DataFrame): effect, estimate, ci_low, ci_high."""
        shown = self.measures()
        return {
            "effect": [e.name for e in shown],
            "estimate": [e.estimate for e in shown],
            "ci_low": [e.low for e in shown],
            "ci_high": [e.high for e in shown],
        }

    def table(self) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
        """The effects table: header and rows (the effect's name, estimate, interval ends)."""
        lo, hi = printing.interval_columns(self.level)
        rows = tuple((e.label, printing.fixed(e.estimate), printing.fixed(e.low), printing.fixed(e.high))
                     for e in self.measures())  # fmt: skip
        return ("", "estimate", lo, hi), rows

    def block(self, title: str = "", notes: tuple[str, ...] = ()) -> printing.Block:
        """The effects as a table with their intervals at ``level``, then the method."""
        header, rows = self.table()
        return printing.Block(
            title or f"Effect sizes of an association, {printing.level_text(self.level)} intervals",
            header=header, rows=rows, notes=(f"intervals: {self.method}", *notes),
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        v = self.cramers_v
        return printing.short_repr(
            "AssociationEffects",
            f"Cramer's V = {printing.fixed(v.estimate)} {printing.interval(v.low, v.high)} "
            f"({printing.level_text(self.level)}), {len(self.measures())} effects",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


# --- the formulas (vectorised over leading axes; shares (..., I, J), normalised here) --------


def _normalised(shares: npt.ArrayLike) -> FloatArray:
    p = np.asarray(shares, dtype=np.float64)
    if p.ndim < 2 or p.shape[-1] < 2 or p.shape[-2] < 2:
        raise TooFewLevelsError(f"an effect size needs a table of at least 2 x 2 shares, got shape {p.shape}")
    total = p.sum(axis=(-2, -1), keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(p / total, dtype=np.float64)


def _result(values: FloatArray) -> float | FloatArray:
    return float(values) if values.ndim == 0 else values


def cramers_v(shares: npt.ArrayLike) -> float | FloatArray:
    """Cramer's V = sqrt(phi^2 / (min(I, J) - 1)), phi^2 = sum_ij (p_ij - r_i c_j)^2 / (r_i c_j)
    with r, c the margins of the normalised table (Cramer 1946, Sec. 21.9; = chi^2 / n of the
    counts). Cells of an empty row or column contribute 0; a table with one non-empty row or
    column has V = 0."""
    p = _normalised(shares)
    expected = p.sum(axis=-1, keepdims=True) * p.sum(axis=-2, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = np.where(expected > 0, (p - expected) ** 2 / expected, 0.0)
    smaller = min(p.shape[-2], p.shape[-1]) - 1
    return _result(np.sqrt(terms.sum(axis=(-2, -1)) / smaller))


def mutual_information(shares: npt.ArrayLike) -> float | FloatArray:
    """Mutual information in nats, I = sum_ij p_ij ln(p_ij / (r_i c_j)), terms with p_ij = 0
    being 0 (Cover and Thomas 2006, Eq. 2.28)."""
    p = _normalised(shares)
    expected = p.sum(axis=-1, keepdims=True) * p.sum(axis=-2, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = np.where(p > 0, p * np.log(p / expected), 0.0)
    return _result(np.maximum(terms.sum(axis=(-2, -1)), 0.0))


def _two_by_two(shares: npt.ArrayLike) -> FloatArray:
    p = _normalised(shares)
    if p.shape[-2:] != (2, 2):
        raise ShapeMismatchError(f"this effect is defined on a 2 x 2 table, got shape {p.shape}")
    return p


def odds_ratio(shares: npt.ArrayLike) -> float | FloatArray:
    """Odds ratio p_11 p_22 / (p_12 p_21) of a 2 x 2 table (Agresti 2013, Eq. 2.9): inf when
    only the denominator is 0, NaN when both are."""
    p = _two_by_two(shares)
    with np.errstate(invalid="ignore", divide="ignore"):
        return _result(p[..., 0, 0] * p[..., 1, 1] / (p[..., 0, 1] * p[..., 1, 0]))


def risk_difference(shares: npt.ArrayLike) -> float | FloatArray:
    """Risk difference P(b = 2nd | a = 2nd) - P(b = 2nd | a = 1st) = p_22/(p_21 + p_22) -
    p_12/(p_11 + p_12), a the rows and b the columns (Agresti 2013, Sec. 2.2.1); NaN when a row
    is empty."""
    p = _two_by_two(shares)
    with np.errstate(invalid="ignore", divide="ignore"):
        second = p[..., 1, 1] / (p[..., 1, 0] + p[..., 1, 1])
        first = p[..., 0, 1] / (p[..., 0, 0] + p[..., 0, 1])
    return _result(second - first)


def kendall_tau_b(shares: npt.ArrayLike) -> float | FloatArray:
    """Kendall's tau-b of a table of two ordered attributes (Agresti 2010, Sec. 7.1.4):
    tau_b = 2 (P_c - P_d) / sqrt((1 - sum r_i^2)(1 - sum c_j^2)), with
    P_c = sum_ij p_ij sum_{i' > i, j' > j} p_i'j' and P_d = sum_ij p_ij sum_{i' > i, j' < j} p_i'j'.
    From counts n p: concordant minus discordant pairs over sqrt((n0 - n1)(n0 - n2)), n0 - n1 =
    (n^2 - sum r_i^2)/2 once n = sum r_i, which is the formula above times n^2/2. NaN when one
    attribute has a single non-empty level."""
    p = _normalised(shares)
    # S[i, j] = sum_{i' >= i, j' >= j}: suffix sums; L[i, j] = sum_{i' >= i, j' <= j}
    suffix = np.flip(np.cumsum(np.cumsum(np.flip(p, axis=(-2, -1)), axis=-2), axis=-1), axis=(-2, -1))
    lower_left = np.cumsum(np.flip(np.cumsum(np.flip(p, axis=-2), axis=-2), axis=-2), axis=-1)
    concordant = np.zeros_like(p)
    concordant[..., :-1, :-1] = suffix[..., 1:, 1:]
    discordant = np.zeros_like(p)
    discordant[..., :-1, 1:] = lower_left[..., 1:, :-1]
    pc = np.sum(p * concordant, axis=(-2, -1))
    pd = np.sum(p * discordant, axis=(-2, -1))
    rows = 1.0 - np.sum(p.sum(axis=-1) ** 2, axis=-1)
    cols = 1.0 - np.sum(p.sum(axis=-2) ** 2, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return _result(2.0 * (pc - pd) / np.sqrt(rows * cols))


# --- argument checks -------------------------------------------------------------------------


def _check_observed(observed: npt.ArrayLike) -> npt.NDArray[np.int64]:
    raw = np.asarray(observed)
    if raw.ndim != 2:
        raise InvalidCountsError(f"observed counts must be an I x J table, got {raw.ndim} dimension(s)")
    if raw.shape[0] < 2 or raw.shape[1] < 2:
        raise TooFewLevelsError(f"each attribute needs at least 2 levels, got a {raw.shape[0]} x {raw.shape[1]} table")
    if raw.dtype == bool or not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
        raise InvalidCountsError(f"observed counts must be non-negative integers, got dtype {raw.dtype}")
    values = raw.astype(np.float64)
    if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values != np.round(values)):
        raise InvalidCountsError("observed counts must be finite, non-negative integers")
    if values.sum() < 1:
        raise InvalidCountsError("observed counts are all zero: at least one record is needed")
    return values.astype(np.int64)


# --- the interval machinery ------------------------------------------------------------------


def _working_statistics(tables: FloatArray, names: tuple[str, ...]) -> FloatArray:
    """Each named effect of tables (..., I, J) on the scale the intervals work in, stacked on a
    last axis: V, MI, log odds ratio (clipped to +-30), risk difference, tau-b. An undefined value
    (0/0: an empty row, a degenerate 2 x 2) is the no-association value 0."""
    columns: list[FloatArray] = []
    for name in names:
        if name == "cramers_v":
            value = np.asarray(cramers_v(tables))
        elif name == "mutual_information":
            value = np.asarray(mutual_information(tables))
        elif name == "odds_ratio":
            with np.errstate(divide="ignore"):
                value = np.clip(np.log(np.asarray(odds_ratio(tables))), -_LOG_OR_CAP, _LOG_OR_CAP)
        elif name == "risk_difference":
            value = np.asarray(risk_difference(tables))
        else:
            value = np.asarray(kendall_tau_b(tables))
        columns.append(np.nan_to_num(value.astype(np.float64), nan=0.0))
    return np.stack(columns, axis=-1)


def _double_centred(matrix: FloatArray) -> FloatArray:
    return np.asarray(
        matrix - matrix.mean(axis=0, keepdims=True) - matrix.mean(axis=1, keepdims=True) + matrix.mean(),
        dtype=np.float64,
    )


def _tilt_direction(observed: npt.NDArray[np.int64]) -> FloatArray:
    """The log-linear interaction of the observed table (half a count added to every cell),
    double-centred and scaled to max |S| = 1. The channel adds a constant to every cell, so the
    observed table's interaction points the way of the true one. A table without interaction
    (all counts equal, say) gets the linear-by-linear pattern (i - mean)(j - mean)."""
    direction = _double_centred(np.log(observed.astype(np.float64) + 0.5))
    scale = float(np.max(np.abs(direction)))
    if scale < 1e-12:
        rows = np.arange(observed.shape[0]) - (observed.shape[0] - 1) / 2.0
        cols = np.arange(observed.shape[1]) - (observed.shape[1] - 1) / 2.0
        direction = np.outer(rows, cols)
        scale = float(np.max(np.abs(direction)))
    return np.asarray(direction / scale, dtype=np.float64)


def tilt_path(
    rows: FloatArray, cols: FloatArray, direction: FloatArray, t: FloatArray, base: FloatArray | None = None
) -> FloatArray:
    """The tables p(t) with margins ``rows``, ``cols`` whose log-linear interaction is t S
    (DESIGN 11 effects): p(t)_ij = x_i y_j exp(t S_ij), x and y fitted to the margins by
    iterative proportional fitting (Sinkhorn; it keeps every cross-ratio, so the interaction is
    exactly t S and t = 0 is independence r c^T). On a 2 x 2 table this is the whole family of
    tables with those margins, log odds ratio t (S_11 - S_12 - S_21 + S_22). With ``base`` B
    (shares, zeros allowed) the kernel is B_ij exp(t S_ij): the tilt of B, zero cells staying 0.
    Returns (len(t), I, J).
    """
    logits = t[:, None, None] * direction[None]
    logits -= logits.max(axis=(1, 2), keepdims=True)
    kernel = np.exp(logits) if base is None else np.exp(logits) * base[None]
    x = np.ones((t.size, rows.size, 1))
    y = np.ones((t.size, 1, cols.size))
    row_target, col_target = rows[None, :, None], cols[None, None, :]
    for step in range(_SINKHORN_STEPS):
        row_sums = np.sum(kernel * y, axis=2, keepdims=True)
        x = np.divide(row_target, row_sums, out=np.zeros_like(row_sums), where=row_sums > 0)
        col_sums = np.sum(kernel * x, axis=1, keepdims=True)
        y = np.divide(col_target, col_sums, out=np.zeros_like(col_sums), where=col_sums > 0)
        if step % 8 == 7 and np.max(np.abs(np.sum(kernel * x * y, axis=2) - rows[None, :])) < 1e-10:
            break
    tables = x * kernel * y
    return np.asarray(tables / tables.sum(axis=(1, 2), keepdims=True), dtype=np.float64)


def mle_path(centre: FloatArray, direction: FloatArray, t: FloatArray) -> FloatArray:
    """The path of true tables through a table estimated from the data, ``centre`` = q (DESIGN 11
    effects; :func:`association_effects` passes the bias-corrected MLE), margins r, c of q:
    p(t) = r c^T + t (q - r c^T) for 0 <= t <= 1 (independence to q; phi^2(p(t)) = t^2 phi^2(q),
    so Cramer's V is exactly t V(q)), the tilt of q by (t - 1) S beyond (:func:`tilt_path` with
    base q: cells empty in q stay empty), and the tilt of independence by t S for t < 0 (the
    reversed association of a signed effect). Continuous at t = 0 and t = 1. Returns
    (len(t), I, J)."""
    rows, cols = centre.sum(axis=1), centre.sum(axis=0)
    independent = np.outer(rows, cols)
    t = np.asarray(t, dtype=np.float64)
    tables = np.empty((t.size, *centre.shape))
    below, between, beyond = t < 0, (t >= 0) & (t <= 1), t > 1
    if below.any():
        tables[below] = tilt_path(rows, cols, direction, t[below])
    if between.any():
        mix = t[between][:, None, None]
        tables[between] = independent[None] + mix * (centre - independent)[None]
    if beyond.any():
        tables[beyond] = tilt_path(rows, cols, direction, t[beyond] - 1.0, base=centre)
    return tables


def _order_statistic_ranks(draws: int, alpha: float) -> int:
    """k = floor(alpha/2 (B + 1)): the Monte Carlo test rejects "theta too small" when the
    observed estimate exceeds the (B - k + 1)-th smallest of B draws, i.e. when at most k - 1
    draws reach it, whose probability under the null is k/(B + 1) <= alpha/2 by exchangeability
    (exact for continuous statistics; ties only make it rarer). k = 0: never rejects."""
    return math.floor(alpha / 2.0 * (draws + 1) + 1e-9)


def _multinomial(m: int, probs: FloatArray, draws: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``draws`` Multinomial(m, probs) count vectors. With fewer records than cells, m records
    per draw by inverse CDF (searchsorted of uniforms, then one bincount): O(m log C) a draw
    instead of the C conditional binomials of Generator.multinomial."""
    cells = probs.size
    if m * _RECORDS_PER_CELL >= cells:
        return np.asarray(rng.multinomial(m, probs, size=draws), dtype=np.int64)
    cdf = np.cumsum(probs)
    cdf /= cdf[-1]
    records = np.minimum(np.searchsorted(cdf, rng.random((draws, m)), side="right"), cells - 1)
    records += np.arange(draws)[:, None] * cells
    return np.bincount(records.reshape(-1), minlength=draws * cells).reshape(draws, cells).astype(np.int64)


def _simulate_quantiles(
    tables: FloatArray, keep: float, m: int, draws: int, rank: int, names: tuple[str, ...], rng: np.random.Generator
) -> tuple[FloatArray, FloatArray]:
    """For each true table (k, I, J): draw B observed tables through the channel, take the MLE
    and each effect, and return the rank-th smallest and rank-th largest (k, effects)."""
    k, rows, cols = tables.shape
    cells = rows * cols
    probs = keep * tables.reshape(k, cells) + (1.0 - keep) / cells
    probs /= probs.sum(axis=1, keepdims=True)
    counts = np.stack([_multinomial(m, probs[i], draws, rng) for i in range(k)])
    mle = mle_water_filling(counts.reshape(k * draws, cells), keep).reshape(k, draws, rows, cols)
    stats = np.sort(_working_statistics(mle, names), axis=1)
    if rank == 0:
        return np.full((k, len(names)), -np.inf), np.full((k, len(names)), np.inf)
    return stats[:, rank - 1, :], stats[:, draws - rank, :]


def _bootstrap_mles(
    table: FloatArray, keep: float, m: int, draws: int, rng: np.random.Generator
) -> FloatArray:
    """The MLEs (draws, I, J) of ``draws`` tables ~ Multinomial(m, a table + (1 - a)/C)."""
    rows, cols = table.shape
    probs = keep * table.reshape(-1) + (1.0 - keep) / table.size
    counts = _multinomial(m, probs / probs.sum(), draws, rng)
    return mle_water_filling(counts, keep).reshape(draws, rows, cols)


def bias_corrected_table(p_hat: FloatArray, mles: FloatArray) -> FloatArray:
    """One parametric-bootstrap bias correction of the MLE, cell by cell (Efron and Tibshirani
    1993, Eq. 10.7): p_tilde = max(0, 2 p_hat - mean_b p_hat*_b), with ``mles`` the p_hat*_b
    (B, I, J), MLEs of tables simulated at p_hat (:func:`_bootstrap_mles`), then refitted to the
    margins of p_hat (:func:`tilt_path` at t = 0 with base p_tilde). The MLE clips at 0, so a
    cell near 0 is biased upward and the estimated table is less sparse than the truth; this
    undoes most of it (measured on 10 x 10, V = 0.4, m = 10^4, a = 0.3, 6 data sets: the
    bootstrap bias of V is -0.009 to -0.015 at p_tilde, -0.009 to -0.014 at p_hat, -0.015 at
    the truth; of MI -0.038 to -0.064, -0.023 to -0.053 and -0.058)."""
    corrected = np.maximum(2.0 * p_hat - mles.mean(axis=0), 0.0)
    if corrected.sum() <= 0:
        return p_hat
    direction = np.zeros_like(p_hat)
    return np.asarray(
        tilt_path(p_hat.sum(axis=1), p_hat.sum(axis=0), direction, np.zeros(1), base=corrected)[0], dtype=np.float64
    )


def bias_step(
    p_hat: FloatArray, mles_at_hat: FloatArray, centre: FloatArray, mles_at_centre: FloatArray, names: tuple[str, ...]
) -> FloatArray:
    """The change of each effect's bootstrap bias made by the correction (working scale):
    d = (mean_b theta(p*_b | centre) - theta(centre)) - (mean_b theta(p*_b | p_hat) - theta(p_hat)).
    The bias at the truth lies further the same way: the correction is one step of the fixed
    point p = p_hat - bias(p), and further steps move on in the same direction but by less than
    the remaining gap (measured, 10 x 10, V = 0.4, m = 10^4, a = 0.3: V's bias -0.0103 at p_hat,
    -0.0121 after one step, -0.0123 after three; -0.0153 at the truth). The interval is extended
    by ``_STEP_FACTOR`` |d| = 2 |d| on the side the bias pushes the truth: up when d < 0, down when
    d > 0 (with |d| alone V still missed 9 of 100 there, 7 of them above; with 2 |d|, 6 of 100)."""
    at_centre = _working_statistics(mles_at_centre, names).mean(axis=0) - _working_statistics(centre, names)
    at_hat = _working_statistics(mles_at_hat, names).mean(axis=0) - _working_statistics(p_hat, names)
    return np.asarray(at_centre - at_hat, dtype=np.float64)


def _crossings(t_points: FloatArray, gap: FloatArray) -> FloatArray:
    """Where the piecewise-linear curve through (t_points, gap) crosses from < 0 to >= 0 or back."""
    i = np.nonzero((gap[:-1] >= 0) != (gap[1:] >= 0))[0]
    g0, g1 = gap[i], gap[i + 1]
    return np.asarray(t_points[i] + (t_points[i + 1] - t_points[i]) * g0 / (g0 - g1), dtype=np.float64)


def _interval_end(
    path: Callable[[FloatArray], FloatArray],
    t_fine: FloatArray,
    stats_fine: FloatArray,
    t_points: FloatArray,
    gap: FloatArray,
    low_end: bool,
) -> tuple[float, float]:
    """One end of one effect's interval along one path, and the t where it is attained (NaN
    unless it is a crossing of a quantile curve, which a further simulated point can sharpen).

    The low end is the smallest effect value at which the estimate is not too large (gap =
    q_high(t) - estimate >= 0), the high end the largest at which it is not too small (gap =
    estimate - q_low(t) >= 0). The gap is linear in t between simulated points; its crossings
    of 0 are solved exactly and the effect evaluated there (``path``: t -> effect), the rest of
    the set read on the fine grid. When no t passes (the estimate is beyond every simulated
    table), the end is the path's extreme on the other side."""
    inside = np.interp(t_fine, t_points, gap) >= 0
    crossing = _crossings(t_points, gap)
    values = np.concatenate([stats_fine[inside], path(crossing) if crossing.size else np.empty(0)])
    where = np.concatenate([np.full(int(inside.sum()), np.nan), crossing])
    if values.size == 0:
        return float(stats_fine.max() if low_end else stats_fine.min()), math.nan
    best = int(np.argmin(values) if low_end else np.argmax(values))
    return float(values[best]), float(where[best])


def _coarse_points(t_fine: FloatArray, v_fine: FloatArray, per_side: int) -> FloatArray:
    """Points of the path evenly spaced in Cramer's V on each side of t = 0."""
    chosen = [0.0]
    for side in (t_fine >= 0, t_fine <= 0):
        t_side, v_side = t_fine[side], v_fine[side]
        if t_side.size < 2 or float(np.ptp(v_side)) <= 0:
            continue
        targets = np.linspace(v_side.min(), v_side.max(), per_side + 1)[1:]
        for target in targets:
            chosen.append(float(t_side[int(np.argmin(np.abs(v_side - target)))]))
    return np.unique(np.asarray(chosen, dtype=np.float64))


def _path_bounds(
    path: Callable[[FloatArray], FloatArray],
    t_fine: FloatArray,
    keep: float,
    m: int,
    draws: int,
    rank: int,
    names: tuple[str, ...],
    observed_stats: FloatArray,
    rng: np.random.Generator,
    anchors: tuple[float, ...] = (),
) -> tuple[FloatArray, FloatArray]:
    """Lowest and highest effect value (working scale) the tests keep along one path (``path``:
    t -> tables (len(t), I, J), t = 0 independence; ``t_fine``: its deterministic grid;
    ``anchors``: further t simulated from the start, such as the path's centre)."""
    fine_tables = path(t_fine)
    fine_stats = _working_statistics(fine_tables, names)
    fine_stats[t_fine == 0] = 0.0  # independence: every effect's no-association value, not sqrt(rounding)
    v_fine = np.abs(fine_stats[:, 0])  # the first effect (V, or tau-b on its own path) spaces the points
    t_points = np.union1d(_coarse_points(t_fine, v_fine, _COARSE), np.asarray(anchors, dtype=np.float64))
    low_q, high_q = _simulate_quantiles(path(t_points), keep, m, draws, rank, names, rng)

    def effect_at(t: FloatArray, e: int) -> FloatArray:
        return np.asarray(_working_statistics(path(t), names)[:, e])

    lows = np.empty(len(names))
    highs = np.empty(len(names))
    for step in range(_REFINE_ROUNDS + 1):
        deciding: list[float] = []
        for e in range(len(names)):
            for low_end, gap in ((True, high_q[:, e] - observed_stats[e]), (False, observed_stats[e] - low_q[:, e])):
                value, where = _interval_end(
                    functools.partial(effect_at, e=e), t_fine, fine_stats[:, e], t_points, gap, low_end
                )
                if low_end:
                    lows[e] = value
                else:
                    highs[e] = value
                if math.isfinite(where) and np.min(np.abs(t_points - where)) > 1e-9:
                    deciding.append(where)
        if step == _REFINE_ROUNDS or not deciding:
            break
        # regula falsi: simulate where each end was read, so the next reading has a bracket there
        more = np.unique(np.asarray(deciding, dtype=np.float64))
        low_more, high_more = _simulate_quantiles(path(more), keep, m, draws, rank, names, rng)
        order = np.argsort(np.concatenate([t_points, more]), kind="stable")
        t_points = np.concatenate([t_points, more])[order]
        low_q = np.concatenate([low_q, low_more])[order]
        high_q = np.concatenate([high_q, high_more])[order]
    return lows, highs


def _margins_weak(margins: tuple[FloatArray, FloatArray], m: int, keep: float) -> bool:
    """Whether the plug-in margins are too uncertain to fix the path's nuisance alone: a margin
    of the MLE has an empty level, or a sqrt(m) < 20 (a margin share's standard error, about
    1/(a sqrt(m)) from DESIGN 3's variance, above 0.05). The interval is then the union with the
    path at uniform margins, whose effects reach their widest range (measured: without it, 2 x 2
    risk differences at m = 30, a = 1 missed 15 times in 60)."""
    return bool(np.any(margins[0] <= 0) or np.any(margins[1] <= 0) or keep * keep * m < _WEAK_MARGINS)


def _effect_names(shape: tuple[int, int], ordered: bool) -> tuple[str, ...]:
    names = ["cramers_v", "mutual_information"]
    if shape == (2, 2):
        names += ["odds_ratio", "risk_difference"]
    if ordered:
        names.append("kendall_tau_b")
    return tuple(names)


def _to_effect(name: str, estimate: float, low: float, high: float) -> Effect:
    if name == "odds_ratio":
        low_or = 0.0 if low <= -_LOG_OR_CAP else math.exp(low)
        high_or = math.inf if high >= _LOG_OR_CAP else math.exp(high)
        return Effect(name, estimate, low_or, high_or)
    return Effect(name, estimate, low, high)


def association_effects(
    observed: npt.ArrayLike,
    keep: float,
    *,
    ordered: bool = False,
    level: float = 0.95,
    draws: int = DEFAULT_DRAWS,
    seed: int = 0,
    test: IndependenceTest | None = None,
) -> AssociationEffects:
    """Effect sizes of the association of an observed (perturbed) I x J table, with intervals.

    ``observed``: integer counts (I, J) of the m perturbed records; ``keep``: the channel's keep
    probability a; ``ordered``: both attributes ordered (adds Kendall's tau-b); ``draws``: the
    bootstrap draws per simulated point of the path; ``seed``: the bootstrap's seed; ``test``:
    the printed test of independence of the same table (default: :func:`independence_test` of
    it with its defaults and ``seed``), whose inversion gives V's lower end.

    Estimates: each effect at the MLE p_hat of the true shares (plug-in; see the module).
    Intervals (DESIGN 11): a test-inversion (Neyman) construction along one-parameter families
    of true tables p(t), t = 0 independence. For V, MI, OR and RD the family is :func:`mle_path`
    through the centre p_tilde (:func:`bias_corrected_table`; the margins of p_hat): linear from
    independence (t = 0) to p_tilde (t = 1), p_tilde tilted by (t - 1) S beyond, S the observed
    table's interaction (:func:`_tilt_direction`), and independence tilted by t S for t < 0 when a
    signed effect (2 x 2, ordered) asks for both signs. At 7-14 points of t (spaced evenly in V,
    plus t = 1), then at the interval ends found (two regula-falsi rounds), the MLE's effects are
    simulated through the channel (``draws`` tables ~ Multinomial(m, a p(t) + (1 - a)/C)). The
    exact Monte Carlo test keeps t on the low side when the estimate is at most the k-th largest
    draw, on the high side when it is at least the k-th smallest, k = floor((1 - level)/2
    (draws + 1)); each interval end is the extreme effect value of p(t) over the t its side keeps
    (quantile curves linear in t between simulated points). When the margins are weak
    (:func:`_margins_weak`: an empty level, or a^2 m < 400) the same is done along the path
    :func:`tilt_path` with uniform margins, and the union taken. Kendall's tau-b uses the
    linear-by-linear tilt of independence at the margins of p_hat (and uniform ones if weak).
    On tables larger than 2 x 2 the end of V's and MI's interval that the bias correction moved
    is then extended by twice that move (:func:`bias_step`); the interval is widened to contain
    the estimate and clipped to V in [0, 1], MI in [0, ln min(I, J)]. Because the simulated null
    carries the bias of V and MI through the same channel and estimator, V's interval starts at
    0 when the one-sided test of independence at (1 - level)/2 (statistic V of the MLE, margins
    at plug-in) does not reject (barring the extension). V's lower end is then replaced by the
    inversion of ``test`` itself (:func:`~secure_release.mechanism.analysis.v_interval.lower_end`
    along the straight part of the path, independence to the centre): 0 exactly when ``test``'s
    p-value is above 1 - ``level``, above 0 otherwise, by construction. Odds ratios work on the log scale,
    clipped at +-30 (reported as 0 or inf beyond); an undefined effect of a bootstrap table (0/0)
    counts as no association.
    Cost: O(points x draws x C log C); coverage measured by simulation (the helper's report).
    """
    counts = _check_observed(observed)
    a = _check_keep(keep)
    lev = check_level(level)
    draws = _check_draws(draws)
    rows, cols = counts.shape
    m = int(counts.sum())
    names = _effect_names((rows, cols), bool(ordered))
    signed = len(names) > 2
    rng = np.random.default_rng(seed)
    p_hat = mle_water_filling(counts.reshape(-1).astype(np.float64), a).reshape(rows, cols)
    estimates = _working_statistics(p_hat, names)
    rank = _order_statistic_ranks(draws, 1.0 - lev)
    direction = _tilt_direction(counts)
    bases = [(p_hat.sum(axis=1), p_hat.sum(axis=0))]
    if _margins_weak(bases[0], m, a):
        bases.append((np.full(rows, 1.0 / rows), np.full(cols, 1.0 / cols)))
    lows = estimates.copy()
    highs = estimates.copy()
    # V, MI, OR, RD along the observed interaction; tau-b along the linear-by-linear one (the
    # uniform-association direction: a noise direction may never reach a large tau-b)
    scores = np.outer(np.arange(rows) - (rows - 1) / 2.0, np.arange(cols) - (cols - 1) / 2.0)
    paths = [(direction, [i for i, n in enumerate(names) if n != "kendall_tau_b"])]
    if ordered:
        paths.append((scores / np.abs(scores).max(), [names.index("kendall_tau_b")]))
    u = np.linspace(-1.0 if signed else 0.0, 1.0, _FINE)
    t_tilt = _PATH_END * np.sign(u) * u**2
    beyond = 1.0 + t_tilt[t_tilt > 0]
    t_through = np.concatenate([t_tilt[t_tilt < 0], np.linspace(0.0, 1.0, _FINE // 3), beyond])
    mles_at_hat = _bootstrap_mles(p_hat, a, m, draws, rng)
    centre = bias_corrected_table(p_hat, mles_at_hat)
    main = [i for i, n in enumerate(names) if n != "kendall_tau_b"]
    main_names = tuple(names[i] for i in main)
    step = np.zeros(len(names))
    if (rows - 1) * (cols - 1) > 1:  # a 2 x 2 path is the whole family with those margins: no centre to choose
        step[main] = bias_step(p_hat, mles_at_hat, centre, _bootstrap_mles(centre, a, m, draws, rng), main_names)
    for index, base in enumerate(bases):
        for path_direction, chosen in paths:
            subset = tuple(names[i] for i in chosen)
            path: Callable[[FloatArray], FloatArray]
            anchors: tuple[float, ...]
            if index == 0 and path_direction is direction:
                path, t_fine, anchors = functools.partial(mle_path, centre, direction), t_through, (1.0,)
            else:
                path, t_fine, anchors = functools.partial(tilt_path, *base, path_direction), t_tilt, ()
            low, high = _path_bounds(path, t_fine, a, m, draws, rank, subset, estimates[chosen], rng, anchors)
            lows[chosen] = np.fmin(lows[chosen], low)
            highs[chosen] = np.fmax(highs[chosen], high)
    lows -= _STEP_FACTOR * np.maximum(step, 0.0)
    highs -= _STEP_FACTOR * np.minimum(step, 0.0)
    ceilings = {"cramers_v": 1.0, "mutual_information": math.log(min(rows, cols))}
    for i, name in enumerate(names):
        if name in ceilings:
            lows[i], highs[i] = max(lows[i], 0.0), min(highs[i], ceilings[name])
    if test is None:
        test = independence_test(counts, a, seed=seed)
    p_value = float(test.p_value)
    v_centre = centre if float(cramers_v(centre)) > 0 else p_hat  # a centre without association: p_hat's
    v_low = v_interval.lower_end(
        lambda t: mle_path(v_centre, direction, t)[..., None], lambda tables: np.asarray(cramers_v(tables[..., 0])),
        a, m, float(test.statistic), p_value, lev, draws, rng,
    )  # fmt: skip
    lows[0] = min(v_low, float(estimates[0]))
    highs[0] = max(highs[0], lows[0])
    raw_estimates = {
        "cramers_v": float(cramers_v(p_hat)),
        "mutual_information": float(mutual_information(p_hat)),
    }
    if "odds_ratio" in names:
        raw_estimates["odds_ratio"] = float(odds_ratio(p_hat))
        raw_estimates["risk_difference"] = float(risk_difference(p_hat))
    if "kendall_tau_b" in names:
        raw_estimates["kendall_tau_b"] = float(kendall_tau_b(p_hat))
    effects = {
        name: _to_effect(name, raw_estimates[name], float(lows[i]), float(highs[i])) for i, name in enumerate(names)
    }
    return AssociationEffects(
        cramers_v=effects["cramers_v"],
        mutual_information=effects["mutual_information"],
        odds_ratio=effects.get("odds_ratio"),
        risk_difference=effects.get("risk_difference"),
        kendall_tau_b=effects.get("kendall_tau_b"),
        level=lev,
        method=METHOD.format(draws=draws, alpha=1.0 - lev, p=printing.p_value(p_value)),
        draws=draws,
        test_p_value=p_value,
    )
