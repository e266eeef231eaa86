"""The low-memory order of m close to n (:func:`sampling._ranged_positions`: packs built chunk
by chunk in one array, ties found chunk by chunk, tied keys recomputed) is the one-sort order bit
for bit: exact comparisons, with small chunks so every chunk boundary is crossed."""

from __future__ import annotations

import numpy as np
import pytest

from secure_release.mechanism.primitives import sampling
from secure_release.mechanism.primitives.keys import Seed


@pytest.mark.parametrize(("n", "m"), [(200_000, 200_000), (200_000, 199_993), (131_072, 100_000), (999, 1)])
def test_ranged_order_is_the_one_sort_order(n: int, m: int) -> None:
    key = Seed(bytes(range(32))).derive("sampling", "r1")
    expected = sampling._all_positions_ordered(sampling.position_keys(key, 0, n))[:m]
    got = sampling._ranged_positions(key, n, m, chunk=1 << 14)
    assert got.dtype == np.int64 and np.array_equal(got, expected)


def test_sample_positions_takes_the_ranged_path_from_its_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    seed, n = Seed(bytes(32)), 70_000
    expected = sampling.sample_positions(seed, n, n - 3, "r2")
    calls: list[int] = []
    ranged = sampling._ranged_positions

    def spy(key: bytes, n_: int, m_: int, chunk: int) -> np.ndarray:
        calls.append(n_)
        return ranged(key, n_, m_, 4_096)

    monkeypatch.setattr(sampling, "LOW_MEMORY_MIN", 65_536)
    monkeypatch.setattr(sampling, "_ranged_positions", spy)
    assert np.array_equal(sampling.sample_positions(seed, n, n - 3, "r2"), expected) and calls == [n]


def test_tied_key_tops_are_ordered_by_the_full_key() -> None:
    """Keys that tie in their packed top bits (forced: a keystream stand-in with few distinct
    tops) are put in (full key, index) order, as the one-sort path does."""
    rng = np.random.default_rng(4)
    n = 50_000
    keys = (rng.integers(0, 64, n).astype(np.uint64) << np.uint64(58)) | rng.integers(0, 1 << 20, n).astype(np.uint64)
    fake = lambda _key, start, count: keys[start : start + count]  # noqa: E731
    expected = sampling._all_positions_ordered(keys.copy())
    original = sampling.position_keys
    sampling.position_keys = fake  # type: ignore[assignment]
    try:
        got = sampling._ranged_positions(b"k" * 32, n, n, chunk=4_096)
    finally:
        sampling.position_keys = original  # type: ignore[assignment]
    assert np.array_equal(got, expected)
