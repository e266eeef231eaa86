"""Record alignment by keyed hashes of ids (DESIGN 3.1; Sec. V-B "secure hashes of the unique IDs").

Tag. Each id gets the 128-bit tag AES-256-CMAC_K(id bytes) (NIST SP 800-38B; RFC 4493 is the
same construction with AES-128), with K = HKDF(alignment key, "alignment-cmac"). Text ids are
their UTF-8 bytes; integer ids are their decimal text, so "123" in a CSV and 123 in a Parquet
int column get the same tag, and every integer below 10^16 is a single CMAC block.

Why a PRF: CMAC over a block cipher that is a pseudorandom permutation is a PRF on messages of
any length (Iwata and Kurosawa's OMAC proof; the advantage is about q^2 l^2 / 2^128 for q ids
of l blocks, negligible at 10^9 ids), so without the curators' key the tags are
indistinguishable from random 128-bit strings and reveal nothing about the ids beyond equality.
No length prefix is needed: CMAC's two subkeys already separate complete from padded last
blocks, which is what makes it secure on variable-length input.

Speed. The computation is column-wise: ids are grouped by block count, and CBC step j of every
id in a group is one AES-ECB call over all ids at once (AES-NI in ``cryptography``), so there
is no per-id Python work. The curators exchange tags (never ids), keep the ids all of them hold,
and put them in one canonical order: ascending tag, found by one numeric sort of the tags' high
64-bit words (the rare equal high words are broken by the low words) and merged with
``searchsorted``. The server and the researcher never see tags or ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.keys import AlignmentKey
from secure_release.mechanism.sampling import sorted_by_key

U64 = npt.NDArray[np.uint64]
ByteMatrix = npt.NDArray[np.uint8]
TAG_DTYPE = np.dtype([("hi", ">u8"), ("lo", ">u8")])
TagArray = npt.NDArray[np.void]
IdArray = Sequence[str] | npt.NDArray[np.str_] | npt.NDArray[np.bytes_] | npt.NDArray[np.integer]
_BLOCK = 16
_RB = 0x87  # the constant of the CMAC subkey doubling in GF(2^128)


class DuplicateIdError(SecureReleaseError):
    """A curator's id column repeats an id; ids must be unique per curator."""


def _ecb(key: bytes, blocks: ByteMatrix) -> ByteMatrix:
    """AES-ECB of every 16-byte row of ``blocks`` (one call, no Python loop over rows)."""
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    out = np.empty(blocks.size + _BLOCK, dtype=np.uint8)
    written = enc.update_into(np.ascontiguousarray(blocks).reshape(-1).data, out.data)
    return out[:written].reshape(-1, _BLOCK)


def _double(block: bytes) -> bytes:
    """Multiplication by x in GF(2^128) (CMAC subkey generation, SP 800-38B 6.1)."""
    value = int.from_bytes(block, "big") << 1
    if value >> 128:
        value = (value & (2**128 - 1)) ^ _RB
    return value.to_bytes(_BLOCK, "big")


def cmac_subkeys(key: bytes) -> tuple[bytes, bytes]:
    """CMAC subkeys (K1, K2) of an AES key."""
    k1 = _double(_ecb(key, np.zeros((1, _BLOCK), dtype=np.uint8)).tobytes())
    return k1, _double(k1)


def aes_cmac(key: bytes, messages: ByteMatrix, lengths: npt.NDArray[np.integer]) -> ByteMatrix:
    """AES-CMAC tag (16 bytes) of each message: row i of ``messages`` holds message i in its
    first ``lengths[i]`` bytes and zeros after them. Key of 16, 24 or 32 bytes. Column-wise:
    one AES-ECB call per block position per group of messages with the same block count."""
    lengths64: npt.NDArray[np.int64] = np.asarray(lengths, dtype=np.int64)
    if lengths64.size == 0:
        return np.zeros((0, _BLOCK), dtype=np.uint8)
    k1, k2 = (np.frombuffer(k, dtype=np.uint8) for k in cmac_subkeys(key))
    num_blocks = np.maximum(1, -(-lengths64 // _BLOCK))
    counts = np.flatnonzero(np.bincount(num_blocks))
    if counts.size == 1:  # the common case: no gather, no scatter
        return _cmac_group(key, messages, lengths64, int(counts[0]), k1, k2)
    tags = np.zeros((lengths64.size, _BLOCK), dtype=np.uint8)
    for count in counts:
        rows = np.flatnonzero(num_blocks == count)
        tags[rows] = _cmac_group(key, messages[rows], lengths64[rows], int(count), k1, k2)
    return tags


def _cmac_group(key: bytes, messages: ByteMatrix, lengths: npt.NDArray[np.int64], count: int,
                k1: ByteMatrix, k2: ByteMatrix) -> ByteMatrix:
    """CMAC of zero-filled messages that all take ``count`` blocks."""
    width = count * _BLOCK
    padded = np.zeros((lengths.size, width), dtype=np.uint8)
    take = min(width, messages.shape[1])
    padded[:, :take] = messages[:, :take]
    partial = np.flatnonzero(lengths < width)
    padded[partial, lengths[partial]] = 0x80  # 10* padding of an incomplete last block
    last = padded[:, width - _BLOCK :]
    last ^= k1
    last[partial] ^= k1 ^ k2  # complete last blocks take K1, padded ones K2
    state = padded[:, :_BLOCK]
    for j in range(count):
        if j:
            state ^= padded[:, j * _BLOCK : (j + 1) * _BLOCK]
        state = _ecb(key, state)
    return state


def id_bytes(ids: IdArray) -> tuple[ByteMatrix, npt.NDArray[np.int64]]:
    """The ids as a (rows, width) byte matrix of their UTF-8 bytes (zero-filled) and lengths.

    Integer ids become their decimal text. ASCII text (the common case) is narrowed from
    numpy's UTF-32 in one vectorized pass; other text goes through numpy's UTF-8 encoder.
    """
    arr = np.asarray(ids)
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.bytes_)
    if arr.dtype.kind == "U":
        arr = _utf8(arr)
    if arr.dtype.kind != "S":
        raise ShapeMismatchError(f"ids must be text or integers, got dtype {arr.dtype}")
    width = max(arr.dtype.itemsize, 1)
    matrix = np.ascontiguousarray(arr).view(np.uint8).reshape(arr.size, width) if arr.dtype.itemsize else (
        np.zeros((arr.size, 1), dtype=np.uint8))
    return matrix, _lengths(matrix)


def _utf8(text: npt.NDArray[np.str_]) -> npt.NDArray[np.bytes_]:
    width = text.dtype.itemsize // 4
    if width == 0:
        return np.zeros(text.size, dtype="S1")
    points = np.ascontiguousarray(text).view(np.uint32).reshape(text.size, width)
    if points.size and int(points.max()) >= 0x80:
        return np.asarray(np.strings.encode(text, "utf-8"))
    return points.astype(np.uint8).view(f"S{width}").reshape(text.size)


def _lengths(matrix: ByteMatrix) -> npt.NDArray[np.int64]:
    """Length of each zero-filled row: one past its last non-zero byte."""
    width = matrix.shape[1]
    nonzero = matrix != 0
    last_from_end = np.argmax(nonzero[:, ::-1], axis=1)
    return np.where(nonzero.any(axis=1), width - last_from_end, 0).astype(np.int64)


def id_tags(ids: IdArray, key: AlignmentKey) -> TagArray:
    """128-bit keyed tags of the ids: AES-256-CMAC under HKDF(key, "alignment-cmac")."""
    matrix, lengths = id_bytes(ids)
    tags = aes_cmac(key.derive("alignment-cmac"), matrix, lengths)
    return tags.reshape(-1).view(TAG_DTYPE).copy()


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
    """The (hi, lo) halves of tags as native uint64."""
    return tags["hi"].astype(np.uint64), tags["lo"].astype(np.uint64)


def _tag_order(hi: U64, lo: U64) -> npt.NDArray[np.int64]:
    """Order of tags by (hi, lo): one numeric sort of hi; lexsort only if two hi words tie
    (probability about size^2 / 2^65)."""
    order = sorted_by_key(hi, np.arange(hi.size, dtype=np.int64))
    sorted_hi = hi[order]
    if sorted_hi.size > 1 and bool(np.any(sorted_hi[1:] == sorted_hi[:-1])):
        return np.lexsort((lo, hi))
    return order


def _sorted_unique(tags: TagArray) -> tuple[U64, U64, npt.NDArray[np.int64], bool]:
    """Sorted (hi, lo) words without repeats, the row of each, and whether there were repeats."""
    hi, lo = _words(tags)
    order = _tag_order(hi, lo)
    hi, lo = hi[order], lo[order]
    fresh = np.ones(order.size, dtype=bool)
    fresh[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    repeated = not bool(np.all(fresh))
    return hi[fresh], lo[fresh], order[fresh], repeated


def _locate(hi: U64, lo: U64, want_hi: U64, want_lo: U64) -> npt.NDArray[np.intp]:
    """For each wanted tag, its index in the sorted, repeat-free (hi, lo), or -1 if absent."""
    at = np.searchsorted(hi, want_hi)
    found = np.full(want_hi.size, -1, dtype=np.intp)
    inside = at < hi.size
    # equal hi words are rare; where one occurs, step along the run to the matching lo
    while True:
        cand = np.flatnonzero(inside)
        if cand.size == 0:
            return found
        pos = at[cand]
        same_hi = hi[pos] == want_hi[cand]
        hit = same_hi & (lo[pos] == want_lo[cand])
        found[cand[hit]] = pos[hit]
        step = same_hi & ~hit
        inside[:] = False
        inside[cand[step]] = True
        at[cand[step]] += 1
        inside &= at < hi.size


def common_tags(tag_lists: Sequence[TagArray]) -> TagArray:
    """The tags every curator holds, in ascending (hi, lo) order: the canonical order."""
    if not tag_lists:
        raise ShapeMismatchError("alignment needs the tags of at least one curator")
    hi, lo, _, _ = _sorted_unique(tag_lists[0])
    for other in tag_lists[1:]:
        o_hi, o_lo, _, _ = _sorted_unique(other)
        keep = _locate(o_hi, o_lo, hi, lo) >= 0
        hi, lo = hi[keep], lo[keep]
    common = np.empty(hi.size, dtype=TAG_DTYPE)
    common["hi"], common["lo"] = hi, lo
    return common


def align(own_tags: TagArray, agreed: TagArray) -> Alignment:
    """This curator's row order for the agreed common tags (each must occur once here)."""
    hi, lo, rows, repeated = _sorted_unique(own_tags)
    if repeated:
        raise DuplicateIdError("an id occurs more than once in this curator's table; ids must be unique")
    ag_hi, ag_lo = _words(agreed)
    at = _locate(hi, lo, ag_hi, ag_lo)
    if np.any(at < 0):
        raise ShapeMismatchError("an agreed tag is not among this curator's ids")
    return Alignment(rows[at].astype(np.int64), int(own_tags.size), int(agreed.size))
