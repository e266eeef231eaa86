"""Speed of the researcher's analyses (issue 42): a test and an association at K up to 1,000
cells, bootstrap included, and `associations` over 10 attributes.

Run:  .venv/bin/python bench/bench_analysis_speed.py [--repeat 3]

Targets: one test (p-value by the parametric bootstrap, 999 draws) and one association (effect
sizes with intervals) each at most 1 s for a table of up to 1,000 cells; `Result.associations()`
over 10 attributes (5 a curator: 25 cross-curator pairs) at most 30 s. The reference measured in
the same run is scipy's non-private chi-square test of the same table (scipy.stats.chi2_contingency);
the ratio says how many non-private tests one private test costs on this machine today.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats

from secure_release import api
from secure_release.mechanism.analysis.association import independence_test
from secure_release.mechanism.analysis.effects import association_effects
from secure_release.mechanism.primitives.pram import PramChannel

SEED = 20261127


def best_of(repeat: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times)


def table_speed(repeat: int) -> None:
    rng = np.random.default_rng(SEED)
    print("one table (I x J x L cells), m = 2,000, keep from K = the table's cells x 4 and gamma 5:")
    print(f"{'cells':>6} {'shape':>10} {'keep':>6} {'test s':>8} {'effects s':>10} {'scipy s':>9} "
          f"{'test/scipy':>10}  method")  # fmt: skip
    cases = [(shape, 5.0, False) for shape in ((2, 2, 1), (3, 2, 2), (10, 10, 1), (10, 10, 10), (25, 40, 1))]
    cases += [(shape, 40.0 * int(np.prod(shape)), True) for shape in ((10, 10, 10), (25, 40, 1))]
    for shape, gamma, dependent in cases:
        cells = int(np.prod(shape))
        keep = PramChannel(gamma, 4 * cells).keep
        p = rng.dirichlet(np.ones(cells))
        if dependent:  # a strong association: every bootstrap draw is needed (p = 1/1000)
            p = p.reshape(shape)
            i, j = np.indices(shape[:2])
            p = (p * np.where(i % shape[1] == j % shape[0], 20.0, 1.0)[:, :, None]).reshape(-1)
            p /= p.sum()
        observed = rng.multinomial(2000, keep * p + (1 - keep) / cells).reshape(shape)
        test_s = best_of(repeat, independence_test, observed, keep, draws=999, seed=1)
        method = independence_test(observed, keep, draws=999, seed=1).method
        effect_s = best_of(repeat, association_effects, observed.sum(axis=2), keep, seed=1)
        ref = observed.sum(axis=2) + 1
        scipy_s = best_of(repeat, stats.chi2_contingency, ref, lambda_="log-likelihood")
        flag = "" if max(test_s, effect_s) <= 1.0 else "  <-- over 1 s"
        print(f"{cells:>6} {'x'.join(map(str, shape)):>10} {keep:6.3f} {test_s:8.3f} {effect_s:10.3f} "
              f"{scipy_s:9.5f} {test_s / scipy_s:10.0f}  {method}{flag}")  # fmt: skip


def associations_speed() -> None:
    rng = np.random.default_rng(SEED)
    n = 20000
    ids = np.char.add("p", np.arange(n).astype(str))
    levels = (2, 3, 4, 2, 3)
    schemas: dict[str, dict[str, list[str]]] = {}
    tables: dict[str, dict[str, Any]] = {}
    for curator in ("alice", "bob"):
        schemas[curator] = {f"{curator}{j}": [f"c{c}" for c in range(k)] for j, k in enumerate(levels)}
        tables[curator] = {"id": ids, **{a: rng.choice(c, n) for a, c in schemas[curator].items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = api.release(tables, schemas, epsilon=4.0, m=5000, test_keys=1)
    start = time.perf_counter()
    rows = result.association_rows()
    took = time.perf_counter() - start
    flag = "" if took <= 30 else "  <-- over 30 s"
    print(f"\nassociations: 10 attributes (5 a curator), K = {result.plan.joint_size:,}, "
          f"{len(rows)} cross-curator pairs: {took:.1f} s (target 30 s){flag}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs (default 3)")
    args = parser.parse_args()
    table_speed(args.repeat)
    associations_speed()


if __name__ == "__main__":
    main()
