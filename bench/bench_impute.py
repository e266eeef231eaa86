"""Multiple imputation of a large release (DESIGN 13): M imputations of K = 10^4 cells, m = 10^6.

Run:  .venv/bin/python bench/bench_impute.py [--imputations 20] [--epsilon 1] [--json]

The release: a random joint theta ~ Dirichlet(1) over K = 100 x 100 cells (numpy seed 20261207, a
simulation, never a release), m = 10^6 records, the channel of the plan at ``--epsilon`` with m
at the plan's m* (n chosen so that m* = m, Cor. 3.6; then keep a = sqrt K/(2 sqrt K + 1), about
1/2, whatever epsilon); the observed counts o ~ Multinomial(m, A theta). It prints the wall
time of :func:`~secure_release.mechanism.estimation.imputation.impute` (saturated joint, two
chains, spacing from the pilot) and its ratio to one maximum-likelihood fit of the same release
measured in the same run (:func:`~secure_release.mechanism.estimation.estimators.estimate_mle_exact`,
the project's MLE: water filling, the closed form of EM's fixed point), and the spacing, burn-in,
R-hat and autocorrelations the imputation chose and measured.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from secure_release.mechanism.estimation.estimators import estimate_mle_exact
from secure_release.mechanism.estimation.imputation import impute
from secure_release.mechanism.privacy.plan import plan_release

SEED = 20261207
SIZES = (100, 100)
M_RECORDS = 1_000_000


def population_for(m: int, sizes: tuple[int, ...], epsilon: float) -> int:
    """The n whose m* (Cor. 3.6) is m: n = m K^(3/2) / ((1 + sqrt K)(e^eps - 1)), rounded."""
    K = int(math.prod(sizes))
    n: float = m * math.pow(K, 1.5) / ((1 + math.sqrt(K)) * math.expm1(epsilon))
    return round(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imputations", type=int, default=20)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()
    plan = plan_release(population_for(M_RECORDS, SIZES, args.epsilon), SIZES, args.epsilon, M_RECORDS)
    channel = plan.channel
    rng = np.random.default_rng(SEED)
    theta = rng.dirichlet(np.ones(plan.joint_size))
    observed = rng.multinomial(plan.m, channel.keep * theta + channel.off_diagonal)

    start = time.perf_counter()
    estimate_mle_exact(observed, channel.keep)
    mle_seconds = time.perf_counter() - start

    start = time.perf_counter()
    result = impute(observed, channel, args.imputations, np.random.default_rng(SEED + 1))
    impute_seconds = time.perf_counter() - start
    d = result.diagnostics
    figures = {
        "K": plan.joint_size, "m": plan.m, "n": plan.n, "epsilon": plan.epsilon, "gamma": plan.gamma,
        "keep": channel.keep, "imputations": args.imputations, "chains": result.chains,
        "impute_seconds": impute_seconds, "mle_seconds": mle_seconds, "ratio_to_mle": impute_seconds / mle_seconds,
        "pilot_sweeps": result.pilot_sweeps, "pilot_rate": d.pilot_autocorrelation, "spacing": result.spacing,
        "burn_in": result.burn_in, "max_rhat": d.max_rhat,
        "max_sweep_autocorrelation": float(np.nanmax(np.abs(d.sweep_autocorrelation))),
        "max_imputation_autocorrelation": d.max_imputation_autocorrelation,
        "summaries": dict(zip(d.summaries, zip(d.rhat.tolist(), d.imputation_autocorrelation.tolist(), strict=True),
                              strict=True)),
    }  # fmt: skip
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"release: K = {plan.joint_size}, m = {plan.m}, n = {plan.n}, epsilon = {plan.epsilon:g}, "
          f"gamma = {plan.gamma:.6g}, keep a = {channel.keep:.4f}")  # fmt: skip
    print(
        f"impute, M = {args.imputations}, {result.chains} chains: {impute_seconds:.2f} s "
        f"= {impute_seconds / mle_seconds:.0f}x one MLE fit (estimate_mle_exact: {1000 * mle_seconds:.1f} ms)"
    )
    print(
        f"pilot {result.pilot_sweeps} sweeps, slowest rate {d.pilot_autocorrelation:.3f} -> spacing {result.spacing}, "
        f"burn-in {result.burn_in}"
    )
    print(
        f"max R-hat {d.max_rhat:.3f}; max |autocorrelation| between consecutive imputations "
        f"{d.max_imputation_autocorrelation:.3f}"
    )
    print(result)


if __name__ == "__main__":
    main()
