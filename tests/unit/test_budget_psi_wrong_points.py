# tier: unit
"""Issue 24, item 8: a PSI member that sends valid but wrong group points ends the release
promptly with a named error, and the leader's state stays usable (it answers every later call
with the failure instead of waiting). The ring runs in threads through the leader's mailbox
(the transport the Curator service wraps), with bob replacing the lists it re-blinds by valid
points of other ids: its re-blinding proof (mechanism/alignment/psi_proof.py) does not verify and the leader
names it. Before, the agreement failed only with "n must be >= 1, got 0", and a wrong-length list
or a changed resend left the leader waiting for the ring's deadline."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from secure_release.curator.errors import PsiMismatchError
from secure_release.curator.leader import LeaderState
from secure_release.curator.release.psi_ring import WaitLog, _local, ring
from secure_release.curator.waits import Deadline
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import AgreementError, PsiStreamError
from secure_release.mechanism.alignment.psi import POINT_BYTES, PsiKey, hash_to_group
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.architectures import AlignmentMode

CURATORS = ("alice", "bob", "carol")
IDS = np.array([f"id{i}" for i in range(200)])
RING_S = 30.0  # the release's own timeout in this test


def _leader() -> LeaderState:
    return LeaderState("r1", CURATORS, None, 1.0, None, CipherMode.OTP, ("res",), Seed(bytes(32)),
                       alignment=AlignmentMode.PSI)  # fmt: skip


def _member(state: LeaderState, me: str, wrong: str, out: dict[str, object]) -> None:
    send, receive = _local(state, me, Deadline(RING_S), WaitLog(EventLog("curator", me)))  # never entered: no thread
    if me == "bob":
        honest = send

        def send(owner: str, hop: int, points: bytes, proof: bytes = b"", public: bytes = b"") -> None:
            if owner != "bob" and wrong == "points":  # valid group points, of other ids
                points = b"".join(hash_to_group([f"forged{i}" for i in range(len(points) // POINT_BYTES)]))
            if owner != "bob" and wrong == "length":
                points = points[:-POINT_BYTES]
            honest(owner, hop, points, proof, public)

    try:
        state.add_tags(me, ring(me, CURATORS, IDS, PsiKey.generate(), send, receive), 4, AlignmentMode.PSI)
        out[me] = "tags"
    except Exception as exc:
        out[me] = exc


@pytest.mark.parametrize("wrong", ["points", "length"])
def test_wrong_points_end_the_release_promptly_with_a_named_error(wrong: str) -> None:
    state = _leader()
    out: dict[str, object] = {}
    t0 = time.monotonic()
    threads = [threading.Thread(target=_member, args=(state, c, wrong, out)) for c in CURATORS]
    for t in threads:
        t.start()
    with pytest.raises((AgreementError, PsiMismatchError, PsiStreamError)) as info:
        state.collect(RING_S)
    for t in threads:
        t.join(RING_S)
    elapsed = time.monotonic() - t0
    print(f"PSI wrong {wrong}: clean end after {elapsed:.2f} s (release timeout {RING_S:g} s)")
    assert elapsed < 10.0  # well inside the release's own timeout: nobody waits for the deadline
    message = str(info.value) + str(state.error)
    assert "'bob' sent a wrong PSI list" in message  # the member is named
    if wrong == "points":  # caught by bob's re-blinding proof, not only by the empty intersection
        assert "does not verify" in message
    # the leader stays up: every later call gets the failure at once, none waits
    t1 = time.monotonic()
    with pytest.raises(AgreementError):
        state.wait_agreement(RING_S)
    assert time.monotonic() - t1 < 1.0
