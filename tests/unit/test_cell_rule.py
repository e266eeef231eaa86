"""The one cell rule (mechanism/cells.py): known answers per Arrow type, rule 7's equivalences,
and the findings of issue 33 through the notebook API and the curator's reader.

The differential test over every source is tests/unit/test_cell_rule_sources.py."""

from __future__ import annotations

import datetime
import warnings
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from secure_release import api
from secure_release.curator.columnar import BadRowsError, TableSpec, read_file
from secure_release.mechanism.cells import cell_text, equivalent_codes, number_key
from secure_release.mechanism.schema import CuratorSchema, attribute_from_dict


def _texts(array: pa.Array) -> list[str]:
    return [str(v) for v in cell_text(array)[0].to_pylist()]


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        (pa.array([3, -7, 0, None], pa.int8()), ["3", "-7", "0", ""]),
        (pa.array([2**64 - 1], pa.uint64()), ["18446744073709551615"]),
        (pa.array([3.0, -0.0, 2.5, 0.1, float("nan"), None, 1e20, float("inf")]),
         ["3", "0", "2.5", "0.1", "", "", "100000000000000000000", "inf"]),
        (pa.array(np.array([0.1, 3.0, 1.5], dtype=np.float32)), ["0.1", "3", "1.5"]),  # its own width's shortest
        (pa.array([Decimal("3.00"), Decimal("2.50"), Decimal("-0.10"), None], pa.decimal128(6, 2)),
         ["3", "2.5", "-0.1", ""]),
        (pa.array([True, False, None]), ["true", "false", ""]),
        (pa.array([datetime.date(2020, 1, 2), None]), ["2020-01-02", ""]),
        (pa.array([datetime.datetime(2020, 1, 2), datetime.datetime(2020, 1, 2, 10, 30),
                   datetime.datetime(2020, 1, 2, 10, 30, 5, 250000)], pa.timestamp("ns")),
         ["2020-01-02", "2020-01-02 10:30:00", "2020-01-02 10:30:05.25"]),
        (pa.array(["  male ", "\u3000f\u00a0", "", "   ", None]), ["male", "f", "", "", ""]),
        (pa.array(["b", "a", "b", None]).dictionary_encode(), ["b", "a", "b", ""]),
        (pa.array([b"x ", b" y"], pa.binary()), ["x", "y"]),
    ],
)
def test_cell_text_known_answers(array: pa.Array, expected: list[str]) -> None:
    assert _texts(array) == expected


def test_a_cell_that_is_not_utf8_is_flagged_not_guessed() -> None:
    text, bad = cell_text(pa.array([b"ok", b"\xff\xfe"], pa.binary()))
    assert text.to_pylist() == ["ok", ""] and bad.tolist() == [False, True]


@pytest.mark.parametrize(
    ("text", "key"),
    [("3", "3"), ("3.0", "3"), ("03", "3"), ("3e0", "3"), ("+3", "3"), ("-0.0", "0"), ("2.50", "2.5"),
     ("1E2", "100"), (".5", "0.5"), ("x", None), ("3.0.1", None), ("inf", None), ("nan", None), ("", None)],
)
def test_number_keys(text: str, key: str | None) -> None:
    assert number_key(text) == key


def test_equivalence_picks_the_one_category_of_equal_value_and_never_guesses_between_two() -> None:
    cells = pa.array(["3.0", "03", "4", "TRUE", "1.0", "x"])
    assert equivalent_codes(cells, ["1", "3", "true"]).tolist() == [1, 1, -1, 2, 0, -1]
    # "1" and "01" are both categories: a value equal to both matches only exactly (here: neither)
    assert equivalent_codes(pa.array(["1.0", "001"]), ["1", "01"]).tolist() == [-1, -1]


def _spec(curator: str, attributes: list[dict[str, object]], id_column: str = "pid") -> TableSpec:
    return TableSpec(CuratorSchema(curator, tuple(attribute_from_dict(a) for a in attributes)), id_column)


CODES = ["1", "10", "11", "12"]


def test_pandas3_text_with_missing_cells_keeps_every_character(tmp_path: Path) -> None:
    """Issue 33's Done-when: a pandas text column with missing cells and codes 1, 10, 11, 12 gives
    through api.release the codes the CSV path gives (today's frames.py cut every value to "1")."""
    rng = np.random.default_rng(33)
    n = 600
    codes = rng.choice(CODES, n).astype(object)
    codes[rng.choice(n, 25, replace=False)] = None
    frame = pd.DataFrame({"pid": [f"p{i}" for i in range(n)], "code": codes})
    assert frame["code"].isna().sum() == 25
    if int(pd.__version__.split(".")[0]) >= 3:
        assert str(frame["code"].dtype) == "str"  # pandas 3's text dtype, NaN for a missing cell
    schema = {"curator": "alice", "id_column": "pid",
              "attributes": [{"name": "code", "categories": CODES, "missing": "unknown"}]}
    frame.to_csv(tmp_path / "alice.csv", index=False)
    from_csv = read_file(tmp_path / "alice.csv", _spec("alice", schema["attributes"]))  # type: ignore[arg-type]
    from_frame = api.curator_tables({"alice": frame}, {"alice": schema})[0]
    np.testing.assert_array_equal(from_frame.symbols(), from_csv.symbols())
    expected = np.array([CODES.index(c) if c is not None else 4 for c in codes])
    np.testing.assert_array_equal(from_csv.symbols(), expected)  # every code kept whole: 10 is not 1
    other = pd.DataFrame({"pid": [f"p{i}" for i in range(n)], "sex": rng.choice(["f", "m"], n)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = api.release({"alice": frame, "bob": other},
                             {"alice": schema, "bob": {"curator": "bob", "id_column": "pid",
                                                       "attributes": [{"name": "sex", "categories": ["f", "m"]}]}},
                             epsilon=1.0, test_keys=5)  # fmt: skip
    truth = np.bincount(expected * 2 + (other["sex"].to_numpy() == "m"), minlength=10) / n
    np.testing.assert_allclose(result.truth, truth)


def test_a_pandas_csv_of_integer_codes_with_a_missing_cell_reads_as_its_dataframe(tmp_path: Path) -> None:
    """An integer column with a missing cell is float64 in pandas and "3.0" in its CSV: the CLI's
    reader and the API give the same codes (today the CLI refused every row)."""
    values = [3, 1, None, 2, 3]
    frame = pd.DataFrame({"pid": ["a", "b", "c", "d", "e"], "n": values})
    assert frame["n"].dtype == np.float64
    frame.to_csv(tmp_path / "t.csv", index=False)
    assert "3.0" in (tmp_path / "t.csv").read_text()
    attributes = [{"name": "n", "categories": ["1", "2", "3"], "missing": "unknown"}]
    from_csv = read_file(tmp_path / "t.csv", _spec("c", attributes))
    from_frame = api.curator_tables({"c": frame}, {"c": {"curator": "c", "id_column": "pid", "attributes": attributes}})
    np.testing.assert_array_equal(from_csv.symbols(), [2, 0, 3, 1, 2])
    np.testing.assert_array_equal(from_frame[0].symbols(), from_csv.symbols())


def test_the_api_and_the_reader_refuse_the_same_rows_with_the_same_summary(tmp_path: Path) -> None:
    frame = pd.DataFrame({"pid": ["a", "b", "c", "d"], "sex": ["male", "Male", " male", "x"]})
    frame.to_csv(tmp_path / "t.csv", index=False)
    attributes = [{"name": "sex", "categories": ["female", "male"]}]
    with pytest.raises(BadRowsError) as from_csv:
        read_file(tmp_path / "t.csv", _spec("c", attributes))
    with pytest.raises(BadRowsError) as from_frame:
        api.curator_tables({"c": frame}, {"c": {"curator": "c", "id_column": "pid", "attributes": attributes}})
    assert from_csv.value.problems == from_frame.value.problems == [
        (3, "sex='Male' not in ['female', 'male']"), (5, "sex='x' not in ['female', 'male']")]
    body = str(from_csv.value).split("\n", 1)[1]
    assert body == str(from_frame.value).split("\n", 1)[1]  # the same summary, only the source's name differs
    assert "hint: 'Male' differs from 'male' only in case or white space" in body


def test_the_schema_says_where_the_ids_are() -> None:
    frame = pd.DataFrame({"pid": ["a", "b"], "sex": ["f", "m"]})
    schema = {"curator": "c", "id_column": "pid", "attributes": [{"name": "sex", "categories": ["f", "m"]}]}
    assert api.curator_tables({"c": frame}, {"c": schema})[0].num_rows == 2  # no id_column keyword needed
    assert api.curator_tables({"c": frame}, {"c": schema}, id_column="pid")[0].num_rows == 2  # agreeing: fine
    with pytest.raises(api.IdColumnConflictError, match=r"column 'pid'.*id_column='id'"):
        api.curator_tables({"c": frame}, {"c": schema}, id_column="id")
    no_id = {"sex": ["f", "m"]}  # no id_column in the schema: the keyword fills it in
    assert api.curator_tables({"c": frame}, {"c": no_id}, id_column="pid")[0].num_rows == 2
    with pytest.raises(BadRowsError, match=r"missing column\(s\) \['id'\]"):
        api.curator_tables({"c": frame}, {"c": no_id})  # default "id"


def test_a_schema_file_names_its_id_column(tmp_path: Path) -> None:
    import json

    (tmp_path / "s.json").write_text(json.dumps(
        {"curator": "c", "id_column": "pid", "attributes": [{"name": "sex", "categories": ["f", "m"]}]}))
    frame = pd.DataFrame({"pid": ["a", "b"], "sex": ["f", "m"]})
    assert api.curator_tables({"c": frame}, {"c": tmp_path / "s.json"})[0].num_rows == 2


def test_a_draft_reads_the_same_categories_from_a_frame_and_from_its_csv(tmp_path: Path) -> None:
    """An integer column with a gap is float64 in pandas and "3.0" in its CSV: schema draft (which
    reads the CSV as text) and draft_schema on the DataFrame draft the same categories."""
    from secure_release.commands.schema import read_columns

    frame = pd.DataFrame({"id": ["a", "b", "c", "d"], "n": [3, 1, None, 12]})
    frame.to_csv(tmp_path / "t.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_frame = api.draft_schema(frame, "c")["attributes"]
        from_csv = api.draft_schema(read_columns(tmp_path / "t.csv"), "c")["attributes"]
    assert from_frame == from_csv == [{"name": "n", "categories": ["1", "3", "12"], "missing": "missing"}]
