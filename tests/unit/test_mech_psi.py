"""The N-party ECDH PSI (mechanism.alignment.psi): correctness against a plain set intersection, one
canonical order at every curator, rejection of bad points, and what a curator receives.

What is exactly testable about the received messages (with every curator's scalar fixed):
1. the list a curator gets back (its own ids, fully blinded) and the agreed common tags are
   bit-identical when a partner changes only ids outside the intersection;
2. in the partner's list the curator receives, the points of intersection ids are unchanged, and
   the points of non-intersection ids are the image of ids it does not hold under x -> H(x)^s
   with s unknown to it; replacing exactly those points by fresh uniformly random group elements
   (the simulator's view) leaves everything the curator computes unchanged (it forwards them
   re-blinded and never matches them). That the real and simulated points cannot be told apart
   is the DDH assumption, which no test can check.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from secure_release.mechanism.alignment.keyed_hash import align, common_tags
from secure_release.mechanism.alignment.psi import (
    POINT_BYTES,
    InvalidPointError,
    PsiKey,
    blind,
    hash_to_group,
    psi_finish,
    psi_reblind,
    psi_start,
    ring_hops,
    run_psi,
    split_points,
)
from secure_release.mechanism.alignment.psi_group import FIELD_PRIME, check_points, point_mul, swiftec_decode

KEYS = [PsiKey(hashlib.sha256(b"psi-%d" % j).digest()) for j in range(3)]


def _ids(lo: int, hi: int, prefix: str = "id") -> np.ndarray:
    return np.array([f"{prefix}{i}" for i in range(lo, hi)])


def _outgoing(ids: np.ndarray, key: PsiKey, num: int | None = None) -> set[bytes]:
    """The owner's own list as it leaves it: H(x)^r for its one-time mask r, or H(x)^s at N = 2."""
    first = key.scalar() if num == 2 else key.mask()
    return {point_mul(first, p) for p in hash_to_group(ids)}


def _is_square(v: int) -> bool:
    return pow(v, (FIELD_PRIME - 1) // 2, FIELD_PRIME) in (0, 1)


def _x_bytes(x: int) -> bytes:
    return x.to_bytes(32, "big")


def bad_points() -> dict[str, bytes]:
    """Encodings every received list must refuse (each 33 bytes unless the name says otherwise)."""
    p = FIELD_PRIME
    off = next(x for x in range(1, 100) if not _is_square((x**3 + 7) % p))  # x^3 + 7 not a square
    on = next(x for x in range(1, 100) if _is_square((x**3 + 7) % p))  # a valid x below 2^32 + 977
    good = b"\x02" + _x_bytes(on)
    check_points(good)  # the non-canonical case below differs from a valid point only by x + p
    return {
        "off the curve": b"\x02" + _x_bytes(off),
        "identity (all zero)": bytes(POINT_BYTES),
        "prefix 0x00": b"\x00" + _x_bytes(on),
        "non-canonical x + p": b"\x02" + _x_bytes(on + p),
        "x = p": b"\x03" + _x_bytes(p),
        "uncompressed prefix 0x04": b"\x04" + _x_bytes(on),
        "hybrid prefix 0x06": b"\x06" + _x_bytes(on),
        "all 0xff": b"\xff" * POINT_BYTES,
    }


def _aligned_ids(id_lists: list[np.ndarray], keys: list[PsiKey]) -> list[np.ndarray]:
    run = run_psi(id_lists, keys)
    common = common_tags(run.tags)
    return [ids[align(t, common).row_order] for ids, t in zip(id_lists, run.tags, strict=True)]


@pytest.mark.parametrize("num", [2, 3])
def test_intersection_and_one_canonical_order(num: int) -> None:
    rng = np.random.default_rng(5)
    universe = _ids(0, 120)
    id_lists = [rng.permutation(universe[rng.random(120) < 0.7]) for _ in range(num)]
    aligned = _aligned_ids(id_lists, KEYS[:num])
    truth = set(id_lists[0].tolist()).intersection(*[set(x.tolist()) for x in id_lists[1:]])
    assert set(aligned[0].tolist()) == truth and len(aligned[0]) == len(truth)
    for other in aligned[1:]:
        assert np.array_equal(other, aligned[0])  # the same ids in the same canonical order
    # the order does not depend on any curator's row order
    again = _aligned_ids([x[::-1].copy() for x in id_lists], KEYS[:num])
    assert np.array_equal(again[0], aligned[0])


def test_order_depends_on_keys_and_looks_unrelated_to_ids() -> None:
    ids = _ids(0, 200)
    a = _aligned_ids([ids, ids], KEYS[:2])[0]
    b = _aligned_ids([ids, ids], [PsiKey.generate(), PsiKey.generate()])[0]
    assert sorted(a.tolist()) == sorted(b.tolist()) and not np.array_equal(a, b)
    assert not np.array_equal(a, np.sort(ids))


def test_empty_intersection_and_unicode() -> None:
    run = run_psi([np.array(["ä", "b"]), np.array(["c"])], KEYS[:2])
    assert common_tags(run.tags).size == 0
    assert _aligned_ids([np.array(["ä", "b"]), np.array(["b", "ä"])], KEYS[:2])[0].tolist() != []


def test_ring_routes() -> None:
    assert ring_hops(0, 3) == [1, 2] and ring_hops(2, 3) == [0, 1] and ring_hops(1, 2) == [0]


def test_commutative_blinding_and_hash_in_group() -> None:
    points = hash_to_group(["x", "y"])
    assert check_points(b"".join(points)) == b"".join(points) and all(len(p) == POINT_BYTES for p in points)
    ab = blind(blind(points, KEYS[0]), KEYS[1])
    ba = blind(blind(points, KEYS[1]), KEYS[0])
    assert ab == ba and ab[0] != ab[1]


@pytest.mark.parametrize("name", sorted(bad_points()))
@pytest.mark.parametrize("num", [2, 3])
def test_invalid_points_are_refused(name: str, num: int) -> None:
    """Off the curve, the identity, non-canonical, wrong prefix: refused with InvalidPointError
    by a re-blinding hop and by the owner's finish, alone or hidden among valid points; at N = 2
    the finish multiplies nothing and still validates every point."""
    bad = bad_points()[name]
    own = psi_start(["x", "y"], KEYS[0], num_curators=num)
    back = psi_reblind(own.sent, KEYS[1])
    for hop_input in (bad, own.sent[:POINT_BYTES] + bad):
        with pytest.raises(InvalidPointError):
            psi_reblind(hop_input, KEYS[1])
    with pytest.raises(InvalidPointError):
        psi_finish(own, back[:POINT_BYTES] + bad)
    with pytest.raises(InvalidPointError):
        blind([bad], KEYS[0])
    psi_finish(own, back)  # the valid list still finishes


def test_wrong_lengths_are_refused() -> None:
    own = psi_start(["x"], KEYS[0], num_curators=2)
    for data in (own.sent + b"x", own.sent[:-1], own.sent[1:], b"\x02" * 32, own.sent + bytes(65)):
        with pytest.raises(InvalidPointError):
            split_points(data)
        with pytest.raises(InvalidPointError):
            psi_reblind(data, KEYS[1])
    with pytest.raises(InvalidPointError):
        blind([own.sent[:32]], KEYS[1])


def test_received_messages_do_not_depend_on_partner_ids_outside_the_intersection() -> None:
    alice = _ids(0, 40)
    common = _ids(20, 40)
    bob1 = np.concatenate([common, _ids(100, 130, "x")])
    bob2 = np.concatenate([common, _ids(500, 530, "y")])  # differs only outside the intersection
    keys = KEYS[:2]
    run1, run2 = run_psi([alice, bob1], keys), run_psi([alice, bob2], keys)
    # (1) Alice's own list back, and the agreed tags: bit-identical
    back1 = [m for owner, _, m in run1.received[0] if owner == 0]
    back2 = [m for owner, _, m in run2.received[0] if owner == 0]
    assert back1 == back2
    assert np.array_equal(run1.tags[0], run2.tags[0])
    assert np.array_equal(common_tags(run1.tags), common_tags(run2.tags))
    # (2) Bob's list as Alice receives it: intersection points identical, the rest disjoint
    got1 = set(split_points(next(m for owner, _, m in run1.received[0] if owner == 1)))
    got2 = set(split_points(next(m for owner, _, m in run2.received[0] if owner == 1)))
    assert len(got1 & got2) == common.size
    assert got1 & got2 == _outgoing(common, keys[1], 2)  # N = 2: H(x)^{s_bob}, no mask (issue 41)


def test_simulated_view_gives_the_same_outcome() -> None:
    """Replace the points of Bob's non-intersection ids, as Alice receives them, by uniformly
    random group elements: Alice's re-blinded answer on the intersection and the agreed
    intersection are unchanged."""
    alice, bob = _ids(0, 30), np.concatenate([_ids(10, 30), _ids(300, 320, "z")])
    keys = KEYS[:2]
    real = run_psi([alice, bob], keys)
    bob_own = psi_start(bob, keys[1])
    inter_points = _outgoing(_ids(10, 30), keys[1])  # psi_start without N: masked
    received = split_points(bob_own.sent)
    simulated = [p if p in inter_points else swiftec_decode(os.urandom(64)) for p in received]
    sim_back = psi_reblind(b"".join(simulated), keys[0])
    bob_tags = psi_finish(bob_own, sim_back, domain=1)
    sim_common = common_tags([real.tags[0], bob_tags])  # N = 2: the leader matches in bob's domain 1
    assert np.array_equal(sim_common, common_tags(real.tags))
