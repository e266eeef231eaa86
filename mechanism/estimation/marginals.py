"""Marginals and conditional tables of a released estimate, with standard errors (pure numpy).

A released estimate covers C cells (the joint alphabet, or a curator subset's marginal when
some curators refused their keys). Its channel on those cells is "keep the record's cell with
probability a, else a uniform cell", so each cell gets off-diagonal mass b = (1 - a)/C
(DESIGN 3.5; for the joint, b = 1/q). The groups of a marginal over some attributes all hold
g = C / (number of groups) cells, and summed over them the channel is again "keep w.p. a, else
uniform" with off-diagonal g b (DESIGN 3.5). So a group's raw estimate is the sum of its cells',
its variance is DESIGN 3's per-cell formula with b -> g b
(:func:`~secure_release.mechanism.privacy.accounting.channel_cell_variance`), and its interval is the
researcher's exact one on the group's observed count
(:func:`~secure_release.mechanism.estimation.estimators.cell_intervals`).

Every table's headline is the projection of THAT table's own raw estimate onto its own simplex
(and its MLE the closed-form MLE of its own counts), not the marginal of the projected joint: the
projection is never further from the truth than the raw estimate it projects (a projection onto a
closed convex set holding the truth is non-expansive), but the marginal of the projected joint has
no such bound and was measured up to 1.5x the marginal's own raw error (K = 2592, epsilon 2,
m = 72). The price: a marginal's headline is no longer the sum of the joint's headline cells, so
tables need not sum exactly into one another (their raw columns still do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import ShapeMismatchError, UnknownCategoryError
from secure_release.mechanism.estimation import estimators
from secure_release.mechanism.estimation.estimators import DEFAULT_ESTIMATOR
from secure_release.mechanism.estimation.report import FIELD_OF_COLUMN, OUTPUT_COLUMNS
from secure_release.mechanism.estimation.unified import hold_estimate
from secure_release.mechanism.privacy import accounting

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Marginal:
    """A marginal table: one row per category combination of ``attributes`` (first-appearance
    order of the cells, which is the schema's category order). The fields carry the report's own
    names (``estimate`` is the raw sum, ``projected`` its projection onto the marginal's own
    simplex, ``mle`` the MLE of the marginal's own counts); :meth:`columns` gives the output
    vocabulary."""

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
        """The headline estimate (``estimators.DEFAULT_ESTIMATOR``: the projection of this table's
        own raw estimate onto its own simplex)."""
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
    wanted: Sequence[str],
    n: int,
    m: int,
    keep: float,
    observed: npt.ArrayLike,
) -> Marginal:
    """The marginal of a released estimate over ``wanted`` attributes (``estimate``: the joint's
    raw A^-1 cells; ``observed``: the per-cell observed counts of the release). Its raw estimate
    is the sum of the cells' (exactly the marginal's own A^-1 estimate, DESIGN 3.5); its headline
    ``projected`` is that raw estimate projected onto the marginal's own simplex; its ``mle`` is
    :func:`~secure_release.mechanism.estimation.estimators.mle_water_filling` of the marginal's own counts
    (keep a, off-diagonal (1 - a)/groups); SEs; exact 95% intervals
    (:func:`~secure_release.mechanism.estimation.estimators.cell_intervals`, the default unified ones),
    widened where needed to hold the headline
    (:func:`~secure_release.mechanism.estimation.unified.hold_estimate`)."""
    raw = np.asarray(estimate, dtype=np.float64)
    arr = np.asarray(labels, dtype=str).reshape(raw.size, len(attributes))
    groups, index = group_cells(arr, attribute_columns(attributes, wanted))
    size = groups.shape[0]
    g = np.bincount(index, minlength=size).astype(np.float64)
    est = np.bincount(index, weights=raw, minlength=size).astype(np.float64)
    headline = estimators.project_to_simplex(est)
    off_diagonal = float(g[0]) * (1.0 - keep) / raw.size  # every group holds g[0] cells
    se = np.sqrt(accounting.channel_cell_variance(n, m, keep, off_diagonal, est))
    counts = np.bincount(index, weights=np.asarray(observed, dtype=np.float64), minlength=size)
    whole = np.rint(counts).astype(np.int64)
    iv = estimators.cell_intervals(whole, n, m, keep, off_diagonal)
    low, high, _ = hold_estimate(iv.low, iv.high, headline)
    mle = estimators.mle_water_filling(whole, keep)
    return Marginal(tuple(wanted), groups, est, headline, se, low, high, mle, whole)


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
    return joint_labels, share_of_group(joint, given_index, given_labels.shape[0])


def share_of_group(shares: npt.ArrayLike, index: npt.NDArray[np.int64], groups: int) -> FloatArray:
    """Each row's share divided by its group's total (the rows of a (given, target) table
    grouped by given: P(target | given)); NaN where the group's total is 0."""
    values = np.asarray(shares, dtype=np.float64)
    denominator = np.bincount(index, weights=values, minlength=groups)[index]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(denominator > 0, values / np.where(denominator > 0, denominator, 1.0), np.nan),
                          dtype=np.float64)  # fmt: skip


def conditional_table(
    attributes: Sequence[str],
    labels: Sequence[Sequence[str]],
    estimate: npt.ArrayLike,
    observed: npt.ArrayLike,
    target: Sequence[str],
    given: Sequence[str],
    n: int,
    m: int,
    keep: float,
    level: float = 0.95,
) -> tuple[npt.NDArray[np.str_], FloatArray, FloatArray, FloatArray, FloatArray]:
    """P(target | given), rows as :func:`conditional`: (labels, headline, mle, ci_low, ci_high).

    The headline comes from the (given, target) two-way table's own headline: its raw estimate
    (the sum of the joint's raw cells, ``estimate``) projected onto its own simplex, divided by
    its row sums; the MLE likewise from :func:`~secure_release.mechanism.estimation.estimators.mle_water_filling`
    of the two-way table's own counts. The interval is :func:`conditional_intervals`'s, widened
    where needed to hold the headline (a superset keeps the coverage). NaN where the headline's
    P(given) is 0 (the interval is then [0, 1])."""
    raw = np.asarray(estimate, dtype=np.float64)
    two_way = marginal(attributes, labels, raw, [*given, *target], n, m, keep, observed)
    given_labels, given_index = group_cells(two_way.labels, list(range(len(given))))
    groups = given_labels.shape[0]
    prob = share_of_group(two_way.projected, given_index, groups)
    prob_mle = share_of_group(two_way.mle, given_index, groups)
    low, high = conditional_intervals(attributes, labels, observed, target, given, n, m, keep, level)
    low, high, _ = hold_estimate(low, high, np.where(np.isnan(prob), low, prob))
    return two_way.labels, prob, prob_mle, low, high


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
