"""The leader's kept PSI mailbox (issue 47): its slices and pinned public keys survive a crash of
the leader (a new :class:`PsiMailbox` on the same directory takes them again), a torn temporary
file or an altered slice is ignored and removed, its files are 0600 in a 0700 directory, it is
deleted when the release record is saved sealed or the release is dropped, and a wait of the
ring is logged while it lasts. (A list deleted once its next hop is complete, issue 49:
``test_psi_mailbox_bound.py``.)"""

from __future__ import annotations

import stat
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from secure_release.curator.leader import LeaderState
from secure_release.curator.psi_mailbox import MAGIC, PsiMailbox, SliceShape, whole_shape
from secure_release.curator.records.keystore import Keystore, ReleaseRecord
from secure_release.curator.release.opening import psi_mailbox_dir
from secure_release.curator.release.psi_ring import WaitLog
from secure_release.infra.streams import PsiStreamError
from secure_release.mechanism.alignment.psi import PsiKey, hash_blind
from secure_release.mechanism.alignment.psi_proof import ReblindProofError, public_point
from secure_release.mechanism.primitives.keys import PadKey
from secure_release.mechanism.primitives.pads import CipherMode, ReleasePad
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.architectures import AlignmentMode
from secure_release.mechanism.protocol.spec import ReleaseSpec

KEYS = {"alice": PsiKey(bytes(range(5, 37))), "bob": PsiKey(bytes(range(6, 38)))}


def _points(who: str, count: int, start: int = 0) -> bytes:
    ids = np.array([f"{who}{i:05d}" for i in range(start, start + count)])
    return hash_blind(ids, KEYS[who].scalar())


def _filled(directory: Path) -> tuple[PsiMailbox, dict[tuple[str, int, int], bytes]]:
    """A mailbox with bob's list in two slices at hop 1 and its slice 0 at hop 2 (the hop under
    way: nothing is deleted yet), alice's whole list at hop 1, and bob's public key pinned."""
    box = PsiMailbox(directory)
    sent: dict[tuple[str, int, int], bytes] = {}
    shapes = [SliceShape(0, 2, 0, 3, 5), SliceShape(1, 2, 3, 2, 5)]
    for hop, shape in ((1, shapes[0]), (1, shapes[1]), (2, shapes[0])):
        points = _points("bob", shape.count, shape.first + 100 * hop)
        assert box.put("bob", hop, shape, points)
        sent[("bob", hop, shape.index)] = points
    alice = _points("alice", 4)
    assert box.put("alice", 1, whole_shape(4), alice)
    sent[("alice", 1, 0)] = alice
    assert box.pin("bob", public_point(KEYS["bob"])) == public_point(KEYS["bob"])
    return box, sent


def test_a_reopened_mailbox_holds_every_slice_shape_and_pin_of_the_killed_one(tmp_path: Path) -> None:
    directory = tmp_path / "box"
    before, sent = _filled(directory)
    del before  # the leader killed: nothing closed, nothing flushed beyond what put wrote
    box = PsiMailbox(directory)
    assert (box.kept, box.ignored) == (4, 0)
    assert box.stored_keys() == sorted(sent)
    for (owner, hop, index), points in sent.items():
        assert box.get(owner, hop, index) == points
    assert box.whole("bob", 1) == sent[("bob", 1, 0)] + sent[("bob", 1, 1)] and box.whole("bob", 2) is None
    assert box.complete("bob", 1) and box.complete("alice", 1) and not box.complete("alice", 2)
    assert not box.complete("bob", 2) and box.has("bob", 2, 0) and not box.has("bob", 2, 1)
    assert box.shape("bob", 1) == SliceShape(1, 2, 3, 2, 5) and box.totals == {"bob": 5, "alice": 4}
    # a resend after the restart is identical (a no-op); anything else is refused, as before the kill
    assert not box.put("bob", 2, SliceShape(0, 2, 0, 3, 5), sent[("bob", 2, 0)])
    with pytest.raises(PsiStreamError, match="resent with other points"):
        box.put("bob", 2, SliceShape(0, 2, 0, 3, 5), _points("bob", 3, 900))
    with pytest.raises(PsiStreamError, match="other bounds"):
        box.put("bob", 1, SliceShape(1, 2, 2, 3, 5), _points("bob", 3))
    # the pin survived: the first key bob proved with is still the one held
    assert box.pin("bob", public_point(KEYS["alice"])) == public_point(KEYS["bob"])
    # the lists go on where they were: alice's hop 2 is new, bob's hop 2 gets its slice 1
    assert box.put("alice", 2, whole_shape(4), _points("alice", 4, 50)) and box.complete("alice", 2)
    assert box.put("bob", 2, SliceShape(1, 2, 3, 2, 5), _points("bob", 2, 203)) and box.complete("bob", 2)
    assert box.stored_keys() == [("alice", 2, 0), ("bob", 2, 0), ("bob", 2, 1)]  # the hops 1 passed on


def test_a_torn_temporary_file_and_a_torn_or_altered_slice_are_ignored_and_removed(tmp_path: Path) -> None:
    directory = tmp_path / "box"
    _, sent = _filled(directory)
    torn = directory / "bob-1-000000.pts"
    raw = torn.read_bytes()
    assert raw.startswith(MAGIC) and raw.endswith(sent[("bob", 1, 0)])
    torn.write_bytes(raw[:-7])  # a slice cut short (as a power loss could leave it)
    altered = directory / "alice-1-000000.pts"
    flipped = bytearray(altered.read_bytes())
    flipped[-1] ^= 1
    altered.write_bytes(bytes(flipped))
    (directory / "bob-2-000000.pts.part").write_bytes(raw[:40])  # a kill while a resend was written
    (directory / "stray").write_bytes(b"?")
    box = PsiMailbox(directory)
    # bob's slice 0 is gone at hop 1, so its hop 2 (made from it) is not taken either
    assert box.stored_keys() == [("bob", 1, 1)]
    assert (box.kept, box.ignored) == (1, 5)
    assert sorted(p.name for p in directory.iterdir()) == ["bob-1-000001.pts", "pin-bob.pub"]
    # the senders' resends fill the gap, and the slices tile the list again
    assert box.put("bob", 1, SliceShape(0, 2, 0, 3, 5), sent[("bob", 1, 0)]) and box.complete("bob", 1)
    assert box.put("bob", 2, SliceShape(0, 2, 0, 3, 5), sent[("bob", 2, 0)])
    assert box.get("bob", 2, 0) == sent[("bob", 2, 0)] and box.get("bob", 1, 0) == sent[("bob", 1, 0)]


def test_the_kept_mailbox_is_private_and_holds_no_id(tmp_path: Path) -> None:
    directory = tmp_path / "box"
    _filled(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = list(directory.iterdir())
    assert len(files) == 5 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert not any(b"bob0" in p.read_bytes() or b"alice0" in p.read_bytes() for p in files)  # points, not ids
    directory.chmod(0o755)  # loosened meanwhile: a restart makes it private again
    PsiMailbox(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_a_leader_restarted_holds_a_follower_to_the_public_key_it_pinned_before(tmp_path: Path) -> None:
    def state() -> LeaderState:
        return LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                           alignment=AlignmentMode.PSI, psi_dir=tmp_path / "box")  # fmt: skip

    first = state()
    first.psi_put("alice", "alice", 1, _points("alice", 4))
    first.psi_mailbox.pin("bob", public_point(KEYS["bob"]))
    restarted = state()
    assert restarted.psi_mailbox.kept == 1 and restarted.psi_mailbox.complete("alice", 1)
    with pytest.raises(ReblindProofError, match="differs from the one 'bob' sent"):
        restarted.psi_put("bob", "alice", 2, _points("alice", 4, 7), b"", public_point(KEYS["alice"]))
    restarted.leave_psi_mailbox()  # the run ends: the files stay for a rerun
    assert (tmp_path / "box" / "alice-1-000000.pts").exists()
    empty = LeaderState("r2", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                        alignment=AlignmentMode.PSI, psi_dir=tmp_path / "empty")  # fmt: skip
    assert empty.psi_mailbox.kept == 0 and (tmp_path / "empty").is_dir()
    empty.leave_psi_mailbox()  # a run that kept nothing (e.g. a resume after the seal) leaves no directory
    assert not (tmp_path / "empty").exists()


def _record(release_id: str) -> ReleaseRecord:
    plan = plan_release(50, [4, 2], 1.0, 50)
    spec = ReleaseSpec(release_id, ("alice", "bob"), CipherMode.CHACHA20, plan, ("researcher",)).validate()
    pad = ReleasePad(CipherMode.CHACHA20, 4, 50, key=PadKey(bytes(range(32))))
    return ReleaseRecord(spec, pad, np.zeros(50, dtype=np.uint32), "fp", "ds", "seedfp")


def test_the_kept_mailbox_is_deleted_with_the_sealed_record_or_the_drop_and_no_other_release_s(
    tmp_path: Path,
) -> None:
    keystore = Keystore(tmp_path / "ks")
    boxes = {}
    for rid in ("r1", "r1-b", "r2"):
        boxes[rid] = psi_mailbox_dir(tmp_path / "ks", rid)
        assert boxes[rid] == keystore.psi_mailbox_dir(rid)
        _filled(boxes[rid])
    keystore.psi_key("r1", KEYS["alice"])
    older = tmp_path / "ks" / "psi-r1-ab12cd_9"  # an older version's temporary mailbox of r1
    older.mkdir()
    assert psi_mailbox_dir(tmp_path / "ks", "r1") == boxes["r1"] and not older.exists()
    assert boxes["r1-b"].exists()  # another release's (its id starts alike) is not touched
    record = _record("r1")
    keystore.save_record(record)  # prepared, not sealed: a follower may still run the ring again
    assert boxes["r1"].exists() and not list((tmp_path / "ks").glob("psi-key-r1*"))
    keystore.set_retention(record, 1e10)  # sealed: every curator has its record
    assert not boxes["r1"].exists() and boxes["r1-b"].exists() and boxes["r2"].exists()
    keystore.drop_record("r2")  # aborted
    assert not boxes["r2"].exists() and boxes["r1-b"].exists()
    PsiMailbox(boxes["r1-b"]).close()
    assert not boxes["r1-b"].exists()


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.said = threading.Event()

    def __call__(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))
        self.said.set()


def test_a_wait_of_the_ring_is_logged_by_what_it_waits_for_while_it_lasts() -> None:
    log = _Log()
    with WaitLog(log, every=0.05) as watch:  # type: ignore[arg-type]
        with watch.waiting("nothing long"):
            pass
        with watch.waiting("bob's PSI list at hop 1"):
            assert log.said.wait(10), "a wait of the ring was not logged"
    assert log.events and {e for e, _ in log.events} == {"psi_waiting"}
    assert all(f["what"] == "bob's PSI list at hop 1" and f["waited_s"] >= 0.05 for _, f in log.events)
