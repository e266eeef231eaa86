"""Every figure the composition root draws (matplotlib, the ``plot`` extra; headless Agg).

The researcher's heat map is the researcher role's own (researcher/heatmap.py): roles never
import the composition root.
"""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from secure_release.mechanism.estimation.marginals import Marginal, group_cells
from secure_release.reproduce.sweeps import EPSILONS, FIG_FOR, SYNTHETIC
from secure_release.tables import CountTable


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def reproduction_figures(
    out: Path,
    base: CountTable,
    sweeps: dict[str, list[dict[str, Any]]],
    card_rows: list[dict[str, Any]],
) -> list[str]:
    plt = pyplot()
    if plt is None:
        return []
    colors = {0.1: "tab:blue", 0.5: "tab:orange", 1.0: "tab:green"}
    K = base.joint_size
    written = []

    def curves(ax: Any, rows: list[dict[str, Any]], marker: str, label: str, theory: bool) -> None:
        for eps in EPSILONS:
            pts = sorted((r for r in rows if r["epsilon"] == eps), key=lambda r: r["m"])
            ms = [r["m"] for r in pts]
            c = colors[eps]
            ax.plot(
                ms,
                [r["mean_l2_error"] for r in pts],
                marker,
                color=c,
                ms=4,
                mfc="none" if marker != "o" else c,
                label=f"{label} eps={eps:g}",
            )
            if theory:
                ax.plot(ms, [r["bound"] for r in pts], "-", color=c, lw=1)
                ax.plot(ms, [r["bound_over_sqrtK"] for r in pts], "--", color=c, lw=1)
                ax.plot(ms, [r["predicted_rmse"] for r in pts], ":", color=c, lw=1.5)
                ax.axvline(pts[0]["m_min_error"], color=c, ls="-.", lw=0.8)
            ax.axvline(pts[0]["m_star"], color=c, ls="-", lw=0.8, alpha=0.7)

    def finish(fig: Any, ax: Any, title: str, name: str, note: str) -> None:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of samples m")
        ax.set_ylabel("mean l2 error of the joint type")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, ncol=2, loc="upper right")
        ax.text(0.01, 0.01, note, transform=ax.transAxes, fontsize=6.5, va="bottom")
        fig.tight_layout()
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        written.append(name)

    fig, ax = plt.subplots(figsize=(7, 4.8))
    curves(ax, sweeps["adult"], "o", "Adult", True)
    finish(
        fig,
        ax,
        f"Fig. 5: UCI Adult (n={base.n}, K={K})",
        "fig5_adult.png",
        "solid: Thm 3.4 bound; dashed: bound/sqrt(K); dotted: exact predicted RMSE;\n"
        "vertical solid: m*; dash-dot: m minimizing the predicted error",
    )
    for kind in SYNTHETIC:
        fig, ax = plt.subplots(figsize=(7, 4.8))
        curves(ax, sweeps["adult"], "o", "Adult", False)
        curves(ax, sweeps[kind], "s", kind, False)
        for eps in EPSILONS:
            pts = sorted((r for r in sweeps[kind] if r["epsilon"] == eps), key=lambda r: r["m"])
            ax.plot(
                [r["m"] for r in pts],
                [r["predicted_rmse"] for r in pts],
                ":",
                color=colors[eps],
                lw=1.2,
            )
        n = FIG_FOR[kind]
        finish(
            fig,
            ax,
            f"Fig. {n}: Adult (filled) vs {kind} (open), K={K}",
            f"fig{n}_{kind}.png",
            f"dotted: exact predicted RMSE for {kind}; vertical: m*",
        )
    fig, ax = plt.subplots(figsize=(7, 4.8))
    styles = {"uniform": "s-", "linear": "^--", "peaky": "v:"}
    for eps in EPSILONS:
        for kind in SYNTHETIC:
            pts = sorted(
                (r for r in card_rows if r["dataset"] == kind and r["epsilon"] == eps),
                key=lambda r: r["K"],
            )
            ax.plot(
                [r["K"] for r in pts],
                [r["mean_l2_error"] for r in pts],
                styles[kind],
                color=colors[eps],
                ms=4,
                mfc="none",
                lw=1,
                label=f"{kind} eps={eps:g}",
            )
        a = next(r for r in card_rows if r["dataset"] == "adult" and r["epsilon"] == eps)
        ax.plot(
            [a["K"]],
            [a["mean_l2_error"]],
            "*",
            color=colors[eps],
            ms=11,
            mec="k",
            label=f"Adult eps={eps:g}",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("cardinality K")
    ax.set_ylabel("mean l2 error at m*")
    ax.set_title(f"Fig. 9: error at m* against cardinality (n={base.n})", fontsize=10)
    ax.legend(fontsize=6.5, ncol=4, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "fig9_cardinality.png", dpi=90)
    plt.close(fig)
    written.append("fig9_cardinality.png")
    return written


def simulation_figure(summaries: list[dict[str, Any]], table: CountTable, out: str) -> None:
    plt = pyplot()
    if plt is None:
        sys.stderr.write("secure-release simulate: matplotlib is not installed; --plot skipped\n")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for eps in sorted({s["epsilon"] for s in summaries}):
        pts = sorted((s for s in summaries if s["epsilon"] == eps), key=lambda s: s["m"])
        ms = [s["m"] for s in pts]
        line = ax.plot(ms, [s["mean_l2_error"] for s in pts], "o", label=f"eps={eps:g} raw")[0]
        ax.plot(ms, [s["predicted_rmse"] for s in pts], "-", color=line.get_color(), alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("m")
    ax.set_ylabel("mean l2 error")
    ax.set_title(f"{table.name} (n={table.n}, K={table.joint_size})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------- the report page's charts
#: matplotlib settings of the page's charts: text stays text in the SVG (selectable, searchable,
#: readable by a test), no date in the file, ids fixed by a per-chart salt (reproducible bytes).
SVG_STYLE = {"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
             "text.parse_math": False}  # fmt: skip
#: Text from a curator's schema or a researcher's id is shown as written: a "$" is no mathtext.
AS_WRITTEN = {"parse_math": False}
#: The bars' colour, and the interval's.
BAR_COLOR, INTERVAL_COLOR = "#4c72b0", "#222222"
#: A heat map prints each cell's value when it has at most this many cells.
ANNOTATE_CELLS = 64


@dataclass(frozen=True)
class Chart:
    """One chart of the report page: its id (the prefix of the gids of its value labels), the
    attributes it shows, and the inline SVG (no XML prolog)."""

    chart_id: str
    attributes: tuple[str, ...]
    svg: str


def marginal_bars(ax: Any, t: Marginal, title: str | None = None, gid: str | None = None) -> None:
    """One attribute's marginal on ``ax``: a bar per category at the headline estimate, the
    share's 95% interval as a capped vertical line, the estimate's value printed above both, both
    axes labelled. With ``gid``, each value label is SVG group ``{gid}-value-{i}``."""
    x = np.arange(t.headline.size)
    ax.bar(x, t.headline, width=0.7, color=BAR_COLOR, label="estimate (headline)")
    ax.vlines(x, t.ci_low, t.ci_high, color=INTERVAL_COLOR, linewidth=1.2, label="95% interval")
    ax.plot(np.concatenate([x, x]), np.concatenate([t.ci_low, t.ci_high]), "_", color=INTERVAL_COLOR, ms=7)
    top = np.maximum(t.headline, t.ci_high)
    span = max(float(np.max(top)), 1e-9)
    many = x.size > 8
    for i in range(x.size):  # one label a category, never a data row
        text = ax.text(x[i], top[i] + 0.02 * span, f"{t.headline[i]:.3f}", ha="center", va="bottom", fontsize=7,
                       rotation=90 if many else 0)  # fmt: skip
        if gid is not None:
            text.set_gid(f"{gid}-value-{i}")
    ax.set_xticks(x, [str(v) for v in t.labels[:, 0]], rotation=45 if x.size > 5 else 0,
                  ha="right" if x.size > 5 else "center", **AS_WRITTEN)  # fmt: skip
    ax.set_xlabel(t.attributes[0], **AS_WRITTEN)
    ax.set_ylabel("share of records")
    ax.set_ylim(0.0, span * (1.25 if many else 1.12))
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False, borderaxespad=0.2)
    if title:
        ax.set_title(title, fontsize=9, pad=18, **AS_WRITTEN)
    if gid is not None:
        ax.xaxis.label.set_gid(f"{gid}-xlabel")
        ax.yaxis.label.set_gid(f"{gid}-ylabel")


def pair_heatmap(ax: Any, t: Marginal, gid: str | None = None) -> None:
    """Two attributes' marginal on ``ax`` as a heat map of the headline estimate (rows: the first
    attribute's categories, columns: the second's), each value printed when there are at most
    :data:`ANNOTATE_CELLS` cells (SVG group ``{gid}-value-{r}-{c}``)."""
    rows, row_of = group_cells(t.labels, [0])
    cols, col_of = group_cells(t.labels, [1])
    grid = np.zeros((len(rows), len(cols)))
    grid[row_of, col_of] = t.headline
    image = ax.imshow(grid, cmap="Blues", vmin=0.0, aspect="auto")
    ax.figure.colorbar(image, ax=ax, label="share of records", shrink=0.85)
    ax.set_yticks(np.arange(len(rows)), rows[:, 0].tolist(), **AS_WRITTEN)
    ax.set_xticks(np.arange(len(cols)), cols[:, 0].tolist(), rotation=45 if len(cols) > 4 else 0,
                  ha="right" if len(cols) > 4 else "center", **AS_WRITTEN)  # fmt: skip
    ax.set_ylabel(t.attributes[0], **AS_WRITTEN)
    ax.set_xlabel(t.attributes[1], **AS_WRITTEN)
    if gid is not None:
        ax.xaxis.label.set_gid(f"{gid}-xlabel")
        ax.yaxis.label.set_gid(f"{gid}-ylabel")
    if grid.size > ANNOTATE_CELLS:
        return
    dark = grid > 0.6 * max(float(grid.max()), 1e-12)
    for (r, c), value in np.ndenumerate(grid):  # at most ANNOTATE_CELLS labels, not data rows
        text = ax.text(c, r, f"{value:.3f}", ha="center", va="center", fontsize=7,
                       color="white" if dark[r, c] else "black")  # fmt: skip
        if gid is not None:
            text.set_gid(f"{gid}-value-{r}-{c}")


def _svg(fig: Any, salt: str) -> str:
    """``fig`` as inline SVG text (from ``<svg``: no XML prolog, no DOCTYPE), then closed."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    with plt.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def report_charts(result: Any) -> list[Chart]:
    """The page's charts of a :class:`~secure_release.api.Result`: a bar chart per attribute,
    and a heat map per pair of attributes when there are two to four (``MissingDependencyError``
    without matplotlib, saying how to install it)."""
    from itertools import combinations

    from secure_release.frames import MissingDependencyError

    plt = pyplot()
    if plt is None:
        raise MissingDependencyError("the report's charts need matplotlib: pip install 'secure-release[plot]'")
    charts = []
    with plt.rc_context(SVG_STYLE):
        for i, attribute in enumerate(result.attributes):
            t = result.marginal_table(attribute)
            fig, ax = plt.subplots(figsize=(min(7.5, 2.2 + 0.45 * t.headline.size), 3.0))
            marginal_bars(ax, t, gid=f"bars{i}")
            charts.append(Chart(f"bars{i}", (attribute,), _svg(fig, f"bars{i}")))
        pairs = list(combinations(result.attributes, 2)) if 2 <= len(result.attributes) <= 4 else []
        for i, pair in enumerate(pairs):
            t = result.marginal_table(*pair)
            width = len(set(t.labels[:, 1].tolist()))
            fig, ax = plt.subplots(figsize=(min(7.5, 2.6 + 0.55 * width), 2.8))
            pair_heatmap(ax, t, gid=f"heat{i}")
            charts.append(Chart(f"heat{i}", pair, _svg(fig, f"heat{i}")))
    return charts
