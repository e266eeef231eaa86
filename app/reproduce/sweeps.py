"""The simulations behind Figures 5-9 and the exact coverage table, and their CSV files."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from secure_release.mechanism.estimation.estimators import INTERVAL_METHODS
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.simulation.monte_carlo import exact_cell_coverage, log_m_grid, simulate_point
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


def row(table: CountTable, s: dict[str, Any]) -> dict[str, Any]:
    K, n, eps = table.joint_size, table.n, s["epsilon"]
    row = {"dataset": table.name, "K": K, "n": n, **{k: s.get(k) for k in _COLUMNS if k in s}}
    row["bound_over_sqrtK"] = s["bound"] / math.sqrt(K)
    row["m_star"] = accounting.optimal_sample_size_int(n, K, eps)
    row["m_min_error"] = accounting.error_minimizing_sample_size(n, K, eps, float(np.sum((table.counts / n) ** 2)))
    return row


def sweep(
    table: CountTable,
    trials: int,
    rng: np.random.Generator,
    grid: int,
    estimators: tuple[str, ...],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    rows = []
    for eps in EPSILONS:
        n, K = table.n, table.joint_size
        m_star = accounting.optimal_sample_size_int(n, K, eps)
        m_min = accounting.error_minimizing_sample_size(n, K, eps, float(np.sum((table.counts / n) ** 2)))
        for m in log_m_grid(n, m_star, grid, extra=(m_star, m_min)):
            pt = simulate_point(table.counts, eps, m, trials, rng, table.alphabet_sizes, estimators)
            rows.append(row(table, pt.summary()))
        log(f"  {table.name} eps={eps:g}: {len(rows)} points so far")
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    k: ("" if r.get(k) is None else (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]))
                    for k in _COLUMNS
                }
            )


COVERAGE_CSV = "coverage.csv"
_COVERAGE_COLUMNS = [
    "dataset",
    "K",
    "n",
    "epsilon",
    "m",
    "target",
    "method",
    "simultaneous",
    "min_coverage",
    "mass_weighted_coverage",
    "cells_below_90",
    "mass_below_90",
    "cells_below_93",
    "mean_width",
    "mass_weighted_width",
    "all_cells_union_bound",
]
ZIPF_K, ZIPF_N = 1000, 100_000


def coverage_table_rows() -> list[dict[str, Any]]:
    """Exact per-cell coverage (enumerated, no Monte Carlo) of every interval method at m*:
    Adult (joint and both curators' marginals) at epsilon 0.1, 0.5, 1 and a K = 1000 Zipf table
    (n = 10^5) at epsilon 1; plus Clopper-Pearson with Bonferroni (simultaneous) on the joint."""
    settings: list[tuple[CountTable, float]] = [(adult(), e) for e in EPSILONS]
    settings.append((synthetic("zipf", ZIPF_K, ZIPF_N), 1.0))
    rows: list[dict[str, Any]] = []
    for table, eps in settings:
        n, K = table.n, table.joint_size
        m = accounting.optimal_sample_size_int(n, K, eps)
        ch = PramChannel(accounting.gamma_from_epsilon(n, m, eps), K)
        a = ch.keep
        targets = [("joint", table.counts, ch.off_diagonal)]
        if table.name == "adult":
            cube = table.counts.reshape(table.alphabet_sizes)
            for j, k_s in enumerate(table.alphabet_sizes):
                other = tuple(i for i in range(len(table.alphabet_sizes)) if i != j)
                targets.append(
                    (f"marginal {table.curator_names[j]}", cube.sum(axis=other).reshape(-1), (1.0 - a) / k_s)
                )
        for target, cells, b in targets:
            runs: list[tuple[bool, tuple[str, ...]]] = [(False, INTERVAL_METHODS)]
            if target == "joint":
                runs.append((True, ("clopper-pearson",)))
            for simultaneous, methods in runs:
                for res in exact_cell_coverage(cells, m, a, b, methods, 0.95, simultaneous):
                    summary = res.summary()
                    rows.append(
                        {
                            "dataset": table.name,
                            "K": K,
                            "n": n,
                            "epsilon": eps,
                            "m": m,
                            "target": target,
                            "method": res.method,
                            "simultaneous": int(simultaneous),
                            **{k: summary[k] for k in _COVERAGE_COLUMNS if k in summary},
                            "all_cells_union_bound": max(0.0, 1.0 - float(np.sum(1.0 - res.coverage))),
                        }
                    )
    return rows


def write_coverage_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=_COVERAGE_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]) for k in _COVERAGE_COLUMNS})


def read_csv_rows(path: Path) -> list[dict[str, Any]]:
    """A CSV written here, with numbers parsed (ints stay ints, empty cells become None)."""
    out = []
    with open(path, newline="", encoding="utf-8") as fh:
        for raw in csv.DictReader(fh):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if v == "":
                    row[k] = None
                    continue
                try:
                    row[k] = int(v)
                except ValueError:
                    try:
                        row[k] = float(v)
                    except ValueError:
                        row[k] = v
            out.append(row)
    return out


def write_figure_csvs(
    out: Path, trials: int, rng: np.random.Generator, grid: int, cards: tuple[int, ...], quick: bool,
    log: Callable[[str], None],
) -> tuple[CountTable, dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:  # fmt: skip
    """Simulate every point of Figures 5-9 and the exact coverage table and write their CSVs to
    ``out``; the Adult table, the sweeps (Figs. 5-8) and the cardinality rows (Fig. 9)."""
    base = adult()
    sweeps: dict[str, list[dict[str, Any]]] = {}
    sweeps["adult"] = sweep(
        base,
        trials,
        rng,
        grid,
        ("raw", "projected") if quick else ("raw", "projected", "mle"),
        log,
    )
    write_csv(out / "fig5_adult.csv", sweeps["adult"])
    for kind in SYNTHETIC:
        table = synthetic(kind, base.joint_size, base.n)
        sweeps[kind] = sweep(table, trials, rng, grid, ("raw", "projected"), log)
        write_csv(out / f"fig{FIG_FOR[kind]}_{kind}.csv", sweeps[kind])

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
                    trials,
                    rng,
                    table.alphabet_sizes,
                    ("raw", "projected", "mle"),
                )
                card_rows.append(row(table, pt.summary()))
        log(f"  fig 9 {kind}: done")
    for eps in EPSILONS:  # the Adult point at K = 24, at m*
        card_rows.append(next(r for r in sweeps["adult"] if r["epsilon"] == eps and r["m"] == r["m_star"]))
    write_csv(out / "fig9_cardinality.csv", card_rows)

    write_coverage_csv(out / COVERAGE_CSV, coverage_table_rows())
    log("  exact interval coverage: done")

    return base, sweeps, card_rows
