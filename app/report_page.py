"""The release page: one Jinja2 template (``templates/report.html.j2``, package data) serves
``secure-release analyst report`` (a whole, self-contained HTML document) and the notebook's
``Result._repr_html_`` (the same page as a fragment).

Order on the page: the headline summary and every warning, the charts (``plotting.report_charts``:
a bar chart per attribute, a heat map per pair when there are two to four; matplotlib SVG with
text kept as text), the associations (every cross-curator pair tested, Holm-adjusted, Cramer's V
with its interval: ``analysis.associations``), the guarantee as a definition list, the plan, then
the cells in the output
vocabulary (``mechanism.estimation.report.OUTPUT_COLUMNS``). Every number shown also sits at full precision
in a ``data-value`` attribute. No script and no fetch: the page opens offline and prints on A4.

Without matplotlib (the ``plot`` extra) ``analyst report`` refuses with a message saying how to
install it (:func:`html_report` raises ``MissingDependencyError``); the notebook page, which must
not raise, shows that message where the charts would be.
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.analysis import counted
from secure_release.frames import MissingDependencyError
from secure_release.mechanism.estimation.report import COLUMN_MEANINGS, OUTPUT_COLUMNS, spans_zero
from secure_release.mechanism.privacy.guarantee import privacy_guarantee, utility_check

#: How each output column is shown (the ``data-value`` attribute keeps full precision).
FORMATS = {"estimate": "%.4f", "raw": "%+.4f", "mle": "%.4f", "se": "%.4f", "ci_low": "%.4f", "ci_high": "%.4f",
           "observed": "%d"}  # fmt: skip
#: What the page says instead of the charts when matplotlib is missing.
NO_MATPLOTLIB = "the charts need matplotlib: pip install 'secure-release[plot]'"


@cache
def _template() -> Any:
    from jinja2 import Environment, StrictUndefined

    env = Environment(autoescape=True, undefined=StrictUndefined, keep_trailing_newline=True)
    text = resources.files("secure_release").joinpath("templates/report.html.j2").read_text(encoding="utf-8")
    return env.from_string(text)


def _shown(values: npt.NDArray[Any], fmt: str) -> list[tuple[str, str]]:
    """(full precision, shown) text pairs of a column."""
    shown = np.char.mod(fmt, values.astype(np.int64) if fmt == "%d" else values)
    return list(zip((repr(v) for v in values.tolist()), shown.tolist(), strict=True))


def _cells(result: Any) -> list[dict[str, Any]]:
    columns = result.report.columns()
    shown = [_shown(np.asarray(columns[name]), FORMATS[name]) for name in OUTPUT_COLUMNS]
    return [{"labels": labels, "numbers": [col[c] for col in shown]} for c, labels in enumerate(result.report.labels)]


def _summary(result: Any, spans: int) -> list[dict[str, str]]:
    plan, utility = result.plan, utility_check(result.plan)
    items = (
        ("epsilon", "epsilon (spent)", plan.epsilon, f"{plan.epsilon:g}"),
        ("n", "records n", plan.n, f"{plan.n:,}"),
        ("m", "sampled m", plan.m, f"{plan.m:,}"),
        ("K", "cells K", plan.joint_size, f"{plan.joint_size:,}"),
        ("rmse", "predicted RMSE per cell", utility["predicted_rmse_per_cell"],
         f"{utility['predicted_rmse_per_cell']:.4f}"),
        ("typical", "typical share 1/K", utility["typical_cell_share"], f"{utility['typical_cell_share']:.4f}"),
        ("spans_zero", "cells whose interval reaches 0", spans, f"{spans} of {len(result.report.labels)}"),
    )  # fmt: skip
    return [{"key": k, "name": name, "value": repr(value), "shown": shown} for k, name, value, shown in items]


def _guarantee(result: Any) -> tuple[list[tuple[str, str]], list[dict[str, str]]]:
    g = privacy_guarantee(result.plan)
    terms = [
        ("Statement", g["statement"]),
        ("Privacy unit", g["privacy_unit"]),
        ("Neighbouring relation", g["neighbouring_relation"]),
        ("What is statistical", g["statistical"]),
        ("What is computational", g["computational"]),
        ("Mechanism", g["mechanism"]),
        ("Theorem", g["theorem"]),
        ("Composition", g["composition"]),
        ("Analyses", "The associations on this page, and every test, effect size and model of "
         "`secure-release analyst test` and the notebook's Result, are post-processing of the released "
         "counts: they spend no privacy budget."),
    ]
    recipes = [
        {"name": name, "agreement": g[key]["agreement"], "code": "\n".join(g[key]["recipe"])}
        for name, key in (("OpenDP", "opendp"), ("dp_accounting", "dp_accounting"))
    ]
    return terms, recipes


def _plan(result: Any) -> list[dict[str, str]]:
    plan = result.plan
    sizes = " x ".join(str(k) for k in plan.alphabet_sizes)
    rows = (
        ("n", plan.n, f"{plan.n}", "records all curators hold (after alignment); public"),
        ("m", plan.m, f"{plan.m}", "records sampled, the same m at every curator (which ones stays secret)"),
        ("K", plan.joint_size, f"{plan.joint_size}", f"joint cells: the product of the alphabet sizes ({sizes})"),
        ("epsilon spent", plan.epsilon, f"{plan.epsilon:g}", "this release's share of each curator's budget"),
        ("gamma", plan.gamma, f"{plan.gamma:.6g}", f"PRAM's diagonal weight: a sampled record keeps its cell w.p. "
         f"{plan.channel.keep:.3g}, else gets a uniform cell"),
    )  # fmt: skip
    return [{"name": name, "value": repr(value), "shown": shown, "text": text} for name, value, shown, text in rows]


def _charts(result: Any, prefix: str = "") -> list[dict[str, Any]]:
    from secure_release.plotting import report_charts

    def caption(attributes: tuple[str, ...]) -> str:
        return attributes[0] if len(attributes) == 1 else f"{attributes[0]} by {attributes[1]}"

    return [{"chart_id": c.chart_id, "attributes": c.attributes, "caption": caption(c.attributes),
             "svg": _prefixed_svg(c.svg, prefix)} for c in report_charts(result)]  # fmt: skip


def _prefixed_svg(svg: str, prefix: str) -> str:
    """``svg`` with every id it declares, and every reference to one, starting with ``prefix``:
    the charts of several tables on one page then share no id (matplotlib names a chart's clip
    paths and glyphs alike in every chart)."""
    if not prefix:
        return svg
    out = svg.replace(' id="', f' id="{prefix}').replace("url(#", f"url(#{prefix}")
    return out.replace('href="#', f'href="#{prefix}')


#: The associations table's numeric columns, in order, and how each is shown.
ASSOCIATION_COLUMNS = (("statistic", "%.3f"), ("df", "%d"), ("p_value", "%.4f"), ("p_holm", "%.4f"),
                       ("cramers_v", "%.4f"), ("v_ci_low", "%.4f"), ("v_ci_high", "%.4f"),
                       ("mutual_information", "%.4f"))  # fmt: skip


def _associations(result: Any) -> dict[str, Any]:
    """The Associations section: every cross-curator pair (``analysis.associations``), or why not."""
    from secure_release.analysis import ADJUSTMENT
    from secure_release.mechanism.errors import SecureReleaseError

    try:
        rows = result.association_rows()
    except SecureReleaseError as exc:
        return {"associations": [], "associations_missing": f"no associations: {exc}", "association_method": "",
                "association_level": "", "association_interval": "", "association_adjustment": ""}  # fmt: skip
    table = [r.to_dict() for r in rows]
    out = [
        {"a": d["a"], "b": d["b"],
         "numbers": [(repr(d[k]), fmt % (int(d[k]) if fmt == "%d" else d[k])) for k, fmt in ASSOCIATION_COLUMNS]}
        for d in table
    ]  # fmt: skip
    first = rows[0] if rows else None
    return {
        "associations": out,
        "associations_missing": None,
        "association_method": first.test.method if first else "",
        "association_level": f"{100 * first.effect.effects.level:g}%" if first else "",
        "association_interval": first.effect.effects.method if first else "",
        "association_adjustment": ADJUSTMENT,
    }


def render(result: Any, standalone: bool, charts_missing: str | None = None) -> str:
    """The page of ``result`` (an :class:`~secure_release.api.Result`), a whole document when
    ``standalone``; ``charts_missing`` replaces the charts with that message. A release of
    several tables: :func:`render_tables`."""
    if getattr(result, "parts", ()):
        return render_tables(result, standalone, charts_missing)
    return _render_table(result, standalone, charts_missing)


def _render_table(result: Any, standalone: bool, charts_missing: str | None, prefix: str = "") -> str:
    """One table's page; with ``prefix``, its section of a release of several tables (no wrapper,
    style or guarantee; every id starting with ``prefix``)."""
    spans = int(np.sum(spans_zero(result.report.ci_low, result.report.ci_high)))
    negatives = int(np.sum(result.report.estimate < 0.0))
    note = (f"{spans} of {len(result.report.labels)} cells have a 95% interval reaching 0: not distinguishable "
            f"from empty; {negatives} raw estimates are negative (noise around a small share)")  # fmt: skip
    notes = [note] if spans else []
    terms, recipes = _guarantee(result)
    return str(
        _template().render(
            standalone=standalone and not prefix,
            tables_page=False,
            bare=bool(prefix),
            prefix=prefix,
            h="h3" if prefix else "h2",
            release_id=result.report.release_id,
            note=result.report.note,
            summary=_summary(result, spans),
            warnings=[*result.warnings, *notes],
            charts=[] if charts_missing else _charts(result, prefix),
            charts_missing=charts_missing,
            **_associations(result),
            guarantee=terms,
            recipes=recipes,
            plan=_plan(result),
            legend=list(COLUMN_MEANINGS.items()),
            attributes=result.report.attributes,
            columns=OUTPUT_COLUMNS,
            cells=_cells(result),
        )
    )


#: The numeric columns of the questions' table, in order, after Q, question, table, test and effect.
QUESTION_COLUMNS = (("statistic", "G"), ("df", "df"), ("p_value", "p"), ("estimate", "estimate"),
                    ("ci_low", "low"), ("ci_high", "high"), ("planned_v", "V planned"))  # fmt: skip


def _number(value: Any, fmt: str) -> tuple[str, str]:
    """(full precision, shown) of one number of the questions' or tables' table ("" when missing)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return repr(value), "" if value is None or math.isnan(value) else "none"
    return repr(value), fmt % value


def _questions(result: Any) -> dict[str, Any]:
    """The Questions section: every question of the design answered (``Result.questions``), or why not."""
    from secure_release.analysis import short_test
    from secure_release.mechanism import printing
    from secure_release.mechanism.errors import SecureReleaseError

    try:
        answers = result.questions()
    except SecureReleaseError as exc:
        return {"questions": [], "questions_missing": f"no answers: {exc}", "questions_header": [],
                "questions_notes": [], "questions_level": "", "questions_planned": ""}  # fmt: skip
    header = ["Q", "question", "table", "test", "effect", *(name for _, name in QUESTION_COLUMNS)]
    if answers.at_v is not None:
        header.append(f"power at V {answers.at_v:g}")
    rows = []
    for a in answers.answers:
        numbers = [
            _number(a.statistic, "%.4g"), _number(a.df, "%d"),
            (repr(a.p_value), printing.p_value(a.p_value) if a.answered else ""),
            _number(a.estimate, "%.4f"), _number(a.ci_low, "%.4f"), _number(a.ci_high, "%.4f"),
            _number(a.planned_v, "%.3f"),
        ]  # fmt: skip
        if answers.at_v is not None:
            numbers.append(_number(a.planned_power, "%.3f"))
        rows.append({"number": a.number, "question": a.question, "table": a.table, "numbers": numbers,
                     "test": short_test(a.test) if a.answered else "not answered", "effect": a.effect})  # fmt: skip
    notes = [*(f"Q{a.number}: {a.test}" for a in answers.answers if a.answered),
             *(f"Q{a.number}: {a.note}" for a in answers.answers if a.note),
             *(f"Q{a.number} p-value: {a.method}" for a in answers.answers if a.method)]  # fmt: skip
    planned = (f"with probability {answers.power:g} at level {answers.alpha:g}, for the {answers.planned_n:,} "
               "records the design planned; 'none': no useful power")  # fmt: skip
    level = next((a.level for a in answers.answers if a.answered), 0.95)
    return {"questions": rows, "questions_missing": None, "questions_header": header, "questions_notes": notes,
            "questions_level": f"{100 * level:g}%", "questions_planned": planned}  # fmt: skip


def _tables_summary(result: Any) -> list[dict[str, str]]:
    t, tables = result.tables_report, result.tables()
    d = result.design
    items = [
        ("epsilon", "epsilon charged (Eq. T1)", t.epsilon, f"{t.epsilon:.6g}"),
        ("sequential_epsilon", "by sequential composition (Eq. T3)", t.sequential_epsilon,
         f"{t.sequential_epsilon:.6g}"),
        ("n", "records n", tables.n, f"{tables.n:,}"),
        ("tables", "tables", len(tables), f"{len(tables)}"),
    ]  # fmt: skip
    if d is not None:
        items.append(("questions", "questions", len(d.questions), f"{len(d.questions)}"))
    items.append(("design", "design (SHA-256)", t.design_digest, t.design_digest[:16]))
    return [{"key": k, "name": name, "value": repr(value), "shown": shown} for k, name, value, shown in items]


def _tables_rows(result: Any) -> list[dict[str, Any]]:
    return [{"table": x.table, "attributes": ", ".join(x.attributes), "curators": ", ".join(x.curators),
             "answers": ", ".join(f"Q{q}" for q in x.questions) or ("not estimated" if x.missing else ""),
             "numbers": [_number(x.K, "%d"), _number(x.m, "%d"), _number(x.gamma, "%.6g"), _number(x.keep, "%.4g")]}
            for x in result.tables().rows]  # fmt: skip


def _tables_guarantee(result: Any) -> list[tuple[str, str]]:
    g = result.guarantee
    return [
        ("Statement", g["statement"]),
        ("Privacy unit", g["privacy_unit"]),
        ("Neighbouring relation", g["neighbouring_relation"]),
        ("What is statistical", g["statistical"]),
        ("What is computational", g["computational"]),
        ("Mechanism", g["mechanism"]),
        ("Theorem", g["theorem"]),
        ("Sequential composition", f"the tables' epsilons by sequential composition (Eq. T3) would sum to "
         f"{g['sequential_epsilon']:.6g}; the release is charged {g['epsilon']:.6g} (Eq. T1), never more"),
        ("Analyses", "The answers and associations on this page, and every test, effect size and model of "
         "`secure-release analyst` and the notebook's Result, are post-processing of the released counts: they "
         "spend no privacy budget."),
    ]  # fmt: skip


def render_tables(result: Any, standalone: bool, charts_missing: str | None = None) -> str:
    """The page of a release of several tables: the summary (epsilon as charged and by
    sequential composition), the design's questions answered, the tables, the whole release's
    guarantee, then one section a table (``table-1``, ...: the single-table page's summary, charts,
    associations, plan and cells, every id prefixed ``t1-``, ...)."""
    t = result.tables_report
    d = result.design
    sections = []
    for number, part in enumerate(result.parts, start=1):
        info = result.tables().rows[number - 1]
        fragment = "" if part is None else _render_table(part, False, charts_missing, prefix=f"t{number}-").strip()
        sections.append({"number": number, "attributes": info.attributes, "missing": info.missing,
                         "fragment": fragment})  # fmt: skip
    questions = f" designed for {counted(len(d.questions), 'question')}" if d is not None else ""
    note = (f"A release of {counted(len(result.parts), 'table')} from disjoint samples of one alignment{questions} "
            f"(design {t.design_digest[:16]}): each table answers only what it holds.")  # fmt: skip
    return str(
        _template().render(
            standalone=standalone,
            tables_page=True,
            bare=False,
            release_id=t.release_id,
            note=note,
            summary=_tables_summary(result),
            warnings=list(result.warnings),
            **_questions(result),
            tables=_tables_rows(result),
            guarantee=_tables_guarantee(result),
            table_sections=sections,
        )
    )


def html_report(result: Any) -> str:
    """The whole page ``analyst report`` writes (raises ``MissingDependencyError`` without matplotlib)."""
    return render(result, standalone=True)


def report_fragment(result: Any) -> str:
    """The page as a fragment for a notebook; without matplotlib it says how to get the charts."""
    try:
        return render(result, standalone=False)
    except MissingDependencyError:
        return render(result, standalone=False, charts_missing=NO_MATPLOTLIB)
