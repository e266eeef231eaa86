"""The one cell rule: how any table cell becomes the text an attribute's categories are matched
against (DESIGN 10, docs/own-data.md "One cell rule").

Every source (CSV text; Arrow, Parquet and DuckDB types; pandas, polars and mappings, which
:mod:`secure_release.frames` turns into Arrow first) goes through :func:`cell_text`, and every
categorical attribute through :func:`equivalent_codes`, so the CLI and the notebook API give
the same codes and refuse the same rows. All of it is vectorised Arrow compute; the only Python
steps run once per *distinct* unmatched value (a column's few categories, or a refusal's values).

The rule:

1. **Missing**: a null (None, NaN, NaT, pandas NA), or text that is empty once trimmed.
2. **Text** loses leading and trailing white space; otherwise it is exact and case-sensitive.
3. **Integers** are their decimal text; **booleans** are ``true`` / ``false``.
4. **Floats**: an integral value is the text of that integer (3.0 -> ``3``, -0.0 -> ``0``); any
   other finite value its shortest text that reads back as the same float of its own width
   (float32 0.1 -> ``0.1``); infinities ``inf`` / ``-inf``.
5. **Decimals**: an integral value is the integer's text (Decimal("3.00") -> ``3``); any other
   the value without trailing zeros (``2.50`` -> ``2.5``).
6. **Dates** are ISO ``YYYY-MM-DD``; a **timestamp** is its date at midnight, else
   ``YYYY-MM-DD HH:MM:SS`` with non-zero fractional seconds only.
7. **Matching a category** (:func:`equivalent_codes`): a cell matches the category equal to its
   text; failing that, a cell that is a decimal number matches the one category that is a
   decimal number of the same value ("3.0", "03" and "3e0" match ``3``; 3 matches ``03``), a
   date or date-time the one category that is the same moment (``2020-01-02 00:00:00`` matches
   ``2020-01-02``), and ``true``/``false`` in any case the one category that is the same word.
   A value that two categories share (a codebook with both ``1`` and ``01``) matches exactly only.

Ids follow rules 1-6 but never rule 7: ``007`` and ``7`` are two different people.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

#: A decimal number as text: sign, digits with an optional point, an optional exponent.
NUMBER_PATTERN = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_NUMBER = re.compile(NUMBER_PATTERN)
_BOOLEAN_WORDS = ("true", "false")
#: An ISO date, optionally followed by a time of day ("2020-01-02", "2020-01-02T10:30:00.5").
MOMENT_PATTERN = r"^([0-9]{4}-[0-9]{2}-[0-9]{2})(?:[ T]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(\.[0-9]*)?)?)?$"
_MOMENT = re.compile(MOMENT_PATTERN)
_INT64_LIMIT = float(2**63)


def plain(column: Any) -> Any:
    """Dictionary and view arrays (or chunked arrays) as plain value arrays of their value type."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if getattr(pa.types, "is_string_view", _never)(column.type):  # pyarrow >= 16
        column = column.cast(pa.large_string())
    elif getattr(pa.types, "is_binary_view", _never)(column.type):
        column = column.cast(pa.large_binary())
    return column


def _never(kind: pa.DataType) -> bool:
    return False


def cell_text(column: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, npt.NDArray[np.bool_]]:
    """Rules 1-6: every cell of ``column`` as trimmed UTF-8 text, a missing cell as ``""``, and
    which rows held bytes that are not UTF-8 (their text is ``""`` too)."""
    values = plain(column)
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    bad = np.zeros(len(arr), dtype=bool)
    kind = arr.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        try:
            arr = pc.cast(arr, pa.large_string() if pa.types.is_large_binary(kind) else pa.string())
        except pa.ArrowInvalid:
            bad = invalid_utf8(arr)
            arr = pc.cast(pc.if_else(pa.array(bad), pa.scalar(b"", arr.type), arr), pa.string())
    elif pa.types.is_floating(kind):
        arr = float_text(arr)
    elif pa.types.is_decimal(kind):
        arr = decimal_text(arr)
    elif pa.types.is_timestamp(kind):
        arr = timestamp_text(arr)
    elif pa.types.is_null(kind):
        arr = pa.array([""] * 0, pa.string()) if len(arr) == 0 else pa.nulls(len(arr), pa.string())
    elif not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        arr = pc.cast(arr, pa.string())  # integers, booleans (true/false), dates (ISO)
    if arr.null_count:
        arr = pc.fill_null(arr, "")  # rule 1: a null is missing
    return (pc.utf8_trim_whitespace(arr) if may_need_trim(arr) else arr), bad


def float_text(arr: pa.Array) -> pa.Array:
    """Rule 4: floats as text (NaN as null)."""
    if pa.types.is_float16(arr.type):
        arr = pc.cast(arr, pa.float32())  # exact
    values = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.float64)  # a null is NaN here
    finite = np.isfinite(values)
    integral = finite & (np.floor(values) == values)
    small = integral & (np.abs(values) < _INT64_LIMIT)
    shortest = pc.cast(arr, pa.string())  # Arrow writes each width's shortest round-trip text
    as_int = pc.cast(pa.array(np.where(small, values, 0.0).astype(np.int64)), pa.string())
    text = pc.if_else(pa.array(small), as_int, shortest)
    huge = np.flatnonzero(integral & ~small)
    if huge.size:  # |x| >= 2^63: exact integer text of each (a handful of extreme values at most)
        exact = [str(int(v)) for v in values[huge].tolist()]
        text = _put(text, huge, exact)
    return pc.if_else(pa.array(np.isnan(values)), pa.scalar(None, pa.string()), text)


def decimal_text(arr: pa.Array) -> pa.Array:
    """Rule 5: decimals as text without trailing zeros (an integral value as the integer)."""
    text = pc.cast(arr, pa.string())
    if getattr(arr.type, "scale", 0) <= 0:
        return text
    text = pc.replace_substring_regex(text, r"(\.[0-9]*?)0+$", r"\1")
    text = pc.replace_substring_regex(text, r"\.$", "")
    return pc.replace_substring_regex(text, r"^-0$", "0")


def timestamp_text(arr: pa.Array) -> pa.Array:
    """Rule 6: a timestamp as its ISO date at midnight, else date and time (fraction if any)."""
    text = pc.cast(arr, pa.string())
    text = pc.replace_substring_regex(text, r"(\.[0-9]*?)0+$", r"\1")
    text = pc.replace_substring_regex(text, r"\.$", "")
    return pc.replace_substring_regex(text, r" 00:00:00$", "")


def _put(text: pa.Array, rows: npt.NDArray[np.intp], values: Sequence[str]) -> pa.Array:
    """``text`` with the given rows replaced (error or rare paths only)."""
    items = text.to_pylist()
    for row, value in zip(rows.tolist(), values, strict=True):
        items[row] = value
    return pa.array(items, pa.string())


def may_need_trim(arr: pa.Array, piece: int = 1 << 20) -> bool:
    """False only if no value starts or ends with white space: every white-space character Arrow
    trims is an ASCII byte <= 0x20 or a multi-byte character, all of whose bytes are >= 0x80,
    so a value whose first and last bytes lie in [0x21, 0x7e] is unchanged by trimming.
    In ``piece``-row steps: the temporaries are small and reused, not n words each."""
    offsets, data = offsets_data(arr)
    for start in range(0, len(arr), piece):
        bounds = offsets[start : start + piece + 1]
        starts, ends = bounds[:-1], bounds[1:] - 1
        full = ends >= starts
        if not bool(full.all()):
            starts, ends = starts[full], ends[full]
        edges = np.concatenate([data[starts], data[ends]])
        if bool(np.any((edges < 0x21) | (edges > 0x7E))):
            return True
    return False


def offsets_data(arr: pa.Array) -> tuple[npt.NDArray[np.signedinteger[Any]], npt.NDArray[np.uint8]]:
    """Offsets (rows + 1, in the array's own int32/int64 width: no copy) and data bytes of a
    string/binary array without nulls."""
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    width: type[np.signedinteger[Any]] = np.int64 if large else np.int32
    offsets: npt.NDArray[np.signedinteger[Any]] = np.frombuffer(arr.buffers()[1], dtype=width)
    data_buffer = arr.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return offsets[arr.offset : arr.offset + len(arr) + 1], data


def invalid_utf8(arr: pa.Array, piece: int = 4096) -> npt.NDArray[np.bool_]:
    """Rows that are not valid UTF-8 (error path: bisects by pieces, decodes only failing ones)."""
    bad = np.zeros(len(arr), dtype=bool)
    for start in range(0, len(arr), piece):
        part = arr.slice(start, piece)
        try:
            pc.cast(part, pa.string())
        except pa.ArrowInvalid:
            for i, value in enumerate(part.to_pylist()):
                try:
                    (value or b"").decode("utf-8")
                except UnicodeDecodeError:
                    bad[start + i] = True
    return bad


def number_key(text: str) -> str | None:
    """The canonical text of a decimal number written as ``text`` ("3.0", "03", "3e0" -> "3";
    "2.50" -> "2.5"), or None if ``text`` is not a finite decimal number."""
    if not _NUMBER.match(text):
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    if value == 0:
        return "0"
    normal = value.normalize()
    return format(normal, "f")


def moment_key(text: str) -> str | None:
    """The canonical text (rule 6) of a date or date and time written as ``text``
    ("2020-01-02T00:00:00.000" -> "2020-01-02"; "2020-01-02 10:30:00.50" -> "2020-01-02 10:30:00.5"),
    or None if ``text`` is not one."""
    found = _MOMENT.match(text)
    if not found:
        return None
    day, hours, minutes, seconds, fraction = found.groups()
    fraction = (fraction or "").rstrip("0").rstrip(".")
    clock = f"{hours or '00'}:{minutes or '00'}:{seconds or '00'}{fraction}"
    return day if clock == "00:00:00" else f"{day} {clock}"


def equivalence_key(text: str) -> str | None:
    """Rule 7's key of a text: a number's canonical text, a date's or date-time's (rule 6),
    ``true``/``false`` for those words in any case, else None (the text matches exactly or not
    at all)."""
    key = number_key(text)
    if key is not None:
        return "#" + key
    moment = moment_key(text)
    if moment is not None:
        return "@" + moment
    lowered = text.lower()
    return "?" + lowered if lowered in _BOOLEAN_WORDS else None


def category_keys(categories: Sequence[str]) -> dict[str, int]:
    """Rule 7's key -> category code, for the keys exactly one category has."""
    seen: dict[str, list[int]] = {}
    for code, category in enumerate(categories):
        key = equivalence_key(category)
        if key is not None:
            seen.setdefault(key, []).append(code)
    return {key: codes[0] for key, codes in seen.items() if len(codes) == 1}


def equivalent_codes(texts: pa.Array, categories: Sequence[str]) -> npt.NDArray[np.int64]:
    """Rule 7 for cells that matched no category exactly: the code of the one category each
    cell's number or boolean equals, else -1. One Python step per distinct text."""
    keys = category_keys(categories)
    if not keys or len(texts) == 0:
        return np.full(len(texts), -1, dtype=np.int64)
    encoded = pc.dictionary_encode(texts)
    distinct = encoded.dictionary.to_pylist()
    table = np.asarray(
        [keys.get(key, -1) if (key := equivalence_key(str(v))) is not None else -1 for v in distinct] + [-1],
        dtype=np.int64,
    )
    indices = np.asarray(encoded.indices.fill_null(len(distinct)).to_numpy(zero_copy_only=False), dtype=np.intp)
    codes: npt.NDArray[np.int64] = table[indices]
    return codes


def hint(value: str, categories: Sequence[str]) -> str | None:
    """Why ``value`` may have been meant as a category: a case or white-space difference, a
    non-integer among integer codes, a date not in ISO form; None if nothing fits."""
    folded = " ".join(value.split()).casefold()
    for category in categories:
        if category.casefold() == folded:
            return f"differs from {category!r} only in case or white space"
    integer_codes = bool(categories) and all(number_key(c) is not None and "." not in (number_key(c) or "")
                                              for c in categories)
    key = number_key(value)
    if integer_codes and key is not None and "." in key:
        return "this column's categories are integer codes, and this value is not an integer"
    if integer_codes and key is not None:
        return "a number, but not one of this column's integer codes"
    if re.match(r"^\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}$", value):
        return "dates are written YYYY-MM-DD"
    return None
