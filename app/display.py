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
    ("estimate", "unbiased estimate of the cell's share of the aligned table (A^-1 of the observed shares); "
     "noise can make it negative"),
    ("SE", "its standard error (exact variance formula at the estimate)"),
    (
        "95% CI",
        "exact (Clopper-Pearson) interval of the cell's share, within [0, 1]; '*' marks a cell whose "
        "interval reaches 0: not distinguishable from empty",
    ),
    ("projected", "the estimate projected onto the probability simplex: >= 0 and summing to 1"),
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
    """The guarantee in standard form, one statement a line (and one per preprocessed attribute)."""
    g = privacy_guarantee(plan, preprocessing)
    return [
        *(f"  preprocessing: {line}" for line in preprocessing),
        f"  ({g['epsilon']:.4g}, {g['delta']:g})-DP, {g['definition']}",
        f"  privacy unit: {g['privacy_unit']}",
        f"  neighbouring: {g['neighbouring_relation']}",
        f"  mechanism:    {g['mechanism']}",
        f"  OpenDP:       make_randomized_response(prob={g['opendp']['prob']:.6g}, {g['opendp']['categories']} "
        f"categories), amplified by sampling {plan.m} of population_size={plan.n}",
        f"  dp_accounting: RandomizedResponseDpEvent(noise_parameter={g['dp_accounting']['noise_parameter']:.6g}, "
        f"num_buckets={plan.joint_size}) inside SampledWithoutReplacementDpEvent({plan.n}, {plan.m})",
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
    head = f"{' / '.join(report.attributes).ljust(w)}  {'estimate':>9} {'SE':>7}  {'95% CI':^19}  {'projected':>9}"
    head += f" {'truth':>7}" if truth is not None else ""
    lines = [head + f" {'observed':>8}"]
    for c, name in enumerate(names):
        ci = f"[{report.ci_low[c]:+.4f}, {report.ci_high[c]:+.4f}]{'*' if mark[c] else ' '}"
        row = f"{name.ljust(w)}  {report.estimate[c]:+9.4f} {report.standard_error[c]:7.4f}  {ci:<19} "
        row += f"{report.projected[c]:9.4f}" + (f" {truth[c]:7.4f}" if truth is not None else "")
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
        "negative (noise around a small share; use 'projected' for non-negative shares).",
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
    out = [f"{' / '.join(attributes).ljust(w)}  {'estimate':>9} {'SE':>7}  {'95% CI':^19}  {'projected':>9}"]
    for i, name in enumerate(names):
        ci = f"[{columns['ci_low'][i]:+.4f}, {columns['ci_high'][i]:+.4f}]"
        out.append(
            f"{name.ljust(w)}  {columns['estimate'][i]:+9.4f} {columns['standard_error'][i]:7.4f}  {ci:<19}  "
            f"{columns['projected'][i]:9.4f}"
        )
    return out
