"""Benchmark of the simulator.

1. The full Figure 5 sweep on Adult (3 epsilons x >= 20 values of m x 1000 trials, fast path),
   timed without and with the EM (MLE) estimator.
2. Trials per second at m = n (no sampling, eps0 = epsilon) of the fast path, the per-record
   mechanism path, and a peer: multi_freq_ldpy's GRR client + estimator on the same records,
   where the two mechanisms coincide (GRR with eps0 = ln gamma is our PRAM with gamma, m = n).

Run (from the repository root): PYTHONPATH=. python bench/bench_simulate.py [--json] [--trials 1000]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.simulation.monte_carlo import log_m_grid, records_from_counts, simulate_point
from secure_release.tables import adult


def fig5_sweep(trials: int, estimators: tuple[str, ...], grid: int) -> tuple[float, int]:
    table = adult()
    rng = np.random.default_rng(1)
    points = 0
    t0 = time.perf_counter()
    for eps in (0.1, 0.5, 1.0):
        m_star = accounting.optimal_sample_size_int(table.n, table.joint_size, eps)
        for m in log_m_grid(table.n, m_star, grid, extra=(m_star,)):
            simulate_point(table.counts, eps, m, trials, rng, table.alphabet_sizes, estimators)
            points += 1
    return time.perf_counter() - t0, points


def rate(fn, trials: int) -> float:
    t0 = time.perf_counter()
    fn(trials)
    return trials / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--grid", type=int, default=20)
    ap.add_argument("--per-record-trials", type=int, default=10)
    ap.add_argument("--grr-trials", type=int, default=3)
    args = ap.parse_args()
    out: dict[str, float | int | str] = {}

    t_raw, points = fig5_sweep(args.trials, ("raw", "projected"), args.grid)
    t_mle, _ = fig5_sweep(args.trials, ("raw", "projected", "mle"), args.grid)
    out.update(
        fig5_points=points,
        fig5_trials=args.trials,
        fig5_seconds_raw_projected=t_raw,
        fig5_seconds_with_mle=t_mle,
    )

    table = adult()
    n, K, eps = table.n, table.joint_size, 1.0
    rng = np.random.default_rng(2)
    out["rate_fast_trials_per_s"] = rate(
        lambda t: simulate_point(table.counts, eps, n, t, rng, table.alphabet_sizes, ("raw",)), 2000
    )
    out["rate_per_record_trials_per_s"] = rate(
        lambda t: simulate_point(
            table.counts, eps, n, t, rng, table.alphabet_sizes, ("raw",), per_record=True
        ),
        args.per_record_trials,
    )
    try:
        from multi_freq_ldpy.pure_frequency_oracles.GRR import GRR_Aggregator_MI, GRR_Client

        gamma = accounting.gamma_from_epsilon(n, n, eps)
        eps0 = math.log(gamma)  # = eps at m = n
        records = records_from_counts(table.counts)
        GRR_Client(0, K, eps0)  # numba compile outside the timing

        def grr(t: int) -> None:
            for _ in range(t):
                reports = [GRR_Client(int(x), K, eps0) for x in records]
                GRR_Aggregator_MI(reports, K, eps0)

        out["rate_grr_multi_freq_ldpy_trials_per_s"] = rate(grr, args.grr_trials)
        out["fast_over_grr"] = (
            out["rate_fast_trials_per_s"] / out["rate_grr_multi_freq_ldpy_trials_per_s"]
        )
        out["per_record_over_grr"] = (
            out["rate_per_record_trials_per_s"] / out["rate_grr_multi_freq_ldpy_trials_per_s"]
        )
    except ImportError:
        out["rate_grr_multi_freq_ldpy_trials_per_s"] = "multi_freq_ldpy not installed"
    out["fast_over_per_record"] = (
        out["rate_fast_trials_per_s"] / out["rate_per_record_trials_per_s"]
    )

    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(f"Fig. 5 sweep, Adult, {points} (epsilon, m) points x {args.trials} trials, fast path:")
    print(f"  raw + projected      {t_raw:8.2f} s   (target <= 10 s)")
    print(f"  raw + projected + MLE{t_mle:8.2f} s")
    print(f"Trials per second at m = n = {n}, K = {K}, epsilon = eps0 = {eps:g}:")
    for key in (
        "rate_fast_trials_per_s",
        "rate_per_record_trials_per_s",
        "rate_grr_multi_freq_ldpy_trials_per_s",
    ):
        v = out[key]
        print(f"  {key:42s} {v:12.3f}" if isinstance(v, float) else f"  {key:42s} {v}")
    for key in ("fast_over_per_record", "fast_over_grr", "per_record_over_grr"):
        if key in out:
            print(f"  {key:42s} {out[key]:12.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
