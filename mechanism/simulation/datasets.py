"""Synthetic count tables of Sec. IV (pure: no file I/O).

"uniform": every cell 1/K. "linear": cell c (0-based) has share (c + 1)/q, q = 1 + ... + K.
"peaky": cell 0 holds 90%, the other K - 1 cells share 10% uniformly. "zipf": cell c (0-based)
has share proportional to 1/(c + 1) (Zipf's law, exponent 1; the issue-13 coverage table). Shares become integer
counts summing exactly to n by largest-remainder (Hamilton) rounding, ties to the lower index.
The joint alphabet is split between two curators as k1 x k2 = K with k1 >= k2 as close as
possible (24 = 6 x 4, as Adult's education x marital / sex x salary).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import (
    EmptyDomainError,
    InvalidCountsError,
    InvalidSampleSizeError,
    UnknownDatasetError,
)

SYNTHETIC = ("uniform", "linear", "peaky", "zipf")
PEAK_SHARE = 0.9


def shares(kind: str, joint_size: int) -> npt.NDArray[np.float64]:
    """Cell shares of a synthetic type of size K (sums to 1)."""
    K = _check_k(joint_size)
    if kind == "uniform":
        return np.full(K, 1.0 / K)
    if kind == "linear":
        q = K * (K + 1) / 2.0
        return np.arange(1, K + 1, dtype=np.float64) / q
    if kind == "peaky":
        out = np.full(K, (1.0 - PEAK_SHARE) / (K - 1))
        out[0] = PEAK_SHARE
        return out
    if kind == "zipf":
        weights = 1.0 / np.arange(1, K + 1, dtype=np.float64)
        return np.asarray(weights / weights.sum(), dtype=np.float64)
    raise UnknownDatasetError(f"unknown synthetic dataset {kind!r}; choose one of {list(SYNTHETIC)}")


def largest_remainder(weights: npt.ArrayLike, n: int) -> npt.NDArray[np.int64]:
    """Integer counts proportional to ``weights`` summing exactly to n (largest remainder)."""
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise InvalidSampleSizeError(f"n must be an integer >= 1, got {n!r}")
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise InvalidCountsError("weights must be a non-empty vector of finite values >= 0, not all 0")
    exact = w / w.sum() * int(n)
    base = np.floor(exact).astype(np.int64)
    short = int(n) - int(base.sum())
    if short > 0:
        order = np.lexsort((np.arange(w.size), -(exact - base)))
        base[order[:short]] += 1
    return np.asarray(base, dtype=np.int64)


def synthetic_counts(kind: str, joint_size: int, n: int) -> npt.NDArray[np.int64]:
    """Integer counts (summing to n) of a synthetic type."""
    return largest_remainder(shares(kind, joint_size), n)


def two_curator_split(joint_size: int) -> tuple[int, int]:
    """(k1, k2) with k1 * k2 = K, k1 >= k2 and k2 the largest divisor <= sqrt K."""
    K = _check_k(joint_size)
    k2 = max(d for d in range(1, math.isqrt(K) + 1) if K % d == 0)
    return K // k2, k2


def _check_k(joint_size: int) -> int:
    if isinstance(joint_size, bool) or int(joint_size) != joint_size or joint_size < 2:
        raise EmptyDomainError(
            f"the joint alphabet K must be an integer >= 2 (K = 1 is a single cell with "
            f"nothing to release), got {joint_size!r}"
        )
    return int(joint_size)
