"""Issue 34, item 1: one headline, one vocabulary. Every output of a result names its per-cell
columns the same way and in the same order: ``estimate`` (the headline, the projection), ``raw``
(A^-1), ``mle``, ``se`` (of raw), ``ci_low``, ``ci_high`` (the share's 95% interval), then the
others. The expected names are written out here, not read from the code, so renaming or
reordering a column anywhere fails this test; each output's values are checked against the
report's own fields (the headline is the projection, raw is A^-1), so a column that carries the
wrong estimate under the right name fails too. The analyst CLI's outputs over a live service are
checked in tests/integration/test_cli_exitcodes.py; the browser test reads the page's numbers.
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from secure_release import api, display
from secure_release.mechanism.estimation.report import ReleaseReport
from secure_release.report_page import html_report
from secure_release.researcher.heatmap import share_grid
from secure_release.researcher.storage import report_csv

#: The vocabulary, in order (literal on purpose).
VOCABULARY = ["estimate", "raw", "mle", "se", "ci_low", "ci_high", "observed"]
#: A conditional table: a probability has no raw and no se.
CONDITIONAL = ["estimate", "mle", "ci_low", "ci_high"]
ATTRIBUTES = ["edu", "sex", "sal"]


@pytest.fixture(scope="module")
def result() -> api.Result:
    rng = np.random.default_rng(5)
    n = 3000
    ids = np.array([f"p{i}" for i in range(n)])
    frames = {
        "alice": {"id": ids, "edu": rng.choice(["a", "b", "c"], n)},
        "bob": {"id": ids, "sex": rng.choice(["f", "m"], n), "sal": rng.choice(["lo", "hi"], n, p=[0.8, 0.2])},
    }
    schemas = {"alice": {"edu": ["a", "b", "c"]}, "bob": {"sex": ["f", "m"], "sal": ["lo", "hi"]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = api.release(frames, schemas, epsilon=0.4, test_keys=9)  # type: ignore[arg-type]
    # the estimates differ: a column under the wrong name cannot pass by accident
    assert not np.array_equal(r.report.projected, r.report.estimate)
    assert not np.array_equal(r.report.projected, r.report.mle)
    return r


def _check_cells(columns: dict[str, object], report: ReleaseReport) -> None:
    np.testing.assert_array_equal(np.asarray(columns["estimate"], dtype=float), report.projected)
    np.testing.assert_array_equal(np.asarray(columns["raw"], dtype=float), report.estimate)
    np.testing.assert_array_equal(np.asarray(columns["mle"], dtype=float), report.mle)
    np.testing.assert_array_equal(np.asarray(columns["se"], dtype=float), report.standard_error)


def test_the_api_tables_and_frames(result: api.Result) -> None:
    for frame in (result.cells(), result.to_pandas(), result.to_polars(), result.cells("polars")):
        assert list(frame.columns) == [*ATTRIBUTES, *VOCABULARY, "ci_spans_zero"]
        _check_cells({c: frame[c].to_numpy() for c in VOCABULARY}, result.report)
    assert list(result.cell_columns()) == [*ATTRIBUTES, *VOCABULARY, "ci_spans_zero"]
    marginal = result.marginal("edu", "sal")
    assert list(marginal.columns) == ["edu", "sal", *VOCABULARY]
    t = result.marginal_table("edu", "sal")
    np.testing.assert_array_equal(marginal["estimate"].to_numpy(), t.projected)
    np.testing.assert_array_equal(marginal["raw"].to_numpy(), t.estimate)
    assert list(result.marginal("sex", backend="polars").columns) == ["sex", *VOCABULARY]
    conditional = result.conditional("sal", "edu")
    assert list(conditional.columns) == ["edu", "sal", *CONDITIONAL]
    # the conditional's estimate comes from the (given, target) table's own headline, per given row
    two_way = result.marginal_table("edu", "sal").projected
    share = two_way / np.repeat(two_way.reshape(-1, 2).sum(axis=1), 2)
    np.testing.assert_allclose(conditional["estimate"].to_numpy(), share, rtol=1e-12)


def test_the_json_csv_and_parquet_files(result: api.Result, tmp_path: Path) -> None:
    d = result.to_dict()
    assert [list(c) for c in d["cells"]] == [["labels", *VOCABULARY]] * len(d["cells"])
    assert list(d["columns"]) == VOCABULARY and d["headline"] == "projected"
    _check_cells({c: [cell[c] for cell in d["cells"]] for c in VOCABULARY}, result.report)
    saved = json.loads(result.save(tmp_path / "r.json").read_text())
    assert list(saved["cells"][0]) == ["labels", *VOCABULARY]
    assert api.load_result(tmp_path / "r.json").report.to_dict() == result.report.to_dict()

    rows = list(csv.reader(io.StringIO(report_csv(result.report).decode())))
    assert rows[0] == [*ATTRIBUTES, *VOCABULARY]
    _check_cells({c: [r[3 + i] for r in rows[1:]] for i, c in enumerate(VOCABULARY)}, result.report)

    table = pq.read_table(result.to_parquet(tmp_path / "r.parquet"))
    assert table.column_names == [*ATTRIBUTES, *VOCABULARY, "ci_spans_zero"]
    _check_cells({c: table.column(c).to_numpy() for c in VOCABULARY}, result.report)
    about = json.loads(table.schema.metadata[b"secure_release"])
    assert list(about["columns"]) == VOCABULARY and about["guarantee"]["delta"] == 0.0


def test_a_file_written_before_the_vocabulary_still_reads(result: api.Result) -> None:
    old = result.report.to_dict()
    fields = ("estimate", "projected", "mle", "standard_error", "ci_low", "ci_high", "observed")
    arrays = [result.report.estimate, result.report.projected, result.report.mle, result.report.standard_error,
              result.report.ci_low, result.report.ci_high, result.report.observed]  # fmt: skip
    old["cells"] = [{"labels": list(labels), **{f: a[c].item() for f, a in zip(fields, arrays, strict=True)}}
                    for c, labels in enumerate(result.report.labels)]  # fmt: skip
    del old["columns"]
    assert ReleaseReport.from_dict(old).to_dict() == result.report.to_dict()


def test_the_printed_tables(result: api.Result) -> None:
    text = display.explain(result.report)
    head = text.splitlines()[2].split()
    assert head == ["edu", "/", "sex", "/", "sal", *VOCABULARY]
    legend = [line.split()[0] for line in text.split("Columns:\n")[1].split("\n\n")[0].splitlines()]
    assert legend == VOCABULARY
    first = text.splitlines()[3].split()
    assert float(first[5]) == round(float(result.report.projected[0]), 4)
    assert float(first[6]) == round(float(result.report.estimate[0]), 4)
    assert display.marginal_lines(result.marginal_table("edu"))[0].split() == ["edu", *VOCABULARY]
    lines = display.conditional_lines(result.conditional_columns("sal", "edu"), ["edu", "sal"], "P(sal | edu)")
    assert lines.splitlines()[1].split() == ["edu", "/", "sal", *CONDITIONAL]


def test_the_page_and_the_charts(result: api.Result) -> None:
    class Heads(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.heads: list[str] = []
            self.legend: list[str] = []
            self._in = ""

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self._in = tag

        def handle_data(self, data: str) -> None:
            if self._in == "th" and data.strip():
                self.heads.append(data.strip())
            if self._in == "dt" and data.strip():
                self.legend.append(data.strip())
            self._in = ""

    page = Heads()
    page.feed(html_report(result))
    assert page.heads[-len(ATTRIBUTES) - len(VOCABULARY) :] == [*ATTRIBUTES, *VOCABULARY]  # the cells table
    assert [d for d in page.legend if d in VOCABULARY] == VOCABULARY
    import matplotlib

    matplotlib.use("Agg")
    ax = result.plot_marginal("edu")  # the PNG chart of ``analyst marginal --plot``
    labels = ax.get_legend_handles_labels()[1]
    assert sorted(labels) == ["95% interval", "estimate (headline)"]
    heights = [p.get_height() for p in ax.patches]
    np.testing.assert_array_equal(heights, result.marginal_table("edu").projected)  # bars: the headline
    grid, _, _ = share_grid(result.report)  # the researcher's heat map PNG
    np.testing.assert_array_equal(grid.ravel(), result.report.projected)


def test_a_curators_category_names_are_shown_as_written_never_run(tmp_path: Path) -> None:
    """Labels come from schemas a curator wrote: the page escapes them (no script, no tag) and
    the charts show them as typed (a "$" is no mathtext, which would mangle or crash)."""
    rng = np.random.default_rng(3)
    n = 1500
    ids = np.array([f"p{i}" for i in range(n)])
    cats = ["<script>alert(1)</script>", "$0-$10k", "$\\frac$"]
    frames = {
        "alice": {"id": ids, "<b>pay</b>": rng.choice(cats, n)},
        "bob": {"id": ids, "s": rng.choice(["f", "m"], n)},
    }
    schemas = {"alice": {"<b>pay</b>": cats}, "bob": {"s": ["f", "m"]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = api.release(frames, schemas, epsilon=1.0, test_keys=4)  # type: ignore[arg-type]
    page = html_report(r)
    assert "<script" not in page and "<b>pay" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;b&gt;pay&lt;/b&gt;" in page
    assert page.count("$0-$10k") >= 3  # the cells table, the bar chart's tick, the heat map's tick
    assert page.count("$\\frac$") >= 3


def test_export_and_report_refuse_a_bad_path_before_fetching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each mistake is a named error, exit 2, checked before any connection (a unit test fails on
    a socket) and nothing is written."""
    from secure_release.cli import main

    conn = ["--researcher", "127.0.0.1:9", "--insecure"]
    cases = {
        "unknown format": (["export", "r1", str(tmp_path / "r1.xlsx")], ".csv, .json, .parquet"),
        "missing directory": (["export", "r1", str(tmp_path / "no" / "r1.csv")], "does not exist; create it"),
        "a directory": (["export", "r1", str(tmp_path.with_suffix(".csv"))], ""),
        "report, missing directory": (["report", "r1", "--out", str(tmp_path / "no" / "r1.html")], "does not exist"),
    }
    tmp_path.with_suffix(".csv").mkdir()
    for case, (argv, said) in cases.items():
        assert main(["analyst", *argv, *conn]) == 2, case
        err = capsys.readouterr().err
        assert "OutputPathError" in err and said in err, (case, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
