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
is no per-id Python work. Arrow string/binary arrays are read straight from their buffers (no
per-id objects, no numpy unicode copy): ids of at most 12 bytes through Arrow's binary-view
layout, whose 16-byte views hold the bytes inline and zero-padded (the columnar spec requires
it), ids of one common length as a reshaped data buffer, any others by a 16-byte gather at
their offsets. The last block's 10* padding and subkey are one XOR with a 17-row table indexed
by the bytes in that block; bytes past an id are cleared with a mask table.

Alignment. The curators exchange tags (never ids), keep the ids all of them hold, and put them
in one canonical order: ascending (hi, lo) tag words. Each list is sorted once, as int64 packs
of (top bits of the high word, row) (:func:`sort_tags`; a curator sorts its own while it checks
for repeated ids, and the leader reuses that sort). :func:`common_tags` and :func:`align_all`
join each further list to the matches so far by a binary search of its prefixes
(``np.searchsorted``, piece by piece) and confirm every prefix match on the full 16-byte tags;
prefixes shared by two tags of one list (a repeated id, or a rare collision of the top bits)
are matched apart by an exact sort of the full tags, so the result is exact for any input.
:func:`align` runs the same join of one curator's tags against the agreed, sorted list. The
server and the researcher never see tags or ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.primitives.keys import AlignmentKey
from secure_release.mechanism.primitives.stream import worker_pool

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
ByteMatrix = npt.NDArray[np.uint8]
TAG_DTYPE = np.dtype([("hi", ">u8"), ("lo", ">u8")])
TAG_BYTES = TAG_DTYPE.itemsize  # 16: a tag on the wire and in the leader's spool
TagArray = npt.NDArray[np.void]
#: numpy text/bytes/integer arrays, sequences of str, or pyarrow string/binary/integer
#: (Chunked)Arrays (typed Any: pyarrow has no type stubs).
IdArray = Sequence[str] | npt.NDArray[np.str_] | npt.NDArray[np.bytes_] | npt.NDArray[np.integer] | Any
_BLOCK = 16
_RB = 0x87  # the constant of the CMAC subkey doubling in GF(2^128)
_INLINE = 12  # Arrow binary-view: values up to 12 bytes are inline in their 16-byte view
_SIGN = np.uint64(1 << 63)


class DuplicateIdError(SecureReleaseError):
    """A curator's id column repeats an id; ids must be unique per curator."""


def _ecb(key: bytes, blocks: ByteMatrix) -> ByteMatrix:
    """AES-ECB of every 16-byte row of ``blocks`` (one call, no Python loop over rows)."""
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    flat = np.ascontiguousarray(blocks).reshape(-1)
    out = np.empty(flat.size + _BLOCK, dtype=np.uint8)
    written = enc.update_into(flat.data, out.data)
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


@dataclass(frozen=True)
class _LastBlock:
    """Per count r in [0, 16] of message bytes in the last block: ``mask`` keeps those r bytes,
    ``add`` is the 10* padding (r < 16) XOR the subkey (K1 if r == 16 else K2). Rows are 16 bytes,
    also viewable as two native uint64 words or four uint32 words."""

    mask: ByteMatrix
    add: ByteMatrix

    @classmethod
    def of(cls, key: bytes) -> _LastBlock:
        k1, k2 = (np.frombuffer(k, dtype=np.uint8) for k in cmac_subkeys(key))
        mask = np.zeros((_BLOCK + 1, _BLOCK), dtype=np.uint8)
        add = np.zeros((_BLOCK + 1, _BLOCK), dtype=np.uint8)
        for r in range(_BLOCK + 1):
            mask[r, :r] = 0xFF
            if r < _BLOCK:
                add[r, r] = 0x80
            add[r] ^= k1 if r == _BLOCK else k2
        return cls(mask, add)

    def inline_pairs(self) -> npt.NDArray[np.uint32]:
        """Rows ``add[r]`` with the (native int32) length r2 XORed into bytes 12..15, at
        r * 13 + r2 for r, r2 in [0, 12]: the Arrow binary-view fast path of :func:`_cmac_arrow`."""
        table = np.repeat(self.add[: _INLINE + 1], _INLINE + 1, axis=0).view(np.uint32).copy()
        table[:, 3] ^= np.tile(np.arange(_INLINE + 1, dtype=np.int32), _INLINE + 1).view(np.uint32)
        return table

    def add_rows(self, counts: npt.NDArray[np.integer], dtype: type[np.unsignedinteger[Any]]) -> npt.NDArray[Any]:
        """``add`` of each row's count, as rows of ``dtype`` words."""
        return np.take(self.add.view(dtype), counts, axis=0)


def aes_cmac(key: bytes, messages: ByteMatrix, lengths: npt.NDArray[np.integer]) -> ByteMatrix:
    """AES-CMAC tag (16 bytes) of each message: row i of ``messages`` holds message i in its
    first ``lengths[i]`` bytes and zeros after them. Key of 16, 24 or 32 bytes. Column-wise:
    one AES-ECB call per block position per group of messages with the same block count."""
    lengths64: I64 = np.asarray(lengths, dtype=np.int64)
    matrix = np.ascontiguousarray(messages, dtype=np.uint8).reshape(lengths64.size, -1)
    return _cmac_matrix(key, matrix, lengths64)


def _cmac_matrix(key: bytes, matrix: ByteMatrix, lengths: I64) -> ByteMatrix:
    """CMAC of zero-filled rows (the bytes of row i past lengths[i] are zero)."""
    rows, width = matrix.shape
    if rows == 0:
        return np.zeros((0, _BLOCK), dtype=np.uint8)
    last = _LastBlock.of(key)
    if width <= _BLOCK:  # one block each: rows at a fixed stride, bytes past a row cleared
        blocks = _windows16(matrix.reshape(-1), 0, width, rows)
        if bool(np.all(lengths == lengths[0])):
            _mask_add(blocks, last, int(lengths[0]))
        else:
            _mask_add(blocks, last, width, add=False)
            blocks.view(np.uint64)[:] ^= last.add_rows(lengths, np.uint64)
        return _ecb(key, blocks)
    starts = np.arange(rows, dtype=np.int64) * width
    return _cmac_rows(key, matrix.reshape(-1), starts, lengths, last)


def _cmac_rows(key: bytes, data: ByteMatrix, starts: I64, lengths: I64, last: _LastBlock) -> ByteMatrix:
    """CMAC of message i = data[starts[i] : starts[i] + lengths[i]] (any bytes around them);
    in steps of :data:`_CHUNK` rows, so each step's blocks stay in cache."""
    if lengths.size > _CHUNK:
        tags = np.empty((lengths.size, _BLOCK), dtype=np.uint8)
        for start, stop in _chunks(lengths.size):
            tags[start:stop] = _cmac_rows(key, data, starts[start:stop], lengths[start:stop], last)
        return tags
    num_blocks = np.maximum(1, -(-lengths // _BLOCK))
    counts = np.flatnonzero(np.bincount(num_blocks))
    if counts.size == 1:  # the common case: no gather, no scatter
        return _cmac_chain(key, data, starts, lengths, int(counts[0]), last)
    tags = np.zeros((lengths.size, _BLOCK), dtype=np.uint8)
    for count in counts:
        rows = np.flatnonzero(num_blocks == count)
        tags[rows] = _cmac_chain(key, data, starts[rows], lengths[rows], int(count), last)
    return tags


def _cmac_chain(key: bytes, data: ByteMatrix, starts: I64, lengths: I64, count: int, last: _LastBlock) -> ByteMatrix:
    """CMAC of messages that all take ``count`` blocks: CBC, one ECB call per block position."""
    state: ByteMatrix | None = None
    for j in range(count):
        block = _gather16(data, starts + j * _BLOCK)
        if j == count - 1:
            in_last = lengths - (count - 1) * _BLOCK
            words = block.view(np.uint64)
            words &= np.take(last.mask.view(np.uint64), in_last, axis=0)
            words ^= last.add_rows(in_last, np.uint64)
        if state is not None:
            block ^= state
        state = _ecb(key, block)
    assert state is not None
    return state


def _windows16(data: ByteMatrix, first: int, stride: int, rows: int) -> ByteMatrix:
    """Rows of the 16 bytes data[first + i * stride :][:16] (zeros past the end of data):
    one strided copy of 16-byte items."""
    out = np.empty((rows, _BLOCK), dtype=np.uint8)
    limit = data.size - _BLOCK  # a window starting at or below this lies inside data
    inside = 0 if first > limit else rows if stride == 0 else min(rows, (limit - first) // stride + 1)
    if inside:
        windows = np.ndarray(shape=(inside,), dtype="V16", buffer=data, offset=first, strides=(stride,))
        out.view("V16")[:inside, 0] = windows
    if inside < rows:
        out[inside:] = _gather16(data, first + stride * np.arange(inside, rows, dtype=np.int64))
    return out


def _mask_add(blocks: ByteMatrix, last: _LastBlock, count: int, add: bool = True) -> None:
    """In place, every block keeps its first ``count`` bytes, then (``add``) takes the padding
    and subkey of a last block with ``count`` message bytes."""
    _row_op(np.bitwise_and, blocks, last.mask[count])
    if add:
        _row_op(np.bitwise_xor, blocks, last.add[count])


_TILE = 256  # rows per tiled operand: a long inner loop instead of one 16-byte row at a time


def _row_op(op: np.ufunc, blocks: ByteMatrix, row: ByteMatrix) -> None:
    """blocks[i] = op(blocks[i], row) for every row, on uint64 words in tiles of rows."""
    words = blocks.view(np.uint64)
    row_words = np.ascontiguousarray(row).view(np.uint64)
    full = words.shape[0] - words.shape[0] % _TILE
    if full:
        tiled = words[:full].reshape(-1, 2 * _TILE)
        op(tiled, np.tile(row_words, _TILE), out=tiled)
    op(words[full:], row_words, out=words[full:])


def _gather16(data: ByteMatrix, pos: I64) -> ByteMatrix:
    """Rows of the 16 bytes data[p : p + 16] for each p (zeros past the end of data)."""
    out = np.empty((pos.size, _BLOCK), dtype=np.uint8)
    if pos.size == 0:
        return out
    limit = data.size - _BLOCK  # a start at or below this has 16 bytes in data
    inside = pos <= limit
    if limit >= 0:
        windows = np.ndarray(shape=(limit + 1,), dtype="V16", buffer=data, offset=0, strides=(1,))
        if bool(inside.all()):
            out.view("V16")[:, 0] = windows[pos]
            return out
        out.view("V16")[inside, 0] = windows[pos[inside]]
    base = max(0, limit)
    tail = np.zeros(data.size - base + 2 * _BLOCK, dtype=np.uint8)
    tail[: data.size - base] = data[base:]
    tail_windows = np.ndarray(shape=(tail.size - _BLOCK + 1,), dtype="V16", buffer=tail, offset=0, strides=(1,))
    out.view("V16")[~inside, 0] = tail_windows[pos[~inside] - base]
    return out


def id_bytes(ids: IdArray) -> tuple[ByteMatrix, I64]:
    """The ids as a (rows, width) byte matrix of their UTF-8 bytes (zero-filled) and lengths.

    Integer ids become their decimal text. ASCII text (the common case) is narrowed from
    numpy's UTF-32 in one vectorized pass; other text goes through numpy's UTF-8 encoder.
    """
    arr, lengths = _numpy_bytes(ids)
    width = arr.dtype.itemsize
    if width == 0:
        return np.zeros((arr.size, 1), dtype=np.uint8), np.zeros(arr.size, dtype=np.int64)
    matrix = np.ascontiguousarray(arr).view(np.uint8).reshape(arr.size, width)
    return matrix, lengths


def _numpy_bytes(ids: IdArray) -> tuple[npt.NDArray[np.bytes_], I64]:
    """UTF-8 bytes (zero-filled) and their lengths; ASCII text is narrowed from UTF-32.
    (``np.char``, not ``np.strings``: the same ufuncs on numpy 2, and numpy 1.26 has only it.)"""
    arr = np.asarray(ids).reshape(-1)
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.bytes_)
    if arr.dtype.kind == "U":
        width = arr.dtype.itemsize // 4
        if width == 0:
            return np.zeros(arr.size, dtype="S1"), np.zeros(arr.size, dtype=np.int64)
        points = np.ascontiguousarray(arr).view(np.uint32).reshape(arr.size, width)
        if not points.size or int(points.max()) < 0x80:  # ASCII: one byte per character
            narrow = points.astype(np.uint8).view(f"S{width}").reshape(arr.size)
            return narrow, np.asarray(np.char.str_len(arr), dtype=np.int64)
        arr = np.asarray(np.char.encode(arr, "utf-8"))
    if arr.dtype.kind != "S":
        raise ShapeMismatchError(f"ids must be text or integers, got dtype {arr.dtype}")
    return arr, np.asarray(np.char.str_len(arr), dtype=np.int64)


def _is_arrow(ids: object) -> bool:
    return type(ids).__module__.split(".")[0] == "pyarrow"


def id_tags(ids: IdArray, key: AlignmentKey) -> TagArray:
    """128-bit keyed tags of the ids: AES-256-CMAC under HKDF(key, "alignment-cmac").

    ``ids``: a numpy text, bytes or integer array, a sequence of str, or a pyarrow string,
    binary or integer (Chunked)Array without nulls (hashed from its buffers)."""
    cmac_key = key.derive("alignment-cmac")
    if _is_arrow(ids):
        tags = _cmac_arrow(cmac_key, ids)
    else:
        matrix, lengths = id_bytes(ids)
        tags = _cmac_matrix(cmac_key, matrix, lengths)
    return tags.reshape(-1).view(TAG_DTYPE)


def _cmac_arrow(key: bytes, ids: Any) -> ByteMatrix:
    """CMAC of every value of an Arrow string/binary/integer array, from its buffers."""
    import pyarrow as pa  # only callers holding Arrow arrays pay the import
    import pyarrow.compute as pc

    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if pa.types.is_integer(arr.type):
        arr = pc.cast(arr, pa.string())
    if pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type):
        arr = pc.cast(arr, pa.large_binary())
    if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)
            or pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)):
        raise ShapeMismatchError(f"ids must be text or integers, got Arrow type {arr.type}")
    if arr.null_count:
        raise ShapeMismatchError(f"{arr.null_count} id(s) are null; every row needs an id")
    rows = len(arr)
    if rows == 0:
        return np.zeros((0, _BLOCK), dtype=np.uint8)
    last = _LastBlock.of(key)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if large else np.int32)[arr.offset : arr.offset + rows + 1]
    lengths = np.diff(offsets)
    shortest, longest = int(lengths.min()), int(lengths.max())
    data_buffer = arr.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    out = np.empty((rows + 1, _BLOCK), dtype=np.uint8)  # update_into wants one spare block
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    if shortest == longest:  # one length: rows at a fixed stride, block j a strided copy
        first, count = int(offsets[0]), max(1, -(-longest // _BLOCK))
        in_last = longest - (count - 1) * _BLOCK
        scratch = np.empty((min(rows, _CHUNK) + 1, _BLOCK), dtype=np.uint8)  # CBC state, one spare row
        for start, stop in _chunks(rows):
            for j in range(count):
                blocks = _windows16(data, first + start * longest + j * _BLOCK, longest, stop - start)
                if j == count - 1:
                    _mask_add(blocks, last, in_last)
                if j:
                    blocks ^= scratch[: stop - start]
                target = out[start : stop + 1] if j == count - 1 else scratch[: stop - start + 1]
                enc.update_into(blocks.reshape(-1).data, target.reshape(-1).data)
        return out[:rows]
    if longest <= _INLINE:  # every value inline in its zero-padded 16-byte binary view
        views = pc.cast(arr, pa.binary_view())
        words = np.frombuffer(views.buffers()[1], dtype=np.uint32)[4 * views.offset : 4 * (views.offset + rows)]
        pair = lengths * (_INLINE + 1)
        pair[:-1] += lengths[1:]
        table = last.inline_pairs()
        buffer = np.empty((min(rows, _CHUNK), 4), dtype=np.uint32)
        for start, stop in _chunks(rows):
            blocks32 = buffer[: stop - start]
            np.take(table, pair[start:stop], axis=0, out=blocks32)
            # XOR in view bytes 4..15 of each row and the length word of the next row, which
            # the pair table (indexed by both lengths) holds too, so it cancels
            end = min(4 * stop + 1, 4 * rows)
            blocks32.reshape(-1)[: end - 4 * start - 1] ^= words[4 * start + 1 : end]
            enc.update_into(blocks32.reshape(-1).view(np.uint8).data, out[start : stop + 1].reshape(-1).data)
        return out[:rows]
    return _cmac_rows(key, data, offsets[:-1].astype(np.int64), lengths.astype(np.int64), last)


_CHUNK = 1 << 16  # rows per step of the Arrow paths: the working set stays in cache
_STEP = 1 << 20  # items per piece of the full-length passes (temporaries of 8 MiB, reused)


def _chunks(rows: int) -> list[tuple[int, int]]:
    return [(start, min(rows, start + _CHUNK)) for start in range(0, rows, _CHUNK)]


RowOrder = npt.NDArray[np.int64]
"""One curator's table rows in the canonical (ascending tag) order."""


@dataclass(frozen=True)
class Alignment:
    """One curator's view of the agreed alignment."""

    row_order: I64
    """Indices into this curator's table, in the canonical (ascending tag) order."""
    num_rows: int
    num_matched: int

    @property
    def num_unmatched(self) -> int:
        return self.num_rows - self.num_matched


def _pairs(tags: TagArray) -> npt.NDArray[np.void]:
    """The tags as contiguous 16-byte items (big-endian hi then lo: byte order = tag order)."""
    return np.ascontiguousarray(tags, dtype=TAG_DTYPE).view("V16").reshape(-1)




def _keyed(tags: TagArray, bits: int) -> I64:
    """The packs (top 63 - b bits of hi | 0 | b-bit row), sign-flipped so that int64 order is
    unsigned order, ascending: one int64 sort, skipped if the tags come in that order already
    (an agreed list, ascending by construction)."""
    packed = np.ascontiguousarray(tags, dtype=TAG_DTYPE)["hi"].astype(np.uint64)
    low = np.uint64((1 << (bits + 1)) - 1)
    packed &= ~low
    for start in range(0, packed.size, _STEP):  # the row numbers, a piece at a time (no n-word temporary)
        piece = packed[start : start + _STEP]
        piece |= np.arange(start, start + piece.size, dtype=np.uint64)
    packed ^= _SIGN
    signed = packed.view(np.int64)
    if signed.size > 1 and not bool(np.all(signed[1:] > signed[:-1])):
        signed.sort()  # int64 sorts use the SIMD kernels; uint64 does not
    return signed


@dataclass(frozen=True)
class _Matched:
    """The tags every list holds, ascending, and for each list the row of each (its first
    occurrence) and whether any of them occurs more than once in that list."""

    tags: TagArray
    rows: list[I64]
    repeated: list[bool]


@dataclass(frozen=True)
class SortedTags:
    """A curator's tags sorted for :func:`align` ahead of time (while it waits for the
    agreement): the packs of :func:`_keyed` for lists of up to ``2^bits`` tags."""

    tags: TagArray
    bits: int
    packs: I64


def _prefix_bits(size: int) -> int:
    return max(1, (size - 1).bit_length())


def sort_tags(tags: TagArray) -> SortedTags:
    """``tags`` sorted for a later :func:`align` against agreed tags no more numerous (the
    sort is the larger part of ``align``; numpy's sort releases the GIL, so a thread can do it
    while the curator waits)."""
    bits = _prefix_bits(int(tags.size))
    return SortedTags(tags, bits, _keyed(tags, bits) if bits <= 39 else np.zeros(0, dtype=np.int64))


def has_repeated_tag(sorted_tags: SortedTags) -> bool:
    """Whether a tag occurs more than once in ``sorted_tags.tags``, exactly. Equal ids have
    equal tags, so this finds a repeated id in the sort the curator makes anyway (DESIGN 3.1):
    equal tags have equal prefixes, adjacent in the sorted packs, and only the rows of a tied
    prefix (about size^2 / 2^(64 - b) of them) are compared on their full 16 bytes."""
    tags = sorted_tags.tags
    if tags.size < 2:
        return False
    if sorted_tags.packs.size != tags.size:  # too many tags for packs: exact throughout
        return bool(np.unique(_pairs(tags)).size != tags.size)
    shift = np.int64(sorted_tags.bits + 1)
    ties = _equal_neighbours(sorted_tags.packs, shift)
    if not ties.size:
        return False
    prefixes = np.unique(sorted_tags.packs[ties] >> shift)
    rows = sorted_tags.packs[_prefix_runs(sorted_tags.packs, prefixes, shift)] & np.int64((1 << sorted_tags.bits) - 1)
    candidates = _pairs(tags)[rows]
    return bool(np.unique(candidates).size != candidates.size)


def _match(tag_lists: Sequence[TagArray], presorted: SortedTags | None = None) -> _Matched:
    """Intersect tag lists exactly by (hi, lo), in ascending (hi, lo) order.

    Fast part: each list is sorted once as packs of (top bits of hi, row) (:func:`_keyed`);
    each further list is joined to the matches so far by a binary search of each of its
    prefixes (:func:`_join_prefixes`, piece by piece), and each prefix match is confirmed on
    the full 16-byte tags. Prefixes that repeat within a list (a repeated id, or distinct tags
    sharing the top 63 - b bits: about size^2 / 2^(64 - b) pairs) are skipped by the join and
    matched exactly in :func:`_match_exact`; the two parts are then interleaved by prefix
    (disjoint by construction).

    Memory: each temporary of n words is dropped as soon as the next step has what it needs, so
    at n = 10^7 the work beside the inputs stays near four arrays of n words (the curator's
    peak memory is set here)."""
    size = max(t.size for t in tag_lists)
    bits = _prefix_bits(size)
    if bits > 39:  # too few prefix bits left: exact matching throughout
        return _match_exact(tag_lists, [np.arange(t.size, dtype=np.int64) for t in tag_lists])
    shift = np.int64(bits + 1)
    row_mask = np.int64((1 << bits) - 1)
    packs = _sorted_packs(tag_lists, bits, presorted)
    slow_prefix = _tied_prefixes(packs, shift)
    slow_rows: list[I64] = []
    if slow_prefix.size:
        for i, pack in enumerate(packs):
            out = _prefix_runs(pack, slow_prefix, shift)
            slow_rows.append(np.sort(pack[out] & row_mask))
            if len(packs) == 1:  # no join to skip them in
                packs[i] = np.delete(pack, out)
            del out
    pairs = [_pairs(t) for t in tag_lists]
    current = packs[0]  # packs of list 0 still matched, ascending
    packs[0] = np.zeros(0, dtype=np.int64)
    rows: list[I64] = []
    for i in range(1, len(packs)):
        mine, theirs = _join_prefixes(current, packs[i], shift, row_mask, pairs[0], pairs[i], slow_prefix)
        packs[i] = np.zeros(0, dtype=np.int64)
        if rows:
            keep = np.searchsorted(current, mine)
            rows = [r[keep] for r in rows]
        current = mine
        rows.append(theirs)
        del mine, theirs
    if slow_prefix.size:
        exact = _match_exact(tag_lists, slow_rows)
        exact_hi = (exact.tags["hi"].astype(np.uint64) ^ _SIGN).view(np.int64)
        at = np.searchsorted(current, (exact_hi >> shift) << shift)  # before the prefix's place
    # the packs become rows: in place when they are this function's own (a join's output)
    first = current & row_mask if len(packs) == 1 else np.bitwise_and(current, row_mask, out=current)
    rows = [first, *rows]
    tags = pairs[0][first].view(TAG_DTYPE)
    repeated = [False] * len(packs)
    if slow_prefix.size:
        tags = _insert(tags, at, exact.tags)
        rows = [_insert(r, at, e) for r, e in zip(rows, exact.rows, strict=True)]
        repeated = exact.repeated
    return _Matched(tags, rows, repeated)


_PARALLEL_SORT = 1 << 18  # lists this long are sorted on the worker pool, one list a thread


def _sorted_packs(tag_lists: Sequence[TagArray], bits: int, presorted: SortedTags | None) -> list[I64]:
    """Every list's sorted packs: ``presorted``'s where it is that list's (same array, same
    bits); long lists on the worker pool, one a thread (numpy's sort releases the GIL)."""
    def packs_of(tags: TagArray) -> I64:
        if presorted is not None and presorted.tags is tags and presorted.bits == bits:
            return presorted.packs
        return _keyed(tags, bits)

    if sum(1 for t in tag_lists if t.size >= _PARALLEL_SORT) < 2:
        return [packs_of(t) for t in tag_lists]
    return list(worker_pool().map(packs_of, tag_lists))


def _tied_prefixes(packs: Sequence[I64], shift: np.int64) -> I64:
    """The prefixes that occur more than once within one list (ascending, usually few)."""
    tied = [pack[_equal_neighbours(pack, shift)] >> shift for pack in packs]
    return np.unique(np.concatenate(tied)) if any(t.size for t in tied) else np.zeros(0, np.int64)


def _join_prefixes(
    current: I64, packs: I64, shift: np.int64, row_mask: np.int64,
    current_tags: npt.NDArray[np.void], tags: npt.NDArray[np.void], skip: I64 | None = None, step: int = _STEP,
) -> tuple[I64, I64]:  # fmt: skip
    """The packs of ``current`` whose tag ``packs``' list holds too, and the row in that list
    of each, both ascending, leaving out the prefixes ``skip`` (ascending: those tied within
    some list, matched exactly apart). Every other prefix occurs at most once in each list, so
    each of ``packs`` is looked up by one binary search of its prefix in ``current`` and a
    prefix match confirmed on the full 16-byte tags; in :data:`_STEP`-item pieces, written
    into outputs whose untouched tails never cost memory (no n-word temporaries)."""
    size = min(current.size, packs.size)
    mine, theirs = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
    found = 0
    if size == 0:
        return mine, theirs
    for start in range(0, packs.size, step):
        piece = packs[start : start + step]
        prefix = piece >> shift
        at = np.searchsorted(current, prefix << shift)  # the first pack with that prefix or above
        np.minimum(at, current.size - 1, out=at)
        candidate = current[at]
        hit = np.flatnonzero((candidate >> shift) == prefix)
        if skip is not None and skip.size:
            hit = hit[~_member(prefix[hit], skip)]
        candidate, rows = candidate[hit], piece[hit] & row_mask
        same = _equal(current_tags[candidate & row_mask], tags[rows])
        count = int(np.count_nonzero(same))
        mine[found : found + count] = candidate[same]
        theirs[found : found + count] = rows[same]
        found += count
    return mine[:found], theirs[:found]


def _member(values: I64, ascending: I64) -> npt.NDArray[np.bool_]:
    """Whether each of ``values`` is one of the (non-empty) ``ascending``."""
    at = np.minimum(np.searchsorted(ascending, values), ascending.size - 1)
    found: npt.NDArray[np.bool_] = ascending[at] == values
    return found


def _equal_neighbours(values: I64, shift: np.int64, step: int = _STEP) -> I64:
    """Indices i with values[i] >> shift == values[i + 1] >> shift, in pieces of ``step`` (no
    temporary of the full length)."""
    found: list[I64] = []
    for start in range(0, max(0, values.size - 1), step):
        window = values[start : start + step + 1] >> shift
        found.append(np.flatnonzero(window[1:] == window[:-1]) + start)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _equal(a: npt.NDArray[np.void], b: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    """Whether 16-byte items are equal, compared as two uint64 words."""
    wa, wb = a.view(np.uint64).reshape(-1, 2), b.view(np.uint64).reshape(-1, 2)
    same: npt.NDArray[np.bool_] = wa[:, 0] == wb[:, 0]
    same &= wa[:, 1] == wb[:, 1]
    return same


def _prefix_runs(packs: I64, prefixes: I64, shift: np.int64) -> I64:
    """Indices of the ascending ``packs`` whose prefix (``pack >> shift``) is one of the
    ascending ``prefixes``: two binary searches per prefix, no pass over ``packs``."""
    low = (np.int64(1) << shift) - np.int64(1)
    first = np.searchsorted(packs, prefixes << shift, "left")
    end = np.searchsorted(packs, (prefixes << shift) | low, "right")
    counts = end - first
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    run_start = np.repeat(first - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return run_start + np.arange(total, dtype=np.int64)


_FEW_SLOTS = 4096


def _insert(base: npt.NDArray[Any], at: I64, extra: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``np.insert(base, at, extra)`` for ascending ``at``: few slots (ties of the prefix
    sort, usually a handful) as block copies between them, many by one boolean mask."""
    out = np.empty(base.size + extra.size, dtype=base.dtype)
    slots = at + np.arange(at.size, dtype=np.int64)
    out[slots] = extra
    if at.size > _FEW_SLOTS:
        keep = np.ones(out.size, dtype=bool)
        keep[slots] = False
        out[keep] = base
        return out
    edges = [0, *at.tolist(), base.size]
    for k in range(len(edges) - 1):  # one block copy per gap between slots
        out[edges[k] + k : edges[k + 1] + k] = base[edges[k] : edges[k + 1]]
    return out


def _match_exact(tag_lists: Sequence[TagArray], subsets: Sequence[I64]) -> _Matched:
    """:func:`_match` restricted to the given rows of each list, by lexsort (slow, exact)."""
    common: TagArray | None = None
    for tags, rows in zip(tag_lists, subsets, strict=True):
        mine = np.unique(_pairs(tags)[rows])
        common = mine if common is None else np.intersect1d(common, mine, assume_unique=True)
    assert common is not None
    out_rows: list[I64] = []
    repeated: list[bool] = []
    for tags, rows in zip(tag_lists, subsets, strict=True):
        values = _pairs(tags)[rows]
        order = np.argsort(values, kind="stable")  # 16-byte items compare as their bytes
        ordered = values[order]
        first = np.searchsorted(ordered, common, "left")
        last = np.searchsorted(ordered, common, "right")
        out_rows.append(rows[order[first]].astype(np.int64))
        repeated.append(bool(np.any(last - first > 1)))
    return _Matched(common.view(TAG_DTYPE), out_rows, repeated)


def common_tags(tag_lists: Sequence[TagArray]) -> TagArray:
    """The tags every curator holds, in ascending (hi, lo) order: the canonical order."""
    if not tag_lists:
        raise ShapeMismatchError("alignment needs the tags of at least one curator")
    return _match(tag_lists).tags


def _alignment(rows: I64, num_rows: int, repeated: bool, agreed_size: int) -> Alignment:
    if repeated:
        raise DuplicateIdError("an id occurs more than once in this curator's table; ids must be unique")
    if rows.size != agreed_size:
        raise ShapeMismatchError("an agreed tag is not among this curator's ids")
    return Alignment(rows, num_rows, agreed_size)


def align(own_tags: TagArray, agreed: TagArray, presorted: SortedTags | None = None) -> Alignment:
    """This curator's row order for the agreed common tags: each agreed tag must occur once
    among ``own_tags`` (:class:`DuplicateIdError` if more often, ShapeMismatchError if not at
    all). A repeat among own ids outside the agreed set cannot change the alignment (tables read
    by ``curator.table.read_table`` refuse every repeated id, with its line numbers).

    ``agreed`` is ascending as :func:`common_tags` returns it (then it is not sorted again);
    another order is followed as given. ``presorted``: :func:`sort_tags` of ``own_tags``, done
    ahead (used when it fits; the result is the same either way)."""
    matched = _match([agreed, own_tags], presorted)
    if matched.repeated[0] or matched.tags.size != agreed.size:
        if matched.repeated[1]:
            raise DuplicateIdError("an id occurs more than once in this curator's table; ids must be unique")
        raise ShapeMismatchError("an agreed tag is not among this curator's ids (or the agreed tags repeat)")
    rows = matched.rows[1]
    if rows.size > 1 and not bool(np.all(matched.rows[0][1:] > matched.rows[0][:-1])):
        rows = np.empty_like(rows)  # agreed was not ascending: follow its order
        rows[matched.rows[0]] = matched.rows[1]
    return _alignment(rows, int(own_tags.size), matched.repeated[1], int(agreed.size))


def align_all(
    tag_lists: Sequence[TagArray], presorted: SortedTags | None = None
) -> tuple[TagArray, list[Alignment]]:
    """:func:`common_tags` and every list's :func:`align` to it, sorting each list once (the
    in-memory protocol, and the leader, which holds every curator's tags). ``presorted``:
    :func:`sort_tags` of one of the lists, done ahead."""
    if not tag_lists:
        raise ShapeMismatchError("alignment needs the tags of at least one curator")
    matched = _match(tag_lists, presorted)
    alignments = [
        _alignment(rows, int(tags.size), repeated, int(matched.tags.size))
        for tags, rows, repeated in zip(tag_lists, matched.rows, matched.repeated, strict=True)
    ]
    return matched.tags, alignments
