"""`schema draft` bins per column and readable edges (issue 33, item 6): `--range COL=LOW:HIGH:BINS`
or a `--bins` right after a `--range` gives that range its own count; a `--bins` before every
`--range` is the default of the others; equal-width edges as the fewest decimals that keep each
inner edge within 1% of a bin's width of its exact value (or one more when that makes them exact)."""

from __future__ import annotations

import itertools
import json
import warnings
from fractions import Fraction
from pathlib import Path

import pytest

from secure_release.api import draft_schema, equal_width_edges
from secure_release.cli import main
from secure_release.curator.table import load_schema, read_table
from secure_release.frames import TableInputError

AGES = [17, 21.9, 22, 30, 41.5, 42]  # 22 is an edge: it opens the second bin of 17:42 at 5
AFFAIRS = [0, 12, 19.99, 20, 59, 60]


def _csv(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    rows = [f"{i},{a},{f}\n" for i, (a, f) in enumerate(zip(AGES, AFFAIRS, strict=True))]
    path.write_text("id,age,affairs\n" + "".join(rows))
    return path


def _draft_cli(tmp_path: Path, *options: str) -> dict[str, list[float]]:
    out = tmp_path / "s.json"
    assert main(["schema", "draft", str(_csv(tmp_path)), "--curator", "alice", *options, "--out", str(out)]) == 0
    return {a["name"]: a["bins"] for a in json.loads(out.read_text())["attributes"]}


def test_each_bins_applies_to_the_range_before_it(tmp_path: Path) -> None:
    # the command: age must get 5 bins (width (42 - 17) / 5 = 5), affairs 3 (width 20)
    bins = _draft_cli(tmp_path, "--range", "age=17:42", "--bins", "5", "--range", "affairs=0:60", "--bins", "3")
    assert bins == {"age": [17, 22, 27, 32, 37, 42], "affairs": [0, 20, 40, 60]}
    text = (tmp_path / "s.json").read_text()
    assert "25.33" not in text and "17.0" not in text  # integral edges written without a decimal point
    # the labels read the values at the printed edges: 22 opens [22, 27), 21.9 is in [17, 22)
    table = read_table(_csv(tmp_path), load_schema(tmp_path / "s.json"))
    assert list(table.columns["age"]) == ["[17, 22)", "[17, 22)", "[22, 27)", "[27, 32)", "[37, 42]", "[37, 42]"]
    assert list(table.columns["affairs"]) == ["[0, 20)", "[0, 20)", "[0, 20)", "[20, 40)", "[40, 60]", "[40, 60]"]


def test_own_count_in_the_range_and_the_default_before_every_range(tmp_path: Path) -> None:
    # affairs has no count of its own: the default 4 (width 15)
    assert _draft_cli(tmp_path, "--range", "age=17:42:5", "--range", "affairs=0:60") == {
        "age": [17, 22, 27, 32, 37, 42], "affairs": [0, 15, 30, 45, 60]}  # fmt: skip
    # --bins 2 before any --range: the default of age (width 12.5); affairs keeps its own 3
    assert _draft_cli(tmp_path, "--bins", "2", "--range", "age=17:42", "--range", "affairs=0:60:3") == {
        "age": [17, 29.5, 42], "affairs": [0, 20, 40, 60]}  # fmt: skip
    # a --bins after the second --range belongs to it alone: age keeps the default 4 (width 6.25)
    assert _draft_cli(tmp_path, "--range", "age=17:42", "--range", "affairs=0:60", "--bins", "3") == {
        "age": [17, 23.25, 29.5, 35.75, 42], "affairs": [0, 20, 40, 60]}  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--range", "age=17:42:5", "--bins", "3"], "already has its count of bins"),
        (["--range", "age=17:42", "--bins", "3", "--bins", "4"], "already has its count of bins"),
        (["--bins", "3", "--bins", "4", "--range", "age=17:42"], "a second --bins before any --range"),
        (["--range", "age=17:42:x"], "COLUMN=LOW:HIGH:BINS"),
        (["--range", "age=17:42:5:1"], "COLUMN=LOW:HIGH:BINS"),
        (["--range", "age=17"], "COLUMN=LOW:HIGH"),
        (["--range", "age=17:42", "--range", "age=0:99"], "given twice"),
        (["--range", "age=17:42:0"], "the range of 'age': a range needs a whole number of bins >= 1, got 0"),
        (["--range", "age=17:42", "--bins", "0"], "the range of 'age': a range needs a whole number of bins >= 1"),
        (["--bins", "0", "--range", "affairs=0:60"], "the range of 'affairs': a range needs a whole number of bins"),
        (["--range", "age=42:17"], "the range of 'age': a range needs finite LOW < HIGH, got 42.0:17.0"),
        (["--bins", "5"], "--bins 5 without any --range"),  # else silently ignored
    ],
)
def test_unclear_binning_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str],
                                    message: str) -> None:  # fmt: skip
    assert main(["schema", "draft", str(_csv(tmp_path)), "--curator", "alice", *options]) == 2
    assert message in capsys.readouterr().err


def test_help_states_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["schema", "draft", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a --bins right after a --range is that range's count of bins" in text
    assert "a --bins before any --range is the count of every range without its own (default: 4)" in text
    assert "COLUMN=LOW:HIGH[:BINS]" in text


def test_api_takes_a_count_per_range_and_stays_backward_compatible() -> None:
    table = {"id": ["1", "2"], "age": ["20", "40"], "affairs": ["0", "60"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_range = draft_schema(table, "alice", ranges={"age": (17, 42, 5), "affairs": (0, 60)}, bins=3)
        old_style = draft_schema(table, "alice", ranges={"age": (17.0, 42.0), "affairs": (0.0, 60.0)})
    assert [a["bins"] for a in per_range["attributes"]] == [[17, 22, 27, 32, 37, 42], [0, 20, 40, 60]]
    assert [a["bins"] for a in old_style["attributes"]] == [[17, 23.25, 29.5, 35.75, 42], [0, 15, 30, 45, 60]]
    with pytest.raises(TableInputError, match=r"\(LOW, HIGH\) or \(LOW, HIGH, BINS\)"):
        draft_schema(table, "alice", ranges={"age": (17, 42, 5, 1)}, warn=False)  # type: ignore[dict-item]
    with pytest.raises(TableInputError, match="the range of 'age': a range needs a whole number of bins"):
        draft_schema(table, "alice", ranges={"age": (17, 42, 2.5)}, warn=False)  # type: ignore[dict-item]
    with pytest.raises(TableInputError, match="the range of 'affairs': could not convert"):
        draft_schema(table, "alice", ranges={"affairs": ("low", 60)}, warn=False)  # type: ignore[dict-item]


def test_readable_edges_worked_by_hand() -> None:
    # 0:1 at 3: exact 1/3, 2/3, width 1/3; 0.3 is 1/30 off = 10% of a width (too far), 0.33 is
    # 1/300 off = exactly 1% (kept)
    assert equal_width_edges(0, 1, 3) == [0, 0.33, 0.67, 1]
    # 0:60 at 7: width 60/7 = 8.571...; whole numbers are up to 0.43 = 5% off; one decimal at
    # most 0.043 = 0.5%: 8.571 -> 8.6, 17.143 -> 17.1, 25.714 -> 25.7, 34.286 -> 34.3, ...
    assert equal_width_edges(0, 60, 7) == [0, 8.6, 17.1, 25.7, 34.3, 42.9, 51.4, 60]
    # 0.1:0.2 at 3: width 1/30; 0.13 is 1/300 = 10% off, 0.133 is 1/3000 = 1%
    assert equal_width_edges(0.1, 0.2, 3) == [0.1, 0.133, 0.167, 0.2]
    assert equal_width_edges(-10, 40, 3) == [-10, 6.7, 23.3, 40]  # 50/3 = 16.67: -10 + 16.67 = 6.67
    assert equal_width_edges(2500, 6500, 4) == [2500, 3500, 4500, 5500, 6500]
    # 17:42 at 4: width 6.25; 23.2 is within 1% (0.05 <= 0.0625) but 23.25 is exact with one decimal more
    assert equal_width_edges(17, 42, 4) == [17, 23.25, 29.5, 35.75, 42]
    # 0:1 at 16: width 1/16; 0.06 is 4% off, 0.063 0.8% off, and 0.0625 exact with one more decimal
    assert equal_width_edges(0, 1, 16)[1:4] == [0.0625, 0.125, 0.1875]
    assert equal_width_edges(0, 1, 1) == [0, 1]


def _decimals(value: float) -> int:
    text = repr(value)
    assert "e" not in text, text
    return len(text.partition(".")[2].rstrip("0")) if "." in text else 0


@pytest.mark.parametrize("low_high", [(0, 1), (17, 42), (0, 60), (-3.5, 7.25), (0.001, 0.002), (1000, 1001), (5, 6e4)])
@pytest.mark.parametrize("bins", [1, 2, 3, 6, 7, 9, 11, 13, 40])
def test_edges_meet_the_rule_and_no_fewer_decimals_would(low_high: tuple[float, float], bins: int) -> None:
    low, high = low_high
    edges = equal_width_edges(low, high, bins)
    assert len(edges) == bins + 1 and edges[0] == low and edges[-1] == high
    assert all(b > a for a, b in itertools.pairwise(edges))
    width = (Fraction(str(high)) - Fraction(str(low))) / bins
    exact = [Fraction(str(low)) + width * i for i in range(1, bins)]
    assert all(abs(Fraction(repr(e)) - x) <= width / 100 for e, x in zip(edges[1:-1], exact, strict=True))
    used = max((_decimals(e) for e in edges[1:-1]), default=0)

    def within(decimals: int) -> bool:  # every inner edge rounded to `decimals` within 1% of a width
        return decimals >= 0 and all(abs(Fraction(round(x * 10**decimals), 10**decimals) - x) <= width / 100
                                     for x in exact)  # fmt: skip

    def exact_at(decimals: int) -> bool:
        return all((x * 10**decimals).denominator == 1 for x in exact)

    fewest = next(d for d in range(18) if within(d))  # the 1% rule's fewest decimals
    assert used <= fewest + 1
    if exact_at(fewest + 1):  # one more decimal writes every edge exactly: they are exact
        assert [Fraction(repr(e)) for e in edges[1:-1]] == exact
    else:
        assert used == fewest
