"""Numeric attributes binned at public edges, clamping and missing values by declaration
(issue 26, items 1 and 2): the schema fields, the curator's columnar reader and the guarantee."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from secure_release.curator.table import BadRowsError, SchemaFileError, load_schema, read_table
from secure_release.mechanism.errors import InvalidBinsError, UnknownCategoryError
from secure_release.mechanism.privacy.guarantee import privacy_guarantee
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.schema import (
    Attribute,
    attribute_from_dict,
    attribute_to_dict,
    bin_labels,
)

EDGES = [2500, 3500, 4500, 5500, 6500]
LABELS = ["[2500, 3500)", "[3500, 4500)", "[4500, 5500)", "[5500, 6500]"]


def _schema(tmp_path: Path, *attributes: dict[str, object]) -> Path:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"curator": "alice", "id_column": "id", "attributes": list(attributes)}))
    return path


def _read(tmp_path: Path, text: str, *attributes: dict[str, object]) -> dict[str, list[str]]:
    (tmp_path / "t.csv").write_text(text)
    table = read_table(tmp_path / "t.csv", load_schema(_schema(tmp_path, *attributes)))
    return {name: table.columns[name].tolist() for name in table.columns}


def _problems(tmp_path: Path, text: str, *attributes: dict[str, object]) -> list[tuple[int, str]]:
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "t.csv", load_schema(_schema(tmp_path, *attributes)))
    return info.value.problems


def test_labels_are_half_open_and_the_last_bin_closed() -> None:
    assert list(bin_labels(EDGES)) == LABELS
    assert bin_labels([0, 0.5, 1.25]) == ("[0, 0.5)", "[0.5, 1.25]")
    assert Attribute.binned("mass", EDGES).categories == tuple(LABELS)


def test_edges_fall_in_the_bin_they_open_and_the_top_edge_in_the_last(tmp_path: Path) -> None:
    rows = "id,mass\n" + "".join(f"{i},{v}\n" for i, v in enumerate(
        ["2500", "3499.999", "3500", "4500.0", "6499.5", "6500", " 5000 ", "2.5e3"]))
    got = _read(tmp_path, rows, {"name": "mass", "bins": EDGES})["mass"]
    assert got == [LABELS[0], LABELS[0], LABELS[1], LABELS[2], LABELS[3], LABELS[3], LABELS[2], LABELS[0]]


def test_out_of_range_values_are_refused_with_their_lines(tmp_path: Path) -> None:
    rows = "id,mass\n1,3000\n2,2499.99\n3,6500.01\n4,nan\n5,inf\n6,heavy\n7,4000\n"
    problems = _problems(tmp_path, rows, {"name": "mass", "bins": EDGES})
    assert [line for line, _ in problems] == [3, 4, 5, 6, 7]
    assert "mass=2499.99 is outside the bins; allowed: a number in [2500, 6500]" in problems[0][1]
    assert 'declare "clamp": true' in problems[1][1]
    assert "mass='heavy' is not a number" in problems[4][1]


def test_clamp_counts_values_outside_in_the_outer_bins_but_never_a_non_number(tmp_path: Path) -> None:
    attribute = {"name": "mass", "bins": EDGES, "clamp": True}
    got = _read(tmp_path, "id,mass\n1,-5\n2,99999\n3,4000\n", attribute)["mass"]
    assert got == [LABELS[0], LABELS[3], LABELS[1]]
    problems = _problems(tmp_path, "id,mass\n1,-5\n2,inf\n3,nan\n", attribute)
    assert [line for line, _ in problems] == [3, 4]
    assert "allowed: a finite number" in problems[0][1]


def test_empty_cells_are_refused_unless_a_missing_label_is_declared(tmp_path: Path) -> None:
    rows = "id,mass,sp\n1,3000,Adelie\n2,,Gentoo\n3,4000,\n4,?,NA\n"
    problems = _problems(tmp_path, rows, {"name": "mass", "bins": EDGES}, {"name": "sp", "categories": ["Adelie"]})
    assert [line for line, _ in problems] == [3, 4, 5]
    assert 'mass is missing (empty); declare "missing": LABEL' in problems[0][1]
    assert "sp is missing (empty)" in problems[1][1]
    assert "sp='Gentoo' not in ['Adelie']" in problems[0][1]
    got = _read(
        tmp_path, rows,
        {"name": "mass", "bins": EDGES, "missing": "unknown", "missing_tokens": ["?"]},
        {"name": "sp", "categories": ["Adelie", "Gentoo"], "missing": "n/a", "missing_tokens": ["NA"]},
    )
    assert got == {"mass": [LABELS[0], "unknown", LABELS[1], "unknown"], "sp": ["Adelie", "Gentoo", "n/a", "n/a"]}


def test_a_token_not_declared_missing_is_still_refused(tmp_path: Path) -> None:
    rows = "id,sp\n1,Adelie\n2,?\n3,\n"
    problems = _problems(tmp_path, rows, {"name": "sp", "categories": ["Adelie"], "missing": "n/a"})
    assert problems == [(3, "sp='?' not in ['Adelie', 'n/a']")]


def test_parquet_numeric_columns_are_binned_and_nulls_are_missing(tmp_path: Path) -> None:
    data = pa.table({"id": ["a", "b", "c", "d"], "mass": pa.array([2600, None, 6500, 4000], pa.int64()),
                     "year": pa.array([2007.0, 2008.5, None, 2009.0])})
    pq.write_table(data, tmp_path / "t.parquet")
    spec = load_schema(_schema(tmp_path, {"name": "mass", "bins": EDGES, "missing": "unknown"},
                               {"name": "year", "bins": [2007, 2008, 2010]}))
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "t.parquet", spec)
    assert info.value.problems == [(4, 'year is missing (empty); declare "missing": LABEL in the schema '
                                       "to keep such rows")]
    pq.write_table(data.set_column(2, "year", pa.array([2007.0, 2008.5, 2010.0, 2009.0])), tmp_path / "t.parquet")
    table = read_table(tmp_path / "t.parquet", spec)
    assert table.columns["mass"].tolist() == [LABELS[0], "unknown", LABELS[3], LABELS[1]]
    assert table.columns["year"].tolist() == ["[2007, 2008)", "[2008, 2010]", "[2008, 2010]", "[2008, 2010]"]
    assert table.symbols().tolist() == [0, 9, 7, 3]  # mixed radix: mass (5 codes) x year (2)


def test_binning_over_many_pieces_matches_numpy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import secure_release.curator.columnar as columnar_module

    monkeypatch.setattr(columnar_module, "_PIECE", 1000)
    rng = np.random.default_rng(7)
    values = rng.uniform(2500, 6500, 5500).round(2)
    (tmp_path / "t.csv").write_text("id,mass\n" + "".join(f"{i},{v}\n" for i, v in enumerate(values)))
    table = read_table(tmp_path / "t.csv", load_schema(_schema(tmp_path, {"name": "mass", "bins": EDGES})))
    expected = np.minimum(np.digitize(values, EDGES) - 1, 3)
    assert np.array_equal(table.symbols(), expected)


def test_malformed_bins_and_missing_fields_are_named(tmp_path: Path) -> None:
    bad = [
        ({"name": "m", "bins": [1]}, "at least two edges"),
        ({"name": "m", "bins": [1, 1, 2]}, "strictly increasing"),
        ({"name": "m", "bins": [1, "x"]}, "bins must be numbers"),
        ({"name": "m", "bins": [1, 2], "categories": ["a"]}, "either categories or bins"),
        ({"name": "m", "categories": ["a"], "clamp": True}, "clamp needs bins"),
        ({"name": "m", "bins": [1, 2], "clamp": "yes"}, "clamp must be true or false"),
        ({"name": "m", "categories": ["a", ""]}, 'declare "missing"'),
        ({"name": "m", "categories": ["a"], "missing": "a"}, "must be the last category and no other"),
        ({"name": "m", "categories": ["a"], "missing_tokens": ["?"]}, 'need a "missing" label'),
        ({"name": "m", "categories": ["a"], "missing": "na", "missing_tokens": ["a"]}, "also categories"),
        ({"name": "m", "categories": ["a"], "edges": [1]}, "unknown field(s) ['edges']"),
    ]
    for entry, message in bad:
        with pytest.raises(SchemaFileError, match=None) as info:
            load_schema(_schema(tmp_path, entry))
        assert message in str(info.value), (entry, str(info.value))
    with pytest.raises(InvalidBinsError):
        attribute_from_dict({"name": "m", "bins": [0, float("inf")]})


def test_schema_entries_round_trip() -> None:
    for entry in (
        {"name": "mass", "bins": EDGES, "clamp": True, "missing": "unknown", "missing_tokens": ["?", "NA"]},
        {"name": "ratio", "bins": [0, 0.25, 1]},
        {"name": "sp", "categories": ["b", "a"], "missing": "n/a"},
    ):
        assert attribute_to_dict(attribute_from_dict(entry)) == entry


def test_in_memory_encode_bins_numbers_and_counts_missing() -> None:
    attribute = Attribute.binned("mass", EDGES, missing="unknown", missing_tokens=("?",))
    assert attribute.encode(np.array([2500, 6500.0, np.nan])).tolist() == [0, 3, 4]
    assert attribute.encode(["3600", "", "?", "[5500, 6500]"]).tolist() == [1, 4, 4, 3]
    with pytest.raises(UnknownCategoryError, match="outside the bins"):
        Attribute.binned("mass", EDGES).encode(np.array([7000]))
    with pytest.raises(UnknownCategoryError, match="outside its categories"):
        Attribute("sp", ("a",)).encode(["a", ""])


def test_the_guarantee_states_what_clamping_does() -> None:
    plan = plan_release(1000, [5, 2], 1.0)
    assert "preprocessing" not in privacy_guarantee(plan)
    clamped = Attribute.binned("mass", EDGES, clamp=True).describe()
    assert clamped is not None
    assert "a value below 2500 is counted in [2500, 3500) and one above 6500 in [5500, 6500]" in clamped
    g = privacy_guarantee(plan, [clamped])
    assert g["preprocessing"]["attributes"] == [clamped]
    assert "data-independent" in g["preprocessing"]["rule"]
    assert "refused" in (Attribute.binned("mass", EDGES).describe() or "")


def test_date_columns_bin_by_day_from_text_and_from_arrow_dates(tmp_path: Path) -> None:
    import datetime

    edges = ["2007-01-01", "2008-01-01", "2010-01-01"]
    attribute = {"name": "seen", "bins": edges, "missing": "unknown"}
    rows = "id,seen\n1,2007-01-01\n2,2009-12-31\n3,2010-01-01\n4,\n5,2008-01-01\n"
    got = _read(tmp_path, rows, attribute)["seen"]
    assert got == ["[2007-01-01, 2008-01-01)", "[2008-01-01, 2010-01-01]", "[2008-01-01, 2010-01-01]", "unknown",
                   "[2008-01-01, 2010-01-01]"]  # fmt: skip
    rows = "id,seen\n1,2006-12-31\n2,31/12/2008\n3,2008-06-01\n"
    problems = _problems(tmp_path, rows, {"name": "seen", "bins": edges})
    assert problems[0] == (2, 'seen=2006-12-31 is outside the bins; allowed: a date in [2007-01-01, 2010-01-01] '
                              '(or declare "clamp": true)')  # fmt: skip
    assert problems[1][0] == 3 and "seen='31/12/2008' is not a date (YYYY-MM-DD)" in problems[1][1]
    days = pa.array([datetime.date(2007, 5, 1), datetime.date(2011, 1, 1)], pa.date32())
    pq.write_table(pa.table({"id": ["a", "b"], "seen": days}), tmp_path / "d.parquet")
    spec = load_schema(_schema(tmp_path, {"name": "seen", "bins": edges, "clamp": True}))
    table = read_table(tmp_path / "d.parquet", spec)
    assert table.columns["seen"].tolist() == ["[2007-01-01, 2008-01-01)", "[2008-01-01, 2010-01-01]"]
    assert attribute_to_dict(spec.schema.attributes[0]) == {"name": "seen", "bins": edges, "clamp": True}
