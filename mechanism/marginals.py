"""Marginals and conditional tables of a released estimate, with standard errors (pure numpy).

A released estimate covers C cells (the joint alphabet, or a curator subset's marginal when
some curators refused their keys). Its channel on those cells is "keep the record's cell with
probability a, else a uniform cell", so each cell gets off-diagonal mass b = (1 - a)/C
(DESIGN 3.5; for the joint, b = 1/q). The groups of a marginal over some attributes all hold
g = C / (number of groups) cells, and summed over them the channel is again "keep w.p. a, else
uniform" with off-diagonal g b (DESIGN 3.5). So a group's raw estimate is the sum of its cells',
its variance is DESIGN 3's per-cell formula with b -> g b
(:func:`~secure_release.mechanism.accounting.channel_cell_variance`), and its interval is the
researcher's exact one on the group's observed count
(:func:`~secure_release.mechanism.estimators.cell_intervals`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism import accounting, estimators
from secure_release.mechanism.errors import ShapeMismatchError, UnknownCategoryError
from secure_release.mechanism.estimators import DEFAULT_ESTIMATOR
from secure_release.mechanism.report import FIELD_OF_COLUMN, OUTPUT_COLUMNS

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Marginal:
    """A marginal table: one row per category combination of ``attributes`` (first-appearance
    order of the cells, which is the schema's category order). The fields carry the report's own
    names (``estimate`` is the raw sum); :meth:`columns` gives the output vocabulary."""

    attributes: tuple[str, ...]
    labels: npt.NDArray[np.str_]  # (rows, len(attributes))
    estimate: FloatArray
    projected: FloatArray
    standard_error: FloatArray
    ci_low: FloatArray
    ci_high: FloatArray
    mle: FloatArray
    observed: npt.NDArray[np.int64]

    @property
    def headline(self) -> FloatArray:
        """The summed headline estimate (``estimators.DEFAULT_ESTIMATOR``, the projection)."""
        out: FloatArray = getattr(self, DEFAULT_ESTIMATOR)
        return out

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        """The rows' arrays under the output names, in :data:`~report.OUTPUT_COLUMNS` order
        (the fields share :class:`~report.ReleaseReport`'s names, so :data:`~report.FIELD_OF_COLUMN`
        maps them): estimate (the headline), raw, mle, se (of raw), ci_low, ci_high, observed."""
        return {name: getattr(self, FIELD_OF_COLUMN[name]) for name in OUTPUT_COLUMNS}


def group_cells(
    labels: npt.NDArray[np.str_], columns: Sequence[int]
) -> tuple[npt.NDArray[np.str_], npt.NDArray[np.int64]]:
    """The distinct label combinations of ``columns`` (in first-appearance order) and, for each
    cell, the index of its group."""
    sub = labels[:, list(columns)]
    _, first, inverse = np.unique(sub, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return sub[first[order]], rank[np.asarray(inverse).reshape(-1)].astype(np.int64)


def attribute_columns(all_attributes: Sequence[str], wanted: Sequence[str]) -> list[int]:
    """Positions of ``wanted`` among ``all_attributes``; a named error for unknown or repeated ones."""
    unknown = [a for a in wanted if a not in all_attributes]
    if unknown or not wanted:
        raise UnknownCategoryError(
            f"unknown attribute(s) {unknown or '(none given)'}; the estimate has {list(all_attributes)}"
        )
    if len(set(wanted)) != len(wanted):
        raise ShapeMismatchError(f"attributes must be distinct, got {list(wanted)}")
    return [list(all_attributes).index(a) for a in wanted]


def marginal(
    attributes: Sequence[str],
    labels: Sequence[Sequence[str]],
    estimate: npt.ArrayLike,
    projected: npt.ArrayLike,
    wanted: Sequence[str],
    n: int,
    m: int,
    keep: float,
    observed: npt.ArrayLike,
    mle: npt.ArrayLike | None = None,
) -> Marginal:
    """The marginal of a released estimate over ``wanted`` attributes, with SEs and exact 95%
    intervals (``observed``: the per-cell observed counts of the release; ``mle``: the per-cell
    MLE, summed like the others; the sum of the joint MLE is the marginal's MLE; NaN when not
    given)."""
    raw = np.asarray(estimate, dtype=np.float64)
    proj = np.asarray(projected, dtype=np.float64)
    arr = np.asarray(labels, dtype=str).reshape(raw.size, len(attributes))
    groups, index = group_cells(arr, attribute_columns(attributes, wanted))
    size = groups.shape[0]
    g = np.bincount(index, minlength=size).astype(np.float64)
    est = np.bincount(index, weights=raw, minlength=size).astype(np.float64)
    summed = np.bincount(index, weights=proj, minlength=size).astype(np.float64)
    off_diagonal = float(g[0]) * (1.0 - keep) / raw.size  # every group holds g[0] cells
    se = np.sqrt(accounting.channel_cell_variance(n, m, keep, off_diagonal, est))
    counts = np.bincount(index, weights=np.asarray(observed, dtype=np.float64), minlength=size)
    whole = np.rint(counts).astype(np.int64)
    iv = estimators.cell_intervals(whole, n, m, keep, off_diagonal)
    mle_sum = np.full(size, np.nan)
    if mle is not None:
        mle_sum = np.bincount(index, weights=np.asarray(mle, dtype=np.float64), minlength=size).astype(np.float64)
    return Marginal(tuple(wanted), groups, est, summed, se, iv.low, iv.high, mle_sum, whole)


def conditional(
    attributes: Sequence[str],
    labels: Sequence[Sequence[str]],
    shares: npt.ArrayLike,
    target: Sequence[str],
    given: Sequence[str],
) -> tuple[npt.NDArray[np.str_], FloatArray]:
    """P(target | given) from non-negative ``shares`` (the headline or the MLE estimate):
    rows are the (given..., target...) combinations; NaN where P(given) is 0."""
    if set(target) & set(given):
        raise ShapeMismatchError(f"target {list(target)} and given {list(given)} must not overlap")
    p = np.clip(np.asarray(shares, dtype=np.float64), 0.0, None)
    arr = np.asarray(labels, dtype=str).reshape(p.size, len(attributes))
    joint_labels, joint_index = group_cells(arr, attribute_columns(attributes, [*given, *target]))
    joint = np.bincount(joint_index, weights=p, minlength=joint_labels.shape[0])
    given_labels, given_index = group_cells(joint_labels, list(range(len(given))))
    denominator = np.bincount(given_index, weights=joint, minlength=given_labels.shape[0])[given_index]
    with np.errstate(invalid="ignore", divide="ignore"):
        prob = np.where(denominator > 0, joint / np.where(denominator > 0, denominator, 1.0), np.nan)
    return joint_labels, prob


def conditional_intervals(
    attributes: Sequence[str],
    labels: Sequence[Sequence[str]],
    observed: npt.ArrayLike,
    target: Sequence[str],
    given: Sequence[str],
    n: int,
    m: int,
    keep: float,
    level: float = 0.95,
) -> tuple[FloatArray, FloatArray]:
    """Intervals for P(target | given), rows as :func:`conditional`: the ratio of the exact
    intervals of the joint share P(given, target) and of P(given), each at level
    1 - (1 - ``level``)/2, so both hold together with probability >= ``level`` (Bonferroni), and
    then low = joint_low / given_high, high = joint_high / given_low (1 where given_low is 0),
    within [0, 1]: conservative, never narrower than the truth warrants."""
    counts = np.asarray(observed, dtype=np.float64)
    arr = np.asarray(labels, dtype=str).reshape(counts.size, len(attributes))
    joint_labels, joint_index = group_cells(arr, attribute_columns(attributes, [*given, *target]))
    joint_counts = np.bincount(joint_index, weights=counts, minlength=joint_labels.shape[0])
    given_labels, given_index = group_cells(joint_labels, list(range(len(given))))
    given_counts = np.bincount(given_index, weights=joint_counts, minlength=given_labels.shape[0])
    each = 1.0 - (1.0 - level) / 2.0
    cells = counts.size

    def bounds(k: npt.NDArray[Any], groups: int) -> tuple[FloatArray, FloatArray]:
        off_diagonal = (cells / groups) * (1.0 - keep) / cells
        iv = estimators.cell_intervals(np.rint(k).astype(np.int64), n, m, keep, off_diagonal, level=each)
        return np.clip(iv.low, 0.0, 1.0), np.clip(iv.high, 0.0, 1.0)

    j_lo, j_hi = bounds(joint_counts, joint_labels.shape[0])
    g_lo, g_hi = bounds(given_counts, given_labels.shape[0])
    g_lo, g_hi = g_lo[given_index], g_hi[given_index]
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(g_hi > 0, j_lo / np.where(g_hi > 0, g_hi, 1.0), 0.0)
        high = np.where(g_lo > 0, j_hi / np.where(g_lo > 0, g_lo, 1.0), 1.0)
    return np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)
