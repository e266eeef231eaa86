"""Mixing diagnostics of the imputation chains (DESIGN 13: imputations spaced so that they are
nearly independent, measured).

A trace is an array (chains, draws, summaries): one scalar summary per column (a cell's theta,
the log-likelihood of the observed counts), recorded at every sweep.

- :func:`split_rhat`: the rank-normalised split-R-hat of Vehtari, Gelman, Simpson, Carpenter and
  Buerkner (2021, "Rank-normalization, folding, and localization: an improved R-hat"), the larger
  of the bulk (rank-normalised) and the tail (folded, rank-normalised) value, per summary;
- :func:`lag_autocorrelation`: the autocorrelation at a lag, chains pooled around their own means;
- :func:`choose_spacing`: the sweeps between imputations from a pilot's per-sweep autocorrelation.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import special, stats

FloatArray = npt.NDArray[np.float64]

#: :func:`choose_spacing`: rho^s <= this, 0.05 squared: twice the spacing an AR(1) chain needs for
#: consecutive imputations correlated at 0.05, because a short pilot underestimates a slow chain's
#: rate (measured: at the plan's settings a 0.05 target left consecutive imputations correlated up
#: to 0.36; see tests/unit/test_mech_imputation.py).
SPACING_TARGET = 0.0025
#: :func:`choose_spacing`: the largest spacing chosen (a chain slower than this is reported, not hidden).
MAX_SPACING = 500


def classic_split_rhat(trace: FloatArray) -> FloatArray:
    """Gelman-Rubin R-hat of each summary over the split chains (each chain cut in two halves):
    sqrt(((n - 1)/n W + B/n) / W) with W the mean within-chain variance and B/n the variance of
    the chain means (Gelman et al., BDA3, 11.4). (chains, draws, summaries) -> (summaries,);
    NaN with fewer than 2 draws per half; 1 where every draw of a summary is equal."""
    _, draws, count = trace.shape
    half = draws // 2
    if half < 2:
        return np.full(count, math.nan)
    split = np.concatenate([trace[:, :half], trace[:, draws - half :]], axis=0)
    within = split.var(axis=1, ddof=1).mean(axis=0)
    between = split.mean(axis=1).var(axis=0, ddof=1)
    pooled = (half - 1) / half * within + between
    with np.errstate(divide="ignore", invalid="ignore"):
        rhat = np.sqrt(pooled / within)
    return np.asarray(np.where((within == 0) & (between == 0), 1.0, rhat), dtype=np.float64)


def rank_normalise(trace: FloatArray) -> FloatArray:
    """Vehtari et al. (2021), eq. 14: every draw of a summary replaced by the normal quantile of its
    average rank r over all chains and draws, Phi^-1((r - 3/8) / (S + 1/4)), S the number of draws."""
    chains, draws, count = trace.shape
    flat = trace.reshape(chains * draws, count)
    ranks = stats.rankdata(flat, axis=0)
    scores = special.ndtri((ranks - 0.375) / (flat.shape[0] + 0.25))
    return np.asarray(scores.reshape(trace.shape), dtype=np.float64)


def split_rhat(trace: FloatArray) -> FloatArray:
    """Vehtari et al. (2021) R-hat per summary: max(bulk, tail), bulk the split R-hat of the
    rank-normalised draws, tail that of the rank-normalised |draw - median|. Values near 1 (below
    1.01 in their advice, 1.05 as a looser rule) say the chains agree."""
    bulk = classic_split_rhat(rank_normalise(trace))
    folded = np.abs(trace - np.median(trace.reshape(-1, trace.shape[2]), axis=0))
    tail = classic_split_rhat(rank_normalise(folded))
    return np.asarray(np.fmax(bulk, tail), dtype=np.float64)


def lag_autocorrelation(trace: FloatArray, lag: int) -> FloatArray:
    """Autocorrelation at ``lag`` draws per summary: each chain centred on its own mean, the lagged
    products and the variances summed over chains. NaN when no pair is that far apart; 0 for a
    summary with no variation."""
    chains, draws, count = trace.shape
    if lag >= draws or lag < 1:
        return np.full(count, math.nan)
    centred = trace - trace.mean(axis=1, keepdims=True)
    products = (centred[:, lag:] * centred[:, :-lag]).sum(axis=(0, 1)) / (chains * (draws - lag))
    variance = (centred**2).sum(axis=(0, 1)) / (chains * draws)
    return np.asarray(np.where(variance > 0, products / np.where(variance > 0, variance, 1.0), 0.0), dtype=np.float64)


def slowest_rate(trace: FloatArray, lags: tuple[int, ...] = (1, 2, 4, 8)) -> float:
    """The per-sweep rate of the slowest summary, read as AR(1): the largest acf(k)^(1/k) over the
    summaries and the ``lags`` k (a long lag sees a slow component that lag 1 hides under fast
    ones); 0 when no autocorrelation is positive."""
    rates = [0.0]
    for lag in lags:
        acf = lag_autocorrelation(trace, lag)
        positive = acf[np.isfinite(acf) & (acf > 0)]
        rates += [float(r) ** (1.0 / lag) for r in positive]
    return max(rates)


def choose_spacing(per_sweep_rho: float, target: float = SPACING_TARGET, cap: int = MAX_SPACING) -> int:
    """The smallest spacing s with rho^s <= ``target`` for the per-sweep lag-1 autocorrelation rho
    of the slowest summary (an AR(1) reading of the chain), at least 1 and at most ``cap``."""
    rho = float(per_sweep_rho)
    if not math.isfinite(rho) or rho <= target:
        return 1
    if rho >= 1.0:
        return cap
    return max(1, min(cap, math.ceil(math.log(target) / math.log(rho))))
