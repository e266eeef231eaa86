"""`plan --power A,B` and `plan --suggest --power A,B`: the detectable Cramer's V of a pair of
attributes, printed from the --schema files (the command run in-process, as test_plan_suggest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_plan_suggest import WALK_ALICE, WALK_BOB, _write  # the walk-through's schemas, one copy

from secure_release.cli import main
from secure_release.curator.table import load_schema
from secure_release.mechanism.analysis.power import power_plan

ALICE = {"curator": "alice", "id_column": "id", "attributes": [
    {"name": "education", "categories": ["a", "b", "c"]},
    {"name": "marital", "categories": ["m", "s"]},
]}  # fmt: skip
BOB = {"curator": "bob", "id_column": "id", "attributes": [
    {"name": "sex", "categories": ["f", "m"]},
    {"name": "salary", "categories": ["lo", "hi"]},
]}  # fmt: skip
def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code  # type: ignore[assignment]
    out = capsys.readouterr()
    return code, out.out, out.err


def _plan(paths: list[str], n: int, epsilon: float, *extra: str) -> list[str]:
    return ["plan", "--n", str(n), "--epsilon", repr(epsilon), *extra, *(a for p in paths for a in ("--schema", p))]


def test_plan_power_json_is_the_power_plan_and_leaves_the_plan_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _write(tmp_path, ALICE, BOB)
    code, plain, _ = _run(capsys, _plan(paths, 45222, 1.0, "--json"))
    assert code == 0
    code, text, _ = _run(capsys, _plan(paths, 45222, 1.0, "--json", "--power", "education,sex"))
    assert code == 0
    with_power = json.loads(text)
    pair = with_power.pop("power")
    assert with_power == json.loads(plain)
    schemas = [load_schema(p).schema for p in paths]
    assert pair == json.loads(json.dumps(power_plan(45222, schemas, 1.0, "education", "sex").to_dict()))
    assert pair["attributes"] == ["education", "sex"] and pair["levels"] == [3, 2] and pair["df"] == 2
    assert pair["m"] == pair["m_star"] == with_power["m"] == 3899 and pair["best_m"] == 3238
    assert pair["assumption"] == "uniform marginals" and pair["same_curator"] is False
    assert pair["min_detectable_cramers_v"] == pytest.approx(0.1096, abs=5e-4)  # sqrt(9.635 / (3899 a^2)), a = .454


def test_plan_power_prints_a_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = _write(tmp_path, ALICE, BOB)
    code, out, _ = _run(capsys, _plan(paths, 45222, 1.0, "--power", "education,sex"))
    assert code == 0
    block = out.split("\nPower: ", 1)[1]
    assert block.startswith("likelihood-ratio test of independence of education x sex (3 x 2 levels, df = 2)")
    assert "assumes uniform marginals" in block
    assert "at m = 3899 (m*), a = 0.454  V = 0.11  (asymptotic)" in block
    assert "at best m = 3238, a = 0.5" in block and "V at m* / V at best m = 1.0043" in block
    # with --m: the m asked, the best m and m*
    code, out, _ = _run(capsys, _plan(paths, 45222, 1.0, "--power", "sex,education", "--m", "1000"))
    block = out.split("\nPower: ", 1)[1]
    assert code == 0 and "of sex x education (2 x 3 levels" in block
    assert "at m = 1000, a = " in block and "at best m = 3238" in block and "at m* = 3899" in block


def test_a_pair_of_one_curator_is_allowed_and_said_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = _write(tmp_path, ALICE, BOB)
    code, out, _ = _run(capsys, _plan(paths, 45222, 1.0, "--power", "education,marital"))
    assert code == 0 and "held by the same curator" in out and "needs no cross-curator release" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--power", "educ,sex"], "no attribute 'educ' in the schemas: they have ['education', 'marital', 'sex', "
                                  "'salary']"),
        (["--power", "sex,sex"], "two different attributes, got 'sex' twice"),
        (["--power", "sex"], "--power takes two attribute names separated by a comma"),
        (["--power", "sex,education", "--alphabet", "6,4"], "instead of --alphabet"),
    ],
)
def test_plan_power_refuses_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                        message: str) -> None:  # fmt: skip
    code, _, err = _run(capsys, _plan(_write(tmp_path, ALICE, BOB), 45222, 1.0, *flags))
    assert code == 2 and message in err and err.startswith("secure-release plan")


def test_plan_power_needs_schemas(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, ["plan", "--n", "45222", "--epsilon", "1", "--alphabet", "6,4", "--power", "a,b"])
    assert code == 2 and "--power A,B names attributes of the --schema files" in err
    assert "alphabet sizes carry no attribute names" in err


def test_suggest_power_gives_each_suggestion_its_detectable_v(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    paths = _write(tmp_path, WALK_ALICE, WALK_BOB)
    code, text, _ = _run(capsys, _plan(paths, 3000, 1.0, "--suggest", "--json", "--power", "island,year"))
    assert code == 0
    out = json.loads(text)
    schemas = [load_schema(p).schema for p in paths]
    assert out["power"] == json.loads(json.dumps(power_plan(3000, schemas, 1.0, "island", "year").to_dict()))
    assert out["power"]["m"] == out["current"]["m"]
    kept, dropped = 0, 0
    for i, suggestion in enumerate(out["suggestions"]):
        names = {a["name"] for s in suggestion["schemas"] for a in s["attributes"]}
        if {"island", "year"} <= names:  # the pair's figures are power_plan on the changed schemas, at their m*
            folder = tmp_path / f"s{i}"
            folder.mkdir()
            changed = _write(folder, *suggestion["schemas"])
            expected = power_plan(3000, [load_schema(p).schema for p in changed], 1.0, "island", "year")
            assert suggestion["power"] == json.loads(json.dumps(expected.to_dict()))
            assert suggestion["power"]["m"] == suggestion["m"]
            kept += 1
        else:
            assert suggestion["power"] is None
            dropped += 1
    assert kept and dropped  # this walk-through has both kinds (measured: 1 keeps the pair, 3 drop one of it)
    code, text, _ = _run(capsys, _plan(paths, 3000, 1.0, "--suggest", "--power", "island,year"))
    assert code == 0
    assert "island x year: detectable Cramer's V none (no table is dependent enough) at m = 39" in text
    assert "island x year: not testable (drops one of them)" in text
    first = out["suggestions"][0]["power"]
    assert f"island x year: detectable Cramer's V {first['min_detectable_cramers_v']:.3g} at m = {first['m']}" in text
