"""A Result of several tables: each analysis is read on the table that holds every attribute it
names (of several, the one with the largest m_t a_t^2), NoTableHoldsError lists the tables when
none does, ``questions()`` answers the design's questions from their tables, a saved result
loads back, and the page opens with the answers."""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from secure_release import analysis, api
from secure_release.mechanism.analysis.subtables import holm_adjust
from secure_release.mechanism.errors import MultiTableResultError, NoTableHoldsError, UnknownAttributeError
from secure_release.mechanism.estimation.report import TABLES_FORMAT
from secure_release.report_page import NO_MATPLOTLIB, html_report, render

N = 20000
SCHEMAS = {
    "alice": {"a": ["a0", "a1"], "b": ["b0", "b1", "b2"], "c": ["c0", "c1"]},
    "bob": {"x": ["x0", "x1"], "y": ["y0", "y1", "y2"], "z": ["z0", "z1"]},
}
QUESTIONS = ["a ~ x", "b ~ y | c", "z ~ a + c"]
TABLES = [("a", "x"), ("b", "c", "y"), ("a", "c", "z")]


def frames(n: int = N, seed: int = 1) -> dict[str, dict[str, np.ndarray]]:
    """a and x strongly associated (x copies a w.p. 0.9, Cramer's V 0.9); the rest independent."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"p{i}" for i in range(n)])
    a = rng.choice(["a0", "a1"], n)
    x = np.where(rng.random(n) < 0.9, np.where(a == "a0", "x0", "x1"), rng.choice(["x0", "x1"], n))
    return {
        "alice": {"id": ids, "a": a, "b": rng.choice(["b0", "b1", "b2"], n), "c": rng.choice(["c0", "c1"], n)},
        "bob": {"id": ids, "x": x, "y": rng.choice(["y0", "y1", "y2"], n), "z": rng.choice(["z0", "z1"], n)},
    }


@pytest.fixture(scope="module")
def result() -> api.Result:
    d = api.design(N, SCHEMAS, 1.0, QUESTIONS, at_v=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(frames(), SCHEMAS, 1.0, design=d, release_id="r-tables", test_keys=3)


@pytest.fixture(scope="module")
def classic() -> api.Result:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(frames(4000), SCHEMAS, 1.0, release_id="r-joint", test_keys=3)


def _part(result: api.Result, table: int) -> api.Result:
    return result.part(table)


def test_the_tables_are_the_designs(result: api.Result) -> None:
    assert [p.report.attributes for p in result.parts if p is not None] == TABLES
    tables = result.tables()
    assert len(tables) == 3 and [row.attributes for row in tables.rows] == TABLES
    assert [row.questions for row in tables.rows] == [(1,), (2,), (3,)]
    for row, part in zip(tables.rows, result.parts, strict=True):
        assert part is not None and (row.m, row.gamma, row.K) == (part.plan.m, part.plan.gamma, part.plan.joint_size)
        assert row.keep == part.plan.channel.keep
    text = str(tables)
    assert "table  attributes" in text and "b, c, y" in text and "Eq. T1" in text
    frame = tables.to_frame()
    assert list(frame.columns) == ["table", "attributes", "curators", "K", "m", "gamma", "keep", "questions", "missing"]
    assert frame["m"].tolist() == [row.m for row in tables.rows]
    assert "<table>" in tables._repr_html_() and json.dumps(tables.to_dict())
    assert result.attributes == ("a", "x", "b", "c", "y", "z")


def test_an_analysis_reads_the_table_that_holds_its_attributes(result: api.Result) -> None:
    test = result.test_independence("a", "x")  # only table 1 holds both
    want = analysis.test_independence(_part(result, 1).report, "a", "x")
    assert (test.statistic, test.p_value, test.m) == (want.statistic, want.p_value, _part(result, 1).plan.m)
    given = result.test_independence("b", "y", "c")
    assert given.m == _part(result, 2).plan.m
    # a is in tables 1 and 3: the one with the largest m_t a_t^2 answers (here table 3, not the first)
    info = {t: _part(result, t).plan.m * _part(result, t).plan.channel.keep ** 2 for t in (1, 3)}
    best = max(info, key=lambda t: info[t])
    assert best == 3 and info[3] > info[1]
    marginal = result.marginal_table("a")
    want_marginal = _part(result, best).marginal_table("a")
    np.testing.assert_array_equal(marginal.headline, want_marginal.headline)
    assert not np.array_equal(marginal.headline, _part(result, 1).marginal_table("a").headline)
    assert result.marginal_columns("z")["observed"].sum() == _part(result, 3).plan.m
    conditional = result.conditional_columns("y", ["b", "c"])
    want_conditional = _part(result, 2).conditional_columns("y", ["b", "c"])
    np.testing.assert_array_equal(conditional["estimate"], want_conditional["estimate"])
    effect = result.association("a", "x")
    assert effect.cramers_v == analysis.association(_part(result, 1).report, "a", "x").cramers_v
    full = result.logistic("z", ["a", "c"])
    reduced = result.logistic("z", ["c"])
    compared = result.compare_models(reduced, full)
    want_cmp = analysis.compare_models(_part(result, 3).report, reduced, full)
    assert (compared.statistic, compared.df, compared.p_value) == (want_cmp.statistic, want_cmp.df, want_cmp.p_value)


def test_attributes_no_table_holds_together_are_refused_with_the_tables(result: api.Result) -> None:
    listing = "table 1 (a, x); table 2 (b, c, y); table 3 (a, c, z)"
    calls: list[Callable[[], object]] = [
        lambda: result.test_independence("a", "y"),
        lambda: result.association("x", "z"),
        lambda: result.marginal_table("x", "y"),
        lambda: result.conditional_columns("y", "a"),
        lambda: result.logistic("z", ["a", "b"]),
        lambda: result.marginal_table("nowhere"),
    ]
    for call in calls:
        with pytest.raises(NoTableHoldsError) as caught:
            call()
        assert listing in str(caught.value) and "r-tables" in str(caught.value)
        assert isinstance(caught.value, UnknownAttributeError)
    with pytest.raises(NoTableHoldsError, match="tables 1 to 3, not 4"):
        result.part(4)


def test_association_rows_are_routed_and_adjusted_over_every_pair(result: api.Result) -> None:
    rows = result.association_rows()
    pairs = {(r.test.a[0], r.test.b[0]) for r in rows}
    assert pairs == {("a", "x"), ("b", "y"), ("c", "y"), ("a", "z"), ("c", "z")}
    by_pair = {(r.test.a[0], r.test.b[0]): r for r in rows}
    assert by_pair[("c", "z")].test.m == _part(result, 3).plan.m  # c is in tables 2 and 3, z only in 3
    assert by_pair[("c", "y")].test.m == _part(result, 2).plan.m
    p = np.array([r.test.p_value for r in rows])
    np.testing.assert_array_equal([r.p_adjusted for r in rows], holm_adjust(p))


def test_questions_are_answered_from_their_tables(result: api.Result) -> None:
    answers = result.questions()
    d = result.design
    assert d is not None and [a.question for a in answers.answers] == QUESTIONS
    q1, q2, q3 = answers.answers
    assert [q1.table, q2.table, q3.table] == [1, 2, 3]
    for a, figure in zip(answers.answers, d.release.figures, strict=True):
        assert (a.planned_v, a.planned_power) == (figure.detectable_v, figure.power_at_v)
    # a ~ x: x copies a w.p. 0.9 (V = 0.9); at m ~ 1100 and keep 0.5 G's noncentrality is ~220, so p
    # below 1e-6 fails with probability < 1e-20. b ~ y | c is independent in the data: under H0 p is
    # (near) uniform, so p <= 1e-6 has probability <= 1e-6 (alpha = 1e-6). Fixed seeds: deterministic.
    assert q1.p_value < 1e-6 and q2.p_value > 1e-6
    want = analysis.test_independence(_part(result, 2).report, "b", "y", ["c"])
    assert (q2.statistic, q2.df, q2.p_value) == (want.statistic, want.df, want.p_value) and q2.df == 8
    # V's 95% interval: the estimate's standard error is ~0.03 at this m, so a lower end below 0.5 (10
    # standard errors under the truth) has probability far below 1e-6
    assert q1.effect.startswith("Cramer's V") and q1.ci_low > 0.5 and q1.ci_low <= q1.estimate <= q1.ci_high
    # z ~ a + c, z binary: the deviance test of a given c on table 3, exactly compare_models' figures
    part = _part(result, 3)
    cmp = analysis.compare_models(part.report, part.logistic("z", ["c"]), part.logistic("z", ["a", "c"]))
    assert (q3.statistic, q3.df, q3.p_value) == (cmp.statistic, cmp.df, cmp.p_value) and q3.df == 1
    assert q3.test.startswith("deviance") and [c["name"] for c in q3.coefficients] == ["Intercept", "a[a1]", "c[c1]"]
    text = str(answers)
    assert all(q in text for q in QUESTIONS) and "power@0.1" in text and "deviance" in text
    frame = answers.to_frame()
    assert frame.shape[0] == 3 and frame["p_value"].tolist() == [q1.p_value, q2.p_value, q3.p_value]
    assert list(frame.columns) == list(analysis.QuestionAnswers.COLUMNS)
    doc = json.loads(json.dumps(answers.to_dict(), allow_nan=False))
    assert doc["design_digest"] == d.digest() and doc["questions"][2]["kind"] == "model"
    assert "<table>" in answers._repr_html_()


def test_a_release_of_the_whole_joint_has_no_questions(classic: api.Result) -> None:
    with pytest.raises(api.NoDesignError, match=r"r-joint.*no questions"):
        classic.questions()
    assert not classic.designed and classic.design is None and classic.parts == ()
    tables = classic.tables()
    assert len(tables) == 1 and tables.rows[0].m == classic.plan.m and classic.plan.joint_size == tables.rows[0].K
    assert classic.part(1) is classic
    assert classic.attributes == classic.report.attributes


def test_a_designed_result_saves_and_loads(result: api.Result, classic: api.Result, tmp_path: Path) -> None:
    path = result.save(tmp_path / "r.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == TABLES_FORMAT and "truth" not in doc and doc["guarantee"]["epsilon"] == doc["epsilon"]
    loaded = api.load_result(path)
    assert loaded.designed and loaded.tables_report is not None and result.tables_report is not None
    assert loaded.tables_report.to_dict() == result.tables_report.to_dict()
    assert loaded.design is not None and loaded.design.digest() == result.tables_report.design_digest
    assert loaded.questions().to_dict() == result.questions().to_dict()
    assert loaded.to_dict() == result.to_dict()
    assert repr(loaded) == repr(result).replace("; truth held, not exported", "")
    with_truth = json.loads(result.save(tmp_path / "t.json", include_truth=True).read_text())
    assert [len(t) for t in with_truth["truth"]] == [4, 18, 8]
    back = api.load_result(classic.save(tmp_path / "c.json"))  # a single table still loads as one
    assert not back.designed and np.array_equal(back.report.estimate, classic.report.estimate)
    with pytest.raises(MultiTableResultError, match="part"):
        result.to_parquet(tmp_path / "r.parquet")


def test_repr_names_the_tables_and_both_epsilons(result: api.Result) -> None:
    text = repr(result)
    t = result.tables_report
    assert t is not None
    lines = text.splitlines()
    assert lines[0].startswith("<Result r-tables: 3 tables") and "n=20000" in lines[0]
    part = _part(result, 2)
    assert f"  table 2 (b, c, y): m={part.plan.m}, gamma={part.plan.gamma:.4g}, K=18" in lines
    assert f"epsilon charged (Eq. T1) {t.epsilon:.6g}; sequential composition (Eq. T3) {t.sequential_epsilon:.6g}" \
        in lines[-1]  # fmt: skip
    assert len(lines) == 5 and text.endswith(">")
    assert _part(result, 1).guarantee == result.guarantee  # a table states the release's guarantee


def test_the_page_opens_with_the_questions_then_each_table(result: api.Result, classic: api.Result) -> None:
    page = render(result, standalone=True, charts_missing=NO_MATPLOTLIB)
    questions = page.index('<section id="questions">')
    first_table = page.index('<section class="table-section" id="table-1"')
    assert questions < page.index('<section id="tables-section">') < first_table
    answered = page[questions:first_table]
    assert all(f'data-question="{q}"' in answered for q in QUESTIONS)
    for t in (1, 2, 3):
        assert f'id="table-{t}"' in page and f'<table id="t{t}-cells">' in page
    ids = Counter(re.findall(r' id="([^"]+)"', page))
    assert [k for k, c in ids.items() if c > 1] == []  # one page, several tables: no id twice
    assert page.count("<style>") == 1 and page.lstrip().startswith("<!DOCTYPE html>")
    whole = html_report(result)  # with the charts: each table's, ids prefixed
    assert 'id="t3-bars0"' in whole and whole.index('id="questions"') < whole.index('id="table-1"')
    assert 'id="questions"' not in render(classic, standalone=True, charts_missing=NO_MATPLOTLIB)
    fragment = result._repr_html_()
    assert fragment.index('id="questions"') < fragment.index('id="table-1"') and "<!DOCTYPE" not in fragment


def test_show_prints_the_tables_the_guarantee_once_and_each_table(result: api.Result) -> None:
    from secure_release.display import explain_tables

    text = explain_tables(result)
    assert text.startswith(str(result.tables()))
    assert text.count("Guarantee:") == 1 and result.guarantee["statement"] in text
    heads = [text.index(f"Table {t}: {', '.join(a)}") for t, a in enumerate(TABLES, start=1)]
    assert heads == sorted(heads) and text.count("Parameters:") == 3
