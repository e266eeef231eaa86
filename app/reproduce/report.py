"""The reproduction report (docs/reproduction.md): tables and findings from the figure CSVs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from secure_release.reproduce.findings import at, coverage_section, findings
from secure_release.reproduce.sweeps import COVERAGE_CSV, EPSILONS, FIG_FOR, SYNTHETIC, read_csv_rows
from secure_release.tables import CountTable


def header_line(trials: int, seed: int, base: CountTable, seconds: float) -> str:
    return (
        f"Trials per point: {trials}; seed {seed}; n = {base.n}; K = {base.joint_size} for "
        f"Figs. 5-8; fast count-level path (mechanism/simulation/monte_carlo.py); run time {seconds:.0f} s."
    )


def build_report(out: Path, header: str, pngs: list[str], image_prefix: str) -> str:
    """The markdown report from the CSVs in ``out`` (so every number in it is the CSVs')."""
    sweeps = {"adult": read_csv_rows(out / "fig5_adult.csv")}
    for kind in SYNTHETIC:
        sweeps[kind] = read_csv_rows(out / f"fig{FIG_FOR[kind]}_{kind}.csv")
    card_rows = read_csv_rows(out / "fig9_cardinality.csv")
    cov = read_csv_rows(out / COVERAGE_CSV) if (out / COVERAGE_CSV).exists() else []
    lines = tables(sweeps, card_rows, header, pngs, image_prefix)
    lines += findings(sweeps, card_rows)
    if cov:
        lines += coverage_section(cov)
    return "\n".join(lines) + "\n"


def _pct(lower: float | None, raw: float) -> str:
    return "-" if lower is None else f"{100.0 * (raw - lower) / raw:.1f}%"


def tables(
    sweeps: dict[str, list[dict[str, Any]]],
    card_rows: list[dict[str, Any]],
    header: str,
    pngs: list[str],
    image_prefix: str,
) -> list[str]:
    K = sweeps["adult"][0]["K"]
    lines = [
        "# Reproduction of Sec. IV (Figures 5-9)",
        "",
        "Regenerate with `secure-release reproduce --out docs/figures "
        "--doc docs/reproduction.md` (`--quick` for a smoke run). The CSV behind each figure "
        "and table is in `docs/figures/`; every number below is computed from those CSVs "
        "(tests/unit/test_sim_coverage_doc.py regenerates this file's text from them).",
        "",
        header,
        "Errors are mean l2 errors ||T_hat - T||_2 of the A^-1 estimate unless marked; 'pred RMSE' is "
        "the exact sqrt(E||T_hat - T||^2) with the table's sum of squared shares (an upper bound on "
        "the mean by Jensen). 'argmin m' is the grid point with the smallest mean raw error.",
        "",
    ]
    for eps in EPSILONS:
        lines += [
            f"## epsilon = {eps:g}",
            "",
            "| data | m* | m min pred | argmin m (emp.) | error at m* (+-se) | pred RMSE at m* | "
            "error at argmin | bound at m* | bound / error | bound / (error sqrt K) | projection lowers | MLE lowers |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, rows in sweeps.items():
            pts = [r for r in rows if r["epsilon"] == eps]
            star = at(rows, eps, pts[0]["m_star"])
            best = min(pts, key=lambda r: r["mean_l2_error"])
            err = star["mean_l2_error"]
            lines.append(
                f"| {name} | {star['m_star']} | {star['m_min_error']} | {best['m']} | "
                f"{err:.4f} +- {star['se_mean_l2_error']:.4f} | {star['predicted_rmse']:.4f} | "
                f"{best['mean_l2_error']:.4f} | {star['bound']:.3f} | {star['bound'] / err:.2f} | "
                f"{star['bound'] / err / math.sqrt(K):.2f} | "
                f"{_pct(star['mean_l2_error_projected'], err)} | {_pct(star['mean_l2_error_mle'], err)} |"
            )
        lines.append("")
    lines += [
        "## Error at m* across cardinalities (Fig. 9)",
        "",
        "| data | K | " + " | ".join(f"eps {e:g}: m*, error, proj., MLE" for e in EPSILONS) + " |",
        "|---|---|" + "---|" * len(EPSILONS),
    ]
    keys = sorted({(r["dataset"], r["K"]) for r in card_rows}, key=lambda t: (t[0] != "adult", t[0], t[1]))
    for name, k in keys:
        cells = []
        for e in EPSILONS:
            r = next(x for x in card_rows if x["dataset"] == name and x["K"] == k and x["epsilon"] == e)
            mle = r.get("mean_l2_error_mle")
            cells.append(
                f"{r['m']}, {r['mean_l2_error']:.4f}, {r['mean_l2_error_projected']:.4f}, "
                + ("-" if mle is None else f"{mle:.4f}")
            )
        lines.append(f"| {name} | {k} | " + " | ".join(cells) + " |")
    lines.append("")
    if pngs:
        lines += ["## Figures", ""] + [f"![{p}]({image_prefix}{p})" for p in pngs] + [""]
    else:
        lines += ["PNGs were skipped: matplotlib is not installed.", ""]
    return lines
