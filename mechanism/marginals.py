"""Marginals and conditional tables of a released estimate, with standard errors (pure numpy).

A released estimate covers C cells (the joint alphabet, or a curator subset's marginal when
some curators refused their keys). Its channel on those cells is "keep the record's cell with
probability a, else a uniform cell", so each cell gets off-diagonal mass b = (1 - a)/C
(DESIGN 3.5; for the joint, b = 1/q). Summing the raw estimate over a group G of g cells gives
an unbiased estimate of the group's share T_G, and a record lands in G with probability a + g b
if it belongs to G, g b otherwise, so by DESIGN 3's per-cell formula with b -> g b:

    Var(T_hat_G) = T_G (1 - T_G)(n - m)/(m (n - 1)) + [T_G (a + gb)(1 - a - gb) + (1 - T_G) gb (1 - gb)] / (m a^2)

For g = 1 this is exactly the per-cell variance the researcher reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import ShapeMismatchError, UnknownCategoryError

FloatArray = npt.NDArray[np.float64]
#: Two-sided 95% normal quantile, as the researcher's cell intervals use.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Marginal:
    """A marginal table: one row per category combination of ``attributes`` (first-appearance
    order of the cells, which is the schema's category order)."""

    attributes: tuple[str, ...]
    labels: npt.NDArray[np.str_]  # (rows, len(attributes))
    estimate: FloatArray
    projected: FloatArray
    standard_error: FloatArray
    ci_low: FloatArray
    ci_high: FloatArray


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


def group_variance(n: int, m: int, keep: float, off_diagonal: FloatArray, shares: FloatArray) -> FloatArray:
    """The module docstring's variance for groups with per-group off-diagonal ``g b``."""
    t = np.clip(shares, 0.0, 1.0)
    a, gb = keep, off_diagonal
    sampling = t * (1.0 - t) * ((n - m) / (m * (n - 1)) if n > 1 else 0.0)
    pram = (t * (a + gb) * (1.0 - a - gb) + (1.0 - t) * gb * (1.0 - gb)) / (m * a * a)
    return np.asarray(sampling + pram, dtype=np.float64)


def marginal(
    attributes: Sequence[str],
    labels: Sequence[Sequence[str]],
    estimate: npt.ArrayLike,
    projected: npt.ArrayLike,
    wanted: Sequence[str],
    n: int,
    m: int,
    keep: float,
) -> Marginal:
    """The marginal of a released estimate over ``wanted`` attributes, with SEs and 95% CIs."""
    raw = np.asarray(estimate, dtype=np.float64)
    proj = np.asarray(projected, dtype=np.float64)
    arr = np.asarray(labels, dtype=str).reshape(raw.size, len(attributes))
    groups, index = group_cells(arr, attribute_columns(attributes, wanted))
    size = groups.shape[0]
    g = np.bincount(index, minlength=size).astype(np.float64)
    est = np.bincount(index, weights=raw, minlength=size).astype(np.float64)
    summed = np.bincount(index, weights=proj, minlength=size).astype(np.float64)
    se = np.sqrt(group_variance(n, m, keep, g * (1.0 - keep) / raw.size, est))
    return Marginal(tuple(wanted), groups, est, summed, se, est - Z95 * se, est + Z95 * se)


def conditional(
    attributes: Sequence[str],
    labels: Sequence[Sequence[str]],
    shares: npt.ArrayLike,
    target: Sequence[str],
    given: Sequence[str],
) -> tuple[npt.NDArray[np.str_], FloatArray]:
    """P(target | given) from non-negative ``shares`` (use the projected or MLE estimate):
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
