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
from pathlib import Path
from typing import Any

import numpy as np

from mechanism.errors import SecureReleaseError
from mechanism.protocol import CuratorTable
from mechanism.schema import Attribute, CuratorSchema


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
    schema: CuratorSchema
    id_column: str


def load_schema(path: str | Path) -> TableSpec:
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


def schema_to_dict(spec: TableSpec) -> dict[str, Any]:
    return {
        "curator": spec.schema.name,
        "id_column": spec.id_column,
        "attributes": [{"name": a.name, "categories": list(a.categories)} for a in spec.schema.attributes],
    }


def _read_rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and (line number, values) rows; line numbers count the header as line 1."""
    if path.suffix.lower() in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover
            raise SchemaFileError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from exc
        table = pq.read_table(path)
        header = list(table.column_names)
        cols = [table.column(c).to_pylist() for c in header]
        rows = [(i + 2, ["" if v is None else str(v) for v in vals]) for i, vals in enumerate(zip(*cols, strict=True))]
        return header, rows
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration as exc:
            raise BadRowsError(str(path), [(1, "empty file: no header")]) from exc
        rows = [(reader.line_num, row) for row in reader if row]
    return header, rows


def read_table(data_path: str | Path, spec: TableSpec) -> CuratorTable:
    """The curator's table; raises :class:`BadRowsError` listing every bad line."""
    path = Path(data_path)
    header, rows = _read_rows(path)
    needed = [spec.id_column] + [a.name for a in spec.schema.attributes]
    missing = [c for c in needed if c not in header]
    if missing:
        raise BadRowsError(str(path), [(1, f"missing column(s) {missing}; header is {header}")])
    idx = {c: header.index(c) for c in needed}
    allowed = {a.name: set(a.categories) for a in spec.schema.attributes}
    problems: list[tuple[int, str]] = []
    ids: list[str] = []
    cols: dict[str, list[str]] = {a.name: [] for a in spec.schema.attributes}
    seen: dict[str, int] = {}
    for line, row in rows:
        if len(row) != len(header):
            problems.append((line, f"{len(row)} fields, expected {len(header)}"))
            continue
        rid = row[idx[spec.id_column]].strip()
        bad = [
            f"{a}={row[idx[a]].strip()!r} not in {sorted(allowed[a])}"
            for a in allowed
            if row[idx[a]].strip() not in allowed[a]
        ]
        if not rid:
            bad.append("empty id")
        elif rid in seen:
            bad.append(f"duplicate id (first on line {seen[rid]})")
        if bad:
            problems.append((line, ", ".join(bad)))
            continue
        seen[rid] = line
        ids.append(rid)
        for a in cols:
            cols[a].append(row[idx[a]].strip())
    if problems:
        raise BadRowsError(str(path), problems)
    return CuratorTable(
        spec.schema,
        np.asarray(ids, dtype=str),
        {a: np.asarray(v, dtype=str) for a, v in cols.items()},
    )
