"""Estimating the joint type from decrypted, perturbed rows (Sec. III-A release; DESIGN 3.5-3.6).

Every estimator here is O(K) time and memory: the gamma-diagonal structure A = a I + b J makes
A^-1 closed-form, so no K x K matrix is ever built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.accounting import cell_variance, channel_cell_variance
from secure_release.mechanism.errors import NonFiniteInputError, ShapeMismatchError
from secure_release.mechanism.pram import PramChannel
from secure_release.mechanism.schema import CodeArray, check_joint_alphabet, mixed_radix_decode, mixed_radix_encode

FloatArray = npt.NDArray[np.float64]
Z_95 = 1.959963984540054


def observed_counts(codes: npt.ArrayLike, joint_size: int) -> npt.NDArray[np.int64]:
    """Histogram of joint codes over Z_K (bincount; codes must lie in [0, K))."""
    arr = np.asarray(codes, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= joint_size):
        raise ShapeMismatchError(f"joint codes must lie in [0, {joint_size})")
    return np.bincount(arr, minlength=joint_size).astype(np.int64)


def invert_channel(observed_type: npt.ArrayLike, keep: float, off_diagonal: float) -> FloatArray:
    """A^-1 T_obs in closed form (Sec. III-A, T_hat = A^-1 T): (T_obs - b)/a.

    For A = a I + b J and sum(T_obs) = 1: A^-1 = (I - b/(a + K b) J)/a, and a + K b = 1, so
    A^-1 T_obs = (T_obs - b)/a.
    """
    t = np.asarray(observed_type, dtype=np.float64)
    if not np.all(np.isfinite(t)):
        raise NonFiniteInputError("the observed type has non-finite entries")
    return np.asarray((t - off_diagonal) / keep, dtype=np.float64)


def estimate_joint(counts: npt.ArrayLike, channel: PramChannel) -> FloatArray:
    """The paper's estimator T_hat = A^-1 T_obs from observed joint counts (O(K))."""
    c = np.asarray(counts, dtype=np.float64)
    if c.size != channel.joint_size:
        raise ShapeMismatchError(f"{c.size} counts for a joint alphabet of {channel.joint_size}")
    total = c.sum()
    if total <= 0:
        raise ShapeMismatchError("no observed rows: cannot estimate from an empty sample")
    return invert_channel(c / total, channel.keep, channel.off_diagonal)


def marginal_counts(
    counts: npt.ArrayLike, alphabet_sizes: Sequence[int], keep_curators: Sequence[int]
) -> npt.NDArray[np.int64]:
    """Counts of the joint table summed onto the curators in ``keep_curators`` (in that order)."""
    c = np.asarray(counts)
    check_joint_alphabet(alphabet_sizes)
    if c.size != int(np.prod(alphabet_sizes)):
        raise ShapeMismatchError(f"{c.size} counts for alphabets {list(alphabet_sizes)}")
    _check_subset(keep_curators, len(alphabet_sizes))
    table = c.reshape(tuple(int(k) for k in alphabet_sizes))
    drop = tuple(j for j in range(len(alphabet_sizes)) if j not in keep_curators)
    summed = table.sum(axis=drop) if drop else table
    kept_sorted = sorted(keep_curators)
    order = [kept_sorted.index(j) for j in keep_curators]
    return np.asarray(np.transpose(summed, order).reshape(-1), dtype=np.int64)


def marginal_codes(
    columns: Sequence[npt.NDArray[np.integer]],
    alphabet_sizes: Sequence[int],
    keep_curators: Sequence[int],
) -> CodeArray:
    """Codes on the sub-alphabet of ``keep_curators`` from their decrypted columns."""
    _check_subset(keep_curators, len(alphabet_sizes))
    return mixed_radix_encode(
        [columns[j] for j in keep_curators], [alphabet_sizes[j] for j in keep_curators]
    )


def estimate_marginal(counts_on_subset: npt.ArrayLike, channel: PramChannel) -> FloatArray:
    """DESIGN 3.5: on a sub-alphabet of size K_S the channel is "keep w.p. a, else uniform",
    so T_hat_S = (T_obs_S - (1 - a)/K_S)/a."""
    c = np.asarray(counts_on_subset, dtype=np.float64)
    total = c.sum()
    if total <= 0:
        raise ShapeMismatchError("no observed rows: cannot estimate from an empty sample")
    sub_size = c.size
    a = channel.keep
    return np.asarray((c / total - (1.0 - a) / sub_size) / a, dtype=np.float64)


def _check_subset(keep_curators: Sequence[int], num_curators: int) -> None:
    if (
        not keep_curators
        or len(set(keep_curators)) != len(keep_curators)
        or any(not 0 <= j < num_curators for j in keep_curators)
    ):
        raise ShapeMismatchError(
            f"curator subset {list(keep_curators)} must be distinct indices in [0, {num_curators})"
        )


def standard_errors(estimate: npt.ArrayLike, n: int, m: int, channel: PramChannel) -> FloatArray:
    """Per-cell standard errors: sqrt of DESIGN 3's per-cell variance at the estimate
    (clipped to [0, 1] as the plug-in share)."""
    t = np.clip(np.asarray(estimate, dtype=np.float64), 0.0, 1.0)
    return np.sqrt(cell_variance(n, m, channel.joint_size, channel.gamma, t))


def marginal_standard_errors(
    estimate: npt.ArrayLike, n: int, m: int, channel: PramChannel
) -> FloatArray:
    """Per-cell standard errors on a sub-alphabet: the same formula with K_S and the channel
    keep a, replace-uniform on K_S (b_S = (1 - a)/K_S)."""
    t = np.asarray(estimate, dtype=np.float64)
    a = channel.keep
    return np.sqrt(channel_cell_variance(n, m, a, (1.0 - a) / t.size, t))


def confidence_intervals(
    estimate: npt.ArrayLike, errors: npt.ArrayLike, z: float = Z_95
) -> tuple[FloatArray, FloatArray]:
    """Normal-approximation intervals estimate -+ z * standard error (95% by default)."""
    est = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(errors, dtype=np.float64)
    return est - z * se, est + z * se


def project_to_simplex(vector: npt.ArrayLike) -> FloatArray:
    """Euclidean projection onto {p >= 0, sum p = 1} (sort-based; Held et al. 1974,
    Duchi et al. 2008). Post-processing, so free under DP; it never increases the l2 error."""
    v = np.asarray(vector, dtype=np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise NonFiniteInputError("projection needs a non-empty finite vector")
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1.0
    ranks = np.arange(1, v.size + 1)
    rho = int(np.nonzero(u - cumulative / ranks > 0)[0][-1])
    theta = cumulative[rho] / (rho + 1)
    return np.asarray(np.maximum(v - theta, 0.0), dtype=np.float64)


@dataclass(frozen=True)
class MleResult:
    """An EM / iterative Bayesian update result with its stopping information."""

    estimate: FloatArray
    iterations: int
    converged: bool
    log_likelihood: float


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


def mle_water_filling(counts: npt.ArrayLike, keep: float) -> FloatArray:
    """The exact maximum-likelihood estimate under the gamma-diagonal channel, in closed form.

    Maximize L(p) = sum_o N_o log(a p_o + g), g = (1 - a)/K, over the simplex. L is concave;
    its KKT conditions are a N_o/(a p_o + g) = lambda where p_o > 0 and a N_o/g <= lambda where
    p_o = 0. So p_o = max(0, N_o/lambda' - r) with r = g/a and lambda' = lambda/a, and on the
    active set S (the cells with the largest counts) sum p = 1 gives
    lambda' = N_S / (1 + |S| r). S has size s*, the largest s with N_(s) (1 + s r) > r N_(1..s)
    (counts sorted in decreasing order) -- water filling, like the simplex projection.
    Interior case (S = all cells): lambda' = N a and p = (T_obs - g)/a, the A^-1 estimate.
    Works row-wise on a (rows, K) array; O(K log K) per row, no iteration.
    """
    n_obs = np.asarray(counts, dtype=np.float64)
    if n_obs.size == 0 or not np.all(np.isfinite(n_obs)) or np.any(n_obs < 0):
        raise NonFiniteInputError("MLE needs non-negative finite counts")
    if not 0.0 < keep <= 1.0:
        raise NonFiniteInputError(f"keep probability must be in (0, 1], got {keep!r}")
    rows = n_obs.reshape(-1, n_obs.shape[-1])
    if np.any(rows.sum(axis=1) <= 0):
        raise NonFiniteInputError("MLE needs a positive total count")
    K = rows.shape[1]
    r = (1.0 - keep) / K / keep
    ordered = -np.sort(-rows, axis=1)
    cumulative = np.cumsum(ordered, axis=1)
    sizes = np.arange(1, K + 1, dtype=np.float64)
    active = ordered * (1.0 + sizes * r) > r * cumulative
    s_star = K - np.argmax(active[:, ::-1], axis=1)  # last True (s = 1 is always active)
    lam = cumulative[np.arange(rows.shape[0]), s_star - 1] / (1.0 + s_star * r)
    p = np.maximum(rows / lam[:, None] - r, 0.0)
    p /= p.sum(axis=1, keepdims=True)  # exact up to rounding; removes the last ulp drift
    return np.asarray(p.reshape(n_obs.shape), dtype=np.float64)


def estimate_mle_exact(counts: npt.ArrayLike, keep: float) -> MleResult:
    """:func:`mle_water_filling` with its log-likelihood, as an :class:`MleResult`
    (``iterations`` 0: no iteration is needed)."""
    n_obs = np.asarray(counts, dtype=np.float64)
    p = mle_water_filling(n_obs, keep)
    mixed = keep * p + (1.0 - keep) / n_obs.size
    positive = n_obs > 0
    log_lik = float(np.sum(n_obs[positive] * np.log(mixed[positive])))
    return MleResult(p, 0, True, log_lik)


def l2_error(estimate: npt.ArrayLike, truth: npt.ArrayLike) -> float:
    """||estimate - truth||_2."""
    return float(
        np.linalg.norm(np.asarray(estimate, dtype=np.float64) - np.asarray(truth, dtype=np.float64))
    )


def split_cells(codes: npt.NDArray[np.integer], alphabet_sizes: Sequence[int]) -> list[CodeArray]:
    """Per-curator digits of joint cell codes."""
    return mixed_radix_decode(codes, alphabet_sizes)
