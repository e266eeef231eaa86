"""Record alignment by keyed hashes of ids (DESIGN 3.1; Sec. V-B "secure hashes of the unique IDs").

Each id (UTF-8 text) gets a 128-bit tag: two SipHash-2-4 values under two 128-bit keys derived
from the curators' shared :class:`~mechanism.keys.AlignmentKey`. SipHash is a PRF built for short
inputs; here it is vectorized over all ids of the same byte length (numpy uint64 lanes), so
there is no per-row Python loop. The curators exchange tags (never ids), keep the ids all of them
hold, and put them in one canonical order: ascending tag. The server and the researcher never
see tags or ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.keys import AlignmentKey

U64 = npt.NDArray[np.uint64]
TAG_DTYPE = np.dtype([("hi", ">u8"), ("lo", ">u8")])
TagArray = npt.NDArray[np.void]


class DuplicateIdError(SecureReleaseError):
    """A curator's id column repeats an id; ids must be unique per curator."""


def _rotl(x: U64, bits: int) -> U64:
    return (x << np.uint64(bits)) | (x >> np.uint64(64 - bits))


def _sipround(v0: U64, v1: U64, v2: U64, v3: U64) -> tuple[U64, U64, U64, U64]:
    v0 = v0 + v1
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = v2 + v3
    v3 = _rotl(v3, 16) ^ v2
    v0 = v0 + v3
    v3 = _rotl(v3, 21) ^ v0
    v2 = v2 + v1
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(key: bytes, messages: npt.NDArray[np.uint8], length: int) -> U64:
    """SipHash-2-4 of each row of ``messages`` (shape (rows, >= length) bytes), all of ``length``.

    Reference: Aumasson and Bernstein, "SipHash: a fast short-input PRF" (2012).
    """
    if len(key) != 16:
        raise ShapeMismatchError("SipHash needs a 16-byte key")
    rows = messages.shape[0]
    k0 = np.uint64(int.from_bytes(key[:8], "little"))
    k1 = np.uint64(int.from_bytes(key[8:], "little"))
    v0 = np.full(rows, k0 ^ np.uint64(0x736F6D6570736575), dtype=np.uint64)
    v1 = np.full(rows, k1 ^ np.uint64(0x646F72616E646F6D), dtype=np.uint64)
    v2 = np.full(rows, k0 ^ np.uint64(0x6C7967656E657261), dtype=np.uint64)
    v3 = np.full(rows, k1 ^ np.uint64(0x7465646279746573), dtype=np.uint64)
    padded_width = (length // 8 + 1) * 8
    block = np.zeros((rows, padded_width), dtype=np.uint8)
    block[:, :length] = messages[:, :length]
    block[:, padded_width - 1] = length & 0xFF  # the final word carries the length byte
    words = block.view("<u8").astype(np.uint64)
    for w in range(words.shape[1]):
        m = words[:, w]
        v3 = v3 ^ m
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 = v0 ^ m
    v2 = v2 ^ np.uint64(0xFF)
    for _ in range(4):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return np.asarray(v0 ^ v1 ^ v2 ^ v3, dtype=np.uint64)


def _as_bytes(
    ids: Sequence[str] | npt.NDArray[np.str_] | npt.NDArray[np.bytes_],
) -> npt.NDArray[np.bytes_]:
    arr = np.asarray(ids)
    if arr.dtype.kind == "U":
        arr = np.strings.encode(arr, "utf-8")
    if arr.dtype.kind != "S":
        raise ShapeMismatchError(f"ids must be text, got dtype {arr.dtype}")
    return np.asarray(arr)


def id_tags(
    ids: Sequence[str] | npt.NDArray[np.str_] | npt.NDArray[np.bytes_], key: AlignmentKey
) -> TagArray:
    """128-bit keyed tags of the ids (vectorized SipHash-2-4 under two derived keys)."""
    raw = _as_bytes(ids)
    tags = np.zeros(raw.size, dtype=TAG_DTYPE)
    if raw.size == 0:
        return tags
    width = max(raw.dtype.itemsize, 1)
    matrix = np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=np.uint8).reshape(
        raw.size, width
    )
    lengths = np.strings.str_len(raw)
    key_hi = key.derive("alignment-tag-hi", length=16)
    key_lo = key.derive("alignment-tag-lo", length=16)
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length)
        group = matrix[rows]
        tags["hi"][rows] = siphash24(key_hi, group, int(length))
        tags["lo"][rows] = siphash24(key_lo, group, int(length))
    return tags


@dataclass(frozen=True)
class Alignment:
    """One curator's view of the agreed alignment."""

    row_order: npt.NDArray[np.int64]
    """Indices into this curator's table, in the canonical (ascending tag) order."""
    num_rows: int
    num_matched: int

    @property
    def num_unmatched(self) -> int:
        return self.num_rows - self.num_matched


def _words(tags: TagArray) -> tuple[U64, U64]:
    """The (hi, lo) halves of tags as native uint64 (numeric sorts are ~50x faster than
    sorting the structured records)."""
    return tags["hi"].astype(np.uint64), tags["lo"].astype(np.uint64)


def _sorted_unique(tags: TagArray) -> tuple[TagArray, bool]:
    """Tags in ascending (hi, lo) order without repeats, and whether there were repeats."""
    hi, lo = _words(tags)
    order = np.lexsort((lo, hi))
    hi, lo = hi[order], lo[order]
    fresh = np.ones(order.size, dtype=bool)
    fresh[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    return tags[order][fresh], bool(not np.all(fresh))


def common_tags(tag_lists: Sequence[TagArray]) -> TagArray:
    """The tags every curator holds, in ascending (hi, lo) order: the canonical order."""
    if not tag_lists:
        raise ShapeMismatchError("alignment needs the tags of at least one curator")
    uniques = [_sorted_unique(t)[0] for t in tag_lists]
    merged = np.concatenate(uniques)
    hi, lo = _words(merged)
    order = np.lexsort((lo, hi))
    hi, lo, merged = hi[order], lo[order], merged[order]
    starts = np.ones(order.size, dtype=bool)
    starts[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    first = np.flatnonzero(starts)
    run_length = np.diff(np.append(first, order.size))
    common: TagArray = merged[first[run_length == len(tag_lists)]]
    return common


def align(own_tags: TagArray, agreed: TagArray) -> Alignment:
    """This curator's row order for the agreed common tags (each must occur once here).

    Own and agreed tags are sorted together by (hi, lo, source); as both are free of repeats
    and agreed is a subset, each agreed tag lands right after its own row.
    """
    if _sorted_unique(own_tags)[1]:
        raise DuplicateIdError("an id occurs more than once in this curator's table; ids must be unique")
    own_hi, own_lo = _words(own_tags)
    ag_hi, ag_lo = _words(agreed)
    hi = np.concatenate([own_hi, ag_hi])
    lo = np.concatenate([own_lo, ag_lo])
    source = np.concatenate([np.zeros(own_hi.size, np.int8), np.ones(ag_hi.size, np.int8)])
    order = np.lexsort((source, lo, hi))
    at = np.flatnonzero(source[order] == 1)
    if at.size and at[0] == 0:
        raise ShapeMismatchError("an agreed tag is not among this curator's ids")
    match = order[at - 1]
    if np.any(source[match] != 0) or np.any(hi[match] != hi[order[at]]) or np.any(lo[match] != lo[order[at]]):
        raise ShapeMismatchError("an agreed tag is not among this curator's ids")
    # agreed entries come out in ascending (hi, lo); list rows in the agreed array's own order
    rows = np.empty(agreed.size, dtype=np.int64)
    rows[order[at] - own_hi.size] = match
    return Alignment(rows, int(own_tags.size), int(agreed.size))
