"""Read a curator's table (CSV, or Parquet with pyarrow) against its schema JSON.

Schema file: ``{"curator": "alice", "id_column": "id",
"attributes": [{"name": "education", "categories": ["no college", ...]}, ...]}``.
Rows whose values lie outside the schema are refused with their line numbers
(:class:`BadRowsError`); nothing is silently dropped or recoded.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.protocol import CuratorTable
from secure_release.mechanism.schema import Attribute, CuratorSchema


class SchemaFileError(SecureReleaseError):
    """The schema JSON file is missing a field or malformed."""


class BadRowsError(SecureReleaseError):
    """Some rows hold values outside the schema (or an empty/duplicate id)."""

    def __init__(self, path: str, problems: list[tuple[int, str]]) -> None:
        self.path = path
        self.problems = problems
        shown = "; ".join(f"line {line}: {msg}" for line, msg in problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        super().__init__(f"{path}: {len(problems)} bad row(s) refused: {shown}{more}")


@dataclass(frozen=True)
class TableSpec:
    """A schema file: the curator's schema and the name of its id column."""

    schema: CuratorSchema
    id_column: str


def load_schema(path: str | Path) -> TableSpec:
    """Read a schema JSON file; :class:`SchemaFileError` says what is missing or malformed."""
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


def _read_columns(path: Path) -> tuple[list[str], list[npt.NDArray[np.str_]], npt.NDArray[np.bool_]]:
    """Header, one stripped string column per header field, and which records had the right
    number of fields (records with a wrong count are left out of the columns).

    Parsing is the csv module's C reader (or pyarrow for Parquet); everything after it is
    numpy: no per-row Python loop on the happy path.
    """
    if path.suffix.lower() in (".parquet", ".pq"):
        try:
            import pyarrow.compute as pc
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover
            raise SchemaFileError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from exc
        table = pq.read_table(path)
        header = list(table.column_names)
        columns = []
        for name in header:
            text = pc.fill_null(pc.cast(table.column(name), "string"), "")
            columns.append(np.strings.strip(text.to_numpy(zero_copy_only=False).astype(str)))
        return header, columns, np.ones(table.num_rows, dtype=bool)
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration as exc:
            raise BadRowsError(str(path), [(1, "empty file: no header")]) from exc
        records = list(filter(None, reader))  # blank lines skipped
    widths = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
    good = widths == len(header)
    kept = records if bool(good.all()) else list(compress(records, good.tolist()))
    fields = list(zip(*kept, strict=True)) if kept else [() for _ in header]
    columns = [np.strings.strip(np.asarray(f, dtype=str)) for f in fields]
    return header, columns, good


def _line_numbers(path: Path, record_indices: npt.NDArray[np.int64]) -> list[int]:
    """File line numbers of the given records (error path only: a second, counting pass)."""
    if path.suffix.lower() in (".parquet", ".pq"):
        return [int(i) + 2 for i in record_indices]
    wanted = set(record_indices.tolist())
    lines: dict[int, int] = {}
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        next(reader)
        index = 0
        for record in reader:
            if not record:
                continue
            if index in wanted:
                lines[index] = reader.line_num
            index += 1
    return [lines[int(i)] for i in record_indices]


def read_table(data_path: str | Path, spec: TableSpec) -> CuratorTable:
    """The curator's table; raises :class:`BadRowsError` listing every bad line."""
    path = Path(data_path)
    header, columns, good_width = _read_columns(path)
    needed = [spec.id_column] + [a.name for a in spec.schema.attributes]
    missing = [c for c in needed if c not in header]
    if missing:
        raise BadRowsError(str(path), [(1, f"missing column(s) {missing}; header is {header}")])
    by_name = dict(zip(header, columns, strict=True))
    ids = by_name[spec.id_column]
    record_of = np.flatnonzero(good_width)  # record index of each kept row
    reasons: dict[int, list[str]] = {
        int(i): [f"wrong number of fields, expected {len(header)}"] for i in np.flatnonzero(~good_width)
    }

    def flag(rows: npt.NDArray[np.int64], message: str) -> None:
        for r in rows:
            reasons.setdefault(int(record_of[r]), []).append(message)

    for attribute in spec.schema.attributes:
        values = by_name[attribute.name]
        outside = np.flatnonzero(~np.isin(values, np.asarray(attribute.categories, dtype=str)))
        for r in outside:
            flag(np.array([r]), f"{attribute.name}={str(values[r])!r} not in {sorted(attribute.categories)}")
    flag(np.flatnonzero(ids == ""), "empty id")
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    repeated = np.flatnonzero(first[inverse] != np.arange(ids.size))
    if repeated.size:
        first_lines = _line_numbers(path, record_of[first[inverse[repeated]]])
        for r, line in zip(repeated, first_lines, strict=True):
            flag(np.array([r]), f"duplicate id (first on line {line})")
    if reasons:
        bad = np.array(sorted(reasons), dtype=np.int64)
        lines = _line_numbers(path, bad)
        raise BadRowsError(str(path), [(line, ", ".join(reasons[int(i)])) for line, i in zip(lines, bad, strict=True)])
    return CuratorTable(spec.schema, ids, {a.name: by_name[a.name] for a in spec.schema.attributes})
