"""Calibration and power of the researcher's test of association (issue 42; docs/analysis.md).

Run:  .venv/bin/python bench/bench_association.py [--releases 200] [--draws 199] [--quick]
                                                 [--figure docs/figures/association_calibration.png]
                                                 [--json out.json] [--markdown]

Each point simulates ``--releases`` releases on the count-level fast path
(``mechanism.simulation.monte_carlo.fast_observed_counts``: a population of n records drawn i.i.d. from the
superpopulation, m of them sampled without replacement, PRAM on the joint of K cells with the
keep probability of gamma = 1 + (n/m)(e^epsilon - 1); numpy seed 20261127, a simulation, never a
release). The tested pair is summed out of the joint, as a release's analysis does.

Under the null (the pair independent, or independent within each level of the given attribute),
it reports the rejection rate at alpha 0.05 and 0.01 with its Monte Carlo standard error, the
Kolmogorov-Smirnov p-value of the p-values against uniform, and the same for RAPPOR's Wald test
(measured, not offered: ``mechanism.analysis.association.rappor_wald_test``). Under an alternative with a
given Cramer's V it reports the power of the test next to the non-private chi-square test of the
same m sampled records and of all n records (scipy.stats.chi2_contingency, G-test). The grid:
m from 30 to n, K from 4 to 96, epsilon from 0.1 to 4, marginal and conditional tests.
``--figure`` draws type-I error and power against m with RAPPOR's test beside them.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from secure_release.mechanism.analysis.association import independence_test, rappor_wald_test
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy.accounting import gamma_from_epsilon
from secure_release.mechanism.simulation.monte_carlo import fast_observed_counts

SEED = 20261127


@dataclass(frozen=True)
class Setting:
    """A joint table: the pair (I x J), the strata L of the given attribute (1: a marginal test)
    and ``rest`` cells of other attributes, so K = I J L rest."""

    name: str
    rows: int
    cols: int
    strata: int
    rest: int

    @property
    def joint_size(self) -> int:
        return self.rows * self.cols * self.strata * self.rest


SETTINGS = (
    Setting("2x2, K=4", 2, 2, 1, 1),
    Setting("3x2, K=24 (Adult-like)", 3, 2, 1, 4),
    Setting("3x2 given 2, K=24", 3, 2, 2, 2),
    Setting("4x4 given 2, K=96", 4, 4, 2, 3),
)


def superpopulation(setting: Setting, cramers_v: float, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Shares over (I, J, L, rest): non-uniform marginals, and within every stratum a dependence
    of the pair with Cramer's V = ``cramers_v`` (0: independent) built as p0 (1 + t u v^T) with
    centred scores u, v scaled to the target V."""
    i, j = setting.rows, setting.cols
    row = np.linspace(1.0, 2.0, i)
    row /= row.sum()
    col = np.linspace(2.0, 1.0, j)
    col /= col.sum()
    p0 = np.outer(row, col)
    u = np.arange(i) - row @ np.arange(i)
    v = np.arange(j) - col @ np.arange(j)
    shape = np.outer(u, v)
    base = np.sqrt(np.sum(p0 * shape**2) / (min(i, j) - 1))
    t = cramers_v / base if base > 0 else 0.0
    pair = p0 * (1.0 + t * shape)
    if np.any(pair < 0):
        raise ValueError(f"V = {cramers_v} is too large for {setting.name}")
    strata = np.linspace(1.0, 1.5, setting.strata)
    strata /= strata.sum()
    rest = np.full(setting.rest, 1.0 / setting.rest)
    joint = pair[:, :, None, None] * strata[None, None, :, None] * rest[None, None, None, :]
    return np.asarray(joint / joint.sum(), dtype=np.float64)


def _g_test(table: npt.NDArray[np.int64]) -> float:
    """The non-private G-test p-value of independence (within strata: the sum over strata)."""
    stat, df = 0.0, 0
    for layer in np.moveaxis(table, 2, 0):
        keep_rows, keep_cols = layer.sum(axis=1) > 0, layer.sum(axis=0) > 0
        sub = layer[keep_rows][:, keep_cols]
        if sub.shape[0] < 2 or sub.shape[1] < 2:
            continue
        g, _, d, _ = stats.chi2_contingency(sub, correction=False, lambda_="log-likelihood")
        stat, df = stat + float(g), df + int(d)
    return float(stats.chi2.sf(stat, df)) if df else 1.0


@dataclass(frozen=True)
class Point:
    setting: str
    conditional: bool
    joint_size: int
    n: int
    m: int
    epsilon: float
    keep: float
    cramers_v: float
    releases: int
    reject_05: float
    reject_01: float
    mc_se_05: float
    mc_se_01: float
    ks_p: float
    wald_reject_05: float
    wald_reject_01: float
    nonprivate_m_05: float
    nonprivate_n_05: float
    methods: str
    seconds_per_test: float


def run_point(
    setting: Setting, n: int, m: int, epsilon: float, cramers_v: float, releases: int, draws: int, seed: int
) -> Point:
    rng = np.random.default_rng(seed)
    K = setting.joint_size
    keep = PramChannel(gamma_from_epsilon(n, m, epsilon), K).keep
    shares = superpopulation(setting, cramers_v, rng).reshape(-1)
    shape = (setting.rows, setting.cols, setting.strata, setting.rest)
    p_ours, p_wald, p_np_m, p_np_n, methods = [], [], [], [], set()
    elapsed = 0.0
    for r in range(releases):
        population = rng.multinomial(n, shares)
        observed = fast_observed_counts(population, m, keep, 1, rng)[0].reshape(shape).sum(axis=3)
        start = time.perf_counter()
        test = independence_test(observed, keep, draws=draws, seed=seed + r)
        elapsed += time.perf_counter() - start
        p_ours.append(test.p_value)
        methods.add(test.method.split(";")[-1].strip())
        if setting.strata == 1:
            p_wald.append(rappor_wald_test(observed[:, :, 0], keep).p_value)
        sampled = rng.multivariate_hypergeometric(population, m).reshape(shape).sum(axis=3)
        p_np_m.append(_g_test(sampled))
        p_np_n.append(_g_test(population.reshape(shape).sum(axis=3)))
    p = np.asarray(p_ours)
    wald = np.asarray(p_wald) if p_wald else np.full(1, np.nan)
    return Point(
        setting.name, setting.strata > 1, K, n, m, epsilon, keep, cramers_v, releases,
        float(np.mean(p <= 0.05)), float(np.mean(p <= 0.01)),
        math.sqrt(0.05 * 0.95 / releases), math.sqrt(0.01 * 0.99 / releases),
        float(stats.kstest(p, "uniform").pvalue) if cramers_v == 0 else float("nan"),
        float(np.mean(wald <= 0.05)), float(np.mean(wald <= 0.01)),
        float(np.mean(np.asarray(p_np_m) <= 0.05)), float(np.mean(np.asarray(p_np_n) <= 0.05)),
        ", ".join(sorted(methods)), elapsed / releases,
    )  # fmt: skip


def grid(quick: bool) -> list[tuple[Setting, int, float, float]]:
    n = 4000
    ms = (30, 100, 300, 1000, 4000) if not quick else (30, 300)
    epsilons = (0.1, 0.5, 1.0, 4.0) if not quick else (0.5, 2.0)
    points: list[tuple[Setting, int, float, float]] = []
    for setting in SETTINGS if not quick else SETTINGS[1:3]:
        for eps in epsilons:
            for m in ms:
                points.append((setting, m, eps, 0.0))
    alternative = SETTINGS[1]
    for eps in (0.5, 1.0, 4.0) if not quick else (2.0,):
        for m in (30, 60, 100, 300, 1000, 4000) if not quick else (100, 1000):
            points.append((alternative, m, eps, 0.2))
    return [(s, m, e, v) for s, m, e, v in points if m <= n]


def figure(points: list[Point], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    null = [p for p in points if p.cramers_v == 0 and not p.conditional and p.setting.startswith("3x2, K=24")]
    alt = [p for p in points if p.cramers_v > 0]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for eps in sorted({p.epsilon for p in null}):
        ps = sorted((p for p in null if p.epsilon == eps), key=lambda p: p.m)
        ms = [p.m for p in ps]
        left.plot(ms, [p.reject_05 for p in ps], "o-", label=f"this test, eps {eps:g}")
        left.plot(ms, [p.wald_reject_05 for p in ps], "x--", label=f"RAPPOR Wald, eps {eps:g}")
    left.axhline(0.05, color="k", lw=0.8)
    releases = null[0].releases if null else 1
    left.axhline(0.05 + 2 * math.sqrt(0.05 * 0.95 / releases), color="k", lw=0.6, ls=":")
    left.set(xscale="log", xlabel="m (records sampled)", ylabel="type-I error at alpha 0.05",
             title="Under independence (3x2 pair, K = 24, n = 4,000)")  # fmt: skip
    left.legend(fontsize=7, ncol=2)
    for eps in sorted({p.epsilon for p in alt}):
        ps = sorted((p for p in alt if p.epsilon == eps), key=lambda p: p.m)
        right.plot([p.m for p in ps], [p.reject_05 for p in ps], "o-", label=f"this test, eps {eps:g}")
    if alt:
        ps = sorted({p.m: p for p in alt}.values(), key=lambda p: p.m)
        right.plot([p.m for p in ps], [p.nonprivate_m_05 for p in ps], "k--", label="non-private, same m records")
        right.axhline(ps[0].nonprivate_n_05, color="grey", ls=":", label="non-private, all n records")
    right.set(xscale="log", xlabel="m (records sampled)", ylabel="power at alpha 0.05",
              title=f"Cramer's V = {alt[0].cramers_v if alt else 0:g} (3x2 pair, K = 24)", ylim=(0, 1.02))  # fmt: skip
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(points: list[Point]) -> str:
    head = ("| setting | test | eps | m | keep | V | type-I 0.05 (+-2 SE) | type-I 0.01 | KS p | RAPPOR Wald 0.05 |"
            " non-private m | non-private n | p-value |")  # fmt: skip
    lines = [head, "|" + "---|" * 13]
    for p in points:
        lines.append(
            f"| {p.setting} | {'conditional' if p.conditional else 'marginal'} | {p.epsilon:g} | {p.m} | {p.keep:.3f} "
            f"| {p.cramers_v:g} | {p.reject_05:.3f} (+-{2 * p.mc_se_05:.3f}) | {p.reject_01:.3f} | {p.ks_p:.2g} "
            f"| {p.wald_reject_05:.3f} | {p.nonprivate_m_05:.3f} | {p.nonprivate_n_05:.3f} | {p.methods} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", type=int, default=200, help="releases per point (default 200)")
    parser.add_argument("--draws", type=int, default=199, help="bootstrap draws per test (default 199)")
    parser.add_argument("--quick", action="store_true", help="a few points only")
    parser.add_argument("--workers", type=int, default=2, help="processes, one point each at a time (default 2)")
    parser.add_argument("--figure", help="write the figure (PNG) here")
    parser.add_argument("--json", help="write every point as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args()
    points: list[Point] = []
    start = time.perf_counter()
    todo = grid(args.quick)
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(run_point, setting, 4000, m, eps, v, args.releases, args.draws, SEED + index)
                   for index, (setting, m, eps, v) in enumerate(todo)]  # fmt: skip
        done = [f.result() for f in futures]
    for index, ((setting, m, eps, v), point) in enumerate(zip(todo, done, strict=True)):
        points.append(point)
        flag = ""
        if v == 0 and point.reject_05 > 0.05 + 2 * point.mc_se_05:
            flag = "  <-- over alpha + 2 SE"
        print(f"[{index + 1}/{len(todo)} {time.perf_counter() - start:6.0f} s] {setting.name:<24} eps {eps:<4g} "
              f"m {m:<5} V {v:<4g} reject@.05 {point.reject_05:.3f} @.01 {point.reject_01:.3f} "
              f"KS p {point.ks_p:.2g} | Wald {point.wald_reject_05:.3f} | non-private m {point.nonprivate_m_05:.3f} "
              f"n {point.nonprivate_n_05:.3f} | {point.seconds_per_test * 1e3:.0f} ms/test{flag}",
              flush=True)  # fmt: skip
    if args.markdown:
        print(markdown(points))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([asdict(p) for p in points], fh, indent=1)
    if args.figure:
        figure(points, args.figure)
        print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
