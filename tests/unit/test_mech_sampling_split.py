"""The two-thread one-sort path (m close to n, n >= PARALLEL_MIN) gives the single-thread array
bit for bit: on real keystreams over many (n, m), and on crafted keys whose packed top bits tie
(the rare tie fix by full key, with tied runs spanning both halves of the positions)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_release.mechanism.primitives import sampling
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.primitives.sampling import (
    _all_positions_ordered,
    _all_positions_ordered_split,
    position_keys,
    sample_positions,
)

SEED = Seed(bytes(range(32)))


def _source(keys: npt.NDArray[np.uint64]) -> sampling.KeySource:
    def keys_of(start: int, count: int) -> npt.NDArray[np.uint64]:
        assert start % 8 == 0 and start >= 0 and start + count <= keys.size
        return keys[start : start + count].copy()

    return keys_of


def _by_key_then_index(keys: npt.NDArray[np.uint64]) -> list[int]:
    return [i for _, i in sorted((int(k), i) for i, k in enumerate(keys.tolist()))]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**14)), min_size=1, max_size=300))
def test_split_exact_when_top_bits_tie(pairs: list[tuple[int, int]]) -> None:
    # 4 top values (both key top bits, so both output stretches) plus low noise below the bits a
    # pack keeps: packed tops tie in long runs, and duplicate keys fall back to index order
    keys = np.array([(top << 62) | low for top, low in pairs], dtype=np.uint64)
    got = _all_positions_ordered_split(_source(keys), keys.size)
    assert got.dtype == np.int64
    assert got.tolist() == _by_key_then_index(keys)
    assert np.array_equal(got, _all_positions_ordered(keys.copy()))


@pytest.mark.parametrize("n", [1, 2, 7, 8, 15, 16, 17, 1000, 4099])
def test_split_two_keys_runs_span_both_halves(n: int) -> None:
    # every key is one of two values (top bit 0 and top bit 1): two tied runs, each drawing
    # positions from both halves; the answer is index order within each value
    rng = np.random.default_rng(n)
    values = np.array([0x0123_4567_89AB_CDEF, 0xF123_4567_89AB_CDEF], dtype=np.uint64)
    keys = values[rng.integers(0, 2, n)]
    expected = np.concatenate([np.flatnonzero(keys == values[0]), np.flatnonzero(keys == values[1])])
    got = _all_positions_ordered_split(_source(keys), n)
    assert np.array_equal(got, expected)
    assert np.array_equal(got, _all_positions_ordered(keys.copy()))


def test_split_matches_single_at_scale_with_ties() -> None:
    n = 300_001
    keys = np.random.default_rng(7).integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    keys[1000:1010] = keys[5]  # equal keys inside half 0
    keys[200_000:200_004] = keys[7]  # ... and across the halves
    keys[250_000] ^= np.uint64(1)  # differs from keys[250_001] only below the packed bits
    keys[250_001] = keys[250_000] ^ np.uint64(1)
    keys[10] = keys[250_000]
    got = _all_positions_ordered_split(_source(keys), n)
    assert np.array_equal(got, _all_positions_ordered(keys.copy()))
    order = np.lexsort((np.arange(n), keys))
    assert np.array_equal(got, order)


@pytest.mark.parametrize(
    "n", [1, 9, 16, 63, 64, 65, 1000, 1001, 4096, 4097, 12_345, 65_536, 100_003, (1 << 18) + 5]
)
def test_split_matches_single_on_real_keystreams(n: int) -> None:
    key = SEED.derive("sampling", f"split{n}")
    single = _all_positions_ordered(position_keys(key, 0, n))
    assert np.array_equal(_all_positions_ordered_split(partial(position_keys, key), n), single)


@pytest.mark.parametrize("n", [17, 300, 5_000, 40_001])
@pytest.mark.parametrize("m_of", [lambda n: n, lambda n: n - 1, lambda n: (3 * n) // 4])
def test_sample_positions_same_through_either_path(
    n: int, m_of: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = m_of(n)  # type: ignore[operator]
    calls: list[int] = []
    real_split = sampling._all_positions_ordered_split

    def spy(keys_of: sampling.KeySource, size: int) -> npt.NDArray[np.int64]:
        calls.append(size)
        return real_split(keys_of, size)

    monkeypatch.setattr(sampling, "_all_positions_ordered_split", spy)
    monkeypatch.setattr(sampling, "PARALLEL_MIN", 1 << 40)
    single = sample_positions(SEED, n, m, "both")
    assert calls == []
    monkeypatch.setattr(sampling, "PARALLEL_MIN", 1)
    parallel = sample_positions(SEED, n, m, "both")
    if (sampling.os.cpu_count() or 1) >= 2:
        assert calls == [n]
    assert np.array_equal(parallel, single)
    assert parallel.size == m and np.unique(parallel).size == m


def test_default_threshold_takes_the_split_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_split = sampling._all_positions_ordered_split

    def spy(keys_of: sampling.KeySource, size: int) -> npt.NDArray[np.int64]:
        calls.append(size)
        return real_split(keys_of, size)

    monkeypatch.setattr(sampling, "_all_positions_ordered_split", spy)
    monkeypatch.setattr(sampling.os, "cpu_count", lambda: 2)
    n = sampling.PARALLEL_MIN
    small = sample_positions(SEED, n - 1, n - 1, "t")
    assert calls == []  # small inputs stay on one thread
    big = sample_positions(SEED, n, n, "t")
    assert calls == [n]
    key = SEED.derive("sampling", "t")
    assert np.array_equal(big, _all_positions_ordered(position_keys(key, 0, n)))
    assert np.array_equal(small, _all_positions_ordered(position_keys(key, 0, n - 1)))


def test_split_runs_inline_when_the_pool_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    # a one-thread pool held busy: the second half must run on the calling thread, not wait
    pool = ThreadPoolExecutor(max_workers=1)
    release = threading.Event()
    blocker = pool.submit(release.wait, 30)
    monkeypatch.setattr(sampling, "worker_pool", lambda: pool)
    try:
        key = SEED.derive("sampling", "busy")
        got = _all_positions_ordered_split(partial(position_keys, key), 50_000)
        assert not blocker.done()
        assert np.array_equal(got, _all_positions_ordered(position_keys(key, 0, 50_000)))
    finally:
        release.set()
        pool.shutdown(wait=True)
