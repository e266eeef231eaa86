"""The PSI ring on a curator's cluster (issue 41), on the in-process engine (the same stage
functions a Dask worker runs; tests/system/test_psi_cluster_services.py runs it on real clusters through
the services).

Exact checks: the cluster ring gives every row the PSI tag the in-process ring gives it (same
keys), the release it leads to samples the rows of the in-process keyed reference, no slice
passing through the transport exceeds the slice size, the leader's mailbox is on disk (0700)
and removed, a follower killed mid-ring and rerun with its kept key resends identical slices,
and an in-process follower (whole lists) shares a ring with a cluster leader (slices)."""

from __future__ import annotations

import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import run_at_once, split_parquet

from secure_release.curator.cluster import ring as rg
from secure_release.curator.cluster.engine import InlineEngine
from secure_release.curator.cluster.matching import ClusterLeader
from secure_release.curator.leader import LeaderState
from secure_release.curator.psi_mailbox import PsiMailbox, SliceShape, whole_shape
from secure_release.curator.release.psi_ring import ring
from secure_release.curator.table import load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import PsiStreamError, TagStream, tag_chunks
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE
from secure_release.mechanism.alignment.psi import POINT_BYTES, PsiKey, psi_tags, run_psi
from secure_release.mechanism.alignment.psi_proof import ReblindProofError
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.architectures import AlignmentMode

LOG = EventLog("curator", "test")
KEYS = {"alice": PsiKey(bytes([1]) * 32), "bob": PsiKey(bytes([2]) * 32)}
SLICE = 97  # points a slice: many slices, some shards with a short last one


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clusterpsi")
    write_demo_data(root, rows=1500, seed=5)
    return root


@pytest.fixture(autouse=True)
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rg, "SLICE_POINTS", SLICE)


def _leader(tmp_path: Path) -> ClusterLeader:
    leader = ClusterLeader("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                           seed=Seed(bytes(32)), alignment=AlignmentMode.PSI)  # fmt: skip
    leader.psi_dir = tmp_path / "mailbox"
    return leader


def _points(engine: InlineEngine, world: Path, tmp_path: Path, who: str) -> Any:
    data = split_parquet(world / f"{who}.csv", tmp_path / who, 3, groups=2)
    return rg.load_points(engine, str(data), load_schema(world / f"{who}.json"), KEYS[who], 2, LOG, shard_bits=2)


class Recording:
    """A transport into the leader's mailbox that records the size of every slice it carries
    and can fail after a number of sends (a curator killed mid-ring)."""

    def __init__(self, state: LeaderState, me: str, fail_after: int | None = None) -> None:
        self.state, self.me, self.fail_after = state, me, fail_after
        self.sizes: list[int] = []
        self.sends = 0

    def send(self, owner: str, hop: int, shape: SliceShape, points: bytes, proof: bytes, public: bytes) -> None:
        if self.fail_after is not None and self.sends >= self.fail_after:
            raise KeyboardInterrupt("killed mid-ring")
        self.sends += 1
        self.sizes.append(len(points) // POINT_BYTES)
        self.state.psi_put_slice(self.me, owner, hop, shape, points, proof, public)

    def receive(self, owner: str, hop: int, index: int) -> tuple[SliceShape, bytes]:
        got = self.state.psi_get_slice(self.me, owner, hop, index, 30.0)
        assert got is not None, f"slice {index} of {owner} at hop {hop} never came"
        self.sizes.append(len(got[1]) // POINT_BYTES)
        return got

    def transport(self) -> rg.Transport:
        return rg.Transport(self.send, self.receive)


def _pairs(table: Any) -> set[tuple[bytes, int]]:
    """(tag, symbol) of every row of a tag table."""
    tags = np.concatenate([s.result().tags for s in table.shards]).astype(TAG_DTYPE)  # (concatenate goes native)
    symbols = np.concatenate([s.result().symbols for s in table.shards])
    return {(t.tobytes(), int(v)) for t, v in zip(tags, symbols, strict=True)}


def test_the_cluster_ring_gives_every_row_the_in_process_rings_tag_and_a_release(world: Path, tmp_path: Path) -> None:
    engine = InlineEngine(2)
    leader = _leader(tmp_path)
    try:
        points = {c: _points(engine, world, tmp_path, c) for c in ("alice", "bob")}
        wires = {c: Recording(leader, c) for c in ("alice", "bob")}
        tags = dict(zip(("alice", "bob"), run_at_once(
            *(lambda c=c: rg.cluster_ring(c, ("alice", "bob"), points[c], KEYS[c], wires[c].transport(), LOG, 2)
              for c in ("alice", "bob"))
        ), strict=True))  # fmt: skip
        assert max(max(w.sizes) for w in wires.values()) <= SLICE  # nothing moves a list, only slices
        mailbox = tmp_path / "mailbox"
        assert stat.S_IMODE(mailbox.stat().st_mode) == 0o700 and len(list(mailbox.glob("*.pts"))) > 4 * 2
        # the reference: the in-process ring with the same keys; at N = 2 both sides tag in domain 1
        tables = {c: read_table(world / f"{c}.csv", load_schema(world / f"{c}.json")) for c in ("alice", "bob")}
        run = run_psi([tables[c].ids for c in ("alice", "bob")], [KEYS["alice"], KEYS["bob"]])
        reference = {"alice": run.leader_tags[1], "bob": run.sent_tags[1]}
        expected = {
            c: {(t.tobytes(), int(v)) for t, v in zip(reference[c], tables[c].symbols(), strict=True)} for c in tables
        }
        for c in ("alice", "bob"):
            assert _pairs(tags[c]) == expected[c]
        # the agreement from there is the keyed hash's: the leader spools bob's tags against its own
        leader.attach(tags["alice"], tmp_path)
        leader.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), tags["alice"].alphabet_size)
        stream = TagStream(tag_chunks("r1", "bob", tags["bob"].tag_pieces(), tags["bob"].alphabet_size,
                                      AlignmentMode.PSI), "bob", lambda _r: 1 << 40)  # fmt: skip
        stream.start()
        leader.add_tag_stream("bob", stream.pieces(), stream.alphabet_size, stream.alignment)
        agreement = leader.agree()
        common = set(tables["alice"].ids.tolist()) & set(tables["bob"].ids.tolist())
        assert agreement.num_common == len(common) > 0
        bob_rows = leader.rows_of("bob")[0 : agreement.num_common].astype(np.int64)
        by_id = {c: dict(zip(tables[c].ids.tolist(), tables[c].symbols().tolist(), strict=True)) for c in tables}
        pairs = set(zip(leader.own_aligned().tolist(), tags["bob"].aligned_symbols(bob_rows).tolist(), strict=True))
        assert pairs == {(by_id["alice"][i], by_id["bob"][i]) for i in common}  # the joint rows, paired by id
        leader.cleanup()
        assert not mailbox.exists() and not list(tmp_path.glob("spool-*"))
    finally:
        engine.close()


def test_the_own_list_leaves_in_an_order_that_is_not_its_rows(world: Path, tmp_path: Path) -> None:
    """The list is ordered by a private keyed tag (a pseudorandom permutation), not by row: the
    rank correlation of list position and row number is near 0 (|r| < 0.2; for 1,500 rows a
    random order gives |r| >= 0.2 with probability below 1e-13)."""
    engine = InlineEngine(2)
    try:
        table = _points(engine, world, tmp_path, "bob")
        runs = rg.slice_runs(table.sizes)
        sent = b"".join(engine.result(engine.submit(rg.ps.point_slice, table.shards[s], a, b)) for s, a, b in runs)
        ids = read_table(world / "bob.csv", load_schema(world / "bob.json")).ids
        mine = np.frombuffer(rg.ps.hash_blind(ids, KEYS["bob"].scalar()), dtype=f"V{POINT_BYTES}")
        assert sorted(np.frombuffer(sent, dtype=f"V{POINT_BYTES}").tolist()) == sorted(mine.tolist())
        position = {p: i for i, p in enumerate(np.frombuffer(sent, dtype=f"V{POINT_BYTES}").tolist())}
        order = np.array([position[p] for p in mine.tolist()])
        r = np.corrcoef(order, np.arange(order.size))[0, 1]
        assert abs(r) < 0.2
        table.close()
    finally:
        engine.close()


def test_a_follower_killed_mid_ring_reruns_with_its_kept_key_and_the_mailbox_takes_its_slices_again(
    world: Path, tmp_path: Path
) -> None:
    engine = InlineEngine(2)
    leader = _leader(tmp_path)
    try:
        points = {c: _points(engine, world, tmp_path, c) for c in ("alice", "bob")}
        bob_slices = len(rg.slice_runs(points["bob"].sizes))
        # killed during its hop of alice's list, after its own list and 5 slices of alice's went out
        alice, killed = Recording(leader, "alice"), Recording(leader, "bob", fail_after=bob_slices + 5)
        leading = threading.Thread(
            target=lambda: rg.cluster_ring("alice", ("alice", "bob"), points["alice"], KEYS["alice"], alice.transport(),
                                           LOG, 2)
        )  # fmt: skip
        leading.start()
        with pytest.raises(KeyboardInterrupt):
            rg.cluster_ring("bob", ("alice", "bob"), points["bob"], KEYS["bob"], killed.transport(), LOG, 2)
        points["bob"] = _points(engine, world, tmp_path / "again", "bob")  # the rerun reads its table again
        rerun = Recording(leader, "bob")
        tags = rg.cluster_ring("bob", ("alice", "bob"), points["bob"], KEYS["bob"], rerun.transport(), LOG, 2)
        leading.join(60)
        assert not leading.is_alive() and leader.error is None  # every resent slice was identical
        assert killed.sends == bob_slices + 5 and rerun.sends > bob_slices + 5
        table = read_table(world / "bob.csv", load_schema(world / "bob.json"))
        assert tags.num_rows == table.num_rows
    finally:
        engine.close()


def test_a_slice_resent_with_other_points_fails_the_release_for_everybody(tmp_path: Path) -> None:
    state = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                        alignment=AlignmentMode.PSI, psi_dir=tmp_path / "m")  # fmt: skip
    points = rg.ps.hash_blind(np.array(["a", "b", "c"]), KEYS["bob"].scalar())
    shape = SliceShape(0, 2, 0, 3, 5)
    state.psi_put_slice("bob", "bob", 1, shape, points)
    state.psi_put_slice("bob", "bob", 1, shape, points)  # identical: taken again, nothing changes
    assert state.error is None
    with pytest.raises(PsiStreamError, match="resent with other points"):
        state.psi_put_slice("bob", "bob", 1, shape, points[POINT_BYTES:] + points[:POINT_BYTES])
    assert state.error is not None and "'bob' sent a wrong PSI list" in state.error


def test_a_reblinded_slice_needs_its_own_proof(tmp_path: Path) -> None:
    """A proof binds the slice's index: the proof of slice 0 does not verify slice 1."""
    from secure_release.mechanism.alignment.psi_proof import prove_reblind, public_point, slice_context

    state = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                        alignment=AlignmentMode.PSI)  # fmt: skip
    own = rg.ps.hash_blind(np.array(["a", "b", "c", "d"]), KEYS["alice"].scalar())
    halves = [own[: 2 * POINT_BYTES], own[2 * POINT_BYTES :]]
    for i, half in enumerate(halves):
        state.psi_put_slice("alice", "alice", 1, SliceShape(i, 2, 2 * i, 2, 4), half)
    out = [rg.ps.reblind_slice(KEYS["bob"].scalar(), h) for h in halves]
    proofs = [prove_reblind(KEYS["bob"], slice_context("alice", 2, i, 2), halves[i], out[i]) for i in range(2)]
    public = public_point(KEYS["bob"])
    state.psi_put_slice("bob", "alice", 2, SliceShape(0, 2, 0, 2, 4), out[0], proofs[0], public)
    with pytest.raises(ReblindProofError):
        state.psi_put_slice("bob", "alice", 2, SliceShape(1, 2, 2, 2, 4), out[1], proofs[0], public)


def test_an_in_process_follower_shares_a_ring_with_a_leader_on_a_cluster(world: Path, tmp_path: Path) -> None:
    """The follower sends and receives whole lists (psi_put / psi_get), the leader slices: the
    mailbox cuts the follower's lists into the owner's slices and joins the leader's."""
    engine = InlineEngine(2)
    leader = _leader(tmp_path)
    try:
        points = _points(engine, world, tmp_path, "alice")
        table = read_table(world / "bob.csv", load_schema(world / "bob.json"))

        def send(owner: str, hop: int, pts: bytes, proof: bytes = b"", public: bytes = b"") -> None:
            leader.psi_put("bob", owner, hop, pts, proof, public)

        def receive(owner: str, hop: int) -> bytes:
            got = leader.psi_get("bob", owner, hop, 30.0)
            assert got is not None
            return got

        alice, bob_points = run_at_once(
            lambda: rg.cluster_ring("alice", ("alice", "bob"), points, KEYS["alice"],
                                    Recording(leader, "alice").transport(), LOG, 2),
            lambda: ring("bob", ("alice", "bob"), table.ids, KEYS["bob"], send, receive),
        )  # fmt: skip
        alice_ids = read_table(world / "alice.csv", load_schema(world / "alice.json")).ids
        run = run_psi([alice_ids, table.ids], [KEYS["alice"], KEYS["bob"]])
        assert np.array_equal(psi_tags(bob_points, 1), run.sent_tags[1])
        assert {t for t, _ in _pairs(alice)} == {t.tobytes() for t in run.leader_tags[1]}
    finally:
        engine.close()


def test_the_mailbox_refuses_slices_that_do_not_tile_their_list() -> None:
    box = PsiMailbox()
    box.put("a", 1, SliceShape(0, 2, 0, 2, 5), b"\x02" * 66)
    with pytest.raises(PsiStreamError, match="overlaps"):
        box.admit("a", 1, SliceShape(1, 2, 1, 4, 5))
    with pytest.raises(PsiStreamError, match="slices of 5 points"):
        box.admit("a", 1, SliceShape(1, 3, 2, 3, 5))
    with pytest.raises(PsiStreamError, match="does not lie in its list"):
        box.admit("a", 1, SliceShape(1, 2, 4, 3, 5))
    with pytest.raises(PsiStreamError, match="came before its hop 1"):
        box.admit("a", 2, SliceShape(1, 2, 2, 3, 5))
    with pytest.raises(PsiStreamError, match="other bounds"):
        box.admit("a", 2, SliceShape(0, 2, 0, 1, 5))
    assert not box.complete("a", 1) and box.whole("a", 1) is None
    box.put("a", 1, SliceShape(1, 2, 2, 3, 5), b"\x03" * 99)
    assert box.complete("a", 1) and box.whole("a", 1) == b"\x02" * 66 + b"\x03" * 99
    assert [s for s, _ in box.split("a", bytes(165))] == [SliceShape(0, 2, 0, 2, 5), SliceShape(1, 2, 2, 3, 5)]
    assert whole_shape(7) == SliceShape(0, 1, 0, 7, 7) and whole_shape(0).check() == SliceShape(0, 1, 0, 0, 0)
    with pytest.raises(PsiStreamError, match="does not lie"):  # an empty slice of a list that has points
        box.admit("b", 1, SliceShape(0, 2, 0, 0, 5))
    with pytest.raises(PsiStreamError, match="1 to 65536 slices"):  # a file a slice: bounded
        box.admit("b", 1, SliceShape(0, 1 << 20, 0, 1, 1 << 20))


def test_a_follower_on_its_cluster_in_a_ring_of_three_tags_in_its_own_domain(tmp_path: Path) -> None:
    """N = 3, the leader and carol in one process each (whole lists), bob on his cluster
    (slices, masked own list, unmasked at the finish): bob's tags are the in-process ring's, in
    his domain 1, and the others' are too (the mailbox cut and joined their whole lists)."""
    root = tmp_path / "three"
    write_demo_data(root, rows=600, seed=6, curators=3)
    names = ("alice", "bob", "carol")
    keys = {c: PsiKey(bytes([11 + i]) * 32) for i, c in enumerate(names)}
    state = LeaderState("r1", names, None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                        alignment=AlignmentMode.PSI)  # fmt: skip
    tables = {c: read_table(root / f"{c}.csv", load_schema(root / f"{c}.json")) for c in names}
    engine = InlineEngine(2)

    def whole(me: str) -> tuple[Callable[..., None], Callable[[str, int], bytes]]:
        def send(owner: str, hop: int, pts: bytes, proof: bytes = b"", public: bytes = b"") -> None:
            state.psi_put(me, owner, hop, pts, proof, public)

        def receive(owner: str, hop: int) -> bytes:
            got = state.psi_get(me, owner, hop, 30.0)
            assert got is not None
            return got

        return send, receive

    try:
        data = split_parquet(root / "bob.csv", tmp_path / "bob", 2)
        points = rg.load_points(engine, str(data), load_schema(root / "bob.json"), keys["bob"], 3, LOG, shard_bits=1)
        alice, bob, carol = run_at_once(
            lambda: ring("alice", names, tables["alice"].ids, keys["alice"], *whole("alice")),
            lambda: rg.cluster_ring("bob", names, points, keys["bob"], Recording(state, "bob").transport(), LOG, 2),
            lambda: ring("carol", names, tables["carol"].ids, keys["carol"], *whole("carol")),
        )
    finally:
        engine.close()
    run = run_psi([tables[c].ids for c in names], [keys[c] for c in names])
    assert {t for t, _ in _pairs(bob)} == {t.tobytes() for t in run.sent_tags[1]}
    assert np.array_equal(psi_tags(carol, 2), run.sent_tags[2])
    assert np.array_equal(psi_tags(alice, 0), run.leader_tags[0])
