"""Read a curator's table (CSV, Parquet or Arrow IPC) against its schema JSON, columnar.

Schema file: ``{"curator": "alice", "id_column": "id",
"attributes": [{"name": "education", "categories": ["no college", ...]}, ...]}``.

Engine: pyarrow (a core dependency of the curator). The file is parsed by Arrow's C++ readers
(multi-threaded CSV, Parquet and IPC in record batches); the needed columns are read as raw
bytes, checked for UTF-8, trimmed, and mapped to category codes with ``index_in`` against the
schema's category list; missing, over-long and duplicate ids are found there too
(``dictionary_encode``). Nothing is silently dropped or recoded: any bad row makes
:class:`BadRowsError` list every bad line (what was wrong and what is allowed), and no table is
returned. Line numbers are exact for CSV (a second, counting pass runs on the error path only)
and are row index + 2 (the header is line 1) for Parquet and Arrow files.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.protocol import CuratorTable
from secure_release.mechanism.schema import Attribute, CuratorSchema, SymbolArray, mixed_radix_encode

#: Longest id accepted, in UTF-8 bytes (longer ones are refused, never truncated).
MAX_ID_BYTES = 256
_PARQUET = (".parquet", ".pq")
_ARROW = (".arrow", ".feather", ".ipc", ".arrows")


class SchemaFileError(SecureReleaseError):
    """The schema JSON file is missing a field or malformed."""


class BadRowsError(SecureReleaseError):
    """Some rows hold values outside the schema (or a missing, over-long or duplicate id, or
    bytes that are not UTF-8)."""

    def __init__(self, path: str, problems: list[tuple[int, str]]) -> None:
        self.path = path
        self.problems = problems
        shown = "; ".join(f"line {line}: {msg}" for line, msg in problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        super().__init__(f"{path}: {len(problems)} bad row(s) refused: {shown}{more}")


@dataclass(frozen=True)
class TableSpec:
    schema: CuratorSchema
    id_column: str


def load_schema(path: str | Path) -> TableSpec:
    """The schema JSON as a :class:`TableSpec`; raises :class:`SchemaFileError`."""
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
        name = str(data["curator"])
        attrs = tuple(Attribute(str(a["name"]), tuple(str(c) for c in a["categories"])) for a in data["attributes"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SchemaFileError(
            f"{path}: cannot read schema ({type(exc).__name__}: {exc}); expected "
            '{"curator": NAME, "id_column": "id", '
            '"attributes": [{"name": ..., "categories": [...]}]}'
        ) from exc
    return TableSpec(CuratorSchema(name, attrs), str(data.get("id_column", "id")))


class _Labels(Mapping[str, npt.NDArray[np.str_]]):
    """Label columns computed on access from the category codes (no string column is kept)."""

    def __init__(self, schema: CuratorSchema, digits: Mapping[str, npt.NDArray[np.int64]]) -> None:
        self._schema, self._digits = schema, digits

    def __getitem__(self, name: str) -> npt.NDArray[np.str_]:
        attribute = next(a for a in self._schema.attributes if a.name == name)
        return np.asarray(attribute.categories, dtype=str)[self._digits[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._digits)

    def __len__(self) -> int:
        return len(self._digits)


@dataclass(frozen=True)
class EncodedTable(CuratorTable):
    """A :class:`CuratorTable` whose symbols were computed at read time (columnar)."""

    encoded: SymbolArray = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))

    def symbols(self) -> SymbolArray:
        return self.encoded


def _open_batches(path: Path, needed: list[str]) -> tuple[list[str], pa.Table, int]:
    """Header, the needed columns (bytes for CSV) and how many CSV records had a wrong width."""
    suffix = path.suffix.lower()
    if suffix in _PARQUET:
        pfile = pq.ParquetFile(path)
        header = list(pfile.schema_arrow.names)
        present = [c for c in needed if c in header]
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
    return _read_csv(path, needed)


def _read_csv(path: Path, needed: list[str]) -> tuple[list[str], pa.Table, int]:
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
        read_options=pacsv.ReadOptions(column_names=header, skip_rows=1, block_size=1 << 24),
        parse_options=pacsv.ParseOptions(invalid_row_handler=skip),
        convert_options=pacsv.ConvertOptions(
            column_types={c: pa.binary() for c in header},
            include_columns=[c for c in needed if c in header],
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )
    return header, table, len(wrong_width)


def _text(column: pa.ChunkedArray) -> tuple[pa.Array, npt.NDArray[np.bool_]]:
    """The column as trimmed UTF-8 strings and which rows were not valid UTF-8 (set to "")."""
    arr = column.combine_chunks()
    if pa.types.is_integer(arr.type):
        arr = pc.cast(arr, pa.string())
    bad = np.zeros(len(arr), dtype=bool)
    if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
        try:
            arr = pc.cast(arr, pa.string())
        except pa.ArrowInvalid:
            bad = _invalid_utf8(arr)
            arr = pc.cast(pc.if_else(pa.array(bad), pa.scalar(b"", arr.type), arr), pa.string())
    elif not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = pc.cast(arr, pa.string())
    return pc.utf8_trim_whitespace(pc.fill_null(arr, "")), bad  # a null is a missing value


def _invalid_utf8(arr: pa.Array, piece: int = 4096) -> npt.NDArray[np.bool_]:
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


def _numpy_text(arr: pa.Array) -> npt.NDArray[np.str_]:
    """A string array as a numpy unicode array (ASCII: from the buffers, no Python strings)."""
    arr = pc.fill_null(arr, "")
    offsets_buf, data_buf = arr.buffers()[1], arr.buffers()[2]
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]] if data_buf else np.zeros(0, np.uint8)
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
    """Reasons per row index (of the rows the reader kept)."""

    reasons: dict[int, list[str]] = field(default_factory=dict)

    def flag(self, rows: npt.NDArray[np.intp], message: str) -> None:
        for r in rows.tolist():
            self.reasons.setdefault(int(r), []).append(message)


def _check_ids(ids: pa.Array, bad_utf8: npt.NDArray[np.bool_], problems: _Problems) -> None:
    lengths = pc.binary_length(ids).to_numpy(zero_copy_only=False)
    problems.flag(np.flatnonzero(bad_utf8), "id is not valid UTF-8 (the file must be UTF-8)")
    problems.flag(np.flatnonzero((lengths == 0) & ~bad_utf8), "missing id (empty)")
    problems.flag(np.flatnonzero(lengths > MAX_ID_BYTES), f"id longer than {MAX_ID_BYTES} bytes")
    indices = pc.dictionary_encode(ids).indices.to_numpy(zero_copy_only=False)
    counts = np.bincount(indices)
    repeated = np.flatnonzero(counts[indices] > 1)
    if repeated.size:
        first = np.full(counts.size, len(ids), dtype=np.int64)
        np.minimum.at(first, indices[repeated], repeated)
        later = repeated[first[indices[repeated]] != repeated]
        for r, f in zip(later.tolist(), first[indices[later]].tolist(), strict=True):
            problems.reasons.setdefault(r, []).append(f"duplicate id (first at row {f})")


def _encode(attribute: Attribute, column: pa.ChunkedArray, problems: _Problems) -> npt.NDArray[np.int64]:
    text, bad_utf8 = _text(column)
    codes = pc.index_in(text, value_set=pa.array(list(attribute.categories), pa.string()))
    unknown = np.flatnonzero(~np.asarray(pc.is_valid(codes)) & ~bad_utf8)
    allowed = sorted(attribute.categories)
    for r in unknown.tolist():
        problems.reasons.setdefault(r, []).append(f"{attribute.name}={text[r].as_py()!r} not in {allowed}")
    problems.flag(np.flatnonzero(bad_utf8), f"{attribute.name} is not valid UTF-8 (the file must be UTF-8)")
    return np.asarray(pc.fill_null(codes, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def read_table(data_path: str | Path, spec: TableSpec) -> CuratorTable:
    """The curator's table; raises :class:`BadRowsError` listing every bad line."""
    path = Path(data_path)
    needed = [spec.id_column] + [a.name for a in spec.schema.attributes]
    header, table, wrong_width = _open_batches(path, needed)
    missing = [c for c in needed if c not in header]
    if missing:
        raise BadRowsError(str(path), [(1, f"missing column(s) {missing}; header is {header}")])
    problems = _Problems()
    ids, bad_id_utf8 = _text(table.column(spec.id_column))
    _check_ids(ids, bad_id_utf8, problems)
    digits = {a.name: _encode(a, table.column(a.name), problems) for a in spec.schema.attributes}
    if problems.reasons or wrong_width:
        raise BadRowsError(str(path), _report(path, problems, len(header)))
    symbols = mixed_radix_encode([digits[a.name] for a in spec.schema.attributes], spec.schema.radices)
    return EncodedTable(spec.schema, _numpy_text(ids), _Labels(spec.schema, digits), symbols.astype(np.uint32))


def _report(path: Path, problems: _Problems, width: int) -> list[tuple[int, str]]:
    """(line, reasons) for every bad row, in file order (error path only)."""
    rows = sorted(problems.reasons)
    if path.suffix.lower() in _PARQUET + _ARROW:
        lines = {r: r + 2 for r in rows}
        return [(lines[r], _rename_rows(", ".join(problems.reasons[r]), lines)) for r in rows]
    report: list[tuple[int, str]] = []
    kept_line: list[int] = []  # file line of each record the columnar reader kept
    with path.open(newline="", encoding="utf-8", errors="surrogateescape") as fh:
        reader = csv.reader(fh)
        next(reader)
        for record in reader:  # error path only: a counting pass for exact line numbers
            if not record:
                continue
            if len(record) != width:
                report.append((reader.line_num, f"wrong number of fields, expected {width}, got {len(record)}"))
            else:
                kept_line.append(reader.line_num)
    lines = {r: kept_line[r] for r in rows if r < len(kept_line)}
    report += [(lines[r], _rename_rows(", ".join(problems.reasons[r]), dict(enumerate(kept_line)))) for r in lines]
    return sorted(report)


def _rename_rows(message: str, line_of: Mapping[int, int]) -> str:
    """Turn "first at row R" into "first on line L"."""
    marker = "(first at row "
    if marker not in message:
        return message
    head, _, tail = message.partition(marker)
    row, _, rest = tail.partition(")")
    return f"{head}(first on line {line_of.get(int(row), int(row) + 2)}){_rename_rows(rest, line_of)}"
