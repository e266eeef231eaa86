"""Draft a curator's schema from a table (``api.draft_schema``, ``secure-release schema draft``).

A draft is a starting point, never a schema to release with: categories read from the private data
must be replaced by a public codebook's (:data:`CODEBOOK_WARNING`), and a numeric column is binned
over a public range given by the caller (:func:`equal_width_edges`), never over the data's own
minimum and maximum. Empty cells draft as a public ``missing`` entry, never as a category.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.frames import TableInputError, column_names, text_columns
from secure_release.mechanism.cells import number_key

CODEBOOK_WARNING = (
    "DRAFT SCHEMA: the category lists were read from the private data. Replace them with the "
    "categories of a public codebook before any release: a category that appears only in the "
    "private data (a rare value, a typo, a new code) is itself disclosive, and the schema is shared "
    "with every party."
)



#: A numeric column with more distinct values than this needs public bins (``ranges``).
DRAFT_MAX_NUMERIC_CATEGORIES = 12
#: The missing label a draft gives a column with empty cells.
DRAFT_MISSING_LABEL = "missing"


class DraftNeedsRangeError(TableInputError):
    """A numeric column has too many distinct values to list as categories, and no public range
    was given to bin it (``--range COLUMN=LOW:HIGH``)."""


def _is_number(values: npt.NDArray[np.str_]) -> bool:
    try:
        numbers = values.astype(np.float64)
    except ValueError:
        return False
    return bool(values.size) and bool(np.all(np.isfinite(numbers)))


def _natural_order(values: Sequence[str]) -> list[str]:
    """Numbers numerically (when every value is one), else text order."""
    arr = np.asarray(list(values), dtype=str)
    if _is_number(arr):
        return [str(v) for v in arr[np.argsort(arr.astype(np.float64), kind="stable")]]
    return sorted(values)


#: Bins a ``ranges`` entry without its own count gets (``draft_schema(bins=...)``, ``--bins``).
DRAFT_DEFAULT_BINS = 4
#: Readable edges: every inner edge within this fraction of a bin's width of its exact value.
EDGE_ROUNDING_TOLERANCE = Fraction(1, 100)


def equal_width_edges(low: float, high: float, bins: int) -> list[float]:
    """``bins`` equal-width bins over the public range [low, high], written readably.

    The exact edges are e_i = low + i (high - low) / bins (in exact rational arithmetic from the
    shortest decimal text of ``low`` and ``high``). ``low`` and ``high`` are kept as given; the
    inner edges are rounded to d decimals, with d the fewest (0, 1, 2, ...) that keeps every inner
    edge within 1% of a bin's width of its exact value (so every bin's width is within 2% of
    equal and the edges stay strictly increasing), or d + 1 when that writes every edge exactly.
    17:42 at 5 bins gives 17, 22, 27, 32, 37, 42; at 4, 23.25, 29.5, 35.75 (exact at two
    decimals, one more than the 23.2 that is within 1%); 0:1 at 3 gives 0, 0.33, 0.67, 1 (0.3
    would be 10% of a width off). If no d up to 17 does, the nearest floats of the exact edges."""
    if not (np.isfinite(low) and np.isfinite(high) and high > low):
        raise TableInputError(f"a range needs finite LOW < HIGH, got {low}:{high}")
    if isinstance(bins, bool) or not isinstance(bins, int | np.integer) or bins < 1:
        raise TableInputError(f"a range needs a whole number of bins >= 1, got {bins!r}")
    bins = int(bins)
    lo, hi = Fraction(repr(float(low))), Fraction(repr(float(high)))
    width = (hi - lo) / bins
    exact = [lo + width * i for i in range(1, bins)]

    def rounded(decimals: int) -> list[Fraction]:
        return [Fraction(round(e * 10**decimals), 10**decimals) for e in exact]

    for decimals in range(18):
        if all(abs(r - e) <= EDGE_ROUNDING_TOLERANCE * width for r, e in zip(rounded(decimals), exact, strict=True)):
            if rounded(decimals + 1) == exact:
                decimals += 1
            edges = [float(low), *(float(r) for r in rounded(decimals)), float(high)]
            if bool(np.all(np.diff(edges) > 0)):
                return edges
    return [float(low), *(float(e) for e in exact), float(high)]


def _range_edges(name: str, spec: Sequence[Any], bins: int) -> list[float]:
    """The edges of column ``name``'s range: ``(low, high)`` at the default ``bins``, or ``(low,
    high, count)`` at its own count (:func:`equal_width_edges`, whose refusal names the column)."""
    if len(spec) not in (2, 3):
        raise TableInputError(f"the range of {name!r} is (LOW, HIGH) or (LOW, HIGH, BINS), got {tuple(spec)!r}")
    try:
        return equal_width_edges(float(spec[0]), float(spec[1]), spec[2] if len(spec) == 3 else bins)
    except (TableInputError, TypeError, ValueError) as exc:
        raise TableInputError(f"the range of {name!r}: {exc}") from None


def draft_schema(
    table: Any, curator: str, id_column: str = "id", attributes: Sequence[str] | None = None, warn: bool = True,
    ranges: Mapping[str, tuple[float, float] | tuple[float, float, int]] | None = None,
    bins: int = DRAFT_DEFAULT_BINS, codebook: Mapping[str, Sequence[str]] | None = None,
    missing_tokens: Sequence[str] = (),
) -> dict[str, Any]:
    """A DRAFT schema dict from a table. A column in ``ranges`` is binned at equal-width bins of
    that public range (never the data's own minimum or maximum), edges from
    :func:`equal_width_edges`: ``(low, high, count)`` gives its own count of bins, ``(low, high)``
    takes ``bins``; a numeric column with
    more than :data:`DRAFT_MAX_NUMERIC_CATEGORIES` distinct values and no range raises
    :class:`DraftNeedsRangeError` naming it. Categories follow ``codebook`` (public, in its order)
    when it lists the column, else a natural order (numbers numerically); empty cells give a
    ``missing`` entry (with a warning), never a category, and so do ``missing_tokens`` (listed as
    the entry's ``missing_tokens`` where they occur). Warns that categories read from the data must
    be replaced by a public codebook's (:data:`CODEBOOK_WARNING`)."""
    names = list(attributes) if attributes is not None else [c for c in column_names(table) if c != id_column]
    if not names:
        raise TableInputError(f"no attribute columns besides the id column {id_column!r}")
    ranges, codebook = dict(ranges or {}), dict(codebook or {})
    unknown = sorted((set(ranges) | set(codebook)) - set(names))
    if unknown:
        raise TableInputError(f"--range/--codebook name column(s) {unknown} that are not attributes: {names}")
    cols = _draft_columns(table, names, f"curator {curator}")
    entries: list[dict[str, Any]] = []
    for name in names:
        values = cols[name]
        tokens = sorted(set(np.unique(values).tolist()) & set(missing_tokens))
        empty = (values == "") | np.isin(values, tokens)
        present = values[~empty]
        entry: dict[str, Any] = {"name": name}
        if name in ranges:
            edges = _range_edges(name, ranges[name], bins)
            entry["bins"] = [int(e) if e.is_integer() else e for e in edges]
        elif name in codebook:
            entry["categories"] = [str(c) for c in codebook[name]]
        else:
            distinct = np.unique(present).tolist()
            if _is_number(present):  # "3.0" (a CSV pandas wrote) drafts as 3, as its DataFrame does (cell rule 7)
                distinct = sorted({number_key(v) or v for v in distinct})
            if _is_number(present) and len(distinct) > DRAFT_MAX_NUMERIC_CATEGORIES:
                raise DraftNeedsRangeError(
                    f"column {name!r} is numeric with {len(distinct)} distinct values: give its public range "
                    f"(--range {name}=LOW:HIGH [--bins N]); bins are never drawn from the data's own minimum "
                    "or maximum, which would disclose them"
                )
            entry["categories"] = _natural_order(distinct)
        if bool(empty.any()):
            label = DRAFT_MISSING_LABEL
            while label in entry.get("categories", []):
                label = f"({label})"
            entry["missing"] = label
            if tokens:
                entry["missing_tokens"] = tokens
            warnings.warn(f"column {name!r} has {int(empty.sum())} empty cell(s): drafted as \"missing\": "
                          f"{label!r} (a public category of its own), never as an empty category", UserWarning,
                          stacklevel=2)  # fmt: skip
        entries.append(entry)
    if warn:
        warnings.warn(CODEBOOK_WARNING, UserWarning, stacklevel=2)
    return {"curator": curator, "id_column": id_column, "attributes": entries}


def _draft_columns(table: Any, names: Sequence[str], what: str) -> dict[str, npt.NDArray[np.str_]]:
    """The columns as the one cell rule reads them (trimmed text, a missing cell ""), as numpy
    text whose width numpy takes from the values themselves."""
    return {name: np.asarray(text.to_numpy(zero_copy_only=False), dtype=object).astype(str)
            for name, text in text_columns(table, names, what).items()}

