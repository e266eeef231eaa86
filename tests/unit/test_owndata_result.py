"""A notebook Result safe to share and pleasant to read (issue 26, item 9): a short repr, an
HTML view with marginals and intervals, no truth in any export unless asked for, and
conditionals with intervals; a binned numeric column through the notebook API."""

from __future__ import annotations

import html
import json
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from secure_release import api
from secure_release.mechanism.estimation import marginals

SCHEMAS = {
    "alice": {"curator": "alice", "attributes": [{"name": "mass", "bins": [2500, 4000, 6500], "missing": "unknown"},
                                                 {"name": "sp", "categories": ["a", "g"]}]},
    "bob": {"curator": "bob", "attributes": [{"name": "sex", "categories": ["f", "m"]}]},
}  # fmt: skip


@pytest.fixture(scope="module")
def result() -> api.Result:
    rng = np.random.default_rng(26)
    n = 3000
    ids = np.char.add("p", np.arange(n).astype(str))
    mass = rng.uniform(2500, 6500, n).round(1).astype(str)
    mass[::50] = ""  # empty cells: the declared missing label
    alice = pd.DataFrame({"id": ids, "mass": mass, "sp": rng.choice(["a", "g"], n)})
    bob = pd.DataFrame({"id": ids[::-1], "sex": rng.choice(["f", "m"], n)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release({"alice": alice, "bob": bob}, SCHEMAS, epsilon=2.0, test_keys=7)


def test_binned_and_missing_cells_reach_the_release(result: api.Result) -> None:
    assert result.attributes == ("mass", "sp", "sex")
    assert {labels[0] for labels in result.report.labels} == {"[2500, 4000)", "[4000, 6500]", "unknown"}
    assert result.truth is not None
    unknown = [c for c, labels in enumerate(result.report.labels) if labels[0] == "unknown"]
    assert float(result.truth[unknown].sum()) == pytest.approx(60 / 3000)


def test_repr_is_a_few_lines_and_never_shows_the_truth(result: api.Result) -> None:
    text = repr(result)
    lines = text.splitlines()
    assert 2 <= len(lines) <= 4, text
    for part in ("Result", "n=3000", "m=", "K=12", "epsilon=2", "estimator", "-DP", "truth held, not exported"):
        assert part in text, part
    assert "array(" not in text and "0." + str(result.truth[0])[2:6] not in text  # type: ignore[index]


def test_html_shows_the_cells_and_each_marginal_with_intervals(result: api.Result) -> None:
    class Page(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tables, self.charts, self.data, self.tags = 0, [], [], set()

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.add(tag)
            self.tables += tag == "table"
            if tag == "figure":
                self.charts.append(dict(attrs)["data-attributes"])

        def handle_data(self, data: str) -> None:
            self.data.append(data.strip())

    parser = Page()
    parser.feed(result._repr_html_())
    assert parser.tables == 3  # the associations (issue 42), the plan and the cells
    pairs = [f"{a},{b}" for i, a in enumerate(result.attributes) for b in result.attributes[i + 1 :]]
    assert parser.charts == [*result.attributes, *pairs]  # a bar chart each, a heat map a pair (3 attributes)
    assert {"svg", "dl"} <= parser.tags and "script" not in parser.tags and "html" not in parser.tags
    assert "[2500, 4000)" in parser.data  # labels escaped and shown as typed
    assert parser.data.count("95% interval") == len(result.attributes)  # each bar chart's legend


def test_the_notebook_page_without_matplotlib_says_how_to_get_the_charts(
    result: api.Result, monkeypatch: pytest.MonkeyPatch
) -> None:
    from secure_release import plotting, report_page
    from secure_release.frames import MissingDependencyError

    monkeypatch.setattr(plotting, "pyplot", lambda: None)
    page = result._repr_html_()
    shown = html.unescape(page.split('id="charts-missing">')[1].split("</p>")[0])
    assert shown == report_page.NO_MATPLOTLIB and "<svg" not in page and 'id="cells"' in page
    with pytest.raises(MissingDependencyError, match=r"secure-release\[plot\]"):
        report_page.html_report(result)


def test_no_export_carries_the_truth_unless_asked(result: api.Result, tmp_path: Path) -> None:
    assert "truth" not in result.to_dict() and "truth" not in result.to_pandas().columns
    assert "truth" not in result.to_polars().columns and "truth" not in result.cells().columns
    saved = result.save(tmp_path / "r.json")
    assert "truth" not in json.loads(saved.read_text())
    assert (saved.stat().st_mode & 0o777) == 0o600
    assert api.load_result(saved).report.estimate.tolist() == result.report.estimate.tolist()
    assert len(result.to_dict(include_truth=True)["truth"]) == 12
    assert "truth" in result.to_pandas(include_truth=True).columns
    assert "truth" in json.loads(result.save(tmp_path / "t.json", include_truth=True).read_text())


def test_conditional_has_intervals_that_hold_the_truth(result: api.Result) -> None:
    df = result.conditional("sex", given="sp")
    assert list(df.columns) == ["sp", "sex", "estimate", "mle", "ci_low", "ci_high"]
    assert ((df["ci_low"] >= 0) & (df["ci_high"] <= 1) & (df["ci_low"] <= df["ci_high"])).all()
    assert ((df["ci_low"] <= df["estimate"] + 1e-12) & (df["estimate"] <= df["ci_high"] + 1e-12)).all()
    r = result.report
    assert result.truth is not None
    _, true_p = marginals.conditional(r.attributes, r.labels, result.truth, ["sex"], ["sp"])
    # fixed keys (test_keys=7): deterministic; each interval holds >= 95% by construction
    assert ((df["ci_low"] <= true_p) & (true_p <= df["ci_high"])).all()
    assert float((df["ci_high"] - df["ci_low"]).max()) < 0.8  # informative, not [0, 1]


def test_a_null_cell_in_a_notebook_table_is_missing_only_by_declaration() -> None:
    from secure_release.curator.columnar import BadRowsError

    ids = [f"p{i}" for i in range(300)]
    alice = pd.DataFrame({"id": ids, "sp": (["a", "g", None] * 100)})
    bob = pd.DataFrame({"id": ids, "sex": ["f", "m", "f"] * 100})
    declared = {"alice": {"curator": "alice", "attributes": [{"name": "sp", "categories": ["a", "g"],
                                                              "missing": "n/a"}]},
                "bob": {"sex": ["f", "m"]}}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = api.release({"alice": alice, "bob": bob}, declared, epsilon=1.0, test_keys=1)
        assert {labels[0] for labels in result.report.labels} == {"a", "g", "n/a"}
        with pytest.raises(BadRowsError, match=r'sp: 100 row.s. missing .empty.(.|\n)*hint: declare "missing"'):
            api.release({"alice": alice, "bob": bob}, {"alice": {"sp": ["a", "g"]}, "bob": {"sex": ["f", "m"]}},
                        epsilon=1.0, test_keys=1)  # fmt: skip
