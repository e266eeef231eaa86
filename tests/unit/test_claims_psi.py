# tier: unit
"""Issue 23, item 1: with N >= 2 curators the PSI reveals what docs/architectures.md says, no more.

Every party is played as the attacker: it takes everything it received (for the leader, the
mailbox of the services, i.e. every ring list at every hop, and every follower's tags) and
everything it holds (its ids, H of them, its two scalars, its F values), raises every received
point to every exponent it can form from its own scalars (s, r, their inverses and products),
tags every point in every tag domain, and matches all of it against every encoding of its own ids.
The ids it links this way, plus what the agreement tells it (its own rows of the intersection),
must be exactly the N-way intersection for a follower, and exactly its pairwise intersections for
the leader; the leader must also find no link at all between two other curators' data. At N = 2
(issue 41: no mask, each of the two can finish the other's list) both must link exactly the
intersection.

Planted: N-way core, pairwise-only overlaps of different sizes for every pair, and (N = 4)
triple-only overlaps with and without the leader, so any pairwise leak shows as a size that
differs from the core. The same attacker run on the pre-issue-23 ring (emulated below from the
same primitives: the owner blinds with s_j, so its ring predecessor can finish its list, and every
tag is in one domain) finds the leaks the audit reported: the test that it does is what makes
this attacker able to fail.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from secure_release.mechanism.alignment.keyed_hash import align_all
from secure_release.mechanism.alignment.psi import (
    InvalidPointError,
    PsiKey,
    blinded_tags,
    hash_to_group,
    run_psi,
    split_points,
)
from secure_release.mechanism.alignment.psi_group import point_mul, scalar_inverse, scalar_mul


def _keys(num: int, tag: bytes = b"") -> list[PsiKey]:
    return [PsiKey(hashlib.sha256(b"claims-psi-%d" % j + tag).digest()) for j in range(num)]


def planted(num: int) -> tuple[list[np.ndarray], dict[frozenset[int], int]]:
    """Id lists with planted overlaps: every subset S of size >= 2 of the curators shares
    ``sizes[S]`` ids that no curator outside S holds; every curator has 3 ids of its own."""
    sizes: dict[frozenset[int], int] = {frozenset(range(num)): 4}
    for k, pair in enumerate(itertools.combinations(range(num), 2)):
        sizes[frozenset(pair)] = 2 + k  # 2, 3, 4, ... : every pair a different size
    if num == 4:
        sizes[frozenset({1, 2, 3})] = 2  # followers only
        sizes[frozenset({0, 1, 2})] = 1  # with the leader
    lists: list[list[str]] = [[f"own{j}-{i}" for i in range(3)] for j in range(num)]
    for subset, size in sizes.items():
        name = "".join(map(str, sorted(subset)))
        for j in subset:
            lists[j] += [f"s{name}-{i}" for i in range(size)]
    rng = np.random.default_rng(num)
    return [rng.permutation(np.array(ids)) for ids in lists], sizes


def _mul(scalar: bytes, point: bytes) -> bytes | None:
    try:
        return point_mul(scalar, point)
    except InvalidPointError:
        return None


def _exponents(scalars: Sequence[bytes]) -> list[bytes]:
    """Every exponent a party can form from its scalars: each, its inverse, and pairwise products."""
    base = list(dict.fromkeys([*scalars, *(scalar_inverse(s) for s in scalars)]))
    products = [scalar_mul(a, b) for a, b in itertools.combinations_with_replacement(base, 2)]
    return list(dict.fromkeys([*base, *products]))


@dataclass
class Attacker:
    """One party's knowledge: encodings of its own ids (points, and tags in every domain)."""

    ids: np.ndarray
    exponents: list[bytes]
    domains: int
    own_points: dict[bytes, str]
    own_tags: dict[bytes, str]

    @classmethod
    def of(cls, ids: np.ndarray, scalars: Sequence[bytes], finished: Sequence[bytes], domains: int) -> Attacker:
        exps = _exponents(scalars)
        points: dict[bytes, str] = {}
        for x, h, f in zip(ids.tolist(), hash_to_group(ids), finished, strict=True):
            for p in (h, f):
                points[p] = x
                for e in exps:
                    q = _mul(e, p)
                    if q is not None:
                        points[q] = x
        tags = {}
        for p, x in points.items():
            for d in range(domains):
                tags[blinded_tags([p], d).tobytes()] = x
        return cls(ids, exps, domains, points, tags)

    def forms(self, point: bytes) -> set[bytes]:
        """The received point under every own exponent, as points and as tags in every domain."""
        pts = {point, *(q for e in self.exponents if (q := _mul(e, point)) is not None)}
        return pts | {blinded_tags([p], d).tobytes() for p in pts for d in range(self.domains)}

    def links(self, lists: Iterable[bytes], tags: Iterable[np.ndarray]) -> set[str]:
        """Own ids linked to anything received (point lists, tag arrays) from other parties."""
        found: set[str] = set()
        for packed in lists:
            for p in split_points(packed):
                for f in self.forms(p):
                    x = self.own_points.get(f) or self.own_tags.get(f)
                    if x is not None:
                        found.add(x)
        for arr in tags:
            found.update(x for t in np.asarray(arr) if (x := self.own_tags.get(t.tobytes())) is not None)
        return found


def cross_links(attacker: Attacker, by_source: dict[int, tuple[list[bytes], list[np.ndarray]]]) -> int:
    """Pairs of items from two different other parties that the attacker can show are equal
    (every form of one source's points and tags against the other's)."""
    forms: dict[int, set[bytes]] = {}
    for src, (lists, tags) in by_source.items():
        out: set[bytes] = set()
        for packed in lists:
            for p in split_points(packed):
                out |= attacker.forms(p)
        for arr in tags:
            out |= {t.tobytes() for t in np.asarray(arr)}
        forms[src] = out
    return sum(len(forms[a] & forms[b]) for a, b in itertools.combinations(sorted(forms), 2))


@dataclass
class View:
    """What one run gives every party."""

    received: list[list[tuple[int, int, bytes]]]  # per party: (owner, hop, list)
    sent_tags: list[np.ndarray]  # per party: the tags it sends the leader
    finished: list[list[bytes]]  # per party: F of its own ids (own row order)
    scalars: list[list[bytes]]  # per party: every scalar it holds
    agreed: list[set[str]]  # per party: the ids the agreement tells it are common


def current_view(ids: list[np.ndarray], keys: list[PsiKey]) -> View:
    num = len(ids)
    run = run_psi(ids, keys)
    _, alignments = align_all(run.tags)
    agreed = [set(x[a.row_order].tolist()) for x, a in zip(ids, alignments, strict=True)]
    # F of own ids: the unmasked list (what psi_finish_points returns; recomputed from the scalars)
    product = keys[0].scalar()
    for k in keys[1:]:
        product = scalar_mul(product, k.scalar())
    finished = [[point_mul(product, h) for h in hash_to_group(x)] for x in ids]
    for j in range(num):  # the F the party holds are those its tags were made of
        assert blinded_tags(finished[j], j).tobytes() == run.sent_tags[j].tobytes()
    return View(run.received, run.sent_tags, finished, [[k.scalar(), k.mask()] for k in keys], agreed)


def pre_issue_23_view(ids: list[np.ndarray], keys: list[PsiKey]) -> View:
    """The ring as it was: owner j sends H(x)^{s_j}; back after N - 1 hops it is F; one tag domain."""
    num = len(ids)
    scal = [k.scalar() for k in keys]
    received: list[list[tuple[int, int, bytes]]] = [[] for _ in range(num)]
    finished = []
    for j in range(num):
        pts = [point_mul(scal[j], h) for h in hash_to_group(ids[j])]
        order = sorted(range(len(pts)), key=lambda i: pts[i])
        message = [pts[i] for i in order]
        for hop in range(1, num):
            i = (j + hop) % num
            received[i].append((j, hop, b"".join(message)))
            message = [point_mul(scal[i], p) for p in message]
        received[j].append((j, num, b"".join(message)))
        f = [b""] * len(pts)
        for pos, i in enumerate(order):
            f[i] = message[pos]
        finished.append(f)
    tags = [blinded_tags(f, 0) for f in finished]
    _, alignments = align_all(tags)
    agreed = [set(x[a.row_order].tolist()) for x, a in zip(ids, alignments, strict=True)]
    return View(received, tags, finished, [[s] for s in scal], agreed)


@dataclass
class Learned:
    """What each party linked: own ids (per party) and the leader's cross links between others."""

    own: list[set[str]]
    leader_cross_links: int


def attack(ids: list[np.ndarray], view: View) -> Learned:
    num = len(ids)
    own: list[set[str]] = []
    cross = 0
    for party in range(num):
        attacker = Attacker.of(ids[party], view.scalars[party], view.finished[party], num)
        if party == 0:  # the leader is the mailbox: every list at every hop, and every follower's tags
            mailbox = [(owner, m) for got in view.received for owner, _, m in got]
            by_source = {
                src: ([m for owner, m in mailbox if owner == src], [view.sent_tags[src]]) for src in range(1, num)
            }
            found = attacker.links([m for _, m in mailbox if _ != 0], [view.sent_tags[s] for s in range(1, num)])
            cross = cross_links(attacker, by_source)
        else:
            found = attacker.links([m for owner, _, m in view.received[party] if owner != party], [])
        own.append(found | view.agreed[party])
    return Learned(own, cross)


def _truth(ids: list[np.ndarray]) -> tuple[set[str], list[set[str]]]:
    sets = [set(x.tolist()) for x in ids]
    core = set.intersection(*sets)
    leader = set().union(*(sets[0] & sets[j] for j in range(1, len(ids))))
    return core, [leader, *([core] * (len(ids) - 1))]


@pytest.mark.parametrize("num", [2, 3, 4])
def test_every_party_learns_only_what_the_table_grants(num: int) -> None:
    ids, sizes = planted(num)
    core, granted = _truth(ids)
    assert len(core) == sizes[frozenset(range(num))] > 0
    assert all(len(g) > len(core) for g in granted[:1]) or num == 2  # N = 2: the pairwise one is the core
    learned = attack(ids, current_view(ids, _keys(num)))
    for party in range(num):
        assert learned.own[party] == granted[party], party  # followers: the N-way intersection only
    assert learned.leader_cross_links == 0  # nothing about two followers' ids the leader lacks


@pytest.mark.parametrize("num", [3, 4])
def test_the_attacker_finds_the_leaks_of_the_pre_issue_23_ring(num: int) -> None:
    """The same attacker on the old ring: every follower learns its pairwise intersection with
    its ring successor, and the leader links followers' ids it does not hold."""
    ids, sizes = planted(num)
    core, _ = _truth(ids)
    sets = [set(x.tolist()) for x in ids]
    learned = attack(ids, pre_issue_23_view(ids, _keys(num)))
    for party in range(1, num):
        successor = (party + 1) % num
        assert learned.own[party] >= sets[party] & sets[successor] > core
    followers_only = sum(size for s, size in sizes.items() if 0 not in s)
    assert learned.leader_cross_links >= followers_only > 0


def test_leader_view_maps_every_follower_tag_it_holds_and_keeps_repeats() -> None:
    """psi_leader_view: matched tags become the leader's domain-0 tag (a repeated follower id
    stays repeated, so alignment still refuses it); unmatched ones match nothing."""
    from secure_release.mechanism.alignment.keyed_hash import DuplicateIdError
    from secure_release.mechanism.alignment.psi import psi_leader_view

    ids = [np.array(["a", "b", "c"]), np.array(["b", "c", "d"])]
    run = run_psi(ids, _keys(2))
    view = psi_leader_view(run.leader_tags, {1: run.sent_tags[1]})[1]
    assert view[:2].tobytes() == run.leader_tags[0][1:].tobytes()  # b, c
    assert view[2].tobytes() not in {t.tobytes() for t in run.leader_tags[0]}  # d: a filler
    repeated = np.concatenate([run.sent_tags[1], run.sent_tags[1][:1]])
    with pytest.raises(DuplicateIdError):
        align_all([run.leader_tags[0], psi_leader_view(run.leader_tags, {1: repeated})[1]])
