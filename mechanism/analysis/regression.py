"""Logistic and multinomial regression fitted on the likelihood of PRAM-perturbed counts (DESIGN 11).

The researcher holds the observed counts o (Y x X) of m perturbed records on a sub-table: an
outcome y with Y levels and covariate cells x (the mixed-radix product of categorical
covariates). On the Y X cells of the sub-table the channel is "keep the true cell with
probability a, else a uniform cell of the Y X" (DESIGN 3.5), so

    o ~ Multinomial(m, q),   q(y, x) = a p(y, x) + (1 - a)/(Y X).

The model is p(y, x) = pi_x P(y | x; beta): the covariate distribution pi is saturated (free on
the simplex over the X cells) and P(y | x) is a logistic (Y = 2) or baseline-category
multinomial logit (Y > 2) with design row d(x) and the first outcome level as reference:
P(y | x) = exp(d(x) . beta_y) / sum_y' exp(d(x) . beta_y'), beta_0 = 0.

The fit maximises the observed-data likelihood by EM over the true cells, accelerated by SQUAREM
(Varadhan and Roland 2008) and finished by Newton steps on the observed likelihood. It reads the
counts only, never the A^-1 estimate, and costs no privacy budget (post-processing). At a = 1 the
E-step returns o itself and the fit is the ordinary (non-private) grouped logistic fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats

from secure_release.mechanism import printing
from secure_release.mechanism.errors import (
    DesignRowsError,
    DifferentTablesError,
    EmptyDomainError,
    InvalidCountsError,
    InvalidInteractionError,
    NonFiniteInputError,
    NotNestedModelsError,
    RankDeficientDesignError,
    ShapeMismatchError,
    TooFewOutcomeLevelsError,
)
from secure_release.mechanism.estimation.estimators import check_level, mle_water_filling, normal_quantile
from secure_release.mechanism.primitives.pram import check_keep

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Covariate shares at or below this are on the boundary of the simplex: held fixed at their
#: value (not free parameters) in the Newton steps and the information matrix.
BOUNDARY_SHARE = 1e-10
#: SQUAREM stops when every entry of the EM map's residual F(theta) - theta is below this.
EM_TOLERANCE = 1e-8
#: SQUAREM hands over to Newton when its residual is below this (and, should Newton fail, goes
#: on to :data:`EM_TOLERANCE` before a second Newton attempt).
NEWTON_START = 1e-3
#: Newton stops when every entry of its step is below this.
NEWTON_TOLERANCE = 1e-10
#: At most this many SQUAREM cycles (3 EM steps each) in all, and per round before Newton.
MAX_CYCLES = 2000
ROUND_CYCLES = 50
#: A fitted log-odds beyond this (a probability below e^-30 = 1e-13; a finite MLE at keep = 1
#: has |log-odds| <= ln(m), so this needs m > 10^13) means the MLE is at infinity (a separated
#: outcome): the fit stops, not converged.
SEPARATION_LOG_ODDS = 30.0
#: The M-step's Newton stops when its decrement g' I^-1 g is below this (log-likelihood units).
DECREMENT_TOLERANCE = 1e-20
#: At most this many Newton steps in one M-step.
INNER_STEPS = 30
INTERCEPT = "Intercept"
#: A coefficient whose standard error exceeds this (on the logit scale), or is not finite (the
#: information matrix is singular or not positive definite there), is not estimated
#: (:attr:`ModelFit.not_estimated`): its 95% Wald interval spans more than +-19.6 log-odds, odds
#: ratios from e^-20 to e^20, so the likelihood is flat along it whether or not the fit converged.
FLAT_STANDARD_ERROR = 10.0
#: Why a coefficient is not estimated, and what to do (the printed warning line, and the text of
#: :class:`~secure_release.mechanism.errors.FlatLikelihoodWarning`).
FLAT_LIKELIHOOD = (
    "flat likelihood in {names}: too few records in some cell of the table inform {them}, so {pronoun} not "
    "estimated (standard error above {limit:g} on the logit scale, or not finite: the information matrix is "
    "(nearly) singular there{converged}). Merge bins or levels, spend more epsilon, or release more records."
)
#: The header's short name of the fitting method.
FIT_METHOD = "MLE of the perturbed counts (EM + Newton)"


# --- the design -----------------------------------------------------------------------------


def design_matrix(
    levels: Sequence[int],
    names: Sequence[str],
    categories: Sequence[Sequence[str]],
    interactions: Sequence[tuple[int, int]] = (),
) -> tuple[FloatArray, list[str]]:
    """The design rows d(x) of every covariate cell x, and the column names.

    Rows are the X = prod(levels) cells in mixed-radix order, the first attribute slowest (as
    numpy's ``reshape(levels)``). Columns: the intercept, then each attribute's dummies (first
    category the reference; "educ[HS]"), then each named pairwise interaction (i, j) as the
    products of i's and j's dummies ("educ[HS]:sex[F]", i's category outer). With no attributes
    the design is the single intercept row.
    """
    if not len(levels) == len(names) == len(categories):
        raise ShapeMismatchError(
            f"{len(levels)} levels, {len(names)} names and {len(categories)} category lists: "
            "give one of each per covariate"
        )
    sizes: list[int] = []
    for name, k, cats in zip(names, levels, categories, strict=True):
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise EmptyDomainError(f"covariate {name!r} has {k!r} levels; it needs an integer >= 1")
        if len(cats) != k:
            raise ShapeMismatchError(f"covariate {name!r} has {k} levels but {len(cats)} category names")
        sizes.append(int(k))
    pairs = _check_interactions(interactions, len(sizes))
    cells = math.prod(sizes)
    grid = np.indices(sizes).reshape(len(sizes), cells)
    columns: list[FloatArray] = [np.ones(cells)]
    labels = [INTERCEPT]
    dummies: list[list[tuple[str, FloatArray]]] = []
    for i, (name, cats) in enumerate(zip(names, categories, strict=True)):
        own = [(f"{name}[{cats[c]}]", (grid[i] == c).astype(np.float64)) for c in range(1, sizes[i])]
        dummies.append(own)
        labels += [label for label, _ in own]
        columns += [col for _, col in own]
    for i, j in pairs:
        for label_i, col_i in dummies[i]:
            for label_j, col_j in dummies[j]:
                labels.append(f"{label_i}:{label_j}")
                columns.append(col_i * col_j)
    return np.asarray(np.stack(columns, axis=1), dtype=np.float64), labels


def _check_interactions(interactions: Sequence[tuple[int, int]], count: int) -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    for pair in interactions:
        if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int | np.integer) for v in pair):
            raise InvalidInteractionError(f"interaction {pair!r} must be a pair of covariate indices")
        i, j = int(pair[0]), int(pair[1])
        if not (0 <= i < count and 0 <= j < count) or i == j:
            raise InvalidInteractionError(
                f"interaction {pair!r} must name two distinct covariates by index in [0, {count})"
            )
        if (i, j) in pairs or (j, i) in pairs:
            raise InvalidInteractionError(f"interaction {pair!r} is named twice")
        pairs.append((i, j))
    return pairs


# --- the model's probabilities and the observed likelihood -----------------------------------


def outcome_probabilities(design: FloatArray, beta: FloatArray) -> FloatArray:
    """P(y | x; beta), shape (Y, X): the softmax over y of eta_yx = d(x) . beta_y with
    eta_0x = 0 (first level the reference); beta has shape (Y - 1, D). Stable (max subtracted)."""
    eta = np.vstack([np.zeros((1, design.shape[0])), beta @ design.T])
    eta -= eta.max(axis=0, keepdims=True)
    e = np.exp(eta)
    return np.asarray(e / e.sum(axis=0, keepdims=True), dtype=np.float64)


def observed_cell_probabilities(shares: FloatArray, outcome: FloatArray, keep: float) -> FloatArray:
    """q = a p + (1 - a)/(Y X) with p(y, x) = pi_x P(y | x): the observed-cell probabilities of
    the keep-or-uniform channel on the Y X cells (DESIGN 3.5)."""
    return np.asarray(keep * outcome * shares[None, :] + (1.0 - keep) / outcome.size, dtype=np.float64)


def observed_log_likelihood(observed: FloatArray, q: FloatArray) -> float:
    """l = sum_c o_c log q_c, the multinomial log-likelihood of the observed counts without its
    constant log(m! / prod o_c!) (cells with o_c = 0 contribute 0, also where q_c = 0)."""
    seen = observed > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(observed[seen] * np.log(q[seen])))


def _ratio(observed: FloatArray, q: FloatArray, power: int) -> FloatArray:
    """o / q^power, 0 where o = 0 (there q may be 0 at a = 1)."""
    out = np.zeros_like(observed)
    np.divide(observed, q**power, out=out, where=observed > 0)
    return out


# --- EM ------------------------------------------------------------------------------------


def expected_true_counts(observed: FloatArray, p: FloatArray, keep: float) -> FloatArray:
    """E-step: E[true counts | o] under the joint p, in closed form for the keep-or-uniform
    channel.

    P(true t, observed c) = p_t (a [t = c] + g), g = (1 - a)/N over the N = Y X cells, so
    P(true t | observed c) = p_t (a [t = c] + g)/q_c and
    n_t = sum_c o_c P(t | c) = p_t (a o_t/q_t + g sum_c o_c/q_c). O(N). At a = 1, n = o.
    """
    g = (1.0 - keep) / p.size
    q = keep * p + g
    w = _ratio(observed, q, 1)
    return np.asarray(p * (keep * w + g * w.sum()), dtype=np.float64)


@dataclass(frozen=True)
class _OutcomeFit:
    beta: FloatArray
    converged: bool


def fit_outcome_model(counts: FloatArray, design: FloatArray, start: FloatArray) -> _OutcomeFit:
    """M-step for beta: the weighted (grouped) logistic / multinomial-logit MLE on counts n (Y, X).

    Maximises L(beta) = sum_yx n_yx log P(y | x; beta) by Newton's method with step halving:
    gradient g_kj = sum_x d_xj (n_kx - N_x s_kx), information
    I_(kj)(li) = sum_x N_x s_kx ([k = l] - s_lx) d_xj d_xi (N_x = sum_y n_yx; k, l >= 1),
    positive definite when the design rows with N_x > 0 have full column rank (checked by the
    caller) and the fitted probabilities are not numerically 0 or 1. Converged when the Newton
    decrement g' I^-1 g (twice the predicted gain of L) is below :data:`DECREMENT_TOLERANCE` or
    every step entry is below :data:`NEWTON_TOLERANCE`; at most :data:`INNER_STEPS` steps (a
    generalised EM step then: L still does not decrease).
    """
    beta = start.copy()
    totals = counts.sum(axis=0)
    k1, d = beta.shape
    value = _outcome_log_likelihood(counts, design, beta)
    eye = np.eye(k1)[:, :, None]
    for _ in range(INNER_STEPS):
        s = outcome_probabilities(design, beta)[1:]
        grad = ((counts[1:] - totals * s) @ design).reshape(-1)
        cov = (s[:, None, :] * (eye - s[None, :, :])) * totals  # (K1, K1, X)
        info = np.einsum("klx,xj,xi->kjli", cov, design, design).reshape(k1 * d, k1 * d)
        try:
            chol = np.linalg.cholesky(info)
        except np.linalg.LinAlgError:
            return _OutcomeFit(beta, False)
        half = np.linalg.solve(chol, grad)
        if float(half @ half) < DECREMENT_TOLERANCE:
            return _OutcomeFit(beta, True)
        step = np.linalg.solve(chol.T, half).reshape(k1, d)
        length = 1.0
        while True:
            trial = beta + length * step
            trial_value = _outcome_log_likelihood(counts, design, trial)
            if trial_value >= value:
                break
            length /= 2.0
            if length < 1e-8:
                return _OutcomeFit(beta, False)
        beta, value = trial, trial_value
        if np.max(np.abs(length * step)) < NEWTON_TOLERANCE:
            return _OutcomeFit(beta, True)
    return _OutcomeFit(beta, False)


def _outcome_log_likelihood(counts: FloatArray, design: FloatArray, beta: FloatArray) -> float:
    s = outcome_probabilities(design, beta)
    seen = counts > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(counts[seen] * np.log(s[seen])))


@dataclass
class _State:
    """theta = (beta (Y - 1, D), pi (X,))."""

    beta: FloatArray
    shares: FloatArray

    def vector(self) -> FloatArray:
        return np.concatenate([self.beta.reshape(-1), self.shares])


def _em_step(observed: FloatArray, keep: float, design: FloatArray, state: _State) -> _State:
    """One EM map F: E-step (:func:`expected_true_counts`), then the M-step pi_x = n_.x / m and
    beta from :func:`fit_outcome_model` on n (warm-started)."""
    s = outcome_probabilities(design, state.beta)
    n = expected_true_counts(observed, s * state.shares[None, :], keep)
    totals = n.sum(axis=0)
    fit = fit_outcome_model(n, design, state.beta)
    return _State(fit.beta, totals / totals.sum())


def _log_likelihood(observed: FloatArray, keep: float, design: FloatArray, state: _State) -> float:
    s = outcome_probabilities(design, state.beta)
    return observed_log_likelihood(observed, observed_cell_probabilities(state.shares, s, keep))


def _from_vector(vector: FloatArray, shape: tuple[int, int]) -> _State:
    size = shape[0] * shape[1]
    return _State(vector[:size].reshape(shape), vector[size:])


def squarem_cycle(observed: FloatArray, keep: float, design: FloatArray, state: _State) -> tuple[_State, float]:
    """One SQUAREM cycle (Varadhan and Roland 2008, scheme S3) on the EM map F.

    theta1 = F(theta0), theta2 = F(theta1), r = theta1 - theta0, v = theta2 - 2 theta1 + theta0,
    alpha = -|r|/|v| (at most -1), theta' = theta0 - 2 alpha r + alpha^2 v (its pi still sums
    to 1: the weights sum to 1), then theta'' = F(theta'). alpha is moved halfway to -1 while
    theta' has a negative share; theta'' is kept only if its likelihood is >= theta2's
    (alpha = -1 gives theta' = theta2, plain EM). Returns the new state and max |r|.
    """
    first = _em_step(observed, keep, design, state)
    second = _em_step(observed, keep, design, first)
    t0, t1, t2 = state.vector(), first.vector(), second.vector()
    r, v = t1 - t0, t2 - 2.0 * t1 + t0
    residual = float(np.max(np.abs(r)))
    v_norm = float(np.linalg.norm(v))
    if v_norm == 0.0:
        return second, residual
    alpha = min(-float(np.linalg.norm(r)) / v_norm, -1.0)
    shape = state.beta.shape
    for _ in range(60):
        extrapolated = _from_vector(t0 - 2.0 * alpha * r + alpha**2 * v, (shape[0], shape[1]))
        if np.all(extrapolated.shares >= 0.0) or alpha == -1.0:
            break
        alpha = (alpha - 1.0) / 2.0 if alpha < -1.0 - 1e-9 else -1.0
    third = _em_step(observed, keep, design, extrapolated)
    if _log_likelihood(observed, keep, design, third) >= _log_likelihood(observed, keep, design, second):
        return third, residual
    return second, residual


# --- the observed-data score and information --------------------------------------------------


def observed_score_hessian(
    observed: FloatArray, keep: float, design: FloatArray, beta: FloatArray, shares: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Gradient and Hessian of l(beta, pi) = sum o log q in (beta, pi), pi unconstrained (X
    coordinates; the simplex constraint is applied by :func:`free_information`). Analytic.

    With s = P(y | x), E_ykx = [y = k] - s_kx, w1 = o/q, w2 = o/q^2, a = keep:
      dp_yx/dbeta_kj = pi_x s_yx E_ykx d_xj,   dp_yx/dpi_x = s_yx,
      dl/dbeta_kj = a sum_x d_xj pi_x sum_y w1 s_y E_yk,   dl/dpi_x = a sum_y w1 s_y,
      d2l/dbeta_kj dbeta_li = sum_x d_xj d_xi [a pi_x (sum_y w1 s_y E_yk E_yl - s_k([k = l] - s_l) sum_y w1 s_y)
                                            - a^2 pi_x^2 sum_y w2 s_y^2 E_yk E_yl],
      d2l/dbeta_kj dpi_x = d_xj [a sum_y w1 s_y E_yk - a^2 pi_x sum_y w2 s_y^2 E_yk],
      d2l/dpi_x dpi_x' = -[x = x'] a^2 sum_y w2 s_y^2
    (from d2l = a sum w1 d2p - a^2 sum w2 dp dp and d2s_y/deta_k deta_l = s_y E_yk E_yl -
    s_y s_k ([k = l] - s_l)). Order of the coordinates: beta row-major (level, column), then pi.
    """
    k1, d = beta.shape
    x = design.shape[0]
    s = outcome_probabilities(design, beta)
    q = observed_cell_probabilities(shares, s, keep)
    w1, w2 = _ratio(observed, q, 1), _ratio(observed, q, 2)
    y = s.shape[0]
    e = np.eye(y)[:, 1:, None] - s[None, 1:, :]  # (Y, K1, X)
    u = w1 * s  # (Y, X)
    ws = u.sum(axis=0)  # (X,)
    score_eta = keep * shares * np.einsum("yx,ykx->kx", u, e)  # (K1, X)
    grad_beta = (score_eta @ design).reshape(-1)
    grad_pi = keep * ws
    t1 = np.einsum("yx,ykx,ylx->klx", u, e, e) - s[1:, None, :] * (np.eye(k1)[:, :, None] - s[None, 1:, :]) * ws
    t2 = np.einsum("yx,ykx,ylx->klx", w2 * s**2, e, e)
    curv = keep * shares * t1 - keep**2 * shares**2 * t2  # (K1, K1, X)
    h_bb = np.einsum("klx,xj,xi->kjli", curv, design, design).reshape(k1 * d, k1 * d)
    cross = keep * np.einsum("yx,ykx->kx", u, e) - keep**2 * shares * np.einsum("yx,ykx->kx", w2 * s**2, e)
    h_bp = (cross[:, None, :] * design.T[None, :, :]).reshape(k1 * d, x)
    h_pp = np.diag(-(keep**2) * (w2 * s**2).sum(axis=0))
    hess = np.block([[h_bb, h_bp], [h_bp.T, h_pp]])
    return np.concatenate([grad_beta, grad_pi]), np.asarray(hess, dtype=np.float64)


def free_coordinates(num_beta: int, shares: FloatArray) -> tuple[FloatArray, int, npt.NDArray[np.intp]]:
    """The linear map T from free coordinates (beta, u) to (beta, pi): the covariate cells with
    pi_x > :data:`BOUNDARY_SHARE` are active; the largest one, r, is eliminated by
    pi_r = 1 - sum of the others, so d pi/d u_x = e_x - e_r for the other active x; cells on
    the boundary stay fixed. Returns T, r and the active cells other than r."""
    x = shares.size
    ref = int(np.argmax(shares))
    free = np.nonzero(shares > BOUNDARY_SHARE)[0]
    free = free[free != ref]
    t = np.zeros((num_beta + x, num_beta + free.size))
    t[:num_beta, :num_beta] = np.eye(num_beta)
    t[num_beta + free, num_beta + np.arange(free.size)] = 1.0
    t[num_beta + ref, num_beta:] = -1.0
    return t, ref, free


def free_information(hessian: FloatArray, num_beta: int, shares: FloatArray) -> FloatArray:
    """The observed information -T' H T in the free coordinates of :func:`free_coordinates`
    (an affine map, so no second-derivative term of T)."""
    t, _, _ = free_coordinates(num_beta, shares)
    return np.asarray(-(t.T @ hessian @ t), dtype=np.float64)


def _newton_polish(
    observed: FloatArray, keep: float, design: FloatArray, state: _State, steps: int = 50
) -> tuple[_State, bool, int]:
    """Newton's method on the observed likelihood in the free coordinates, step halving until the
    likelihood does not decrease and every share stays >= 0. Returns (state, converged, steps)."""
    k1, d = state.beta.shape
    nb = k1 * d
    value = _log_likelihood(observed, keep, design, state)
    for done in range(1, steps + 1):
        grad, hess = observed_score_hessian(observed, keep, design, state.beta, state.shares)
        t, _, _ = free_coordinates(nb, state.shares)
        info = -(t.T @ hess @ t)
        try:
            chol = np.linalg.cholesky(info)
        except np.linalg.LinAlgError:
            return state, False, done
        step = t @ np.linalg.solve(chol.T, np.linalg.solve(chol, t.T @ grad))
        length = 1.0
        while length > 1e-10:
            vec = state.vector() + length * step
            trial = _from_vector(vec, (k1, d))
            if np.all(trial.shares >= 0.0):
                trial_value = _log_likelihood(observed, keep, design, trial)
                if trial_value >= value - 1e-12 * abs(value):
                    break
            length /= 2.0
        else:
            return state, False, done
        state, value = trial, trial_value
        if np.max(np.abs(length * step)) < NEWTON_TOLERANCE:
            return state, True, done
    return state, False, steps


# --- the fit -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFit:
    """A fitted logistic / multinomial model of perturbed counts.

    ``names``: the coefficient names (for Y > 2 each prefixed "y[level] ~ ", level by level);
    ``coef``, ``standard_error``, ``ci_low``, ``ci_high``: per coefficient, Wald intervals at
    ``level``; ``log_likelihood``: the observed-data l = sum o log q at the MLE (no multinomial
    constant); ``num_params``: the beta's plus pi's X - 1 free shares; ``iterations``: SQUAREM
    cycles plus Newton steps; ``observed`` and ``keep``: the table and channel fitted (a deviance
    test compares only fits of one table).
    """

    names: tuple[str, ...]
    coef: FloatArray
    standard_error: FloatArray
    ci_low: FloatArray
    ci_high: FloatArray
    log_likelihood: float
    num_params: int
    iterations: int
    converged: bool
    level: float
    outcome_levels: tuple[str, ...]
    observed: IntArray
    keep: float

    # ------------------------------------------------------------------- reading the fit
    @property
    def m(self) -> int:
        """The records of the fitted table."""
        return int(self.observed.sum())

    @property
    def z_values(self) -> FloatArray:
        """Wald z = coef / standard error (NaN where the standard error is not finite and > 0)."""
        se = self.standard_error
        ok = np.isfinite(se) & (se > 0)
        return np.asarray(np.where(ok, self.coef / np.where(ok, se, 1.0), np.nan), dtype=np.float64)

    @property
    def p_values(self) -> FloatArray:
        """Two-sided Wald p-values 2 P(Z > |z|) (NaN where z is)."""
        return np.asarray([printing.wald_p_value(float(z)) for z in self.z_values], dtype=np.float64)

    @property
    def flat(self) -> npt.NDArray[np.bool_]:
        """Per coefficient: its standard error is above :data:`FLAT_STANDARD_ERROR` or not finite
        (the likelihood is flat along it: see :attr:`not_estimated`)."""
        se = self.standard_error
        return np.asarray(~np.isfinite(se) | (se > FLAT_STANDARD_ERROR), dtype=np.bool_)

    @property
    def not_estimated(self) -> tuple[str, ...]:
        """The coefficients the likelihood does not determine, even where the fit converged: a
        standard error above :data:`FLAT_STANDARD_ERROR` (10) on the logit scale, or not finite
        (the information matrix singular or not positive definite). Typically a covariate level
        with (almost) no records at a small m; the print flags them "not estimated"."""
        return tuple(n for n, f in zip(self.names, self.flat.tolist(), strict=True) if f)

    @property
    def flat_likelihood_warning(self) -> str:
        """Empty, or why some coefficients are not estimated and what to do (:data:`FLAT_LIKELIHOOD`)."""
        names = self.not_estimated
        if not names:
            return ""
        return FLAT_LIKELIHOOD.format(
            names=", ".join(names), them="it" if len(names) == 1 else "them",
            pronoun="it is" if len(names) == 1 else "they are", limit=FLAT_STANDARD_ERROR,
            converged=", although the fit converged" if self.converged else "",
        )

    def columns(self) -> dict[str, list[Any]]:
        """The coefficient table as named columns (for a DataFrame): name, coef, se, z, p_value,
        ci_low, ci_high, not_estimated."""
        return {
            "name": list(self.names),
            "coef": self.coef.tolist(),
            "se": self.standard_error.tolist(),
            "z": self.z_values.tolist(),
            "p_value": self.p_values.tolist(),
            "ci_low": self.ci_low.tolist(),
            "ci_high": self.ci_high.tolist(),
            "not_estimated": self.flat.tolist(),
        }

    def summary_block(
        self, title: str = "", head: tuple[tuple[str, str], ...] = (), notes: tuple[str, ...] = ()
    ) -> printing.Block:
        """The statsmodels-like layout: ``head`` (e.g. the model's formula), then m, the
        log-likelihood, convergence, keep, parameters and the method, then the coefficient table,
        the warnings (not converged; coefficients not estimated) and ``notes``."""
        kind = "Logistic" if len(self.outcome_levels) == 2 else "Multinomial logistic"
        pairs = (
            *head,
            ("Outcome levels", ", ".join(self.outcome_levels)),
            ("m (records)", str(self.m)),
            ("Log-likelihood", printing.sig(self.log_likelihood, 6)),
            ("Converged", "yes" if self.converged else "NO"),
            ("Keep probability a", printing.sig(self.keep)),
            ("Parameters", f"{self.num_params} = {len(self.names)} coef. + {self.num_params - len(self.names)} shares"),
            ("Iterations", str(self.iterations)),
            ("Method", FIT_METHOD),
        )
        lines = []
        if not self.converged:
            lines.append(
                "WARNING: the fit did not converge: the maximum likelihood is at infinity (a separated outcome); "
                "the coefficients and standard errors are not estimates."
            )
        if self.not_estimated:
            lines.append(f"WARNING: {self.flat_likelihood_warning}")
        return printing.coefficient_block(
            title or f"{kind} regression on perturbed counts", pairs, self.names, self.coef.tolist(),
            self.standard_error.tolist(), self.z_values.tolist(), self.p_values.tolist(), self.ci_low.tolist(),
            self.ci_high.tolist(), self.level, self.flat.tolist(), (*lines, *notes),
        )  # fmt: skip

    def __str__(self) -> str:
        return self.summary_block().text()

    def __repr__(self) -> str:
        flag = printing.not_estimated_flag(self.not_estimated)
        return printing.short_repr(
            "ModelFit",
            f"{len(self.names)} coefficients, m = {self.m}, log-likelihood = {printing.sig(self.log_likelihood, 6)}, "
            f"converged = {self.converged}{flag}",
        )

    def _repr_html_(self) -> str:
        return self.summary_block().html()


def wald_interval(coef: FloatArray, standard_error: FloatArray, level: float) -> tuple[FloatArray, FloatArray]:
    """coef -/+ z_{(1 + level)/2} se."""
    z = normal_quantile(0.5 + check_level(level) / 2.0)
    return coef - z * standard_error, coef + z * standard_error


def _check_observed(observed: npt.ArrayLike) -> IntArray:
    arr = np.asarray(observed)
    if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "iuf":
        raise InvalidCountsError(f"observed counts must be a non-empty (Y, X) numeric array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidCountsError("observed counts must be finite")
    ints = arr.astype(np.int64)
    if np.any(ints != arr) or np.any(ints < 0):
        raise InvalidCountsError("observed counts must be non-negative integers")
    if ints.sum() == 0:
        raise InvalidCountsError("observed counts are all zero: there is nothing to fit")
    if ints.shape[0] < 2:
        raise TooFewOutcomeLevelsError(f"the outcome has {ints.shape[0]} level; a regression needs at least 2")
    return ints


def _check_design(design: npt.ArrayLike, cells: int, names: Sequence[str]) -> FloatArray:
    d = np.asarray(design, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != cells or d.shape[1] < 1:
        raise DesignRowsError(f"the design has shape {d.shape}; it needs one row per covariate cell ({cells})")
    if not np.all(np.isfinite(d)):
        raise NonFiniteInputError("the design matrix has non-finite entries")
    if len(names) != d.shape[1]:
        raise DesignRowsError(f"{len(names)} coefficient names for {d.shape[1]} design columns")
    if np.linalg.matrix_rank(d) < d.shape[1]:
        raise RankDeficientDesignError(
            f"the design's {d.shape[1]} columns have rank {np.linalg.matrix_rank(d)}: some coefficient "
            "is not identified; drop or merge a column"
        )
    return d


def maximize_likelihood(observed: FloatArray, keep: float, design: FloatArray) -> tuple[_State, int, bool]:
    """The MLE of (beta, pi), from :func:`_start`, in rounds: SQUAREM cycles (at most
    :data:`ROUND_CYCLES`) until the EM residual is below the tolerance (:data:`NEWTON_START`),
    then Newton on the observed likelihood. Newton converging ends the fit; a failed Newton
    tightens the tolerance to :data:`EM_TOLERANCE` (EM reaching it ends the fit). A fitted
    log-odds past :data:`SEPARATION_LOG_ODDS`, or :data:`MAX_CYCLES` cycles, ends it not
    converged. Returns (state, SQUAREM cycles + Newton steps, converged)."""
    state = _start(observed, keep, design)
    cycles, steps, tolerance = 0, 0, NEWTON_START
    while cycles < MAX_CYCLES:
        residual = math.inf
        for _ in range(ROUND_CYCLES):
            state, residual = squarem_cycle(observed, keep, design, state)
            cycles += 1
            if residual < tolerance or _separated(design, state.beta):
                break
        if _separated(design, state.beta):
            return state, cycles + steps, False
        state, newton_done, done = _newton_polish(observed, keep, design, state)
        steps += done
        if _separated(design, state.beta):
            return state, cycles + steps, False
        if newton_done or residual < EM_TOLERANCE:
            return state, cycles + steps, True
        if residual < tolerance:
            tolerance = EM_TOLERANCE
    return state, cycles + steps, False


def _separated(design: FloatArray, beta: FloatArray) -> bool:
    """Some fitted log-odds d(x) . beta_k beyond +-:data:`SEPARATION_LOG_ODDS`."""
    return bool(np.max(np.abs(beta @ design.T)) > SEPARATION_LOG_ODDS)


def _start(observed: FloatArray, keep: float, design: FloatArray) -> _State:
    """Start: the saturated MLE of the Y X joint (water filling, closed form), mixed with 1% of
    the uniform table so no cell starts at 0; pi its covariate margin, beta its M-step fit."""
    y, x = observed.shape
    p = 0.99 * mle_water_filling(observed.reshape(-1), keep).reshape(y, x) + 0.01 / observed.size
    fit = fit_outcome_model(p * observed.sum(), design, np.zeros((y - 1, design.shape[1])))
    return _State(fit.beta, p.sum(axis=0))


def fit_logistic(
    observed: npt.ArrayLike,
    keep: float,
    design: npt.ArrayLike,
    *,
    outcome_levels: Sequence[str],
    names: Sequence[str],
    level: float = 0.95,
) -> ModelFit:
    """The maximum-likelihood logistic (Y = 2: level 2 against level 1) or baseline-category
    multinomial (Y > 2: each level against the first) fit of perturbed counts (DESIGN 11).

    ``observed``: integer counts (Y, X), columns the covariate cells; ``design``: (X, D) rows
    d(x) (e.g. :func:`design_matrix`, rows may repeat when the table has cells the model
    ignores); ``names``: the D column names.

    Fitting: SQUAREM cycles of EM (:func:`squarem_cycle`) until the EM residual is below
    :data:`NEWTON_START`, then Newton on the observed likelihood (:func:`observed_score_hessian`,
    :func:`_newton_polish`) until its step is below :data:`NEWTON_TOLERANCE`; should Newton fail
    (information not positive definite, no ascent), SQUAREM goes on to :data:`EM_TOLERANCE`,
    with Newton tried again after every :data:`ROUND_CYCLES` cycles (:func:`maximize_likelihood`).
    Measured (keep 0.45, m = 1000, 6 covariate cells, 4 coefficients): ~6 cycles + steps, ~5-10 ms
    a fit. ``converged`` is False when neither
    stopped by its tolerance within :data:`MAX_CYCLES` cycles, or when a fitted log-odds passed
    :data:`SEPARATION_LOG_ODDS` (the MLE is at infinity: a separated outcome; the coefficients
    are then where the fit stopped and their intervals mean nothing).

    Standard errors: the observed information -T' H T, H the analytic Hessian of the observed
    log-likelihood in (beta, pi) at the MLE, T the map from the free coordinates (beta and the
    X - 1 free shares; shares on the boundary held fixed; :func:`free_coordinates`), inverted;
    the beta block of the inverse (so the uncertainty of pi is accounted for). At a = 1 this is
    the ordinary logistic fit's information (the likelihood separates in pi and beta). Wald
    intervals at ``level``. SEs are NaN when the information is not positive definite (at a
    separated fit they are NaN or huge).
    """
    obs_int = _check_observed(observed)
    a = check_keep(keep)
    lvl = check_level(level)
    y, x = obs_int.shape
    if len(outcome_levels) != y:
        raise ShapeMismatchError(f"{len(outcome_levels)} outcome level names for {y} outcome rows")
    d = _check_design(design, x, names)
    seen = obs_int.sum(axis=0) > 0
    if a == 1.0 and np.linalg.matrix_rank(d[seen]) < d.shape[1]:
        raise RankDeficientDesignError(
            f"at keep = 1 only the {int(seen.sum())} covariate cells with records inform the fit, and "
            "their design rows are not of full column rank: drop or merge a column"
        )
    obs = obs_int.astype(np.float64)
    state, iterations, converged = maximize_likelihood(obs, a, d)
    nb = state.beta.size
    _, hess = observed_score_hessian(obs, a, d, state.beta, state.shares)
    info = free_information(hess, nb, state.shares)
    se = _standard_errors(info, nb)
    coef = state.beta.reshape(-1).copy()
    low, high = wald_interval(coef, se, lvl)
    levels = tuple(str(v) for v in outcome_levels)
    labels = list(names) if y == 2 else [f"y[{lv}] ~ {n}" for lv in levels[1:] for n in names]
    return ModelFit(
        names=tuple(labels),
        coef=coef,
        standard_error=se,
        ci_low=low,
        ci_high=high,
        log_likelihood=_log_likelihood(obs, a, d, state),
        num_params=nb + x - 1,
        iterations=iterations,
        converged=bool(converged),
        level=lvl,
        outcome_levels=levels,
        observed=obs_int,
        keep=a,
    )


def _standard_errors(info: FloatArray, num_beta: int) -> FloatArray:
    """sqrt of the beta block's diagonal of info^-1 (through the Cholesky factor L: the diagonal
    of info^-1 = L^-T L^-1 is the column sums of squares of L^-1); NaN when info is not finite
    and positive definite."""
    if not np.all(np.isfinite(info)):
        return np.full(num_beta, np.nan)
    try:
        chol = np.linalg.cholesky(info)
        inverse = np.linalg.solve(chol, np.eye(info.shape[0]))
    except np.linalg.LinAlgError:
        return np.full(num_beta, np.nan)
    variance = np.sum(inverse[:, :num_beta] ** 2, axis=0)
    return np.asarray(np.where(np.isfinite(variance), np.sqrt(variance), np.nan), dtype=np.float64)


def deviance_test(reduced: ModelFit, full: ModelFit) -> tuple[float, int, float]:
    """The likelihood-ratio (deviance) test of a reduced model nested in a full one, both fitted
    to the same observed table: G = 2 (l_full - l_reduced), df = the difference in parameters,
    p = P(chi-square(df) >= G) (asymptotic; Wilks).

    Refuses fits of different tables or keep probabilities (:class:`DifferentTablesError`), and
    pairs that are not nested (:class:`NotNestedModelsError`): the reduced fit must have fewer
    parameters, its coefficient names a subset of the full fit's, the same outcome levels, and a
    log-likelihood not above the full fit's (beyond 1e-6 relative; G is clamped to >= 0 there).
    """
    if (
        reduced.observed.shape != full.observed.shape
        or not np.array_equal(reduced.observed, full.observed)
        or reduced.keep != full.keep
    ):
        raise DifferentTablesError(
            "the two fits are of different observed tables or keep probabilities; a deviance test "
            "compares two models of the same table"
        )
    df = full.num_params - reduced.num_params
    if df < 1 or reduced.outcome_levels != full.outcome_levels or not set(reduced.names) <= set(full.names):
        raise NotNestedModelsError(
            f"the reduced fit ({reduced.num_params} parameters) is not nested in the full fit "
            f"({full.num_params}): it must have fewer parameters, the same outcome levels and a "
            "subset of the full fit's coefficients"
        )
    g = 2.0 * (full.log_likelihood - reduced.log_likelihood)
    if g < 0.0:
        if g < -1e-6 * max(1.0, abs(full.log_likelihood)):
            raise NotNestedModelsError(
                f"the full fit's log-likelihood ({full.log_likelihood}) is below the reduced fit's "
                f"({reduced.log_likelihood}): the models are not nested or a fit did not converge"
            )
        g = 0.0
    return float(g), int(df), float(stats.chi2.sf(g, df))
