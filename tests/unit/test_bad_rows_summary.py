"""Errors a data owner can act on (issue 33, item 5), through the installed CLI's entry points
(in this process): one summary per column whatever the number of bad rows, hints, the 0600
``--bad-rows`` file, and ``schema draft --codebook`` checking the data against the codebook."""

from __future__ import annotations

import csv
import json
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from secure_release.cli import main
from secure_release.curator.badrows import BadCell, summary

CODES = [str(c) for c in range(1, 13)]


def _table(tmp_path: Path, rows: int = 6366) -> Path:
    """A CSV written by pandas whose every row is bad in two columns: the codes 13.0 and 2.5
    (a column of integer codes 1-12) and "Male" (the codebook says "male")."""
    rng = np.random.default_rng(7)
    frame = pd.DataFrame({
        "pid": [f"p{i}" for i in range(rows)],
        "code": rng.choice([13.0, 2.5], rows, p=[0.7, 0.3]),
        "sex": ["Male"] * (rows - 1) + ["x"],
        "age": rng.integers(20, 60, rows),
    })
    frame.to_csv(tmp_path / "people.csv", index=False)
    return tmp_path / "people.csv"


def _schema(tmp_path: Path) -> Path:
    schema = {"curator": "alice", "id_column": "pid", "attributes": [
        {"name": "code", "categories": CODES}, {"name": "sex", "categories": ["female", "male"]},
        {"name": "age", "bins": [17, 42, 67]}]}
    (tmp_path / "alice.json").write_text(json.dumps(schema))
    return tmp_path / "alice.json"


def test_schema_check_summarises_per_column_and_writes_every_cell(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    data, schema = _table(tmp_path), _schema(tmp_path)
    bad = tmp_path / "bad.csv"
    assert main(["schema", "check", str(data), str(schema), "--bad-rows", str(bad)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) <= 20 and max(len(line) for line in lines) < 300, err
    assert "6366 bad row(s) refused" in lines[0]
    assert "code: 6366 row(s) not a category, line(s) 2, 3, 4, 5, 6, ...; values: '13.0' (" in err
    assert "hint: '13.0' a number, but not one of this column's integer codes" in err
    assert "sex: 6366 row(s) not a category" in err and "'Male' (6365), 'x' (1)" in err
    assert "hint: 'Male' differs from 'male' only in case or white space" in err
    assert f"every bad cell (12732): {bad} (readable by you only)" in err
    assert stat.S_IMODE(bad.stat().st_mode) == 0o600
    with bad.open(newline="", encoding="utf-8") as fh:
        cells = list(csv.DictReader(fh))
    assert len(cells) == 2 * 6366
    codes = pd.read_csv(data)["code"]
    found = {(int(c["line"]), c["value"]) for c in cells if c["column"] == "code"}
    assert found == {(i + 2, f"{v:.1f}") for i, v in enumerate(codes)}  # every (line, value), as pandas wrote it


def test_a_non_integer_among_integer_codes_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.csv").write_text("pid,code,sex,age\na,2.5,male,30\nb,3.0,male,30\n")
    assert main(["schema", "check", str(tmp_path / "t.csv"), str(_schema(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "code: 1 row(s) not a category, line(s) 2; values: '2.5' (1)" in err  # 3.0 is the code 3: accepted
    assert "this column's categories are integer codes, and this value is not an integer" in err


def test_the_summary_stays_short_whatever_the_number_of_columns_and_rows() -> None:
    cells = [BadCell(line, f"c{column}", f"v{line % 50}", "not a category") for line in range(2, 20_002)
             for column in range(12)]
    text = summary("t.csv", 20_000, cells)
    assert len(text.splitlines()) <= 20
    assert "and 6 more column problem(s) in 120000 cell(s)" in text


def test_draft_with_a_codebook_refuses_data_outside_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _table(tmp_path, rows=400)
    (tmp_path / "codebook.json").write_text(json.dumps({"code": CODES, "sex": ["female", "male"]}))
    bad = tmp_path / "bad.csv"
    code = main(["schema", "draft", str(data), "--curator", "alice", "--id-column", "pid", "--attributes", "code,sex",
                 "--codebook", str(tmp_path / "codebook.json"), "--out", str(tmp_path / "draft.json"),
                 "--bad-rows", str(bad)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert not (tmp_path / "draft.json").exists()  # nothing half-written
    lines = err.strip().splitlines()
    assert sum(len(line) > 300 for line in lines) == 0 and len(lines) <= 25, err
    assert "code: 400 row(s) not a category" in err and "sex: 400 row(s) not a category" in err
    assert stat.S_IMODE(bad.stat().st_mode) == 0o600 and len(bad.read_text().splitlines()) == 801


def test_draft_with_a_codebook_the_data_fits_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.csv").write_text("pid,code\na,3.0\nb,12\nc,\n")
    (tmp_path / "codebook.json").write_text(json.dumps({"code": CODES}))
    assert main(["schema", "draft", str(tmp_path / "t.csv"), "--curator", "alice", "--id-column", "pid",
                 "--codebook", str(tmp_path / "codebook.json"), "--out", str(tmp_path / "d.json")]) == 0
    drafted = json.loads((tmp_path / "d.json").read_text())
    assert drafted["attributes"] == [{"name": "code", "categories": CODES, "missing": "missing"}]


def test_a_bad_rows_file_that_cannot_be_written_keeps_the_summary(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.csv").write_text("pid,code,sex,age\na,2.5,male,30\n")
    (tmp_path / "taken").mkdir()  # a directory where the file should go
    for target in (tmp_path / "no-such-dir" / "bad.csv", tmp_path / "taken"):
        assert main(["schema", "check", str(tmp_path / "t.csv"), str(_schema(tmp_path)), "--bad-rows",
                     str(target)]) == 2
        err = capsys.readouterr().err
        assert "code: 1 row(s) not a category" in err and f"--bad-rows {target}: not written (" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alice.json", "t.csv", "taken"]  # no temporary file left
    assert list((tmp_path / "taken").iterdir()) == []
