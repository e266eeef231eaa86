"""Private alignment: an N-party ECDH private set intersection (Sec. V-B "synchronization").

Group: the prime-order subgroup (order L = 2^252 + 27742317777372353535851937790883648493) of
edwards25519, through libsodium as PyNaCl binds it. PyNaCl 1.6 exposes no ristretto255 calls, so
the group is edwards25519's main subgroup with libsodium's checks instead: every received point
goes through ``crypto_scalarmult_ed25519_noclamp``, which rejects non-canonical encodings, points
of small order and points outside the main subgroup (:class:`InvalidPointError`). Scalars are
uniform in [1, L) (64 HKDF bytes reduced mod L), never clamped, so blinding commutes exactly:
(P^a)^b = (P^b)^a.

Hash to the group (:func:`hash_to_group`): d = SHA-512("secure-release/v1|psi-id|" || id);
H(id) = from_uniform(d[0:32]) + from_uniform(d[32:64]) (two Elligator 2 maps with cofactor
clearing, then a point addition: the random-oracle construction of RFC 9380, with SHA-512 in
place of expand_message_xmd).

Protocol for curators 0 .. N-1, each with a fresh secret scalar s_j (:class:`PsiKey`):

1. curator j computes H(x)^{s_j} for its ids and sorts them (the sort is a pseudorandom
   permutation of its rows, so the order says nothing) -> :func:`psi_start`;
2. the list travels the ring j -> j+1 -> ... -> j+N-1 (mod N); each curator raises every point
   to its own scalar and forwards the list in the same order -> :func:`psi_reblind`;
3. back at j, the list holds F(x) = H(x)^{s_0 s_1 ... s_{N-1}} for j's ids, in j's sorted order,
   so j links each F(x) to its own row -> :func:`psi_finish` gives the 128-bit tag
   BLAKE2b-128(F(x)) per own row, in the layout of :func:`mechanism.alignment.id_tags`;
4. as in the keyed-hash mode, every curator sends its tags to the leader, which keeps the tags
   all curators hold (:func:`mechanism.alignment.common_tags`; canonical order = ascending tag of
   the fully blinded value) and sends them back in the agreement; each curator aligns with
   :func:`mechanism.alignment.align`.

Costs (per element, measured on the 2-core machine): hash to group ~120 us, one scalar
multiplication ~180 us; a curator with s ids does s (hash + N multiplications) in total
(its own list plus N - 1 hops of the others' lists). libsodium has no batch call, so each is one
call in a tight comprehension; that per-element loop is the unavoidable cost of the mode.
"""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from nacl import bindings as sodium

from secure_release.mechanism.alignment import TAG_DTYPE, TagArray
from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.keys import Secret

POINT_BYTES = 32
SCALAR_BYTES = 32
GROUP_NAME = "edwards25519 prime-order subgroup (libsodium via PyNaCl)"
_ID_DOMAIN = b"secure-release/v1|psi-id|"
_TAG_PERSON = b"sr-psi-tag-v1"
_T = TypeVar("_T")
_R = TypeVar("_R")


class InvalidPointError(SecureReleaseError):
    """A received list is not a whole number of 32-byte points, or holds a point that is not a
    canonical element of the prime-order subgroup (or is the identity)."""


class PsiKey(Secret):
    """One curator's secret blinding scalar for one alignment (fresh from the OS per run)."""

    kind = "psi key"

    def scalar(self) -> bytes:
        """The scalar s in [1, L): 64 HKDF bytes reduced mod L."""
        s = sodium.crypto_core_ed25519_scalar_reduce(self.derive("psi-scalar", length=64))
        if s == bytes(SCALAR_BYTES):  # probability 2^-252
            raise InvalidPointError("the derived PSI scalar is zero; draw a fresh PsiKey")
        return bytes(s)


def _encode_ids(ids: Sequence[str] | npt.NDArray[np.str_]) -> list[bytes]:
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.dtype.kind != "U":
        raise ShapeMismatchError(f"ids must be a one-dimensional text array, got dtype {arr.dtype}")
    return [str(x).encode("utf-8") for x in arr.tolist()]


def _hash_piece(raw_ids: Sequence[bytes]) -> bytes:
    """H(id) for encoded ids, packed (the per-element libsodium calls; runs in a worker too)."""
    add, from_uniform, sha512 = sodium.crypto_core_ed25519_add, sodium.crypto_core_ed25519_from_uniform, hashlib.sha512
    digests = [sha512(_ID_DOMAIN + raw).digest() for raw in raw_ids]
    return b"".join([add(from_uniform(d[:32]), from_uniform(d[32:])) for d in digests])


def _blind_piece(scalar: bytes, packed: bytes) -> bytes:
    """P^s for every point of a packed list, packed; libsodium validates each point."""
    mult = sodium.crypto_scalarmult_ed25519_noclamp
    try:
        return b"".join([mult(scalar, packed[i : i + POINT_BYTES]) for i in range(0, len(packed), POINT_BYTES)])
    except (RuntimeError, TypeError, ValueError) as exc:  # libsodium returns -1 on a bad point
        raise InvalidPointError(
            "a received point is not a canonical, non-identity element of the prime-order subgroup"
        ) from exc


def _valid_piece(packed: bytes) -> bool:
    """True if every point of a packed list is a canonical element of the prime-order subgroup."""
    valid = sodium.crypto_core_ed25519_is_valid_point
    return all(valid(packed[i : i + POINT_BYTES]) for i in range(0, len(packed), POINT_BYTES))


class PsiWorkers:
    """Worker processes that share one curator's per-element calls (``--psi-workers``): the list
    is cut into ``count`` contiguous pieces, ``count - 1`` of them go to spawned processes (never
    forked: a curator runs gRPC threads) and the calling process does the first; the pieces are
    joined in order, so the result is bit-identical to ``count = 1``. Lists shorter than
    ``min_points`` stay in the calling process. Use as a context manager (the processes end on
    exit). The scalar goes to the workers over the pool's local pipe, like any argument; it is
    never logged."""

    def __init__(self, count: int, min_points: int = 1000) -> None:
        if count < 1:
            raise ShapeMismatchError(f"PSI workers must be at least 1, got {count}")
        self.count, self.min_points = count, min_points
        self._pool: ProcessPoolExecutor | None = None
        if count > 1:
            self._pool = ProcessPoolExecutor(count - 1, mp_context=multiprocessing.get_context("spawn"))

    def __enter__(self) -> PsiWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the worker processes."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def pieces(self, size: int) -> list[tuple[int, int]]:
        """[start, stop) of each piece of a list of ``size`` elements."""
        count = self.count if self._pool is not None and size >= self.min_points else 1
        edges = [size * k // count for k in range(count + 1)]
        return list(itertools.pairwise(edges))

    def run(self, fn: Callable[[_T], _R], args: Sequence[_T]) -> list[_R]:
        """``[fn(a) for a in args]``, the first in this process, the others in the workers."""
        if self._pool is None or len(args) < 2:
            return [fn(a) for a in args]
        futures = [self._pool.submit(fn, a) for a in args[1:]]
        first = fn(args[0])
        return [first, *(f.result() for f in futures)]


_IN_PROCESS = PsiWorkers(1)


def _hash_packed(raw_ids: list[bytes], workers: PsiWorkers) -> bytes:
    cuts = workers.pieces(len(raw_ids))
    return b"".join(workers.run(_hash_piece, [raw_ids[a:b] for a, b in cuts]))


def _blind_packed(packed: bytes, scalar: bytes, workers: PsiWorkers) -> bytes:
    cuts = workers.pieces(len(packed) // POINT_BYTES)
    args = [(scalar, packed[a * POINT_BYTES : b * POINT_BYTES]) for a, b in cuts]
    return b"".join(workers.run(_blind_args, args))


def _blind_args(args: tuple[bytes, bytes]) -> bytes:
    return _blind_piece(*args)


def hash_to_group(ids: Sequence[str] | npt.NDArray[np.str_], workers: PsiWorkers = _IN_PROCESS) -> list[bytes]:
    """H(id) for every id (random-oracle hash to the prime-order subgroup; module doc)."""
    return _unpack(_hash_packed(_encode_ids(ids), workers))


def _unpack(packed: bytes) -> list[bytes]:
    return [packed[i : i + POINT_BYTES] for i in range(0, len(packed), POINT_BYTES)]


def check_packed(data: bytes) -> None:
    """:class:`InvalidPointError` unless ``data`` is a whole number of 32-byte encodings."""
    if not isinstance(data, bytes | bytearray) or len(data) % POINT_BYTES:
        size = len(data) if isinstance(data, bytes | bytearray) else type(data).__name__
        raise InvalidPointError(f"a point list must be a whole number of {POINT_BYTES}-byte points, got {size}")


def split_points(data: bytes) -> list[bytes]:
    """A packed list (concatenated 32-byte encodings) as a list of points; checks the length."""
    check_packed(data)
    return [bytes(data[i : i + POINT_BYTES]) for i in range(0, len(data), POINT_BYTES)]


def blind(points: Sequence[bytes], key: PsiKey, workers: PsiWorkers = _IN_PROCESS) -> list[bytes]:
    """P^s for every point, in the same order; each point is validated by libsodium."""
    if any(len(p) != POINT_BYTES for p in points):
        raise InvalidPointError(f"a point must be {POINT_BYTES} bytes")
    return _unpack(_blind_packed(b"".join(points), key.scalar(), workers))


def _sort_order_packed(packed: bytes) -> npt.NDArray[np.int64]:
    """Indices that sort the 32-byte encodings of a packed list ascending (four big-endian 64-bit words)."""
    if not packed:
        return np.zeros(0, dtype=np.int64)
    words = np.frombuffer(packed, dtype=">u8").reshape(-1, 4).astype(np.uint64)
    return np.asarray(np.lexsort(words.T[::-1]), dtype=np.int64)


@dataclass(frozen=True)
class PsiOwnList:
    """A curator's own list after step 1: what it sends, and how to link the answer back."""

    sent: bytes
    """H(x)^{s_j}, sorted ascending by encoding: the message to the next curator in the ring."""
    row_of: npt.NDArray[np.int64]
    """row_of[i] = the own row whose point is the i-th of ``sent``."""


def psi_start(
    ids: Sequence[str] | npt.NDArray[np.str_], key: PsiKey, workers: PsiWorkers = _IN_PROCESS
) -> PsiOwnList:
    """Step 1: hash the own ids to the group, blind with the own scalar, sort."""
    blinded = _blind_packed(_hash_packed(_encode_ids(ids), workers), key.scalar(), workers)
    order = _sort_order_packed(blinded)
    rows = np.frombuffer(blinded, dtype=np.dtype((np.void, POINT_BYTES)))
    return PsiOwnList(rows[order].tobytes(), order)


def psi_reblind(received: bytes, key: PsiKey, workers: PsiWorkers = _IN_PROCESS) -> bytes:
    """Step 2: raise every received point to the own scalar, keeping the order (one ring hop)."""
    check_packed(received)
    return _blind_packed(bytes(received), key.scalar(), workers)


def blinded_tags(points: Sequence[bytes]) -> TagArray:
    """BLAKE2b-128 of each fully blinded point, as alignment tags (hi, lo big-endian words)."""
    digest = b"".join(hashlib.blake2b(p, digest_size=16, person=_TAG_PERSON).digest() for p in points)
    return np.frombuffer(digest, dtype=TAG_DTYPE).copy()


def psi_finish(own: PsiOwnList, returned: bytes, workers: PsiWorkers = _IN_PROCESS) -> TagArray:
    """Step 3: the fully blinded own list (back after N - 1 hops) as tags in own row order."""
    points = split_points(returned)
    if len(points) != own.row_of.size:
        raise ShapeMismatchError(
            f"the returned list holds {len(points)} points, but {own.row_of.size} were sent"
        )
    # the list came over the wire: reject anything outside the group
    packed = bytes(returned)
    if not all(workers.run(_valid_piece, [packed[a * POINT_BYTES : b * POINT_BYTES]
                                          for a, b in workers.pieces(len(points))])):  # fmt: skip
        raise InvalidPointError("a returned point is not in the prime-order subgroup")
    tags = np.zeros(own.row_of.size, dtype=TAG_DTYPE)
    tags[own.row_of] = blinded_tags(points)
    return tags


def ring_hops(owner: int, num_curators: int) -> list[int]:
    """The curators owner's list visits, in order (then it returns to ``owner``)."""
    if not 0 <= owner < num_curators or num_curators < 2:
        raise ShapeMismatchError(f"owner {owner} must index one of N >= 2 curators, N = {num_curators}")
    return [(owner + h) % num_curators for h in range(1, num_curators)]


@dataclass(frozen=True)
class PsiRun:
    """The outcome of :func:`run_psi` and every curator's received messages."""

    tags: list[TagArray]
    """Per curator, the tag of each own row (own row order)."""
    received: list[list[tuple[int, int, bytes]]]
    """received[i]: (owner, hop, list) for every ring message curator i received."""


def run_psi(
    id_lists: Sequence[Sequence[str] | npt.NDArray[np.str_]], keys: Sequence[PsiKey], workers: PsiWorkers = _IN_PROCESS
) -> PsiRun:
    """Steps 1-3 for N curators in memory (the ring, hop by hop); step 4 is the keyed-hash
    mode's leader step on the returned tags."""
    num = len(id_lists)
    if num < 2 or len(keys) != num:
        raise ShapeMismatchError(f"PSI needs N >= 2 curators and one key each; got {num} and {len(keys)}")
    own = [psi_start(ids, k, workers) for ids, k in zip(id_lists, keys, strict=True)]
    received: list[list[tuple[int, int, bytes]]] = [[] for _ in range(num)]
    tags = []
    for j in range(num):
        message = own[j].sent
        for hop, i in enumerate(ring_hops(j, num), start=1):
            received[i].append((j, hop, message))
            message = psi_reblind(message, keys[i], workers)
        received[j].append((j, num, message))
        tags.append(psi_finish(own[j], message, workers))
    return PsiRun(tags, received)
