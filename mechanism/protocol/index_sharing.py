"""Sharing the sampling indices instead of a seed (Sec. V-B: "no more than m log n bits").

The leading curator draws the ordered m-tuple of distinct positions from the operating system's
CSPRNG and sends it, packed, to the other curators inside the agreement. Against the researcher
the sampling is then *truly* random (statistical guarantee), not pseudorandom from a seed.

Sampler (:func:`draw_index_tuple`), exactly uniform over the ordered m-tuples of distinct
positions in [0, n) (the set Theta of Theorem 3.2's proof):

- ``m <= n / 2`` (*first distinct*): draw i.i.d. exactly uniform integers in [0, n)
  (:func:`mechanism.primitives.stream.uniform_below`, rejection sampling), in batches; the tuple is the
  first m distinct values of that stream, in stream order. Sequentially this is "draw uniformly
  until the value is new", so step i is uniform over the n - i unused positions and the tuple
  has probability prod_i 1/(n - i) = 1/|Theta|. Expected draws <= m / (1 - m/n) <= 2m.
- ``m > n / 2`` (*random keys*): one uniform 64-bit key per position; if two keys tie, all are
  drawn again; the tuple is the m positions with the smallest keys, in ascending key order.
  Conditioned on "all keys distinct" (an event symmetric in the positions), the key order is a
  uniform permutation, so its first m entries are a uniform ordered m-tuple.

Both are exact given exactly uniform input; the tests check the reduction by exact enumeration
of small input streams, and the whole variant's epsilon by enumeration.

Wire form (:func:`pack_indices` / :func:`unpack_indices`): each position in w = ceil(log2 n)
bits (w = 0 when n = 1), most significant bit first, concatenated in tuple order and padded with
zero bits to whole bytes: ceil(m w / 8) bytes, i.e. m ceil(log2 n) bits of payload plus fewer
than 8 bits of padding. Unpacking validates the length, the padding, the range and distinctness.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.primitives.sampling import check_sample_size
from secure_release.mechanism.primitives.stream import os_bytes, uniform_below

IndexArray = npt.NDArray[np.int64]
#: ``draws(count)``: ``count`` i.i.d. exactly uniform integers in [0, n) (n fixed by the caller).
UniformDraws = Callable[[int], npt.NDArray[np.int64]]
#: ``keys(count)``: ``count`` i.i.d. uniform 64-bit words.
UniformKeys = Callable[[int], npt.NDArray[np.uint64]]

#: Positions are packed in at most 32 bits each, so n <= 2^32.
MAX_INDEX_POSITIONS = 2**32


class InvalidIndexTupleError(SecureReleaseError):
    """A packed index tuple has the wrong length, non-zero padding, a position outside [0, n)
    or a repeated position."""


def index_bits(n: int) -> int:
    """w = ceil(log2 n): the bits one position in [0, n) needs (0 when n = 1)."""
    check_sample_size(n, 1)
    if n > MAX_INDEX_POSITIONS:
        raise InvalidIndexTupleError(f"index sharing packs positions in 32 bits; n = {n} > 2^32")
    return (n - 1).bit_length()


def packed_size(n: int, m: int) -> int:
    """Bytes of a packed m-tuple over [0, n): ceil(m ceil(log2 n) / 8)."""
    check_sample_size(n, m)
    return -(-m * index_bits(n) // 8)


def _os_draws(n: int) -> UniformDraws:
    def draws(count: int) -> npt.NDArray[np.int64]:
        return uniform_below(n, count, os_bytes).astype(np.int64)

    return draws


def _os_keys(count: int) -> npt.NDArray[np.uint64]:
    return os_bytes(8 * count).view("<u8").astype(np.uint64)


def first_distinct(stream: npt.NDArray[np.int64], m: int) -> IndexArray:
    """The first (up to) m distinct values of ``stream``, in the order they first occur."""
    _, first = np.unique(stream, return_index=True)
    return np.asarray(stream[np.sort(first)[:m]], dtype=np.int64)


def draw_by_first_distinct(n: int, m: int, draws: UniformDraws) -> IndexArray:
    """The first m distinct values of an i.i.d. uniform stream on [0, n) (see module doc).

    Batches ask for exactly the number of still-missing values, so the result is a function of
    the stream alone (not of how it is batched).
    """
    check_sample_size(n, m)
    stream = np.zeros(0, dtype=np.int64)
    tuple_ = np.zeros(0, dtype=np.int64)
    while tuple_.size < m:
        batch = np.asarray(draws(m - tuple_.size), dtype=np.int64)
        if batch.size != m - tuple_.size or np.any(batch < 0) or np.any(batch >= n):
            raise ShapeMismatchError(f"a draw source returned a bad batch for [0, {n})")
        stream = np.concatenate([stream, batch])
        tuple_ = first_distinct(stream, m)
    return tuple_


def draw_by_random_keys(n: int, m: int, keys: UniformKeys) -> IndexArray:
    """The m positions with the smallest of n distinct uniform keys, in ascending key order;
    all keys are redrawn while any two tie (see module doc)."""
    check_sample_size(n, m)
    while True:
        k = np.asarray(keys(n), dtype=np.uint64)
        if k.size != n:
            raise ShapeMismatchError(f"a key source returned {k.size} keys, expected {n}")
        order = np.argsort(k, kind="stable")
        ordered = k[order]
        if not np.any(ordered[1:] == ordered[:-1]):
            return np.asarray(order[:m], dtype=np.int64)


def draw_index_tuple(
    n: int, m: int, draws: UniformDraws | None = None, keys: UniformKeys | None = None
) -> IndexArray:
    """A uniformly random ordered m-tuple of distinct positions in [0, n), exactly, from the OS
    CSPRNG (``draws`` / ``keys``: injected sources for tests only)."""
    index_bits(n)
    check_sample_size(n, m)
    if 2 * m <= n:
        return draw_by_first_distinct(n, m, draws if draws is not None else _os_draws(n))
    return draw_by_random_keys(n, m, keys if keys is not None else _os_keys)


def pack_indices(positions: npt.ArrayLike, n: int) -> bytes:
    """Positions (distinct, in [0, n)) packed in ceil(log2 n) bits each, MSB first."""
    pos = np.asarray(positions)
    if pos.ndim != 1 or pos.dtype.kind not in "iu":
        raise InvalidIndexTupleError("positions must be a one-dimensional integer array")
    m = int(pos.size)
    check_sample_size(n, max(m, 1))
    _check_tuple(pos.astype(np.int64), n)
    w = index_bits(n)
    if w == 0 or m == 0:
        return b""
    shifts = np.arange(w - 1, -1, -1, dtype=np.uint64)
    bits = (pos.astype(np.uint64)[:, None] >> shifts[None, :]) & np.uint64(1)
    return np.packbits(bits.astype(np.uint8).ravel()).tobytes()


def unpack_indices(data: bytes, n: int, m: int) -> IndexArray:
    """The inverse of :func:`pack_indices`; raises :class:`InvalidIndexTupleError` unless
    ``data`` is exactly ceil(m w / 8) bytes with zero padding and encodes m distinct positions
    in [0, n)."""
    if not isinstance(data, bytes | bytearray):
        raise InvalidIndexTupleError(f"packed indices must be bytes, got {type(data).__name__}")
    expected = packed_size(n, m)
    if len(data) != expected:
        raise InvalidIndexTupleError(
            f"{len(data)} bytes, but {m} positions over n = {n} pack into exactly {expected}"
        )
    w = index_bits(n)
    if w == 0:
        return np.zeros(m, dtype=np.int64)
    bits = np.unpackbits(np.frombuffer(bytes(data), dtype=np.uint8))
    if np.any(bits[m * w :]):
        raise InvalidIndexTupleError("the padding bits of packed indices must be zero")
    weights = np.uint64(1) << np.arange(w - 1, -1, -1, dtype=np.uint64)
    pos = (bits[: m * w].reshape(m, w).astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    out: IndexArray = np.asarray(pos, dtype=np.int64)
    _check_tuple(out, n)
    return out


def _check_tuple(pos: IndexArray, n: int) -> None:
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise InvalidIndexTupleError(f"every position must lie in [0, {n})")
    if np.unique(pos).size != pos.size:
        raise InvalidIndexTupleError("positions of a sample must be distinct")


def indices_fingerprint(packed: bytes) -> str:
    """A public 8-hex-digit id of the packed, *ordered* tuple: an integrity check that the
    positions arrived as sent (the sample chunks carry it). Not for the ledger's reuse check: a
    reordered tuple is the same sample and gets another value here (:func:`sample_set_fingerprint`)."""
    h = hashlib.sha256(b"fingerprint|index tuple|" + bytes(packed))
    return h.hexdigest()[:8]


def sample_set_fingerprint(positions: IndexArray) -> str:
    """A public 16-hex-digit id of the *set* of sampled positions, for the ledger's reuse check:
    SHA-256 of the ascending positions as little-endian 64-bit words, so every order of one
    sample gives the same value (issue 23: re-serving a reordered sample must be refused; a
    reused sample gets no amplification, DESIGN 3 "Budget")."""
    pos = np.sort(np.asarray(positions, dtype=np.int64)).astype("<i8")
    h = hashlib.sha256(b"fingerprint|sample set|" + pos.tobytes())
    return h.hexdigest()[:16]
