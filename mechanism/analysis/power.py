"""The power of an independence test of two attributes, planned from public inputs (n, the
alphabets, epsilon, m) before any budget is spent (DESIGN 11; derived here).

The channel on the pair. A release perturbs the joint cell of all K = prod_j k_j cells: keep it
with probability a = (gamma - 1)/(gamma - 1 + K), else replace it by a uniform joint cell
(DESIGN 3.4). A uniform joint cell is an independent uniform level of every attribute, so summed
onto attributes A (I levels) and B (J levels) the channel is "keep the (A, B) cell with
probability a, else a uniform one of the I J cells": the m sampled records give
o ~ Multinomial(m, q), q_c = a p_c + (1 - a)/(I J), p the population's (A, B) shares (DESIGN 11).
With Eq. 2, gamma - 1 = (n/m) c, c = e^eps - 1, so a = n c / (n c + m K).

The test. The researcher's likelihood-ratio test of independence on o (DESIGN 11) has df =
(I - 1)(J - 1). Under local alternatives p = p0 + d (d with zero row and column sums, p0 = r s^T
its marginals' product) G is asymptotically noncentral chi-square(df, lambda) with lambda =
m min_t ||a d - t||^2_W, W = diag(1/q0), q0 = a p0 + (1 - a)/(I J), t over the null model's
tangent at p0 (the fitted marginals may move). With uniform marginals the tangent is W-orthogonal
to every such d and lambda = m sum_c (a d_c)^2 / q0_c = m a^2 I J sum_c d_c^2 = m a^2 phi^2 =
m a^2 V^2 (min(I, J) - 1), V Cramer's V of p (:func:`noncentrality`).

The plan. Power = P(chi2_df(lambda) > chi2_df quantile 1 - alpha); the minimum detectable V
solves lambda(V) = lambda*(df) (:func:`required_noncentrality`). m a^2 = m (n c)^2/(n c + m K)^2
has derivative (n c - m K)(n c)^2/(n c + m K)^3 in m: it rises to its maximum at m = n c / K,
where a = 1/2, and falls after; the best integer m is one of its neighbours clamped into [1, n]
(:func:`power_maximizing_sample_size`). The plan's m* (Cor. 3.6) = n (1 + sqrt K) c / K^1.5 =
(n c / K)(1 + 1/sqrt K) is a factor 1 + 1/sqrt K above it, where a = sqrt K/(2 sqrt K + 1); then
m* a*^2 / (m a^2)_max = 4 (K + sqrt K)/(2 sqrt K + 1)^2 = 1 - 1/(2 sqrt K + 1)^2, so (both
unclamped) V(m*)/V(best m) = (1 + 1/(4 K + 4 sqrt K))^(1/2) = 1 + 1/(8 K) + O(K^-2): m* costs
the test almost nothing.

Small m (measured, uniform marginals, 2000-4000 tables each, the table in the module's report):
at the asymptotic V the chi-square LRT's power is 0.61-0.75 when m/(I J) <= 10 (6 x 4 and 4 x 3
tables), 0.76-0.79 at 20-40, 0.77-0.80 from 80 on (df 15 converges slowest); the chi-square test
is also conservative there (size 0.02-0.04 at m/(I J) = 5). So below
:data:`SIMULATE_BELOW_INFORMATION` the plan simulates the test instead
(:func:`simulated_min_detectable_cramers_v`: seeded, vectorised over the tables), along one family
of dependent tables with uniform marginals (:func:`dependent_table`), against the larger of the
chi-square and the simulated null critical value, so that the number holds whether the researcher
takes the p-value from chi-square or from a parametric bootstrap.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import linalg, optimize, stats

from secure_release.mechanism import printing
from secure_release.mechanism.analysis.association import likelihood_ratio_statistics
from secure_release.mechanism.analysis.effects import cramers_v
from secure_release.mechanism.errors import (
    InvalidDrawsError,
    InvalidLevelError,
    InvalidSampleSizeError,
    InvalidSeedError,
    NonFiniteInputError,
    RepeatedAttributeError,
    ShapeMismatchError,
    TooFewLevelsError,
    UnknownAttributeError,
)
from secure_release.mechanism.primitives.pram import PramChannel, check_keep
from secure_release.mechanism.primitives.sampling import check_sample_size
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.schema import CuratorSchema, check_joint_alphabet

FloatArray = npt.NDArray[np.float64]

DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8
#: m a^2 / (I J) below which the power is simulated rather than read from the noncentral
#: chi-square: 40 is m/(I J) = 160 at a = 1/2. Measured at the asymptotic V (4000 tables each):
#: 0.79-0.80 for 3 x 2 at m a^2/(I J) = 134, but 0.77-0.79 for 6 x 4 (df 15) at 33, 0.71 at 2; the
#: researcher's ``method="auto"`` switches to the bootstrap below 10.
SIMULATE_BELOW_INFORMATION = 40.0
#: The largest pair table (I J cells) the simulation takes on; above it the asymptotic figure
#: stands and the plan says so.
SIMULATION_MAX_CELLS = 400
#: Simulated tables per power evaluation (standard error of a simulated power near 0.8: 0.009).
DEFAULT_REPLICATES = 2000
DEFAULT_SEED = 20_261_127
_ROOT_STEPS = 12


# --------------------------------------------------------------------------------- arguments
def check_probability(name: str, value: float) -> float:
    """A test level alpha or a target power: a finite number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < 1.0:
        raise InvalidLevelError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return float(value)


def check_levels(rows: int, cols: int) -> tuple[int, int]:
    """Two level counts, integers >= 2."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 2:
            raise TooFewLevelsError(f"an independence test needs >= 2 levels on each attribute; {name} = {value!r}")
    return int(rows), int(cols)


def levels_from_df(df: int, min_levels: int) -> tuple[int, int]:
    """(I, J) with I = min(I, J) = ``min_levels`` and (I - 1)(J - 1) = ``df``; a named error if
    no table has them."""
    if isinstance(df, bool) or not isinstance(df, int | np.integer) or df < 1:
        raise ShapeMismatchError(f"df must be an integer >= 1, got {df!r}")
    check_levels(min_levels, min_levels)
    other, rest = divmod(int(df), int(min_levels) - 1)
    if rest or other + 1 < min_levels:
        raise ShapeMismatchError(f"no I x J table has df = {df} and min(I, J) = {min_levels}: need (min - 1) to "
                                 f"divide df and df/(min - 1) >= min - 1")  # fmt: skip
    return int(min_levels), other + 1


def _check_m(m: int) -> int:
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 1:
        raise InvalidSampleSizeError(f"m must be an integer >= 1, got {m!r}")
    return int(m)


# --------------------------------------------------------------------------- the formulas


def noncentrality(m: int, keep: float, shares: npt.ArrayLike, null_shares: npt.ArrayLike | None = None) -> float:
    """lambda = m sum_c (a (p_c - p0_c))^2 / (a p0_c + (1 - a)/(I J)) (module text; p0 defaults
    to the product of p's marginals). The LRT's exact local noncentrality when the marginals are
    uniform; otherwise an upper bound of it (:func:`marginal_efficiency` has the exact one)."""
    m, a = _check_m(m), check_keep(keep)
    p = np.asarray(shares, dtype=np.float64)
    p0 = np.outer(p.sum(axis=1), p.sum(axis=0)) if null_shares is None else np.asarray(null_shares, dtype=np.float64)
    q0 = a * p0 + (1.0 - a) / p.size
    return float(m * np.sum((a * (p - p0)) ** 2 / q0))


def uniform_noncentrality(m: int, keep: float, cramers_v: float, min_levels: int) -> float:
    """lambda = m a^2 V^2 (min(I, J) - 1): :func:`noncentrality` with uniform marginals."""
    return _check_m(m) * check_keep(keep) ** 2 * cramers_v**2 * (min_levels - 1)


def required_noncentrality(df: int, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER) -> float:
    """lambda*(df): the noncentrality at which P(chi2_df(lambda) > chi2_df quantile 1 - alpha)
    equals ``power`` (> alpha); the power rises with lambda, so one root."""
    alpha, power = check_probability("alpha", alpha), check_probability("power", power)
    if power <= alpha:
        raise InvalidLevelError(f"the target power must exceed alpha (the power at V = 0); got power = {power!r}, "
                                f"alpha = {alpha!r}")  # fmt: skip
    crit = float(stats.chi2.isf(alpha, df))
    hi = 1.0
    while stats.ncx2.sf(crit, df, hi) < power:
        hi *= 2.0
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(crit, df, lam) - power, 0.0, hi, xtol=1e-12))


def test_power(
    cramers_v: float, m: int, keep: float, df: int, min_levels: int, alpha: float = DEFAULT_ALPHA
) -> float:
    """Asymptotic power P(chi2_df(lambda) > chi2_df quantile 1 - alpha), lambda =
    :func:`uniform_noncentrality` (uniform marginals)."""
    levels_from_df(df, min_levels)
    if not math.isfinite(cramers_v) or not 0.0 <= cramers_v <= 1.0:
        raise NonFiniteInputError(f"Cramer's V must be in [0, 1], got {cramers_v!r}")
    alpha = check_probability("alpha", alpha)
    lam = uniform_noncentrality(m, keep, cramers_v, min_levels)
    crit = stats.chi2.isf(alpha, df)
    return float(stats.chi2.sf(crit, df) if lam == 0 else stats.ncx2.sf(crit, df, lam))


test_power.__test__ = False  # type: ignore[attr-defined]  # a formula, not a pytest test


def min_detectable_cramers_v(
    m: int, keep: float, df: int, min_levels: int, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
    efficiency: float = 1.0,
) -> float:  # fmt: skip
    """The asymptotic minimum detectable V: sqrt(lambda*(df) / (m a^2 (min(I, J) - 1) mu)), mu =
    ``efficiency`` (1 with uniform marginals; :func:`marginal_efficiency` otherwise); math.inf
    when that exceeds 1 (no table is dependent enough)."""
    levels_from_df(df, min_levels)
    m, a = _check_m(m), check_keep(keep)
    v = math.sqrt(required_noncentrality(df, alpha, power) / (m * a * a * (min_levels - 1) * efficiency))
    return v if v <= 1.0 else math.inf


def marginal_efficiency(keep: float, row_shares: npt.ArrayLike, col_shares: npt.ArrayLike) -> tuple[float, float]:
    """(worst, best) of lambda / (m a^2 phi^2) over the directions of dependence, for public
    marginals r, s (1 and 1 when uniform). Derivation (module text): with d = D B e, D =
    diag(sqrt(r_i s_j)), B an orthonormal basis of sqrt(r)^perp (x) sqrt(s)^perp (exactly the d with
    zero margins), phi^2 = |e|^2 and lambda = m a^2 e^T M e, M = B^T D G D B, G = W - W X (X^T W
    X)^+ X^T W the W-residual after the null tangent X (columns (e_i - e_I) (x) s and
    r (x) (e_j - e_J)). The extremes of e^T M e / |e|^2 are M's extreme eigenvalues."""
    a = check_keep(keep)
    r = _shares("row_shares", row_shares)
    s = _shares("col_shares", col_shares)
    n_i, n_j = check_levels(r.size, s.size)
    q0 = a * np.outer(r, s).ravel() + (1.0 - a) / (n_i * n_j)
    w = 1.0 / q0
    x_rows = [np.kron(np.eye(n_i)[i] - np.eye(n_i)[-1], s) for i in range(n_i - 1)]
    x_cols = [np.kron(r, np.eye(n_j)[j] - np.eye(n_j)[-1]) for j in range(n_j - 1)]
    X = np.stack(x_rows + x_cols, axis=1)
    WX = w[:, None] * X
    G = np.diag(w) - WX @ np.linalg.pinv(X.T @ WX) @ WX.T
    B = np.kron(linalg.null_space(np.sqrt(r)[None, :]), linalg.null_space(np.sqrt(s)[None, :]))
    DB = np.sqrt(np.outer(r, s).ravel())[:, None] * B
    eig = np.linalg.eigvalsh(DB.T @ G @ DB)
    return float(eig[0]), float(eig[-1])


def _shares(name: str, values: npt.ArrayLike) -> FloatArray:
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size < 2 or not np.all(np.isfinite(v)) or np.any(v <= 0) or abs(float(v.sum()) - 1.0) > 1e-6:
        raise NonFiniteInputError(f"{name} must be >= 2 positive finite shares summing to 1, got {v.tolist()!r}")
    return np.asarray(v / v.sum(), dtype=np.float64)


def keep_probability(n: int, m: int, joint_size: int, epsilon: float) -> float:
    """a of the plan's channel at m: gamma by Eq. 2 (rounded down as the plan declares it), a =
    (gamma - 1)/(gamma - 1 + K) = n c/(n c + m K)."""
    return PramChannel(accounting.gamma_from_epsilon(n, m, epsilon), joint_size).keep


def power_maximizing_sample_size(n: int, joint_size: int, epsilon: float) -> int:
    """The integer m in [1, n] maximising m a^2 (so minimising the detectable V at uniform
    marginals): floor or ceil of n c / K, clamped (module text: m a^2 is unimodal with its peak at
    m = n c/K, where a = 1/2)."""
    check_sample_size(n, 1)
    K = check_joint_alphabet([joint_size])
    c = math.expm1(min(accounting.check_epsilon(epsilon), 700.0))
    peak = n * c / K
    candidates = {min(max(v, 1), n) for v in (math.floor(min(peak, n)), math.ceil(min(peak, n)))}
    return max(sorted(candidates), key=lambda m: m * keep_probability(n, m, K, epsilon) ** 2)


# ---------------------------------------------------------------------------- the simulation
def max_uniform_cramers_v(rows: int, cols: int) -> float:
    """Cramer's V of :func:`dependent_table`'s end point (the comonotone table): 1 when one level
    count divides the other."""
    return float(cramers_v(_comonotone(*check_levels(rows, cols))))


def _comonotone(n_i: int, n_j: int) -> FloatArray:
    """The coupling of two uniform marginals that puts level i of A with the levels j of B whose
    interval [j/J, (j+1)/J) overlaps [i/I, (i+1)/I): cell = the overlap's length."""
    x, y = np.arange(n_i + 1) / n_i, np.arange(n_j + 1) / n_j
    lo = np.maximum(x[:-1, None], y[None, :-1])
    hi = np.minimum(x[1:, None], y[None, 1:])
    return np.asarray(np.clip(hi - lo, 0.0, None), dtype=np.float64)


def dependent_table(rows: int, cols: int, cramers_v: float) -> FloatArray:
    """A table of shares with uniform marginals and Cramer's V = ``cramers_v``: (1 - t) U + t P,
    U uniform, P the comonotone coupling; the deviation from U is linear in t with the chi-square
    metric fixed (uniform marginals), so V = t V(P)."""
    n_i, n_j = check_levels(rows, cols)
    top = max_uniform_cramers_v(n_i, n_j)
    if not 0.0 <= cramers_v <= top + 1e-12:
        raise NonFiniteInputError(f"a {n_i} x {n_j} table with uniform marginals here reaches V <= {top:.4g}, "
                                  f"got {cramers_v!r}")  # fmt: skip
    U = np.full((n_i, n_j), 1.0 / (n_i * n_j))
    return np.asarray(U + min(cramers_v / top, 1.0) * (_comonotone(n_i, n_j) - U), dtype=np.float64)


def lrt_statistics(counts: npt.ArrayLike, keep: float, rows: int, cols: int) -> FloatArray:
    """G of perturbed counts (D, I J), one per table: exactly the researcher's statistic
    (:func:`mechanism.analysis.association.likelihood_ratio_statistics`, DESIGN 11), so the power the plan
    simulates is the power of the test ``analyst test`` runs."""
    check_keep(keep)
    n_i, n_j = check_levels(rows, cols)
    tables = np.asarray(counts, dtype=np.float64).reshape(-1, n_i, n_j, 1)
    return np.asarray(likelihood_ratio_statistics(tables, keep)[0], dtype=np.float64)


def _check_simulation(replicates: int, seed: int) -> tuple[int, int]:
    if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 100:
        raise InvalidDrawsError(f"replicates must be an integer >= 100, got {replicates!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidSeedError(f"seed must be an integer >= 0, got {seed!r}")
    return replicates, seed


def _simulated_statistics(
    cramers_v: float, m: int, keep: float, rows: int, cols: int, replicates: int, seed: int
) -> FloatArray:
    """G of ``replicates`` tables: m records from :func:`dependent_table`, through the channel;
    the same seed for every V (common random numbers, so a bisection in V sees smooth power)."""
    q = keep * dependent_table(rows, cols, cramers_v).ravel() + (1.0 - keep) / (rows * cols)
    counts = np.random.default_rng(seed).multinomial(m, q / q.sum(), size=replicates)
    return lrt_statistics(counts, keep, rows, cols)


def simulated_critical_value(
    m: int, keep: float, rows: int, cols: int, alpha: float = DEFAULT_ALPHA,
    replicates: int = DEFAULT_REPLICATES, seed: int = DEFAULT_SEED,
) -> float:  # fmt: skip
    """The critical value of the test as the researcher may run it: the larger of the chi-square
    quantile and the simulated null quantile 1 - alpha (uniform marginals). Where chi-square is
    conservative (small m) this is the chi-square test's; where it is liberal, a calibrated
    (bootstrap) test's. A power computed against it holds for both p-values."""
    n_i, n_j = check_levels(rows, cols)
    alpha = check_probability("alpha", alpha)
    g0 = _simulated_statistics(0.0, _check_m(m), check_keep(keep), n_i, n_j, *_check_simulation(replicates, seed + 1))
    return max(float(stats.chi2.isf(alpha, (n_i - 1) * (n_j - 1))), float(np.quantile(g0, 1.0 - alpha)))


def simulated_power(
    cramers_v: float, m: int, keep: float, rows: int, cols: int, alpha: float = DEFAULT_ALPHA,
    replicates: int = DEFAULT_REPLICATES, seed: int = DEFAULT_SEED, critical_value: float | None = None,
) -> float:  # fmt: skip
    """The share of simulated tables (:func:`dependent_table` at ``cramers_v``) whose G exceeds
    :func:`simulated_critical_value`: the test's power at small m, seeded."""
    crit = simulated_critical_value(m, keep, rows, cols, alpha, replicates, seed) if critical_value is None \
        else critical_value  # fmt: skip
    g = _simulated_statistics(cramers_v, _check_m(m), check_keep(keep), rows, cols,
                              *_check_simulation(replicates, seed))  # fmt: skip
    return float(np.mean(g > crit))


def simulated_min_detectable_cramers_v(
    m: int, keep: float, rows: int, cols: int, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
    replicates: int = DEFAULT_REPLICATES, seed: int = DEFAULT_SEED,
) -> float:  # fmt: skip
    """The V at which :func:`simulated_power` reaches ``power``: regula falsi (Illinois) on the
    simulated power curve in V (common random numbers make it smooth in V), started from the
    asymptotic V, until the simulated power is within 0.25/sqrt(replicates) of ``power`` (a
    quarter of its standard error) or the bracket is 1% of :func:`max_uniform_cramers_v` wide;
    math.inf if not even the most dependent table of :func:`dependent_table` reaches it."""
    n_i, n_j = check_levels(rows, cols)
    power = check_probability("power", power)
    crit = simulated_critical_value(m, keep, n_i, n_j, alpha, replicates, seed)
    top = max_uniform_cramers_v(n_i, n_j)

    def excess(v: float) -> float:
        return simulated_power(v, m, keep, n_i, n_j, alpha, replicates, seed, crit) - power

    hi, f_hi = top, excess(top)
    if f_hi < 0:
        return math.inf
    lo, f_lo = 0.0, float(np.mean(_simulated_statistics(0.0, m, keep, n_i, n_j, replicates, seed) > crit)) - power
    guess = min_detectable_cramers_v(m, keep, (n_i - 1) * (n_j - 1), min(n_i, n_j), alpha, power)
    x = guess if guess < top else 0.5 * top
    tolerance = 0.25 / math.sqrt(replicates)
    side = 0
    for _ in range(_ROOT_STEPS):
        f_x = excess(x)
        if abs(f_x) <= tolerance:
            return x
        if f_x > 0:
            hi, f_hi = x, f_x
            if side == 1:
                f_lo *= 0.5
            side = 1
        else:
            lo, f_lo = x, f_x
            if side == -1:
                f_hi *= 0.5
            side = -1
        if hi - lo <= 0.01 * top:
            return hi
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
    return hi


def needs_simulation(m: int, keep: float, rows: int, cols: int) -> bool:
    """True when m a^2/(I J) < :data:`SIMULATE_BELOW_INFORMATION` and the table is small enough to
    simulate (:data:`SIMULATION_MAX_CELLS`)."""
    return m * keep * keep / (rows * cols) < SIMULATE_BELOW_INFORMATION and rows * cols <= SIMULATION_MAX_CELLS


@functools.lru_cache(maxsize=256)  # pure; --suggest asks the same (m, a, I, J) for many suggestions
def planned_min_detectable_cramers_v(
    m: int, keep: float, rows: int, cols: int, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
    efficiency: float = 1.0, replicates: int = DEFAULT_REPLICATES, seed: int = DEFAULT_SEED,
) -> tuple[float, str]:  # fmt: skip
    """(V, how): the asymptotic :func:`min_detectable_cramers_v` where it holds, else the
    simulated one (:func:`needs_simulation`); with non-uniform marginals (``efficiency`` != 1) the
    simulated value is scaled by the asymptotic ratio V(marginals)/V(uniform)."""
    n_i, n_j = check_levels(rows, cols)
    df, low = (n_i - 1) * (n_j - 1), min(n_i, n_j)
    asymptotic = min_detectable_cramers_v(m, keep, df, low, alpha, power, efficiency)
    if not needs_simulation(m, keep, n_i, n_j):
        big = n_i * n_j > SIMULATION_MAX_CELLS and m * keep * keep / (n_i * n_j) < SIMULATE_BELOW_INFORMATION
        return asymptotic, "asymptotic (small m, too many cells to simulate: optimistic)" if big else "asymptotic"
    simulated = simulated_min_detectable_cramers_v(m, keep, n_i, n_j, alpha, power, replicates, seed)
    if efficiency == 1.0 or not math.isfinite(simulated):
        return simulated, f"simulated ({replicates} tables, seed {seed})"
    uniform = min_detectable_cramers_v(m, keep, df, low, alpha, power)
    scaled = simulated * asymptotic / uniform if math.isfinite(asymptotic) and math.isfinite(uniform) else math.inf
    how = f"simulated ({replicates} tables, seed {seed}), scaled to the marginals"
    return (scaled if scaled <= 1.0 else math.inf), how


# -------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class PowerPlan:
    """The detectable dependence of one pair of attributes in a planned release: the minimum
    Cramer's V the researcher's independence test detects with probability ``power`` at level
    ``alpha``, at the m asked (m* when none), at the m that maximises it and at m*. math.inf:
    no table is dependent enough (``to_dict`` writes None)."""

    attributes: tuple[str, str]
    levels: tuple[int, int]
    df: int
    alpha: float
    power: float
    m: int
    keep: float
    min_detectable_cramers_v: float
    best_m: int
    best_keep: float
    min_detectable_cramers_v_at_best_m: float
    m_star: int
    min_detectable_cramers_v_at_m_star: float
    assumption: str
    note: str
    n: int = 0
    joint_size: int = 0
    epsilon: float = 0.0
    method: str = "asymptotic"
    method_at_best_m: str = "asymptotic"
    method_at_m_star: str = "asymptotic"
    same_curator: bool | None = None

    @property
    def ratio_m_star_to_best_m(self) -> float:
        """V at m* over V at the best m (>= 1 up to simulation noise)."""
        return _ratio(self.min_detectable_cramers_v_at_m_star, self.min_detectable_cramers_v_at_best_m)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["attributes"], out["levels"] = list(self.attributes), list(self.levels)
        out["ratio_m_star_to_best_m"] = self.ratio_m_star_to_best_m
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}

    # ------------------------------------------------------------------- reading the plan
    def _keep_at_m_star(self) -> float:
        if self.m_star == self.m:
            return self.keep
        if self.m_star == self.best_m:
            return self.best_keep
        if self.n >= 1 and self.joint_size >= 2 and self.epsilon > 0 and 1 <= self.m_star <= self.n:
            return keep_probability(self.n, self.m_star, self.joint_size, self.epsilon)
        return math.nan

    def columns(self) -> dict[str, list[Any]]:
        """The plan's rows as named columns (for a DataFrame): at (which m), m, keep,
        min_detectable_cramers_v (inf: no table is dependent enough) and method; one row per
        distinct m (the m asked, the best m, m*)."""
        rows = [("m*" if self.m == self.m_star else "m", self.m, self.keep, self.min_detectable_cramers_v,
                 self.method)]  # fmt: skip
        if self.best_m != self.m:
            rows.append(("best m", self.best_m, self.best_keep, self.min_detectable_cramers_v_at_best_m,
                         self.method_at_best_m))  # fmt: skip
        if self.m_star not in (self.m, self.best_m):
            rows.append(("m*", self.m_star, self._keep_at_m_star(), self.min_detectable_cramers_v_at_m_star,
                         self.method_at_m_star))  # fmt: skip
        names = ("at", "m", "keep", "min_detectable_cramers_v", "method")
        return {name: [row[i] for row in rows] for i, name in enumerate(names)}

    def block(self) -> printing.Block:
        """The plan as a short table: a row per distinct m, its keep probability, the smallest
        detectable Cramer's V and how it was found; the note under it."""
        a, b = self.attributes
        cols = self.columns()
        rows = tuple(
            (at, str(m), printing.sig(keep), printing.fixed(v) if math.isfinite(v) else "none", how)
            for at, m, keep, v, how in zip(*cols.values(), strict=True)
        )
        public = f"; n = {self.n}, K = {self.joint_size}, epsilon = {self.epsilon:g}" if self.n else ""
        notes = [self.note] if self.note else []
        if any(not math.isfinite(v) for v in cols["min_detectable_cramers_v"]):
            notes.append("none: no table is dependent enough to be detected with this power")
        return printing.Block(
            f"Power of the likelihood-ratio test of independence: {a} x {b}",
            lines=(
                f"data:  {self.levels[0]} x {self.levels[1]} levels (df = {self.df}){public}",
                f"smallest Cramer's V detected with probability {self.power:g} at level {self.alpha:g}; assumes "
                f"{self.assumption}",
            ),
            header=("at", "m", "keep a", "detectable V", "how"), rows=rows, align="lrrrl", notes=tuple(notes),
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        v = self.min_detectable_cramers_v
        shown = printing.fixed(v) if math.isfinite(v) else "none"
        return printing.short_repr(
            "PowerPlan",
            f"{self.attributes[0]} x {self.attributes[1]} ({self.levels[0]} x {self.levels[1]}): detectable "
            f"Cramer's V {shown} at m = {self.m}, power {self.power:g}, level {self.alpha:g}; best m = {self.best_m}, "
            f"m* = {self.m_star}",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


def _ratio(x: float, y: float) -> float:
    return x / y if math.isfinite(x) and math.isfinite(y) else math.inf


def _pair(
    alphabets: Sequence[int] | Sequence[CuratorSchema], a_name: str | int, b_name: str | int
) -> tuple[tuple[int, ...], tuple[str, str], tuple[int, int], bool | None]:
    """(alphabet sizes, names, levels, same curator) from schemas and two attribute names, or
    from alphabet sizes and two level counts."""
    if all(isinstance(s, CuratorSchema) for s in alphabets):
        schemas = [s for s in alphabets if isinstance(s, CuratorSchema)]
        where: dict[str, list[tuple[int, int]]] = {}
        for j, schema in enumerate(schemas):
            for attribute in schema.attributes:
                where.setdefault(attribute.name, []).append((j, attribute.size))
        have = [name for name in where]
        for name in (a_name, b_name):
            if not isinstance(name, str) or name not in where:
                raise UnknownAttributeError(f"no attribute {name!r} in the schemas: they have {have}")
            if len(where[name]) > 1:
                raise RepeatedAttributeError(f"attribute {name!r} is in more than one schema; names must be unique")
        if a_name == b_name:
            raise RepeatedAttributeError(f"a test of independence needs two different attributes, got {a_name!r} "
                                         "twice")  # fmt: skip
        (ja, ia), (jb, ib) = where[str(a_name)][0], where[str(b_name)][0]
        return tuple(s.alphabet_size for s in schemas), (str(a_name), str(b_name)), check_levels(ia, ib), ja == jb
    sizes = tuple(int(k) for k in alphabets)  # type: ignore[arg-type]
    if isinstance(a_name, str) or isinstance(b_name, str):
        raise UnknownAttributeError("with alphabet sizes alone there are no attribute names: give the two level "
                                    f"counts, or the schemas; got {a_name!r}, {b_name!r}")  # fmt: skip
    n_i, n_j = check_levels(a_name, b_name)
    K = check_joint_alphabet(sizes)
    if K % (n_i * n_j):
        raise ShapeMismatchError(f"levels {n_i} x {n_j} cannot be two attributes of alphabets {list(sizes)}: I J = "
                                 f"{n_i * n_j} must divide K = {K}")  # fmt: skip
    return sizes, (f"A ({n_i} levels)", f"B ({n_j} levels)"), (n_i, n_j), None


def power_plan(
    n: int, alphabets: Sequence[int] | Sequence[CuratorSchema], epsilon: float, a_name: str | int,
    b_name: str | int, m: int | None = None, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
    marginals: tuple[Sequence[float], Sequence[float]] | None = None, replicates: int = DEFAULT_REPLICATES,
    seed: int = DEFAULT_SEED,
) -> PowerPlan:  # fmt: skip
    """The :class:`PowerPlan` of attributes ``a_name`` and ``b_name`` (names, with ``alphabets``
    the curators' schemas; or level counts, with alphabet sizes) in a release of n records at
    ``epsilon`` with m samples (default m*, Cor. 3.6, rounded). Uniform marginals unless
    ``marginals`` gives public shares of both attributes (then the worst direction of
    dependence, :func:`marginal_efficiency`). Public inputs only."""
    sizes, names, (n_i, n_j), same = _pair(alphabets, a_name, b_name)
    K = check_joint_alphabet(sizes)
    if K < 2:
        raise TooFewLevelsError(f"alphabets {list(sizes)} give K = {K}: nothing to release")
    eps = accounting.check_epsilon(epsilon)
    alpha, power = check_probability("alpha", alpha), check_probability("power", power)
    required_noncentrality((n_i - 1) * (n_j - 1), alpha, power)  # power > alpha
    _check_simulation(replicates, seed)
    check_sample_size(n, 1)
    m_star = accounting.optimal_sample_size_int(n, K, eps)
    m_used = m_star if m is None else m
    check_sample_size(n, m_used)
    efficiency: Callable[[float], float] = _uniform_efficiency
    assumption = "uniform marginals"
    if marginals is not None:
        rows, cols = _shares("row_shares", marginals[0]), _shares("col_shares", marginals[1])
        if (rows.size, cols.size) != (n_i, n_j):
            raise ShapeMismatchError(f"marginal shares of sizes {rows.size}, {cols.size} for attributes of {n_i} and "
                                     f"{n_j} levels")  # fmt: skip
        assumption = ("public marginal shares given; worst direction of dependence "
                      f"({names[0]}: {_short(rows)}, {names[1]}: {_short(cols)})")  # fmt: skip

        def efficiency(keep: float) -> float:
            return marginal_efficiency(keep, rows, cols)[0]

    best = _best_m(n, K, eps, efficiency)

    def figure(mm: int) -> tuple[float, float, str]:
        keep = keep_probability(n, mm, K, eps)
        v, how = planned_min_detectable_cramers_v(mm, keep, n_i, n_j, alpha, power, efficiency(keep), replicates, seed)
        return keep, v, how

    keep, v, how = figure(m_used)
    best_keep, v_best, how_best = figure(best)
    _, v_star, how_star = (keep, v, how) if m_used == m_star else figure(m_star)
    note = _note(n, K, eps, best, m_star, v_best, v_star, same, names, n_i, n_j)
    return PowerPlan(names, (n_i, n_j), (n_i - 1) * (n_j - 1), alpha, power, m_used, keep, v, best, best_keep, v_best,
                     m_star, v_star, assumption, note, n, K, eps, how, how_best, how_star, same)  # fmt: skip


def _uniform_efficiency(_: float) -> float:
    return 1.0


def _short(shares: FloatArray) -> str:
    return "[" + ", ".join(f"{x:.3g}" for x in shares) + "]"


def _best_m(n: int, K: int, epsilon: float, efficiency: Callable[[float], float]) -> int:
    """argmax over integers m in [1, n] of m a^2 mu(a): closed form at uniform marginals
    (:func:`power_maximizing_sample_size`), else a geometric grid refined around its best point."""
    uniform = power_maximizing_sample_size(n, K, epsilon)
    if efficiency is _uniform_efficiency:
        return uniform

    def score(mm: int) -> float:
        keep = keep_probability(n, mm, K, epsilon)
        return float(mm * keep * keep * efficiency(keep))

    grid = sorted({int(x) for x in np.round(np.geomspace(1, n, num=min(n, 120)))} | {uniform})
    at = max(range(len(grid)), key=lambda i: score(grid[i]))
    lo, hi = grid[max(at - 1, 0)], grid[min(at + 1, len(grid) - 1)]
    fine = sorted({int(x) for x in np.round(np.linspace(lo, hi, num=min(hi - lo + 1, 60)))})
    return max(fine, key=score)


def _note(
    n: int, K: int, epsilon: float, best: int, m_star: int, v_best: float, v_star: float, same: bool | None,
    names: tuple[str, str], n_i: int, n_j: int,
) -> str:  # fmt: skip
    c = math.expm1(min(epsilon, 700.0))
    parts = []
    if best == m_star:
        parts.append(f"m* = {m_star} also maximises m a^2 (clamped into [1, {n}]).")
    else:
        ratio = _ratio(v_star, v_best)
        shown = f"{ratio:.4f}" if math.isfinite(ratio) else "n/a"
        parts.append(f"best m = {best} maximises m a^2 (peak n c/K = {n * c / K:.4g}, a = 1/2 there); m* = {m_star} "
                     f"(Cor. 3.6) minimises the joint's error instead: detectable V {_v_text(v_star)} at m* vs "
                     f"{_v_text(v_best)} at best m (ratio {shown}; unclamped theory "
                     f"{math.sqrt(1 + 1 / (4 * K + 4 * math.sqrt(K))):.4f}).")  # fmt: skip
    if same:
        parts.append(f"{names[0]} and {names[1]} are held by the same curator: that curator can test them on its "
                     "own data; the question needs no cross-curator release.")  # fmt: skip
    if not math.isfinite(v_best):
        parts.append(f"No {n_i} x {n_j} table is dependent enough to be detected with this power at any m.")
    return " ".join(parts)


def _v_text(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else "none (no table is dependent enough)"
