"""A curator's table, read against its schema JSON: :func:`read_table` takes one file (CSV,
Parquet, Arrow IPC, or a DuckDB database with a query), a PostgreSQL database with a query, or
a directory or glob of Parquet or CSV files (hive ``key=value`` directories become string
columns), and refuses every bad row with its file and line (:class:`BadRowsError`).

The engine is :mod:`curator.columnar` (the reader, the checks and the encoding, vectorized in
Arrow and numpy); :mod:`curator.partitions` lists and reads a directory's files. This module is
the entry point every caller uses (the curator, ``budget set``, ``schema check``, the notebook
API) and names what they need.
"""

from __future__ import annotations

from pathlib import Path

from secure_release.curator.columnar import (
    MAX_ID_BYTES,
    BadRowsError,
    DataSourceError,
    EncodedTable,
    SchemaFileError,
    TableSpec,
    load_schema,
    raise_repeats,
    read_file,
)
from secure_release.curator.partitions import is_partitioned, read_partitioned
from secure_release.curator.postgres import is_database_url

__all__ = [
    "MAX_ID_BYTES",
    "BadRowsError",
    "DataSourceError",
    "EncodedTable",
    "SchemaFileError",
    "TableSpec",
    "load_schema",
    "raise_repeats",
    "read_table",
]


def read_table(
    data_path: str | Path, spec: TableSpec, query: str | None = None, check_repeats: bool = True
) -> EncodedTable:
    """The curator's table; raises :class:`BadRowsError` listing every bad line.
    ``data_path``: a file (:func:`curator.columnar.read_file`), or a directory or glob of Parquet
    or CSV files (:func:`curator.partitions.read_partitioned`: the files in sorted order, an id
    repeated across them refused naming both). ``query``: SQL run on ``data_path`` as a DuckDB
    database (a file only). ``check_repeats=False``: repeated ids are looked for only if some row
    is bad anyway (so the report stays complete); a caller that hashes the ids finds repeats as
    equal tags in its own sort of them and then calls :func:`raise_repeats` (the curator: no
    second hash and sort). A ``postgresql://`` URL: ``query``'s rows on that database
    (:func:`curator.postgres_read.read_query`: streamed, one read-only snapshot)."""
    if is_database_url(data_path):
        from secure_release.curator.postgres_read import read_query

        return read_query(str(data_path), spec, query, check_repeats)
    if is_partitioned(data_path):
        if query is not None:
            raise DataSourceError(f"{data_path}: a query reads one DuckDB database file, not a directory or glob")
        return read_partitioned(data_path, spec, check_repeats)
    return read_file(data_path, spec, query, check_repeats)
