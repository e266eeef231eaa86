"""The curators' shared sample: a uniformly random ordered m-tuple of distinct positions.

Rule (DESIGN 3.2). Let ks = ChaCha20(key = HKDF(seed, "sampling", release_id), nonce = 0).
Position i in [0, n) gets the 64-bit key r_i = little-endian word i of ks. The sample is the
m positions with the smallest (r_i, i), listed in ascending (r_i, i).

Why uniform: if the r_i were i.i.d. uniform reals, the m smallest form a uniform m-subset and
their ascending order is a uniform permutation of it (exchangeability), i.e. a uniform ordered
m-tuple, exactly the pi of Theorem 3.2's proof. With 64-bit keys a tie occurs with probability
at most n^2 / 2^65 (about 3e-6 at n = 10^7) and only then does the index break the order; with a
pseudorandom keystream the guarantee is computational against anyone without the seed.

One pass over positions in chunks; memory O(m + chunk). Every curator holding the seed computes
the same tuple; :data:`KNOWN_ANSWERS` in the tests pin the rule.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import partial

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import InvalidSampleSizeError
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.primitives.stream import CHACHA_BLOCK_BYTES, keystream_words, nonce_for, worker_pool

DEFAULT_CHUNK = 1 << 20
_FULL_SORT_MAX = 1 << 28  # n up to this sorts all n keys at once when m is close to n (8n bytes)
# n from which the one-sort path splits its work over two threads (below it, thread hand-off
# costs more than it saves; measured on 2 cores: the two-thread path wins from about 2^17 on)
PARALLEL_MIN = 1 << 18
_WORDS_PER_BLOCK = CHACHA_BLOCK_BYTES // 8
#: n from which m close to n is ordered in one array of n words (:func:`_ranged_positions`):
#: the two-thread one-sort path holds about 24 bytes a position (2.2 GiB at 9 * 10^7).
LOW_MEMORY_MIN = 1 << 25
MAX_POSITIONS = (2**32) * _WORDS_PER_BLOCK


def check_sample_size(n: int, m: int) -> None:
    """Raise unless n >= 1 and m is an integer in [1, n]."""
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise InvalidSampleSizeError(f"n must be an integer >= 1, got {n!r}")
    if isinstance(m, bool) or int(m) != m or not 1 <= m <= n:
        raise InvalidSampleSizeError(f"m must be an integer in [1, n] = [1, {n}], got {m!r}")


def position_keys(key: bytes, start: int, count: int) -> npt.NDArray[np.uint64]:
    """r_i for i in [start, start + count); ``start`` must be a multiple of 8."""
    if start % _WORDS_PER_BLOCK:
        raise InvalidSampleSizeError("position chunks must start at a multiple of 8")
    return keystream_words(key, nonce_for(0), start // _WORDS_PER_BLOCK, count)


def _smallest(
    keys: npt.NDArray[np.uint64], idx: npt.NDArray[np.int64], m: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """The m entries with the smallest (key, index), unordered; exact under key ties."""
    if keys.size <= m:
        return keys, idx
    part = np.argpartition(keys, m - 1)
    threshold = keys[part[m - 1]]
    below = keys < threshold
    num_below = int(np.count_nonzero(below))
    at = np.flatnonzero(keys == threshold)
    at = at[np.argsort(idx[at], kind="stable")][: m - num_below]
    keep = np.concatenate([np.flatnonzero(below), at])
    return keys[keep], idx[keep]


def sample_positions(
    seed: Seed, n: int, m: int, release_id: str = "", chunk: int = DEFAULT_CHUNK
) -> npt.NDArray[np.int64]:
    """The ordered m-tuple of distinct positions in [0, n) shared by every seed holder.

    Fast path: the m-th smallest of n uniform 64-bit keys lies below
    t0 = 2^64 (m + 8 sqrt(m) + 64) / n except with probability < 1e-15, so each chunk keeps only
    keys <= t0. If fewer than m keys survive, the exact streaming selection runs instead. The
    output is the same either way (only keys <= t0 were dropped, and m keys lie below t0).
    """
    check_sample_size(n, m)
    if n > MAX_POSITIONS:
        raise InvalidSampleSizeError(f"n = {n} exceeds {MAX_POSITIONS} positions")
    chunk = max(_WORDS_PER_BLOCK, chunk - chunk % _WORDS_PER_BLOCK)
    key = sampling_key(seed, release_id)
    fraction = kept_bound(m) / n
    if fraction >= 0.5 and n >= LOW_MEMORY_MIN:  # m close to large n: 8 bytes a position
        return _ranged_positions(key, n, m, chunk)
    if fraction >= 0.5 and n <= _FULL_SORT_MAX:  # m close to n: one keystream, one numeric sort
        if n >= PARALLEL_MIN and (os.cpu_count() or 1) >= 2:
            return _all_positions_ordered_split(partial(position_keys, key), n)[:m]
        return _all_positions_ordered(position_keys(key, 0, n))[:m]
    if fraction < 0.5:
        cut = np.uint64(int(fraction * 2.0**64))
        kept_keys: list[npt.NDArray[np.uint64]] = []
        kept_idx: list[npt.NDArray[np.int64]] = []
        for start in range(0, n, chunk):
            keys = position_keys(key, start, min(chunk, n - start))
            hit = np.flatnonzero(keys <= cut)
            kept_keys.append(keys[hit])
            kept_idx.append(hit.astype(np.int64) + start)
        all_keys, all_idx = np.concatenate(kept_keys), np.concatenate(kept_idx)
        if all_keys.size >= m:
            return _ordered(*_smallest(all_keys, all_idx, m))
    return _ordered(*_streaming_smallest(key, n, m, chunk))


def _ranged_positions(key: bytes, n: int, m: int, chunk: int) -> npt.NDArray[np.int64]:
    """The one-sort order (:func:`_all_positions_ordered`) of all n positions, first m, in one
    array of n words: the packs are made chunk by chunk straight into it (no array of n keys),
    sorted in place, scanned for ties a chunk at a time, unpacked in place; a tied position's
    full key is recomputed from the keystream (one more pass, only if some tie). Bit for bit the
    same tuple, at 8 bytes a position instead of about 24."""
    bits = max(1, (n - 1).bit_length())
    if bits > _POSITION_BITS_MAX:
        return _all_positions_ordered(position_keys(key, 0, n))[:m]
    packed = np.empty(n, dtype=np.uint64)
    for start in range(0, n, chunk):
        count = min(chunk, n - start)
        packed[start : start + count] = _pack_positions(position_keys(key, start, count), start, bits)
    packed.view(np.float64).sort()  # in place; float64 order = pack order (see _pack_positions)
    tied = np.concatenate(
        [_tied_pairs(packed[lo : min(lo + chunk, n - 1) + 1], bits) + lo for lo in range(0, max(n - 1, 1), chunk)]
    )
    ordered = _unpack_positions(packed, bits)
    if tied.size:
        at, run, tied_idx = _tie_runs(ordered, tied)
        _resort_runs(ordered, at, run, tied_idx, _keys_at(key, tied_idx, n, chunk))
    return ordered[:m]


def _keys_at(key: bytes, positions: npt.NDArray[np.int64], n: int, chunk: int) -> npt.NDArray[np.uint64]:
    """r_i at ``positions`` (any order), one pass of keystream over the chunks that hold some."""
    order = np.argsort(positions, kind="stable")
    wanted = positions[order]
    bounds = np.searchsorted(wanted, np.arange(0, n + chunk, chunk))
    out = np.empty(positions.size, dtype=np.uint64)
    for i, start in enumerate(range(0, n, chunk)):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        if lo < hi:
            keys = position_keys(key, start, min(chunk, n - start))
            out[order[lo:hi]] = keys[wanted[lo:hi] - start]
    return out


def _streaming_smallest(
    key: bytes, n: int, m: int, chunk: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """The m smallest (r_i, i) over all positions, one chunk at a time."""
    best_keys = np.zeros(0, dtype=np.uint64)
    best_idx = np.zeros(0, dtype=np.int64)
    for start in range(0, n, chunk):
        count = min(chunk, n - start)
        keys = position_keys(key, start, count)
        idx = np.arange(start, start + count, dtype=np.int64)
        if best_keys.size == m:  # only keys not above the current m-th smallest can enter
            mask = keys <= best_keys.max()
            keys, idx = keys[mask], idx[mask]
        best_keys, best_idx = _smallest(
            np.concatenate([best_keys, keys]), np.concatenate([best_idx, idx]), m
        )
    return best_keys, best_idx


def _ordered(keys: npt.NDArray[np.uint64], idx: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Positions in ascending (r_i, i)."""
    return sorted_by_key(keys, idx)


def _all_positions_ordered(keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """``sorted_by_key(keys, arange(n))`` with fewer passes: the packs (:func:`_pack_positions`)
    are built in one new array, sorted and unpacked in place (the keys stay intact for the rare
    tie fix)."""
    n = keys.size
    bits = max(1, (n - 1).bit_length())
    if bits > _POSITION_BITS_MAX:
        return sorted_by_key(keys, np.arange(n, dtype=np.int64))
    packed = _pack_positions(keys, 0, bits)
    packed.view(np.float64).sort()  # see _pack_positions: float64 order = pack order here
    tied = _tied_pairs(packed, bits)
    ordered = _unpack_positions(packed, bits)
    if tied.size:  # idx is arange(n): a tied position's full key is keys[position]
        at, run, tied_idx = _tie_runs(ordered, tied)
        _resort_runs(ordered, at, run, tied_idx, keys[tied_idx])
    return ordered


_POSITION_BITS_MAX = 40  # beyond, too few key bits are left in a pack to make ties rare
_PACK_OFFSET = 1 << 61


def _pack_positions(keys: npt.NDArray[np.uint64], start: int, bits: int) -> npt.NDArray[np.uint64]:
    """Position start + j (j < keys.size <= 2^bits - start) packed as one 64-bit word, ordered
    as (top 62 - bits bits of r_i, i): ((r >> 2) with the low ``bits`` bits replaced by i)
    + 2^61.

    Every pack lies in [2^61, 2^61 + 2^62), the bit patterns of positive normal doubles, whose
    float64 order is their unsigned integer order, so the packs are sorted as float64 (numpy's
    float64 sort is ~18% faster than its int64 sort on AVX2); normal, so a flush-denormals mode
    cannot change a comparison. Two packs tie in their bits above ``bits`` iff their keys tie
    in their top 62 - bits bits; only those are re-ordered by the full key afterwards.
    """
    packed = np.right_shift(keys, np.uint64(2))
    packed &= ~np.uint64((1 << bits) - 1)
    packed += np.arange(start + _PACK_OFFSET, start + keys.size + _PACK_OFFSET, dtype=np.uint64)
    return packed


def _tied_pairs(packed: npt.NDArray[np.uint64], bits: int) -> npt.NDArray[np.intp]:
    """i where sorted packs i and i + 1 have equal bits above the low ``bits`` (equal key tops)."""
    return np.flatnonzero((packed[1:] ^ packed[:-1]) <= np.uint64((1 << bits) - 1))


def _unpack_positions(packed: npt.NDArray[np.uint64], bits: int) -> npt.NDArray[np.int64]:
    """The positions held by ``packed``, in place (the array is reused as int64)."""
    ordered = packed.view(np.int64)
    ordered &= np.int64((1 << bits) - 1)
    return ordered


KeySource = Callable[[int, int], npt.NDArray[np.uint64]]


def _all_positions_ordered_split(keys_of: KeySource, n: int) -> npt.NDArray[np.int64]:
    """``_all_positions_ordered(keys_of(0, n))`` on two threads, the same array bit for bit.

    ``keys_of(start, count)`` gives r_i for i in [start, start + count) (start a multiple of 8).
    Step 1, one thread per half of the positions: its keys, their packs
    (:func:`_pack_positions`) and which packs have key top bit 0 (pack < 2^62).
    Step 2, one thread per key top bit: it gathers the packs of its top bit from both halves
    into its own stretch of the output (top bit 0 first), sorts that stretch, finds its tied
    pairs and unpacks it. The packs are distinct, so the sorted array is the single-thread one
    whatever sort runs; packs of different key top bits never tie (a pack keeps the key's top
    62 - bits >= 22 bits), so the tied pairs are the single-thread ones and so is the tie fix by
    full key. The threads overlap the keystream of one half with that of the other, and the
    sort of one stretch with the other's.
    """
    bits = max(1, (n - 1).bit_length())
    if bits > _POSITION_BITS_MAX:
        return _all_positions_ordered(keys_of(0, n))
    half = (n // 2) // _WORDS_PER_BLOCK * _WORDS_PER_BLOCK
    bounds = ((0, half), (half, n))
    keys: list[npt.NDArray[np.uint64]] = [np.zeros(0, dtype=np.uint64)] * 2
    packs: list[npt.NDArray[np.uint64]] = [np.zeros(0, dtype=np.uint64)] * 2
    top0: list[npt.NDArray[np.bool_]] = [np.zeros(0, dtype=bool)] * 2
    top1: list[npt.NDArray[np.bool_]] = [np.zeros(0, dtype=bool)] * 2

    def pack(part: int) -> None:
        lo, hi = bounds[part]
        keys[part] = keys_of(lo, hi - lo)
        packs[part] = _pack_positions(keys[part], lo, bits)
        top0[part] = packs[part] < np.uint64(1 << 62)
        top1[part] = ~top0[part]

    _on_two_threads(pack)
    first0 = int(np.count_nonzero(top0[0]))
    split = first0 + int(np.count_nonzero(top0[1]))
    packed = np.empty(n, dtype=np.uint64)
    tied: list[npt.NDArray[np.intp]] = [np.zeros(0, dtype=np.intp)] * 2

    def gather_sort(top: int) -> None:
        masks, start, stop, first = (top0, 0, split, first0) if top == 0 else (top1, split, n, half - first0)
        stretch = packed[start:stop]
        np.compress(masks[0], packs[0], out=stretch[:first])
        np.compress(masks[1], packs[1], out=stretch[first:])
        stretch.view(np.float64).sort()
        tied[top] = _tied_pairs(stretch, bits) + start
        _unpack_positions(stretch, bits)

    _on_two_threads(gather_sort)
    ordered = packed.view(np.int64)
    all_tied = np.concatenate(tied)
    if all_tied.size:
        at, run, tied_idx = _tie_runs(ordered, all_tied)
        in_first = tied_idx < half
        full_key = np.empty(tied_idx.size, dtype=np.uint64)
        full_key[in_first] = keys[0][tied_idx[in_first]]
        full_key[~in_first] = keys[1][tied_idx[~in_first] - half]
        _resort_runs(ordered, at, run, tied_idx, full_key)
    return ordered


def _on_two_threads(task: Callable[[int], None]) -> None:
    """``task(0)`` here and ``task(1)`` on the worker pool, both done on return. If no pool
    thread has taken ``task(1)`` by the time ``task(0)`` is done, it runs here instead (no
    waiting on a busy pool, no deadlock when called from a pool thread)."""
    other = worker_pool().submit(task, 1)
    try:
        task(0)
    except BaseException:
        other.cancel()
        raise
    if other.cancel():
        task(1)
    else:
        other.result()


def sorted_by_key(keys: npt.NDArray[np.uint64], idx: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``idx`` (distinct, non-negative) in ascending (key, idx) order, by one numeric sort
    (also the tag order of :mod:`mechanism.alignment.keyed_hash`).

    Each entry is packed into one int64: the top 64 - b bits of its key above its b-bit index
    (b = bits of max idx), with the sign bit flipped so signed order is unsigned order. Sorting
    the packs orders by (top key bits, idx); only entries whose top key bits tie can be out of
    (key, idx) order, and those runs (rare: about size^2 / 2^(65 - b) pairs) are re-sorted by the
    full key.
    """
    if idx.size == 0:
        return idx.astype(np.int64)
    bits = max(1, int(idx.max()).bit_length())
    if bits > 40:  # too few key bits left to make ties rare; exact lexsort instead
        return idx[np.lexsort((idx, keys))]
    low_mask = np.uint64((1 << bits) - 1)
    packed = keys & ~low_mask
    packed |= idx.astype(np.uint64)
    packed ^= np.uint64(1 << 63)
    ordered = np.sort(packed.view(np.int64))  # int64 sorts use the SIMD kernels; uint64 does not
    ordered_u = ordered.view(np.uint64)
    out = (ordered_u & low_mask).astype(np.int64)
    top = ordered_u >> np.uint64(bits)
    tied = np.flatnonzero(top[1:] == top[:-1])
    if tied.size:
        _fix_ties(out, keys, idx, tied)
    return out


def _fix_ties(out: npt.NDArray[np.int64], keys: npt.NDArray[np.uint64], idx: npt.NDArray[np.int64],
              tied: npt.NDArray[np.intp]) -> None:
    """Re-sort, in place, the runs of ``out`` whose packed top key bits tie, by (full key, idx)."""
    at, run, tied_idx = _tie_runs(out, tied)
    holders = np.flatnonzero(np.isin(idx, tied_idx))  # where the tied indices sit in idx
    by_idx = np.argsort(idx[holders])
    full_key = keys[holders[by_idx]][np.searchsorted(idx[holders][by_idx], tied_idx)]
    _resort_runs(out, at, run, tied_idx, full_key)


def _tie_runs(
    out: npt.NDArray[np.int64], tied: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.int64]]:
    """Slots of ``out`` in a tied run (``tied``: i where slots i, i + 1 tie), their run
    numbers and the indices they hold."""
    member = np.zeros(out.size, dtype=bool)
    member[tied] = True
    member[tied + 1] = True
    at = np.flatnonzero(member)
    run_start = np.ones(at.size, dtype=bool)
    run_start[1:] = ~np.isin(at[1:] - 1, tied)  # a new run unless tied to its predecessor
    return at, np.cumsum(run_start), out[at]


def _resort_runs(out: npt.NDArray[np.int64], at: npt.NDArray[np.intp], run: npt.NDArray[np.intp],
                 tied_idx: npt.NDArray[np.int64], full_key: npt.NDArray[np.uint64]) -> None:
    """Each tied run of ``out`` (slots ``at``) in ascending (full key, idx) order."""
    out[at] = tied_idx[np.lexsort((tied_idx, full_key, run))]


# ------------------------------------------------------------------------ the sample by pieces
#: Kept keys a key range of the sharded sample holds about (one merge task each: ~40 MB).
RANGE_KEYS = 1 << 22


#: The largest 64-bit position key: a cut at it keeps every key.
MAX_KEY = (1 << 64) - 1


def kept_bound(m: int) -> float:
    """m + 8 sqrt(m) + 64 (DESIGN 3.2, the sampler's fast path): of n uniform 64-bit keys, at
    least m lie at or below t0 = 2^64 kept_bound(m) / n except with probability < 1e-15, and
    about kept_bound(m) do."""
    return float(m + 8.0 * math.sqrt(m) + 64.0)


def sampling_key(seed: Seed, release_id: str) -> bytes:
    """The ChaCha20 key of the position keys r_i (DESIGN 3.2): HKDF(seed, "sampling", release_id)."""
    return seed.derive("sampling", release_id)


def sample_cut(n: int, m: int) -> int:
    """The key bound t0 = 2^64 (m + 8 sqrt(m) + 64) / n of :func:`sample_positions` (at most
    2^64 - 1): the m-th smallest of n uniform keys lies at or below it except with probability
    < 1e-15. Keeping only keys <= t0 never changes the tuple when at least m are kept."""
    check_sample_size(n, m)
    fraction = kept_bound(m) / n
    return MAX_KEY if fraction >= 1.0 else min(MAX_KEY, int(fraction * 2.0**64))


def keys_at_positions(key: bytes, start: int, count: int) -> npt.NDArray[np.uint64]:
    """r_i for i in [start, start + count), any ``start`` (the keystream is seekable: the
    block holding ``start`` is computed and the words before it dropped)."""
    if start < 0 or count < 0 or start + count > MAX_POSITIONS:
        raise InvalidSampleSizeError(f"positions [{start}, {start + count}) are outside [0, {MAX_POSITIONS})")
    skip = start % _WORDS_PER_BLOCK
    return position_keys(key, start - skip, count + skip)[skip:]


def num_key_ranges(n: int, m: int, range_keys: int = RANGE_KEYS) -> int:
    """How many key ranges split the kept keys (about ``range_keys`` each; at least 1)."""
    expected = min(n, kept_bound(m))
    return max(1, int(-(-expected // range_keys)))


def key_range_width(cut: int, num_ranges: int) -> int:
    """The width of each of ``num_ranges`` equal key ranges covering [0, cut]: key k is in
    range k // width."""
    return cut // num_ranges + 1


def split_kept_keys(
    keys: npt.NDArray[np.uint64], cut: int, width: int, num_ranges: int
) -> list[npt.NDArray[np.intp]]:
    """For each key range, the indices (ascending) of ``keys`` that are <= ``cut`` and fall in
    it: one stable counting pass, no sort of the keys."""
    kept = np.flatnonzero(keys <= np.uint64(cut))
    if width > MAX_KEY:  # one range holding every key
        return [kept]
    small = np.uint16 if num_ranges <= 1 << 16 else np.intp  # numpy's stable sort of 16-bit ints is a radix sort
    ranges = (keys[kept] // np.uint64(width)).astype(small)
    order = np.argsort(ranges, kind="stable")
    bounds = np.searchsorted(ranges[order], np.arange(num_ranges + 1))
    return [kept[order[bounds[r] : bounds[r + 1]]] for r in range(num_ranges)]


def order_of_range(keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """The order of one key range's kept keys, concatenated in position order: ascending
    (r_i, i), ties by position (:func:`sorted_by_key` with the index in the concatenation,
    which ascends with the position)."""
    return sorted_by_key(keys, np.arange(keys.size, dtype=np.int64))


def range_takes(range_counts: npt.NDArray[np.int64], m: int) -> list[tuple[int, int, int]]:
    """(range, offset in the m-tuple, entries it gives) for each key range the first m come
    from, in order; the ranges past the m-th key are left out. :class:`InvalidSampleSizeError`
    if fewer than m keys were kept (the caller keeps every key then: cut = 2^64 - 1)."""
    total = int(np.sum(range_counts))
    if total < m:
        raise InvalidSampleSizeError(f"{total} keys kept below the cut, m = {m} needed")
    takes, offset = [], 0
    for r, count in enumerate(np.asarray(range_counts).tolist()):
        if offset >= m:
            break
        take = min(int(count), m - offset)
        takes.append((r, offset, take))
        offset += take
    return takes
