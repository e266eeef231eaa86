"""A curator's table as many files: ``--data`` may name a directory or a glob of Parquet files
(hive-partitioned directories included: ``data/region=north/part-0.parquet`` gives every row of
that file the string column ``region`` = ``north``, usable as the id or an attribute) or of CSV
files, as well as one file.

* :func:`discover` lists the units of reading (:class:`Partition`): every ``*.parquet``, ``*.pq``
  or ``*.csv`` file under a directory (recursively; hidden and ``_``-prefixed names such as
  ``_SUCCESS`` skipped) or matching a glob, in sorted path order, a Parquet file cut into runs
  of consecutive row groups of about ``target_rows`` rows each. Parquet and CSV are never mixed.
* :func:`read_partition` reads one with exactly the checks and encoding of
  :func:`curator.table.read_table` (one code path: :func:`curator.columnar.check_rows`); a bad row
  is reported with its file and line (CSV: the exact line; Parquet: the row's index in its file
  + 2, the header being line 1).
* :func:`read_partitioned` reads them all into one table, in :func:`discover` order; an id
  repeated across files is refused naming both files, and the problems of every file are
  reported together (one :class:`curator.columnar.BadRowsError`).
* :func:`dataset_fingerprint` is the ledger's fingerprint of the data: a single file's is its
  SHA-256 (:func:`curator.records.ledgerfile.file_fingerprint`, as before), a directory's or glob's
  covers each file's path relative to the directory (or the glob's fixed prefix) and its own
  SHA-256: renaming or changing any file changes it, moving the whole directory does not.
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from secure_release.curator.columnar import (
    BadRowsError,
    CheckedRows,
    DataSourceError,
    EncodedTable,
    RowSource,
    TableSpec,
    check_rows,
    combine_checked,
    encode_checked,
    read_columns,
    source_of,
)
from secure_release.curator.postgres import (
    check_url,
    is_database_url,
    password_file,
    query_dataset_name,
    registered_query,
)
from secure_release.curator.records.ledgerfile import file_fingerprint
from secure_release.infra.fileio import require_file
from secure_release.mechanism.errors import SecureReleaseError

#: Suffixes of the files a directory or glob contributes (lower case).
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv",)
_GLOB_CHARACTERS = "*?["
_LOOKED_FOR = "*.parquet, *.pq or *.csv files (hidden and _-prefixed names skipped)"
# Domain of a directory's fingerprint: never the SHA-256 of a single file's bytes.
_FINGERPRINT_DOMAIN = b"secure-release data set fingerprint v1\0"


class NoInputFilesError(SecureReleaseError):
    """A data directory or glob holds no table file (or a data path names nothing)."""


class MixedInputFormatsError(SecureReleaseError):
    """A data directory or glob holds both Parquet and CSV files (one data set is one format)."""


class UnreadableInputError(DataSourceError):
    """A file of the data set cannot be opened or read as its format."""


@dataclass(frozen=True)
class Partition:
    """One unit of reading, small and picklable (shipped to workers): ``path`` (its file),
    ``row_groups`` (a Parquet file's run of row groups; None: the whole file), ``first_row``
    (the index in its file of its first row, for error lines), ``num_rows`` (from Parquet
    metadata; None for CSV) and ``hive`` (the key=value pairs of its directory names, each a
    string column of its rows)."""

    path: str
    row_groups: tuple[int, ...] | None = None
    first_row: int = 0
    num_rows: int | None = None
    hive: tuple[tuple[str, str], ...] = ()
    #: A PostgreSQL query's slice (``path`` its URL): the query, (slice, slices) and the snapshot
    #: every slice reads at (:func:`curator.postgres_read.query_partitions`).
    query: str | None = None
    slice: tuple[int, int] | None = None
    snapshot: str | None = None
    password_file: str | None = None  # --data-password-file (its path: the worker reads it to connect)


def is_partitioned(data: str | Path) -> bool:
    """True if ``data`` names a directory, or is a glob pattern (holds ``*``, ``?`` or ``[``)
    that is not itself an existing path ("" names nothing, not the working directory)."""
    if not str(data):
        return False
    path = Path(data)
    if path.is_dir():
        return True
    return not path.exists() and any(c in str(data) for c in _GLOB_CHARACTERS)


def _glob_base(pattern: str) -> Path:
    """The directory part of a glob before its first wildcard (the base of relative names)."""
    fixed: list[str] = []
    for part in Path(pattern).parts:
        if any(c in part for c in _GLOB_CHARACTERS):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path()


def _wanted(relative: Path) -> bool:
    """True if a file at this path (relative to the data's base) is a table file: a known
    suffix and no hidden or ``_``-prefixed part (``_SUCCESS``, ``.crc``, ``_temporary/``)."""
    if any(part.startswith((".", "_")) for part in relative.parts):
        return False
    return relative.suffix.lower() in PARQUET_SUFFIXES + CSV_SUFFIXES


def input_files(data: str | Path) -> tuple[Path, list[Path]]:
    """The data's base directory and its table files in sorted order (by path relative to the
    base, part by part): one file as given, every table file under a directory, or a glob's
    table-file matches. :class:`NoInputFilesError` if there is none,
    :class:`MixedInputFormatsError` if Parquet and CSV files are mixed."""
    path = Path(data)
    if path.is_file():
        return path.parent, [path]
    if path.is_dir():
        base = path
        found = [p for p in path.rglob("*") if p.is_file() and _wanted(p.relative_to(path))]
        where = f"{data}: no table files in the directory (looked for {_LOOKED_FOR}, recursively)"
    elif is_partitioned(data):
        base = _glob_base(str(data))
        matches = (Path(m) for m in glob.glob(str(data), recursive=True))
        found = [p for p in matches if p.is_file() and _wanted(p.relative_to(base))]
        where = f"{data}: the pattern matches no table file (looked for {_LOOKED_FOR})"
    else:
        raise NoInputFilesError(f"{data}: no such file, directory or glob match")
    if not found:
        raise NoInputFilesError(where)
    found.sort(key=lambda p: p.relative_to(base).parts)
    kinds = {p.suffix.lower() in PARQUET_SUFFIXES for p in found}
    if len(kinds) > 1:
        parquet = next(p for p in found if p.suffix.lower() in PARQUET_SUFFIXES)
        text = next(p for p in found if p.suffix.lower() in CSV_SUFFIXES)
        raise MixedInputFormatsError(
            f"{data}: holds both Parquet ({parquet}) and CSV ({text}) files; a data set is read in one format: "
            "convert or move the others"
        )
    return base, found


def require_data(data: str | Path, flag: str, query: str | None = None) -> Path:
    """``data`` if it names a readable file, or a directory or glob holding table files of one
    format; else a named error (:class:`~secure_release.infra.fileio.MissingInputFileError`,
    :class:`NoInputFilesError`, :class:`MixedInputFormatsError`) naming ``flag``: a typo never
    reads as empty data. A PostgreSQL URL: checked (no password in it) and ``query`` required."""
    if is_database_url(data):
        url = check_url(data)
        if not query:
            raise DataSourceError(f"{flag} {url.name}: a PostgreSQL database needs --query \"SELECT ... FROM ...\"")
        return Path(data)
    if not is_partitioned(data):
        return require_file(data, flag)
    try:
        input_files(data)
    except (NoInputFilesError, MixedInputFormatsError) as exc:
        raise type(exc)(f"{flag} {exc}") from None
    return Path(data)


def dataset_name(data: str | Path, query: str | None = None) -> str:
    """The default data set (budget) name of ``--data``: a file's or directory's name; a glob's
    is the name of its directory before the first wildcard (every selection from one directory
    spends one budget unless ``--dataset`` names it apart); a PostgreSQL database's is its name
    and the digest of its server, database and ``query`` (:func:`curator.postgres.query_dataset_name`)."""
    if is_database_url(data):
        return query_dataset_name(data, query or registered_query(data))
    if is_partitioned(data) and not Path(data).is_dir():
        base = _glob_base(str(data))
        return base.name or base.resolve().name
    return Path(data).name


def _hive_pairs(relative: Path) -> tuple[tuple[str, str], ...]:
    """The ``key=value`` pairs of a file's directory names (values URL-decoded, as Hive writes
    them), outermost first."""
    pairs = (part.partition("=") for part in relative.parts[:-1])
    return tuple((key, unquote(value)) for key, equals, value in pairs if equals and key)


def _parquet_partitions(path: Path, hive: tuple[tuple[str, str], ...], target_rows: int) -> list[Partition]:
    """A Parquet file's runs of consecutive row groups of about ``target_rows`` rows each (one
    run: the whole file); :class:`UnreadableInputError` if its metadata cannot be read."""
    try:
        metadata = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as exc:
        raise UnreadableInputError(f"{path}: cannot be read as Parquet ({type(exc).__name__}: {exc})") from exc
    group_rows = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    runs: list[tuple[int, ...]] = []
    run: list[int] = []
    rows = 0
    for group, count in enumerate(group_rows):  # per row group (metadata), never per row
        run.append(group)
        rows += count
        if rows >= target_rows:
            runs.append(tuple(run))
            run, rows = [], 0
    if run:
        runs.append(tuple(run))
    if len(runs) <= 1:
        return [Partition(str(path), None, 0, metadata.num_rows, hive)]
    partitions, first = [], 0
    for groups in runs:
        count = sum(group_rows[g] for g in groups)
        partitions.append(Partition(str(path), groups, first, count, hive))
        first += count
    return partitions


def discover(data: str | Path, target_rows: int = 1 << 20) -> list[Partition]:
    """The partitions of ``data`` (a file, a directory or a glob; see :func:`input_files`), in a
    deterministic order: files in sorted path order, a Parquet file's row-group runs (about
    ``target_rows`` rows each) in file order; any other file is one partition."""
    if is_database_url(data):
        from secure_release.curator.postgres_read import query_partitions

        secret = password_file()
        return [Partition(url, num_rows=rows, query=query, slice=part, snapshot=snapshot,
                          password_file=None if secret is None else str(secret.resolve()))
                for url, query, part, snapshot, rows in query_partitions(str(data), target_rows)]
    base, files = input_files(data)
    single = Path(data).is_file()
    partitions: list[Partition] = []
    for path in files:
        hive = () if single else _hive_pairs(path.relative_to(base))
        if path.suffix.lower() in PARQUET_SUFFIXES:
            partitions += _parquet_partitions(path, hive, target_rows)
        elif not os.access(path, os.R_OK):
            raise UnreadableInputError(f"{path}: cannot be read (permission denied)")
        else:
            partitions.append(Partition(str(path), hive=hive))
    return partitions


def _with_hive_columns(
    partition: Partition, header: list[str], table: pa.Table, spec: TableSpec
) -> tuple[list[str], pa.Table]:
    """The header and columns with the partition's hive keys added: each needed key as a
    string column holding its value on every row (a one-entry dictionary: no per-row text).
    :class:`BadRowsError` if a key is also a column of the file (which one to read is unclear)."""
    if not partition.hive:
        return header, table
    clash = [key for key, _ in partition.hive if key in header]
    if clash:
        raise BadRowsError(partition.path, [(1, f"column(s) {clash} are both in the file and directory names "
                                                f"({', '.join(f'{k}={v}' for k, v in partition.hive)})")])
    needed = {spec.id_column, *(a.name for a in spec.schema.attributes)}
    zeros = pa.array(np.zeros(table.num_rows, dtype=np.int32))
    for key, value in partition.hive:
        if key in needed:
            table = table.append_column(key, pa.DictionaryArray.from_arrays(zeros, pa.array([value], pa.string())))
    return header + [key for key, _ in partition.hive], table


def _checked_partition(partition: Partition, spec: TableSpec, check_repeats: bool | None) -> CheckedRows:
    """One partition's rows checked against ``spec`` (see :func:`curator.columnar.check_rows`)."""
    if partition.query is not None and partition.slice is not None:
        from secure_release.curator.postgres_read import read_slice

        return read_slice(partition.path, partition.query, partition.slice, partition.snapshot, spec,
                          partition.password_file)
    path = Path(partition.path)
    try:
        header, table, wrong_width = read_columns(path, spec, row_groups=partition.row_groups)
    except (OSError, pa.ArrowException) as exc:
        raise UnreadableInputError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from exc
    width = len(header)  # a record's fields in the file itself: the hive keys are not among them
    header, table = _with_hive_columns(partition, header, table, spec)
    source = RowSource(path, source_of(path).is_csv, partition.first_row)
    return check_rows(header, table, spec, source, check_repeats, wrong_width, width)


def read_partition(partition: Partition, spec: TableSpec, check_repeats: bool = True) -> EncodedTable:
    """Exactly the rows of ``partition``, checked and encoded as :func:`curator.table.read_table`
    does (its hive keys as string columns); :class:`BadRowsError` naming the partition's file and
    every bad line in it (ids repeated within the partition included)."""
    return encode_checked(_checked_partition(partition, spec, check_repeats), spec)


def read_partitioned(data: str | Path, spec: TableSpec, check_repeats: bool = True) -> EncodedTable:
    """Every partition of ``data`` read and checked, end to end in :func:`discover` order, as one
    table. Any bad row, in any file, raises one :class:`BadRowsError` for ``data`` listing every
    file's bad lines, each naming its file; an id repeated across files names both files and
    lines. ``check_repeats=False``: as for :func:`curator.table.read_table`."""
    parts: list[CheckedRows | BadRowsError] = []
    for partition in discover(data):
        try:
            parts.append(_checked_partition(partition, spec, None))
        except BadRowsError as refused:  # a missing column or an empty file: reported with the rest
            parts.append(refused)
    return combine_checked(str(data), parts, spec, check_repeats)


def dataset_fingerprint(data: str | Path, query: str | None = None) -> str:
    """SHA-256 (hex) fingerprint of the data: a single file's is :func:`file_fingerprint` of it
    (unchanged: existing ledgers still match); a directory's or glob's is the SHA-256 of, for
    each table file in :func:`input_files` order, its path relative to the directory (or the
    glob's fixed prefix) and its own SHA-256 (each file streamed, never read whole); a
    PostgreSQL database's is that of ``query``'s rows as read
    (:class:`curator.postgres_read.RowDigest`: order-independent)."""
    if is_database_url(data):
        from secure_release.curator.postgres_read import query_fingerprint

        return query_fingerprint(str(data), query or registered_query(data))
    if Path(data).is_file():
        return file_fingerprint(data)
    base, files = input_files(data)
    digest = hashlib.sha256(_FINGERPRINT_DOMAIN)
    for path in files:
        name = path.relative_to(base).as_posix().encode("utf-8", "surrogateescape")
        try:
            own = file_fingerprint(path)
        except OSError as exc:
            raise UnreadableInputError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from exc
        digest.update(len(name).to_bytes(8, "big") + name + bytes.fromhex(own))
    return digest.hexdigest()
