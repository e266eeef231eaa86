"""Every analysis result prints as a short table a statistician reads (R's print.htest for a
test, statsmodels' summary() for a model): the figures rounded as the formats say, computed here
from the objects' own attributes; a repr of a line or two, never an array; an HTML fragment that
parses, holds a table and escapes a hostile name; DataFrames equal to the attributes."""

from __future__ import annotations

import dataclasses
import html
import math
import re
from html.parser import HTMLParser
from typing import Any

import numpy as np
import pytest
from scipy import stats
from test_analysis_glue import released

from secure_release import analysis, api
from secure_release.mechanism import printing
from secure_release.mechanism.analysis import association as assoc
from secure_release.mechanism.analysis import power as pw
from secure_release.mechanism.analysis import subtables
from secure_release.mechanism.analysis.suggest import pair_power_view, suggest_changes
from secure_release.mechanism.errors import ShapeMismatchError
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.schema import CuratorSchema, attribute_from_dict

HOSTILE = "<script>alert('x')</script>"
# the issue's schemas of test_plan_suggest (K = 15,750 at n = 5,800: the plan says noise)
ISSUE_ALICE = [{"name": "age", "bins": [17, 22, 27, 32, 37, 42, 47, 52]},
               {"name": "educ", "categories": ["a", "b", "c", "d", "e", "f"],
                "groups": {"school": ["a", "b"], "college": ["c", "d"], "graduate": ["e", "f"]}},
               {"name": "rate", "categories": ["1", "2", "3", "4", "5"]}]  # fmt: skip
ISSUE_BOB = [{"name": "religious", "categories": ["1", "2", "3", "4", "5"]},
             {"name": "affairs", "bins": [4 * i for i in range(16)]}]  # fmt: skip


# ----------------------------------------------------------------------- references written here
def r_pval(p: float) -> str:
    """R's format.pval(p, digits = 4): below .Machine$double.eps '< 2.2e-16', else 4 significant digits."""
    return "< 2.2e-16" if p < np.finfo(float).eps else f"{p:.4g}"


def dec4(x: float) -> str:
    """An estimate to 4 decimals (R's Inf for infinity)."""
    return {math.inf: "Inf", -math.inf: "-Inf"}.get(x, f"{x:.4f}")


def flat(text: str) -> str:
    """Text with its wrapping undone (every run of blanks one space)."""
    return " ".join(text.split())


def row_of(text: str, label: str) -> list[str]:
    """The cells after ``label`` of the one table row it heads (a row label is padded by at least
    two blanks, which tells a row from a note that starts with the same words)."""
    hits = [line for line in text.splitlines() if re.match(re.escape(label) + r"\s{2,}\S", line)]
    assert len(hits) == 1, (label, text)
    return hits[0][len(label):].split()


def line_with(text: str, piece: str) -> str:
    hits = [line for line in text.splitlines() if piece in line]
    assert len(hits) == 1, (piece, text)
    return hits[0]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.opened.append(tag)
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (tag, self.stack)
        self.stack.pop()


def check_html(page: str, hostile: bool = True) -> None:
    """The fragment parses with every element closed in order, holds a table and no script; a
    planted hostile name is escaped, never raw."""
    parser = _Tags()
    parser.feed(page)
    parser.close()
    assert not parser.stack, parser.stack
    assert "table" in parser.opened and ("th" in parser.opened or "td" in parser.opened)
    assert "script" not in parser.opened
    if hostile:
        assert HOSTILE not in page and html.escape(HOSTILE, quote=True) in page


def check_repr(obj: object, *must: str) -> str:
    text = repr(obj)
    assert len(text) < 300 and "array(" not in text and text.count("\n") <= 2, text
    for piece in must:
        assert piece in text, (piece, text)
    return text


# ------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def result() -> api.Result:
    return released()


@pytest.fixture(scope="module")
def models(result: api.Result) -> tuple[analysis.Model, analysis.Model, analysis.ModelComparison]:
    full = result.logistic("salary", ["education", "sex"])
    reduced = result.logistic("salary", ["sex"])
    return full, reduced, result.compare_models(reduced, full)


# ------------------------------------------------------------------------------------ formats
def test_number_formats_are_r_and_statsmodels_ones() -> None:
    assert [printing.p_value(p) for p in (0.0155321, 1.0, 3.2e-5, 0.0004764, 1e-20, np.finfo(float).eps)] == [
        "0.01553", "1", "3.2e-05", "0.0004764", "< 2.2e-16", "2.22e-16"]  # fmt: skip
    assert printing.p_value(math.nan) == "NaN" and printing.fixed(math.inf) == "Inf"
    assert printing.fixed(-0.68204) == "-0.6820" and printing.fixed(9.008e12) == "9.008e+12"
    assert printing.interval_columns(0.95) == ("[0.025", "0.975]")
    assert printing.interval_columns(0.9) == ("[0.05", "0.95]")
    with pytest.raises(ShapeMismatchError, match="a row of 2 cells in a table of 3 columns"):
        printing.table_lines(["a", "b", "c"], [["1", "2"]])


# ------------------------------------------------------------------------------------- tests
def test_a_test_prints_as_r_print_htest(result: api.Result) -> None:
    t = result.test_independence("education", "salary", given="sex", draws=199)
    text = str(t)
    lines = text.splitlines()
    assert lines[0] == "Likelihood-ratio test of independence on perturbed counts" and lines[1] == ""
    assert f"G = {t.statistic:.4g}, df = {t.df}, p-value = {r_pval(t.p_value)}" in lines
    assert f"data: education and salary given sex ({t.strata} strata); m = {t.m} released records" in flat(text)
    assert f"null hypothesis: {t.hypothesis}" in flat(text)
    assert "alternative hypothesis: education and salary are associated within some level of sex" in flat(text)
    assert f"method: {flat(t.method)}" in flat(text)
    assert str(t.statistic) not in text  # rounded for reading; the full value stays on the object
    check_repr(t, f"p-value = {r_pval(t.p_value)}", f"m = {t.m}", "education ~ salary | sex")
    check_html(dataclasses.replace(t, a=(HOSTILE,))._repr_html_())
    # the floor: a p-value below the double epsilon prints as R prints it, never as a tiny number
    tiny = dataclasses.replace(t, p_value=1e-20)
    assert "p-value = < 2.2e-16" in str(tiny) and "1e-20" not in str(tiny) and "< 2.2e-16" in repr(tiny)


def test_the_mechanism_test_prints_as_r_print_htest(result: api.Result) -> None:
    r = result.report
    table = subtables.attribute_table(r.observed, analysis.release_layout(r), [["education"], ["salary"], ["sex"]])
    t = assoc.independence_test(table, r.plan.channel.keep, draws=99, seed=1)
    text = str(t)
    assert text.splitlines()[0] == "Likelihood-ratio test of independence on perturbed counts"
    assert f"data:  an observed {table.shape[0]} x {table.shape[1]} table, {table.shape[2]} strata" in text
    assert f"G = {t.statistic:.4g}, df = {t.df}, p-value = {r_pval(t.p_value)}" in text.splitlines()
    assert f"method: {flat(t.method)}" in flat(text)
    check_repr(t, f"p-value = {r_pval(t.p_value)}", f"{t.draws} draws")
    check_html(dataclasses.replace(t, method=HOSTILE)._repr_html_())
    wald = assoc.rappor_wald_test(table[:, :, 0], r.plan.channel.keep)
    assert str(wald).startswith("Wald test of independence")
    assert f"W = {wald.statistic:.4g}, df = {wald.df}" in str(wald)
    assert "W = " in repr(wald) and "chi-square" in repr(wald)


# ----------------------------------------------------------------------------------- effects
def test_an_association_prints_its_effects_with_intervals(result: api.Result) -> None:
    x = result.association("sex", "salary")  # 2 x 2: V, MI, odds ratio, risk difference
    text = str(x)
    assert text.splitlines()[0] == "Association of sex with salary (2 x 2 table), 95% intervals"
    assert line_with(text, "[0.025").split() == ["estimate", "[0.025", "0.975]"]
    labels = {"cramers_v": "Cramer's V", "mutual_information": "mutual information (nats)",
              "odds_ratio": "odds ratio", "risk_difference": "risk difference"}  # fmt: skip
    assert [e.name for e in x.measures()] == list(labels)
    for e in x.measures():
        assert row_of(text, labels[e.name]) == [dec4(e.estimate), dec4(e.low), dec4(e.high)]
    assert f"intervals: {flat(x.effects.method)}" in flat(text) and analysis.NO_BUDGET in text
    check_repr(x, f"Cramer's V = {dec4(x.cramers_v)} [{dec4(x.ci_low)}, {dec4(x.ci_high)}]")
    check_html(dataclasses.replace(x, a=(HOSTILE,))._repr_html_())
    # the mechanism's objects
    fx = x.effects
    assert str(fx.cramers_v) == f"Cramer's V = {dec4(fx.cramers_v.estimate)}, interval [{dec4(fx.cramers_v.low)}, " \
        f"{dec4(fx.cramers_v.high)}]"  # fmt: skip
    check_repr(fx.cramers_v, dec4(fx.cramers_v.estimate))
    check_html(dataclasses.replace(fx.cramers_v, name=HOSTILE)._repr_html_())
    assert row_of(str(fx), "odds ratio") == [
        dec4(fx.odds_ratio.estimate), dec4(fx.odds_ratio.low), dec4(fx.odds_ratio.high)]  # type: ignore[union-attr]
    check_repr(fx, dec4(fx.cramers_v.estimate), "4 effects")
    check_html(dataclasses.replace(fx, method=HOSTILE)._repr_html_())


def test_an_association_as_a_frame_is_its_effects(result: api.Result) -> None:
    x = result.association("sex", "salary")
    frame = x.to_frame()
    assert list(frame.columns) == ["effect", "estimate", "ci_low", "ci_high"]
    assert list(frame["effect"]) == [e.name for e in x.measures()]
    for column, field in (("estimate", "estimate"), ("ci_low", "low"), ("ci_high", "high")):
        assert frame[column].tolist() == [getattr(e, field) for e in x.measures()]
    pl = pytest.importorskip("polars")
    polars_frame = x.to_frame(backend="polars")
    assert isinstance(polars_frame, pl.DataFrame) and polars_frame["estimate"].to_list() == frame["estimate"].tolist()


def test_an_association_row_prints_the_test_the_effect_and_holm(result: api.Result) -> None:
    rows = result.association_rows(draws=99)
    row = rows[0]
    text = str(row)
    t, v = row.test, row.effect.effects.cramers_v
    assert f"data: {t.a[0]} ({row.holders[0]}) and {t.b[0]} ({row.holders[1]}); m = {t.m}" in flat(text)
    assert f"G = {t.statistic:.4g}, df = {t.df}, p-value = {r_pval(t.p_value)}" in text.splitlines()
    assert f"Cramer's V = {dec4(v.estimate)}, 95% interval [{dec4(v.low)}, {dec4(v.high)}]" in text.splitlines()
    assert f"Holm-adjusted p-value = {r_pval(row.p_adjusted)}" in text
    check_repr(row, f"Holm {r_pval(row.p_adjusted)}", row.holders[0])
    check_html(dataclasses.replace(row, holders=(HOSTILE, "bob"))._repr_html_())
    frame = row.to_frame()
    assert len(frame) == 1 and list(frame.columns) == list(row.to_dict())
    assert {k: frame[k].iloc[0] for k in frame.columns} == row.to_dict()
    assert list(frame.columns) == list(result.associations(draws=99).columns)


# ------------------------------------------------------------------------------------- models
def _coefficient_rows(text: str, names: tuple[str, ...]) -> list[list[str]]:
    return [row_of(text, name) for name in names]


def test_a_model_prints_as_a_statsmodels_summary(
    models: tuple[analysis.Model, analysis.Model, analysis.ModelComparison],
) -> None:
    full = models[0]
    f = full.fit
    text = str(full)
    assert text.splitlines()[0].strip() == "Logistic regression of salary on perturbed counts"
    assert re.search(r"Model:\s+salary ~ education \+ sex\s", text)
    assert re.search(r"m \(records\):\s+(\d+)", text).group(1) == str(int(f.observed.sum()))  # type: ignore[union-attr]
    assert re.search(r"Log-likelihood:\s+(\S+)", text).group(1) == f"{f.log_likelihood:.6g}"  # type: ignore[union-attr]
    assert re.search(r"Converged:\s+(\S+)", text).group(1) == "yes"  # type: ignore[union-attr]
    assert re.search(r"Keep probability a:\s+(\S+)", text).group(1) == f"{f.keep:.4g}"  # type: ignore[union-attr]
    assert line_with(text, "P>|z|").split() == ["coef", "std", "err", "z", "P>|z|", "[0.025", "0.975]"]
    z = f.coef / f.standard_error
    p = 2 * stats.norm.sf(np.abs(z))
    expected = [[dec4(c), dec4(s), f"{zz:.3f}", f"{pp:.3g}", dec4(lo), dec4(hi)]
                for c, s, zz, pp, lo, hi in zip(f.coef, f.standard_error, z, p, f.ci_low, f.ci_high, strict=True)]
    assert _coefficient_rows(text, f.names) == expected
    assert "not estimated" not in text and "WARNING" not in text
    assert "num_params" not in text and "array(" not in text
    check_repr(full, "salary ~ education + sex", f"m = {int(f.observed.sum())}", "converged")
    check_html(dataclasses.replace(full, outcome=HOSTILE)._repr_html_())
    # the mechanism's fit prints the same table under its own header
    assert _coefficient_rows(str(f), f.names) == expected
    check_repr(f, f"m = {int(f.observed.sum())}", "converged = True")
    check_html(dataclasses.replace(f, names=(HOSTILE, *f.names[1:]))._repr_html_())


def test_a_model_as_a_frame_is_its_coefficients(
    models: tuple[analysis.Model, analysis.Model, analysis.ModelComparison],
) -> None:
    f = models[0].fit
    frame = models[0].to_frame()
    assert list(frame.columns) == ["name", "coef", "se", "z", "p_value", "ci_low", "ci_high", "not_estimated"]
    assert tuple(frame["name"]) == f.names
    for column, values in (("coef", f.coef), ("se", f.standard_error), ("ci_low", f.ci_low), ("ci_high", f.ci_high)):
        assert np.array_equal(frame[column].to_numpy(), values)
    assert np.array_equal(frame["z"].to_numpy(), f.coef / f.standard_error)
    np.testing.assert_allclose(frame["p_value"], 2 * stats.norm.sf(np.abs(f.coef / f.standard_error)), rtol=1e-9)
    assert not frame["not_estimated"].any()
    # the coefficients in the dict the JSON carries are the same numbers
    assert [c["coef"] for c in models[0].to_dict()["coefficients"]] == frame["coef"].tolist()


def test_a_comparison_prints_as_a_test_with_both_models(
    models: tuple[analysis.Model, analysis.Model, analysis.ModelComparison],
) -> None:
    full, _, c = models
    text = str(c)
    assert text.splitlines()[0] == "Deviance (likelihood-ratio) test of nested logistic models"
    assert f"G = {c.statistic:.4g}, df = {c.df}, p-value = {r_pval(c.p_value)}" in text.splitlines()
    assert "data: salary ~ sex against salary ~ education + sex" in flat(text)
    assert "added terms (education)" in flat(text)
    for name, model in (("reduced", c.reduced), ("full", c.full)):
        assert row_of(text, name)[-3:] == [str(model.fit.num_params), f"{model.fit.log_likelihood:.6g}", "-"]
    check_repr(c, f"p-value = {r_pval(c.p_value)}")
    check_html(dataclasses.replace(c, full=dataclasses.replace(full, outcome=HOSTILE))._repr_html_())
    frame = c.to_frame()
    assert list(frame["model"]) == ["reduced", "full"]
    assert frame["log_likelihood"].tolist() == [c.reduced.fit.log_likelihood, c.full.fit.log_likelihood]
    assert frame["num_params"].tolist() == [c.reduced.fit.num_params, c.full.fit.num_params]
    assert (frame["df"].iloc[1], frame["deviance"].iloc[1], frame["p_value"].iloc[1]) == (c.df, c.statistic, c.p_value)
    assert frame[["df", "deviance", "p_value"]].iloc[0].isna().all()


# ---------------------------------------------------------------------------------- plans
def test_a_power_plan_prints_a_row_per_m() -> None:
    plan = pw.power_plan(45222, [6, 4], 1.0, 3, 2, m=1000)  # asymptotic at every m
    text = str(plan)
    assert text.splitlines()[0] == f"Power of the likelihood-ratio test of independence: {plan.attributes[0]} x " \
        f"{plan.attributes[1]}"  # fmt: skip
    assert f"data: 3 x 2 levels (df = {plan.df}); n = 45222, K = 24, epsilon = 1" in flat(text)
    keep_star = pw.keep_probability(45222, plan.m_star, 24, 1.0)
    for label, m, keep, v, how in (
        ("m", plan.m, plan.keep, plan.min_detectable_cramers_v, plan.method),
        ("best m", plan.best_m, plan.best_keep, plan.min_detectable_cramers_v_at_best_m, plan.method_at_best_m),
        ("m*", plan.m_star, keep_star, plan.min_detectable_cramers_v_at_m_star, plan.method_at_m_star),
    ):
        assert row_of(text, label) == [str(m), f"{keep:.4g}", dec4(v), how]
    assert flat(plan.note) in flat(text)
    check_repr(plan, f"Cramer's V {dec4(plan.min_detectable_cramers_v)} at m = {plan.m}")
    check_html(dataclasses.replace(plan, attributes=(HOSTILE, "B"))._repr_html_())
    cols = plan.columns()
    assert cols["m"] == [plan.m, plan.best_m, plan.m_star]
    assert cols["min_detectable_cramers_v"] == [plan.min_detectable_cramers_v, plan.min_detectable_cramers_v_at_best_m,
                                                plan.min_detectable_cramers_v_at_m_star]  # fmt: skip
    assert cols["keep"] == [plan.keep, plan.best_keep, keep_star]
    # no table dependent enough: "none", and why
    hopeless = pw.power_plan(300, [6, 4], 1.0, 3, 2)
    assert math.isinf(hopeless.min_detectable_cramers_v)
    assert row_of(str(hopeless), "m*")[2] == "none" and "none: no table is dependent enough" in str(hopeless)
    assert "none" in repr(hopeless) and "inf" not in repr(hopeless)


def _issue_schemas() -> list[CuratorSchema]:
    return [CuratorSchema(name, tuple(attribute_from_dict(a) for a in attrs))
            for name, attrs in (("alice", ISSUE_ALICE), ("bob", ISSUE_BOB))]  # fmt: skip


def test_the_suggestions_print_as_a_table() -> None:
    report = suggest_changes(_issue_schemas(), 5800, 1.0, limit=4)
    text = str(report)
    now = report.current
    assert f"now: K = {now.K} ({' x '.join(map(str, now.alphabet_sizes))}), m = {now.m} (m*): per-cell RMSE " \
        f"{now.predicted_rmse_per_cell:.4g} > target {now.target:.4g}" in flat(text)  # fmt: skip
    assert report.suggestions and report.omitted > 0
    for rank, s in enumerate(report.suggestions, 1):
        row = row_of(text, str(rank))
        assert row[:4] == [str(s.figures.K), str(s.figures.m), f"{s.figures.predicted_rmse_per_cell:.4g}",
                           f"{s.figures.target:.4g}"]  # fmt: skip
        assert " ".join(row[4:]) == " ".join(", ".join(s.keeps).split())
        for item in s.gives_up:
            assert flat(f"{rank}. gives up {item}") in flat(text)
    assert f"... and {report.omitted} more" in text
    found = report.epsilon_unchanged
    assert found is not None and f"epsilon = {found.epsilon:g} would meet it, at m = {found.m}" in flat(text)
    check_repr(report, f"{len(report.suggestions)} suggestion(s) (+{report.omitted} more)", f"K = {now.K}")
    first = dataclasses.replace(report.suggestions[0], keeps=(HOSTILE,))
    check_html(dataclasses.replace(report, suggestions=(first, *report.suggestions[1:]))._repr_html_())
    cols = report.columns()
    assert cols["K"] == [s.figures.K for s in report.suggestions]
    assert cols["predicted_rmse_per_cell"] == [s.figures.predicted_rmse_per_cell for s in report.suggestions]


def _view_rows(view: Any) -> list[list[str]]:
    """The rows the view must print, from its plans: levels, m, the detectable V ('none' when no
    table is dependent enough), its ratio to now's (3 significant digits, when both are finite)."""
    now = view.current.min_detectable_cramers_v
    rows = []
    for plan in (view.current, *view.suggestions):
        if plan is None:
            rows.append(["-", "-", "not", "testable"])
            continue
        v = plan.min_detectable_cramers_v
        ratio = [f"{v / now:.3g}"] if math.isfinite(v) and math.isfinite(now) else []
        rows.append([str(plan.levels[0]), "x", str(plan.levels[1]), str(plan.m), dec4(v) if math.isfinite(v)
                     else "none", *ratio])  # fmt: skip
    return rows


def test_the_pair_power_view_prints_now_and_each_suggestion() -> None:
    schemas = _issue_schemas()
    report = suggest_changes(schemas, 10**6, 1.0, limit=6)
    view = pair_power_view(schemas, report, "age", "affairs")
    assert math.isinf(view.current.min_detectable_cramers_v) and None in view.suggestions  # every kind of row
    for planted in (view, dataclasses.replace(view, current=view.suggestions[0])):  # and a finite V now
        text = str(planted)
        labels = ["now", *(f"suggestion {i}" for i in range(1, len(planted.suggestions) + 1))]
        assert [row_of(text, label) for label in labels] == _view_rows(planted)
    assert "not testable: the suggestion drops one of the pair" in text
    check_repr(view, "now none", f"{len(view.suggestions)} suggestion(s)")
    check_html(dataclasses.replace(view, attributes=(HOSTILE, "affairs"))._repr_html_())
    cols = view.columns()
    assert cols["m"] == [None if p is None else p.m for p in (view.current, *view.suggestions)]


def test_the_release_plan_prints_its_figures() -> None:
    plan = plan_release(6000, [6, 4], 1.0)
    text = str(plan)
    report = plan.report()
    figures = {"n": str(plan.n), "m": str(plan.m), "K": "24", "epsilon": "1", "gamma": f"{plan.gamma:.4g}",
               "keep a": f"{report['keep_probability']:.4g}", "m*": f"{report['m_star']:.4g}",
               "RMSE": f"{report['predicted_rmse']:.4g}",
               "RMSE/cell": f"{report['predicted_rmse_per_cell']:.4g}"}  # fmt: skip
    for name, value in figures.items():
        assert row_of(text, name)[0] == value, (name, text)
    assert "WARNING" not in text and plan.utility_warning() is None
    noisy = plan_release(6000, [6, 4], 0.05)
    assert f"WARNING: {flat(noisy.utility_warning() or '')}" in flat(str(noisy))
    check_repr(plan, f"m = {plan.m}", f"gamma = {plan.gamma:.4g}")
    check_html(plan._repr_html_(), hostile=False)
    assert "WARNING" in noisy._repr_html_()
