"""Coverage of pooled multiple-imputation intervals of perturbed releases (DESIGN 13), by simulation.

Run:  .venv/bin/python bench/bench_impute_coverage.py [--releases 1000] [--processes 2] [--quick] [--json]
                                                      [--out docs/figures/imputation_coverage.csv]

Every release is drawn as the mechanism draws it: a fresh population of n = 2,000 records from a
superpopulation (so the target is the model's coefficient itself), a sample of the plan's m
(Cor. 3.6, ``plan_release(n, alphabet, epsilon).m``) and gamma-diagonal PRAM with the plan's gamma
over the K joint cells, at count level (``fast_observed_counts``: multivariate hypergeometric
sample, Binomial(s_c, a) kept, the rest uniform over K; exactly the per-record law,
tests/unit/test_sim_fast_path.py). The perturbed counts o become a ReleaseReport
(``build_report`` of ``estimate_from_counts``, as the researcher builds it), imputed by
``impute_tables`` (M = 20 by data augmentation under the release's channel) and fitted by
``Imputations.fit`` (statsmodels on every imputation, pooled by Rubin's rules): the notebook's
``Result.impute(M, seed=..., model=...).fit(formula, family)`` without the services.

Benchmarks, each a point of epsilon (and beta1):

* ``logistic`` (NAPSU-MQ's, Raisa et al. AISTATS 2023): X1, X2 ~ Bernoulli(0.5) at one curator,
  Y at the other (alphabet [4, 2], K = 8), logit P(Y = 1) = beta1 X1; ``y ~ x1 + x2`` (truth 0,
  beta1, 0), epsilon in {0.5, 1, 2, 4} x beta1 in {0, 1}. Methods: imputation under the
  saturated joint, under the log-linear ``y*x1 + y*x2 + x1*x2`` (it contains the analysis), the
  table as data (a binomial GLM with the perturbed counts o as frequency weights: what a user who
  ignores the noise gets), and the project's own PRAM-likelihood logistic (``analysis.logistic``,
  ``Result.logistic``). Width: the median over releases of the pooled interval's width of x1 over
  the own logistic's.
* ``poisson``: A at one curator, B and C (3 levels) at the other (alphabet [2, 6], K = 12),
  log p(a, b, c) = const - 0.5 b + 1.0 ab + log P(c), C independent; ``count ~ a*b + c`` (family
  poisson), the A:B log odds ratio (truth 1); imputed under the saturated joint and ``a*b + c``.
* ``ordinal``: X ~ Bernoulli(0.5) at one curator, G (3 ordered levels) at the other (alphabet
  [2, 3], K = 6), logit P(G <= j | x) = t_j - 1.0 x, t = (-0.5, 1); ``g ~ x`` (family ordinal,
  statsmodels' OrderedModel), the coefficient of x (truth 1); imputed under the saturated joint.

A degenerate imputation (``DegenerateImputationError``) or a failed fit counts as an interval that
misses, and is counted in its own column. Coverage is printed with its Monte Carlo standard
error sqrt(c (1 - c) / R). Seeds are fixed per release (numpy's SeedSequence of the bench's seed,
the benchmark, the point and the release's index): a rerun reproduces every figure.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

SEED = 20261207
N_RECORDS = 2000
IMPUTATIONS = 20
LEVEL = 0.95
EPSILONS = (0.5, 1.0, 2.0, 4.0)
BETAS = (0.0, 1.0)
EXTRA_EPSILONS = (1.0, 2.0)
QUICK_RELEASES = 100
#: Targets: the pooled 95% interval's coverage under each imputation model, and the width ratio.
SATURATED_TARGET = (0.93, 0.98)
LOGLINEAR_TARGET = (0.93, 0.97)
WIDTH_RATIO_TARGET = 1.2
#: The A:B log odds ratio of the Poisson benchmark, and the ordinal benchmark's effect and cut points.
LOG_ODDS_RATIO_AB = 1.0
ORDINAL_EFFECT = 1.0
ORDINAL_CUTS = (-0.5, 1.0)

OWN = "own logistic"
TABLE = "table as data"
SATURATED = "saturated MI"


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its curators' attributes, the analysis, the imputation models, the terms."""

    name: str
    curators: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]
    formula: str
    family: str
    models: tuple[tuple[str, str | None], ...]  # (method name, imputation model; None: saturated)
    terms: tuple[tuple[str, str], ...]  # (short name, statsmodels' name)


LOGISTIC = Benchmark(
    "logistic", (("alice", (("x1", 2), ("x2", 2))), ("bob", (("y", 2),))), "y ~ x1 + x2", "binomial",
    ((SATURATED, None), ("log-linear MI", "y*x1 + y*x2 + x1*x2")),
    (("Intercept", "Intercept"), ("x1", "x1[T.1]"), ("x2", "x2[T.1]")),
)  # fmt: skip
POISSON = Benchmark(
    "poisson", (("alice", (("a", 2),)), ("bob", (("b", 2), ("c", 3)))), "count ~ a*b + c", "poisson",
    ((SATURATED, None), ("a*b + c MI", "a*b + c")), (("a:b", "a[T.1]:b[T.1]"),),
)  # fmt: skip
ORDINAL = Benchmark(
    "ordinal", (("alice", (("x", 2),)), ("bob", (("g", 3),))), "g ~ x", "ordinal",
    ((SATURATED, None),), (("x", "x[T.1]"),),
)  # fmt: skip
BENCHMARKS = {b.name: b for b in (LOGISTIC, POISSON, ORDINAL)}


@dataclass(frozen=True)
class Point:
    benchmark: str
    epsilon: float
    beta: float  # the logistic's beta1; the others' effect (fixed)

    @property
    def label(self) -> str:
        effect = f"beta1 = {self.beta:g}" if self.benchmark == "logistic" else f"effect {self.beta:g}"
        return f"{self.benchmark}, epsilon = {self.epsilon:g}, {effect}"


def points() -> list[Point]:
    main = [Point("logistic", e, b) for e in EPSILONS for b in BETAS]
    extra = [Point(name, e, eff) for name, eff in (("poisson", LOG_ODDS_RATIO_AB), ("ordinal", ORDINAL_EFFECT))
             for e in EXTRA_EPSILONS]  # fmt: skip
    return main + extra


# --- the superpopulation of each benchmark --------------------------------------------------------


def cell_probabilities(point: Point) -> npt.NDArray[np.float64]:
    """The superpopulation's joint distribution over the K cells, in joint-code order (the first
    attribute slowest)."""
    if point.benchmark == "logistic":
        x1 = np.array([0, 0, 0, 0, 1, 1, 1, 1])
        y = np.array([0, 1, 0, 1, 0, 1, 0, 1])
        p1 = 1.0 / (1.0 + np.exp(-point.beta * x1))
        return np.asarray(0.25 * np.where(y == 1, p1, 1.0 - p1), dtype=np.float64)
    if point.benchmark == "poisson":
        a, b, c = np.indices((2, 2, 3)).reshape(3, -1)
        c_share = np.array([0.5, 0.3, 0.2])[c]
        weight = np.exp(-0.5 * b + point.beta * a * b) * c_share
        return np.asarray(weight / weight.sum(), dtype=np.float64)
    x, g = np.indices((2, 3)).reshape(2, -1)
    cuts = np.array([*ORDINAL_CUTS, np.inf])
    below = 1.0 / (1.0 + np.exp(-(cuts[g] - point.beta * x)))
    below_prev = np.where(g == 0, 0.0, 1.0 / (1.0 + np.exp(-(cuts[np.maximum(g - 1, 0)] - point.beta * x))))
    return np.asarray(0.5 * (below - below_prev), dtype=np.float64)


def truth(point: Point, term: str) -> float:
    if point.benchmark == "logistic":
        return point.beta if term == "x1" else 0.0
    return point.beta


# --- one release ------------------------------------------------------------------------------------


@cache
def _setup(benchmark: str, epsilon: float) -> tuple[Any, Any]:
    from secure_release.mechanism.privacy.plan import plan_release
    from secure_release.mechanism.schema import Attribute, CuratorSchema, JointSchema

    b = BENCHMARKS[benchmark]
    schema = JointSchema(tuple(
        CuratorSchema(name, tuple(Attribute(a, tuple(str(v) for v in range(k))) for a, k in attrs))
        for name, attrs in b.curators
    ))  # fmt: skip
    return schema, plan_release(N_RECORDS, list(schema.alphabet_sizes), epsilon)


def release_report(point: Point, rng: np.random.Generator) -> Any:
    """A fresh population of n records, a sample of m, PRAM: the researcher's ReleaseReport."""
    from secure_release.mechanism.estimation.report import build_report
    from secure_release.mechanism.protocol.in_memory import estimate_from_counts
    from secure_release.mechanism.simulation.monte_carlo import fast_observed_counts

    schema, plan = _setup(point.benchmark, point.epsilon)
    population = rng.multinomial(N_RECORDS, cell_probabilities(point))
    observed = fast_observed_counts(population, plan.m, plan.channel.keep, 1, rng)[0]
    curators = [c.name for c in schema.curators]
    return build_report("coverage", plan, curators, estimate_from_counts(observed, plan), schema)


def _cell_frame(report: Any, counts: npt.NDArray[np.int64], rows: bool) -> Any:
    """The counts as ImputedTable.frame lays out an imputation (ordered categoricals, ``count``)."""
    from secure_release.frames import require

    pd = require("pandas")

    values = np.asarray(report.labels, dtype=object)
    index = np.repeat(np.arange(counts.size), counts) if rows else np.arange(counts.size)
    data: dict[str, Any] = {}
    for j, name in enumerate(report.attributes):
        levels = list(dict.fromkeys(values[:, j]))
        data[name] = pd.Categorical(values[index, j], categories=levels, ordered=True)
    if not rows:
        data["count"] = counts.astype(np.int64)
    return pd.DataFrame(data)


def table_as_data(b: Benchmark, report: Any) -> dict[str, tuple[float, float]]:
    """The analysis fitted on the perturbed counts o as if they were the records (Wald, 95%)."""
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    observed = np.asarray(report.observed, dtype=np.int64)
    if b.family == "ordinal":
        from statsmodels.miscmodels.ordinal_model import OrderedModel

        frame = _cell_frame(report, observed, rows=True)
        result = OrderedModel.from_formula(b.formula, frame, distr="logit").fit(method="bfgs", disp=False, maxiter=200)
    elif b.family == "poisson":
        result = smf.glm(b.formula, _cell_frame(report, observed, rows=False), family=sm.families.Poisson()).fit()
    else:
        frame = _cell_frame(report, observed, rows=False)
        frame["y"] = (frame["y"] == "1").astype(np.int64)
        result = smf.glm(b.formula, frame, family=sm.families.Binomial(), freq_weights=observed.astype(float)).fit()
    bounds = np.asarray(result.conf_int(alpha=1 - LEVEL))
    names = [str(n) for n in result.params.index]
    return {
        short: (float(bounds[names.index(full), 0]), float(bounds[names.index(full), 1])) for short, full in b.terms
    }


def own_logistic(report: Any) -> dict[str, tuple[float, float]]:
    """The project's PRAM-likelihood logistic (``Result.logistic("y", ["x1", "x2"])``)."""
    from secure_release import analysis

    fit = analysis.logistic(report, "y", ["x1", "x2"], level=LEVEL).fit
    return {short: (float(lo), float(hi)) for (short, _), lo, hi in zip(LOGISTIC.terms, fit.ci_low, fit.ci_high,
                                                                       strict=True)}  # fmt: skip


def pooled(b: Benchmark, report: Any, model: str | None, seed: int) -> dict[str, tuple[float, float]]:
    """``Result.impute(M, seed=seed, model=model).fit(formula, family)``'s pooled intervals."""
    from secure_release.imputation import impute_tables

    fit = impute_tables([(1, report)], IMPUTATIONS, seed=seed, model=model).fit(b.formula, b.family, level=LEVEL)
    names = list(fit.pooled.names)
    return {short: (float(fit.pooled.ci_low[names.index(full)]), float(fit.pooled.ci_high[names.index(full)]))
            for short, full in b.terms}  # fmt: skip


def run_release(task: tuple[Point, int, int]) -> dict[str, Any]:
    """One release: every method's interval per term, or why it has none ("degenerate", "failed")."""
    from secure_release.imputed_fits import DegenerateImputationError

    point, index, release = task
    b = BENCHMARKS[point.benchmark]
    sequence = np.random.SeedSequence([SEED, list(BENCHMARKS).index(b.name), index, release])
    draw_seed, impute_seed = sequence.spawn(2)
    report = release_report(point, np.random.default_rng(draw_seed))
    seed = int(impute_seed.generate_state(1)[0])
    methods: list[tuple[str, Any]] = [(name, (lambda m=model: pooled(b, report, m, seed))) for name, model in b.models]
    methods.append((TABLE, lambda: table_as_data(b, report)))
    if b.name == "logistic":
        methods.append((OWN, lambda: own_logistic(report)))
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, method in methods:
            try:
                out[name] = method()
            except DegenerateImputationError:
                out[name] = "degenerate"
            except Exception as exc:  # a failed fit misses: counted, never hidden
                out[name] = f"failed: {type(exc).__name__}: {exc}"
    return out


# --- the figures ------------------------------------------------------------------------------------


def method_names(b: Benchmark) -> list[str]:
    return [name for name, _ in b.models] + [TABLE] + ([OWN] if b.name == "logistic" else [])


def summarize(point: Point, results: Sequence[dict[str, Any]], seconds: float) -> list[dict[str, Any]]:
    """One row per (method, term): coverage, its Monte Carlo standard error, the degenerate and
    failed releases, the median width and (x1 of the logistic) the median width ratio to the own fit."""
    b = BENCHMARKS[point.benchmark]
    _, plan = _setup(point.benchmark, point.epsilon)
    R = len(results)
    rows = []
    for method in method_names(b):
        got = [r[method] for r in results]
        degenerate = sum(1 for g in got if g == "degenerate")
        failed = sum(1 for g in got if isinstance(g, str) and g.startswith("failed"))
        for short, _ in b.terms:
            t = truth(point, short)
            bounds = np.array([g[short] if isinstance(g, dict) else (math.nan, math.nan) for g in got])
            covered = int(np.sum((bounds[:, 0] <= t) & (t <= bounds[:, 1])))  # NaN bounds miss
            coverage = covered / R
            widths = bounds[:, 1] - bounds[:, 0]
            row: dict[str, Any] = {
                "benchmark": b.name, "epsilon": point.epsilon, "beta": point.beta, "m": plan.m,
                "keep": round(plan.channel.keep, 6), "method": method, "term": short, "truth": t, "releases": R,
                "covered": covered, "coverage": coverage, "mc_se": math.sqrt(coverage * (1 - coverage) / R),
                "degenerate": degenerate, "failed": failed,
                "coverage_of_usable": covered / (R - degenerate - failed) if degenerate + failed < R else math.nan,
                "median_width": float(np.nanmedian(widths)) if np.isfinite(widths).any() else math.nan,
                "median_width_ratio_to_own": math.nan, "seconds": round(seconds, 1),
            }  # fmt: skip
            if b.name == "logistic" and short == "x1" and method != OWN:
                own = np.array([r[OWN]["x1"][1] - r[OWN]["x1"][0] if isinstance(r[OWN], dict) else math.nan
                                for r in results])  # fmt: skip
                ratio = widths / own
                row["median_width_ratio_to_own"] = float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else math.nan
            rows.append(row)
    return rows


def _target(method: str) -> tuple[float, float] | None:
    if method == SATURATED:
        return SATURATED_TARGET
    if method.endswith(" MI"):
        return LOGLINEAR_TARGET
    return None


def print_point(point: Point, rows: Sequence[dict[str, Any]], failures: dict[str, str]) -> None:
    first = rows[0]
    print(f"\n{point.label}: m = {first['m']}, keep a = {first['keep']:.4f}, {first['releases']} releases, "
          f"M = {IMPUTATIONS}, {first['seconds']:.0f} s")  # fmt: skip
    b = BENCHMARKS[point.benchmark]
    terms = [short for short, _ in b.terms]
    header = f"  {'method':<16}" + "".join(f"{t + ' (' + format(truth(point, t), 'g') + ')':>26}" for t in terms)
    extra = "  width x1 / own" if b.name == "logistic" else ""
    print(header + f"{'degenerate':>12}{'failed':>8}{extra}  target")
    for method in method_names(b):
        mine = {r["term"]: r for r in rows if r["method"] == method}
        cells = "".join(f"{mine[t]['coverage']:>11.3f} ± {mine[t]['mc_se']:.3f} ({mine[t]['coverage_of_usable']:.3f})"
                        for t in terms)  # fmt: skip
        first_row = mine[terms[0]]
        line = f"  {method:<16}{cells}{first_row['degenerate']:>12}{first_row['failed']:>8}"
        if b.name == "logistic":
            ratio = mine["x1"]["median_width_ratio_to_own"]
            line += f"{'' if math.isnan(ratio) else format(ratio, '.3f'):>17}"
        target = _target(method)
        if target is not None:
            inside = all(target[0] <= mine[t]["coverage"] <= target[1] for t in terms)
            line += f"  [{target[0]}, {target[1]}] {'met' if inside else 'MISSED'}"
        print(line)
    print(
        "  coverage ± its Monte Carlo standard error (in parentheses: over the releases whose every "
        "imputation gave a usable fit); degenerate and failed releases count as misses"
    )
    for method, why in failures.items():
        print(f"  first failure of {method}: {why[:200]}")


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_done(path: Path, releases: int) -> list[dict[str, Any]]:
    """The rows of a previous run's CSV whose point ran ``releases`` releases (for --resume)."""
    if not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        rows: list[dict[str, Any]] = list(csv.DictReader(handle))
    for row in rows:
        for key in ("epsilon", "beta", "keep", "truth", "coverage", "mc_se", "coverage_of_usable", "median_width",
                    "median_width_ratio_to_own", "seconds"):  # fmt: skip
            row[key] = float(row[key]) if row[key] not in ("", "nan") else math.nan
        for key in ("m", "releases", "covered", "degenerate", "failed"):
            row[key] = int(row[key])
    return [r for r in rows if r["releases"] == releases]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=1000, help="releases a point (default 1000)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (at most 2)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RELEASES} releases a point")
    parser.add_argument("--only", choices=sorted(BENCHMARKS), action="append", help="run only these benchmarks")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list instead of text")
    parser.add_argument("--out", type=Path, help="write the rows as CSV (rewritten after every point)")
    parser.add_argument(
        "--resume", action="store_true", help="keep the points --out already holds at this many releases"
    )
    args = parser.parse_args()
    releases = QUICK_RELEASES if args.quick else args.releases
    processes = max(1, min(args.processes, 2))
    chosen = [(i, p) for i, p in enumerate(points()) if not args.only or p.benchmark in args.only]
    log = sys.stderr if args.json else sys.stdout
    print(f"coverage of pooled 95% intervals: {len(chosen)} points x {releases} releases, M = {IMPUTATIONS}, "
          f"n = {N_RECORDS}, {processes} processes", file=log, flush=True)  # fmt: skip
    all_rows = read_done(args.out, releases) if args.resume and args.out else []
    done_points = {(r["benchmark"], r["epsilon"], r["beta"]) for r in all_rows}
    chosen = [(i, p) for i, p in chosen if (p.benchmark, p.epsilon, p.beta) not in done_points]
    if done_points:
        print(f"resuming: {len(done_points)} points already in {args.out}", file=log, flush=True)
    start = time.perf_counter()
    context = multiprocessing.get_context("fork")
    with context.Pool(processes) as pool:
        for done, (index, point) in enumerate(chosen):
            began = time.perf_counter()
            tasks = [(point, index, r) for r in range(releases)]
            results: list[dict[str, Any]] = []
            for k, result in enumerate(pool.imap(run_release, tasks, chunksize=5), start=1):
                results.append(result)
                if k % max(releases // 4, 1) == 0 and k < releases:
                    print(f"  [{point.label}] {k}/{releases} releases, {time.perf_counter() - began:.0f} s",
                          file=log, flush=True)  # fmt: skip
            seconds = time.perf_counter() - began
            rows = summarize(point, results, seconds)
            all_rows += rows
            failures = {m: r[m] for r in results for m in r if isinstance(r[m], str) and r[m].startswith("failed")}
            if not args.json:
                print_point(point, rows, failures)
            total = time.perf_counter() - start
            print(f"  ({done + 1}/{len(chosen)} points, {total:.0f} s so far)", file=log, flush=True)
            if args.out:
                write_csv(args.out, all_rows)
    if args.json:
        clean = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in all_rows]
        print(json.dumps(clean, indent=1))


if __name__ == "__main__":
    main()
