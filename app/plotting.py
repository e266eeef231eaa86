"""Every figure the composition root draws (matplotlib, the ``plot`` extra; headless Agg).

The researcher's heat map is the researcher role's own (researcher/heatmap.py): roles never
import the composition root.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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
