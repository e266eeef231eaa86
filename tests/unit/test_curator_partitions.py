"""Partitioned input (curator.partitions): a directory or glob of Parquet or CSV files (hive
key=value directories as columns) reads as the one table of its files in sorted order, with the
checks of a single file, errors naming their file, and a fingerprint of every file's name and bytes."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from secure_release.curator.cli import main as curator_main
from secure_release.curator.partitions import (
    MixedInputFormatsError,
    NoInputFilesError,
    Partition,
    UnreadableInputError,
    dataset_fingerprint,
    discover,
    is_partitioned,
    read_partition,
    read_partitioned,
)
from secure_release.curator.records.ledgerfile import file_fingerprint
from secure_release.curator.table import (
    BadRowsError,
    DataSourceError,
    EncodedTable,
    TableSpec,
    load_schema,
    raise_repeats,
    read_table,
)

ATTRIBUTES: list[dict[str, Any]] = [{"name": "edu", "categories": ["a", "b", "c"]},
                                    {"name": "mar", "categories": ["m", "s"]}]
SCHEMA: dict[str, Any] = {"curator": "alice", "id_column": "id", "attributes": ATTRIBUTES}


def _spec(tmp: Path, schema: dict[str, Any] = SCHEMA) -> TableSpec:
    (tmp / "s.json").write_text(json.dumps(schema))
    return load_schema(tmp / "s.json")


def _rows(start: int, count: int) -> pa.Table:
    """``count`` rows with ids p<start>... and attributes cycling through their categories."""
    index = np.arange(start, start + count)
    return pa.table({
        "id": [f"p{i}" for i in index],
        "edu": [("a", "b", "c")[i % 3] for i in index],
        "mar": [("m", "s")[i % 2] for i in index],
    })


def _same(left: EncodedTable, right: EncodedTable) -> None:
    assert left.ids.tolist() == right.ids.tolist()
    assert left.symbols().tolist() == right.symbols().tolist()
    assert left.symbols().dtype == right.symbols().dtype == np.uint32


def _three_parquet_files(base: Path) -> pa.Table:
    """Three Parquet files under ``base`` (written out of order) and the table they make together."""
    base.mkdir(parents=True)
    parts = [_rows(0, 7), _rows(7, 5), _rows(12, 9)]
    for name, part in zip(("part-2", "part-0", "part-1"), (parts[2], parts[0], parts[1]), strict=True):
        pq.write_table(part, base / f"{name}.parquet")
    return pa.concat_tables(parts)


def test_a_parquet_directory_reads_as_its_files_end_to_end(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    whole = _three_parquet_files(tmp_path / "data")
    pq.write_table(whole, tmp_path / "whole.parquet")
    expected = read_table(tmp_path / "whole.parquet", spec)
    assert expected.num_rows == 21
    _same(read_partitioned(tmp_path / "data", spec), expected)
    _same(read_table(tmp_path / "data", spec), expected)  # every read_table caller takes a directory
    (tmp_path / "data" / "_SUCCESS").write_text("")
    (tmp_path / "data" / ".part-0.parquet.crc").write_bytes(b"\0\1")
    (tmp_path / "data" / "notes.txt").write_text("not a table")
    _same(read_table(tmp_path / "data", spec), expected)


def test_a_csv_directory_and_a_glob(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "b.csv").write_text("id,edu,mar\nx3,c,s\n")
    (tmp_path / "csv" / "a.csv").write_text("id,edu,mar\nx1,a,m\n\nx2,b,s\n")
    (tmp_path / "whole.csv").write_text("id,edu,mar\nx1,a,m\nx2,b,s\nx3,c,s\n")
    _same(read_table(tmp_path / "csv", spec), read_table(tmp_path / "whole.csv", spec))
    _three_parquet_files(tmp_path / "pq")
    pattern = str(tmp_path / "pq" / "part-[01].parquet")
    assert [Path(p.path).name for p in discover(pattern)] == ["part-0.parquet", "part-1.parquet"]
    assert read_table(pattern, spec).ids.tolist() == [f"p{i}" for i in range(12)]
    assert read_table(str(tmp_path / "csv" / "*.csv"), spec).ids.tolist() == ["x1", "x2", "x3"]


def test_hive_directories_give_a_column(tmp_path: Path) -> None:
    schema = {**SCHEMA, "attributes": [*ATTRIBUTES, {"name": "region", "categories": ["north", "south east"]}]}
    spec = _spec(tmp_path, schema)
    for region, start in (("south%20east", 4), ("north", 0)):
        (tmp_path / "data" / f"region={region}").mkdir(parents=True)
        pq.write_table(_rows(start, 4), tmp_path / "data" / f"region={region}" / "part-0.parquet")
    partitions = discover(tmp_path / "data")
    assert [p.hive for p in partitions] == [(("region", "north"),), (("region", "south east"),)]
    table = read_table(tmp_path / "data", spec)
    assert table.ids.tolist() == [f"p{i}" for i in range(8)]
    assert table.columns["region"].tolist() == ["north"] * 4 + ["south east"] * 4
    pq.write_table(_rows(0, 8), tmp_path / "flat.parquet")
    _same(read_table(tmp_path / "data", _spec(tmp_path)), read_table(tmp_path / "flat.parquet", _spec(tmp_path)))
    id_schema = {**SCHEMA, "id_column": "region"}
    with pytest.raises(BadRowsError, match="duplicate id"):  # as the id: one value per directory repeats
        read_table(tmp_path / "data", _spec(tmp_path, id_schema))
    pq.write_table(pa.table({"id": ["q"], "edu": ["a"], "mar": ["m"], "region": ["north"]}),
                   tmp_path / "data" / "region=north" / "part-1.parquet")
    with pytest.raises(BadRowsError, match="both in the file and directory names"):
        read_table(tmp_path / "data", spec)


def test_row_group_partitions_of_one_parquet_file(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    pq.write_table(_rows(0, 95), tmp_path / "d.parquet", row_group_size=10)
    partitions = discover(tmp_path / "d.parquet", target_rows=25)
    assert [p.row_groups for p in partitions] == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9,)]
    assert [(p.first_row, p.num_rows) for p in partitions] == [(0, 30), (30, 30), (60, 30), (90, 5)]
    pieces = [read_partition(p, spec) for p in partitions]
    whole = read_table(tmp_path / "d.parquet", spec)
    assert [i for t in pieces for i in t.ids.tolist()] == whole.ids.tolist()
    assert np.concatenate([t.symbols() for t in pieces]).tolist() == whole.symbols().tolist()
    assert discover(tmp_path / "d.parquet") == [Partition(str(tmp_path / "d.parquet"), None, 0, 95, ())]
    assert pickle.loads(pickle.dumps(partitions[1])) == partitions[1]
    bad = _rows(0, 95).set_column(2, "mar", pa.array([("m", "s")[i % 2] if i != 47 else "q" for i in range(95)]))
    pq.write_table(bad, tmp_path / "d.parquet", row_group_size=10)
    with pytest.raises(BadRowsError) as info:
        read_partition(discover(tmp_path / "d.parquet", target_rows=25)[1], spec)
    assert info.value.path == str(tmp_path / "d.parquet")
    assert info.value.problems == [(49, "mar='q' not in ['m', 's']")]  # row 47 of the file, as read_table says
    with pytest.raises(BadRowsError) as whole_info:
        read_table(tmp_path / "d.parquet", spec)
    assert whole_info.value.problems == info.value.problems


def test_discover_order_is_sorted_and_skips_hidden_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name in ("z/b.csv", "a.csv", "z/a.csv", "m/_temporary/x.csv", ".hidden/y.csv", "b.CSV"):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text("id,edu,mar\n")
    found = [Path(p.path).relative_to(data).as_posix() for p in discover(data)]
    assert found == ["a.csv", "b.CSV", "z/a.csv", "z/b.csv"]
    assert discover(data) == discover(str(data))
    assert is_partitioned(data) and is_partitioned(f"{data}/*.csv") and not is_partitioned(data / "a.csv")
    assert not is_partitioned("")  # an empty --data is not the working directory
    assert all(p.num_rows is None and p.row_groups is None for p in discover(data))


def test_a_bad_row_names_its_file_and_line(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "1.csv").write_text("id,edu,mar\nx1,a,m\n")
    (tmp_path / "csv" / "2.csv").write_text("id,edu,mar\nx2,a,m\n\nx3,z,s\n")
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "csv", spec)
    assert info.value.path == str(tmp_path / "csv")
    assert info.value.files == [str(tmp_path / "csv" / "2.csv")]
    assert info.value.problems == [(4, "edu='z' not in ['a', 'b', 'c']")]  # the blank line counts
    assert f"{tmp_path / 'csv' / '2.csv'}:4" in str(info.value) and "'z' (1)" in str(info.value)
    _three_parquet_files(tmp_path / "pq")
    bad = _rows(7, 5).set_column(1, "edu", pa.array(["a", "b", "z", "c", "a"]))
    pq.write_table(bad, tmp_path / "pq" / "part-1.parquet")
    pq.write_table(_rows(12, 9).drop_columns(["mar"]), tmp_path / "pq" / "part-2.parquet")
    with pytest.raises(BadRowsError) as both:
        read_table(tmp_path / "pq", spec)
    assert both.value.files == [str(tmp_path / "pq" / "part-1.parquet"), str(tmp_path / "pq" / "part-2.parquet")]
    assert both.value.problems[0] == (4, "edu='z' not in ['a', 'b', 'c']")
    assert both.value.problems[1][0] == 1 and "missing column(s) ['mar']" in both.value.problems[1][1]


def test_a_repeated_id_names_both_files(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "1.csv").write_text("id,edu,mar\nx1,a,m\n\nx2,b,s\n")
    (tmp_path / "csv" / "2.csv").write_text("id,edu,mar\nx3,a,m\nx2,c,s\nx3,a,s\n")
    first, second = str(tmp_path / "csv" / "1.csv"), str(tmp_path / "csv" / "2.csv")
    expected = [(3, f"duplicate id (first on line 4 of {first})"), (4, "duplicate id (first on line 2)")]
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "csv", spec)
    assert info.value.problems == expected and info.value.files == [second, second]
    assert first in str(info.value) and second in str(info.value)
    table = read_table(tmp_path / "csv", spec, check_repeats=False)  # the curator finds repeats in its tag sort
    assert table.num_rows == 5
    with pytest.raises(BadRowsError) as deferred:
        raise_repeats(tmp_path / "csv", table)
    assert deferred.value.problems == expected and deferred.value.files == [second, second]
    (tmp_path / "csv" / "2.csv").write_text("id,edu,mar\nx3,a,m\nx4,c,s\n")
    raise_repeats(tmp_path / "csv", read_table(tmp_path / "csv", spec, check_repeats=False))


def test_no_files_mixed_formats_unreadable_files_and_a_query(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_text("")
    with pytest.raises(NoInputFilesError, match=r"\*\.parquet, \*\.pq or \*\.csv"):
        read_table(tmp_path / "empty", spec)
    with pytest.raises(NoInputFilesError, match="matches no table file"):
        discover(str(tmp_path / "empty" / "*.parquet"))
    with pytest.raises(NoInputFilesError, match="no such file"):
        discover(tmp_path / "absent")
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.csv").write_text("id,edu,mar\nx1,a,m\n")
    pq.write_table(_rows(0, 2), tmp_path / "mixed" / "b.parquet")
    with pytest.raises(MixedInputFormatsError, match="both Parquet"):
        read_table(tmp_path / "mixed", spec)
    (tmp_path / "mixed" / "a.csv").unlink()
    (tmp_path / "mixed" / "c.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(UnreadableInputError, match=r"c\.parquet"):
        discover(tmp_path / "mixed")
    (tmp_path / "mixed" / "c.parquet").unlink()
    with pytest.raises(DataSourceError, match="not a directory or glob"):
        read_table(tmp_path / "mixed", spec, query="SELECT 1")


def test_dataset_fingerprint(tmp_path: Path) -> None:
    _three_parquet_files(tmp_path / "data")
    one = tmp_path / "data" / "part-0.parquet"
    assert dataset_fingerprint(one) == file_fingerprint(one) == dataset_fingerprint(str(one))
    before = dataset_fingerprint(tmp_path / "data")
    assert before != file_fingerprint(one) and len(before) == 64
    assert dataset_fingerprint(str(tmp_path / "data" / "*.parquet")) == before  # the glob's prefix is its base
    shutil.move(tmp_path / "data", tmp_path / "moved")
    assert dataset_fingerprint(tmp_path / "moved") == before  # moving the directory changes nothing
    (tmp_path / "moved" / "_SUCCESS").write_text("written later")
    assert dataset_fingerprint(tmp_path / "moved") == before  # nor does a file that is not read
    (tmp_path / "moved" / "part-1.parquet").rename(tmp_path / "moved" / "part-9.parquet")
    renamed = dataset_fingerprint(tmp_path / "moved")
    assert renamed != before
    pq.write_table(_rows(100, 3), tmp_path / "moved" / "part-0.parquet")
    assert dataset_fingerprint(tmp_path / "moved") not in (before, renamed)


def test_budget_set_takes_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _three_parquet_files(tmp_path / "people")
    keystore = tmp_path / "ks"
    args = ["budget", "set", "--keystore", str(keystore), "--data", str(tmp_path / "people"), "--epsilon", "1.0"]
    assert curator_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fingerprint"] == dataset_fingerprint(tmp_path / "people")
    assert out["dataset"] == "people"
    glob_set = ["budget", "set", "--keystore", str(tmp_path / "ks3"), "--data", str(tmp_path / "people" / "*.parquet"),
                "--epsilon", "1.0"]
    assert curator_main(glob_set) == 0
    out = json.loads(capsys.readouterr().out)  # a glob's data set: its directory's (one population, one budget)
    assert out["dataset"] == "people" and out["fingerprint"] == dataset_fingerprint(tmp_path / "people")
    (tmp_path / "nothing").mkdir()
    missing = ["budget", "set", "--keystore", str(tmp_path / "ks2"), "--data", str(tmp_path / "nothing"),
               "--epsilon", "1.0"]
    assert curator_main(missing) == 2
    assert "NoInputFilesError" in capsys.readouterr().err and not (tmp_path / "ks2").exists()


REGION_SCHEMA: dict[str, Any] = {**SCHEMA,
                                 "attributes": [*ATTRIBUTES, {"name": "region", "categories": ["north", "south"]}]}


def _hive_csv(base: Path, north: str, south: str) -> tuple[Path, Path]:
    """Two hive-partitioned CSV files (``region=north``, ``region=south``) holding these texts."""
    files = []
    for region, text in (("north", north), ("south", south)):
        (base / f"region={region}").mkdir(parents=True, exist_ok=True)
        (base / f"region={region}" / "part-0.csv").write_text(text)
        files.append(base / f"region={region}" / "part-0.csv")
    return files[0], files[1]


def test_a_bad_value_in_a_hive_csv_file_is_its_one_line(tmp_path: Path) -> None:
    # the hive key is a column of the rows, not a field of the file's records: a bad value is
    # reported on its own line with its own reason (never every line as one field short)
    spec = _spec(tmp_path, REGION_SCHEMA)
    _, south = _hive_csv(tmp_path / "data", "id,edu,mar\nn1,a,m\nn2,b,s\n",
                         "id,edu,mar\ns1,a,m\n\ns2,b,bogus\ns3,c,s\n")
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "data", spec)
    assert info.value.problems == [(4, "mar='bogus' not in ['m', 's']")]  # the blank line counts
    assert info.value.files == [str(south)]
    assert f"mar: 1 row(s) not a category, line(s) {south}:4; values: 'bogus' (1)" in str(info.value)
    assert "wrong number of fields" not in str(info.value)
    with pytest.raises(BadRowsError) as one:
        read_partition(discover(tmp_path / "data")[1], spec)
    assert one.value.path == str(south) and one.value.problems == [(4, "mar='bogus' not in ['m', 's']")]
    south.write_text("id,edu,mar\ns1,a,m\ns2,b,s\n")
    table = read_table(tmp_path / "data", spec)
    assert table.ids.tolist() == ["n1", "n2", "s1", "s2"]
    assert table.columns["region"].tolist() == ["north", "north", "south", "south"]


def test_a_short_line_in_a_hive_csv_file_counts_the_files_own_fields(tmp_path: Path) -> None:
    spec = _spec(tmp_path, REGION_SCHEMA)
    _, south = _hive_csv(tmp_path / "data", "id,edu,mar\nn1,a,m\n", "id,edu,mar\ns1,a,m\ns2,b\ns3,c,q\n")
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "data", spec)
    assert info.value.problems == [(3, "wrong number of fields, expected 3, got 2"),
                                   (4, "mar='q' not in ['m', 's']")]
    assert info.value.files == [str(south), str(south)]
    flat = tmp_path / "flat.csv"  # as the same file read alone
    flat.write_text(south.read_text())
    with pytest.raises(BadRowsError) as alone:
        read_table(flat, _spec(tmp_path))
    assert alone.value.problems == info.value.problems


def test_a_repeated_id_across_hive_csv_files_names_both_lines(tmp_path: Path) -> None:
    spec = _spec(tmp_path, REGION_SCHEMA)
    north, south = _hive_csv(tmp_path / "data", "id,edu,mar\nn1,a,m\n\nx,b,s\n", "id,edu,mar\ns1,a,m\nx,c,s\n")
    expected = [(3, f"duplicate id (first on line 4 of {north})")]
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "data", spec)
    assert info.value.problems == expected and info.value.files == [str(south)]
    table = read_table(tmp_path / "data", spec, check_repeats=False)
    with pytest.raises(BadRowsError) as deferred:
        raise_repeats(tmp_path / "data", table)
    assert deferred.value.problems == expected and deferred.value.files == [str(south)]


def test_a_bad_value_in_a_hive_parquet_file_is_its_one_line(tmp_path: Path) -> None:
    spec = _spec(tmp_path, REGION_SCHEMA)
    for region, start in (("north", 0), ("south", 30)):
        (tmp_path / "data" / f"region={region}").mkdir(parents=True)
        rows = _rows(start, 30)
        if region == "south":
            edu = ["z" if i == 17 else e for i, e in enumerate(rows["edu"].to_pylist())]
            rows = rows.set_column(1, "edu", pa.array(edu))
        pq.write_table(rows, tmp_path / "data" / f"region={region}" / "part-0.parquet", row_group_size=10)
    south = str(tmp_path / "data" / "region=south" / "part-0.parquet")
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "data", spec)
    assert info.value.problems == [(19, "edu='z' not in ['a', 'b', 'c']")]  # row 17 + 2 (the header is line 1)
    assert info.value.files == [south]
    runs = [p for p in discover(tmp_path / "data", target_rows=10) if p.path == south]
    assert [p.first_row for p in runs] == [0, 10, 20]
    with pytest.raises(BadRowsError) as run:
        read_partition(runs[1], spec)
    assert run.value.path == south and run.value.problems == info.value.problems
    read_partition(runs[0], spec)
