"""`plan --suggest` and `api.suggest` (issue 34, item 4): the smallest public schema changes whose
plan meets a per-cell RMSE target, each suggestion's figures checked against `plan` run on the
changed schemas; the set of suggestions checked against a brute-force enumeration; the schema's
`"groups"` key validated with named errors."""

from __future__ import annotations

import itertools
import json
import math
import shlex
from pathlib import Path
from typing import Any

import pytest

from secure_release import api
from secure_release.cli import main
from secure_release.mechanism.analysis.suggest import MAX_GRID, merged_bin_edges
from secure_release.mechanism.errors import (
    InvalidBinsError,
    InvalidGroupsError,
    InvalidSuggestionLimitError,
    SearchTooLargeError,
)
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.schema import Attribute, attribute_from_dict, attribute_to_dict

ROOT = Path(__file__).resolve().parents[2]

# the issue's example: five attributes, K = 210 x 75 = 15,750, n = 5,800, epsilon 1
ISSUE_ALICE = {"curator": "alice", "id_column": "pid", "attributes": [
    {"name": "age", "bins": [17, 22, 27, 32, 37, 42, 47, 52]},  # 7 bins
    {"name": "educ", "categories": ["a", "b", "c", "d", "e", "f"],
     "groups": {"school": ["a", "b"], "college": ["c", "d"], "graduate": ["e", "f"]}},
    {"name": "rate", "categories": ["1", "2", "3", "4", "5"]},
]}  # fmt: skip
ISSUE_BOB = {"curator": "bob", "id_column": "pid", "attributes": [
    {"name": "religious", "categories": ["1", "2", "3", "4", "5"]},
    {"name": "affairs", "bins": [4 * i for i in range(16)]},  # 15 bins
]}  # fmt: skip
# the option sizes of each attribute, written from the schemas above (keep, groups, bin merges, drop)
ISSUE_SIZES = {
    "age": [7, 6, 5, 4, 3, 2, 1],
    "educ": [6, 3, 1],
    "rate": [5, 1],
    "religious": [5, 1],
    "affairs": [*range(15, 1, -1), 1],
}
OWNERS = {"age": 0, "educ": 0, "rate": 0, "religious": 1, "affairs": 1}

# the walk-through's schemas (docs/own-data.md, as its `schema draft` commands write them)
WALK_ALICE = {"curator": "alice", "id_column": "id", "attributes": [
    {"name": "species", "categories": ["Adelie", "Chinstrap", "Gentoo"], "missing": "missing",
     "missing_tokens": ["NA"]},
    {"name": "island", "categories": ["Biscoe", "Dream", "Torgersen"]},
]}  # fmt: skip
WALK_BOB = {"curator": "bob", "id_column": "id", "attributes": [
    {"name": "mass_g", "bins": [2500, 3500, 4500, 5500, 6500]},
    {"name": "year", "categories": ["2007", "2008", "2009"]},
]}  # fmt: skip


def _write(tmp_path: Path, *schemas: dict[str, Any]) -> list[str]:
    paths = []
    for schema in schemas:
        path = tmp_path / f"{schema['curator']}.json"
        path.write_text(json.dumps(schema), encoding="utf-8")
        paths.append(str(path))
    return paths


def _cli_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(argv) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _plan_json(capsys: pytest.CaptureFixture[str], paths: list[str], n: int, epsilon: float) -> dict[str, Any]:
    argv = ["plan", "--n", str(n), "--epsilon", repr(epsilon), "--json"]
    return _cli_json(capsys, argv + [a for p in paths for a in ("--schema", p)])


def _suggest_json(capsys: pytest.CaptureFixture[str], paths: list[str], n: int, epsilon: float,
                  *extra: str) -> dict[str, Any]:  # fmt: skip
    argv = ["plan", "--n", str(n), "--epsilon", repr(epsilon), "--suggest", "--json", *extra]
    return _cli_json(capsys, argv + [a for p in paths for a in ("--schema", p)])


def test_every_suggestion_is_what_plan_says_on_the_changed_schemas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _write(tmp_path, ISSUE_ALICE, ISSUE_BOB)
    now = _plan_json(capsys, paths, 5800, 1.0)
    assert now["K"] == 15750 and now["utility"]["ok"] is False  # the issue's starting point
    out = _suggest_json(capsys, paths, 5800, 1.0, "--max-suggestions", "100")
    assert out["current"]["K"] == 15750 and out["current"]["predicted_rmse_per_cell"] == now["predicted_rmse_per_cell"]
    assert out["suggestions"] and out["omitted"] == 0
    for i, suggestion in enumerate(out["suggestions"]):
        changed = tmp_path / f"s{i}"
        changed.mkdir()
        for schema in suggestion["schemas"]:
            assert schema["id_column"] == "pid"  # the files keep the curators' id columns
        plan = _plan_json(capsys, _write(changed, *suggestion["schemas"]), 5800, 1.0)
        for key in ("alphabet_sizes", "K", "m", "m_star", "predicted_rmse_per_cell"):
            assert suggestion[key] == plan[key], (key, suggestion, plan)
        assert suggestion["target"] == 1 / (2 * plan["K"])  # the default target, from the changed K
        assert plan["predicted_rmse_per_cell"] <= 1 / (2 * plan["K"])
    # the epsilon that would do with the schemas unchanged: plan says it meets 1/(2K), and 1.2% less does not
    found = out["epsilon_unchanged"]
    at = _plan_json(capsys, paths, 5800, found["epsilon"])
    assert at["predicted_rmse_per_cell"] == found["predicted_rmse_per_cell"] <= 1 / (2 * 15750)
    below = _plan_json(capsys, paths, 5800, found["epsilon"] / 1.012)
    assert below["predicted_rmse_per_cell"] > 1 / (2 * 15750)
    assert len(f"{found['epsilon']:g}".replace(".", "").lstrip("0")) <= 3  # three significant digits


def _brute_force_front(n: int, epsilon: float) -> set[tuple[int, ...]]:
    """Every combination of the option sizes (ISSUE_SIZES), each curator keeping an attribute,
    checked by plan_release's own report; then the combinations no other feasible one dominates."""
    names = list(ISSUE_SIZES)
    per_k: dict[int, bool] = {}
    feasible = []
    for sizes in itertools.product(*(ISSUE_SIZES[a] for a in names)):
        kept = [any(s > 1 for s, a in zip(sizes, names, strict=True) if OWNERS[a] == j) for j in (0, 1)]
        K = math.prod(sizes)
        if not all(kept) or K < 2:
            continue
        if K not in per_k:
            per_k[K] = plan_release(n, [K, 1], epsilon).report()["predicted_rmse_per_cell"] <= 1 / (2 * K)
        if per_k[K]:
            feasible.append(sizes)
    return {a for a in feasible
            if not any(b != a and all(x >= y for x, y in zip(b, a, strict=True)) for b in feasible)}  # fmt: skip


def test_the_suggestions_are_exactly_the_pareto_front_of_a_brute_force_enumeration() -> None:
    report = api.suggest(5800, [ISSUE_ALICE, ISSUE_BOB], 1.0, limit=1000)
    got = []
    for suggestion in report.suggestions:
        sizes = {a.name: a.size for s in suggestion.schemas for a in s.attributes}
        got.append(tuple(sizes.get(name, 1) for name in ISSUE_SIZES))
    assert len(got) == len(set(got))
    assert set(got) == _brute_force_front(5800, 1.0)
    # sorted by what they keep: most attributes kept, then most cells
    order = [(s.attributes_kept, s.figures.K) for s in report.suggestions]
    assert order == sorted(order, reverse=True)
    assert report.grid_size == math.prod(len(v) for v in ISSUE_SIZES.values()) and not report.thinned
    # the issue found K = 75 by hand: still noise at 1/(2K) (plan: 0.0199 per cell > 1/150)
    assert all(s.figures.K < 75 for s in report.suggestions)
    # --max-suggestions caps the list and counts the rest
    capped = api.suggest(5800, [ISSUE_ALICE, ISSUE_BOB], 1.0, limit=3)
    assert capped.suggestions == report.suggestions[:3] and capped.omitted == len(got) - 3


def test_walkthrough_tables_worked_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # alice: species 3 + missing = 4, island 3; bob: mass_g 4 bins, year 3; n = 300, epsilon 1.
    # Every curator keeps one attribute, so alice's alphabet is 3, 4 or 12 and bob's 2, 3, 4, 6,
    # 9 or 12. plan: K = 6 gives 0.0787 per cell <= 1/12; K = 8 gives 0.0811 > 1/16, and K = 9,
    # 12, ... are further off: the one suggestion is island with mass_g in two bins.
    for K, ok in ((6, True), (8, False), (9, False), (12, False)):
        assert (plan_release(300, [K, 1], 1.0).report()["predicted_rmse_per_cell"] <= 1 / (2 * K)) is ok
    out = _suggest_json(capsys, _write(tmp_path, WALK_ALICE, WALK_BOB), 300, 1.0)
    assert [s["alphabet_sizes"] for s in out["suggestions"]] == [[3, 2]]
    only = out["suggestions"][0]
    assert only["schemas"][0]["attributes"] == [WALK_ALICE["attributes"][1]]
    assert only["schemas"][1]["attributes"] == [{"name": "mass_g", "bins": [2500, 4500, 6500]}]
    assert only["keeps"] == ["island (3)", "mass_g (2)"]


def test_the_section_of_own_data_runs_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    page = (ROOT / "docs" / "own-data.md").read_text(encoding="utf-8")
    section = page.split("## When the plan says noise: `plan --suggest`", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")[1::2]
    command, shown = blocks[0].strip(), blocks[1].strip("\n")
    _write(tmp_path, WALK_ALICE, WALK_BOB)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    argv = shlex.split(command)
    assert argv[0] == "secure-release" and main(argv[1:]) == 0
    assert capsys.readouterr().out.rstrip("\n") == shown


def test_an_explicit_target_and_schemas_that_already_meet_it(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    paths = _write(tmp_path, WALK_ALICE, WALK_BOB)
    met = _suggest_json(capsys, paths, 300, 1.0, "--target", "0.1")  # 0.0878 per cell now
    assert met["current"]["predicted_rmse_per_cell"] <= 0.1 and met["suggestions"] == []
    assert met["epsilon_unchanged"]["epsilon"] == 1.0 and met["target"] == 0.1
    capsys.readouterr()
    assert main(["plan", "--n", "300", "--epsilon", "1", "--suggest", "--target", "0.1", "--schema", paths[0],
                 "--schema", paths[1]]) == 0  # fmt: skip
    assert "nothing to give up" in capsys.readouterr().out
    # a target no change and no epsilon <= 50 meets: at epsilon 1 every K >= 2 has a per-cell RMSE
    # above 0.07 (m* <= 300, gamma >= 1 + e - 1); at epsilon 50 (m = n = 300, no sampling error)
    # PRAM alone leaves about sqrt((K - 1) / (m gamma)) / sqrt K ~ 1e-12 per cell, gamma ~ e^50
    none = _suggest_json(capsys, paths, 300, 1.0, "--target", "1e-15")
    assert none["suggestions"] == [] and none["epsilon_unchanged"] is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--suggest"], "--suggest needs one --schema FILE per curator, two or more (got 0)"),
        (["--suggest", "--schema", "{a}"], "--suggest needs one --schema FILE per curator, two or more (got 1)"),
        (["--suggest", "--alphabet", "12,12", "--schema", "{a}", "--schema", "{b}"], "not both"),
        (["--suggest", "--schema", "{a}", "--schema", "{b}", "--m", "5"], "drop --m"),
        (["--suggest", "--schema", "{a}", "--schema", "{b}", "--max-suggestions", "0"],
         "--max-suggestions must be >= 1, got 0"),
        (["--suggest", "--schema", "{a}", "--schema", "{b}", "--target", "0"], "finite number > 0, got 0.0"),
        (["--suggest", "--schema", "{a}", "--schema", "{b}", "--target", "nan"], "finite number > 0, got nan"),
        (["--suggest", "--schema", "{a}", "--schema", "{b}", "--target", "1/288"], "invalid float value"),
        (["--schema", "{a}", "--schema", "{b}", "--target", "0.01"], "go with --suggest"),  # else silently ignored
        (["--schema", "{a}", "--schema", "{b}", "--max-suggestions", "3"], "go with --suggest"),
        ([], "give --alphabet SIZES or one --schema FILE per curator"),
    ],
)
def test_suggest_refuses_what_does_not_apply_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         flags: list[str], message: str) -> None:  # fmt: skip
    a, b = _write(tmp_path, WALK_ALICE, WALK_BOB)
    argv = ["plan", "--n", "300", "--epsilon", "1", *(f.format(a=a, b=b) for f in flags)]
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals (a --target that is not a number)
        code = exc.code  # type: ignore[assignment]
    assert code == 2  # usage, as every bad flag of secure-release (infra/exitcodes.py)
    err = capsys.readouterr().err
    assert message in err and err.startswith("secure-release plan")


def test_the_api_names_a_bad_limit_and_a_bad_merge() -> None:
    with pytest.raises(InvalidSuggestionLimitError, match="got 0"):
        api.suggest(300, [WALK_ALICE, WALK_BOB], 1.0, limit=0)
    with pytest.raises(InvalidSuggestionLimitError, match="got True"):
        api.suggest(300, [WALK_ALICE, WALK_BOB], 1.0, limit=True)
    with pytest.raises(InvalidBinsError, match="cannot merge 4 bins into 5"):
        merged_bin_edges([0, 1, 2, 3, 4], 5)


def test_merged_bin_edges_are_runs_of_whole_bins() -> None:
    edges = [17, 22, 27, 32, 37, 42, 47, 52]
    assert merged_bin_edges(edges, 2) == (17, 37, 52)  # 7/2 = 3.5 bins a run: halves up, 4 then 3
    assert merged_bin_edges([4 * i for i in range(16)], 4) == (0, 16, 32, 44, 60)  # runs of 4, 4, 3, 4
    assert merged_bin_edges(edges, 7) == tuple(edges)
    for B in range(2, 30):
        for b in range(1, B + 1):
            merged = merged_bin_edges(list(range(B + 1)), b)  # edge i = index i: a run's length is its width
            runs = [y - x for x, y in itertools.pairwise(merged)]
            assert merged[0] == 0 and merged[-1] == B and len(runs) == b
            assert set(runs) <= {B // b, -(-B // b)}


def test_the_search_is_bounded() -> None:
    wide = [{"name": f"x{i}", "bins": list(range(41))} for i in range(4)]  # 4 attributes of 40 bins: 41^4 options
    report = api.suggest(10**6, [{"curator": "a", "attributes": wide[:2]}, {"curator": "b", "attributes": wide[2:]}],
                         1.0)  # fmt: skip
    assert report.thinned and report.grid_size <= MAX_GRID
    assert report.suggestions  # the thinned search still finds changes that meet the target
    # 20 two-category attributes: keep or drop each, 2^20 > 2^18 combinations and nothing to thin
    alice = [{"name": f"y{i}", "categories": ["0", "1"]} for i in range(10)]
    bob = [{"name": f"z{i}", "categories": ["0", "1"]} for i in range(10)]
    with pytest.raises(SearchTooLargeError, match="at most 262144"):
        api.suggest(10**6, [{"curator": "a", "attributes": alice}, {"curator": "b", "attributes": bob}], 1.0)


EDUCATION = {"name": "education", "categories": ["a", "b", "c"], "groups": {"school": ["a", "b"], "college": ["c"]}}


def test_groups_round_trip_and_change_no_code() -> None:
    attribute = attribute_from_dict(EDUCATION)
    assert attribute.groups == (("school", ("a", "b")), ("college", ("c",)))
    assert attribute_to_dict(attribute) == EDUCATION
    assert attribute == Attribute("education", ("a", "b", "c"))  # the codes are the categories alone
    assert attribute.encode(["c", "a", "b"]).tolist() == [2, 0, 1]
    with_missing = {**EDUCATION, "missing": "unknown"}
    assert attribute_to_dict(attribute_from_dict(with_missing)) == with_missing


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"school": ["a", "b"]}, r"categories \['c'\] are in no group"),
        ({"school": ["a", "b"], "college": ["c", "a"]}, r"categories \['a'\] are in more than one group"),
        ({"school": ["a", "b", "x"], "college": ["c"]}, r"groups list \['x'\], which are not categories"),
        ({}, "at least one group"),
        ({"school": ["a", "b", "c"], "college": []}, r"group\(s\) \['college'\] have no categories"),
        ({" school": ["a", "b", "c"]}, "non-empty words"),
        ({"unknown": ["a", "b", "c"]}, "cannot name a group"),
        ({"school": ["a", "b", "c", "unknown"]}, "stays a category of its own"),
        (["a", "b"], "groups must be"),
        ({"school": "abc"}, "groups must be"),
    ],
)
def test_malformed_groups_are_refused_by_name(groups: Any, message: str) -> None:
    with pytest.raises(InvalidGroupsError, match=message):
        attribute_from_dict({**EDUCATION, "missing": "unknown", "groups": groups})


def test_groups_belong_to_categorical_attributes_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidGroupsError, match="groups are for categorical attributes"):
        attribute_from_dict({"name": "mass", "bins": [0, 1, 2], "groups": {"all": ["[0, 1)", "[1, 2]"]}})
    with pytest.raises(InvalidGroupsError, match="groups are for categorical attributes"):
        Attribute("mass", ("[0, 1)", "[1, 2]"), (0.0, 1.0, 2.0), groups=(("all", ("[0, 1)", "[1, 2]")),))
    # plan reads a schema file's groups, and refuses malformed ones by name (exit 2)
    island = {"name": "island", "categories": ["Biscoe", "Dream", "Torgersen"], "groups": {"west": ["Biscoe"]}}
    bad = {"curator": "alice", "id_column": "id", "attributes": [island]}
    paths = _write(tmp_path, bad, WALK_BOB)
    assert main(["plan", "--n", "300", "--epsilon", "1", "--schema", paths[0], "--schema", paths[1]]) == 2
    assert "are in no group" in capsys.readouterr().err


def test_alphabet_sizes_alone_give_the_epsilon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the same alphabets as the schemas: the same current figures and the same epsilon, no changes
    from_schemas = _suggest_json(capsys, _write(tmp_path, WALK_ALICE, WALK_BOB), 300, 1.0)
    alone = _cli_json(capsys, ["plan", "--n", "300", "--epsilon", "1.0", "--alphabet", "12,12", "--suggest", "--json"])
    assert alone["current"] == from_schemas["current"] and alone["suggestions"] == []
    assert alone["epsilon_unchanged"] == from_schemas["epsilon_unchanged"] and alone["search"]["grid_size"] == 0
    # DESIGN 3's reference: Adult (K = 24, n = 45,222) at epsilon 0.1 has m* = 239 and l2 RMSE 0.139,
    # so 0.139 / sqrt 24 = 0.0284 per cell, above 1/48 = 0.0208: an epsilon above 0.1 is offered
    adult = _cli_json(capsys, ["plan", "--n", "45222", "--epsilon", "0.1", "--alphabet", "6,4", "--suggest", "--json"])
    assert adult["current"]["m"] == 239  # DESIGN 3 gives the RMSE to three digits: 0.139 (0.1396)
    assert abs(adult["current"]["predicted_rmse_per_cell"] * math.sqrt(24) - 0.139) < 1e-3
    assert adult["epsilon_unchanged"]["epsilon"] > 0.1
    assert adult["epsilon_unchanged"]["predicted_rmse_per_cell"] <= 1 / 48
