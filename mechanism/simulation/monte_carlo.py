"""Monte Carlo simulation of the release at count level (Sec. IV; DESIGN 3).

Two paths with one distribution of the observed joint counts:

* **fast path** (:func:`fast_observed_counts`), vectorized over trials:
  the sample's cell counts are multivariate hypergeometric (m of the n records without
  replacement); PRAM at count level keeps Binomial(s_c, a) of the s_c sampled rows of cell c,
  and the R = m - sum kept replaced rows land on cells by a Multinomial(R, uniform over K).
  Given the sample this is exactly the law of the per-record channel (each row independently
  kept w.p. a, else a uniform cell), summed per cell.
* **per-record path** (:func:`per_record_observed_counts`): the real mechanism per trial,
  mechanism.primitives.sampling.sample_positions + mechanism.primitives.pads (encrypt, cancels exactly on decrypt)
  + mechanism.primitives.pram.perturb, then a histogram.

Estimators reuse mechanism.estimation.estimators (A^-1 closed form, marginal inversion); the batched
projection here is row-by-row equal to project_to_simplex (tested), and the closed-form MLE to
EM (mechanism.estimation.reference.estimate_mle, tested).
numpy's Generator drives the fast path: this is a simulation, never a release.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import (
    InvalidCountsError,
    NonFiniteInputError,
    ShapeMismatchError,
    UnknownEstimatorError,
)
from secure_release.mechanism.estimation.estimators import (
    INTERVAL_METHODS,
    invert_channel,
    log_gamma,
    mle_water_filling,
    per_cell_alpha,
    share_intervals,
)
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.primitives.sampling import check_sample_size
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.schema import check_joint_alphabet

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ESTIMATORS = ("raw", "projected", "mle")
_SUFFIX = {"raw": "", "projected": "_projected", "mle": "_mle"}


def check_counts(counts: npt.ArrayLike) -> IntArray:
    """A 1-D vector of non-negative integer cell counts with a positive total."""
    c = np.asarray(counts)
    if c.ndim != 1 or c.size < 2:
        raise InvalidCountsError(f"counts must be a vector of at least 2 cells, got shape {c.shape}")
    if not np.all(np.isfinite(c.astype(np.float64))):
        raise NonFiniteInputError("counts must be finite")
    if np.any(c < 0) or np.any(np.asarray(c, dtype=np.float64) != np.floor(c.astype(np.float64))):
        raise InvalidCountsError("counts must be integers >= 0")
    ci = c.astype(np.int64)
    if ci.sum() < 1:
        raise InvalidCountsError("counts must have a positive total")
    return ci


def fast_observed_counts(counts: npt.ArrayLike, m: int, keep: float, trials: int, rng: np.random.Generator) -> IntArray:
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
    from secure_release.mechanism.estimation.estimators import observed_counts
    from secure_release.mechanism.primitives.keys import PramKey, Seed
    from secure_release.mechanism.primitives.pads import CipherMode, new_release_pad
    from secure_release.mechanism.primitives.pram import perturb
    from secure_release.mechanism.primitives.sampling import sample_positions
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
    """Row-wise :func:`mechanism.estimation.estimators.project_to_simplex` (same sort-based rule)."""
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
        raise UnknownEstimatorError(f"unknown estimator(s) {unknown}; choose from {list(ESTIMATORS)}")
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
        out.append(simulate_point(counts, eps, m, trials, rng, alphabet_sizes, estimators, per_record))
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


# --- coverage of the per-cell confidence intervals -----------------------------------------


def hypergeometric_pmf(n: int, successes: int, m: int) -> tuple[IntArray, FloatArray]:
    """P(S = s) for S the number of a cell's ``successes`` records among m drawn without
    replacement from n: C(C, s) C(n - C, m - s) / C(n, m) on its support, in logs
    (:func:`mechanism.estimation.estimators.log_gamma`), trimmed below 1e-40 and renormalized."""
    check_sample_size(n, m)
    if not 0 <= successes <= n:
        raise ShapeMismatchError(f"a cell holds 0..n = {n} records, got {successes}")
    s = np.arange(max(0, m - (n - successes)), min(successes, m) + 1, dtype=np.int64)
    sf = s.astype(np.float64)

    def log_choose(top: float, bottom: FloatArray) -> FloatArray:
        return np.asarray(log_gamma(top + 1.0) - log_gamma(bottom + 1.0) - log_gamma(top - bottom + 1.0))

    logp = log_choose(successes, sf) + log_choose(n - successes, m - sf)
    logp -= logp.max()
    p = np.exp(logp)
    keep = p > 1e-40
    return s[keep], np.asarray(p[keep] / p[keep].sum(), dtype=np.float64)


def observed_count_pmf(n: int, cell_count: int, m: int, keep: float, off_diagonal: float) -> FloatArray:
    """Exact distribution of a cell's observed count N_c after sampling m of n and PRAM
    (derived here): S ~ Hypergeometric(n, C, m) sampled rows of the cell, and given S,
    N_c = Binomial(S, a + b) + Binomial(m - S, b) (a row of the cell lands in it w.p. a + b,
    any other row w.p. b). Its generating function sum_s P(S=s) (1-a-b + (a+b) z)^s
    (1-b + b z)^(m-s) is evaluated at the m + 1 roots of unity and inverted by one FFT.
    Returns P(N_c = 0..m) (absolute error ~1e-15)."""
    s, h = hypergeometric_pmf(n, cell_count, m)
    size = m + 1
    z = np.exp(2j * np.pi * np.arange(size) / size)
    hit, other = 1.0 - (keep + off_diagonal) + (keep + off_diagonal) * z, 1.0 - off_diagonal + off_diagonal * z
    # sum_s h(s) hit^s other^(m-s) = hit^s0 other^(m-s0) sum_s h(s) r^(s-s0), r = hit/other
    # (other != 0 since b < 1/2), by Horner over the support; each term is <= h(s) in modulus
    ratio = hit / other
    if s.size * math.log(max(float(np.abs(ratio).max()), 1.0)) < 600.0:
        acc = np.zeros(size, dtype=np.complex128)
        for weight in h[::-1]:
            acc = acc * ratio + weight
        s0 = float(s[0])
        pgf = acc * np.power(hit, s0) * np.power(other, m - s0)
    else:  # Horner could overflow (b near 1/2): direct powers, in blocks of the support
        pgf = np.zeros(size, dtype=np.complex128)
        for lo in range(0, s.size, 256):
            sb, hb = s[lo : lo + 256].astype(np.float64), h[lo : lo + 256]
            pgf += hb @ (np.power(hit[None, :], sb[:, None]) * np.power(other[None, :], (m - sb)[:, None]))
    pmf = np.fft.fft(pgf).real / size
    return np.asarray(np.clip(pmf, 0.0, None), dtype=np.float64)


@dataclass(frozen=True)
class ExactCoverage:
    """Per-cell coverage probability and expected width of one interval method, exactly."""

    method: str
    coverage: FloatArray
    mean_width: FloatArray
    shares: FloatArray
    per_cell_alpha: float

    def summary(self) -> dict[str, Any]:
        return _coverage_summary(self.method, self.coverage, self.mean_width, self.shares)


def exact_cell_coverage(
    counts: npt.ArrayLike,
    m: int,
    keep: float,
    off_diagonal: float,
    methods: Sequence[str] = INTERVAL_METHODS,
    level: float = 0.95,
    simultaneous: bool = False,
) -> list[ExactCoverage]:
    """For each cell c of a count table and each method: P(T_c in the interval), summing
    :func:`observed_count_pmf` over the counts whose interval holds T_c (each interval depends
    on N_c alone, so this is exact, no Monte Carlo), and E[width]. For a curator subset's
    marginal pass its counts and b_S = (1 - a)/K_S. With ``simultaneous`` the per-cell level is
    Bonferroni's; 1 - sum_c (1 - coverage_c) then lower-bounds the all-cells coverage."""
    c = check_counts(counts)
    n, K = int(c.sum()), c.size
    check_sample_size(n, m)
    shares = c / n
    everything = np.arange(m + 1)
    alpha = per_cell_alpha(level, K, simultaneous)
    tables = {meth: share_intervals(everything, n, m, keep, off_diagonal, meth, alpha) for meth in methods}
    values, inverse = np.unique(c, return_inverse=True)
    cover = {meth: np.empty(values.size) for meth in methods}
    width = {meth: np.empty(values.size) for meth in methods}
    for i, count in enumerate(values):  # one pmf per distinct cell count (not per row)
        pmf = observed_count_pmf(n, int(count), m, keep, off_diagonal)
        t = count / n
        for meth, (lo, hi) in tables.items():
            cover[meth][i] = float(pmf[(lo <= t) & (t <= hi)].sum())
            width[meth][i] = float(pmf @ (hi - lo))
    return [ExactCoverage(meth, cover[meth][inverse], width[meth][inverse], shares, alpha) for meth in methods]


def _coverage_summary(method: str, coverage: FloatArray, width: FloatArray, shares: FloatArray) -> dict[str, Any]:
    low = coverage < 0.9
    return {
        "method": method,
        "min_coverage": float(coverage.min()),
        "worst_cell": int(np.argmin(coverage)),
        "mass_weighted_coverage": float(np.sum(shares * coverage)),
        "mean_coverage": float(coverage.mean()),
        "cells_below_90": int(low.sum()),
        "mass_below_90": float(shares[low].sum()),
        "cells_below_93": int(np.sum(coverage < 0.93)),
        "mean_width": float(width.mean()),
        "mass_weighted_width": float(np.sum(shares * width)),
    }


@dataclass
class CoverageStudy:
    """Monte Carlo coverage of each interval method on the joint cells and each curator's
    marginal: hit counts per cell, summed widths, and all-cells-at-once hits per trial."""

    epsilon: float
    m: int
    gamma: float
    n: int
    trials: int
    level: float
    simultaneous: bool
    shares: dict[str, FloatArray]
    hits: dict[tuple[str, str], IntArray] = field(repr=False)
    width_sums: dict[tuple[str, str], FloatArray] = field(repr=False)
    all_cells_hits: dict[tuple[str, str], int] = field(repr=False)

    def coverage(self, target: str, method: str) -> FloatArray:
        return np.asarray(self.hits[(target, method)] / self.trials, dtype=np.float64)

    def summary(self) -> list[dict[str, Any]]:
        rows = []
        for target, method in self.hits:
            row = _coverage_summary(
                method,
                self.coverage(target, method),
                self.width_sums[(target, method)] / self.trials,
                self.shares[target],
            )
            row.update(
                target=target,
                epsilon=self.epsilon,
                m=self.m,
                gamma=self.gamma,
                trials=self.trials,
                level=self.level,
                simultaneous=self.simultaneous,
                all_cells_coverage=self.all_cells_hits[(target, method)] / self.trials,
            )
            rows.append(row)
        return rows


def coverage_study(
    counts: npt.ArrayLike,
    epsilon: float,
    m: int,
    trials: int,
    rng: np.random.Generator,
    alphabet_sizes: Sequence[int] | None = None,
    methods: Sequence[str] = INTERVAL_METHODS,
    level: float = 0.95,
    simultaneous: bool = False,
    chunk: int = 2000,
) -> CoverageStudy:
    """Simulate ``trials`` releases (fast count-level path, gamma from Eq. 2) and count, per
    cell and method, how often the interval holds the true share; on the joint cells
    ("joint") and on each curator's marginal ("marginal_j") when ``alphabet_sizes`` has > 1
    curator."""
    c = check_counts(counts)
    n, K = int(c.sum()), c.size
    if isinstance(trials, bool) or int(trials) != trials or trials < 1:
        raise ShapeMismatchError(f"trials must be an integer >= 1, got {trials!r}")
    sizes = [int(k) for k in alphabet_sizes] if alphabet_sizes is not None else [K]
    if check_joint_alphabet(sizes) != K:
        raise ShapeMismatchError(f"alphabets {sizes} do not multiply to K = {K}")
    gamma = accounting.gamma_from_epsilon(n, m, epsilon)
    channel = PramChannel(gamma, K)
    a = channel.keep
    truth = c / n
    targets: dict[str, tuple[FloatArray, float]] = {"joint": (truth, channel.off_diagonal)}
    cube_truth = truth.reshape(sizes)
    axes = marginal_axes(sizes) if len(sizes) > 1 else []
    for j, ax in enumerate(axes):
        targets[f"marginal_{j}"] = (
            cube_truth.sum(axis=tuple(x - 1 for x in ax)),
            (1.0 - a) / sizes[j],
        )
    hits = {(t, meth): np.zeros(v[0].size, dtype=np.int64) for t, v in targets.items() for meth in methods}
    widths = {key: np.zeros(v.size) for key, v in hits.items()}
    all_hits = dict.fromkeys(hits, 0)
    for lo in range(0, int(trials), chunk):
        size = min(chunk, int(trials) - lo)
        obs = fast_observed_counts(c, m, a, size, rng)
        for target, (share, b) in targets.items():
            if target == "joint":
                cells = obs
            else:
                j = int(target.split("_")[1])
                cells = obs.reshape(size, *sizes).sum(axis=axes[j]).reshape(size, -1)
            alpha = per_cell_alpha(level, share.size, simultaneous)
            for meth in methods:
                low, high = share_intervals(cells, n, m, a, b, meth, alpha)
                inside = (low <= share) & (share <= high)
                hits[(target, meth)] += inside.sum(axis=0)
                widths[(target, meth)] += (high - low).sum(axis=0)
                all_hits[(target, meth)] += int(inside.all(axis=1).sum())
    return CoverageStudy(
        float(epsilon),
        int(m),
        gamma,
        n,
        int(trials),
        float(level),
        bool(simultaneous),
        {t: v[0] for t, v in targets.items()},
        hits,
        widths,
        all_hits,
    )
