"""``secure-release reproduce``: regenerate the paper's Figures 5 to 9 (Sec. IV) with a report."""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from secure_release.mechanism import accounting
from secure_release.mechanism.simulation import log_m_grid, simulate_point
from secure_release.tables import CountTable, adult, synthetic

EPSILONS = (0.1, 0.5, 1.0)
SYNTHETIC = ("uniform", "linear", "peaky")
CARDINALITIES = (12, 24, 48, 96, 192, 384, 768)
FIG_FOR = {"uniform": 6, "linear": 7, "peaky": 8}
_COLUMNS = [
    "dataset",
    "K",
    "n",
    "epsilon",
    "m",
    "gamma",
    "trials",
    "mean_l2_error",
    "se_mean_l2_error",
    "mean_l2_error_projected",
    "se_mean_l2_error_projected",
    "mean_l2_error_mle",
    "se_mean_l2_error_mle",
    "rmse_l2_error",
    "predicted_rmse",
    "bound",
    "bound_over_sqrtK",
    "bound_tight",
    "m_star",
    "m_min_error",
]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "reproduce",
        help="regenerate the paper's Figures 5-9 (CSV, PNG and a markdown report)",
        description=(
            "Re-run the simulations of Sec. IV: error against m at epsilon = 0.1, 0.5, 1.0 on the "
            "UCI Adult table with the Thm 3.4 bound, the bound / sqrt K, the exact predicted RMSE, "
            "and vertical lines at m* (Cor. 3.6) and at the m minimizing the predicted error "
            "(Fig. 5); the same on synthetic uniform, linear and peaky tables beside Adult "
            "(Figs. 6-8); the error at m* across cardinalities 12 to 768 (Fig. 9). Writes "
            "figN_*.csv, figN_*.png (if matplotlib is installed) and report.md into --out."
        ),
        epilog="Example: secure-release reproduce --out docs/figures --trials 1000",
    )
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--trials", type=int, default=1000, help="trials per point (default 1000)")
    p.add_argument("--seed", type=int, default=20240601, help="numpy seed (default 20240601)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 8 m values per epsilon, K up to 96, no MLE on the sweeps",
    )
    p.add_argument(
        "--grid", type=int, default=24, help="m values per epsilon (default 24; >= 20 for figures)"
    )
    p.set_defaults(func=run)


def _row(table: CountTable, s: dict[str, Any]) -> dict[str, Any]:
    K, n, eps = table.joint_size, table.n, s["epsilon"]
    row = {"dataset": table.name, "K": K, "n": n, **{k: s.get(k) for k in _COLUMNS if k in s}}
    row["bound_over_sqrtK"] = s["bound"] / math.sqrt(K)
    row["m_star"] = accounting.optimal_sample_size_int(n, K, eps)
    row["m_min_error"] = accounting.error_minimizing_sample_size(
        n, K, eps, float(np.sum((table.counts / n) ** 2))
    )
    return row


def _sweep(
    table: CountTable,
    trials: int,
    rng: np.random.Generator,
    grid: int,
    estimators: tuple[str, ...],
    log: Any,
) -> list[dict[str, Any]]:
    rows = []
    for eps in EPSILONS:
        n, K = table.n, table.joint_size
        m_star = accounting.optimal_sample_size_int(n, K, eps)
        m_min = accounting.error_minimizing_sample_size(
            n, K, eps, float(np.sum((table.counts / n) ** 2))
        )
        for m in log_m_grid(n, m_star, grid, extra=(m_star, m_min)):
            pt = simulate_point(table.counts, eps, m, trials, rng, table.alphabet_sizes, estimators)
            rows.append(_row(table, pt.summary()))
        log(f"  {table.name} eps={eps:g}: {len(rows)} points so far")
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    k: (
                        ""
                        if r.get(k) is None
                        else (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k])
                    )
                    for k in _COLUMNS
                }
            )


def run(args: argparse.Namespace) -> int:
    if args.trials < 2:
        raise argparse.ArgumentTypeError("--trials must be >= 2")  # pragma: no cover
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    grid = 8 if args.quick else max(args.grid, 2)
    cards = tuple(k for k in CARDINALITIES if k <= 96) if args.quick else CARDINALITIES
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        sys.stderr.write(f"[{time.perf_counter() - t0:6.1f}s] {msg}\n")

    base = adult()
    sweeps: dict[str, list[dict[str, Any]]] = {}
    sweeps["adult"] = _sweep(
        base,
        args.trials,
        rng,
        grid,
        ("raw", "projected") if args.quick else ("raw", "projected", "mle"),
        log,
    )
    _write_csv(out / "fig5_adult.csv", sweeps["adult"])
    for kind in SYNTHETIC:
        table = synthetic(kind, base.joint_size, base.n)
        sweeps[kind] = _sweep(table, args.trials, rng, grid, ("raw", "projected"), log)
        _write_csv(out / f"fig{FIG_FOR[kind]}_{kind}.csv", sweeps[kind])

    card_rows: list[dict[str, Any]] = []
    for kind in SYNTHETIC:
        for K in cards:
            table = synthetic(kind, K, base.n)
            for eps in EPSILONS:
                m = accounting.optimal_sample_size_int(table.n, K, eps)
                pt = simulate_point(
                    table.counts,
                    eps,
                    m,
                    args.trials,
                    rng,
                    table.alphabet_sizes,
                    ("raw", "projected", "mle"),
                )
                card_rows.append(_row(table, pt.summary()))
        log(f"  fig 9 {kind}: done")
    for eps in EPSILONS:  # the Adult point at K = 24, at m*
        card_rows.append(
            next(r for r in sweeps["adult"] if r["epsilon"] == eps and r["m"] == r["m_star"])
        )
    _write_csv(out / "fig9_cardinality.csv", card_rows)

    pngs = _plots(out, base, sweeps, card_rows)
    report = _report(base, sweeps, card_rows, args, pngs, time.perf_counter() - t0)
    (out / "report.md").write_text(report, encoding="utf-8")
    log(f"wrote {out}/report.md" + ("" if pngs else " (PNGs skipped: matplotlib missing)"))
    return 0


def _at(rows: list[dict[str, Any]], eps: float, m: int) -> dict[str, Any]:
    return next(r for r in rows if r["epsilon"] == eps and r["m"] == m)


def _pct(lower: float | None, raw: float) -> str:
    return "-" if lower is None else f"{100.0 * (raw - lower) / raw:.1f}%"


def _report(
    base: CountTable,
    sweeps: dict[str, list[dict[str, Any]]],
    card_rows: list[dict[str, Any]],
    args: argparse.Namespace,
    pngs: list[str],
    seconds: float,
) -> str:
    K = base.joint_size
    lines = [
        "# Reproduction of Sec. IV (Figures 5-9)",
        "",
        f"Trials per point: {args.trials}; seed {args.seed}; n = {base.n}; K = {K} for Figs. 5-8; "
        f"fast count-level path (mechanism/simulation.py); run time {seconds:.0f} s.",
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
            star = _at(rows, eps, pts[0]["m_star"])
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
    keys = sorted(
        {(r["dataset"], r["K"]) for r in card_rows}, key=lambda t: (t[0] != "adult", t[0], t[1])
    )
    for name, k in keys:
        cells = []
        for e in EPSILONS:
            r = next(
                x for x in card_rows if x["dataset"] == name and x["K"] == k and x["epsilon"] == e
            )
            mle = r.get("mean_l2_error_mle")
            cells.append(
                f"{r['m']}, {r['mean_l2_error']:.4f}, {r['mean_l2_error_projected']:.4f}, "
                + ("-" if mle is None else f"{mle:.4f}")
            )
        lines.append(f"| {name} | {k} | " + " | ".join(cells) + " |")
    lines.append("")
    if pngs:
        lines += ["## Figures", ""] + [f"![{p}]({p})" for p in pngs] + [""]
    else:
        lines += ["PNGs were skipped: matplotlib is not installed.", ""]
    return "\n".join(lines)


def _plots(
    out: Path,
    base: CountTable,
    sweeps: dict[str, list[dict[str, Any]]],
    card_rows: list[dict[str, Any]],
) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
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
