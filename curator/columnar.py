"""Read a curator's table (CSV, Parquet, Arrow IPC or a DuckDB query) against its schema JSON,
columnar: the engine under :func:`curator.table.read_table` (one file: :func:`read_file`) and
:mod:`curator.partitions` (many files: :func:`check_rows` per file or run of row groups, then
:func:`combine_checked`), one checking path for both.

Schema file: ``{"curator": "alice", "id_column": "id",
"attributes": [{"name": "education", "categories": ["no college", ...]}, ...]}``.

Engine: pyarrow (a core dependency of the curator). The file is parsed by Arrow's C++ readers
(multi-threaded CSV, Parquet and IPC in record batches; a DuckDB database through its embedded
engine, ``duckdb`` being an optional extra). The happy path costs little beyond the read:

* ids are checked for UTF-8 in one cast, trimmed only if some id starts or ends with a byte
  that can begin or end whitespace (one vectorized look at the first and last bytes), checked
  for missing and over-long values from their offsets (in pieces of 1 M rows, so no check
  makes a temporary of n words), and checked for repeats by sorting 64-bit keys (the high
  words of AES-CMAC tags under a fixed public key, computed from the Arrow buffers); only if
  two keys are equal does the exact, slower ``dictionary_encode`` pass run, which names every
  repeated id with the line of its first occurrence (a key collision without a repeat finds
  nothing there, so the check stays exact). A curator that hashes the ids anyway reads with
  ``check_repeats=False`` and finds repeats as equal tags in its own sort of them
  (``curator.release.aligning.hashed_tags``), then :func:`raise_repeats` gives the same report;
* category codes are gathered straight into the narrowest type and the joint symbol is
  built in place in uint32 (no int64 copy of any column);
* an attribute value is looked up as raw bytes among the categories that trimming leaves
  unchanged (one hash look-up, or once per dictionary entry for dictionary-encoded columns);
  only the rows not found there go through the full path (UTF-8 check, trim, look-up against
  every category), and only they can be bad;
* the ids stay an Arrow string array: the alignment hashes them from its buffers, and a numpy
  text copy (4 bytes a character) is made only if someone asks for ``table.ids``.

Nothing is silently dropped or recoded: any bad row makes :class:`BadRowsError` list every bad
line (what was wrong and what is allowed), and no table is returned. Line numbers are exact for
CSV (a second, counting pass runs on the error path only) and are row index + 2 (the header is
line 1) for Parquet and Arrow files and DuckDB query results.

DuckDB: ``read_file("people.duckdb", spec, query="SELECT id, edu, mar FROM people")`` runs the
query read-only on the database file (``--data people.duckdb --query "..."`` for the curator);
the result's columns are matched by name like a file's header.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from secure_release.curator.badrows import BadCell
from secure_release.curator.badrows import BadRowsError as BadRowsError  # raised here, named here too
from secure_release.infra.memory import release_free_memory
from secure_release.mechanism.alignment.keyed_hash import IdArray, id_tags
from secure_release.mechanism.cells import MOMENT_PATTERN, cell_text, equivalent_codes, hint, offsets_data, plain
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.primitives.keys import AlignmentKey
from secure_release.mechanism.primitives.stream import worker_pool
from secure_release.mechanism.protocol.in_memory import CuratorTable
from secure_release.mechanism.schema import (
    Attribute,
    CuratorSchema,
    SymbolArray,
    attribute_from_dict,
    edge_text,
    mixed_radix_encode,
)

_DECLARE_MISSING = 'declare "missing": LABEL in the schema to count such cells under a public label'
#: The column name the bad-row summary gives id problems (whatever the schema's id column).
ID_CELLS = "(id)"
#: Longest id accepted, in UTF-8 bytes (longer ones are refused, never truncated).
MAX_ID_BYTES = 256
_PARQUET = (".parquet", ".pq")
_ARROW = (".arrow", ".feather", ".ipc", ".arrows")
_DUCKDB = (".duckdb", ".ddb")
_CSV_BLOCK = 1 << 22  # bytes per CSV block: several blocks per file keep both parser threads busy
_PIECE = 1 << 20  # rows per step of the id checks and look-ups (temporaries of 1 M items, reused)
# Repeat check only (not secret): a fixed public key, so equal ids give equal keys.
_REPEAT_KEY = AlignmentKey(b"secure-release: id repeat check".ljust(32, b"."))


class SchemaFileError(SecureReleaseError):
    """The schema JSON file is missing a field or malformed."""


class DataSourceError(SecureReleaseError):
    """The table's source cannot be read as asked (a DuckDB file without a query, a failing
    query, or the optional ``duckdb`` package missing)."""


@dataclass(frozen=True)
class TableSpec:
    schema: CuratorSchema
    id_column: str


def load_schema(path: str | Path) -> TableSpec:
    """The schema JSON as a :class:`TableSpec`; raises :class:`SchemaFileError`."""
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
        name = str(data["curator"])
        attrs = tuple(attribute_from_dict(a) for a in data["attributes"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SchemaFileError(
            f"{path}: cannot read schema ({type(exc).__name__}: {exc}); expected "
            '{"curator": NAME, "id_column": "id", '
            '"attributes": [{"name": ..., "categories": [...]} or {"name": ..., "bins": [EDGES], '
            '"clamp": false}, each optionally with "missing": LABEL and "missing_tokens": [...]]}'
        ) from exc
    return TableSpec(CuratorSchema(name, attrs), str(data.get("id_column", "id")))


class _Labels(Mapping[str, npt.NDArray[np.str_]]):
    """Label columns computed on access from the category codes (no string column is kept)."""

    def __init__(self, schema: CuratorSchema, digits: Mapping[str, npt.NDArray[np.unsignedinteger[Any]]]) -> None:
        self._schema, self._digits = schema, digits

    def __getitem__(self, name: str) -> npt.NDArray[np.str_]:
        attribute = next(a for a in self._schema.attributes if a.name == name)
        labels: npt.NDArray[np.str_] = np.asarray(attribute.categories, dtype=str)[self._digits[name]]
        return labels

    def __iter__(self) -> Iterator[str]:
        return iter(self._digits)

    def __len__(self) -> int:
        return len(self._digits)


class EncodedTable(CuratorTable):
    """A :class:`CuratorTable` whose symbols were computed at read time (columnar); the ids are
    kept as an Arrow string array (:attr:`id_array`) and ``ids`` is its numpy text copy, made on
    first use."""

    id_array: pa.Array
    encoded: SymbolArray

    def __init__(self, schema: CuratorSchema, id_array: pa.Array, columns: Mapping[str, npt.NDArray[np.str_]],
                 encoded: SymbolArray) -> None:
        for name, value in (("schema", schema), ("columns", columns), ("id_array", id_array), ("encoded", encoded)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_ids", None)

    @property
    def ids(self) -> npt.NDArray[np.str_]:
        cached: npt.NDArray[np.str_] | None = self.__dict__["_ids"]
        if cached is None:
            cached = _numpy_text(self.id_array)
            object.__setattr__(self, "_ids", cached)
        return cached

    @property
    def num_rows(self) -> int:
        rows: int | None = self.__dict__.get("_rows")
        return len(self.id_array) if rows is None else rows

    def without_ids(self) -> EncodedTable:
        """This table without its ids (same rows, codes and symbols): once the ids are hashed,
        a keyed-hash curator needs only the symbols, and the ids are the table's largest part."""
        slim = EncodedTable(self.schema, pa.array([], pa.string()), self.columns, self.encoded)
        object.__setattr__(slim, "_rows", self.num_rows)
        return slim

    def id_values(self) -> IdArray:
        return self.id_array

    def symbols(self) -> SymbolArray:
        return self.encoded


def read_columns(
    path: Path, spec: TableSpec, query: str | None = None, row_groups: Sequence[int] | None = None
) -> tuple[list[str], pa.Table, int]:
    """Header, the columns ``spec`` needs (those present) and how many CSV records had a wrong
    width, of one file (or a DuckDB query's result); ``row_groups``: only these row groups of a
    Parquet file (None: all)."""
    names = [a.name for a in spec.schema.attributes]
    numeric = {a.name: not (a.missing_tokens or a.dates) for a in spec.schema.attributes if a.bins is not None}
    return _open_batches(path, [spec.id_column, *names], names, query, numeric, row_groups)


def _open_batches(
    path: Path, needed: list[str], names: list[str], query: str | None, numeric: Mapping[str, bool] | None = None,
    row_groups: Sequence[int] | None = None,
) -> tuple[list[str], pa.Table, int]:
    """Header, the needed columns (bytes for CSV) and how many CSV records had a wrong width.
    ``names``: the attribute columns, read dictionary-encoded from Parquet. ``numeric``: the
    binned attributes, each True if a CSV reader may parse it as float64 straight away (no
    missing tokens to look for). ``row_groups``: only these row groups of a Parquet file."""
    suffix = path.suffix.lower()
    if query is not None or suffix in _DUCKDB:
        return _read_duckdb(path, needed, query)
    if suffix in _PARQUET:
        pfile = pq.ParquetFile(path)
        header = list(pfile.schema_arrow.names)
        kinds = {c: pfile.schema_arrow.field(c).type for c in names if c in header}
        text = [c for c, kind in kinds.items() if (pa.types.is_string(kind) or pa.types.is_binary(kind))
                and c not in (numeric or {})]
        if text:
            pfile = pq.ParquetFile(path, read_dictionary=text)
        present = [c for c in needed if c in header]
        if row_groups is not None:
            return header, pfile.read_row_groups(list(row_groups), columns=present, use_threads=True), 0
        return header, pfile.read(columns=present, use_threads=True), 0
    if suffix in _ARROW:
        with pa.memory_map(str(path)) as source:
            try:
                table = ipc.open_file(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = ipc.open_stream(source).read_all()
        header = list(table.column_names)
        return header, table.select([c for c in needed if c in header]), 0
    binned = dict(numeric or {})
    if any(binned.values()):
        try:
            return _read_csv(path, needed, names, binned)
        except pa.ArrowInvalid as exc:
            if "conversion error" not in str(exc).lower():
                raise
            binned = dict.fromkeys(binned, False)  # some cell is not a number: read it as text, find which
    return _read_csv(path, needed, names, binned)


def _read_duckdb(path: Path, needed: list[str], query: str | None) -> tuple[list[str], pa.Table, int]:
    """The result of ``query`` on the DuckDB database ``path`` (opened read-only)."""
    if not query:
        raise DataSourceError(f"{path}: a DuckDB database needs a query (--query \"SELECT ... FROM ...\")")
    try:
        import duckdb  # the optional extra: pip install 'secure-release[duckdb]'
    except ImportError as exc:
        raise DataSourceError(f"{path}: reading DuckDB needs the duckdb package (pip install duckdb)") from exc
    if not path.is_file():
        raise DataSourceError(f"{path}: no such DuckDB database file")
    try:
        with duckdb.connect(str(path), read_only=True) as con:
            relation: Any = con.sql(query)
            if relation is None:
                raise DataSourceError(f"{path}: the query returned no rows or columns (a SELECT is needed)")
            fetch = getattr(relation, "to_arrow_table", None) or relation.arrow  # duckdb 2 / 1.x
            table = fetch()
    except duckdb.Error as exc:
        raise DataSourceError(f"{path}: the query failed ({type(exc).__name__}: {exc})") from exc
    header = list(table.column_names)
    return header, table.select([c for c in needed if c in header]), 0


def _read_csv(
    path: Path, needed: list[str], names: list[str], binned: Mapping[str, bool] | None = None
) -> tuple[list[str], pa.Table, int]:
    """The needed columns as bytes; the attribute columns ``names`` dictionary-encoded while
    they are parsed (a few distinct values each: every lookup is then per dictionary entry).
    ``binned``: numeric attributes, parsed as float64 (True: an empty cell becomes null) or
    read as plain bytes (False: many distinct values, parsed after missing tokens are found)."""
    binned = binned or {}

    def kind(c: str) -> pa.DataType:
        if c in binned:
            return pa.float64() if binned[c] else pa.binary()
        return pa.dictionary(pa.int32(), pa.binary()) if c in names else pa.binary()

    with path.open("rb") as fh:
        first = fh.readline()
    if not first.strip():
        raise BadRowsError(str(path), [(1, "empty file: no header")])
    header = [h.strip() for h in next(csv.reader([first.decode("utf-8", "replace")]))]
    wrong_width: list[int] = []

    def skip(row: Any) -> str:
        wrong_width.append(1)
        return "skip"

    table = pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=header, skip_rows=1, block_size=_CSV_BLOCK),
        parse_options=pacsv.ParseOptions(invalid_row_handler=skip),
        convert_options=pacsv.ConvertOptions(
            column_types={c: kind(c) for c in header},
            include_columns=[c for c in needed if c in header],
            null_values=[""],  # only a numeric column has nulls: its empty cells
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )
    return header, table, len(wrong_width)


def _pieces(rows: int) -> range:
    """Starts of the :data:`_PIECE`-row steps of the id checks."""
    return range(0, rows, _PIECE)


def _numpy_text(arr: pa.Array) -> npt.NDArray[np.str_]:
    """A string array as a numpy unicode array (ASCII: from the buffers, no Python strings)."""
    arr = pc.fill_null(arr, "")
    offsets, data = offsets_data(arr)
    data = data[offsets[0] : offsets[-1]]
    lengths = np.diff(offsets)
    width = int(lengths.max()) if lengths.size else 0
    if width == 0:
        return np.full(len(arr), "", dtype="U1")
    if data.size and int(data.max()) >= 0x80:
        return np.asarray(arr.to_numpy(zero_copy_only=False).astype(str))
    padded = pc.utf8_rpad(arr, width=width, padding="\0")  # ASCII: every row now width bytes
    start = int(np.frombuffer(padded.buffers()[1], dtype=np.int32)[padded.offset])
    matrix = np.frombuffer(padded.buffers()[2], dtype=np.uint8)[start : start + len(arr) * width]
    return matrix.astype(np.uint32).view(f"U{width}")


@dataclass
class _Problems:
    """Reasons per row index (of the rows the reader kept), and with each reason the cell it is
    about: (column, value shown, kind) for the per-column summary and the ``--bad-rows`` file."""

    reasons: dict[int, list[str]] = field(default_factory=dict)
    cells: dict[int, list[tuple[str, str, str, str | None]]] = field(default_factory=dict)

    def add(self, row: int, message: str, column: str, value: str, kind: str, hint: str | None = None) -> None:
        self.reasons.setdefault(row, []).append(message)
        self.cells.setdefault(row, []).append((column, value, kind, hint))

    def flag(self, rows: npt.NDArray[np.intp], message: str, column: str, kind: str, hint: str | None = None) -> None:
        for r in rows.tolist():
            self.add(int(r), message, column, "", kind, hint)


def _check_ids(ids: pa.Array, bad_utf8: npt.NDArray[np.bool_], problems: _Problems, repeats: bool = True) -> None:
    """Flag invalid, missing, over-long and (``repeats``) repeated ids; lengths in
    :data:`_PIECE`-row steps (no length array of n words)."""
    offsets, _ = offsets_data(ids)
    empty: list[npt.NDArray[np.intp]] = [np.zeros(0, dtype=np.intp)]
    long: list[npt.NDArray[np.intp]] = [np.zeros(0, dtype=np.intp)]
    for start in _pieces(len(ids)):
        lengths = np.diff(offsets[start : start + _PIECE + 1])
        empty.append(np.flatnonzero(lengths == 0) + start)
        long.append(np.flatnonzero(lengths > MAX_ID_BYTES) + start)
    empty_rows = np.concatenate(empty)
    problems.flag(np.flatnonzero(bad_utf8), "id is not valid UTF-8 (the file must be UTF-8)", ID_CELLS,
                  "not valid UTF-8")
    problems.flag(empty_rows[~bad_utf8[empty_rows]], "missing id (empty)", ID_CELLS, "missing id (empty)")
    problems.flag(np.concatenate(long), f"id longer than {MAX_ID_BYTES} bytes", ID_CELLS,
                  f"longer than {MAX_ID_BYTES} bytes")
    if repeats and _may_repeat(ids):
        _flag_repeats(ids, problems)


def _may_repeat(ids: pa.Array) -> bool:
    """False only if no two ids are equal: equal ids have equal keys (the high 64 bits of their
    CMAC tags under a fixed key), and one int64 sort shows no two equal keys."""
    if len(ids) < 2:
        return False
    keys = id_tags(ids, _REPEAT_KEY).view(">u8").reshape(-1, 2)[:, 0].astype(np.int64)
    keys.sort()
    return bool(np.any(keys[1:] == keys[:-1]))


def _repeat_pairs(ids: pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(row, row of its first occurrence) of every repeat of an id (exact: ``dictionary_encode``
    of the ids; runs only if :func:`_may_repeat` found two equal keys)."""
    indices = pc.dictionary_encode(ids).indices.to_numpy(zero_copy_only=False)
    counts = np.bincount(indices)
    repeated = np.flatnonzero(counts[indices] > 1)
    if not repeated.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = np.full(counts.size, len(ids), dtype=np.int64)
    np.minimum.at(first, indices[repeated], repeated)
    later = repeated[first[indices[repeated]] != repeated]
    return later.astype(np.int64), first[indices[later]]


def _flag_repeats(ids: pa.Array, problems: _Problems) -> None:
    """Every repeated id, with the row of its first occurrence."""
    later, first = _repeat_pairs(ids)
    values = pc.take(ids, pa.array(later)).to_pylist()  # error path: the repeated ids only
    for r, f, value in zip(later.tolist(), first.tolist(), values, strict=True):
        problems.add(r, f"duplicate id (first at row {f})", ID_CELLS, value, "duplicate id", f"(first at row {f})")


def _encode(attribute: Attribute, column: pa.ChunkedArray, problems: _Problems) -> npt.NDArray[np.unsignedinteger[Any]]:
    """Category code of every row, in the narrowest unsigned type: raw bytes looked up among
    the categories trimming leaves unchanged (per dictionary entry for dictionary columns, then
    one gather per chunk into the output), then the full path (UTF-8 check, trim, every
    category) for the rows not found."""
    keys, key_codes = _keys(attribute)
    categories = pa.array(keys, pa.string())
    untrimmed = np.asarray(pc.equal(pc.utf8_trim_whitespace(categories), categories).to_numpy(zero_copy_only=False))
    plain_codes = key_codes[untrimmed]
    plain_set = pc.take(categories, pa.array(np.flatnonzero(untrimmed)))
    signed = _signed_code_dtype(len(categories))
    codes = np.empty(len(column), dtype=signed)  # -1: not found yet
    at = 0
    for chunk in column.chunks:
        out = codes[at : at + len(chunk)]
        if pa.types.is_dictionary(chunk.type):
            entries = plain(chunk.dictionary)
            table = np.append(_entry_codes(entries, attribute, categories, key_codes), -1).astype(signed)
            indices = chunk.indices.fill_null(len(entries)).to_numpy(zero_copy_only=False)
            np.take(table, indices, out=out, mode="clip")  # every index is in range
        else:
            out[:] = _lookup(plain(chunk), plain_set, plain_codes)
        at += len(chunk)
    rest = np.flatnonzero(codes < 0)
    if rest.size:
        text, bad_utf8 = cell_text(column.take(pa.array(rest)))
        key_at = np.asarray(pc.fill_null(pc.index_in(text, value_set=categories), -1).to_numpy(zero_copy_only=False))
        found = np.where(key_at >= 0, np.append(key_codes, -1)[key_at], -1)
        unmatched = np.flatnonzero(found < 0)
        if unmatched.size:  # rule 7: a number or true/false equal to one category's
            found[unmatched] = equivalent_codes(pc.take(text, pa.array(unmatched)), attribute.categories)
        codes[rest] = found
        unknown = np.flatnonzero((found < 0) & ~bad_utf8)
        allowed = list(attribute.categories)
        shown = pc.take(text, pa.array(unknown)).to_pylist()  # error path: the refused cells only
        hints: dict[str, str | None] = {}
        for r, value in zip(unknown.tolist(), shown, strict=True):
            if value == "":
                problems.add(int(rest[r]), f"{attribute.name} is missing (empty); declare \"missing\": LABEL in the "
                             "schema to keep such rows", attribute.name, "", "missing (empty)", _DECLARE_MISSING)
                continue
            if value not in hints:
                hints[value] = hint(value, attribute.categories)
            problems.add(int(rest[r]), f"{attribute.name}={value!r} not in {allowed}", attribute.name, value,
                         "not a category", hints[value])
        problems.flag(rest[bad_utf8], f"{attribute.name} is not valid UTF-8 (the file must be UTF-8)",
                      attribute.name, "not valid UTF-8")
        codes[codes < 0] = 0
    return codes.view(np.dtype(f"u{codes.itemsize}"))  # no negative code is left


def _entry_codes(
    entries: pa.Array, attribute: Attribute, keys: pa.Array, key_codes: npt.NDArray[np.intp]
) -> npt.NDArray[np.int64]:
    """The code of each distinct value of a dictionary column by the whole cell rule (trim, exact
    look-up, then rule 7's equivalences), once per entry rather than per row; -1 for an entry
    that is refused or not UTF-8 (its rows then take the full path, which names them)."""
    text, bad_utf8 = cell_text(entries)
    at = np.asarray(pc.fill_null(pc.index_in(text, value_set=keys), -1).to_numpy(zero_copy_only=False))
    found = np.where(at >= 0, np.append(key_codes, -1)[at], -1).astype(np.int64)
    unmatched = np.flatnonzero(found < 0)
    if unmatched.size:
        found[unmatched] = equivalent_codes(pc.take(text, pa.array(unmatched)), attribute.categories)
    found[bad_utf8] = -1
    return found


def _keys(attribute: Attribute) -> tuple[list[str], npt.NDArray[np.intp]]:
    """The strings an attribute's cells may hold and the code of each: its categories, then
    (with a missing label) the empty cell and the missing tokens, all counted as the label."""
    keys, codes = list(attribute.categories), list(range(attribute.size))
    if attribute.missing_code is not None:
        extra = [t for t in ("", *attribute.missing_tokens) if t not in keys]
        keys += extra
        codes += [attribute.missing_code] * len(extra)
    return keys, np.asarray(codes, dtype=np.intp)


_NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$|^[+-]?(inf|infinity|nan)$"


def _encode_binned(
    attribute: Attribute, column: pa.ChunkedArray, problems: _Problems
) -> npt.NDArray[np.unsignedinteger[Any]]:
    """Bin code of every row (vectorized: a numeric column in :data:`_PIECE`-row steps of one
    ``searchsorted`` against the edges and two comparisons); a text column is first trimmed, its
    missing cells and tokens found and the rest parsed as numbers in Arrow."""
    assert attribute.bins is not None
    signed = _signed_code_dtype(attribute.size)
    codes = np.empty(len(column), dtype=signed)
    missing = np.zeros(0, dtype=np.intp)
    numbers: pa.ChunkedArray | pa.Array = column
    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    temporal = pa.types.is_date(kind) or pa.types.is_timestamp(kind)
    if attribute.dates and temporal:  # days since 1970-01-01, as the edges
        numbers = pc.cast(pc.cast(column, pa.date32()), pa.int32())
        if column.null_count:
            missing = np.flatnonzero(np.asarray(column.is_null().to_numpy(zero_copy_only=False)))
    elif attribute.dates:
        numbers, missing = _parse_dates(attribute, column, problems)
    elif not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
        numbers, missing = _parse_numbers(attribute, column, problems)
    elif column.null_count or pa.types.is_floating(kind):
        missing = np.flatnonzero(np.asarray(pc.is_null(plain(column), nan_is_null=True).to_numpy(zero_copy_only=False)))
    at, flagged, flagged_values = 0, [], []
    chunks = numbers.chunks if isinstance(numbers, pa.ChunkedArray) else [numbers]
    for chunk in chunks:
        chunk = plain(chunk)
        if not pa.types.is_float64(chunk.type):
            chunk = pc.cast(chunk, pa.float64())
        values = chunk.to_numpy(zero_copy_only=False)  # a null is NaN here; the missing rows are known
        for start in range(0, len(values), _PIECE):
            piece = values[start : start + _PIECE]
            piece_codes, bad = attribute.bin_codes(piece)
            codes[at + start : at + start + len(piece)] = piece_codes
            if bool(bad.any()):
                flagged.append(np.flatnonzero(bad) + at + start)
                flagged_values.append(piece[bad])
        at += len(values)
    bad_rows = np.concatenate(flagged) if flagged else np.zeros(0, dtype=np.intp)
    bad_values = np.concatenate(flagged_values) if flagged_values else np.zeros(0, dtype=np.float64)
    if missing.size:
        if attribute.missing_code is not None:
            codes[missing] = attribute.missing_code
        else:
            problems.flag(missing, f"{attribute.name} is missing (empty); declare \"missing\": LABEL in the "
                          "schema to keep such rows", attribute.name, "missing (empty)", hint=_DECLARE_MISSING)
        kept = ~np.isin(bad_rows, missing)
        bad_rows, bad_values = bad_rows[kept], bad_values[kept]
    if bad_rows.size:
        lo, hi = attribute.edge_label(attribute.bins[0]), attribute.edge_label(attribute.bins[-1])
        what = "a date" if attribute.dates else "a number"
        allowed = f"a finite {what[2:]}" if attribute.clamp else f"{what} in [{lo}, {hi}] (or declare \"clamp\": true)"
        for r, value in zip(bad_rows.tolist(), bad_values.tolist(), strict=True):
            named = problems.cells.get(r, ())
            if all(cell[0] != attribute.name for cell in named):  # a cell that is not a number is already named
                number = attribute.edge_label(value) if math.isfinite(value) else repr(value)
                problems.add(r, f"{attribute.name}={number} is outside the bins; allowed: {allowed}", attribute.name,
                             number, "outside the bins")
        codes[bad_rows] = 0
    return codes.view(np.dtype(f"u{codes.itemsize}"))


def _parse_numbers(
    attribute: Attribute, column: pa.ChunkedArray, problems: _Problems
) -> tuple[pa.Array, npt.NDArray[np.intp]]:
    """A text column as float64 (Arrow's cast) and its missing rows: empty cells and the missing
    tokens; a cell that is not a number is flagged and read as NaN."""
    text, bad_utf8 = cell_text(column)
    problems.flag(np.flatnonzero(bad_utf8), f"{attribute.name} is not valid UTF-8 (the file must be UTF-8)",
                  attribute.name, "not valid UTF-8")
    is_missing = pc.equal(text, "")
    if attribute.missing_tokens:
        is_missing = pc.or_(is_missing, pc.is_in(text, value_set=pa.array(list(attribute.missing_tokens))))
    missing = np.flatnonzero(np.asarray(is_missing.to_numpy(zero_copy_only=False)) & ~bad_utf8)
    cleaned = pc.if_else(pc.or_(is_missing, pa.array(bad_utf8)), pa.scalar("0", text.type), text)
    try:
        return pc.cast(cleaned, pa.float64()), missing
    except pa.ArrowInvalid:
        pass
    ok = pc.match_substring_regex(cleaned, _NUMBER, ignore_case=True)
    wrong = np.flatnonzero(~np.asarray(ok.to_numpy(zero_copy_only=False)))
    for r, value in zip(wrong.tolist(), pc.take(text, pa.array(wrong)).to_pylist(), strict=True):
        problems.add(
            r,
            f"{attribute.name}={value!r} is not a number (bins {[edge_text(e) for e in attribute.bins or ()]}"
            + ("" if attribute.missing is not None else '; declare "missing" and "missing_tokens" for such cells')
            + ")",
            attribute.name, value, "not a number",
        )
    return pc.cast(pc.if_else(ok, cleaned, pa.scalar("nan", text.type)), pa.float64()), missing


def _parse_dates(
    attribute: Attribute, column: pa.ChunkedArray, problems: _Problems
) -> tuple[pa.Array, npt.NDArray[np.intp]]:
    """A text column of ISO dates (YYYY-MM-DD) as day numbers since 1970-01-01 (Arrow's
    strptime) and its missing rows; a cell that is not a date is flagged and read as NaN."""
    text, bad_utf8 = cell_text(column)
    problems.flag(np.flatnonzero(bad_utf8), f"{attribute.name} is not valid UTF-8 (the file must be UTF-8)",
                  attribute.name, "not valid UTF-8")
    is_missing = pc.equal(text, "")
    if attribute.missing_tokens:
        is_missing = pc.or_(is_missing, pc.is_in(text, value_set=pa.array(list(attribute.missing_tokens))))
    skip = np.asarray(is_missing.to_numpy(zero_copy_only=False)) | bad_utf8
    missing = np.flatnonzero(np.asarray(is_missing.to_numpy(zero_copy_only=False)) & ~bad_utf8)
    # an ISO date, or (rule 6's text of a timestamp) an ISO date followed by a time of day
    dated = pc.match_substring_regex(text, MOMENT_PATTERN)
    day = pc.if_else(dated, pc.utf8_slice_codeunits(text, 0, 10), pa.scalar("", text.type))
    stamps = pc.strptime(day, format="%Y-%m-%d", unit="s", error_is_null=True)
    days = pc.cast(pc.cast(stamps, pa.date32()), pa.int32())
    wrong = np.flatnonzero(np.asarray(days.is_null().to_numpy(zero_copy_only=False)) & ~skip)
    for r, value in zip(wrong.tolist(), pc.take(text, pa.array(wrong)).to_pylist(), strict=True):
        problems.add(
            r,
            f"{attribute.name}={value!r} is not a date (YYYY-MM-DD)"
            + ("" if attribute.missing is not None else '; declare "missing" and "missing_tokens" for such cells'),
            attribute.name, value, "not a date (YYYY-MM-DD)", hint(value, ()),
        )
    return days, missing


def _signed_code_dtype(num_categories: int) -> type[np.signedinteger[Any]]:
    """The narrowest signed type holding codes 0..num_categories - 1 and the -1 of "not found"."""
    return np.int8 if num_categories <= 1 << 7 else np.int16 if num_categories <= 1 << 15 else np.int32


def _lookup(values: pa.Array, plain_set: pa.Array, plain_codes: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
    """Code of each value whose raw bytes are one of ``plain_set``, else -1 (nulls: -1)."""
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
            or pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        return np.full(len(values), -1, dtype=np.int64)
    at = pc.index_in(values, value_set=plain_set.cast(values.type))
    found = np.asarray(pc.fill_null(at, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.where(found >= 0, np.append(plain_codes, -1)[found], -1)


@dataclass(frozen=True)
class RowSource:
    """Where a run of a table's rows was read from, for error reports: ``path`` (the file or
    DuckDB database), ``is_csv`` (lines are counted in the file, exactly; otherwise a row's line
    is ``first_row`` + its index + 2, the header being line 1) and ``first_row`` (the index in
    its file of the run's first row: a Parquet run of row groups starts past row 0)."""

    path: Path
    is_csv: bool
    first_row: int = 0


def source_of(path: Path, query: str | None = None) -> RowSource:
    """The :class:`RowSource` of a whole file (CSV unless its suffix or a query says otherwise)."""
    return RowSource(path, query is None and path.suffix.lower() not in _PARQUET + _ARROW + _DUCKDB)


@dataclass
class CheckedRows:
    """One source's rows after every check: ``ids`` (trimmed Arrow strings), ``digits`` (each
    attribute's codes), the problems found per row index (``id_problems`` apart: a report lists
    them first), ``width`` (the header's number of fields: a CSV record's expected width) and
    ``wrong_width`` (CSV records of another width, which the reader skipped)."""

    source: RowSource
    width: int
    ids: pa.Array
    digits: dict[str, npt.NDArray[np.unsignedinteger[Any]]]
    id_problems: _Problems
    problems: _Problems
    wrong_width: int = 0

    @property
    def bad(self) -> bool:
        """True if any row (or CSV record) is refused."""
        return bool(self.problems.reasons or self.id_problems.reasons or self.wrong_width)

    def reasons(self) -> dict[int, list[str]]:
        """Every bad row's reasons, its id's first."""
        merged = {row: list(reasons) for row, reasons in self.id_problems.reasons.items()}
        for row, reasons in self.problems.reasons.items():
            merged[row] = merged.get(row, []) + reasons
        return merged


def check_rows(
    header: list[str], table: pa.Table, spec: TableSpec, source: RowSource, check_repeats: bool | None = True,
    wrong_width: int = 0, width: int | None = None,
) -> CheckedRows:
    """Check and encode the columns ``table`` (read from ``source``, whose header is ``header``)
    against ``spec``: every problem is recorded, none raised, except a missing column
    (:class:`BadRowsError` at once). ``check_repeats``: True, repeated ids are looked for; False,
    only if some row is bad anyway (the report stays complete); None, never (the caller looks
    for them across several sources). ``width``: the number of fields of a record in the file
    itself (a CSV record's expected width when the error path counts them), if ``header`` also
    names columns that are not in the file (a hive partition's keys); default ``len(header)``."""
    needed = [spec.id_column, *(a.name for a in spec.schema.attributes)]
    missing = [c for c in needed if c not in header]
    if missing:
        raise BadRowsError(str(source.path), [(1, f"missing column(s) {missing}; header is {header}")])
    id_problems, problems = _Problems(), _Problems()
    table = _without_views(table, needed)
    ids, bad_id_utf8 = cell_text(table.column(spec.id_column))
    # the id checks (a hash and a sort, both outside the GIL) overlap the attribute look-ups
    id_check = worker_pool().submit(_check_ids, ids, bad_id_utf8, id_problems, bool(check_repeats))
    digits = {
        a.name: (_encode_binned if a.bins is not None else _encode)(a, table.column(a.name), problems)
        for a in spec.schema.attributes
    }
    id_check.result()
    checked = CheckedRows(source, len(header) if width is None else width, ids, digits, id_problems, problems,
                          wrong_width)
    if check_repeats is False and checked.bad and _may_repeat(ids):
        _flag_repeats(ids, id_problems)  # error path: the report lists every bad line
    return checked


def _without_views(table: pa.Table, names: Sequence[str]) -> pa.Table:
    """``table`` with its string and binary view columns among ``names`` as large strings and
    binaries (Arrow's take and look-ups have no view kernels in every version; pyarrow < 16 has
    no view types at all)."""
    views = [getattr(pa.types, test, lambda kind: False) for test in ("is_string_view", "is_binary_view")]
    for name in names:
        kind = table.schema.field(name).type
        if any(is_view(kind) for is_view in views):
            table = table.set_column(table.schema.get_field_index(name), name, plain(table.column(name)))
    return table


def encode_checked(checked: CheckedRows, spec: TableSpec) -> EncodedTable:
    """The :class:`EncodedTable` of one source's checked rows; :class:`BadRowsError` listing
    every bad line of the source if any row is bad."""
    if checked.bad:
        problems, cells = _report(checked)
        raise BadRowsError(str(checked.source.path), problems, cells=cells, allowed=_allowed(spec))
    return _encoded(spec, checked.ids, checked.digits)


def _encoded(
    spec: TableSpec, ids: pa.Array, digits: dict[str, npt.NDArray[np.unsignedinteger[Any]]]
) -> EncodedTable:
    """The table of these ids and attribute codes, its joint symbols built in place."""
    codes = [digits[a.name] for a in spec.schema.attributes]
    encoded = mixed_radix_encode(codes, spec.schema.radices, dtype=np.uint32)  # 4 bytes a row, no int64 pass
    release_free_memory()  # hand Arrow's freed parse buffers (and glibc's free heap) back to the OS
    return EncodedTable(spec.schema, ids, _Labels(spec.schema, digits), encoded)


def read_file(
    data_path: str | Path, spec: TableSpec, query: str | None = None, check_repeats: bool = True
) -> EncodedTable:
    """The curator's table from one file (or a DuckDB query on one); raises
    :class:`BadRowsError` listing every bad line. ``query``: SQL run on ``data_path`` as a
    DuckDB database (see the module docstring). ``check_repeats=False``: repeated ids are looked
    for only if some row is bad anyway (so the report stays complete); a caller that hashes the
    ids finds repeats as equal tags in its own sort of them and then calls :func:`raise_repeats`
    (the curator: no second hash and sort)."""
    path = Path(data_path)
    header, table, wrong_width = read_columns(path, spec, query)
    checked = check_rows(header, table, spec, source_of(path, query), check_repeats, wrong_width)
    del table  # the raw columns: only the ids, the codes and the symbols are kept
    return encode_checked(checked, spec)


def combine_checked(
    data: str, parts: Sequence[CheckedRows | BadRowsError], spec: TableSpec, check_repeats: bool = True
) -> EncodedTable:
    """One table of several sources' rows (checked with ``check_repeats=None``), in order.
    Repeated ids, within a source or across sources, are looked for if ``check_repeats`` or if
    some row is bad anyway. Any problem, or a source refused outright (a :class:`BadRowsError`
    in ``parts``: a missing column, an empty file), raises one :class:`BadRowsError` for
    ``data`` that names each problem's file."""
    checked = [p for p in parts if isinstance(p, CheckedRows)]
    ids = _concat_ids([p.ids for p in checked])
    refused = any(isinstance(p, BadRowsError) for p in parts) or any(p.bad for p in checked)
    lines = _LineCache()
    if (check_repeats or refused) and _may_repeat(ids):
        _flag_repeats_across(ids, checked, lines)
    if refused or any(p.bad for p in checked):
        raise _merged_error(data, parts, lines, spec)
    digits = {
        a.name: np.concatenate([p.digits[a.name] for p in checked]) if checked
        else np.zeros(0, dtype=np.uint8) for a in spec.schema.attributes
    }
    table = _encoded(spec, ids, digits)
    object.__setattr__(table, "_sources", tuple((p.source, p.width, len(p.ids)) for p in checked))
    return table


def _concat_ids(arrays: Sequence[pa.Array]) -> pa.Array:
    """The id arrays end to end, as one string (or, if any is large, large string) array."""
    if len(arrays) == 1:
        return arrays[0]
    large = any(pa.types.is_large_string(a.type) for a in arrays)
    kind = pa.large_string() if large else pa.string()
    if not arrays:
        return pa.array([], kind)
    return pa.concat_arrays([a if a.type == kind else a.cast(kind) for a in arrays])


class _LineCache:
    """Each source's line finder, made once (a CSV source's costs a counting pass of its file)."""

    def __init__(self) -> None:
        self._found: dict[RowSource, tuple[Callable[[int], int | None], list[tuple[int, str]]]] = {}

    def of(self, source: RowSource, width: int) -> tuple[Callable[[int], int | None], list[tuple[int, str]]]:
        if source not in self._found:
            self._found[source] = _line_finder(source, width)
        return self._found[source]


def _flag_repeats_across(ids: pa.Array, parts: Sequence[CheckedRows], lines: _LineCache) -> None:
    """Flag every repeated id of the sources' concatenated ``ids`` in its own source: a repeat
    within one source as :func:`_flag_repeats` does, one across sources with the file and line
    of the first occurrence (error path: a Python step per repeated row)."""
    starts = np.cumsum([0, *(len(p.ids) for p in parts)])
    later, first = _repeat_pairs(ids)
    later_part = np.searchsorted(starts, later, side="right") - 1
    first_part = np.searchsorted(starts, first, side="right") - 1
    for r, f, rp, fp in zip(later.tolist(), first.tolist(), later_part.tolist(), first_part.tolist(), strict=True):
        row, first_row, owner = r - int(starts[rp]), f - int(starts[fp]), parts[fp]
        if rp == fp:
            message = f"duplicate id (first at row {first_row})"
        else:
            line = lines.of(owner.source, owner.width)[0](first_row)
            message = f"duplicate id (first on line {line} of {owner.source.path})"
        parts[rp].id_problems.add(row, message, ID_CELLS, "", "duplicate id", message.removeprefix("duplicate id "))


def _merged_error(
    data: str, parts: Sequence[CheckedRows | BadRowsError], lines: _LineCache, spec: TableSpec | None = None
) -> BadRowsError:
    """One :class:`BadRowsError` for ``data`` listing every source's bad lines, each with its file."""
    problems: list[tuple[int, str]] = []
    files: list[str] = []
    cells: list[BadCell] = []
    for part in parts:
        if isinstance(part, BadRowsError):
            found, file = part.problems, part.path
            cells += [replace(c, file=file) for c in part.cells]
        elif part.bad:
            file = str(part.source.path)
            found, found_cells = _report(part, lines, file)
            cells += found_cells
        else:
            continue
        problems += found
        files += [file] * len(found)
    return BadRowsError(data, problems, files, cells, _allowed(spec))


def raise_repeats(data_path: str | Path, table: EncodedTable, query: str | None = None) -> None:
    """:class:`BadRowsError` naming every repeated id of ``table`` (read with
    ``check_repeats=False``) with its line and the line of its first occurrence (a table read
    from several files: with their files); returns if no id repeats (exact: ``dictionary_encode``
    of the ids)."""
    sources: tuple[tuple[RowSource, int, int], ...] | None = table.__dict__.get("_sources")
    ids = table.id_array
    if sources is not None:
        parts: list[CheckedRows] = []
        at = 0
        for source, width, rows in sources:
            parts.append(CheckedRows(source, width, ids.slice(at, rows), {}, _Problems(), _Problems()))
            at += rows
        lines = _LineCache()
        _flag_repeats_across(ids, parts, lines)
        if any(p.bad for p in parts):
            raise _merged_error(str(data_path), parts, lines)
        return
    problems = _Problems()
    _flag_repeats(ids, problems)
    if problems.reasons:
        path = Path(data_path)
        checked = CheckedRows(source_of(path, query), len(_header(path, query)), ids, {}, problems, _Problems())
        found, cells = _report(checked)
        raise BadRowsError(str(path), found, cells=cells)


def _header(path: Path, query: str | None) -> list[str]:
    """The CSV header (the width of a record), or [] for other sources (error path only)."""
    if query is not None or path.suffix.lower() in _PARQUET + _ARROW + _DUCKDB:
        return []
    with path.open("rb") as fh:
        first = fh.readline()
    return next(csv.reader([first.decode("utf-8", "replace")]))


def _line_finder(source: RowSource, width: int) -> tuple[Callable[[int], int | None], list[tuple[int, str]]]:
    """The file line of a row index (None: no record the reader kept) and, for CSV, every
    record of the wrong width with its line (a counting pass: error path only)."""
    if not source.is_csv:
        return (lambda row: source.first_row + row + 2), []
    wrong: list[tuple[int, str]] = []
    kept_line: list[int] = []  # file line of each record the columnar reader kept
    with source.path.open(newline="", encoding="utf-8", errors="surrogateescape") as fh:
        reader = csv.reader(fh)
        next(reader)
        for record in reader:  # error path only: a counting pass for exact line numbers
            if not record:
                continue
            if len(record) != width:
                wrong.append((reader.line_num, f"wrong number of fields, expected {width}, got {len(record)}"))
            else:
                kept_line.append(reader.line_num)
    return (lambda row: kept_line[row] if row < len(kept_line) else None), wrong


def _report(
    checked: CheckedRows, lines: _LineCache | None = None, file: str | None = None
) -> tuple[list[tuple[int, str]], list[BadCell]]:
    """(line, reasons) for every bad row of one source, in file order, and its bad cells (each
    with ``file``, for a table of several files) (error path only)."""
    line_of, wrong = (lines or _LineCache()).of(checked.source, checked.width)
    reasons = checked.reasons()
    report = list(wrong)
    cells = [BadCell(line, "(record)", "", message, None, file) for line, message in wrong]
    for row in sorted(reasons):
        line = line_of(row)
        if line is not None:
            report.append((line, _rename_rows(", ".join(reasons[row]), line_of)))
            found = (*checked.id_problems.cells.get(row, ()), *checked.problems.cells.get(row, ()))
            for column, value, kind, hint in found:
                shown = None if hint is None else _rename_rows(hint, line_of)
                cells.append(BadCell(line, column, value, kind, shown, file))
    return sorted(report), cells


def _allowed(spec: TableSpec | None) -> dict[str, Sequence[str]] | None:
    """Each categorical attribute's categories (for the summary's "allowed" line)."""
    if spec is None:
        return None
    return {a.name: a.categories for a in spec.schema.attributes if a.bins is None}


def _rename_rows(message: str, line_of: Callable[[int], int | None]) -> str:
    """Turn "first at row R" into "first on line L"."""
    marker = "(first at row "
    if marker not in message:
        return message
    head, _, tail = message.partition(marker)
    row, _, rest = tail.partition(")")
    line = line_of(int(row))
    return f"{head}(first on line {int(row) + 2 if line is None else line}){_rename_rows(rest, line_of)}"
