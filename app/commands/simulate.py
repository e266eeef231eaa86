"""``secure-release simulate``: Monte Carlo error of releases on a count table."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from secure_release import plotting
from secure_release.mechanism.errors import InvalidSampleSizeError
from secure_release.mechanism.estimation.estimators import INTERVAL_METHODS, check_level
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.simulation.monte_carlo import (
    ESTIMATORS,
    SimulationPoint,
    coverage_study,
    exact_cell_coverage,
    sweep,
)
from secure_release.tables import CountTable, dataset, read_counts_csv, read_rows


def _float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one number, got {text!r}")
    return values


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one integer, got {text!r}")
    return values


def _estimators(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in ESTIMATORS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"estimators must be among {','.join(ESTIMATORS)}, got {text!r}")
    return names


def _interval_methods(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in INTERVAL_METHODS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"interval methods must be among {','.join(INTERVAL_METHODS)}, got {text!r}")
    return names


def _level(text: str) -> float:
    try:
        return check_level(float(text))
    except (ValueError, ArithmeticError) as exc:
        raise argparse.ArgumentTypeError(f"expected a level in (0, 1), got {text!r}") from exc


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate releases on a count table and report the l2 estimation error",
        description=(
            "Monte Carlo simulation of the release on a count table. For each epsilon and m, "
            "gamma follows Eq. 2; every trial samples m of the n records without replacement, "
            "applies gamma-diagonal PRAM and estimates the joint type with A^-1 (raw), its "
            "projection onto the simplex, and the EM maximum-likelihood estimate. The default "
            "fast path works on counts (multivariate hypergeometric sample, binomial keep, "
            "multinomial replacement), vectorized over trials; --per-record runs the real "
            "per-record mechanism (ChaCha20 sampling, pads, PRAM) instead, slowly. "
            "predicted_rmse is the exact RMSE with this table's sum of squared shares; bound "
            "is Thm 3.4 and bound_tight the paper's (c + 1)/sqrt m."
        ),
        epilog=(
            "Examples:\n"
            "  secure-release simulate --epsilon 0.1,0.5,1.0 --trials 1000 --json\n"
            "  secure-release simulate --counts my.csv --split a,b:c --epsilon 0.5 --m 500,1000\n"
            "  secure-release simulate --dataset peaky --K 96 --n 100000 --epsilon 1.0\n"
            "  secure-release simulate --coverage --exact --epsilon 0.1,0.5,1 --trials 2000\n"
            "  secure-release simulate --coverage --dataset zipf --K 1000 --n 100000 --epsilon 1\n"
            "Count CSV: header 'attr1,...,attrN,count'; domains are the distinct values in order\n"
            "of first appearance. Default data: the bundled UCI Adult table (K = 24)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--counts", metavar="FILE.csv", help="count table CSV (last column 'count')")
    src.add_argument("--rows", metavar="ROWS.csv", help="raw rows CSV (needs --schema)")
    src.add_argument(
        "--dataset",
        choices=("adult", "uniform", "linear", "peaky", "zipf"),
        default=None,
        help="bundled Adult table or a synthetic one (default: adult)",
    )
    p.add_argument("--schema", metavar="SCHEMA.json", help="schema JSON for --rows")
    p.add_argument(
        "--split",
        help="attributes per curator, e.g. education,marital:sex,salary "
        "(default: first half / second half of the columns)",
    )
    p.add_argument(
        "--K",
        type=int,
        default=None,
        help="joint alphabet size of a synthetic dataset (default 24)",
    )
    p.add_argument("--n", type=int, default=None, help="records of a synthetic dataset (default 45222)")
    p.add_argument("--epsilon", type=_float_list, required=True, help="privacy levels, comma separated")
    p.add_argument(
        "--m",
        type=_int_list,
        default=None,
        help="sample sizes, comma separated (default: m* per epsilon)",
    )
    p.add_argument("--trials", type=_positive_int, default=1000, help="trials per (epsilon, m) (default 1000)")
    p.add_argument("--seed", type=int, default=None, help="numpy seed of the simulation (default: fresh)")
    p.add_argument(
        "--estimators",
        type=_estimators,
        default=list(ESTIMATORS),
        help="subset of raw,projected,mle (default: all)",
    )
    p.add_argument("--per-record", action="store_true", help="run the real per-record mechanism per trial")
    p.add_argument(
        "--coverage",
        action="store_true",
        help="instead of the l2 error, report each interval method's per-cell coverage of the "
        "true shares (min over cells, mass-weighted, cells under 90%%) and mean width, on the "
        "joint cells and each curator's marginal",
    )
    p.add_argument(
        "--interval-methods",
        type=_interval_methods,
        default=list(INTERVAL_METHODS),
        help=f"with --coverage: subset of {','.join(INTERVAL_METHODS)} (default: all)",
    )
    p.add_argument("--level", type=_level, default=0.95, help="with --coverage: confidence level (0.95)")
    p.add_argument(
        "--simultaneous",
        action="store_true",
        help="with --coverage: Bonferroni intervals that hold for all cells at once",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="with --coverage: also the exact coverage of the joint cells by enumerating each "
        "cell's observed-count distribution (no Monte Carlo error; slow for m >> 10^4)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="OUT.png", help="write a plot of error against m")
    p.set_defaults(func=run)


def load_table(args: argparse.Namespace) -> CountTable:
    if args.schema and not args.rows:
        raise argparse.ArgumentTypeError("--schema goes with --rows")
    if args.rows:
        if not args.schema:
            raise argparse.ArgumentTypeError("--rows needs --schema")
        return read_rows(args.rows, args.schema)
    if args.counts:
        return read_counts_csv(args.counts, args.split)
    name = args.dataset or "adult"
    if name == "adult" and args.split is None and args.K is None and args.n is None:
        return dataset("adult")
    return dataset(name, args.K, args.n)


class _Progress:
    """A rich progress bar over the simulated (epsilon, m) points (only when enabled)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self.bar = Progress("points", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False)
            self.bar.start()
            self.task = self.bar.add_task("simulate", total=total)
        self.bar.update(self.task, completed=done)
        if done == total:
            self.bar.stop()


def simulate(args: argparse.Namespace, table: CountTable) -> list[SimulationPoint]:
    points = _points(args, table)
    rng = np.random.default_rng(args.seed)
    long_run = len(points) * args.trials * (50 if args.per_record else 1) > 20_000
    return sweep(
        table.counts,
        points,
        args.trials,
        rng,
        table.alphabet_sizes,
        args.estimators,
        args.per_record,
        _Progress(long_run and sys.stderr.isatty()),
    )


def _points(args: argparse.Namespace, table: CountTable) -> list[tuple[float, int]]:
    n, K = table.n, table.joint_size
    points = []
    for eps in args.epsilon:
        accounting.check_epsilon(eps)
        ms = args.m if args.m is not None else [accounting.optimal_sample_size_int(n, K, eps)]
        for m in ms:
            if not 1 <= m <= n:
                raise InvalidSampleSizeError(f"m must be an integer in [1, n] = [1, {n}], got {m}")
            points.append((eps, m))
    return points


def coverage_rows(args: argparse.Namespace, table: CountTable) -> list[dict[str, Any]]:
    """One row per (epsilon, m, target, method): Monte Carlo coverage and width, and with
    ``args.exact`` the exact coverage (joint cells and each curator's marginal) beside it."""
    rng = np.random.default_rng(args.seed)
    rows: list[dict[str, Any]] = []
    for eps, m in _points(args, table):
        study = coverage_study(
            table.counts,
            eps,
            m,
            args.trials,
            rng,
            table.alphabet_sizes,
            args.interval_methods,
            args.level,
            args.simultaneous,
        )
        exact: dict[tuple[str, str], dict[str, Any]] = {}
        if args.exact:
            a = PramChannel(study.gamma, table.joint_size).keep
            cube = table.counts.reshape(table.alphabet_sizes)
            sizes = table.alphabet_sizes
            targets = {"joint": (table.counts, 1.0 / PramChannel(study.gamma, table.joint_size).normalizer)}
            if len(sizes) > 1:
                for j, k_s in enumerate(sizes):
                    other = tuple(i for i in range(len(sizes)) if i != j)
                    targets[f"marginal_{j}"] = (cube.sum(axis=other).reshape(-1), (1.0 - a) / k_s)
            for target, (cells, b) in targets.items():
                for res in exact_cell_coverage(cells, m, a, b, args.interval_methods, args.level, args.simultaneous):
                    exact[(target, res.method)] = res.summary()
        for row in study.summary():
            ex = exact.get((row["target"], row["method"]))
            if ex is not None:
                for key in (
                    "min_coverage",
                    "mass_weighted_coverage",
                    "cells_below_90",
                    "mean_width",
                    "mass_weighted_width",
                ):
                    row["exact_" + key] = ex[key]
            rows.append(row)
    return rows


def run_coverage(args: argparse.Namespace, table: CountTable) -> int:
    rows = coverage_rows(args, table)
    if args.json:
        print(
            json.dumps(
                {
                    "dataset": table.name,
                    "n": table.n,
                    "K": table.joint_size,
                    "alphabet_sizes": list(table.alphabet_sizes),
                    "curators": list(table.curator_names),
                    "seed": args.seed,
                    "coverage": rows,
                },
                sort_keys=True,
            )
        )
        return 0
    kind = "simultaneous (Bonferroni)" if args.simultaneous else "per cell"
    print(
        f"{table.name}: n = {table.n}, K = {table.joint_size}; {args.trials} trials; "
        f"{100 * args.level:g}% intervals, {kind}; coverage of the true shares"
    )
    heads = [
        "eps",
        "m",
        "target",
        "method",
        "min cov",
        "mass-w cov",
        "<90% cells",
        "mean width",
        "exact min",
        "exact mass-w",
    ]
    print("  ".join(f"{h:>15}" for h in heads))
    for r in rows:
        cells = [
            f"{r['epsilon']:g}",
            str(r["m"]),
            r["target"],
            r["method"],
            f"{r['min_coverage']:.4f}",
            f"{r['mass_weighted_coverage']:.4f}",
            str(r["cells_below_90"]),
            f"{r['mean_width']:.4g}",
            f"{r['exact_min_coverage']:.4f}" if "exact_min_coverage" in r else "-",
            f"{r['exact_mass_weighted_coverage']:.4f}" if "exact_min_coverage" in r else "-",
        ]
        print("  ".join(f"{c:>15}" for c in cells))
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        table = load_table(args)
    except argparse.ArgumentTypeError as exc:
        sys.stderr.write(f"secure-release simulate: error: {exc}\n")
        return 2
    if args.coverage:
        return run_coverage(args, table)
    results = simulate(args, table)
    summaries = [r.summary() for r in results]
    sum_sq = results[0].sum_sq
    for s in summaries:
        s["m_star"] = accounting.optimal_sample_size(table.n, table.joint_size, s["epsilon"])
    if args.plot:
        plotting.simulation_figure(summaries, table, args.plot)
    if args.json:
        print(
            json.dumps(
                {
                    "dataset": table.name,
                    "n": table.n,
                    "K": table.joint_size,
                    "alphabet_sizes": list(table.alphabet_sizes),
                    "curators": list(table.curator_names),
                    "sum_sq_shares": sum_sq,
                    "per_record": bool(args.per_record),
                    "seed": args.seed,
                    "results": summaries,
                },
                sort_keys=True,
            )
        )
        return 0
    print(
        f"{table.name}: n = {table.n}, K = {table.joint_size} "
        f"({' x '.join(map(str, table.alphabet_sizes))}), {summaries[0]['trials']} trials"
        + (", per-record mechanism" if args.per_record else "")
    )
    cols = [
        "epsilon",
        "m",
        "gamma",
        "mean_l2_error",
        "mean_l2_error_projected",
        "mean_l2_error_mle",
        "predicted_rmse",
        "bound",
        "bound_tight",
    ]
    heads = ["eps", "m", "gamma", "raw (+-se)", "projected", "mle", "pred RMSE", "bound", "tight"]
    print("  ".join(f"{h:>16}" if i == 3 else f"{h:>10}" for i, h in enumerate(heads)))
    for s in summaries:
        cells = []
        for _i, c in enumerate(cols):
            v = s[c]
            if c == "mean_l2_error":
                cells.append(f"{v:.4f} +- {s['se_mean_l2_error']:.4f}".rjust(16) if v is not None else "-".rjust(16))
            elif v is None:
                cells.append("-".rjust(10))
            elif c == "m":
                cells.append(f"{v:>10d}")
            else:
                cells.append(f"{v:>10.4g}")
        print("  ".join(cells))
    if "mean_l2_error_marginals" in summaries[0]:
        print("marginal l2 error (A^-1 on each curator's sub-alphabet):")
        for s in summaries:
            parts = ", ".join(
                f"{name}: {v:.4f}" for name, v in zip(table.curator_names, s["mean_l2_error_marginals"], strict=False)
            )
            print(f"  eps {s['epsilon']:g}, m {s['m']}: {parts}")
    return 0


