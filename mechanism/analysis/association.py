"""Tests of (conditional) independence on PRAM-perturbed counts (DESIGN 11).

The researcher holds the observed counts o of m perturbed records on the C = I J L cells of a
sub-table (a's I levels x b's J levels x the L strata of ``given``). Summed onto any subset of the
attributes, the gamma-diagonal channel is "keep the true cell with probability a, else a uniform
cell of the C", so o ~ Multinomial(m, q) with q = a p + (1 - a)/C and p the true-cell shares.
H0: p_ijl = p_l p_{i|l} p_{j|l} (a independent of b within every stratum).

The test is the likelihood ratio of the observed-data likelihood: the saturated MLE is closed-form
(:func:`secure_release.mechanism.estimation.estimators.mle_water_filling`); the null MLE is found by Fisher
scoring in the log-linear parameters with a monotone line search and an EM fallback
(:func:`fit_null_batch`; plain EM converges at rate ~1 - a per step, and SQUAREM on top of it was
measured too slow and too inexact at boundary fits). The p-value comes from a seeded parametric
bootstrap (the fit vectorised across the replicates) unless the chi-square approximation is
trustworthy (:func:`chi_square_is_trustworthy`). The observed table and every bootstrap table go
through the same deterministic fit (start rule and stopping rule), so the bootstrap calibrates
exactly the statistic that is reported even where a fit stops short of the maximum.

Boundary fix: where the null fit lies on the boundary (some shares 0: large sparse tables at small
m a^2), a bootstrap drawn from that fit is anti-conservative (the law of G is smaller at the boundary
than inside). The bootstrap therefore draws from :func:`interior_null`: the fit with every marginal
share raised to at least 2 standard errors from 0 (the most interior, least favourable, of the
nulls the data cannot tell from the fit). Measured rejection rates in % at nominal 5 / 1, 300
releases a point (MC SE 1.3 / 0.6), true marginals Dirichlet(5) drawn per release, 99 draws, the
same releases for the three generating points: the null fit itself (MLE), :func:`interior_null`
(floor 2) and the true p0 (oracle: an exact Monte Carlo test, the reference):
10 x 10, a = 0.2, m = 500: MLE 12.0 / 3.0, floor 2 4.0 / 0.3, oracle 4.0 / 0.3;
10 x 10, a = 0.5, m = 100: 12.3 / 3.0, 3.3 / 0.3, 3.7 / 1.0;
4 x 4, a = 0.2, m = 200: 10.3 / 1.7, 6.3 / 1.0, 5.3 / 0.3;
3 x 3 x 4 strata, a = 0.3, m = 150: 9.0 / 2.3, 5.0 / 1.7, 5.0 / 1.0;
10 x 10, a = 0.9, m = 500: 4.7 / 0.0, 4.7 / 0.0, 4.0 / 0.7;
10 x 10, a = 0.05, m = 300: 5.0 / 1.0, 4.7 / 1.3, 4.7 / 1.7.
(Floor 1 was not enough: 12.3 / 3.3 at 10 x 10, a = 0.5, m = 100, with the earlier 200-step fit.)
Power on a dependent table (p = 0.7 u v^T + 0.3 diagonal, 200 releases, rejections in % at 5 / 1),
MLE -> floor 2: 10 x 10, a = 0.2, m = 500: 46 / 22 -> 27 / 8 (the MLE's excess is its
anti-conservatism: its level there is 12%); 4 x 4, a = 0.2, m = 200: 21 / 6 -> 15 / 5;
4 x 4, a = 0.5, m = 300: 88 / 62 -> 87 / 63; 2 x 2, a = 0.2, m = 300: 17 / 6 -> 15 / 7.
Scripts: /tmp/assocA2/calib.py (not in the repository).

Fixed fit budget: the null fit stops after :data:`FIT_MAX_ITERATIONS` = 50 steps (or at the
tolerance); where the data carry almost no information it stops short of the maximum. The same rule
is applied to the observed table and to every bootstrap table, so the bootstrap calibrates exactly
the statistic that is reported.

P-value: Besag & Clifford's (1991) sequential Monte Carlo p-value (:func:`sequential_p_value`):
bootstrap tables are drawn in batches (:func:`next_batch`) and drawing stops once 20 replicates
reached the observed G (p = 20 / draws used), else after ``draws`` (p = (e + 1)/(draws + 1)).
Exactly valid, like the fixed-draws p-value (from which it differs), and under H0 it needs about
20 (1 + log(50)) ~ 100 draws on average instead of 999. A replicate is fitted only until its G*
is certainly below G (:func:`exceedances`: l only rises during the fit), which settles most
replicates of a strong association in a few steps, with the decisions the finished fits would give.
Measured on this machine (2 cores shared with other jobs, load ~6), at most 999 draws, wall
(CPU) s: C = 1,000 cells (10 x 10 x 10 and 25 x 40), keep 0.02 / 0.2 / 0.9, m = 2,000, under H0:
0.06-0.86 (0.04-0.60), one case at p = 0.075 (268 draws) 0.94-1.07 (0.63-0.69); strongly
dependent tables (all 999 draws needed): 0.37-0.80 (0.25-0.53), and 1.04-1.21 (0.74-0.81) at
10 x 10 x 10, keep 0.02, m = 200,000, p = 0.005; C <= 100: at most 0.13.
bench/bench_analysis_speed.py (keep 0.001): 0.52 s (10 x 10 x 10), 0.30 s (25 x 40).

Every function is post-processing of released counts: it costs no privacy budget, and
``numpy.random`` serves only reproducibility here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from secure_release.mechanism import printing
from secure_release.mechanism.errors import (
    EmptySampleError,
    EmptyStratumError,
    InvalidCountsError,
    InvalidDrawsError,
    InvalidSeedError,
    ShapeMismatchError,
    TooFewLevelsError,
    UnknownTestMethodError,
)
from secure_release.mechanism.estimation.estimators import mle_water_filling
from secure_release.mechanism.primitives.pram import check_keep

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

METHODS = ("auto", "bootstrap", "chi2")
#: :func:`fit_null_batch` stops a replicate when a step raised l by at most this much (nats) ...
FIT_TOLERANCE = 1e-9
#: ... or after this many steps.
FIT_MAX_ITERATIONS = 50
#: :func:`fit_null_batch`: the largest move of one log-linear parameter in one step.
MAX_LOG_STEP = 20.0
#: :func:`fit_null_batch`: halvings of a scoring step before the EM step replaces it (where the
#: data carry almost no information scoring's quadratic model fails and every extra halving is a
#: wasted pass; measured: 30 halvings made one test at C = 1,000, a = 0.001 take 6 s).
LINE_SEARCH_HALVINGS = 3
#: :func:`fit_null_batch`: after a scoring step failed, this many further steps are EM steps (no
#: scoring attempt; same deterministic rule for every table).
EM_RUN = 4
#: :func:`chi_square_is_trustworthy`: the smallest signal-to-noise m a^2 p_t^2 / q_t over the cells.
CHI2_MIN_CELL_INFORMATION = 10.0
#: :func:`interior_null`: the bootstrap draws from the null fit with every marginal share at least
#: this many standard errors from 0 (the boundary fix).
FLOOR_STANDARD_ERRORS = 2.0
#: :func:`sequential_p_value`: stop drawing once this many bootstrap G* have reached G (h).
SEQUENTIAL_EXCEEDANCES = 20
#: :func:`next_batch`: the first batch of bootstrap tables.
FIRST_BATCH = 64


@dataclass(frozen=True)
class IndependenceTest:
    """The likelihood-ratio test of (conditional) independence on a perturbed table."""

    statistic: float  # G = 2 (l(saturated MLE) - l(null MLE)), observed-data log-likelihoods
    df: int  # L (I - 1)(J - 1)
    p_value: float
    method: str  # which p-value, in words
    draws: int  # bootstrap draws used (0 for chi-square)
    null_fit: FloatArray  # (I, J, L) true-cell shares under H0
    saturated_fit: FloatArray  # (I, J, L) the unconstrained MLE

    # ------------------------------------------------------------------- reading the test
    @property
    def title(self) -> str:
        """The test's name (the first line of its print)."""
        if self.method.startswith("Wald"):
            return "Wald test of independence on perturbed counts (RAPPOR baseline)"
        return "Likelihood-ratio test of independence on perturbed counts"

    @property
    def statistic_name(self) -> str:
        """G (likelihood ratio) or W (the Wald baseline)."""
        return "W" if self.method.startswith("Wald") else "G"

    @property
    def short_method(self) -> str:
        """How the p-value was made, in a few words."""
        if self.draws:
            return f"parametric bootstrap, {self.draws} draws"
        return f"chi-square({self.df})"

    def block(self) -> printing.Block:
        """R's ``print.htest`` layout (:func:`printing.htest_block`)."""
        n_i, n_j, n_l = self.null_fit.shape
        strata = f", {n_l} strata" if n_l > 1 else ""
        within, some = (" within every stratum", " within some stratum") if n_l > 1 else ("", "")
        return printing.htest_block(
            self.title, f"an observed {n_i} x {n_j} table{strata}", self.statistic, self.df, self.p_value,
            statistic_name=self.statistic_name,
            null=f"the two attributes are independent{within}",
            alternative=f"the two attributes are associated{some}",
            method=self.method,
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        return printing.short_repr(
            "IndependenceTest",
            f"{self.statistic_name} = {printing.sig(self.statistic)}, df = {self.df}, "
            f"p-value = {printing.p_value(self.p_value)} "
            f"({self.short_method})",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


# ----------------------------------------------------------------------------- validation


def check_table(observed: npt.ArrayLike) -> IntArray:
    """The observed table as int64 of shape (I, J, L), I, J >= 2 (a 2-D table is L = 1).

    Raises :class:`InvalidCountsError` on negative, non-integer or non-finite counts,
    :class:`TooFewLevelsError` on I < 2 or J < 2, :class:`EmptySampleError` on a table with no
    records and :class:`EmptyStratumError` on a stratum with none.
    """
    table = np.asarray(observed)
    if table.ndim == 2:
        table = table[:, :, None]
    if table.ndim != 3:
        raise ShapeMismatchError(
            f"an independence test takes a table of shape (I, J) or (I, J, L), got shape {table.shape}"
        )
    if table.dtype == bool or not (np.issubdtype(table.dtype, np.integer) or np.issubdtype(table.dtype, np.floating)):
        raise InvalidCountsError(f"counts must be non-negative integers, got dtype {table.dtype}")
    if table.size and (not np.all(np.isfinite(table)) or np.any(table < 0) or np.any(table != np.round(table))):
        raise InvalidCountsError("counts must be finite non-negative integers")
    n_i, n_j, n_l = table.shape
    if n_i < 2 or n_j < 2:
        raise TooFewLevelsError(f"each tested attribute needs at least 2 levels, got a table of {n_i} x {n_j}")
    if n_l < 1:
        raise ShapeMismatchError("the table has no strata (L = 0); a marginal test has L = 1")
    counts = table.astype(np.int64)
    if counts.sum() == 0:
        raise EmptySampleError("the table holds no observed records: there is nothing to test")
    per_stratum = counts.sum(axis=(0, 1))
    empty = np.flatnonzero(per_stratum == 0)
    if empty.size:
        raise EmptyStratumError(
            f"stratum {int(empty[0])} of the conditioning attribute(s) has no observed records "
            f"(empty strata: {empty.tolist()}); merge levels of the given attribute so that every "
            "stratum holds records, or test without it"
        )
    return counts


def check_method(method: str) -> str:
    """Raise unless ``method`` is one of :data:`METHODS`."""
    if method not in METHODS:
        raise UnknownTestMethodError(f"p-value method must be one of {list(METHODS)}, got {method!r}")
    return method


def check_draws(draws: int) -> int:
    """Raise unless ``draws`` is an integer >= 1."""
    if isinstance(draws, bool) or not isinstance(draws, int | np.integer) or draws < 1:
        raise InvalidDrawsError(f"bootstrap draws must be an integer >= 1, got {draws!r}")
    return int(draws)


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise InvalidSeedError(f"the bootstrap seed must be an integer >= 0, got {seed!r}")
    return int(seed)


# ----------------------------------------------------------------------------- formulas


def mixed_shares(shares: npt.ArrayLike, keep: float, cells: int) -> FloatArray:
    """DESIGN 3.4 on a sub-table of C cells: q = a p + (1 - a)/C, the law of an observed record."""
    return np.asarray(keep * np.asarray(shares, dtype=np.float64) + (1.0 - keep) / cells, dtype=np.float64)


def observed_log_likelihood(observed: npt.ArrayLike, shares: npt.ArrayLike, keep: float) -> float | FloatArray:
    """l(p) = sum_t o_t log(a p_t + (1 - a)/C), the observed-data log-likelihood of DESIGN 11.

    Up to the additive constant log(m! / prod_t o_t!), the same for every p. The sum runs over the
    last three axes (I, J, L), so C = I J L; leading axes are replicates (a float for one table,
    an array for a batch). Cells with o_t = 0 add 0 (also where q_t = 0).
    """
    o = np.asarray(observed, dtype=np.float64)
    p = np.asarray(shares, dtype=np.float64)
    if o.ndim < 3 or p.shape[-3:] != o.shape[-3:]:
        raise ShapeMismatchError(f"observed {o.shape} and shares {p.shape} must end in the same (I, J, L)")
    a = check_keep(keep)
    q = mixed_shares(p, a, int(np.prod(o.shape[-3:])))
    positive = o > 0
    terms = np.zeros(np.broadcast_shapes(o.shape, p.shape))
    np.log(q, out=terms, where=positive)
    terms *= o
    total = terms.sum(axis=(-3, -2, -1))
    return float(total) if np.ndim(total) == 0 else np.asarray(total, dtype=np.float64)


def independence_fit(counts: npt.ArrayLike) -> FloatArray:
    """The closed-form MLE of conditional independence from (expected) true counts n (..., I, J, L):
    p_ijl = (n_..l / n) (n_i.l / n_..l) (n_.jl / n_..l) (Bishop, Fienberg & Holland 1975, 3.4);
    a stratum with n_..l = 0 gets p = 0. With L = 1 it is the marginal independence fit."""
    n = np.asarray(counts, dtype=np.float64)
    rows = n.sum(axis=-2, keepdims=True)  # n_i.l
    cols = n.sum(axis=-3, keepdims=True)  # n_.jl
    strata = rows.sum(axis=-3, keepdims=True)  # n_..l
    total = strata.sum(axis=-1, keepdims=True)
    safe = np.where(strata > 0, strata, 1.0)
    return np.asarray(rows * cols / safe / total, dtype=np.float64)


def _shares(s: FloatArray, u: FloatArray, v: FloatArray) -> FloatArray:
    """p_ijl = s_l u_il v_jl on (D, I, J, L)."""
    return np.asarray(s[:, None, None, :] * u[:, :, None, :] * v[:, None, :, :], dtype=np.float64)


def em_map(
    s: FloatArray, u: FloatArray, v: FloatArray, observed: FloatArray, keep: float
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """One EM step of the null model, vectorised over D replicates; returns (s', u', v', l(s, u, v)).

    Complete data: the observed cells plus, per record, whether the channel kept it. A record is
    (observed c, kept) with probability a p_c and (observed c, replaced) with probability
    (1 - a)/C whatever its true cell (the replacement is uniform), so the complete-data
    log-likelihood is sum_c k_c log p_c + const, k_c the kept records in cell c. (Augmenting also
    the replaced records' true cells, the textbook E-step n_t = p_t (a w_t + g sum w), adds
    pseudo-counts at the current p: a missing-information fraction ~ 1 - a^2 instead of ~ 1 - a.)
    E-step (closed form, O(C)): E[k_c | o] = o_c a p_c / q_c = a p_c w_c, q_c = a p_c + (1 - a)/C.
    M-step: :func:`independence_fit` of k in its factors: s_l = k_..l / k, u_il = k_i.l / k_..l,
    v_jl = k_.jl / k_..l (a stratum with k_..l = 0 keeps its u, v), where, because
    sum_j v_jl = 1, k_i.l = a s_l u_il sum_j v_jl w_ijl and likewise k_.jl. EM: l never decreases.
    The log-likelihood returned is that of the input point (it costs one log of q).
    """
    g = (1.0 - keep) / int(np.prod(observed.shape[1:]))
    q = _shares(s, u, v)
    q *= keep
    q += g
    positive = observed > 0
    w = np.zeros_like(q)
    np.divide(observed, q, out=w, where=positive)
    np.log(q, out=q, where=positive)
    q[~positive] = 0.0
    loglik = np.einsum("dijl,dijl->d", observed, q)
    row = s[:, None, :] * u * np.einsum("dijl,djl->dil", w, v)  # k_i.l / a
    col = s[:, None, :] * v * np.einsum("dijl,dil->djl", w, u)  # k_.jl / a
    stratum = row.sum(axis=1)  # (D, L)
    kept = stratum.sum(axis=1, keepdims=True)
    live = stratum > 0
    safe = np.where(live, stratum, 1.0)[:, None, :]
    u_new = np.where(live[:, None, :], row / safe, u)
    v_new = np.where(live[:, None, :], col / safe, v)
    return stratum / kept, u_new, v_new, np.asarray(loglik, dtype=np.float64)


@dataclass(frozen=True)
class NullFit:
    """:func:`fit_null_batch`'s result: the shares (D, I, J, L), their log-likelihoods, the
    iterations used per replicate and whether each met the stopping rule."""

    shares: FloatArray
    log_likelihood: FloatArray
    iterations: npt.NDArray[np.int64]
    converged: npt.NDArray[np.bool_]
    #: True where the fit stopped early because l passed ``certify_above`` (l only rises, so the
    #: finished fit's l would be at least as high); all False without ``certify_above``.
    certified: npt.NDArray[np.bool_] | None = None


def _normalised(
    alpha: FloatArray, beta: FloatArray, obs: FloatArray, keep: float, g: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """From log-linear parameters eta_lij = alpha_li + beta_lj (layout (D, L, I, J)): shift alpha so
    that sum p = 1; return (alpha, p, l(p))."""
    eta = alpha[:, :, :, None] + beta[:, :, None, :]
    top = eta.max(axis=(1, 2, 3))
    p = np.exp(eta - top[:, None, None, None])
    total = p.sum(axis=(1, 2, 3))
    p /= total[:, None, None, None]
    alpha = alpha - (top + np.log(total))[:, None, None]
    q = keep * p + g
    loglik = np.einsum("dlij,dlij->d", obs, np.log(q))
    return alpha, p, np.asarray(loglik, dtype=np.float64)


def _scoring_direction(p: FloatArray, obs: FloatArray, keep: float, g: float) -> tuple[FloatArray, FloatArray]:
    """Fisher scoring's direction for the log-linear null model eta_lij = alpha_li + beta_lj
    (beta_lJ = 0), on the tangent of sum p = 1, batched (layout (D, L, I, J), J <= I).

    Score: dl/deta_t = a p_t o_t / q_t; constraint gradient d(sum p)/deta_t = p_t. Expected
    information of o ~ Multinomial(m, q), q = a p + g, in eta: weights W_t = m a^2 p_t^2 / q_t on
    the main-effects design of each stratum (strata are separate blocks, coupled only by sum p = 1),
    plus a ridge 1e-10 m a^2 (a coordinate heading to the boundary has W -> 0). Each stratum's
    block [[diag(A), X], [X^T, diag(B)]] (A_i = sum_j W_ij, B_j = sum_i W_ij, X = W without the
    last column) is solved through the Schur complement on beta (size J - 1). Direction
    d = F^-1 (score - lambda c) with lambda chosen so that c^T d = 0. Returns (d_alpha, d_beta),
    d_beta with its last column 0.
    """
    m = obs.sum(axis=(1, 2, 3))
    score = keep * p * obs / (keep * p + g)
    weight = (m * keep * keep)[:, None, None, None] * p * p / (keep * p + g)
    ridge = (1e-10 * m * keep * keep)[:, None, None]
    diag_a = weight.sum(axis=3) + ridge  # (D, L, I)
    diag_b = weight.sum(axis=2)[:, :, :-1] + ridge  # (D, L, J-1)
    cross = weight[:, :, :, :-1]  # (D, L, I, J-1)
    rhs_a = np.stack([score.sum(axis=3), p.sum(axis=3)], axis=-1)  # (D, L, I, 2)
    rhs_b = np.stack([score.sum(axis=2)[:, :, :-1], p.sum(axis=2)[:, :, :-1]], axis=-1)  # (D, L, J-1, 2)
    scaled = cross / diag_a[:, :, :, None]
    scaled_t = scaled.swapaxes(-1, -2)  # (D, L, J-1, I); matmul runs batched BLAS, einsum would not
    schur = -np.matmul(scaled_t, cross)
    idx = np.arange(schur.shape[-1])
    schur[:, :, idx, idx] += diag_b
    sol_b = np.linalg.solve(schur, rhs_b - np.matmul(scaled_t, rhs_a))
    sol_a = (rhs_a - cross @ sol_b) / diag_a[:, :, :, None]
    # lambda = (c^T F^-1 score) / (c^T F^-1 c), per replicate
    c_score = np.einsum("dli,dli->d", rhs_a[..., 1], sol_a[..., 0]) + np.einsum(
        "dlj,dlj->d", rhs_b[..., 1], sol_b[..., 0]
    )
    c_c = np.einsum("dli,dli->d", rhs_a[..., 1], sol_a[..., 1]) + np.einsum("dlj,dlj->d", rhs_b[..., 1], sol_b[..., 1])
    lam = c_score / c_c
    d_a = sol_a[..., 0] - lam[:, None, None] * sol_a[..., 1]
    d_b = np.zeros((*p.shape[:2], p.shape[3]))
    d_b[:, :, :-1] = sol_b[..., 0] - lam[:, None, None] * sol_b[..., 1]
    return np.asarray(d_a, dtype=np.float64), d_b


def _em_fallback(p: FloatArray, obs: FloatArray, keep: float) -> tuple[FloatArray, FloatArray]:
    """One :func:`em_map` step from shares p in the (D, L, I, J) layout, as log-linear
    parameters (alpha, beta) with beta_lJ = 0 (a zero share becomes log 1e-300)."""
    s = p.sum(axis=(2, 3))
    safe = np.where(s > 0, s, 1.0)[:, :, None]
    u = (p.sum(axis=3) / safe).transpose(0, 2, 1)
    v = (p.sum(axis=2) / safe).transpose(0, 2, 1)
    s2, u2, v2, _ = em_map(s, u, v, obs.transpose(0, 2, 3, 1), keep)
    log_v = np.log(np.maximum(v2.transpose(0, 2, 1), 1e-300))
    alpha = np.log(np.maximum(s2[:, :, None] * u2.transpose(0, 2, 1), 1e-300)) + log_v[:, :, -1:]
    return alpha, log_v - log_v[:, :, -1:]


def fit_null_batch(
    observed: npt.ArrayLike,
    keep: float,
    start: npt.ArrayLike,
    *,
    tolerance: float = FIT_TOLERANCE,
    max_iterations: int = FIT_MAX_ITERATIONS,
    certify_above: FloatArray | None = None,
) -> NullFit:
    """The null (conditional-independence) MLE of D tables (D, I, J, L) at once.

    keep = 1: the closed form :func:`independence_fit` (EM's first step is its fixed point).
    keep < 1: Fisher scoring in the log-linear parameters (:func:`_scoring_direction`), each step
    scaled so that no parameter moves by more than :data:`MAX_LOG_STEP`, with a backtracking line
    search (halve the step, at most :data:`LINE_SEARCH_HALVINGS` times) that accepts a step only if
    it raises the observed-data log-likelihood l; if no halving does, one EM step (:func:`em_map`,
    monotone) is taken instead, and so for the next :data:`EM_RUN` steps of that replicate
    (scoring keeps failing where the data carry almost no information, and each try costs passes).
    l never decreases. (EM converges at the rate of
    the missing information, ~1 - a per step, hopeless at small a; scoring does not.)
    Stopping rule, per replicate: stop when an accepted step raised l by at most ``tolerance``
    nats (``converged`` True), or after ``max_iterations`` steps
    (``converged`` False). Finished replicates leave the batch. ``start`` (D or 1, I, J, L) is a
    null-model point with every share > 0.

    ``certify_above`` (D,): a replicate also leaves the batch (``certified`` True) as soon as its
    l exceeds its level: since l never decreases, the finished fit's l would exceed it too. The
    bootstrap uses this to settle "G* < G" without finishing the fit (:func:`exceedances`).
    """
    o = np.asarray(observed, dtype=np.float64)
    a = check_keep(keep)
    n_d = o.shape[0]
    p0 = np.broadcast_to(np.asarray(start, dtype=np.float64), o.shape)
    if a == 1.0:
        shares = independence_fit(o)
        return NullFit(
            shares,
            np.asarray(observed_log_likelihood(o, shares, a)).reshape(n_d),
            np.ones(n_d, dtype=np.int64),
            np.ones(n_d, dtype=bool),
            np.zeros(n_d, dtype=bool),
        )
    swap = o.shape[2] > o.shape[1]  # the Schur complement is on b's side: make J <= I
    obs = np.ascontiguousarray(o.transpose(0, 3, 2, 1) if swap else o.transpose(0, 3, 1, 2))
    start_t = p0.transpose(0, 3, 2, 1) if swap else p0.transpose(0, 3, 1, 2)
    g = (1.0 - a) / obs[0].size
    log_row = np.log(start_t.sum(axis=3))
    log_col = np.log(start_t.sum(axis=2) / start_t.sum(axis=(2, 3))[:, :, None])
    alpha = log_row
    beta = log_col - log_col[:, :, -1:]
    alpha = alpha + log_col[:, :, -1:]
    alpha, p, loglik = _normalised(alpha, beta, obs, a, g)
    shares = np.zeros_like(obs)
    final = np.zeros(n_d)
    iterations = np.zeros(n_d, dtype=np.int64)
    converged = np.zeros(n_d, dtype=bool)
    certified = np.zeros(n_d, dtype=bool)
    level = np.full(n_d, np.inf) if certify_above is None else np.asarray(certify_above, dtype=np.float64)
    active = np.arange(n_d)
    passed = loglik > level
    if passed.any():  # settled at the start point
        finished = active[passed]
        shares[finished], final[finished], certified[finished] = p[passed], loglik[passed], True
        active, alpha, beta, p, loglik = active[~passed], alpha[~passed], beta[~passed], p[~passed], loglik[~passed]
    rest = np.zeros(n_d, dtype=np.int64)  # EM-only steps left after a failed scoring step
    for step in range(1 if active.size else max_iterations + 1, max_iterations + 1):
        sub = obs[active]
        new_alpha, new_beta, new_p, new_l = alpha.copy(), beta.copy(), p.copy(), loglik.copy()
        resting = rest[active] > 0
        rest[active[resting]] -= 1
        scoring = np.flatnonzero(~resting)
        d_a = np.zeros_like(alpha)
        d_b = np.zeros_like(beta)
        if scoring.size:
            d_a[scoring], d_b[scoring] = _scoring_direction(p[scoring], sub[scoring], a, g)
        d_a = np.clip(d_a, -MAX_LOG_STEP, MAX_LOG_STEP)
        d_b = np.clip(d_b, -MAX_LOG_STEP, MAX_LOG_STEP)
        t = np.ones(active.size)
        pending = scoring
        for _ in range(LINE_SEARCH_HALVINGS + 1):
            if pending.size == 0:
                break
            tt = t[pending][:, None, None]
            tri_alpha, tri_p, tri_l = _normalised(
                alpha[pending] + tt * d_a[pending], beta[pending] + tt * d_b[pending], sub[pending], a, g
            )
            better = tri_l > loglik[pending]
            won = pending[better]
            new_alpha[won], new_beta[won] = tri_alpha[better], beta[won] + t[won][:, None, None] * d_b[won]
            new_p[won], new_l[won] = tri_p[better], tri_l[better]
            pending = pending[~better]
            t[pending] /= 2.0
        rest[active[pending]] = EM_RUN  # scoring failed: EM for the next EM_RUN steps too
        pending = np.sort(np.concatenate([pending, np.flatnonzero(resting)]))
        if pending.size:  # no halving raised l, or resting: one EM step (:func:`em_map`) instead
            em_alpha, em_beta = _em_fallback(p[pending], sub[pending], a)
            em_alpha, em_p, em_l = _normalised(em_alpha, em_beta, sub[pending], a, g)
            better = em_l > loglik[pending]
            won = pending[better]
            new_alpha[won], new_beta[won] = em_alpha[better], em_beta[better]
            new_p[won], new_l[won] = em_p[better], em_l[better]
        gain = new_l - loglik
        above = new_l > level[active]
        done = (gain <= tolerance) | (step == max_iterations) | above
        alpha, beta, p, loglik = new_alpha, new_beta, new_p, new_l
        if done.any():
            finished = active[done]
            shares[finished] = p[done]
            final[finished] = loglik[done]
            iterations[finished] = step
            converged[finished] = gain[done] <= tolerance
            certified[finished] = above[done]
            keep_rows = ~done
            active, alpha, beta, p, loglik = (
                active[keep_rows],
                alpha[keep_rows],
                beta[keep_rows],
                p[keep_rows],
                loglik[keep_rows],
            )
        if active.size == 0:
            break
    out = shares.transpose(0, 3, 2, 1) if swap else shares.transpose(0, 2, 3, 1)
    return NullFit(np.ascontiguousarray(out), final, iterations, converged, certified)


def start_points(observed: FloatArray, keep: float) -> FloatArray:
    """The fit's start for D tables (D, I, J, L): the independence fit of the saturated MLE
    (:func:`mle_water_filling`), mixed 9:1 with the uniform table so that every share is > 0.
    The observed table and every bootstrap table start by this same rule, so the statistic is
    one deterministic function of the table."""
    n_d = observed.shape[0]
    saturated = mle_water_filling(observed.reshape(n_d, -1), keep).reshape(observed.shape)
    return np.asarray(0.9 * independence_fit(saturated) + 0.1 / observed[0].size, dtype=np.float64)


def fit_conditional_independence(
    observed: npt.ArrayLike,
    keep: float,
    *,
    tolerance: float = FIT_TOLERANCE,
    max_iterations: int = FIT_MAX_ITERATIONS,
) -> FloatArray:
    """The null MLE of DESIGN 11: true-cell shares p_ijl = p_l p_{i|l} p_{j|l} maximising
    :func:`observed_log_likelihood` (:func:`fit_null_batch` from :func:`start_points`).
    Returns (I, J, L)."""
    table = check_table(observed)[None].astype(np.float64)
    a = check_keep(keep)
    fit = fit_null_batch(table, a, start_points(table, a), tolerance=tolerance, max_iterations=max_iterations)
    return np.asarray(fit.shares[0], dtype=np.float64)


def likelihood_ratio_statistic(
    observed: FloatArray, keep: float, null_shares: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """G = 2 (l(saturated MLE) - l(null MLE)) for D tables (D, I, J, L); the saturated MLE is the
    closed form :func:`mle_water_filling` on all C cells. G >= 0 up to rounding (the null model is
    a subset of the simplex); it is clipped at 0. Returns (G, saturated shares)."""
    n_d = observed.shape[0]
    saturated = mle_water_filling(observed.reshape(n_d, -1), keep).reshape(observed.shape)
    l_sat = np.asarray(observed_log_likelihood(observed, saturated, keep)).reshape(n_d)
    l_null = np.asarray(observed_log_likelihood(observed, null_shares, keep)).reshape(n_d)
    return np.maximum(2.0 * (l_sat - l_null), 0.0), saturated


def degrees_of_freedom(n_i: int, n_j: int, n_l: int) -> int:
    """df = L (I - 1)(J - 1): free parameters of the saturated model (IJL - 1) minus those of the
    conditional-independence model (L - 1 + L (I - 1) + L (J - 1))."""
    return n_l * (n_i - 1) * (n_j - 1)


def cell_information(shares: npt.ArrayLike, keep: float, m: int) -> FloatArray:
    """m a^2 p_t^2 / q_t: (p_t / sd_t)^2 where sd_t^2 = q_t / (m a^2) is the leading term of the
    variance of the saturated estimate (q_t - g)/a of p_t (DESIGN 3, per-cell variance, a-scaled).
    Small where a true share is within a few standard deviations of the boundary p_t = 0."""
    p = np.asarray(shares, dtype=np.float64)
    q = mixed_shares(p, keep, p.size)
    return np.asarray(m * keep * keep * p * p / q, dtype=np.float64)


def chi_square_is_trustworthy(null_shares: npt.ArrayLike, keep: float, m: int) -> bool:
    """``method="auto"``'s rule: chi-square(df) only when every cell's
    :func:`cell_information` at the null fit is >= :data:`CHI2_MIN_CELL_INFORMATION` (10: every
    share >= 3.2 standard deviations from 0, so the MLE is interior with high probability and G is
    close to its chi-square limit); otherwise the bootstrap. At keep = 1 it asks m p_t >= 10 of the
    null fit, stricter than the classical 'expected counts >= 5'."""
    return bool(np.min(cell_information(null_shares, keep, m)) >= CHI2_MIN_CELL_INFORMATION)


def likelihood_ratio_statistics(tables: npt.ArrayLike, keep: float) -> tuple[FloatArray, FloatArray, FloatArray]:
    """G of D tables (D, I, J, L) at once, each by the same deterministic rule: the null fit
    :func:`fit_null_batch` from :func:`start_points`, then :func:`likelihood_ratio_statistic`.
    Returns (G (D,), null shares, saturated shares)."""
    o = np.asarray(tables, dtype=np.float64)
    a = check_keep(keep)
    fit = fit_null_batch(o, a, start_points(o, a))
    g, saturated = likelihood_ratio_statistic(o, a, fit.shares)
    return g, fit.shares, saturated


def bootstrap_tables(null_shares: FloatArray, keep: float, m: int, draws: int, rng: np.random.Generator) -> FloatArray:
    """``draws`` tables simulated from the fitted null through the channel: o* ~
    Multinomial(m, a p0 + (1 - a)/C) (drawing m true cells from p0 and then applying the channel
    gives exactly this law). Returns (draws, I, J, L)."""
    q = mixed_shares(null_shares, keep, null_shares.size).reshape(-1)
    q = q / q.sum()
    return np.asarray(rng.multinomial(m, q, size=draws).reshape((draws, *null_shares.shape)), dtype=np.float64)


def interior_null(null_shares: npt.ArrayLike, keep: float, m: int, floor: float = FLOOR_STANDARD_ERRORS) -> FloatArray:
    """The bootstrap's generating point: the null fit with every marginal share moved off the
    boundary to at least ``floor`` standard errors (DESIGN 11, the boundary fix).

    Why: where the data carry little information (m a^2 small against C) the null MLE puts shares
    at exactly 0 that are small but positive in truth, and the law of G is smaller at the boundary
    (a chi-bar-square with fewer effective degrees of freedom) than inside; bootstrapping from the
    MLE then rejects too often (measured 12% at nominal 5%, 10 x 10, a = 0.2, m = 500). A share that
    is within ``floor`` standard errors of 0 cannot be told from one ``floor`` standard errors
    inside, so the least favourable of those plausible nulls, the most interior one, is used.
    Formula: the stratum shares s_l, the row shares r_il = s_l u_il and the column shares
    c_jl = s_l v_jl are each estimated from o summed over the other cells; near 0 such a share x
    over a margin of k cells (k = I J, J, I respectively) has standard error
    se_k = sqrt((a/m + (1 - a) k / C) / m) / a: the binomial sd of its observed count at
    q = a/m + (1 - a) k / C (the rate of a share of one record in m), divided by a. Without the a/m
    term the floor vanished at keep near 1, where a sparse table at small m rejected 12.5% at
    nominal 5% (4 x 4 given 2, K = 96, epsilon 4, m = 30; 6.7% with it, 300 releases). Each family
    is floored, x' = max(x, min(floor se_k, x_tot / n_levels)) with x_tot its stratum total (the cap
    keeps a floor above the uniform share from reversing the order), and renormalised to its
    stratum total; p'_ijl = s'_l u'_il v'_jl. At keep = 1 se_k is 1/m. The floor 2 is the measured
    one (module docstring): 1 still rejected 12% at 10 x 10, a = 0.5, m = 100, and 0 (the MLE
    itself) 12-17%.
    """
    p = np.asarray(null_shares, dtype=np.float64)
    n_i, n_j, n_l = p.shape
    cells = p.size

    def floored(x: FloatArray, margin: int, levels: int) -> FloatArray:
        total = x.sum(axis=0, keepdims=True)
        se = math.sqrt((keep / m + (1.0 - keep) * margin / cells) / m) / keep
        raised = np.maximum(x, np.minimum(floor * se, total / levels))
        raised = np.where(total > 0, raised, 1.0)  # a stratum the fit emptied: uniform within it
        return np.asarray(raised / raised.sum(axis=0, keepdims=True), dtype=np.float64)

    s = floored(p.sum(axis=(0, 1))[:, None], n_i * n_j, n_l)[:, 0]  # (L,), sums to 1
    u = floored(p.sum(axis=1), n_j, n_i)  # (I, L), columns sum to 1
    v = floored(p.sum(axis=0), n_i, n_j)  # (J, L)
    return np.asarray(s[None, None, :] * u[:, None, :] * v[None, :, :], dtype=np.float64)


def exceedances(tables: FloatArray, keep: float, statistic: float | FloatArray) -> npt.NDArray[np.bool_]:
    """Whether each bootstrap table's G* reaches the observed G (the tie rule of
    :func:`bootstrap_p_value`), for D tables (D, I, J, L) at once, exactly as
    :func:`likelihood_ratio_statistics` would decide it, but faster: the fit's l only rises, so
    2 (l(saturated) - l(current point)) bounds the finished G* from above, and a replicate whose
    bound is already below the threshold (by a rounding margin) is settled as "no exceedance"
    and leaves the fit (:func:`fit_null_batch`'s ``certify_above``). Only replicates near or
    above G are fitted to the end. The answer is the same as the full computation's (each
    replicate's fit is the same computation whatever else is in the batch). ``statistic``: one G,
    or one per table (D,)."""
    n_d = tables.shape[0]
    observed_g = np.broadcast_to(np.asarray(statistic, dtype=np.float64), (n_d,))
    threshold = observed_g - 1e-9 * np.maximum(1.0, np.abs(observed_g))
    saturated = mle_water_filling(tables.reshape(n_d, -1), keep).reshape(tables.shape)
    l_sat = np.asarray(observed_log_likelihood(tables, saturated, keep)).reshape(n_d)
    margin = 1e-7 * (1.0 + np.abs(l_sat))
    fit = fit_null_batch(tables, keep, start_points(tables, keep), certify_above=l_sat - (threshold - margin) / 2.0)
    g_star, _ = likelihood_ratio_statistic(tables, keep, fit.shares)
    settled = np.zeros(n_d, dtype=bool) if fit.certified is None else fit.certified
    return np.asarray(~settled & (g_star >= threshold), dtype=np.bool_)


def sequential_p_value(
    exceeded: npt.ArrayLike, draws: int, stop_after: int = SEQUENTIAL_EXCEEDANCES
) -> tuple[float, int]:
    """Besag & Clifford's (1991) sequential Monte Carlo p-value; returns (p, draws used).

    Draw bootstrap tables one at a time (here in batches, read in draw order) until ``stop_after``
    = h of them have reached the observed G, or ``draws`` = n - 1 were drawn. Stopped at draw l
    with h exceedances: p = h / l; never stopped, with e exceedances in n - 1 draws:
    p = (e + 1) / n, the fixed-draws p-value of :func:`bootstrap_p_value`. Exactly valid like that
    one (P(p <= u) <= u under exchangeability of G and the G*), a little less powerful, and under
    H0 it needs on average about h (1 + log(n / h)) draws instead of n - 1. ``exceeded`` lists the
    indicators of the first draws in order (at least up to the stopping draw)."""
    hits = np.flatnonzero(np.asarray(exceeded, dtype=bool)[:draws])
    if hits.size >= stop_after:
        used = int(hits[stop_after - 1]) + 1
        return stop_after / used, used
    return (hits.size + 1) / (draws + 1), draws


def next_batch(drawn: int, hits: int, stop_after: int = SEQUENTIAL_EXCEEDANCES) -> int:
    """How many bootstrap tables :func:`independence_test` draws next, having drawn ``drawn`` with
    ``hits`` exceedances (only the cost depends on it, not the p-value: :func:`sequential_p_value`
    reads the draws in order). First :data:`FIRST_BATCH`; with no exceedance yet, as many again;
    else 1.25 times the draws the rate so far says the missing exceedances need,
    1.25 (h - hits) drawn / hits, at least FIRST_BATCH / 2 (fewer tables fitted past the stopping
    draw than with doubling)."""
    if drawn == 0:
        return FIRST_BATCH
    if hits == 0:
        return drawn
    return max(FIRST_BATCH // 2, math.ceil(1.25 * (stop_after - hits) * drawn / hits))


def bootstrap_p_value(statistic: float, replicates: npt.ArrayLike) -> float:
    """p = (1 + #{G* >= G}) / (draws + 1) (Davison & Hinkley 1997, Eq. 4.11): a valid p-value
    for the Monte Carlo test, never 0. A relative slack of 1e-9 counts ties despite rounding."""
    g_star = np.asarray(replicates, dtype=np.float64)
    hits = int(np.count_nonzero(g_star >= statistic - 1e-9 * max(1.0, abs(statistic))))
    return (1 + hits) / (g_star.size + 1)


def independence_test(
    observed: npt.ArrayLike,
    keep: float,
    *,
    method: str = "auto",
    draws: int = 999,
    seed: int = 0,
) -> IndependenceTest:
    """The likelihood-ratio test of H0: a independent of b given the strata (DESIGN 11).

    ``observed`` (I, J, L) (or (I, J) for L = 1) holds the perturbed counts; ``keep`` is the
    channel's a. G = 2 (l(saturated MLE) - l(null MLE)), df = L (I - 1)(J - 1). ``method``:
    "bootstrap" (seeded parametric bootstrap: at most ``draws`` tables from the fitted null moved
    off the boundary, :func:`interior_null` and :func:`bootstrap_tables`, each refitted by the same
    rule, :func:`exceedances`; sequential p-value and stopping rule of :func:`sequential_p_value`;
    ``draws`` of the result is the number drawn),
    "chi2" (chi-square(df) tail) or "auto" (chi-square only when
    :func:`chi_square_is_trustworthy`, else the bootstrap).
    """
    table = check_table(observed)
    a = check_keep(keep)
    check_method(method)
    n_draws = check_draws(draws)
    rng_seed = _check_seed(seed)
    n_i, n_j, n_l = table.shape
    m = int(table.sum())
    g, null, saturated = likelihood_ratio_statistics(table[None], a)
    statistic = float(g[0])
    df = degrees_of_freedom(n_i, n_j, n_l)
    use_chi2 = method == "chi2" or (method == "auto" and chi_square_is_trustworthy(null[0], a, m))
    if use_chi2:
        p_value = float(stats.chi2.sf(statistic, df))
        label = f"likelihood ratio; p from chi-square({df})"
        used = 0
    else:
        source = interior_null(null[0], a, m)
        rng = np.random.default_rng(rng_seed)
        exceeded: list[npt.NDArray[np.bool_]] = []
        drawn, hits = 0, 0
        while drawn < n_draws and hits < SEQUENTIAL_EXCEEDANCES:
            size = min(next_batch(drawn, hits), n_draws - drawn)
            exceeded.append(exceedances(bootstrap_tables(source, a, m, size, rng), a, statistic))
            drawn, hits = drawn + size, hits + int(exceeded[-1].sum())
        p_value, used = sequential_p_value(np.concatenate(exceeded), n_draws)
        label = (
            f"likelihood ratio; p from a parametric bootstrap (seed {rng_seed}) from the null fit with "
            f"marginal shares floored at {FLOOR_STANDARD_ERRORS:g} standard errors, sequential "
            f"(Besag & Clifford 1991: stop at {SEQUENTIAL_EXCEEDANCES} exceedances, at most "
            f"{n_draws} draws; {used} drawn)"
        )
    return IndependenceTest(statistic, df, p_value, label, used, null[0], saturated[0])


def rappor_wald_test(observed_2d: npt.ArrayLike, keep: float) -> IndependenceTest:
    """RAPPOR's association test (Fanti, Pihur & Erlingsson 2016): the EM estimate of the 2-D
    joint, then a Wald chi-square test of independence with the information-matrix covariance.

    NOT CALIBRATED at small m and not offered to users: it is here to be measured as the baseline
    (its type-I error exceeds the nominal level at the m a small-epsilon plan gives; see
    tests/unit/test_mech_association.py). Details: p_hat = the converged EM estimate
    (:func:`mle_water_filling`, its closed form); the covariance of p_hat from the inverse Fisher
    information of o ~ Multinomial(m, a p + g) is V = (diag(q) - q q^T) / (m a^2) at q = a p_hat + g;
    the (I - 1)(J - 1) contrasts h_ij = p_ij - p_i. p_.j (i < I, j < J) vanish under H0, with
    Jacobian dh_ij/dp_kl = [i = k][j = l] - [i = k] p_.j - [j = l] p_i.; W = h^T (H V H^T)^-1 h,
    p from chi-square((I - 1)(J - 1)).
    """
    table = check_table(observed_2d)
    if table.shape[2] != 1:
        raise ShapeMismatchError(f"the Wald baseline takes a 2-D table, got strata L = {table.shape[2]}")
    a = check_keep(keep)
    n_i, n_j, _ = table.shape
    m = int(table.sum())
    p = mle_water_filling(table.reshape(1, -1), a).reshape(n_i, n_j)
    q = mixed_shares(p, a, n_i * n_j).reshape(-1)
    cov = (np.diag(q) - np.outer(q, q)) / (m * a * a)
    rows, cols = p.sum(axis=1), p.sum(axis=0)
    h = (p - np.outer(rows, cols))[: n_i - 1, : n_j - 1].reshape(-1)
    eye_i, eye_j = np.eye(n_i)[: n_i - 1], np.eye(n_j)[: n_j - 1]
    jac = (
        np.einsum("ik,jl->ijkl", eye_i, eye_j)
        - np.einsum("ik,j,l->ijkl", eye_i, cols[: n_j - 1], np.ones(n_j))
        - np.einsum("jl,i,k->ijkl", eye_j, rows[: n_i - 1], np.ones(n_i))
    ).reshape((n_i - 1) * (n_j - 1), n_i * n_j)
    middle = jac @ cov @ jac.T
    statistic = float(h @ np.linalg.lstsq(middle, h, rcond=None)[0])
    df = (n_i - 1) * (n_j - 1)
    return IndependenceTest(
        statistic,
        df,
        float(stats.chi2.sf(statistic, df)),
        f"Wald (RAPPOR, Fanti et al. 2016); p from chi-square({df}); not calibrated at small m",
        0,
        (np.outer(rows, cols))[:, :, None],
        p[:, :, None],
    )
