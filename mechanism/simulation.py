"""Monte Carlo simulation of the release at count level (Sec. IV; DESIGN 3).

Two paths with one distribution of the observed joint counts:

* **fast path** (:func:`fast_observed_counts`), vectorized over trials:
  the sample's cell counts are multivariate hypergeometric (m of the n records without
  replacement); PRAM at count level keeps Binomial(s_c, a) of the s_c sampled rows of cell c,
  and the R = m - sum kept replaced rows land on cells by a Multinomial(R, uniform over K).
  Given the sample this is exactly the law of the per-record channel (each row independently
  kept w.p. a, else a uniform cell), summed per cell.
* **per-record path** (:func:`per_record_observed_counts`): the real mechanism per trial,
  mechanism.sampling.sample_positions + mechanism.pads (encrypt, cancels exactly on decrypt)
  + mechanism.pram.perturb, then a histogram.

Estimators reuse mechanism.estimators (A^-1 closed form, marginal inversion); the batched
projection and EM here are row-by-row equal to project_to_simplex / estimate_mle (tested).
numpy's Generator drives the fast path: this is a simulation, never a release.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism import accounting
from secure_release.mechanism.errors import NonFiniteInputError, ShapeMismatchError
from secure_release.mechanism.estimators import invert_channel, mle_water_filling
from secure_release.mechanism.pram import PramChannel
from secure_release.mechanism.sampling import check_sample_size
from secure_release.mechanism.schema import check_joint_alphabet

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ESTIMATORS = ("raw", "projected", "mle")
_SUFFIX = {"raw": "", "projected": "_projected", "mle": "_mle"}


def check_counts(counts: npt.ArrayLike) -> IntArray:
    """A 1-D vector of non-negative integer cell counts with a positive total."""
    c = np.asarray(counts)
    if c.ndim != 1 or c.size < 2:
        raise ShapeMismatchError(
            f"counts must be a vector of at least 2 cells, got shape {c.shape}"
        )
    if not np.all(np.isfinite(c.astype(np.float64))):
        raise NonFiniteInputError("counts must be finite")
    if np.any(c < 0) or np.any(np.asarray(c, dtype=np.float64) != np.floor(c.astype(np.float64))):
        raise ShapeMismatchError("counts must be integers >= 0")
    ci = c.astype(np.int64)
    if ci.sum() < 1:
        raise ShapeMismatchError("counts must have a positive total")
    return ci


def fast_observed_counts(
    counts: npt.ArrayLike, m: int, keep: float, trials: int, rng: np.random.Generator
) -> IntArray:
    """Observed joint counts after sampling m of n and PRAM, for ``trials`` trials: (trials, K)."""
    c = check_counts(counts)
    check_sample_size(int(c.sum()), m)
    K = c.size
    sample = rng.multivariate_hypergeometric(c, m, size=trials)
    kept = rng.binomial(sample, keep)
    replaced = m - kept.sum(axis=1)
    spread = rng.multinomial(replaced, np.full(K, 1.0 / K))
    return np.asarray(kept + spread, dtype=np.int64)


def records_from_counts(counts: npt.ArrayLike) -> IntArray:
    """The n records (joint codes) of a count table, cell by cell."""
    c = check_counts(counts)
    return np.repeat(np.arange(c.size, dtype=np.int64), c)


def per_record_observed_counts(
    counts: npt.ArrayLike,
    alphabet_sizes: Sequence[int],
    m: int,
    channel: PramChannel,
    trials: int,
    rng: np.random.Generator,
    encrypt: bool = True,
) -> IntArray:
    """Observed joint counts from the real per-record mechanism, one trial at a time."""
    from secure_release.mechanism.estimators import observed_counts
    from secure_release.mechanism.keys import PramKey, Seed
    from secure_release.mechanism.pads import CipherMode, new_release_pad
    from secure_release.mechanism.pram import perturb
    from secure_release.mechanism.sampling import sample_positions
    from secure_release.mechanism.schema import joint_codes, split_joint

    records = records_from_counts(counts)
    sizes = [int(k) for k in alphabet_sizes]
    if check_joint_alphabet(sizes) != len(np.asarray(counts)):
        raise ShapeMismatchError(f"alphabets {sizes} do not match {len(np.asarray(counts))} cells")
    n = records.size
    check_sample_size(n, m)
    out = np.empty((trials, channel.joint_size), dtype=np.int64)
    for t in range(trials):
        seed = Seed(rng.bytes(32))
        positions = sample_positions(seed, n, m)
        columns = split_joint(records[positions], sizes)
        if encrypt:
            pads = [new_release_pad(CipherMode.CHACHA20, k, m) for k in sizes]
            cipher = [p.encrypt(col) for p, col in zip(pads, columns, strict=True)]
            noisy = perturb(cipher, sizes, channel, PramKey(rng.bytes(32)))
            plain = [p.decrypt(col) for p, col in zip(pads, noisy, strict=True)]
        else:
            plain = perturb(columns, sizes, channel, PramKey(rng.bytes(32)))
        out[t] = observed_counts(joint_codes(plain, sizes), channel.joint_size)
    return out


def project_to_simplex_batch(vectors: npt.ArrayLike) -> FloatArray:
    """Row-wise :func:`mechanism.estimators.project_to_simplex` (same sort-based rule)."""
    v = np.asarray(vectors, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] == 0 or not np.all(np.isfinite(v)):
        raise NonFiniteInputError("batched projection needs a finite (rows, K) array")
    rows, K = v.shape
    u = -np.sort(-v, axis=1)
    cumulative = np.cumsum(u, axis=1) - 1.0
    ranks = np.arange(1, K + 1)
    positive = u - cumulative / ranks > 0
    rho = K - 1 - np.argmax(positive[:, ::-1], axis=1)
    theta = cumulative[np.arange(rows), rho] / (rho + 1)
    return np.asarray(np.maximum(v - theta[:, None], 0.0), dtype=np.float64)


@dataclass(frozen=True)
class MleBatch:
    """Row-wise EM results: estimates (rows, K), iterations and converged flags per row."""

    estimate: FloatArray
    iterations: IntArray
    converged: npt.NDArray[np.bool_]


def estimate_mle_batch(
    counts: npt.ArrayLike, keep: float, tolerance: float = 1e-10, max_iterations: int = 10_000
) -> MleBatch:
    """Row-wise :func:`mechanism.estimators.estimate_mle`: the same EM step, start (uniform) and
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


def marginal_axes(alphabet_sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """For each curator j, the axes of the (trials, k_1, ..., k_N) array to sum away."""
    N = len(alphabet_sizes)
    return [tuple(1 + i for i in range(N) if i != j) for j in range(N)]


def trial_errors(
    observed: npt.ArrayLike,
    truth: npt.ArrayLike,
    channel: PramChannel,
    alphabet_sizes: Sequence[int] | None = None,
    estimators: Sequence[str] = ESTIMATORS,
) -> dict[str, FloatArray]:
    """Per-trial l2 errors of each estimator (and of each curator's marginal A^-1 estimate)."""
    obs = np.asarray(observed, dtype=np.float64)
    t = np.asarray(truth, dtype=np.float64)
    m = obs.sum(axis=1, keepdims=True)
    a, b = channel.keep, channel.off_diagonal
    raw = invert_channel(obs / m, a, b)
    out: dict[str, FloatArray] = {}
    if "raw" in estimators:
        out["raw"] = np.linalg.norm(raw - t, axis=1)
    if "projected" in estimators:
        out["projected"] = np.linalg.norm(project_to_simplex_batch(raw) - t, axis=1)
    if "mle" in estimators:
        out["mle"] = np.linalg.norm(mle_water_filling(obs, a) - t, axis=1)
    if alphabet_sizes is not None and len(alphabet_sizes) > 1:
        shape = (obs.shape[0], *[int(k) for k in alphabet_sizes])
        cube, true_cube = obs.reshape(shape), t.reshape(shape[1:])
        for j, axes in enumerate(marginal_axes(alphabet_sizes)):
            k_s = int(alphabet_sizes[j])
            est = invert_channel(cube.sum(axis=axes) / m, a, (1.0 - a) / k_s)
            true_marg = true_cube.sum(axis=tuple(x - 1 for x in axes))
            out[f"marginal_{j}"] = np.linalg.norm(est - true_marg, axis=1)
    return out


def _mean_se(x: FloatArray) -> tuple[float, float]:
    se = float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")
    return float(np.mean(x)), se


@dataclass
class SimulationPoint:
    """One (epsilon, m) point: parameters, per-trial errors and their summary."""

    epsilon: float
    m: int
    gamma: float
    n: int
    joint_size: int
    sum_sq: float
    errors: dict[str, FloatArray] = field(repr=False)

    def summary(self) -> dict[str, Any]:
        n, m, K, g = self.n, self.m, self.joint_size, self.gamma
        out: dict[str, Any] = {"epsilon": self.epsilon, "m": m, "gamma": g}
        out["trials"] = int(next(iter(self.errors.values())).size)
        for name in ESTIMATORS:
            key = "mean_l2_error" + _SUFFIX[name]
            if name in self.errors:
                out[key], out["se_" + key] = _mean_se(self.errors[name])
            else:
                out[key] = out["se_" + key] = None
        if "raw" in self.errors:
            out["rmse_l2_error"] = float(np.sqrt(np.mean(self.errors["raw"] ** 2)))
        margs = sorted(k for k in self.errors if k.startswith("marginal_"))
        if margs:
            stats = [_mean_se(self.errors[k]) for k in margs]
            out["mean_l2_error_marginals"] = [s[0] for s in stats]
            out["se_mean_l2_error_marginals"] = [s[1] for s in stats]
        out["predicted_rmse"] = accounting.predicted_rmse(n, m, K, g, self.sum_sq)
        out["bound"] = accounting.error_bound(m, K, g)
        out["bound_tight"] = accounting.error_bound_tight(m, K, g)
        return out


def sum_of_squared_shares(counts: npt.ArrayLike) -> float:
    c = check_counts(counts).astype(np.float64)
    return float(np.sum((c / c.sum()) ** 2))


def simulate_point(
    counts: npt.ArrayLike,
    epsilon: float,
    m: int,
    trials: int,
    rng: np.random.Generator,
    alphabet_sizes: Sequence[int] | None = None,
    estimators: Sequence[str] = ESTIMATORS,
    per_record: bool = False,
    chunk: int = 1000,
) -> SimulationPoint:
    """Simulate ``trials`` releases at (epsilon, m) on a count table; gamma from Eq. (2)."""
    c = check_counts(counts)
    n, K = int(c.sum()), c.size
    if alphabet_sizes is not None and check_joint_alphabet(alphabet_sizes) != K:
        raise ShapeMismatchError(f"alphabets {list(alphabet_sizes)} do not multiply to K = {K}")
    if isinstance(trials, bool) or int(trials) != trials or trials < 1:
        raise ShapeMismatchError(f"trials must be an integer >= 1, got {trials!r}")
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown or not estimators:
        raise ShapeMismatchError(f"unknown estimator(s) {unknown}; choose from {list(ESTIMATORS)}")
    gamma = accounting.gamma_from_epsilon(n, m, epsilon)
    channel = PramChannel(gamma, K)
    truth = c / n
    parts: list[dict[str, FloatArray]] = []
    for lo in range(0, int(trials), chunk):
        size = min(chunk, int(trials) - lo)
        if per_record:
            sizes = alphabet_sizes if alphabet_sizes is not None else [K]
            obs = per_record_observed_counts(c, sizes, m, channel, size, rng)
        else:
            obs = fast_observed_counts(c, m, channel.keep, size, rng)
        parts.append(trial_errors(obs, truth, channel, alphabet_sizes, estimators))
    errors = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return SimulationPoint(float(epsilon), int(m), gamma, n, K, sum_of_squared_shares(c), errors)


def sweep(
    counts: npt.ArrayLike,
    points: Sequence[tuple[float, int]],
    trials: int,
    rng: np.random.Generator,
    alphabet_sizes: Sequence[int] | None = None,
    estimators: Sequence[str] = ESTIMATORS,
    per_record: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[SimulationPoint]:
    """:func:`simulate_point` over (epsilon, m) points, in order."""
    out = []
    for i, (eps, m) in enumerate(points):
        out.append(
            simulate_point(counts, eps, m, trials, rng, alphabet_sizes, estimators, per_record)
        )
        if progress is not None:
            progress(i + 1, len(points))
    return out


def log_m_grid(n: int, m_star: int, num: int = 24, extra: Sequence[int] = ()) -> list[int]:
    """A log-spaced integer grid of sample sizes from ~m*/20 to n (plus ``extra``)."""
    check_sample_size(n, 1)
    lo = max(1, min(n, round(m_star / 20)))
    grid = {round(x) for x in np.geomspace(lo, n, num=num)}
    grid |= {int(e) for e in extra if 1 <= int(e) <= n}
    return sorted(grid)
