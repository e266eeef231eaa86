"""Columnar table reader: codes, bad rows with exact line numbers, Parquet and Arrow IPC."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from secure_release.curator.table import MAX_ID_BYTES, BadRowsError, load_schema, read_table

SCHEMA = {"curator": "alice", "id_column": "id",
          "attributes": [{"name": "edu", "categories": ["a", "b", "c"]},
                         {"name": "mar", "categories": ["m", "s"]}]}


def _spec(tmp: Path):  # type: ignore[no-untyped-def]
    (tmp / "s.json").write_text(json.dumps(SCHEMA))
    return load_schema(tmp / "s.json")


def _csv(tmp: Path, body: bytes):  # type: ignore[no-untyped-def]
    (tmp / "d.csv").write_bytes(b"id,edu,mar\n" + body)
    return read_table(tmp / "d.csv", _spec(tmp))


def test_codes_labels_and_trimming(tmp_path: Path) -> None:
    table = _csv(tmp_path, " x1 , a ,m\n\n\"x,2\",c,s\nü3,b,m\n".encode())
    assert table.ids.tolist() == ["x1", "x,2", "ü3"]
    assert table.symbols().tolist() == [0, 5, 2]
    assert table.symbols().dtype == np.uint32
    assert table.columns["edu"].tolist() == ["a", "c", "b"]
    assert table.symbols().tolist() == table.schema.encode(table.columns).tolist()


@pytest.mark.parametrize(
    "body,line,fragment",
    [
        (b"x1,a,m\nx2,\xe9,s\n", 3, "edu is not valid UTF-8"),
        (b"x1,a,m\n\xff\xfe,b,s\n", 3, "id is not valid UTF-8"),
        (b"x1,a,m\n,b,s\n", 3, "missing id"),
        (b"x1,a,m\n" + b"y" * (MAX_ID_BYTES + 1) + b",b,s\n", 3, f"longer than {MAX_ID_BYTES}"),
        (b"x1,a,m\n\nx1,b,s\n", 4, "duplicate id (first on line 2)"),
        (b"x1,a,m\nx2,b,q\n", 3, "mar='q' not in ['m', 's']"),
        (b"x1,a,m\nx2,b\n", 3, "wrong number of fields, expected 3, got 2"),
    ],
)
def test_bad_rows_named_with_lines(tmp_path: Path, body: bytes, line: int, fragment: str) -> None:
    with pytest.raises(BadRowsError) as info:
        _csv(tmp_path, body)
    assert [ln for ln, _ in info.value.problems] == [line]
    assert fragment in info.value.problems[0][1]


def test_many_bad_rows_all_listed_in_file_order(tmp_path: Path) -> None:
    rows = [f"r{i},{'abz'[i % 3]},m" for i in range(30_000)]
    with pytest.raises(BadRowsError) as info:
        _csv(tmp_path, ("\n".join(rows) + "\n").encode())
    lines = [ln for ln, _ in info.value.problems]
    assert lines == [i + 2 for i in range(2, 30_000, 3)]


def test_missing_column_and_empty_file(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("id,edu\nx,a\n")
    with pytest.raises(BadRowsError, match="missing column"):
        read_table(tmp_path / "d.csv", _spec(tmp_path))
    (tmp_path / "d.csv").write_text("")
    with pytest.raises(BadRowsError, match="empty file"):
        read_table(tmp_path / "d.csv", _spec(tmp_path))


def test_parquet_integer_ids_and_arrow_ipc(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    data = pa.table({"id": pa.array([10, 20, 30], pa.int64()), "edu": ["b", "c", "a"], "mar": ["s", "m", "s"]})
    pq.write_table(data, tmp_path / "d.parquet")
    feather.write_feather(data, tmp_path / "d.arrow")
    for name in ("d.parquet", "d.arrow"):
        table = read_table(tmp_path / name, spec)
        assert table.ids.tolist() == ["10", "20", "30"]
        assert table.symbols().tolist() == [3, 4, 1]
    bad = pa.table({"id": ["1", None, "1"], "edu": ["b", "c", None], "mar": ["s", "m", "s"]})
    pq.write_table(bad, tmp_path / "b.parquet")
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "b.parquet", spec)
    assert [ln for ln, _ in info.value.problems] == [3, 4]
    assert "missing id" in info.value.problems[0][1]
    assert "duplicate id (first on line 2)" in info.value.problems[1][1]
    assert "edu is missing (empty); declare \"missing\"" in info.value.problems[1][1]
