"""Plain-text output a person understands: every column and parameter explained in one line,
standard errors and 95% intervals beside each estimate, cells whose interval spans zero marked,
the guarantee in standard form and a warning when the release is mostly noise."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.guarantee import privacy_guarantee, utility_check
from secure_release.mechanism.plan import ReleasePlan
from secure_release.mechanism.report import ReleaseReport

COLUMNS = (
    ("projected", "the headline: the raw estimate projected onto the probability simplex (>= 0, summing to 1); "
     "never further from the truth than the raw estimate (docs/estimators.md says why it is the default)"),
    ("raw A^-1", "unbiased estimate of the cell's share of the aligned table (A^-1 of the observed shares); "
     "noise can make it negative"),
    ("SE", "the raw estimate's standard error (exact variance formula at the estimate)"),
    (
        "95% CI",
        "exact (Clopper-Pearson) interval of the cell's share, within [0, 1]; '*' marks a cell whose "
        "interval reaches 0: not distinguishable from empty",
    ),
    ("truth", "the true share (known only in the demo, never to the researcher)"),
    ("observed", "how many of the m perturbed, decrypted records fell in the cell"),
)  # fmt: skip


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
    the OpenDP and dp_accounting lines are the exact code a reader can run (``mechanism.guarantee``;
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


def spans_zero(low: npt.NDArray[np.float64], high: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """Cells whose interval contains 0."""
    return np.asarray((low <= 0.0) & (high >= 0.0))


def cell_table(report: ReleaseReport, truth: Sequence[float] | None = None) -> list[str]:
    """The cells as aligned text rows (with a truth column when given)."""
    names = [" / ".join(labels) for labels in report.labels]
    w = max([len(" / ".join(report.attributes)), *map(len, names)])
    mark = spans_zero(report.ci_low, report.ci_high)
    head = f"{' / '.join(report.attributes).ljust(w)}  {'projected':>9}  {'raw A^-1':>9} {'SE':>7}  {'95% CI':^19}"
    head += f" {'truth':>7}" if truth is not None else ""
    lines = [head + f" {'observed':>8}"]
    headline = report.headline
    for c, name in enumerate(names):
        ci = f"[{report.ci_low[c]:+.4f}, {report.ci_high[c]:+.4f}]{'*' if mark[c] else ' '}"
        row = f"{name.ljust(w)}  {headline[c]:9.4f}  {report.estimate[c]:+9.4f} {report.standard_error[c]:7.4f}  "
        row += f"{ci:<19}" + (f" {truth[c]:7.4f}" if truth is not None else "")
        lines.append(row + f" {int(report.observed[c]):8d}")
    return lines


def explain(report: ReleaseReport, truth: Sequence[float] | None = None, l2: float | None = None) -> str:
    """The whole human-readable result: cells, column legend, parameters, guarantee, warnings."""
    plan = report.plan
    legend = [f"  {name:<10} {text}" for name, text in COLUMNS if truth is not None or name != "truth"]
    out = [f"Release {report.release_id}: {report.note}", "", *cell_table(report, truth), "", "Columns:", *legend]
    negatives = int(np.sum(report.estimate < 0))
    marked = int(np.sum(spans_zero(report.ci_low, report.ci_high)))
    out += [
        "",
        f"{marked} of {len(report.labels)} cells have an interval spanning 0 (*); {negatives} raw estimates are "
        "negative (noise around a small share). Read the projected column (the headline); the raw A^-1 "
        "estimate is kept for unbiased aggregation.",
    ]
    out += ["", "Parameters:", *parameter_lines(plan), "", "Guarantee:", *guarantee_lines(plan), ""]
    rmse = utility_check(plan)["predicted_rmse"]
    err = f"l2 error {l2:.4f} against the truth; " if l2 is not None else ""
    out.append(f"{err}predicted RMSE (l2, worst case) {rmse:.4f}; typical cell share 1/K = {1 / plan.joint_size:.4f}")
    out += warning_lines(plan)
    return "\n".join(out)


def marginal_lines(columns: Mapping[str, Any], attributes: Sequence[str]) -> list[str]:
    """A marginal table (as the API's ``Result.marginal_table``) as text rows."""
    labels = columns["labels"]
    names = [" / ".join(str(v) for v in row) for row in labels]
    w = max([len(" / ".join(attributes)), *map(len, names)])
    out = [f"{' / '.join(attributes).ljust(w)}  {'projected':>9}  {'raw A^-1':>9} {'SE':>7}  {'95% CI':^19}"]
    for i, name in enumerate(names):
        ci = f"[{columns['ci_low'][i]:+.4f}, {columns['ci_high'][i]:+.4f}]"
        out.append(
            f"{name.ljust(w)}  {columns['projected'][i]:9.4f}  {columns['estimate'][i]:+9.4f} "
            f"{columns['standard_error'][i]:7.4f}  {ci:<19}"
        )
    return out


def html_report(result: Any) -> str:
    """One self-contained HTML page a researcher can send (``secure-release analyst report``):
    the plan, the guarantee, the budget this release spent, the cells table, one marginal chart
    per attribute with its 95% intervals (inline SVG: no script, no external file) and the
    warnings. Built from the same :class:`~secure_release.api.Result` as ``analyst show``; every
    number also sits in a ``data-value`` attribute at full precision (a reader can check it).
    ``result`` never carries the truth here (the page is for sending)."""
    from html import escape

    report, plan = result.report, result.report.plan
    g = privacy_guarantee(plan)

    def num(value: float, shown: str) -> str:
        return f'<td data-value="{float(value)!r}">{escape(shown)}</td>'

    params = "".join(
        f"<tr><th>{escape(name)}</th><td>{escape(value)}</td><td>{escape(text)}</td></tr>"
        for name, value, text in (
            ("n", f"{plan.n}", "records all curators hold (after alignment)"),
            ("m", f"{plan.m}", "records sampled"),
            ("K", f"{plan.joint_size}", "joint cells"),
            ("epsilon spent", f"{plan.epsilon:g}", "this release's share of each curator's budget"),
            ("gamma", f"{plan.gamma:.6g}", "PRAM's diagonal weight"),
        )
    )
    head = "".join(f"<th>{escape(a)}</th>" for a in report.attributes)
    rows = []
    for c, labels in enumerate(report.labels):
        cells = "".join(f"<td>{escape(str(v))}</td>" for v in labels)
        rows.append(
            f'<tr class="cell">{cells}{num(report.estimate[c], f"{report.estimate[c]:+.4f}")}'
            f'{num(report.standard_error[c], f"{report.standard_error[c]:.4f}")}'
            f'{num(report.ci_low[c], f"{report.ci_low[c]:+.4f}")}{num(report.ci_high[c], f"{report.ci_high[c]:+.4f}")}'
            f'{num(report.projected[c], f"{report.projected[c]:.4f}")}</tr>'
        )
    charts = [_svg_marginal(result.marginal_table(a), a) for a in report.attributes]
    warnings = "".join(f'<p class="warning">WARNING: {escape(w)}</p>' for w in result.warnings)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Release {escape(report.release_id)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}.warning{{color:#a00}}</style></head>
<body><h1>Release <span id="release-id">{escape(report.release_id)}</span></h1>
<p>{escape(report.note)}</p>
<h2>Plan</h2><table id="plan">{params}</table>
<h2>Guarantee</h2><p id="guarantee">{escape(g['statement'])} {escape(g['statistical'])}
{escape(g['computational'])} Privacy unit:
{escape(g['privacy_unit'])}; neighbouring: {escape(g['neighbouring_relation'])}; mechanism: {escape(g['mechanism'])}.
Releases on the same data compose: their epsilons add.</p>
<h2>Cells</h2><table id="cells"><thead><tr>{head}<th>estimate</th><th>SE</th><th>95% CI low</th>
<th>95% CI high</th><th>projected</th></tr></thead><tbody>{"".join(rows)}</tbody></table>
<h2>Marginals</h2>{"".join(charts)}
<h2>Warnings</h2>{warnings or "<p>none</p>"}
</body></html>
"""


def _svg_marginal(t: Any, attribute: str) -> str:
    """A bar chart of one marginal with its 95% intervals as error bars (inline SVG)."""
    from html import escape

    width, height, pad = 480, 220, 30
    top = max(1e-9, float(np.max(np.maximum(t.estimate, t.ci_high))))
    bottom = min(0.0, float(np.min(np.minimum(t.estimate, t.ci_low))))

    def y(v: float) -> float:
        return pad + (top - v) / (top - bottom) * (height - 2 * pad)

    step = (width - 2 * pad) / max(1, t.estimate.size)
    parts = [f'<line x1="{pad}" x2="{width - pad}" y1="{y(0.0):.1f}" y2="{y(0.0):.1f}" stroke="black"/>']
    for i in range(t.estimate.size):
        x = pad + i * step
        est, lo, hi = float(t.estimate[i]), float(t.ci_low[i]), float(t.ci_high[i])
        label = escape(str(t.labels[i, 0]))
        parts.append(
            f'<rect class="bar" data-label="{label}" data-estimate="{est!r}" data-ci-low="{lo!r}" '
            f'data-ci-high="{hi!r}" x="{x + step * 0.15:.1f}" width="{step * 0.7:.1f}" '
            f'y="{min(y(est), y(0.0)):.1f}" height="{abs(y(est) - y(0.0)):.1f}" fill="#4c72b0"/>'
            f'<line x1="{x + step / 2:.1f}" x2="{x + step / 2:.1f}" y1="{y(hi):.1f}" y2="{y(lo):.1f}" stroke="black"/>'
            f'<text x="{x + step / 2:.1f}" y="{height - 8}" font-size="10" text-anchor="middle">{label}</text>'
        )
    return (f'<h3>{escape(attribute)}</h3><svg class="marginal" data-attribute="{escape(attribute)}" '
            f'width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>')  # fmt: skip
