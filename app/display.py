"""Plain-text output a person understands: every column and parameter explained in one line,
the columns in the output vocabulary (``mechanism.estimation.report.OUTPUT_COLUMNS``: the headline
``estimate`` first), cells whose interval reaches zero marked, the guarantee in standard form and
a warning when the release is mostly noise. The HTML page is ``report_page``'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from secure_release.mechanism.estimation.marginals import Marginal
from secure_release.mechanism.estimation.report import COLUMN_MEANINGS, OUTPUT_COLUMNS, ReleaseReport
from secure_release.mechanism.estimation.report import spans_zero as spans_zero  # the rule, for the demo's table
from secure_release.mechanism.privacy.guarantee import privacy_guarantee, utility_check
from secure_release.mechanism.privacy.plan import ReleasePlan

#: The printed columns and what each holds: the output vocabulary (``mechanism.estimation.report``) first,
#: then the demo's truth.
COLUMNS = (
    *COLUMN_MEANINGS.items(),
    ("truth", "the true share (known only in the demo, never to the researcher)"),
)
#: How the text tables print each output column: (width, format spec).
TEXT_FORMATS = {"estimate": (8, "8.4f"), "raw": (8, "+8.4f"), "mle": (7, "7.4f"), "se": (7, "7.4f"),
                "ci_low": (7, "7.4f"), "ci_high": (7, "7.4f"), "observed": (8, "8d")}  # fmt: skip


def parameter_lines(plan: ReleasePlan) -> list[str]:
    """One line per public parameter of the release."""
    sizes = " x ".join(str(k) for k in plan.alphabet_sizes)
    rows = (
        ("n", f"{plan.n}", "records all curators hold (after alignment); public"),
        ("m", f"{plan.m}", "records sampled, the same m at every curator (which ones stays secret)"),
        ("K", f"{plan.joint_size}", f"joint cells: the product of the curators' alphabet sizes ({sizes})"),
        ("epsilon", f"{plan.epsilon:g}", "privacy level: one record changes any output's probability by <= e^epsilon"),
        ("gamma", f"{plan.gamma:.4g}", f"PRAM's diagonal weight: a sampled record keeps its cell w.p. "
         f"{plan.channel.keep:.3g}, else gets a uniform cell"),
    )  # fmt: skip
    width = max(len(v) for _, v, _ in rows)
    return [f"  {name:<8} {value:>{width}}   {text}" for name, value, text in rows]


def guarantee_lines(plan: ReleasePlan, preprocessing: Sequence[str] = ()) -> list[str]:
    """The guarantee in standard form, one statement a line (and one per preprocessed attribute);
    the OpenDP and dp_accounting lines are the exact code a reader can run (``mechanism.privacy.guarantee``;
    tests run them)."""
    g = privacy_guarantee(plan, preprocessing)
    return [
        *(f"  preprocessing: {line}" for line in preprocessing),
        f"  {g['statement']}",
        f"  {g['statistical']}",
        f"  {g['computational']}",
        f"  privacy unit: {g['privacy_unit']}",
        f"  neighbouring: {g['neighbouring_relation']}",
        f"  mechanism:    {g['mechanism']}",
        f"  OpenDP ({g['opendp']['agreement']}):",
        *(f"    {line}" for line in g["opendp"]["recipe"]),
        f"  dp_accounting ({g['dp_accounting']['agreement']}):",
        *(f"    {line}" for line in g["dp_accounting"]["recipe"]),
    ]


def warning_lines(plan: ReleasePlan) -> list[str]:
    """A WARNING line when the predicted RMSE exceeds the typical cell share 1/K."""
    message = utility_check(plan)["message"]
    return [f"WARNING: {message}"] if message else []


def _table(
    attributes: Sequence[str], labels: Sequence[Sequence[Any]], columns: Mapping[str, Any],
    truth: Sequence[float] | None = None,
) -> list[str]:  # fmt: skip
    """Aligned text rows: the labels, then the output columns in :data:`OUTPUT_COLUMNS` order
    (those ``columns`` holds), a '*' after ci_high where the interval reaches 0, then the truth."""
    names = [" / ".join(str(v) for v in row) for row in labels]
    w = max([len(" / ".join(attributes)), *map(len, names)])
    shown = [c for c in OUTPUT_COLUMNS if c in columns]
    mark = spans_zero(np.asarray(columns["ci_low"]), np.asarray(columns["ci_high"]))
    head = " / ".join(attributes).ljust(w) + "".join(f" {c:>{TEXT_FORMATS[c][0]}}" for c in shown)
    lines = [head + ("  " + f"{'truth':>7}" if truth is not None else "")]
    for i, name in enumerate(names):
        row = name.ljust(w)
        for c in shown:
            fmt = TEXT_FORMATS[c][1]
            value = int(columns[c][i]) if fmt.endswith("d") else float(columns[c][i])
            row += f" {value:{fmt}}" + (("*" if mark[i] else " ") if c == "ci_high" else "")
        lines.append(row + (f" {truth[i]:7.4f}" if truth is not None else ""))
    return lines


def cell_table(report: ReleaseReport, truth: Sequence[float] | None = None) -> list[str]:
    """The cells as aligned text rows (with a truth column when given)."""
    return _table(report.attributes, report.labels, report.columns(), truth)


def explain(
    report: ReleaseReport, truth: Sequence[float] | None = None, l2: float | None = None, guarantee: bool = True
) -> str:
    """The whole human-readable result: cells, column legend, parameters, guarantee (unless
    ``guarantee`` is False: a table of a release of several, whose guarantee is the release's),
    warnings."""
    plan = report.plan
    legend = [f"  {name:<10} {text}" for name, text in COLUMNS if truth is not None or name != "truth"]
    out = [f"Release {report.release_id}: {report.note}", "", *cell_table(report, truth), "", "Columns:", *legend]
    negatives = int(np.sum(report.estimate < 0))
    marked = int(np.sum(spans_zero(report.ci_low, report.ci_high)))
    out += [
        "",
        f"{marked} of {len(report.labels)} cells have an interval reaching 0 (*); {negatives} raw estimates are "
        "negative (noise around a small share). Read the estimate column (the headline); raw is kept for "
        "unbiased aggregation.",
    ]
    out += ["", "Parameters:", *parameter_lines(plan), ""]
    if guarantee:
        out += ["Guarantee:", *guarantee_lines(plan), ""]
    rmse = utility_check(plan)["predicted_rmse"]
    err = f"l2 error of raw {l2:.4f} against the truth; " if l2 is not None else ""
    out.append(f"{err}predicted RMSE (l2, worst case) {rmse:.4f}; typical cell share 1/K = {1 / plan.joint_size:.4f}")
    out += warning_lines(plan)
    return "\n".join(out)


def marginal_lines(t: Marginal) -> list[str]:
    """A marginal table (``Result.marginal_table``) as text rows, in the output vocabulary."""
    return _table(t.attributes, t.labels.tolist(), t.columns())


def conditional_lines(columns: Mapping[str, Any], names: Sequence[str], title: str) -> str:
    """A conditional table (``Result.conditional_columns``) as text: a title line, then the
    labels and the estimate, mle, ci_low and ci_high of each row."""
    labels = np.column_stack([np.asarray(columns[a], dtype=str) for a in names]).tolist()
    return "\n".join([title, *_table(names, labels, columns)])


def explain_tables(result: Any) -> str:
    """A release of several tables (an ``api.Result`` with ``parts``) as text: its tables (epsilon
    as charged, Eq. T1, and by sequential composition, Eq. T3), then each table as :func:`explain`
    prints one (``analyst show``); a table not estimated says why."""
    g = result.guarantee
    out = [str(result.tables()), "", "Guarantee:", f"  {g['statement']}", f"  {g['statistical']}",
           f"  {g['computational']}", f"  privacy unit: {g['privacy_unit']}",
           f"  neighbouring: {g['neighbouring_relation']}", f"  mechanism:    {g['mechanism']}",
           f"  theorem:      {g['theorem']}"]  # fmt: skip
    for info, part in zip(result.tables().rows, result.parts, strict=True):
        head = f"Table {info.table}: {', '.join(info.attributes)}"
        out += ["", "=" * len(head), head, "=" * len(head)]
        out.append(f"not estimated: {info.missing}" if part is None else explain(part.report, guarantee=False))
    return "\n".join(out)
