"""Tag shards: the pure array steps of a curator's sharded alignment (``--engine dask``).

Tags are uniform 128-bit keyed hashes (:mod:`secure_release.mechanism.alignment.keyed_hash`), so their top
``shard_bits`` bits split them into ``2^shard_bits`` shards of about equal size with no
coordination. Ascending shard, then ascending (hi, lo) within a shard, is ascending tag: the
canonical row order of DESIGN 3.1 (``alignment.common_tags``), with no global sort. Each function
here is arrays in, arrays out: the curator's engine runs it in-process or on a Dask worker
(:mod:`secure_release.curator.cluster.shards` wraps it with the partition reads).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray
from secure_release.mechanism.errors import SecureReleaseError

#: Tags a shard holds on average: 4 M (64 MiB of tags), so that the all-to-all step stays at
#: partitions x shards small tasks (2,048 at 10^8 rows in 64 files) and a shard's sort fits a
#: worker of 2 GiB many times over.
SHARD_TAGS = 1 << 22
#: At most 2^16 shards (2.7 * 10^11 rows at 4 M a shard).
MAX_SHARD_BITS = 16

#: How a worker holds tags: (hi, lo) as native little-endian words, so sorting and matching read
#: them with no byte swap; :func:`shard_tags` turns a shard back into the wire's big-endian tags.
WORK_DTYPE = np.dtype([("hi", "<u8"), ("lo", "<u8")])

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


class ShardError(SecureReleaseError):
    """A shard stage was given inconsistent input (a bug or a tampered stream, never bad rows)."""


#: Above this many pieces (partitions x shards) a curator's shuffle goes in two levels
#: (:func:`group_bits_for`): 96 partitions x 128 shards at 3 * 10^8 rows were 12,288 pieces of
#: 0.4 MB a curator, every one a task, a key and a spill file of its own.
TWO_LEVEL_PIECES = 4096


def group_bits_for(num_partitions: int, shard_bits: int, max_pieces: int = TWO_LEVEL_PIECES) -> int:
    """The group bits of a two-level shuffle, 0 for one level. With ``g`` of them each partition
    is split into ``2^g`` groups by the top ``g`` bits of its tags; the pieces of one group from
    ``2^g`` partitions are joined (about one partition's rows) and split by the next
    ``shard_bits - g`` bits. That is ``P (2^g + 2^(shard_bits - g))`` pieces for ``P`` partitions
    rather than ``P 2^shard_bits``: fewest at ``g = shard_bits // 2``."""
    if num_partitions << shard_bits <= max_pieces or shard_bits < 2:
        return 0
    return shard_bits // 2


def shard_bits_for(num_rows: int, shard_tags: int = SHARD_TAGS) -> int:
    """Bits of the shard number for ``num_rows`` tags: about ``shard_tags`` a shard."""
    if num_rows <= shard_tags:
        return 0
    return min(MAX_SHARD_BITS, math.ceil(math.log2(num_rows / shard_tags)))


def shard_of(tags: TagArray, shard_bits: int) -> npt.NDArray[np.intp]:
    """The shard of each tag: its top ``shard_bits`` bits."""
    return top_bits(tag_words(tags)[0], shard_bits)


def top_bits(hi: U64, bits: int) -> npt.NDArray[np.intp]:
    """The top ``bits`` bits of each high word (0 <= bits <= 63): a tag's shard, or with more
    bits its unit within the shard."""
    if bits == 0:
        return np.zeros(hi.size, dtype=np.intp)
    return (hi >> np.uint64(64 - bits)).astype(np.intp)


def held_bytes(value: Any) -> int:
    """The bytes an array, or a tuple or list of them, or a :class:`HoldsArrays`, holds."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, tuple | list):
        return sum(held_bytes(v) for v in value)
    if isinstance(value, HoldsArrays):
        return sys.getsizeof(value)
    return 0


def owned(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``array`` if it owns its memory (or is a view of all of an array that does), else a copy.

    Dask deserializes an object spilled to disk or sent by another worker from one buffer, and
    its arrays are views into that buffer: a piece taken from a partition's pieces read back from
    disk kept all of the partition's 53 MB alive, where Dask counted the piece's 0.4 MB (12 such
    buffers, 620 MB, in one worker of 2 GiB at 3 * 10^8 rows). A task that hands on a part of
    such an object hands on an owned copy."""
    base = array.base
    if base is None or (isinstance(base, np.ndarray) and base.base is None and base.nbytes == array.nbytes):
        return array
    return array.copy()


class HoldsArrays:
    """A dataclass whose ``sys.getsizeof`` counts the arrays it holds. Dask sizes a task's
    result with ``sys.getsizeof`` unless it knows the type: without this a piece, a shard or a
    partition's pieces (tens of MB) counted 56 bytes, so a worker's "managed" memory was near
    zero, it spilled only once its process passed 70% of its limit, chose what to spill blind,
    and its nanny killed it at 95% (3 * 10^8 rows a curator on workers of 2 GiB)."""

    def __sizeof__(self) -> int:
        assert is_dataclass(self)
        return object.__sizeof__(self) + sum(held_bytes(getattr(self, f.name)) for f in fields(self))


@dataclass(frozen=True)
class Piece(HoldsArrays):
    """One partition's rows of one shard (tags and symbols, in any order)."""

    tags: TagArray
    symbols: npt.NDArray[np.unsignedinteger]


def split_by_shard(
    tags: TagArray, shard_bits: int, symbols: npt.NDArray[np.unsignedinteger], skip_bits: int = 0
) -> tuple[Piece, ...]:
    """``(tags, symbols)`` split into ``2^shard_bits`` pieces by the tags' top bits (one stable
    argsort of 16-bit shard numbers: a radix sort; each shard is sorted once, at its merge).
    ``skip_bits``: rows whose top ``skip_bits`` bits are all alike (one group of a two-level
    shuffle), split into ``2^(shard_bits - skip_bits)`` pieces by the bits that follow."""
    if not 0 <= skip_bits <= shard_bits:
        raise ShardError(f"skip_bits {skip_bits} must be between 0 and shard_bits {shard_bits}")
    shard = shard_of(tags, shard_bits).astype(np.uint16)  # at most 2^16 shards
    if skip_bits:
        shard &= np.uint16((1 << (shard_bits - skip_bits)) - 1)
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange((1 << (shard_bits - skip_bits)) + 1))
    records = _records(tags)
    # one gather a piece: each piece owns its arrays (not a view of one array), so a worker frees
    # a piece as soon as its shard is merged, not the whole partition once every shard is
    return tuple(
        Piece(records[order[start:stop]].view(tags.dtype), symbols[order[start:stop]])
        for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    )


def _records(tags: TagArray) -> npt.NDArray[np.void]:
    """Tags as opaque 16-byte items: numpy gathers those 1.7x as fast as the structured items."""
    return np.ascontiguousarray(tags).view("V16")


def tag_words(tags: TagArray) -> tuple[U64, U64]:
    """The high and low words of tags in either layout (views for :data:`WORK_DTYPE`)."""
    if tags.dtype != WORK_DTYPE:
        tags = tags.astype(WORK_DTYPE)
    return tags["hi"], tags["lo"]


@dataclass(frozen=True)
class Shard(HoldsArrays):
    """One shard of a curator's rows, ascending by tag; ``repeated``: every tag that occurs
    more than once (repeated ids; empty for a valid table)."""

    tags: TagArray
    symbols: npt.NDArray[np.unsignedinteger]
    repeated: TagArray

    @property
    def size(self) -> int:
        return int(self.tags.size)


def tag_order(hi: U64, lo: U64) -> I64:
    """The order that sorts tags ascending by (hi, lo), the way ``alignment.sort_tags`` sorts a
    whole table. Below :data:`RADIX_TAGS` tags: one int64 sort of packs (the bits of ``hi`` below
    the prefix all of them share, then the row number in the low bits; 10x numpy's uint64
    argsort); from it, two 16-bit radix passes (:func:`_radix_ordered`). Either way the runs of
    equal prefix are then put in exact (hi, lo) order."""
    return _ordered(hi, lo)[0]


#: From this many tags a shard is ordered by :func:`_radix_ordered` (two 16-bit radix passes),
#: below it by one packed int64 sort (a sort of cache-resident size is the faster there).
RADIX_TAGS = 1 << 16


def _ordered(hi: U64, lo: U64) -> tuple[I64, I64 | None]:
    """:func:`tag_order`, and every position ``i`` of the sorted order whose packed prefix equals
    that of ``i + 1`` (equal tags have equal prefixes, so only these can be repeats); None when
    the tags were ordered by a lexsort of both words (then any neighbours may be equal)."""
    size = int(hi.size)
    if size < 2:
        return np.arange(size, dtype=np.int64), np.zeros(0, dtype=np.int64)
    shared = 64 - (int(hi.min()) ^ int(hi.max())).bit_length()  # a shard's top bits are all equal
    if size >= RADIX_TAGS and shared < 64:
        return _radix_ordered(hi, lo, shared)
    row_bits = max(1, (size - 1).bit_length())
    if shared == 64 or row_bits > 40:  # every hi equal, or too many rows for a useful prefix
        return np.lexsort((lo, hi)).astype(np.int64), None
    packs = hi << np.uint64(shared)
    packs &= ~np.uint64((1 << row_bits) - 1)
    packs |= np.arange(size, dtype=np.uint64)
    packs ^= np.uint64(1 << 63)  # int64 order = unsigned order; int64 sorts use the SIMD kernels
    signed = packs.view(np.int64)
    signed.sort()
    order = signed & np.int64((1 << row_bits) - 1)
    signed >>= np.int64(row_bits)  # the prefixes, in place
    tied = np.flatnonzero(signed[1:] == signed[:-1])
    if tied.size:
        _order_ties(order, tied, hi, lo)
    return order, tied


def _radix_ordered(hi: U64, lo: U64, shared: int) -> tuple[I64, I64]:
    """:func:`_ordered` of a large shard by an LSD radix sort on the 32 bits of ``hi`` below the
    ``shared`` top bits all its tags have in common: two stable argsorts of 16-bit digits (numpy
    sorts those by counting, O(n)), 0.6x the time of the packed int64 sort at 3 M tags on this
    machine. The prefix is those 32 bits; a run of equal prefixes (about n^2 / 2^33 pairs of
    uniform tags: 1,100 at 3 M) is put in exact (hi, lo) order by :func:`_order_ties`. Stable
    passes keep the rows of a run in row order before that, so the result is :func:`tag_order`'s."""
    top = hi << np.uint64(shared)
    low_digit = (top >> np.uint64(32)).astype(np.uint16)  # the truncation keeps bits 32-47
    high_digit = (top >> np.uint64(48)).astype(np.uint16)
    del top  # the digits are 4 bytes a tag; the sort's indices then 8 each, at most two at once
    first = np.argsort(low_digit, kind="stable")
    del low_digit
    second = np.argsort(high_digit[first], kind="stable")
    del high_digit
    order = first[second].astype(np.int64, copy=False)
    del first, second
    prefixes = ((hi << np.uint64(shared)) >> np.uint64(32)).astype(np.uint32)[order]
    tied = np.flatnonzero(prefixes[1:] == prefixes[:-1]).astype(np.int64, copy=False)
    if tied.size:
        _order_ties(order, tied, hi, lo)
    return order, tied


def _order_ties(order: I64, tied: I64, hi: U64, lo: U64) -> None:
    """Put each run of equal packed prefix (about n^2 / 2^(65 - max(row bits, shared bits)) of
    them, or every repeated id's run) of ``order`` in exact (hi, lo) order, in place: one lexsort of all
    the runs' members together (work in the number of ties, not of rows). A run with a smaller
    prefix holds smaller high words, so the members sorted as one list fall back into their own
    runs' places."""
    members = np.union1d(tied, tied + 1)
    rows = order[members]
    order[members] = rows[np.lexsort((lo[rows], hi[rows]))]


def merge_pieces(pieces: Sequence[Piece]) -> Shard:
    """A shard from every partition's piece of it, sorted by tag (ascending (hi, lo) as
    unsigned integers, as :func:`~secure_release.mechanism.alignment.keyed_hash.common_tags` orders them);
    its repeated tags found among the neighbours :func:`_ordered` saw tied."""
    tags = np.concatenate([p.tags for p in pieces]) if pieces else np.zeros(0, dtype=WORK_DTYPE)
    symbols = np.concatenate([p.symbols for p in pieces]) if pieces else np.zeros(0, dtype=np.uint32)
    order, tags, repeated = sort_tags_once(tags)
    return Shard(tags, symbols[order], repeated)


def sort_tags_once(tags: TagArray) -> tuple[I64, TagArray, TagArray]:
    """``tags`` ascending: the order that sorts them (:func:`tag_order`), the sorted tags (as
    :data:`WORK_DTYPE`) and every tag that occurs more than once (found among the neighbours
    :func:`_ordered` saw tied): what a shard's merge needs, whatever else it reorders alongside."""
    if tags.dtype != WORK_DTYPE:
        tags = tags.astype(WORK_DTYPE)
    order, tied = _ordered(tags["hi"], tags["lo"])
    tags = _records(tags)[order].view(WORK_DTYPE)
    hi, lo = tags["hi"], tags["lo"]
    if tied is None:
        tied = np.arange(max(0, hi.size - 1), dtype=np.int64)
    same = tied[(hi[tied + 1] == hi[tied]) & (lo[tied + 1] == lo[tied])]
    return order, tags, np.unique(tags[same]).astype(TAG_DTYPE)


def intersect_shard(own: Shard, others: Sequence[tuple[TagArray, I64]]) -> tuple[I64, list[I64]]:
    """One shard's common tags: the leader's rows of them (indices into ``own``) and, for each
    other curator, the ids it submitted them under (``others[j]`` = that curator's tags of this
    shard and their submission indices), all in ascending tag order. A tag another curator sent
    twice is refused (:class:`ShardError`): ids must be unique, and a follower checked its own."""
    common_hi, common_lo = tag_words(own.tags)
    keep = np.ones(common_hi.size, dtype=bool)
    matches: list[tuple[I64, I64]] = []
    for tags, submitted in others:
        hi, lo = tag_words(tags)
        sub = np.asarray(submitted, dtype=np.int64)
        if not ascending(hi, lo):  # a sharded follower sends its tags ascending already
            order = tag_order(hi, lo)
            hi, lo, sub = hi[order], lo[order], sub[order]
        if hi.size > 1 and bool(np.any((hi[1:] == hi[:-1]) & (lo[1:] == lo[:-1]))):
            raise ShardError("a curator sent the same tag twice; ids must be unique")
        own_at, their_at = _sorted_intersection(common_hi, common_lo, hi, lo)
        hit = np.zeros(common_hi.size, dtype=bool)
        hit[own_at] = True
        keep &= hit
        matches.append((own_at, sub[their_at]))
    own_rows = np.flatnonzero(keep).astype(np.int64)
    other_rows: list[I64] = []
    for own_at, their_sub in matches:
        at_of_own = np.full(common_hi.size, -1, dtype=np.int64)
        at_of_own[own_at] = their_sub
        other_rows.append(at_of_own[own_rows])
    return own_rows, other_rows


def unit_run(tags: TagArray, unit: int, bits: int) -> tuple[int, int]:
    """Where the tags whose top ``bits`` bits are ``unit`` (a shard's unit: its shard's bits and
    a few more) are in ascending ``tags``: rows ``start .. stop - 1``."""
    hi = tag_words(tags)[0]
    if bits == 0:
        return 0, int(hi.size)
    shift = 64 - bits
    start = int(np.searchsorted(hi, np.uint64(unit << shift)))
    stop = int(hi.size) if unit + 1 == 1 << bits else int(np.searchsorted(hi, np.uint64((unit + 1) << shift)))
    return start, stop


def in_unit(tags: TagArray, unit: int, bits: int) -> npt.NDArray[np.bool_]:
    """Which tags' top ``bits`` bits are ``unit`` (a shard's unit: its shard's bits and a few more)."""
    inside: npt.NDArray[np.bool_] = top_bits(tag_words(tags)[0], bits) == unit
    return inside


def within_unit(tags: TagArray, unit: int, bits: int) -> bool:
    """Whether every tag's top ``bits`` bits are ``unit`` (no tags: true)."""
    return bool(np.all(in_unit(tags, unit, bits)))


def ascending(hi: U64, lo: U64) -> bool:
    """Whether (hi, lo) pairs are strictly ascending."""
    if hi.size < 2:
        return True
    step_hi = hi[1:] >= hi[:-1]
    if not bool(np.all(step_hi)):
        return False
    tied = np.flatnonzero(hi[1:] == hi[:-1])
    return bool(np.all(lo[tied + 1] > lo[tied]))


def _sorted_intersection(a_hi: U64, a_lo: U64, b_hi: U64, b_lo: U64) -> tuple[I64, I64]:
    """Positions in two ascending, repeat-free (hi, lo) lists of the pairs both hold: one
    searchsorted of the (sorted, so cache-friendly) ``b_hi`` in ``a_hi``; if ``a_hi`` has equal
    neighbours (rare), the exact search on both words."""
    if a_hi.size > 1 and bool(np.any(a_hi[1:] == a_hi[:-1])):
        a = np.empty(a_hi.size, dtype=[("hi", "<u8"), ("lo", "<u8")])
        a["hi"], a["lo"] = a_hi, a_lo
        b = np.empty(b_hi.size, dtype=a.dtype)
        b["hi"], b["lo"] = b_hi, b_lo
        at = np.searchsorted(a, b)  # structured compare: hi first, then lo
    else:
        at = np.searchsorted(a_hi, b_hi)
    inside = at < a_hi.size
    found = np.zeros(b_hi.size, dtype=bool)
    found[inside] = (a_hi[at[inside]] == b_hi[inside]) & (a_lo[at[inside]] == b_lo[inside])
    return at[found].astype(np.int64), np.flatnonzero(found).astype(np.int64)


def gather_symbols(shard: Shard, rows: I64, dtype: str = "uint32") -> npt.NDArray[np.unsignedinteger]:
    """A shard's symbols at ``rows`` (its common rows in canonical order), as ``dtype``."""
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= shard.size):
        raise ShardError(f"a row order names a row outside this shard's {shard.size} rows")
    return shard.symbols[rows].astype(dtype)


def symbol_dtype(alphabet_size: int) -> str:
    """The narrowest unsigned type holding symbols below ``alphabet_size``."""
    for name, top in (("uint8", 1 << 8), ("uint16", 1 << 16)):
        if alphabet_size <= top:
            return name
    return "uint32"
