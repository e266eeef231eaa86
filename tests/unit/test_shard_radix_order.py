"""The radix order of a large shard (``sharding._radix_ordered``) is the exact (hi, lo) order:
checked against numpy's lexsort of both words at the size boundary, on tags whose 32-bit
prefixes tie while the bits below differ, on repeated tags, and on shards of every shape."""

from __future__ import annotations

import numpy as np
import pytest

from secure_release.mechanism.alignment import sharding as sh


def _uniform(size: int, shard_bits: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    hi = rng.integers(0, 1 << 64, size, dtype=np.uint64, endpoint=False)
    if shard_bits:
        hi = (hi >> np.uint64(shard_bits)) | (np.uint64(0b1011) << np.uint64(64 - shard_bits))
    lo = rng.integers(0, 1 << 64, size, dtype=np.uint64, endpoint=False)
    return hi, lo


@pytest.mark.parametrize("size", [sh.RADIX_TAGS - 1, sh.RADIX_TAGS, sh.RADIX_TAGS + 1, 300_000])
@pytest.mark.parametrize("shard_bits", [0, 4, 12])
def test_order_is_lexsort_at_and_around_the_radix_boundary(size: int, shard_bits: int) -> None:
    hi, lo = _uniform(size, shard_bits, seed=size + shard_bits)
    assert np.array_equal(sh.tag_order(hi, lo), np.lexsort((lo, hi)))


def test_the_radix_path_is_taken_from_the_boundary_and_reports_its_ties() -> None:
    hi, lo = _uniform(sh.RADIX_TAGS, 4, seed=3)
    order, tied = sh._ordered(hi, lo)
    shared = 4
    prefixes = ((hi << np.uint64(shared)) >> np.uint64(32))[order]
    assert tied is not None
    assert np.array_equal(tied, np.flatnonzero(prefixes[1:] == prefixes[:-1]))  # every tie, only ties


def test_tags_that_tie_in_their_32_bit_prefix_are_put_in_exact_order() -> None:
    """Prefixes drawn from 64 values, so almost every neighbour ties there; the bits of hi below
    the prefix, and lo, decide (and some high words are equal outright)."""
    rng = np.random.default_rng(11)
    size = 100_000
    hi = (np.uint64(0b110) << np.uint64(61)) | (rng.integers(0, 64, size).astype(np.uint64) << np.uint64(29))
    hi |= rng.integers(0, 1 << 29, size).astype(np.uint64)  # below the 32 prefix bits
    hi[:500] = hi[500:1000]
    lo = rng.integers(0, 1 << 63, size).astype(np.uint64)
    assert np.array_equal(sh.tag_order(hi, lo), np.lexsort((lo, hi)))


def test_a_large_merge_finds_exactly_the_repeated_tags_and_keeps_each_symbol() -> None:
    hi, lo = _uniform(200_000, 3, seed=5)
    tags = np.zeros(hi.size, dtype=sh.WORK_DTYPE)
    tags["hi"], tags["lo"] = hi, lo
    tags[1000:1100] = tags[5000:5100]  # repeated once
    tags[7000:7010] = tags[5000:5010]  # and a third time
    symbols = np.arange(tags.size, dtype=np.uint32)
    shard = sh.merge_pieces(sh.split_by_shard(tags, 0, symbols))
    expected = np.lexsort((tags["lo"], tags["hi"]))
    assert np.array_equal(shard.tags, tags[expected])
    assert np.array_equal(shard.tags, tags[shard.symbols])
    repeated = {(int(t["hi"]), int(t["lo"])) for t in tags[5000:5100]}
    got = {int.from_bytes(t.tobytes()[:8], "big") for t in shard.repeated}
    assert got == {h for h, _ in repeated}
    assert shard.repeated.size == 100


def test_every_high_word_equal_falls_back_to_the_lexsort() -> None:
    rng = np.random.default_rng(2)
    size = sh.RADIX_TAGS + 10
    hi = np.full(size, np.uint64(12345), dtype=np.uint64)
    lo = rng.integers(0, 1 << 63, size).astype(np.uint64)
    order, tied = sh._ordered(hi, lo)
    assert tied is None
    assert np.array_equal(order, np.lexsort((lo, hi)))
