"""Issue 49: the leader's PSI mailbox keeps only the lists still to be read. A list at hop h is
deleted (every slice) once its hop h + 1 is complete, a last hop is kept for the release, so of
each owner's list at most 2 hops are held at once where a hop is read only once complete: 2N
lists at the peak, not N * N, and N (the last hops) from the end of the ring on.

Exact checks, through the leader's own calls (``psi_put`` / ``psi_put_slice`` with real
re-blindings and proofs, ``psi_get`` / ``psi_get_slice``): which hops of which lists are held
after every step of rings of 2 and 3 (curators on clusters, a slice at a time, and in one
process, whole lists), the peak; a deleted slice's file is its header alone; a resend of a
deleted slice, a fetch of a deleted list and a resend of a re-blinding made from it fail nothing
and bring nothing back, before and after a restart of the leader; a whole list the leader was
killed while storing is checked again against the whole list it came from; the answer crosses the wire
(ALREADY_EXISTS, :class:`PsiListConsumedError`); a curator that runs its ring again, in one
process or on its cluster, skips the lists passed on and ends with the same result; a restart
completes a deletion a kill interrupted, and refuses a mailbox that lost a slice it cannot get
again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import grpc
import numpy as np
import pytest
from support import run_at_once, split_parquet

from secure_release.curator.cluster import ring as rg
from secure_release.curator.cluster.engine import InlineEngine
from secure_release.curator.leader import LeaderState
from secure_release.curator.psi_mailbox import (
    _FIXED,
    DELETED_MAGIC,
    MAGIC,
    PsiListConsumedError,
    PsiMailbox,
    SliceShape,
    whole_shape,
)
from secure_release.curator.release.psi_ring import consumed_at_leader, ring
from secure_release.curator.table import load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.infra.errors import abort_with
from secure_release.infra.streams import PsiStreamError
from secure_release.mechanism.alignment.psi import POINT_BYTES, PsiKey, hash_blind
from secure_release.mechanism.alignment.psi_group import blind_packed
from secure_release.mechanism.alignment.psi_proof import proof_context, prove_reblind, public_point, slice_context
from secure_release.mechanism.errors import SeedReuseError
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.architectures import AlignmentMode

KEYS = {c: PsiKey(bytes([60 + i]) * 32) for i, c in enumerate(("alice", "bob", "carol"))}
HALVES = [SliceShape(0, 2, 0, 3, 5), SliceShape(1, 2, 3, 2, 5)]  # a list on a cluster: two slices


def _state(names: tuple[str, ...], directory: Path | None) -> LeaderState:
    return LeaderState("r1", names, None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                       alignment=AlignmentMode.PSI, psi_dir=directory)  # fmt: skip


class Ring:
    """The curators of a ring as the leader's mailbox sees them: those in ``sliced`` (on a
    cluster) send their own list in two slices and fetch and send a slice at a time; the
    others send a whole list (4 points) and fetch and send whole lists. Every re-blinding is
    real and proved."""

    def __init__(self, state: LeaderState, sliced: set[str]) -> None:
        self.state, self.names, self.sliced = state, state.curators, sliced
        self.sent: dict[tuple[str, str, int, int], tuple[SliceShape, bytes, bytes]] = {}  # what each sent

    def slices(self, owner: str) -> int:
        return 2 if owner in self.sliced else 1

    def start(self, who: str) -> None:
        if who in self.sliced:
            own = hash_blind(np.array([f"{who}{i}" for i in range(5)]), KEYS[who].scalar())
            for shape in HALVES:
                points = own[shape.first * POINT_BYTES : (shape.first + shape.count) * POINT_BYTES]
                self.state.psi_put_slice(who, who, 1, shape, points)
                self.sent[(who, who, 1, shape.index)] = (shape, points, b"")
        else:
            own = hash_blind(np.array([f"{who}{i}" for i in range(4)]), KEYS[who].scalar())
            self.state.psi_put(who, who, 1, own)
            self.sent[(who, who, 1, 0)] = (whole_shape(4), own, b"")

    def owner_at(self, who: str, step: int) -> str:
        return self.names[(self.names.index(who) - step) % len(self.names)]

    def reblind(self, who: str, step: int, index: int = 0) -> None:
        """``who``'s part of ring step ``step``: its slice ``index`` (on a cluster) or the whole
        list (in one process) of the list it is routed, at hop ``step``, into hop ``step + 1``."""
        owner, key = self.owner_at(who, step), KEYS[who]
        if who in self.sliced:
            got = self.state.psi_get_slice(who, owner, step, index, 0.0)
            assert got is not None, f"{who} found no slice {index} of {owner}@{step}"
            shape, points = got
            out = blind_packed(key.scalar(), points)
            proof = prove_reblind(key, slice_context(owner, step + 1, index, shape.slices), points, out)
            self.state.psi_put_slice(who, owner, step + 1, shape, out, proof, public_point(key))
        else:
            whole = self.state.psi_get(who, owner, step, 0.0)
            assert whole is not None, f"{who} found no list {owner}@{step}"
            shape, points = whole_shape(len(whole) // POINT_BYTES), whole
            out = blind_packed(key.scalar(), points)
            proof = prove_reblind(key, proof_context(owner, step + 1), points, out)
            self.state.psi_put(who, owner, step + 1, out, proof, public_point(key))
        self.sent[(who, owner, step + 1, index)] = (shape, out, proof)

    def rounds(self) -> list[dict[str, tuple[int, ...]]]:
        """The ring hop by hop (every curator's own list, then at each step slice 0 of each list
        its curator is routed, then slice 1), as a curator on a cluster whose next list is
        complete; the lists held after the start and after every round."""
        for who in self.names:
            self.start(who)
        seen = [held(self.state)]
        for step in range(1, len(self.names)):
            for index in (0, 1):
                for who in self.names:
                    owner = self.owner_at(who, step)
                    if (index < self.slices(owner)) if who in self.sliced else index == 0:
                        self.reblind(who, step, index)
                seen.append(held(self.state))
        return seen


def held(state: LeaderState) -> dict[str, tuple[int, ...]]:
    """``owner@hop`` -> the slices held of that list (points and all)."""
    out: dict[str, list[int]] = {}
    for owner, hop, index in state.psi_mailbox.stored_keys():
        out.setdefault(f"{owner}@{hop}", []).append(index)
    return {k: tuple(v) for k, v in out.items()}


def _header_size(owner: str) -> int:
    return len(MAGIC) + _FIXED.size + len(owner.encode()) + 32


# ------------------------------------------------------------------------------------ the bound
def test_a_ring_of_two_on_clusters_holds_each_list_until_its_next_hop_is_complete(tmp_path: Path) -> None:
    state = _state(("alice", "bob"), tmp_path / "box")
    two = Ring(state, {"alice", "bob"})
    seen = []
    for step in (lambda: two.start("alice"), lambda: two.start("bob"),
                 lambda: two.reblind("alice", 1, 0), lambda: two.reblind("bob", 1, 0),
                 lambda: two.reblind("alice", 1, 1), lambda: two.reblind("bob", 1, 1)):  # fmt: skip
        step()
        seen.append(held(state))
    assert seen == [
        {"alice@1": (0, 1)},
        {"alice@1": (0, 1), "bob@1": (0, 1)},
        {"alice@1": (0, 1), "bob@1": (0, 1), "bob@2": (0,)},
        {"alice@1": (0, 1), "alice@2": (0,), "bob@1": (0, 1), "bob@2": (0,)},  # the peak: 2 hops of each
        {"alice@1": (0, 1), "alice@2": (0,), "bob@2": (0, 1)},  # bob@2 complete: bob@1 deleted
        {"alice@2": (0, 1), "bob@2": (0, 1)},  # the last hops, for the owners
    ]
    assert max(len(s) for s in seen) == 2 * 2 and len(seen[-1]) == 2
    assert state.error is None
    # the owners take their last hops back: kept (a rerun of an owner needs them again)
    for who, other in (("alice", "bob"), ("bob", "alice")):
        for index in (0, 1):
            assert state.psi_get_slice(who, who, 2, index, 0.0) == two.sent[(other, who, 2, index)][:2]
    assert held(state) == seen[-1]
    # on disk: a deleted slice's file is its header alone; a held one has its points
    directory = tmp_path / "box"
    for owner in ("alice", "bob"):
        for index, shape in enumerate(HALVES):
            gone = (directory / f"{owner}-1-{index:06d}.pts").read_bytes()
            assert gone.startswith(DELETED_MAGIC) and len(gone) == _header_size(owner)
            kept = (directory / f"{owner}-2-{index:06d}.pts").read_bytes()
            assert kept.startswith(MAGIC) and len(kept) == _header_size(owner) + shape.count * POINT_BYTES
    assert state.psi_mailbox.deleted_keys() == [(o, 1, i) for o in ("alice", "bob") for i in (0, 1)]


def test_a_ring_of_three_on_clusters_peaks_at_2n_lists_not_n_squared() -> None:
    state = _state(("alice", "bob", "carol"), None)
    seen = Ring(state, {"alice", "bob", "carol"}).rounds()
    both = {"alice": (0, 1), "bob": (0, 1), "carol": (0, 1)}
    assert seen == [
        {f"{c}@1": s for c, s in both.items()},
        {**{f"{c}@1": s for c, s in both.items()}, **{f"{c}@2": (0,) for c in both}},  # 6 lists
        {f"{c}@2": s for c, s in both.items()},  # every hop 2 complete: every hop 1 deleted
        {**{f"{c}@2": s for c, s in both.items()}, **{f"{c}@3": (0,) for c in both}},  # 6 lists
        {f"{c}@3": s for c, s in both.items()},  # the last hops
    ]
    assert max(len(s) for s in seen) == 2 * 3 < 3 * 3 and len(seen[-1]) == 3
    assert state.error is None


def test_a_ring_of_three_with_the_leader_in_one_process_holds_each_list_at_most_at_two_hops() -> None:
    """alice leads in one process (whole lists: a hop she makes arrives complete), bob and carol
    on clusters; each list is routed alice -> bob -> carol -> alice."""
    state = _state(("alice", "bob", "carol"), None)
    seen = Ring(state, {"bob", "carol"}).rounds()
    assert seen == [
        {"alice@1": (0,), "bob@1": (0, 1), "carol@1": (0, 1)},
        # alice's whole carol@2 and bob's one slice of alice@2 complete their hops; carol's bob@2 is half there
        {"alice@2": (0,), "bob@1": (0, 1), "bob@2": (0,), "carol@2": (0, 1)},
        {"alice@2": (0,), "bob@2": (0, 1), "carol@2": (0, 1)},
        {"alice@3": (0,), "bob@3": (0, 1), "carol@2": (0, 1), "carol@3": (0,)},
        {"alice@3": (0,), "bob@3": (0, 1), "carol@3": (0, 1)},
    ]
    assert max(len(s) for s in seen) == 4 <= 2 * 3 and state.error is None


def test_a_hop_begun_on_a_hop_under_way_holds_only_the_slices_that_arrived() -> None:
    """The exception the bound names: carol (on a cluster) re-blinds the slice of alice's list
    bob (on a cluster) has sent before bob sends the other; alice's list is then held at three
    hops at once, each later hop no more slices than the one before it."""
    state = _state(("alice", "bob", "carol"), None)
    three = Ring(state, {"alice", "bob", "carol"})
    for who in state.curators:
        three.start(who)
    three.reblind("bob", 1, 0)  # alice@2 slice 0
    three.reblind("carol", 2, 0)  # alice@3 slice 0, from it
    assert held(state) == {"alice@1": (0, 1), "alice@2": (0,), "alice@3": (0,), "bob@1": (0, 1), "carol@1": (0, 1)}
    three.reblind("bob", 1, 1)  # alice@2 complete: alice@1 deleted
    assert held(state) == {"alice@2": (0, 1), "alice@3": (0,), "bob@1": (0, 1), "carol@1": (0, 1)}
    three.reblind("carol", 2, 1)  # alice@3 complete: alice@2 deleted
    assert held(state) == {"alice@3": (0, 1), "bob@1": (0, 1), "carol@1": (0, 1)}
    assert state.error is None


# ----------------------------------------------------------------------- resends, fetches, restarts
def _restarted(state: LeaderState, directory: Path) -> LeaderState:
    again = _state(state.curators, directory)
    again.psi_mailbox  # noqa: B018  (opens the kept mailbox)
    return again


def test_a_resend_or_fetch_of_a_deleted_slice_fails_nothing_and_brings_nothing_back(tmp_path: Path) -> None:
    directory = tmp_path / "box"
    state = _state(("alice", "bob"), directory)
    two = Ring(state, {"alice", "bob"})
    two.rounds()
    end = {"alice@2": (0, 1), "bob@2": (0, 1)}
    files = {p.name: p.read_bytes() for p in directory.iterdir()}
    for leader in (state, _restarted(state, directory)):  # the same before and after a restart of the leader
        box = leader.psi_mailbox
        # bob restarted: his own list again, identical (a no-op, deleted or not)
        for index in (0, 1):
            shape, points, _ = two.sent[("bob", "bob", 1, index)]
            leader.psi_put_slice("bob", "bob", 1, shape, points)
        # ... alice's list at hop 1, to re-blind again: deleted, so he is told it is passed on
        with pytest.raises(PsiListConsumedError, match=r"'alice'.s PSI list at hop 1 was re-blinded and deleted"):
            leader.psi_get_slice("bob", "alice", 1, 0, 0.0)
        # ... and his re-blinding of it, sent again (a retried call): taken already
        shape, out, proof = two.sent[("bob", "alice", 2, 1)]
        with pytest.raises(PsiListConsumedError, match="complete at the leader"):
            leader.psi_put_slice("bob", "alice", 2, shape, out, proof, public_point(KEYS["bob"]))
        # the leader's own re-blinding of bob's list, sent again after its restart: taken already
        shape, out, _ = two.sent[("alice", "bob", 2, 0)]
        with pytest.raises(PsiListConsumedError):
            leader.psi_put_slice("alice", "bob", 2, shape, out)
        assert leader.error is None and held(leader) == end
        assert box.deleted_keys() == [(o, 1, i) for o in ("alice", "bob") for i in (0, 1)]
        assert {p.name: p.read_bytes() for p in directory.iterdir()} == files  # nothing rewritten
        assert box.get("bob", 2, 0) == two.sent[("alice", "bob", 2, 0)][1]  # the last hops are there
    restarted = _restarted(state, directory)
    assert (restarted.psi_mailbox.kept, restarted.psi_mailbox.kept_deleted, restarted.psi_mailbox.ignored) == (4, 4, 0)
    # a resend with other points is still refused, and fails the release, as before issue 49
    shape, points, _ = two.sent[("bob", "bob", 1, 0)]
    with pytest.raises(PsiStreamError, match="resent with other points"):
        restarted.psi_put_slice("bob", "bob", 1, shape, points[POINT_BYTES:] + points[:POINT_BYTES])
    assert restarted.error is not None and held(restarted) == end


def test_a_curator_in_one_process_is_told_a_whole_list_was_passed_on() -> None:
    """The mixed ring: alice on a cluster (slices), bob in one process (whole lists; the mailbox
    cuts his re-blinding of alice's list into her slices)."""
    state = _state(("alice", "bob"), None)
    two = Ring(state, {"alice"})
    assert two.rounds() == [
        {"alice@1": (0, 1), "bob@1": (0,)},
        {"alice@2": (0, 1), "bob@2": (0,)},  # both hops 2 complete at once: both hops 1 deleted
        {"alice@2": (0, 1), "bob@2": (0,)},
    ]
    _, own, _ = two.sent[("bob", "bob", 1, 0)]
    state.psi_put("bob", "bob", 1, own)  # restarted: his own list, identical
    with pytest.raises(PsiListConsumedError):
        state.psi_get("bob", "alice", 1, 0.0)
    _, out, proof = two.sent[("bob", "alice", 2, 0)]
    with pytest.raises(PsiListConsumedError):
        state.psi_put("bob", "alice", 2, out, proof, public_point(KEYS["bob"]))
    assert state.error is None and held(state) == {"alice@2": (0, 1), "bob@2": (0,)}
    assert state.psi_get("bob", "bob", 2, 0.0) == two.sent[("alice", "bob", 2, 0)][1]


def test_a_whole_list_the_leader_was_killed_storing_is_taken_again_whole(tmp_path: Path) -> None:
    """Why a list goes only once its next hop is complete, not slice by slice: bob (one process)
    sends his re-blinding of alice's list whole, the leader cuts it into her two slices and is
    killed after storing the first; run again, it checks bob's resend against the whole list it
    was made from, which must still be there."""
    directory = tmp_path / "box"
    state = _state(("alice", "bob"), directory)
    two = Ring(state, {"alice"})
    two.start("alice")
    two.start("bob")
    before = state.psi_get("bob", "alice", 1, 0.0)
    assert before is not None
    out = blind_packed(KEYS["bob"].scalar(), before)
    proof = prove_reblind(KEYS["bob"], proof_context("alice", 2), before, out)
    first, _ = state.psi_mailbox.split("alice", out)
    state.psi_mailbox.put("alice", 2, *first)  # the leader's psi_put stored slice 0 of 2, then was killed
    again = _restarted(state, directory)
    assert held(again) == {"alice@1": (0, 1), "alice@2": (0,), "bob@1": (0,)}
    again.psi_put("bob", "alice", 2, out, proof, public_point(KEYS["bob"]))  # bob's call, retried
    assert again.error is None and held(again) == {"alice@2": (0, 1), "bob@1": (0,)}
    assert again.psi_mailbox.whole("alice", 2) == out


class _Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _Context:
    """What a servicer's ``abort`` does, as the caller's stub sees it."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise _Refused(code, details)


def test_the_leaders_answer_crosses_the_wire_as_already_exists_and_only_it_is_taken_for_it() -> None:
    def answered(exc: Exception) -> Callable[[], None]:
        def call() -> None:
            try:
                abort_with(_Context(), exc)  # type: ignore[arg-type]
            except _Refused as refused:
                assert refused.code() is grpc.StatusCode.ALREADY_EXISTS or not isinstance(exc, PsiListConsumedError)
                raise

        return call

    box = PsiMailbox()
    box.put("a", 1, whole_shape(1), b"\x02" * POINT_BYTES)
    box.put("a", 2, whole_shape(1), b"\x03" * POINT_BYTES)
    with pytest.raises(PsiListConsumedError) as told:
        box.get("a", 1, 0)
    with pytest.raises(PsiListConsumedError, match=r"^'a'.s PSI list at hop 1 was re-blinded and deleted"):
        consumed_at_leader(answered(told.value))
    with pytest.raises(_Refused) as other:  # another ALREADY_EXISTS is no such answer
        consumed_at_leader(answered(SeedReuseError("the seed of r1 was used before")))
    assert other.value.code() is grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(_Refused):
        consumed_at_leader(answered(PsiStreamError("a wrong list")))
    assert consumed_at_leader(lambda: 7) == 7


def _whole_transport(state: LeaderState, me: str) -> tuple[Callable[..., None], Callable[[str, int], bytes]]:
    def send(owner: str, hop: int, pts: bytes, proof: bytes = b"", public: bytes = b"") -> None:
        state.psi_put(me, owner, hop, pts, proof, public)

    def receive(owner: str, hop: int) -> bytes:
        got = state.psi_get(me, owner, hop, 30.0)
        assert got is not None, f"{me} got no {owner}@{hop}"
        return got

    return send, receive


def test_curators_in_one_process_that_run_the_ring_again_skip_the_lists_passed_on(tmp_path: Path) -> None:
    names = ("alice", "bob", "carol")
    ids = {c: np.array([f"id{i}" for i in range(j, j + 30)]) for j, c in enumerate(names)}
    state = _state(names, tmp_path / "box")
    first = run_at_once(*(lambda c=c: ring(c, names, ids[c], KEYS[c], *_whole_transport(state, c)) for c in names))
    assert held(state) == {"alice@3": (0,), "bob@3": (0,), "carol@3": (0,)} and state.error is None
    # the leader killed and run again, then every curator runs its whole ring again with its kept key
    again = _restarted(state, tmp_path / "box")
    for i, c in enumerate(names):
        assert ring(c, names, ids[c], KEYS[c], *_whole_transport(again, c)) == first[i]
    assert held(again) == {"alice@3": (0,), "bob@3": (0,), "carol@3": (0,)} and again.error is None


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


def test_a_curator_on_its_cluster_that_runs_the_ring_again_skips_the_list_passed_on(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_demo_data(root, rows=240, seed=3)
    names = ("alice", "bob")
    alice_ids = read_table(root / "alice.csv", load_schema(root / "alice.json")).ids  # the leader: one process
    state = _state(names, tmp_path / "box")
    engine = InlineEngine(2)

    def sliced(leader: LeaderState) -> rg.Transport:
        def receive(owner: str, hop: int, index: int) -> tuple[SliceShape, bytes]:
            got = leader.psi_get_slice("bob", owner, hop, index, 30.0)
            assert got is not None
            return got

        return rg.Transport(lambda *a: leader.psi_put_slice("bob", *a), receive)

    def bob_ring(leader: LeaderState, log: _Log, at: str) -> set[tuple[bytes, int]]:
        data = split_parquet(root / "bob.csv", tmp_path / at, 2)
        points = rg.load_points(engine, str(data), load_schema(root / "bob.json"), KEYS["bob"], 2, log,  # type: ignore[arg-type]
                                shard_bits=1)  # fmt: skip
        tags = rg.cluster_ring("bob", names, points, KEYS["bob"], sliced(leader), log, 1, 50)  # type: ignore[arg-type]
        pairs = set()
        for shard in tags.shards:
            result = shard.result()
            pairs |= {(t.tobytes(), int(s)) for t, s in zip(result.tags, result.symbols, strict=True)}
        tags.close()
        return pairs

    try:
        first_log, again_log = _Log(), _Log()
        alice_link = _whole_transport(state, "alice")
        _, first = run_at_once(lambda: ring("alice", names, alice_ids, KEYS["alice"], *alice_link),
                               lambda: bob_ring(state, first_log, "one"))  # fmt: skip
        end = held(state)
        assert set(end) == {"alice@2", "bob@2"} and len(end["bob@2"]) > 2 and state.error is None
        again = _restarted(state, tmp_path / "box")
        assert bob_ring(again, again_log, "two") == first and first
        assert held(again) == end and again.error is None
        assert ("psi_hop_taken", "alice", 2) in {(e, f.get("owner"), f.get("hop")) for e, f in again_log.events}
        assert not any(e == "psi_hop_taken" for e, _ in first_log.events)
    finally:
        engine.close()


def test_a_restart_ends_a_deletion_a_kill_cut_short_and_refuses_a_slice_it_cannot_get_again(tmp_path: Path) -> None:
    directory = tmp_path / "box"
    box = PsiMailbox(directory)
    hop1 = {i: hash_blind(np.array([f"b{j}" for j in range(s.first, s.first + s.count)]), KEYS["bob"].scalar())
            for i, s in enumerate(HALVES)}  # fmt: skip
    for shape in HALVES:
        box.put("bob", 1, shape, hop1[shape.index])
    held_file = (directory / "bob-1-000001.pts").read_bytes()
    hop2 = {i: blind_packed(KEYS["alice"].scalar(), hop1[i]) for i in hop1}
    for shape in HALVES:
        box.put("bob", 2, shape, hop2[shape.index])
    assert box.stored_keys() == [("bob", 2, 0), ("bob", 2, 1)]
    # killed after bob@2 was complete, before slice 1 of bob@1 became its header: deleted on reopen
    (directory / "bob-1-000001.pts").write_bytes(held_file)
    again = PsiMailbox(directory)
    assert again.stored_keys() == [("bob", 2, 0), ("bob", 2, 1)]
    assert again.deleted_keys() == [("bob", 1, 0), ("bob", 1, 1)]
    assert len((directory / "bob-1-000001.pts").read_bytes()) == _header_size("bob")
    assert (again.kept, again.kept_deleted, again.ignored) == (3, 1, 0)
    assert not again.put("bob", 1, HALVES[1], hop1[1])  # its resend: a no-op, nothing comes back
    assert again.stored_keys() == [("bob", 2, 0), ("bob", 2, 1)]
    # a slice of bob@2 lost (altered on disk) while bob@1, which it was made from, is deleted
    lost = directory / "bob-2-000000.pts"
    lost.write_bytes(lost.read_bytes()[:-1])
    with pytest.raises(PsiStreamError, match=r"lacks part of 'bob'.s list at hop 2.*cannot resume"):
        PsiMailbox(directory)
