"""Count tables for the simulator: count CSVs, raw rows + schema JSON, bundled Adult, synthetic.

A count CSV has a header; its last column is ``count`` and the others are attributes. Each
attribute's domain is its distinct values in order of first appearance (rows with count 0 are
allowed and define cells); missing combinations count 0 and repeated rows add up. A split
(``a,b:c,d``) assigns attributes to curators; the joint code is curator-major (mixed radix).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.schema import CuratorSchema, JointSchema, attribute_from_dict
from secure_release.mechanism.simulation.datasets import synthetic_counts, two_curator_split

ADULT_CSV = Path(__file__).resolve().parent / "data" / "adult_counts.csv"
ADULT_SPLIT = "education,marital:sex,salary"


class TableError(SecureReleaseError):
    """A count table, rows file, schema or split is malformed."""


@dataclass(frozen=True)
class CountTable:
    """Joint counts (curator-major code order) with the curators' alphabet sizes."""

    name: str
    counts: npt.NDArray[np.int64]
    alphabet_sizes: tuple[int, ...]
    curator_names: tuple[str, ...]

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    @property
    def joint_size(self) -> int:
        return int(self.counts.size)


def _parse_split(split: str | None, names: list[str]) -> list[list[str]]:
    if split is None:
        half = max(1, len(names) // 2)
        groups = [names[:half], names[half:]] if len(names) > 1 else [names]
        return [g for g in groups if g]
    groups = [[a.strip() for a in part.split(",") if a.strip()] for part in split.split(":")]
    flat = [a for g in groups for a in g]
    if any(not g for g in groups) or sorted(flat) != sorted(names):
        raise TableError(
            f"--split {split!r} must list every attribute {names} exactly once, curators separated by ':'"
        )
    return groups


def read_counts_csv(
    path: str | Path, split: str | None = None, name: str | None = None
) -> CountTable:
    """Read a count CSV (last column ``count``) into a joint count table."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise TableError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise TableError(f"{path} is not UTF-8 text") from exc
    if not rows or len(rows[0]) < 2 or rows[0][-1].strip().lower() != "count":
        raise TableError(
            f"{path}: the header's last column must be 'count' after >= 1 attribute column"
        )
    header = [h.strip() for h in rows[0][:-1]]
    if len(set(header)) != len(header) or any(not h for h in header):
        raise TableError(
            f"{path}: attribute column names must be distinct and non-empty, got {header}"
        )
    domains: list[dict[str, int]] = [{} for _ in header]
    cells: list[tuple[tuple[int, ...], int]] = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not x.strip() for x in row):
            continue
        if len(row) != len(header) + 1:
            raise TableError(f"{path}:{lineno}: expected {len(header) + 1} fields, got {len(row)}")
        try:
            count = int(row[-1].strip())
        except ValueError as exc:
            raise TableError(f"{path}:{lineno}: count {row[-1]!r} is not an integer") from exc
        if count < 0:
            raise TableError(f"{path}:{lineno}: count {count} is negative; counts must be >= 0")
        idx = tuple(
            domains[j].setdefault(v.strip(), len(domains[j])) for j, v in enumerate(row[:-1])
        )
        cells.append((idx, count))
    shape = tuple(len(d) for d in domains)
    if not cells:
        raise TableError(f"{path}: no data rows")
    cube = np.zeros(shape, dtype=np.int64)
    for idx, count in cells:
        cube[idx] += count
    if cube.sum() < 1:
        raise TableError(f"{path}: the counts sum to 0; need at least one record")
    return _table_from_cube(name or Path(path).stem, cube, header, split)


def _table_from_cube(
    name: str, cube: npt.NDArray[np.int64], attrs: list[str], split: str | None
) -> CountTable:
    groups = _parse_split(split, attrs)
    order = [attrs.index(a) for g in groups for a in g]
    joint = np.transpose(cube, order).reshape(-1)
    sizes = tuple(int(np.prod([cube.shape[attrs.index(a)] for a in g])) for g in groups)
    if joint.size < 2:
        raise TableError("the table has a single cell; need a joint alphabet of at least 2 cells")
    return CountTable(name, joint.astype(np.int64), sizes, tuple("+".join(g) for g in groups))


def read_schema(path: str | Path) -> JointSchema:
    """Schema JSON: {"curators": [{"name": ..., "attributes": [{"name": ..., "categories": [...]}]}]}."""
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
        return JointSchema(
            tuple(
                CuratorSchema(
                    str(c["name"]),
                    tuple(attribute_from_dict(a) for a in c["attributes"]),
                )
                for c in spec["curators"]
            )
        )
    except OSError as exc:
        raise TableError(f"cannot read schema {path}: {exc.strerror}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, SecureReleaseError):
            raise
        raise TableError(
            f"schema {path} must be JSON {{'curators': [{{'name', 'attributes': [{{'name', 'categories'}}]}}]}}: {exc}"
        ) from exc


def read_rows(rows_path: str | Path, schema_path: str | Path) -> CountTable:
    """Raw rows (CSV with a header naming every schema attribute) counted into joint cells."""
    schema = read_schema(schema_path)
    try:
        with open(rows_path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            data = list(reader)
            fields = reader.fieldnames or []
    except OSError as exc:
        raise TableError(f"cannot read {rows_path}: {exc.strerror}") from exc
    missing = [a for a in schema.attribute_names if a not in fields]
    if missing:
        raise TableError(f"{rows_path}: missing column(s) {missing}; header has {fields}")
    if not data:
        raise TableError(f"{rows_path}: no data rows")
    columns = {a: [r[a].strip() for r in data] for a in schema.attribute_names}
    symbols = [c.encode(columns) for c in schema.curators]
    codes = np.zeros(len(data), dtype=np.int64)
    for sym, k in zip(symbols, schema.alphabet_sizes, strict=True):
        codes = codes * k + sym.astype(np.int64)
    counts = np.bincount(codes, minlength=schema.joint_size).astype(np.int64)
    if counts.size < 2:
        raise TableError("the schema has a single joint cell; need at least 2")
    return CountTable(
        Path(rows_path).stem, counts, schema.alphabet_sizes, tuple(c.name for c in schema.curators)
    )


def adult() -> CountTable:
    """The bundled UCI Adult table (n = 45,222, K = 24; Alice education x marital, Bob sex x salary)."""
    return read_counts_csv(ADULT_CSV, ADULT_SPLIT, name="adult")


def synthetic(kind: str, joint_size: int, n: int) -> CountTable:
    """A synthetic table (uniform / linear / peaky) of K cells and n records, two curators."""
    counts = synthetic_counts(kind, joint_size, n)
    return CountTable(kind, counts, two_curator_split(joint_size), ("alice", "bob"))


def dataset(name: str, joint_size: int | None = None, n: int | None = None) -> CountTable:
    """``adult`` or a synthetic kind; synthetic defaults K = 24, n = 45,222 (Adult's shape)."""
    if name == "adult":
        if joint_size not in (None, 24) or n not in (None, 45222):
            raise TableError(
                "the adult table has K = 24 and n = 45222; --K/--n apply to synthetic data"
            )
        return adult()
    return synthetic(name, 24 if joint_size is None else joint_size, 45222 if n is None else n)
