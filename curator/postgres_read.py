"""A curator's table read from a PostgreSQL query (:mod:`curator.postgres` connects), streamed:
the result arrives as Arrow record batches, which are gathered into runs of about
:data:`RUN_ROWS` rows, each checked and encoded by :func:`curator.columnar.check_rows` (the one
cell rule, the same code path as a file's) while the next run streams in; only the ids and the
codes of the rows read so far are kept, never the result's raw columns.

A bad row is named by its row in the result: ``line`` = the row's index + 2 (the header, the
result's column names, being line 1), as for a Parquet file or a DuckDB query.

The data set's fingerprint for the ledger (:class:`RowDigest`) is computed from the rows as
read: every cell hashed to two 64-bit words (text by AES-CMAC under a fixed public key, a
number's 64-bit pattern through the SplitMix64 finaliser), a row's words multiplied by an odd
factor of their column and added up, each row's two sums through SplitMix64 (so a value moved to
another row is a change), then summed over the rows modulo 2^64: the sum does not depend on the
order the rows come in (a query without ``ORDER BY``, or a cluster's slices), and changes if any
cell of any row changes, a row is added or one removed. The columns' names and types and the row
count are hashed with the two lanes (SHA-256) into the fingerprint. It detects changes, as a
file's SHA-256 does for a file; it is not a commitment against someone crafting a collision.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from secure_release.curator.columnar import (
    CheckedRows,
    DataSourceError,
    EncodedTable,
    RowSource,
    TableSpec,
    _flag_repeats,
    _may_repeat,
    _Problems,
    check_rows,
    encode_checked,
)
from secure_release.curator.postgres import (
    DatabaseUrl,
    check_url,
    current_snapshot,
    held_snapshot,
    query_error,
    record_batches,
    registered_query,
    snapshot,
)
from secure_release.mechanism.alignment.keyed_hash import id_tags
from secure_release.mechanism.primitives.keys import AlignmentKey

#: Rows per run of the checks (the raw columns of one run, and of the next one streaming in,
#: are all that is held of the result beyond its ids and codes).
RUN_ROWS = 1 << 17
# Fingerprint only (not secret): a fixed public key, so the same rows give the same fingerprint.
_FINGERPRINT_KEY = AlignmentKey(b"secure-release: row fingerprint".ljust(32, b"."))
_DOMAIN = b"secure-release postgresql rows fingerprint v1\0"
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_NULL = np.uint64(0x6A09E667F3BCC909)  # a missing cell's value (SHA-256's first initial word)
_U64 = npt.NDArray[np.uint64]
_DIGESTS: dict[tuple[str, str], RowDigest] = {}  # (URL, query) -> the digest at this process's snapshot


def splitmix64(values: _U64) -> _U64:
    """SplitMix64's finaliser of every word (Steele, Lea, Flood 2014): a bijection of 64-bit
    words in which every input bit changes about half the output bits (wrapping arithmetic)."""
    z = values + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    result: _U64 = z ^ (z >> np.uint64(31))
    return result


def _text_words(column: pa.Array, distinct: bool = False) -> tuple[_U64, _U64]:
    """(high, low) 64-bit words of each text cell's AES-CMAC tag (a dictionary column: of each
    dictionary entry, gathered; ``distinct`` False: a plain column whose first 1,024 cells hold
    at most 512 values is dictionary-encoded first, as an attribute's few values hash faster once
    each; the words are the same either way)."""
    if not distinct and not pa.types.is_dictionary(column.type):
        sample = column.slice(0, 1024)
        if pc.count_distinct(sample).as_py() * 2 <= len(sample):  # few values (an attribute): each once
            column = pc.dictionary_encode(column)
    if pa.types.is_dictionary(column.type):
        hi, lo = _text_words(column.dictionary, distinct=True)
        indices = pc.fill_null(column.indices, 0).to_numpy(zero_copy_only=False)
        return hi[indices], lo[indices]
    filled = pc.fill_null(column, "") if column.null_count else column
    tags = id_tags(filled, _FINGERPRINT_KEY).view(">u8").reshape(-1, 2).astype(np.uint64)
    return np.ascontiguousarray(tags[:, 0]), np.ascontiguousarray(tags[:, 1])


def _number_words(column: pa.Array) -> _U64:
    """Each numeric, boolean or temporal cell's 64-bit pattern."""
    kind = column.type
    if pa.types.is_floating(kind):
        values = pc.fill_null(pc.cast(column, pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        return np.ascontiguousarray(values).view(np.uint64)
    if pa.types.is_boolean(kind):
        column = pc.cast(column, pa.int8())
    elif pa.types.is_temporal(kind):
        column = column.view(pa.int64() if kind.bit_width == 64 else pa.int32())
    values = pc.fill_null(pc.cast(column, pa.int64()), 0).to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values).view(np.uint64)


def _is_text(kind: pa.DataType) -> bool:
    return any(test(kind) for test in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                       pa.types.is_large_binary))


def _cell_words(name: str, column: pa.Array, distinct: bool = False) -> tuple[_U64, _U64]:
    """(high, low) words of every cell of one column (``distinct``: a text column of mostly
    distinct values, the ids: hashed cell by cell); a missing cell gives :data:`_NULL` twice.
    :class:`DataSourceError` for a type the curator cannot read (a list, a struct, ...)."""
    kind = column.type
    if _is_text(kind) or (pa.types.is_dictionary(kind) and _is_text(kind.value_type)):
        hi, lo = _text_words(column, distinct)
    elif (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
          or pa.types.is_temporal(kind)):
        hi = splitmix64(_number_words(column))
        lo = hi * np.uint64(0x5851F42D4C957F2D)
    else:
        try:
            hi, lo = _text_words(pc.cast(column, pa.string()))  # decimals, uuids as text
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise DataSourceError(
                f"column {name!r} of the query is of type {kind}, which the curator does not read: select it as "
                "text (CAST(... AS text)) or as a number"
            ) from exc
    if column.null_count:
        missing = np.asarray(column.is_null().to_numpy(zero_copy_only=False))
        hi, lo = np.where(missing, _NULL, hi), np.where(missing, _NULL, lo)
    return hi, lo


def _column_factor(place: int, lane: int) -> np.uint64:
    """An odd 64-bit factor for column ``place`` and lane ``lane`` (a bijection of the words)."""
    word = splitmix64(np.array([2 * place + lane], dtype=np.uint64))[0]
    return np.uint64(int(word) | 1)


class RowDigest:
    """The order-independent fingerprint of a query's rows (see the module docstring): add runs
    of rows in any order, or merge the digests of disjoint slices, then :meth:`hexdigest`."""

    def __init__(self, columns: tuple[tuple[str, str], ...], distinct: frozenset[str] = frozenset()) -> None:
        self.columns, self.distinct = columns, distinct  # distinct: the id column, hashed cell by cell
        self.rows = 0
        self.lanes = np.zeros(2, dtype=np.uint64)

    def add(self, table: pa.Table) -> None:
        """Add every row of ``table`` (the result's columns, in its order)."""
        if table.num_rows == 0:
            return
        row_hi = np.zeros(table.num_rows, dtype=np.uint64)
        row_lo = np.zeros(table.num_rows, dtype=np.uint64)
        for place, name in enumerate(table.column_names):
            hi, lo = _cell_words(name, table.column(name).combine_chunks(), name in self.distinct)
            hi *= _column_factor(place, 0)  # the words are pseudo-random: an odd factor a column keeps
            lo *= _column_factor(place, 1)  # every change a change, and tells the columns apart
            row_hi += hi
            row_lo += lo
        sums = (splitmix64(row_hi).sum(dtype=np.uint64), splitmix64(row_lo ^ _NULL).sum(dtype=np.uint64))
        self.lanes += np.array(sums, dtype=np.uint64)
        self.rows += table.num_rows

    def merge(self, other: RowDigest) -> None:
        """Add the rows ``other`` saw (a disjoint slice of the same query)."""
        if other.columns != self.columns:
            raise DataSourceError(f"slices of one query returned other columns: {other.columns} vs {self.columns}")
        self.lanes += other.lanes
        self.rows += other.rows

    def hexdigest(self) -> str:
        """SHA-256 (hex) of the columns, the row count and the lanes."""
        digest = hashlib.sha256(_DOMAIN)
        for name, kind in self.columns:
            digest.update(f"{len(name)}:{name}:{kind}\0".encode("utf-8", "surrogateescape"))
        digest.update(self.rows.to_bytes(8, "big") + self.lanes.astype(">u8").tobytes())
        return digest.hexdigest()


def _readable(kind: pa.DataType) -> bool:
    """Whether the cell rule reads cells of this type (text, numbers, booleans, dates, decimals)."""
    if pa.types.is_dictionary(kind):
        return _readable(kind.value_type)
    return _is_text(kind) or any(test(kind) for test in (
        pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_temporal, pa.types.is_decimal))


def columns_of(schema: pa.Schema) -> tuple[tuple[str, str], ...]:
    """The result's (name, type) pairs, as the fingerprint names them (metadata dropped);
    :class:`DataSourceError` naming a column of a type the curator does not read (a list, a
    struct, a composite), before any row is read."""
    for field in schema:
        if not _readable(field.type):
            raise DataSourceError(
                f"column {field.name!r} of the query is of type {field.type}, which the curator does not read: "
                "select it as text (CAST(... AS text)) or as a number"
            )
    return tuple((f.name, str(f.type)) for f in schema)


def _runs(reader: Any, url: DatabaseUrl, rows: int = RUN_ROWS) -> Iterator[pa.Table]:
    """The reader's batches as tables of at least ``rows`` rows (the last one fewer), read by a
    thread of their own one run ahead (the server's stream overlaps the checks)."""
    ahead: queue.Queue[pa.Table | BaseException | None] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def pump() -> None:
        try:
            held: list[pa.RecordBatch] = []
            count = 0
            for batch in reader:
                held.append(batch)
                count += batch.num_rows
                if count >= rows:
                    ahead.put(pa.Table.from_batches(held, reader.schema))
                    held, count = [], 0
                    if stop.is_set():
                        return
            ahead.put(pa.Table.from_batches(held, reader.schema) if held else None)
            if held:
                ahead.put(None)
        except BaseException as exc:  # handed to the reading thread, which raises it
            ahead.put(exc)

    thread = threading.Thread(target=pump, name="postgres-rows", daemon=True)
    thread.start()
    try:
        while True:
            item = ahead.get()
            if item is None:
                return
            if isinstance(item, DataSourceError):
                raise item
            if isinstance(item, BaseException):
                raise query_error(url, item) from item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # drain so the pump can end
            with contextlib.suppress(queue.Empty):
                ahead.get(timeout=0.1)
        thread.join()


def _joined(parts: list[CheckedRows], source: RowSource, width: int) -> CheckedRows:
    """One :class:`CheckedRows` of consecutive runs (their problems renumbered from the first)."""
    if len(parts) == 1:
        return parts[0]
    id_problems, problems = _Problems(), _Problems()
    at = 0
    for part in parts:
        for mine, theirs in ((id_problems, part.id_problems), (problems, part.problems)):
            for row, reasons in theirs.reasons.items():  # error path: only bad rows are renumbered
                mine.reasons[row + at] = reasons
                mine.cells[row + at] = theirs.cells.get(row, [])
        at += len(part.ids)
    kinds = {p.ids.type for p in parts}
    kind = pa.large_string() if pa.large_string() in kinds else pa.string()
    ids = pa.concat_arrays([p.ids if p.ids.type == kind else p.ids.cast(kind) for p in parts])
    digits = {name: np.concatenate([p.digits[name] for p in parts]) for name in parts[0].digits}
    return CheckedRows(source, width, ids, digits, id_problems, problems)


def checked_query_rows(
    cursor: Any, url: DatabaseUrl, query: str, spec: TableSpec, first_row: int = 0
) -> tuple[CheckedRows, RowDigest]:
    """Every row of ``query`` (run on ``cursor``, inside its transaction) checked against
    ``spec`` (repeats not looked for) and its fingerprint digest. ``first_row``: the result row
    index of this slice's first row (lines in reports)."""
    reader = record_batches(cursor, url, query)
    header = list(reader.schema.names)
    digest = RowDigest(columns_of(reader.schema), frozenset({spec.id_column}))
    source = RowSource(Path(url.name), False, first_row)
    parts: list[CheckedRows] = []
    with ThreadPoolExecutor(1, thread_name_prefix="postgres-digest") as hashing:  # beside the checks
        for run in _runs(reader, url):
            adding = hashing.submit(digest.add, run)
            parts.append(check_rows(header, run, spec, RowSource(source.path, False, first_row), None))
            first_row += run.num_rows
            adding.result()
            del run
    if not parts:
        empty = pa.table({name: pa.array([], field.type) for name, field in zip(header, reader.schema, strict=True)})
        parts.append(check_rows(header, empty, spec, source, None))
    return _joined(parts, source, len(header)), digest


def read_query(
    data: str, spec: TableSpec, query: str | None, check_repeats: bool = True
) -> EncodedTable:
    """The curator's table from ``query`` on the PostgreSQL database ``data`` (a URL), in one
    read-only, repeatable-read transaction; :class:`BadRowsError` listing every bad row. The
    table's ``fingerprint`` attribute is the rows' :class:`RowDigest`. ``check_repeats=False``:
    as for :func:`curator.table.read_table`."""
    url = check_url(data)
    if not query:
        raise DataSourceError(f"{url.name}: a PostgreSQL database needs a query (--query \"SELECT ... FROM ...\")")
    with snapshot(url, current_snapshot(url)) as cursor:
        checked, digest = checked_query_rows(cursor, url, query, spec)
    if (check_repeats or checked.bad) and _may_repeat(checked.ids):
        _flag_repeats(checked.ids, checked.id_problems)
    table = encode_checked(checked, spec)
    object.__setattr__(table, "fingerprint", digest.hexdigest())
    return table


def query_digest(data: str, query: str | None) -> RowDigest:
    """The :class:`RowDigest` of ``query``'s rows on the database ``data``, read at this
    process's held snapshot (:func:`curator.postgres.held_snapshot`: the table and a cluster's
    slices read the same rows), once per process (no checks: a budget's or a stored table's key,
    a cluster's row count)."""
    url = check_url(data)
    if not query:
        raise DataSourceError(f"{url.name}: a PostgreSQL database needs a query (--query \"SELECT ... FROM ...\")")
    known = _DIGESTS.get((url.url, query))
    if known is not None:
        return known
    with snapshot(url, held_snapshot(url)) as cursor:
        reader = record_batches(cursor, url, query)
        digest = RowDigest(columns_of(reader.schema))
        for run in _runs(reader, url):
            digest.add(run)
    _DIGESTS[(url.url, query)] = digest
    return digest


def query_fingerprint(data: str, query: str | None) -> str:
    """The fingerprint of ``query``'s rows on the database ``data`` (:func:`query_digest`)."""
    return query_digest(data, query).hexdigest()


def _quoted(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def slice_query(query: str, id_column: str, index: int, count: int) -> str:
    """The rows of ``query`` whose id hashes (PostgreSQL's ``hashtext`` of its text) to slice
    ``index`` of ``count``: the slices are disjoint and together every row."""
    inner = query.strip().rstrip(";")
    if count == 1:
        return inner
    return (f"SELECT * FROM (\n{inner}\n) AS secure_release_rows WHERE "
            f"(hashtext(secure_release_rows.{_quoted(id_column)}::text) & 2147483647) % {count} = {index}")


def query_partitions(data: str, target_rows: int) -> list[tuple[str, str, tuple[int, int], str, int]]:
    """A cluster's slices of this process's query on ``data`` (:func:`curator.postgres.register_query`):
    (URL, query, (slice, slices), snapshot id, expected rows) of about ``target_rows`` rows
    each, all at the held snapshot (exported: each worker's transaction joins it)."""
    url = check_url(data)
    query = registered_query(url.url)
    if not query:
        raise DataSourceError(f"{url.name}: a PostgreSQL database needs a query (--query \"SELECT ... FROM ...\")")
    rows = query_digest(url.url, query).rows
    count = max(1, -(-rows // max(1, target_rows)))
    held = held_snapshot(url)
    return [(url.url, query, (index, count), held, rows // count + (index < rows % count)) for index in range(count)]


def read_slice(
    data: str, query: str, part: tuple[int, int], snapshot_id: str | None, spec: TableSpec,
    password_path: str | None = None,
) -> CheckedRows:
    """One cluster slice's rows checked against ``spec`` (run on a worker, in its own
    transaction at ``snapshot_id``; the password from ``password_path`` if given, else
    libpq's places); a bad row's line is its row in the slice + 2."""
    url = check_url(data)
    with snapshot(url, snapshot_id, None if password_path is None else Path(password_path)) as cursor:
        checked, _ = checked_query_rows(cursor, url, slice_query(query, spec.id_column, *part), spec)
    return checked


def query_table(data: str, query: str | None) -> pa.Table:
    """``query``'s whole result as one Arrow table, read in one read-only, repeatable-read
    transaction (``schema draft``: it needs every column's values; draft from a sample of the
    rows, ``TABLESAMPLE`` or ``LIMIT``, if the table is large)."""
    url = check_url(data)
    if not query:
        raise DataSourceError(f"{url.name}: a PostgreSQL database needs a query (--query \"SELECT ... FROM ...\")")
    with snapshot(url, current_snapshot(url)) as cursor:
        reader = record_batches(cursor, url, query)
        try:
            table: pa.Table = reader.read_all()
        except Exception as exc:
            raise query_error(url, exc) from None
    return table
