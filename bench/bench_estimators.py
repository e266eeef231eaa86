"""Which estimate to headline: raw A^-1, projected, MLE (and the data-free uniform 1/K) (issue 23).

Run:  PYTHONPATH=. python bench/bench_estimators.py [--trials 1000] [--markdown]

For each setting (data set, K, epsilon) at m = m* (Cor. 3.6, as a release plans it), ``trials``
releases are simulated on the count-level fast path (``mechanism.simulation.monte_carlo``: multivariate
hypergeometric sample, then PRAM at count level; numpy seed 20231123, a simulation, never a
release) and the mean l2 error ||T_hat - T||_2 of each estimate is reported with its standard
error. Settings: the audited ones (uniform, linear, peaky at K = 24 and epsilon 0.1 / 0.5 / 1;
uniform and peaky at K = 96 and 384), Adult (K = 24) at epsilon 0.1, 0.5, 1, 2, Zipf at K = 24,
96, 384, and tables with one cell of 20-60% (the rest uniform) at K = 96 and 384, where a
data-driven switch between projection and MLE failed. ``switch`` is that rejected rule (per
trial: the projection when the projected sum of squared shares exceeds 0.3, else the MLE). The
last lines give each estimator's worst excess over the best of raw / projected / MLE. The table
in docs/estimators.md is this script's ``--markdown`` output; the rule it justifies is
``mechanism.estimation.estimators.DEFAULT_ESTIMATOR``.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.estimation.estimators import DEFAULT_ESTIMATOR, invert_channel, mle_water_filling
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.simulation.datasets import largest_remainder, two_curator_split
from secure_release.mechanism.simulation.monte_carlo import fast_observed_counts, project_to_simplex_batch
from secure_release.tables import adult, synthetic

SEED = 20231123
N = 45222
ESTIMATES = ("raw", "projected", "mle")
SETTINGS: list[tuple[str, int, float]] = [
    *(("adult", 24, e) for e in (0.1, 0.5, 1.0, 2.0)),
    *((kind, 24, e) for kind in ("uniform", "linear", "peaky") for e in (0.1, 0.5, 1.0)),
    *((kind, K, e) for kind in ("uniform", "peaky") for K in (96, 384) for e in (0.5, 1.0)),
    *(("zipf", K, e) for K in (24, 96, 384) for e in (0.5, 1.0)),
    *((f"peak{p}", K, e) for p in (20, 40, 60) for K in (96, 384) for e in (0.1, 1.0)),
]
SWITCH = 0.3


def counts_of(kind: str, K: int) -> npt.NDArray[np.int64]:
    if kind == "adult":
        return np.asarray(adult().counts, dtype=np.int64).ravel()
    if kind.startswith("peak") and kind[4:].isdigit():
        p = int(kind[4:]) / 100
        w = np.full(K, (1 - p) / (K - 1))
        w[0] = p
        return largest_remainder(w, N)
    return np.asarray(synthetic(kind, K, N).counts, dtype=np.int64).ravel()


def run_setting(kind: str, K: int, epsilon: float, trials: int, rng: np.random.Generator) -> dict[str, object]:
    counts = counts_of(kind, K)
    n = int(counts.sum())
    plan = plan_release(n, (6, 4) if kind == "adult" else two_curator_split(K), epsilon)
    channel = PramChannel(plan.gamma, K)
    truth = counts / n
    obs = fast_observed_counts(counts, plan.m, channel.keep, trials, rng).astype(np.float64)
    raw = invert_channel(obs / plan.m, channel.keep, channel.off_diagonal)
    proj = project_to_simplex_batch(raw)
    errors = {
        "raw": np.linalg.norm(raw - truth, axis=1),
        "projected": np.linalg.norm(proj - truth, axis=1),
        "mle": np.linalg.norm(mle_water_filling(obs, channel.keep) - truth, axis=1),
        "uniform": np.full(trials, float(np.linalg.norm(1.0 / K - truth))),
    }
    errors["switch"] = np.where(np.sum(proj**2, axis=1) > SWITCH, errors["projected"], errors["mle"])
    mean = {k: float(v.mean()) for k, v in errors.items()}
    se = {k: float(v.std(ddof=1) / math.sqrt(trials)) for k, v in errors.items()}
    best = min(ESTIMATES, key=lambda k: mean[k])
    excess = {k: mean[k] / mean[best] - 1 for k in (*ESTIMATES, "switch")}
    return {"data": kind, "K": K, "epsilon": epsilon, "m": plan.m, "mean": mean, "se": se, "best": best,
            "excess": excess}  # fmt: skip


def markdown(rows: list[dict[str, object]], trials: int) -> str:
    out = [
        f"Trials per setting: {trials}; numpy seed {SEED}; n = {N}; m = m*; mean l2 error (its standard error); "
        "`uniform` is the data-free estimate 1/K in every cell; excess = mean error / best mean error - 1.",
        "",
        "| data | K | epsilon | m* | raw | projected | MLE | uniform | best | projected's excess | MLE's excess |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    worst = dict.fromkeys((*ESTIMATES, "switch"), 0.0)
    for r in rows:
        mean, se, excess = r["mean"], r["se"], r["excess"]
        assert isinstance(mean, dict) and isinstance(se, dict) and isinstance(excess, dict)
        cells = " | ".join(f"{mean[k]:.4f} ({se[k]:.4f})" for k in ESTIMATES)
        out.append(
            f"| {r['data']} | {r['K']} | {r['epsilon']:g} | {r['m']} | {cells} | {mean['uniform']:.4f} | {r['best']} | "
            f"{100 * excess['projected']:.1f}% | {100 * excess['mle']:.1f}% |"
        )
        for k in worst:
            worst[k] = max(worst[k], excess[k])
    out += ["", "Worst excess over the best estimate, all settings: " + ", ".join(
        f"{k} {100 * v:.1f}%" for k, v in worst.items()) + f". Default: {DEFAULT_ESTIMATOR}."]  # fmt: skip
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)
    t0 = time.perf_counter()
    rows = [run_setting(kind, K, eps, args.trials, rng) for kind, K, eps in SETTINGS]
    print(markdown(rows, args.trials) if args.markdown else "\n".join(map(str, rows)))
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
