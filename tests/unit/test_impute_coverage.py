"""The pooled intervals of multiply-imputed releases cover (DESIGN 13): a bounded run of
bench/bench_impute_coverage.py's logistic benchmark at one point.

NAPSU-MQ's benchmark (Raisa et al. AISTATS 2023): X1, X2 ~ Bernoulli(0.5) at one curator, Y at
the other (alphabet [4, 2], K = 8), logit P(Y = 1) = X1, a fresh population of n = 2,000 records
a release (the target is beta1 = 1 itself), epsilon = 1 (the plan's m = 581, keep a = 0.425).
Each release is drawn as the mechanism draws it (a multinomial population, the count-level
sample and PRAM of ``fast_observed_counts``, exact in distribution: tests/unit/test_sim_fast_path.py),
built into the researcher's ReleaseReport, imputed M = 20 times (``impute_tables``, as
``Result.impute``) and fitted ``y ~ x1 + x2`` on every imputation, pooled by Rubin's rules
(``Imputations.fit``). A degenerate imputation counts as an interval that misses.

Bounds (exact binomial tails; three checks, each at 1e-6 / 3, so the file's family-wise false
failure rate is at most 1e-6), with R = 60 releases:

* a correct 95% procedure covers x1 in at least 46 of 60 releases with probability at least
  1 - 1e-6 / 3 (P(Binomial(60, 0.95) <= 45) = 1.9e-7), under the saturated joint and under
  the log-linear ``y*x1 + y*x2 + x1*x2``;
* the table as data (a binomial GLM with the perturbed counts as frequency weights) covers x1 in
  at most 42 of 60: a procedure covering 93% or more does so with probability at most
  P(Binomial(60, 0.93) <= 42) = 8.6e-8, so passing shows the check tells a bad procedure apart.

bench/bench_impute_coverage.py measures this point over many releases: the imputed intervals cover
x1 at about 0.95 or above, the table as data almost never (its x1 is attenuated by the noise).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("pandas")
sm = pytest.importorskip("statsmodels.api")
smf = pytest.importorskip("statsmodels.formula.api")

from secure_release.imputation import impute_tables  # noqa: E402
from secure_release.imputed_fits import DegenerateImputationError  # noqa: E402
from secure_release.mechanism.estimation.report import ReleaseReport, build_report  # noqa: E402
from secure_release.mechanism.privacy.plan import plan_release  # noqa: E402
from secure_release.mechanism.protocol.in_memory import estimate_from_counts  # noqa: E402
from secure_release.mechanism.schema import Attribute, CuratorSchema, JointSchema  # noqa: E402
from secure_release.mechanism.simulation.monte_carlo import fast_observed_counts  # noqa: E402

SEED = 20261207
RELEASES = 60
N_RECORDS = 2000
EPSILON = 1.0
BETA1 = 1.0
IMPUTATIONS = 20
FORMULA = "y ~ x1 + x2"
LOGLINEAR = "y*x1 + y*x2 + x1*x2"
CHECKS = 3
ALPHA = 1e-6 / CHECKS  # per check; Bonferroni over the file's three checks
#: A correct 95% procedure covers at least this many of RELEASES (P(fewer) <= ALPHA).
LEAST_COVERED = 46
#: A procedure covering 93% or more covers at most this many with probability <= ALPHA.
MOST_COVERED_BAD = 42
SCHEMA = JointSchema((CuratorSchema("alice", (Attribute("x1", ("0", "1")), Attribute("x2", ("0", "1")))),
                      CuratorSchema("bob", (Attribute("y", ("0", "1")),))))  # fmt: skip


def cell_probabilities(beta1: float) -> np.ndarray:
    """The superpopulation's joint over the cells (x1, x2, y) in joint-code order, y fastest."""
    x1, _, y = np.indices((2, 2, 2)).reshape(3, -1)
    p1 = 1.0 / (1.0 + np.exp(-beta1 * x1))
    return np.asarray(0.25 * np.where(y == 1, p1, 1.0 - p1), dtype=np.float64)


def release(rng: np.random.Generator) -> ReleaseReport:
    """A fresh population of n records, the plan's sample of m and PRAM, as the researcher's report."""
    plan = plan_release(N_RECORDS, list(SCHEMA.alphabet_sizes), EPSILON)
    population = rng.multinomial(N_RECORDS, cell_probabilities(BETA1))
    observed = fast_observed_counts(population, plan.m, plan.channel.keep, 1, rng)[0]
    return build_report("coverage", plan, ["alice", "bob"], estimate_from_counts(observed, plan), SCHEMA)


def x1_interval(fit: Any) -> tuple[float, float]:
    i = list(fit.pooled.names).index("x1[T.1]")
    return float(fit.pooled.ci_low[i]), float(fit.pooled.ci_high[i])


def table_as_data_interval(report: ReleaseReport, frame: Any) -> tuple[float, float]:
    """The binomial GLM of the perturbed counts o as frequency weights: x1's 95% Wald interval."""
    frame = frame.copy()
    frame["y"] = (frame["y"] == "1").astype(np.int64)
    weights = np.asarray(report.observed, dtype=np.float64)
    result = smf.glm(FORMULA, frame, family=sm.families.Binomial(), freq_weights=weights).fit()
    low, high = np.asarray(result.conf_int(alpha=0.05))[list(result.params.index).index("x1[T.1]")]
    return float(low), float(high)


@pytest.fixture(scope="module")
def intervals() -> dict[str, np.ndarray]:
    """x1's interval of every release and method (NaN: a degenerate imputation, which misses)."""
    rng = np.random.default_rng(SEED)
    out: dict[str, list[tuple[float, float]]] = {"saturated": [], "loglinear": [], "table": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(RELEASES):
            report = release(rng)
            for name, model in (("saturated", None), ("loglinear", LOGLINEAR)):
                imputations = impute_tables([(1, report)], IMPUTATIONS, seed=SEED + r, model=model)
                try:
                    out[name].append(x1_interval(imputations.fit(FORMULA, "binomial")))
                except DegenerateImputationError:
                    out[name].append((np.nan, np.nan))
            out["table"].append(table_as_data_interval(report, imputations.tables[0].frame(1)))
    return {k: np.asarray(v) for k, v in out.items()}


def covered(bounds: np.ndarray) -> int:
    return int(np.sum((bounds[:, 0] <= BETA1) & (bounds[:, 1] >= BETA1)))  # NaN bounds miss


def test_the_bounds_are_the_binomial_tails_stated() -> None:
    assert stats.binom.cdf(LEAST_COVERED - 1, RELEASES, 0.95) <= ALPHA < stats.binom.cdf(LEAST_COVERED, RELEASES, 0.95)
    assert stats.binom.cdf(MOST_COVERED_BAD, RELEASES, 0.93) <= ALPHA < stats.binom.cdf(MOST_COVERED_BAD + 1,
                                                                                         RELEASES, 0.93)  # fmt: skip


@pytest.mark.parametrize("model", ["saturated", "loglinear"])
def test_pooled_interval_of_x1_covers(intervals: dict[str, np.ndarray], model: str) -> None:
    assert covered(intervals[model]) >= LEAST_COVERED


def test_the_table_as_data_interval_covers_far_less(intervals: dict[str, np.ndarray]) -> None:
    assert covered(intervals["table"]) <= MOST_COVERED_BAD
