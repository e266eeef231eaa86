"""`schema draft` that does not leak (issue 26, item 3): numeric columns binned only from a public
range, a public codebook's order, a natural order otherwise, and empty cells drafted as a
`missing` entry, never as a category."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from secure_release.api import DraftNeedsRangeError, draft_schema
from secure_release.cli import main
from secure_release.curator.table import load_schema, read_table

TABLE = {
    "id": [str(i) for i in range(40)],
    "mass": [f"{2700 + 91.3 * i:.1f}" for i in range(40)],  # 40 distinct numbers
    "size": ["10", "9", "100", "9"] * 10,
    "effort": ["heavy", "light", "medium", ""] * 10,
}


def _draft(**kw: object) -> dict[str, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return draft_schema(TABLE, "alice", **kw)  # type: ignore[arg-type]


def test_a_numeric_column_with_many_values_needs_a_public_range() -> None:
    with pytest.raises(DraftNeedsRangeError, match=r"--range mass=LOW:HIGH"):
        _draft()
    schema = _draft(ranges={"mass": (2500.0, 6500.0)}, bins=4)
    mass = schema["attributes"][0]  # type: ignore[index]
    assert mass == {"name": "mass", "bins": [2500, 3500, 4500, 5500, 6500]}
    assert min(float(v) for v in TABLE["mass"]) not in mass["bins"]  # never the data's own extremes


def test_natural_order_codebook_order_and_missing_entries() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schema = draft_schema(TABLE, "alice", ranges={"mass": (2500.0, 6500.0)},
                              codebook={"effort": ["light", "medium", "heavy"]})  # fmt: skip
    size, effort = schema["attributes"][1], schema["attributes"][2]
    assert size == {"name": "size", "categories": ["9", "10", "100"]}  # numbers numerically
    assert effort == {"name": "effort", "categories": ["light", "medium", "heavy"], "missing": "missing"}
    messages = [str(w.message) for w in caught]
    assert any("10 empty cell(s)" in m and "never as an empty category" in m for m in messages)
    assert any("DRAFT SCHEMA" in m for m in messages)
    assert "" not in json.dumps(schema["attributes"]).split('"')[1::2]  # no empty category anywhere


def test_the_drafted_schema_reads_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("id,mass,size,effort\n" + "".join(
        f"{i},{m},{s},{e}\n" for i, m, s, e in zip(TABLE["id"], TABLE["mass"], TABLE["size"], TABLE["effort"],
                                                   strict=True)))  # fmt: skip
    assert main(["schema", "draft", str(csv), "--curator", "alice"]) == 2
    assert "--range mass=LOW:HIGH" in capsys.readouterr().err
    out = tmp_path / "s.json"
    code = main(["schema", "draft", str(csv), "--curator", "alice", "--range", "mass=2500:6500", "--bins", "2",
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert "empty cell(s)" in err and "categories of ['size', 'effort'] read from" in err
    table = read_table(csv, load_schema(out))
    assert table.columns["mass"][0] == "[2500, 4500)" and table.columns["effort"][3] == "missing"
    assert main(["schema", "draft", str(csv), "--curator", "alice", "--range", "mass=a:b"]) == 2
