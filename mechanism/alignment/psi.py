"""Private alignment: an N-party ECDH private set intersection (Sec. V-B "synchronization").

Group (issue 41): secp256k1, prime order, cofactor 1, through libsecp256k1 as coincurve bundles it
(:mod:`mechanism.alignment.psi_group`: 33-byte compressed points, every received point parsed and refused
unless it is a canonical encoding of a curve point, :class:`InvalidPointError`; the identity has
no encoding). Scalars are uniform in [1, ORDER) (64 HKDF bytes reduced mod ORDER), so blinding
commutes exactly: (P^a)^b = (P^b)^a, and masks have inverses mod ORDER. Before issue 41 the group
was edwards25519's prime-order subgroup through libsodium: 2.6 to 4 times the CPU per id.

Hash to the group (:func:`hash_to_group`): H(id) = SwiftEC(SHA-512("secure-release/v1|psi-id|" ||
id)), the ElligatorSwift decoding of libsecp256k1, a random oracle into the group
(:mod:`mechanism.alignment.psi_group` gives the argument).

Protocol for curators 0 .. N-1 (curator 0 leads), each with a fresh secret :class:`PsiKey` that
gives two scalars, s_j (its share of the common exponent) and r_j (a one-time mask used on its own
list only):

1. curator j computes H(x)^{r_j} for its ids and sorts them (the sort is a pseudorandom
   permutation of its rows, so the order says nothing) -> :func:`psi_start`;
2. the list travels the ring j -> j+1 -> ... -> j+N-1 (mod N); each curator i raises every point
   to its s_i and forwards the list in the same order -> :func:`psi_reblind`;
3. back at j, the list holds H(x)^{r_j prod_{i != j} s_i}; j raises it to s_j / r_j (mod ORDER),
   which removes its mask and applies its own scalar last: F(x) = H(x)^{s_0 s_1 ... s_{N-1}} for
   j's ids, in j's sorted order -> :func:`psi_finish`. Only j ever holds F of j's ids: every list
   another party sees carries the mask r_j, which nobody else knows, so (DDH) it is unlinkable to
   anything that party holds. (Before issue 23 the owner blinded with s_j itself: the ring
   predecessor then computed F of the owner's ids and matched them with its own, learning their
   pairwise intersection, and the leader, the mailbox, saw every F.)
4. tags: curator j sends the leader T_j(x) = BLAKE2b-128(F(x); salt = j) (:func:`psi_tags`, the
   layout of :func:`mechanism.alignment.keyed_hash.id_tags`), a tag *in its own domain j*. The leader computes
   its own F in every domain, so it matches follower j's tags against its own rows only
   (:func:`psi_leader_view`): it learns its pairwise intersection with each curator, and nothing
   about ids it does not hold (tags of two followers are in different domains and never equal).
   The agreement is the leader's rows held by every follower (canonical order = ascending domain-0
   tag), and each follower receives only its own rows in that order, i.e. the N-way intersection.

N = 2 (issue 41): the mask buys nothing there, so :func:`psi_start` with ``num_curators=2`` blinds
with s_j directly (r_j = s_j, unmask = 1) and :func:`psi_finish_points` only validates the returned
list (no multiplication): 2 multiplications an id per curator instead of 3. The other curator then
holds F of the owner's ids (its hop of the owner's list is F), so each of the two learns their
pairwise intersection - which at N = 2 is the N-way intersection both are told anyway. A list
still carries s_j, which the other party does not know (DDH). The leader matches its one
follower's tags (domain 1) against its own tags in domain 1 directly (:func:`run_psi`'s ``tags``;
no :func:`psi_leader_view`), so the canonical order at N = 2 is ascending domain-1 tag, the same
in one process and on a curator's cluster.

What each party learns (semi-honest, DDH in the prime-order group, SHA-512 and BLAKE2b as random
oracles): a follower, the N-way intersection (as its own rows) and the list sizes; the leader, in
addition, its pairwise intersection with each curator (at N = 2 both are the intersection).
``tests/unit/test_claims_psi.py`` plays every party as the attacker with 2, 3 and 4 curators and
planted pairwise-only overlaps.

Costs (per element, CPU on the loaded 2-core machine, issue 41): hash to group ~15 us, one scalar
multiplication ~46 us (parse, multiply, encode); a curator with s ids does s (hash + N + 1
multiplications) in total at N >= 3 (its own list twice, masked and unmasked, plus N - 1 hops of
the others' lists), s (hash + 2) at N = 2; the leader also computes N - 1 more BLAKE2b tags per
own id. libsecp256k1 has no batch call, so each list is one loop over C calls
(:mod:`mechanism.alignment.psi_group`); that per-element loop is the unavoidable cost of the mode.
"""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray
from secure_release.mechanism.alignment.psi_group import (
    GROUP_NAME,
    ONE,
    POINT_BYTES,
    SCALAR_BYTES,
    InvalidPointError,
    blind_packed,
    check_points,
    hash_packed,
    scalar_from_uniform,
    scalar_inverse,
    scalar_mul,
)
from secure_release.mechanism.errors import ShapeMismatchError
from secure_release.mechanism.primitives.keys import Secret

__all__ = ["GROUP_NAME", "POINT_BYTES", "SCALAR_BYTES", "InvalidPointError"]  # re-exported: the wire checks use them

_ID_DOMAIN = b"secure-release/v1|psi-id|"
_TAG_PERSON = b"sr-psi-tag-v1"
_T = TypeVar("_T")
_R = TypeVar("_R")


class PsiKey(Secret):
    """One curator's secret blinding scalar for one alignment (fresh from the OS per run)."""

    kind = "psi key"

    def scalar(self) -> bytes:
        """The scalar s in [1, ORDER): 64 HKDF bytes reduced mod the group order (32 bytes, big-endian)."""
        return self._scalar("psi-scalar")

    def mask(self) -> bytes:
        """The one-time mask r in [1, ORDER) of the owner's own list (another HKDF label than s, so a
        follower restarted with its kept key sends the identical list)."""
        return self._scalar("psi-mask")

    def _scalar(self, label: str) -> bytes:
        return scalar_from_uniform(self.derive(label, length=64))  # zero (probability 2^-256) is refused


def _encode_ids(ids: Sequence[str] | npt.NDArray[np.str_]) -> list[bytes]:
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.dtype.kind != "U":
        raise ShapeMismatchError(f"ids must be a one-dimensional text array, got dtype {arr.dtype}")
    return [str(x).encode("utf-8") for x in arr.tolist()]


def _hash_piece(raw_ids: Sequence[bytes]) -> bytes:
    """H(id) for encoded ids, packed (the per-element libsecp256k1 calls; runs in a worker too)."""
    return hash_packed(_ID_DOMAIN, raw_ids)


def _hash_blind_piece(args: tuple[bytes, Sequence[bytes]]) -> bytes:
    """H(id)^s for encoded ids, packed, in one pass (runs in a worker too)."""
    scalar, raw_ids = args
    return hash_packed(_ID_DOMAIN, raw_ids, scalar)


def _blind_piece(scalar: bytes, packed: bytes) -> bytes:
    """P^s for every point of a packed list, packed; libsecp256k1 validates each point."""
    return blind_packed(scalar, packed)


def _check_piece(packed: bytes) -> bytes:
    """The packed list itself, every point validated (runs in a worker too)."""
    return check_points(packed)


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


def _hash_blind_packed(raw_ids: list[bytes], scalar: bytes, workers: PsiWorkers) -> bytes:
    cuts = workers.pieces(len(raw_ids))
    return b"".join(workers.run(_hash_blind_piece, [(scalar, raw_ids[a:b]) for a, b in cuts]))


def _check_packed_points(packed: bytes, workers: PsiWorkers) -> bytes:
    cuts = workers.pieces(len(packed) // POINT_BYTES)
    return b"".join(workers.run(_check_piece, [packed[a * POINT_BYTES : b * POINT_BYTES] for a, b in cuts]))


def hash_to_group(ids: Sequence[str] | npt.NDArray[np.str_], workers: PsiWorkers = _IN_PROCESS) -> list[bytes]:
    """H(id) for every id (random-oracle hash to the prime-order subgroup; module doc)."""
    return _unpack(_hash_packed(_encode_ids(ids), workers))


def _unpack(packed: bytes) -> list[bytes]:
    return [packed[i : i + POINT_BYTES] for i in range(0, len(packed), POINT_BYTES)]


def check_packed(data: bytes) -> None:
    """:class:`InvalidPointError` unless ``data`` is a whole number of 33-byte encodings."""
    if not isinstance(data, bytes | bytearray) or len(data) % POINT_BYTES:
        size = len(data) if isinstance(data, bytes | bytearray) else type(data).__name__
        raise InvalidPointError(f"a point list must be a whole number of {POINT_BYTES}-byte points, got {size}")


def split_points(data: bytes) -> list[bytes]:
    """A packed list (concatenated 33-byte encodings) as a list of points; checks the length."""
    check_packed(data)
    return [bytes(data[i : i + POINT_BYTES]) for i in range(0, len(data), POINT_BYTES)]


def blind(points: Sequence[bytes], key: PsiKey, workers: PsiWorkers = _IN_PROCESS) -> list[bytes]:
    """P^s for every point, in the same order; each point is validated by libsecp256k1."""
    if any(len(p) != POINT_BYTES for p in points):
        raise InvalidPointError(f"a point must be {POINT_BYTES} bytes")
    return _unpack(_blind_packed(b"".join(points), key.scalar(), workers))


def _sort_order_packed(packed: bytes) -> npt.NDArray[np.int64]:
    """Indices that sort the 33-byte encodings of a packed list ascending (the prefix byte, then x
    as four big-endian 64-bit words)."""
    if not packed:
        return np.zeros(0, dtype=np.int64)
    rows = np.frombuffer(packed, dtype=np.uint8).reshape(-1, POINT_BYTES)
    words = np.ascontiguousarray(rows[:, 1:]).view(">u8").astype(np.uint64)
    keys = np.stack([words[:, 3], words[:, 2], words[:, 1], words[:, 0], rows[:, 0].astype(np.uint64)])
    return np.asarray(np.lexsort(keys), dtype=np.int64)  # lexsort: the last key (the prefix) first


@dataclass(frozen=True)
class PsiOwnList:
    """A curator's own list after step 1: what it sends, and how to link the answer back."""

    sent: bytes
    """H(x)^{r_j} (the one-time mask; s_j at N = 2), sorted ascending by encoding: the message to the next curator."""
    row_of: npt.NDArray[np.int64]
    """row_of[i] = the own row whose point is the i-th of ``sent``."""
    unmask: bytes = field(default=bytes(SCALAR_BYTES), repr=False)
    """s_j / r_j mod ORDER: turns the returned list into F (secret; never leaves the owner); 1 at N = 2."""


def first_scalar(key: PsiKey, num_curators: int | None) -> bytes:
    """The scalar an owner blinds its own list with at step 1: the one-time mask r_j, or s_j at
    N = 2 (the mask buys nothing there; module doc)."""
    return key.scalar() if num_curators == 2 else key.mask()


def unmask_scalar(key: PsiKey, num_curators: int | None) -> bytes:
    """The scalar that turns the owner's returned list into F: s_j / r_j mod ORDER (step 3), or 1
    at N = 2 (the list returns as F)."""
    return ONE if num_curators == 2 else scalar_mul(key.scalar(), scalar_inverse(key.mask()))


def hash_blind(ids: Sequence[str] | npt.NDArray[np.str_], scalar: bytes) -> bytes:
    """H(id)^scalar for every id, packed in the ids' order (the hash and the multiplication in one
    pass): step 1 for one piece of a table (a worker of a curator's cluster runs it per partition)."""
    return _hash_blind_piece((scalar, _encode_ids(ids)))


def psi_start(
    ids: Sequence[str] | npt.NDArray[np.str_],
    key: PsiKey,
    workers: PsiWorkers = _IN_PROCESS,
    num_curators: int | None = None,
) -> PsiOwnList:
    """Step 1: hash the own ids to the group, blind with the one-time mask r_j, sort. With
    ``num_curators == 2`` the mask buys nothing (module doc): blind with s_j, unmask = 1."""
    blinded = _hash_blind_packed(_encode_ids(ids), first_scalar(key, num_curators), workers)
    order = _sort_order_packed(blinded)
    rows = np.frombuffer(blinded, dtype=np.dtype((np.void, POINT_BYTES)))
    return PsiOwnList(rows[order].tobytes(), order, unmask_scalar(key, num_curators))


def finish_slice(returned: bytes, unmask: bytes) -> bytes:
    """Step 3 for a piece of the owner's returned list: F of each point (raised to ``unmask``;
    ``unmask`` = 1: only validated), packed in the same order."""
    check_packed(returned)
    return check_points(returned) if unmask == ONE else blind_packed(unmask, returned)


def psi_reblind(received: bytes, key: PsiKey, workers: PsiWorkers = _IN_PROCESS) -> bytes:
    """Step 2: raise every received point to the own scalar, keeping the order (one ring hop)."""
    check_packed(received)
    return _blind_packed(bytes(received), key.scalar(), workers)


def blinded_tags(points: Sequence[bytes], domain: int = 0) -> TagArray:
    """BLAKE2b-128 of each fully blinded point in tag domain ``domain`` (salt = the domain as 16
    big-endian bytes; domain 0 is the unsalted tag), as alignment tags (hi, lo big-endian words)."""
    salt = int(domain).to_bytes(16, "big")
    digest = b"".join(hashlib.blake2b(p, digest_size=16, person=_TAG_PERSON, salt=salt).digest() for p in points)
    return np.frombuffer(digest, dtype=TAG_DTYPE).copy()


def psi_finish_points(own: PsiOwnList, returned: bytes, workers: PsiWorkers = _IN_PROCESS) -> bytes:
    """Step 3: F(x) of every own row, packed in own row order, from the own list back after
    N - 1 hops (raised to s_j / r_j; at N = 2 the list is F already and is only validated; every
    point that is not a canonical curve point is refused)."""
    check_packed(returned)
    count = len(returned) // POINT_BYTES
    if count != own.row_of.size:
        raise ShapeMismatchError(f"the returned list holds {count} points, but {own.row_of.size} were sent")
    if own.unmask == bytes(SCALAR_BYTES):
        raise InvalidPointError("this own list carries no unmasking scalar (made by psi_start?)")
    point = np.dtype((np.void, POINT_BYTES))
    back = bytes(returned)
    done = _check_packed_points(back, workers) if own.unmask == ONE else _blind_packed(back, own.unmask, workers)
    finished = np.frombuffer(done, dtype=point)
    out = np.empty_like(finished)
    out[own.row_of] = finished
    return out.tobytes()


def psi_tags(points: bytes, domain: int = 0) -> TagArray:
    """The tags of packed F points in tag domain ``domain`` (:func:`blinded_tags`)."""
    return blinded_tags(split_points(points), domain)


def psi_finish(own: PsiOwnList, returned: bytes, workers: PsiWorkers = _IN_PROCESS, domain: int = 0) -> TagArray:
    """Step 3-4 at curator ``domain`` (its index in the ring): its tags, own row order."""
    return psi_tags(psi_finish_points(own, returned, workers), domain)


def _filler(domain: int) -> TagArray:
    d = hashlib.blake2b(int(domain).to_bytes(8, "big"), digest_size=16, person=b"sr-psi-fill-v1").digest()
    return np.frombuffer(d, dtype=TAG_DTYPE).copy()


def psi_leader_view(leader_tags: Sequence[TagArray], follower_tags: Mapping[int, TagArray]) -> dict[int, TagArray]:
    """The leader's matching (step 4): follower j's tags (domain j) in the leader's domain 0.

    ``leader_tags[d]``: the leader's own tags in domain d (own row order, d = 0 .. N-1);
    ``follower_tags[j]``: what follower j sent. A follower tag equal to the leader's domain-j tag
    of a row becomes that row's domain-0 tag; any other becomes a filler (the tag XOR a per-domain
    constant, pseudorandom, equal to a real tag with probability 2^-128), so it matches nothing.
    :func:`mechanism.alignment.keyed_hash.align_all` over the leader's domain-0 tags and these lists gives
    the N-way intersection and every follower's rows. Vectorised (one sort per follower)."""
    out: dict[int, TagArray] = {}
    for j, tags in follower_tags.items():
        if not 1 <= j < len(leader_tags):
            raise ShapeMismatchError(f"follower {j} has no tag domain among the leader's {len(leader_tags)}")
        tags = np.ascontiguousarray(np.asarray(tags).astype(TAG_DTYPE, copy=False))
        fill = _filler(j)
        view = tags.copy()
        view["hi"] ^= fill["hi"][0]
        view["lo"] ^= fill["lo"][0]
        mine = np.ascontiguousarray(np.asarray(leader_tags[j]).astype(TAG_DTYPE, copy=False))
        order = np.argsort(mine, kind="stable")
        ordered = mine[order]
        at = np.minimum(np.searchsorted(ordered, tags), max(ordered.size - 1, 0))
        hit = ordered[at] == tags if ordered.size else np.zeros(tags.size, dtype=bool)
        view[hit] = leader_tags[0][order[at[hit]]]  # every occurrence: a repeated id stays repeated
        out[j] = view
    return out


def ring_hops(owner: int, num_curators: int) -> list[int]:
    """The curators owner's list visits, in order (then it returns to ``owner``)."""
    if not 0 <= owner < num_curators or num_curators < 2:
        raise ShapeMismatchError(f"owner {owner} must index one of N >= 2 curators, N = {num_curators}")
    return [(owner + h) % num_curators for h in range(1, num_curators)]


@dataclass(frozen=True)
class PsiRun:
    """The outcome of :func:`run_psi` and every curator's received messages."""

    tags: list[TagArray]
    """Per curator, its rows as the leader matches them (own row order): at N = 2 both in domain
    1 (the follower's, which the leader compares directly), else in the leader's domain 0
    (:func:`psi_leader_view`). ``common_tags(tags)`` is the N-way intersection in the canonical
    order, the order the services agree on, on either engine."""
    received: list[list[tuple[int, int, bytes]]]
    """received[i]: (owner, hop, list) for every ring message curator i received (the leader,
    as the mailbox of the services, also sees every other one)."""
    sent_tags: list[TagArray]
    """sent_tags[j]: the tags curator j sends the leader (its own domain j; own row order)."""
    leader_tags: list[TagArray]
    """The leader's own tags in every domain d = 0 .. N-1 (own row order)."""


def run_psi(
    id_lists: Sequence[Sequence[str] | npt.NDArray[np.str_]], keys: Sequence[PsiKey], workers: PsiWorkers = _IN_PROCESS
) -> PsiRun:
    """Steps 1-3 for N curators in memory (the ring, hop by hop); step 4 is the keyed-hash
    mode's leader step on the returned tags."""
    num = len(id_lists)
    if num < 2 or len(keys) != num:
        raise ShapeMismatchError(f"PSI needs N >= 2 curators and one key each; got {num} and {len(keys)}")
    own = [psi_start(ids, k, workers, num) for ids, k in zip(id_lists, keys, strict=True)]
    received: list[list[tuple[int, int, bytes]]] = [[] for _ in range(num)]
    finished = []
    for j in range(num):
        message = own[j].sent
        for hop, i in enumerate(ring_hops(j, num), start=1):
            received[i].append((j, hop, message))
            message = psi_reblind(message, keys[i], workers)
        received[j].append((j, num, message))
        finished.append(psi_finish_points(own[j], message, workers))
    sent = [psi_tags(f, j) for j, f in enumerate(finished)]
    leader = [sent[0], *(psi_tags(finished[0], d) for d in range(1, num))]
    if num == 2:  # the leader matches its one follower in the follower's domain (matched_tags)
        return PsiRun([leader[1], sent[1]], received, sent, leader)
    view = psi_leader_view(leader, {j: sent[j] for j in range(1, num)})
    return PsiRun([leader[0], *(view[j] for j in range(1, num))], received, sent, leader)
