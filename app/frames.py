"""Tables in and out of the API: pandas / polars DataFrames, Arrow tables or plain mappings.

Input: :func:`to_arrow` turns any supported table into an Arrow table with its cells untouched;
the curator's reader (:func:`secure_release.curator.columnar.check_rows`) then applies the one
cell rule (:mod:`secure_release.mechanism.cells`) exactly as it does to a file, so the notebook
and the CLI give the same codes and refuse the same rows with the same message. Output:
:func:`to_frame` builds a pandas (default) or polars DataFrame from numpy columns. pandas and
polars are optional (``pip install 'secure-release[notebook]'``); nothing in the core needs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from secure_release.mechanism.cells import cell_text
from secure_release.mechanism.errors import SecureReleaseError

Backend = Literal["pandas", "polars"]


class TableInputError(SecureReleaseError):
    """A table given to the API is of an unsupported kind, lacks a column or has missing values."""


class MissingDependencyError(SecureReleaseError):
    """An optional library (pandas, polars, matplotlib) is needed for this call."""


@dataclass(frozen=True)
class DatabaseQuery:
    """A table of the notebook API that is the result of ``query`` on a PostgreSQL database
    (``url``: ``postgresql://[USER@]HOST[:PORT]/DB``, no password: libpq finds it in ~/.pgpass,
    PGPASSFILE, PGPASSWORD or a service file, or ``password_file``'s first line). It is read,
    when used, in one read-only, repeatable-read transaction, as the curator reads ``--data URL
    --query SQL`` (:mod:`secure_release.curator.postgres`)."""

    url: str
    query: str
    password_file: str | Path | None = None

    def read(self) -> pa.Table:
        """The query's result as one Arrow table (its cells untouched)."""
        from secure_release.curator.partitions import require_data
        from secure_release.curator.postgres import set_password_file
        from secure_release.curator.postgres_read import query_table

        require_data(self.url, "url", self.query)
        set_password_file(self.password_file)
        return query_table(self.url, self.query)


def database_query(url: str, query: str, password_file: str | Path | None = None) -> DatabaseQuery:
    """A PostgreSQL query as a table for :func:`secure_release.api.curator_tables` and schema
    drafts (see :class:`DatabaseQuery`); the URL is checked at once (a password in it refused)."""
    from secure_release.curator.postgres import check_url

    check_url(url)
    return DatabaseQuery(url, query, password_file)


def _kind(table: Any) -> str:
    if isinstance(table, DatabaseQuery):
        return "database"
    module = type(table).__module__.split(".")[0]
    if module in ("pandas", "polars", "pyarrow", "duckdb"):
        return module
    if isinstance(table, Mapping):
        return "mapping"
    raise TableInputError(
        f"unsupported table type {type(table).__name__}; give a pandas or polars DataFrame, "
        "a pyarrow Table, a DuckDB relation, a database_query(URL, SQL) or a mapping of column name -> sequence"
    )


def column_names(table: Any) -> list[str]:
    """The column names of a supported table."""
    kind = _kind(table)
    if kind == "database":
        return list(to_arrow(table).column_names)
    if kind in ("pyarrow", "duckdb"):
        return [str(c) for c in (table.column_names if kind == "pyarrow" else table.columns)]
    return [str(c) for c in (table.keys() if kind == "mapping" else table.columns)]


def to_arrow(table: Any, what: str = "table") -> pa.Table:
    """Any supported table as an Arrow table, its cells untouched (the one cell rule of
    :mod:`secure_release.mechanism.cells` then reads it as it reads a file): a pandas DataFrame
    through ``pa.Table.from_pandas`` (NaN, None, NaT and NA become nulls; a category column a
    dictionary), a polars DataFrame through ``to_arrow``, a DuckDB relation through its Arrow
    result, a mapping column by column. A column of mixed Python objects (``3`` beside ``"x"``)
    is read as the text pandas gives each value; a :class:`DatabaseQuery` through its result.
    Raises :class:`TableInputError` for a table of another kind or with repeated column names."""
    if isinstance(table, DatabaseQuery):
        return table.read()
    kind = _kind(table)
    names = column_names(table)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise TableInputError(f"{what}: column name(s) {repeated} appear more than once; give each column its own")
    if kind == "pyarrow":
        return table if isinstance(table, pa.Table) else pa.Table.from_batches([table])
    if kind == "duckdb":
        fetch = getattr(table, "to_arrow_table", None) or table.arrow  # duckdb 2 / 1.x
        result = fetch()
        return result if isinstance(result, pa.Table) else result.read_all()
    if kind == "polars":
        arrow: pa.Table = table.to_arrow()
        return arrow
    if kind == "pandas":
        pairs = zip(names, table.columns, strict=True)
        return pa.table({name: _pandas_column(table[column]) for name, column in pairs})
    return pa.table({name: _sequence_column(table[key]) for name, key in zip(names, table.keys(), strict=True)})


def _pandas_column(series: Any) -> pa.Array | pa.ChunkedArray:
    """One pandas column as Arrow: nulls for NaN/None/NaT/NA, mixed objects as pandas' text."""
    try:
        return pa.Array.from_pandas(series)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        nulls = np.asarray(series.isna().to_numpy(), dtype=bool)
        text = series.astype(object).where(~nulls, "").astype(str).to_numpy(dtype=object)
        return pa.array(text, pa.string(), mask=nulls)


def _sequence_column(values: Any) -> pa.Array | pa.ChunkedArray:
    """One mapping column (a list, a numpy array, a pandas or polars Series) as Arrow."""
    module = type(values).__module__.split(".")[0]
    if module == "pandas":
        return _pandas_column(values)
    if module == "polars":
        return values.to_arrow()
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values
    try:
        return pa.array(values, from_pandas=True)  # from_pandas: a float NaN is a null
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        items = list(values)
        nulls = np.asarray([v is None or (isinstance(v, float) and v != v) for v in items], dtype=bool)
        return pa.array(["" if null else str(v) for v, null in zip(items, nulls.tolist(), strict=True)],
                        pa.string(), mask=nulls)


def text_columns(table: Any, names: Sequence[str], what: str = "table") -> dict[str, pa.Array]:
    """The columns ``names`` as the one cell rule's text (:func:`cells.cell_text`: trimmed, a
    missing cell ""), as Arrow string arrays; :class:`TableInputError` if a column is absent."""
    arrow = to_arrow(table, what)
    absent = [n for n in names if n not in arrow.column_names]
    if absent:
        raise TableInputError(f"{what}: missing column(s) {absent}; it has {arrow.column_names}")
    return {name: cell_text(arrow.column(name))[0] for name in names}


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
