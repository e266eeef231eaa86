"""Table reader fast paths: they give exactly what the full path gives (trimming, category
look-up, repeat check, dictionary columns, lazy numpy ids), and DuckDB query input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secure_release.curator import columnar as columnar_module
from secure_release.curator.table import BadRowsError, DataSourceError, EncodedTable, load_schema, read_table
from secure_release.mechanism import cells as cells_module
from secure_release.mechanism.alignment.keyed_hash import id_tags
from secure_release.mechanism.primitives.keys import AlignmentKey

SCHEMA = {"curator": "alice", "id_column": "id",
          "attributes": [{"name": "edu", "categories": ["a", "b", " c", "d e"]},
                         {"name": "mar", "categories": ["m", "s"]}]}
_PIECES = ["x", "é", "7", " ", "\t", "\u00a0", "\u3000", "\u2003", ","]
_VALUES = ["a", "b", " c", "c", "d e", " a ", "\u00a0b", "a\u3000", "z", "", "é"]


def _spec(tmp: Path):  # type: ignore[no-untyped-def]
    (tmp / "s.json").write_text(json.dumps(SCHEMA))
    return load_schema(tmp / "s.json")


def _outcome(path: Path, spec, **kw):  # type: ignore[no-untyped-def]
    try:
        t = read_table(path, spec, **kw)
    except BadRowsError as exc:
        return ("bad", exc.problems)
    return ("ok", t.ids.tolist(), t.symbols().tolist())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.sampled_from(_PIECES), min_size=0, max_size=4),
                          st.sampled_from(_VALUES), st.sampled_from(["m", "s", " s", "q"])),
                min_size=1, max_size=30))
def test_fast_paths_equal_full_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    rows: list[tuple[list[str], str, str]]) -> None:
    # ids with (Unicode) whitespace at either end, categories that trimming changes (" c"):
    # the outcome must equal the always-trim, full-lookup, always-exact-repeat-check reader
    spec = _spec(tmp_path)
    data = pa.table({"id": ["".join(p) for p, _, _ in rows], "edu": [e for _, e, _ in rows],
                     "mar": [m for _, _, m in rows]})
    pacsv.write_csv(data, tmp_path / "d.csv")
    pq.write_table(data, tmp_path / "d.parquet")
    fast = [_outcome(tmp_path / name, spec) for name in ("d.csv", "d.parquet")]
    with monkeypatch.context() as m:
        m.setattr(cells_module, "may_need_trim", lambda arr: True)
        m.setattr(columnar_module, "_may_repeat", lambda ids: True)
        m.setattr(columnar_module, "_lookup", lambda values, plain, codes: np.full(len(values), -1, dtype=np.int64))
        full = [_outcome(tmp_path / name, spec) for name in ("d.csv", "d.parquet")]
    assert fast == full


def test_repeat_key_collision_reports_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # if the 64-bit repeat keys ever collide without a repeated id, the exact pass finds none
    (tmp_path / "d.csv").write_text("id,edu,mar\nx1,a,m\nx2,b,s\n")
    monkeypatch.setattr(columnar_module, "_may_repeat", lambda ids: True)
    assert read_table(tmp_path / "d.csv", _spec(tmp_path)).ids.tolist() == ["x1", "x2"]


def test_repeats_found_in_large_table_with_line_numbers(tmp_path: Path) -> None:
    n = 100_000
    ids = np.char.add("id", np.arange(n).astype(str))
    ids[77_777] = ids[12]
    data = pa.table({"id": ids, "edu": np.full(n, "a"), "mar": np.full(n, "m")})
    pacsv.write_csv(data, tmp_path / "d.csv")
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "d.csv", _spec(tmp_path))
    assert info.value.problems == [(77_779, "duplicate id (first on line 14)")]


def test_parquet_dictionary_columns_over_row_groups(tmp_path: Path) -> None:
    n = 5000
    rng = np.random.default_rng(3)
    edu = np.asarray(["a", "b", "d e"])[rng.integers(0, 3, n)].astype(object)
    edu[[10, 4000]] = None
    data = pa.table({"id": np.char.add("r", np.arange(n).astype(str)), "edu": pa.array(edu, pa.string()),
                     "mar": np.asarray(["m", "s"])[rng.integers(0, 2, n)]})
    pq.write_table(data, tmp_path / "d.parquet", row_group_size=700)
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "d.parquet", _spec(tmp_path))
    assert [ln for ln, _ in info.value.problems] == [12, 4002]
    assert "edu is missing (empty)" in info.value.problems[0][1]
    edu[[10, 4000]] = "a"
    pq.write_table(data.set_column(1, "edu", pa.array(edu, pa.string())), tmp_path / "d.parquet", row_group_size=700)
    table = read_table(tmp_path / "d.parquet", _spec(tmp_path))
    assert table.columns["edu"].tolist() == edu.tolist()


def test_ids_stay_arrow_and_hash_like_numpy(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("id,edu,mar\nx1,a,m\nü2,b,s\n")
    table = read_table(tmp_path / "d.csv", _spec(tmp_path))
    assert isinstance(table, EncodedTable) and isinstance(table.id_values(), pa.Array)
    assert table.num_rows == 2
    key = AlignmentKey(bytes(32))
    assert np.array_equal(id_tags(table.id_values(), key), id_tags(table.ids, key))
    assert table.ids is table.ids  # converted once


def test_a_table_without_ids_keeps_rows_codes_and_symbols(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("id,edu,mar\nx1,a,m\nx2,b,s\nx3,a,m\n")
    table = read_table(tmp_path / "d.csv", _spec(tmp_path))
    slim = table.without_ids()
    assert len(slim.id_values()) == 0 and slim.num_rows == table.num_rows == 3
    assert np.array_equal(slim.symbols(), table.symbols())
    assert list(slim.columns["edu"]) == list(table.columns["edu"]) == ["a", "b", "a"]
    assert table.columns["edu"].dtype.kind == "U" and len(table.ids) == 3  # the original is untouched


duckdb = pytest.importorskip("duckdb")


def _database(tmp: Path, rows: list[tuple[object, str | None, str]]) -> Path:
    path = tmp / "people.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE people (pid VARCHAR, edu VARCHAR, mar VARCHAR, other INTEGER)")
        con.executemany("INSERT INTO people VALUES (?, ?, ?, 1)", [[str(i), e, m] for i, e, m in rows])
    return path


def test_duckdb_query_reads_like_a_file(tmp_path: Path) -> None:
    db = _database(tmp_path, [("x1", "a", "m"), ("x2", "d e", "s"), ("x3", " b ", "m")])
    table = read_table(db, _spec(tmp_path), query="SELECT pid AS id, edu, mar FROM people ORDER BY pid")
    assert table.ids.tolist() == ["x1", "x2", "x3"]
    assert table.columns["edu"].tolist() == ["a", "d e", "b"]
    (tmp_path / "d.csv").write_text("id,edu,mar\nx1,a,m\nx2,d e,s\nx3, b ,m\n")
    assert table.symbols().tolist() == read_table(tmp_path / "d.csv", _spec(tmp_path)).symbols().tolist()


def test_duckdb_bad_rows_and_bad_sources_are_named(tmp_path: Path) -> None:
    db = _database(tmp_path, [("x1", "a", "m"), ("x1", "q", "s"), ("", None, "m")])
    with pytest.raises(BadRowsError) as info:
        read_table(db, _spec(tmp_path), query="SELECT pid AS id, edu, mar FROM people ORDER BY edu NULLS LAST")
    assert [ln for ln, _ in info.value.problems] == [3, 4]
    assert "duplicate id (first on line 2)" in info.value.problems[0][1]
    assert "missing id" in info.value.problems[1][1] and "edu is missing (empty)" in info.value.problems[1][1]
    with pytest.raises(DataSourceError, match="needs a query"):
        read_table(db, _spec(tmp_path))
    with pytest.raises(DataSourceError, match="query failed"):
        read_table(db, _spec(tmp_path), query="SELECT * FROM nowhere")
    with pytest.raises(DataSourceError, match="no such DuckDB"):
        read_table(tmp_path / "absent.duckdb", _spec(tmp_path), query="SELECT 1")
    with pytest.raises(BadRowsError, match="missing column"):
        read_table(db, _spec(tmp_path), query="SELECT pid AS id, edu FROM people")
