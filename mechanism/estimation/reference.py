"""Reference implementations, kept only to cross-check the production code in the tests.

Nothing in a release calls these. Each is the slow, obvious version of something the
production modules compute another way:

- :func:`estimate_mle`, :func:`estimate_mle_batch`: the maximum-likelihood estimate by EM
  (iterative Bayesian update), one table or row-wise; production uses the closed form
  :func:`~secure_release.mechanism.estimation.estimators.mle_water_filling`, which equals EM's fixed point.
- :func:`confidence_intervals`: the normal (Wald) interval, for comparison with the exact
  intervals of :func:`~secure_release.mechanism.estimation.estimators.cell_intervals`.
- :func:`marginal_codes`: a marginal's codes from the decrypted columns, the row-level reference
  for :func:`~secure_release.mechanism.estimation.estimators.marginal_counts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import NonFiniteInputError, ShapeMismatchError
from secure_release.mechanism.estimation.estimators import Z_95, FloatArray, MleResult, _check_subset
from secure_release.mechanism.schema import CodeArray, mixed_radix_encode

IntArray = npt.NDArray[np.int64]


def estimate_mle(
    counts: npt.ArrayLike,
    keep: float,
    tolerance: float = 1e-10,
    max_iterations: int = 10_000,
) -> MleResult:
    """Maximum likelihood of T given observed counts, by EM (iterative Bayesian update).

    Channel on K cells: P(obs = o | true = c) = a [o = c] + (1 - a)/K. With p the current
    estimate and (A p)(o) = a p(o) + (1 - a)/K, one EM step is
        p'(c) = p(c) [a N_c / (A p)(c) + ((1 - a)/K) sum_o N_o/(A p)(o)] / N,
    which stays on the simplex and never decreases the likelihood. Start: the uniform
    distribution. Stop when max_c |p' - p| < ``tolerance`` (then ``converged``) or after
    ``max_iterations`` steps. O(K) per step.
    """
    n_obs = np.asarray(counts, dtype=np.float64)
    total = n_obs.sum()
    if total <= 0 or not np.all(np.isfinite(n_obs)) or np.any(n_obs < 0):
        raise NonFiniteInputError("MLE needs non-negative finite counts with a positive total")
    K = n_obs.size
    background = (1.0 - keep) / K
    p = np.full(K, 1.0 / K)
    converged = False
    iterations = 0
    for iterations in range(1, max_iterations + 1):  # noqa: B007 (iterations reported)
        mixed = keep * p + background
        ratio = n_obs / mixed
        new = p * (keep * ratio + background * ratio.sum()) / total
        step = float(np.max(np.abs(new - p)))
        p = new
        if step < tolerance:
            converged = True
            break
    mixed = keep * p + background
    positive = n_obs > 0
    log_lik = float(np.sum(n_obs[positive] * np.log(mixed[positive])))
    return MleResult(p, iterations, converged, log_lik)


@dataclass(frozen=True)
class MleBatch:
    """Row-wise EM results: estimates (rows, K), iterations and converged flags per row."""

    estimate: FloatArray
    iterations: IntArray
    converged: npt.NDArray[np.bool_]


def estimate_mle_batch(
    counts: npt.ArrayLike, keep: float, tolerance: float = 1e-10, max_iterations: int = 10_000
) -> MleBatch:
    """Row-wise :func:`mechanism.estimation.estimators.estimate_mle`: the same EM step, start (uniform) and
    stopping rule (max_c |p' - p| < tolerance, per row); converged rows leave the active set."""
    n_obs = np.asarray(counts, dtype=np.float64)
    if n_obs.ndim != 2:
        raise ShapeMismatchError("batched MLE needs a (rows, K) array of counts")
    totals = n_obs.sum(axis=1)
    if np.any(totals <= 0) or not np.all(np.isfinite(n_obs)) or np.any(n_obs < 0):
        raise NonFiniteInputError("MLE needs non-negative finite counts with a positive total")
    rows, K = n_obs.shape
    background = (1.0 - keep) / K
    p = np.full((rows, K), 1.0 / K)
    iterations = np.full(rows, max_iterations, dtype=np.int64)
    converged = np.zeros(rows, dtype=bool)
    active = np.arange(rows)
    pa, na, ta = p.copy(), n_obs, totals[:, None]
    nxt, mixed, ratio = np.empty_like(pa), np.empty_like(pa), np.empty_like(pa)
    for it in range(1, max_iterations + 1):
        # the arithmetic of estimate_mle, in place: mixed = a p + bg; ratio = N / mixed;
        # new = p (a ratio + bg sum(ratio)) / N_total
        np.multiply(pa, keep, out=mixed)
        mixed += background
        np.divide(na, mixed, out=ratio)
        scaled_sum = ratio.sum(axis=1, keepdims=True) * background
        ratio *= keep
        ratio += scaled_sum
        np.multiply(pa, ratio, out=nxt)
        nxt /= ta
        np.subtract(nxt, pa, out=mixed)
        np.abs(mixed, out=mixed)
        done = mixed.max(axis=1) < tolerance
        pa, nxt = nxt, pa
        if done.any():
            finished = active[done]
            p[finished] = pa[done]
            iterations[finished] = it
            converged[finished] = True
            left = ~done
            active, pa, na, ta = active[left], pa[left], na[left], ta[left]
            if active.size == 0:
                break
            nxt, mixed, ratio = np.empty_like(pa), np.empty_like(pa), np.empty_like(pa)
    if active.size:
        p[active] = pa
    return MleBatch(p, iterations, converged)


def confidence_intervals(
    estimate: npt.ArrayLike, errors: npt.ArrayLike, z: float = Z_95
) -> tuple[FloatArray, FloatArray]:
    """Normal-approximation (Wald) intervals estimate -+ z * standard error (95% by default).

    Kept for comparison only: it under-covers badly when a cell's expected observed count is
    small (e.g. 45% coverage for some cells of a K = 1000 Zipf table at m*). Use
    :func:`cell_intervals` (default Clopper-Pearson) for reported intervals."""
    est = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(errors, dtype=np.float64)
    return est - z * se, est + z * se


def marginal_codes(
    columns: Sequence[npt.NDArray[np.integer]],
    alphabet_sizes: Sequence[int],
    keep_curators: Sequence[int],
) -> CodeArray:
    """Codes on the sub-alphabet of ``keep_curators`` from their decrypted columns."""
    _check_subset(keep_curators, len(alphabet_sizes))
    return mixed_radix_encode([columns[j] for j in keep_curators], [alphabet_sizes[j] for j in keep_curators])
