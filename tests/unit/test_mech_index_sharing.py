"""Index sharing: the packed wire form (<= m ceil(log2 n) bits + padding) and its validation, and
the OS-CSPRNG sampler's output (exactness is enumerated in test_mech_variants_privacy_exact.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2 as chi2_dist

from secure_release.mechanism.errors import InvalidSampleSizeError, SecureReleaseError
from secure_release.mechanism.primitives.stream import KeyStream, nonce_for, uniform_below
from secure_release.mechanism.protocol.index_sharing import (
    InvalidIndexTupleError,
    draw_index_tuple,
    first_distinct,
    index_bits,
    indices_fingerprint,
    pack_indices,
    packed_size,
    unpack_indices,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 2**32), st.data())
def test_pack_roundtrip_and_size(n: int, data: st.DataObject) -> None:
    m = data.draw(st.integers(1, min(n, 64)))
    pos = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m, unique=True)))
    packed = pack_indices(pos, n)
    w = math.ceil(math.log2(n)) if n > 1 else 0
    assert index_bits(n) == w
    assert len(packed) == packed_size(n, m) == math.ceil(m * w / 8)
    assert 8 * len(packed) - m * w < 8  # payload m ceil(log2 n) bits, < 8 bits of padding
    assert np.array_equal(unpack_indices(packed, n, m), pos)


def test_known_answer() -> None:
    # n = 10: 4 bits each, MSB first: 9, 0, 5 -> 1001 0000 0101 (+ 4 zero bits)
    assert pack_indices(np.array([9, 0, 5]), 10) == bytes([0b10010000, 0b01010000])
    assert pack_indices(np.array([0]), 1) == b""
    assert np.array_equal(unpack_indices(b"", 1, 1), [0])


@pytest.mark.parametrize(
    "data,n,m,why",
    [
        (bytes([0b10010000]), 10, 3, "short"),
        (bytes([0b10010000, 0b01010000, 0]), 10, 3, "long"),
        (bytes([0b10010000, 0b01010001]), 10, 3, "padding"),
        (bytes([0b11110000, 0b01010000]), 10, 3, "out of range (15 >= 10)"),
        (bytes([0b10011001, 0b01010000]), 10, 3, "repeat"),
    ],
)
def test_unpack_rejects(data: bytes, n: int, m: int, why: str) -> None:
    with pytest.raises(InvalidIndexTupleError):
        unpack_indices(data, n, m)


def test_pack_rejects_bad_tuples() -> None:
    with pytest.raises(InvalidIndexTupleError):
        pack_indices(np.array([1, 1]), 10)
    with pytest.raises(InvalidIndexTupleError):
        pack_indices(np.array([10]), 10)
    with pytest.raises(InvalidIndexTupleError):
        pack_indices(np.array([0.5]), 10)
    with pytest.raises(InvalidIndexTupleError):
        index_bits(2**32 + 1)
    with pytest.raises(InvalidSampleSizeError):
        draw_index_tuple(5, 6)
    assert issubclass(InvalidIndexTupleError, SecureReleaseError)


def test_first_distinct() -> None:
    assert first_distinct(np.array([3, 3, 1, 3, 0, 1, 2]), 3).tolist() == [3, 1, 0]
    assert first_distinct(np.array([3, 3]), 3).tolist() == [3]


@pytest.mark.parametrize("n,m", [(1000, 10), (1000, 500), (1000, 501), (7, 7), (1, 1), (10**6, 2000)])
def test_os_tuples_are_valid(n: int, m: int) -> None:
    a, b = draw_index_tuple(n, m), draw_index_tuple(n, m)
    for t in (a, b):
        assert t.size == m and np.unique(t).size == m and t.min() >= 0 and t.max() < n
    if m >= 10 and n > m:
        assert not np.array_equal(a, b)  # fresh OS randomness each time (p < 1e-20)


def test_fingerprint_detects_a_repeated_tuple() -> None:
    p = pack_indices(np.array([1, 2, 3]), 10)
    assert indices_fingerprint(p) == indices_fingerprint(bytes(p))
    assert indices_fingerprint(p) != indices_fingerprint(pack_indices(np.array([1, 3, 2]), 10))


@pytest.mark.parametrize("path_m", [2, 4])  # 2: first-distinct path, 4: random-keys path
def test_chi_square_all_ordered_tuples(path_m: int) -> None:
    """Both paths with a fixed ChaCha20 byte source (deterministic): 12,000 tuples of n = 5
    over all 5!/(5-m)! cells; the chi-square test rejects at alpha = 1e-6."""
    n, m, reps = 5, path_m, 12_000
    stream = KeyStream(bytes(range(32)), nonce_for(path_m, 99))

    def draws(count: int) -> np.ndarray:
        return uniform_below(n, count, stream.take).astype(np.int64)

    def keys(count: int) -> np.ndarray:
        return stream.words(count)

    cells: dict[tuple[int, ...], int] = {}
    for _ in range(reps):
        t = tuple(draw_index_tuple(n, m, draws=draws, keys=keys).tolist())
        cells[t] = cells.get(t, 0) + 1
    num_cells = math.perm(n, m)
    assert len(cells) == num_cells
    expected = reps / num_cells
    chi2 = sum((c - expected) ** 2 / expected for c in cells.values())
    assert chi2 < chi2_dist.isf(1e-6, num_cells - 1)
