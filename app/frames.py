"""Tables in and out of the API: pandas / polars DataFrames, Arrow tables or plain mappings.

Input: :func:`string_columns` turns any supported table into one numpy string column per name
(vectorized, no per-row loop; missing values are refused, never recoded). Output:
:func:`to_frame` builds a pandas (default) or polars DataFrame from numpy columns. pandas and
polars are optional (``pip install 'secure-release[notebook]'``); nothing in the core needs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import SecureReleaseError

Backend = Literal["pandas", "polars"]


class TableInputError(SecureReleaseError):
    """A table given to the API is of an unsupported kind, lacks a column or has missing values."""


class MissingDependencyError(SecureReleaseError):
    """An optional library (pandas, polars, matplotlib) is needed for this call."""


def _kind(table: Any) -> str:
    module = type(table).__module__.split(".")[0]
    if module in ("pandas", "polars", "pyarrow"):
        return module
    if isinstance(table, Mapping):
        return "mapping"
    raise TableInputError(
        f"unsupported table type {type(table).__name__}; give a pandas or polars DataFrame, "
        "a pyarrow Table or a mapping of column name -> sequence"
    )


def column_names(table: Any) -> list[str]:
    """The column names of a supported table."""
    kind = _kind(table)
    if kind == "pyarrow":
        return [str(c) for c in table.column_names]
    return [str(c) for c in (table.keys() if kind == "mapping" else table.columns)]


def _one_column(table: Any, kind: str, name: str) -> tuple[npt.NDArray[np.str_], int]:
    """(stripped string values, number of missing values) of one column."""
    if kind == "pandas":
        col = table[name]
        missing = int(col.isna().sum())
        values = col.astype(str).to_numpy(dtype=str)
    elif kind == "polars":
        col = table[name]
        missing = int(col.null_count())
        values = np.asarray(col.cast(str).to_list() if missing else col.cast(str).to_numpy(), dtype=str)
    elif kind == "pyarrow":
        col = table.column(name)
        missing = int(col.null_count)
        values = np.asarray(col.cast("string").to_numpy(zero_copy_only=False), dtype=str)
    else:
        raw = list(table[name])
        missing = sum(v is None for v in raw)
        values = np.asarray(raw, dtype=str)
    return np.strings.strip(values), missing


def _missing_mask(table: Any, kind: str, name: str) -> npt.NDArray[np.bool_]:
    """Which cells of one column are null (NaN, None)."""
    if kind == "pandas":
        return np.asarray(table[name].isna().to_numpy(), dtype=bool)
    if kind == "polars":
        return np.asarray(table[name].is_null().to_numpy(), dtype=bool)
    if kind == "pyarrow":
        return np.asarray(table.column(name).is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return np.asarray([v is None for v in table[name]], dtype=bool)


def string_columns_with_missing(
    table: Any, names: Sequence[str], what: str = "table"
) -> dict[str, npt.NDArray[np.str_]]:
    """As :func:`string_columns`, but a null cell becomes "" (a missing value) instead of an error."""
    return _string_columns(table, names, what, keep_missing=True)


def string_columns(table: Any, names: Sequence[str], what: str = "table") -> dict[str, npt.NDArray[np.str_]]:
    """One numpy string column per name; :class:`TableInputError` if a column is absent or has
    missing values (a missing value is not a category: recode it, e.g. as "unknown", first)."""
    return _string_columns(table, names, what, keep_missing=False)


def _string_columns(table: Any, names: Sequence[str], what: str, keep_missing: bool) -> dict[str, npt.NDArray[np.str_]]:
    """The columns ``names`` as numpy strings; a null cell is "" (``keep_missing``) or refused."""
    kind = _kind(table)
    present = column_names(table)
    absent = [n for n in names if n not in present]
    if absent:
        raise TableInputError(f"{what}: missing column(s) {absent}; it has {present}")
    out: dict[str, npt.NDArray[np.str_]] = {}
    for name in names:
        values, missing = _one_column(table, kind, name)
        if missing and keep_missing:
            values = np.where(_missing_mask(table, kind, name), "", values)
        elif missing:
            raise TableInputError(
                f"{what}: column {name!r} has {missing} missing value(s); recode them as a category "
                "of the public codebook (e.g. 'unknown') or drop those rows first"
            )
        out[name] = values
    return out


def to_frame(columns: Mapping[str, npt.ArrayLike], backend: Backend = "pandas") -> Any:
    """A pandas (default) or polars DataFrame of ``columns`` (column order kept)."""
    if backend == "pandas":
        pd = require("pandas")
        return pd.DataFrame({k: np.asarray(v) for k, v in columns.items()})
    if backend == "polars":
        pl = require("polars")
        return pl.DataFrame({k: np.asarray(v) for k, v in columns.items()})
    raise TableInputError(f"backend must be 'pandas' or 'polars', got {backend!r}")


def require(module: str) -> Any:
    """Import an optional library or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"this needs {module}: pip install 'secure-release[notebook]' (pandas, polars, matplotlib)"
        ) from exc
