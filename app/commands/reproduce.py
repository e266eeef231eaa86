"""``secure-release reproduce``: regenerate the paper's Figures 5 to 9 (Sec. IV) with a report.

The work lives in :mod:`secure_release.reproduce` (simulations and CSVs, one function per
finding, the report) and :mod:`secure_release.plotting` (the figures); this module is the CLI.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from secure_release import plotting
from secure_release.reproduce.report import build_report, header_line
from secure_release.reproduce.sweeps import CARDINALITIES, write_figure_csvs


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
            "figN_*.csv, figN_*.png (if matplotlib is installed), coverage.csv (exact coverage of "
            "the per-cell 95% intervals at m*) and report.md into --out. Every number in the "
            "report's findings is computed from those CSVs."
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
    p.add_argument("--grid", type=int, default=24, help="m values per epsilon (default 24; >= 20 for figures)")
    p.add_argument(
        "--doc",
        metavar="FILE.md",
        default=None,
        help="also write the report to this markdown file, image links relative to it "
        "(docs/reproduction.md is made with --out docs/figures --doc docs/reproduction.md)",
    )
    p.set_defaults(func=run)


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

    base, sweeps, card_rows = write_figure_csvs(out, args.trials, rng, grid, cards, args.quick, log)
    pngs = plotting.reproduction_figures(out, base, sweeps, card_rows)
    seconds = time.perf_counter() - t0
    head = header_line(args.trials, args.seed, base, seconds)
    (out / "report.md").write_text(build_report(out, head, pngs, ""), encoding="utf-8")
    if args.doc:
        doc = Path(args.doc)
        prefix = os.path.relpath(out, doc.parent).replace(os.sep, "/") + "/"
        doc.write_text(build_report(out, head, pngs, prefix), encoding="utf-8")
    log(f"wrote {out}/report.md" + ("" if pngs else " (PNGs skipped: matplotlib missing)"))
    return 0
