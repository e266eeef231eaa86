"""The Curator service: its RPC methods called directly behind a checked identity (no
network), then the real server (auth interceptor, health) with a follower over loopback."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import grpc
import numpy as np
import pytest
from support import curator_config

from secure_release.curator.config import CuratorConfig
from secure_release.curator.leader import LeaderState
from secure_release.curator.release.agreement_checks import own_alignment
from secure_release.curator.release.follower import follow_leader
from secure_release.curator.release.opening import start_server
from secure_release.curator.service import SERVICE_NAME, CuratorService
from secure_release.curator.waits import Deadline
from secure_release.infra.auth import AuthedContext
from secure_release.infra.health import check
from secure_release.infra.identity import Identity
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import (
    ROWS_PER_PIECE,
    AgreementError,
    agreement_chunks,
    agreement_from_chunks,
    tag_chunks,
    tags_from_bytes,
)
from secure_release.infra.tls import secure_channel
from secure_release.infra.wire import cipher_from_pb, spec_from_pb
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray, align
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, unpack_symbols
from secure_release.mechanism.primitives.pads import CipherMode, new_release_pad
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

SCHEMA = CuratorSchema("alice", (Attribute("edu", ("a", "b", "c")), Attribute("mar", ("m", "s"))))
SEED = Seed(bytes([9]) * 32)


class AbortedError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class FakeContext:
    """Just what the servicer uses of a grpc.ServicerContext."""

    def __init__(self, remaining: float = 5.0) -> None:
        self.remaining = remaining

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise AbortedError(code, details)

    def time_remaining(self) -> float:
        return self.remaining


def _as(role: str, name: str, remaining: float = 5.0) -> Any:
    return AuthedContext(FakeContext(remaining), Identity(role, name))  # type: ignore[arg-type]


def _tags(count: int, offset: int = 0) -> TagArray:
    tags = np.zeros(count, dtype=TAG_DTYPE)
    tags["hi"] = np.arange(offset, offset + count, dtype=np.uint64)
    tags["lo"] = 7
    return tags


def _leading() -> tuple[CuratorService, LeaderState]:
    service = CuratorService("alice", SCHEMA, EventLog("curator", "alice"))
    state = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.OTP, ("res",), SEED)
    service.lead(state)
    return service, state


def _aborted(call: Any) -> AbortedError:
    with pytest.raises(AbortedError) as info:
        result = call()
        if isinstance(result, Iterable):
            list(result)
    return info.value


def test_submit_tags_and_serve_a_multi_chunk_agreement() -> None:
    service, state = _leading()
    n = ROWS_PER_PIECE + 10  # a follower's rows need two AgreementChunks (the common tags, five)
    state.add_tags("alice", _tags(n + 5), 6)
    bob_tags = _tags(n + 3, offset=2)[::-1].copy()  # bob's own row order differs from the canonical one
    resp = service.SubmitTags(tag_chunks("r1", "bob", bob_tags, 4), _as("curator", "bob"))
    assert resp.tags_received == n + 3 and state.sizes == {"alice": 6, "bob": 4}
    agreement = state.collect(1.0).base
    state.publish()
    chunks = list(service.GetAgreement(pb.AgreementRequest(release_id="r1", curator="bob"), _as("curator", "bob")))
    assert [c.sequence for c in chunks] == [0, 1] and chunks[-1].last and not chunks[0].last
    assert spec_from_pb(chunks[0].params) == agreement.spec and agreement.spec.n == n + 3
    assert chunks[0].sampling_seed == SEED.reveal() and not chunks[1].sampling_seed
    # bob gets his own rows in the canonical order (4 bytes a row), not the common tags
    assert not any(c.common_tags for c in chunks)
    got = agreement_from_chunks(iter(chunks))
    assert got.own_rows is not None and got.num_common == n + 3
    assert np.array_equal(got.own_rows, align(bob_tags, agreement.common).row_order)
    assert np.array_equal(own_alignment(got, bob_tags).row_order, got.own_rows)
    # an agreement restored without row orders (an older leader's files) serves the common tags
    state.rows = {}
    chunks = list(service.GetAgreement(pb.AgreementRequest(release_id="r1", curator="bob"), _as("curator", "bob")))
    assert np.array_equal(tags_from_bytes(b"".join(c.common_tags for c in chunks)), agreement.common)
    assert np.array_equal(own_alignment(agreement_from_chunks(iter(chunks)), bob_tags).row_order, got.own_rows)


def test_a_follower_refuses_a_row_order_that_is_not_a_permutation_of_n_of_its_rows() -> None:
    _, state = _leading()
    state.add_tags("alice", _tags(50), 6)
    state.add_tags("bob", _tags(40, offset=20), 4)
    state.collect(1.0)
    state.publish()
    good = agreement_from_chunks(iter(agreement_chunks(state.agreement, state.rows["bob"])))
    assert good.own_rows is not None
    for bad in (np.append(good.own_rows[:-1], good.own_rows[0]), np.append(good.own_rows[:-1], 40)):
        forged = agreement_from_chunks(iter(agreement_chunks(state.agreement, bad)))
        with pytest.raises(AgreementError):
            own_alignment(forged, _tags(40, offset=20))
    with pytest.raises(AgreementError, match="rows"):  # more rows than n
        agreement_from_chunks(iter(agreement_chunks(state.agreement, np.append(good.own_rows, 0))))


@pytest.mark.parametrize(
    ("chunks", "who", "code", "error"),
    [
        (lambda: tag_chunks("r1", "carol", _tags(3), 4), "bob", grpc.StatusCode.PERMISSION_DENIED, "as 'carol'"),
        (lambda: tag_chunks("r9", "bob", _tags(3), 4), "bob", grpc.StatusCode.NOT_FOUND, "does not lead"),
        (lambda: tag_chunks("r1", "carol", _tags(3), 4), "carol", grpc.StatusCode.PERMISSION_DENIED, "not a curator"),
        (lambda: tag_chunks("r1", "alice", _tags(3), 6), "alice", grpc.StatusCode.PERMISSION_DENIED, "own tags"),
        (lambda: tag_chunks("r1", "bob", _tags(3), 0), "bob", grpc.StatusCode.FAILED_PRECONDITION, "no alphabet"),
        (
            lambda: [pb.TagChunk(release_id="r1", curator="bob", sequence=1, last=True)],
            "bob",
            grpc.StatusCode.INVALID_ARGUMENT,
            "out of order",
        ),
    ],
)
def test_submit_tags_refusals(chunks: Any, who: str, code: grpc.StatusCode, error: str) -> None:
    service, state = _leading()
    got = _aborted(lambda: service.SubmitTags(chunks(), _as("curator", who)))
    assert got.code == code and error in got.details, got.details
    assert "bob" not in state.tags


def test_a_non_member_is_refused_before_any_tag_byte_is_kept() -> None:
    service, state = _leading()
    consumed: list[int] = []

    def flood() -> Iterable[pb.TagChunk]:  # a non-member streaming (in principle) forever
        for seq in range(10_000):
            consumed.append(seq)
            yield pb.TagChunk(release_id="r1", curator="carol", sequence=seq, tags=bytes(1 << 20))

    got = _aborted(lambda: service.SubmitTags(flood(), _as("curator", "carol")))
    assert got.code == grpc.StatusCode.PERMISSION_DENIED and "not a curator" in got.details
    assert consumed == [0] and "carol" not in state.tags


def test_a_member_may_send_at_most_max_rows_tags() -> None:
    service = CuratorService("alice", SCHEMA, EventLog("curator", "alice"), max_rows=100)
    state = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.OTP, ("res",), SEED)
    service.lead(state)
    ok = service.SubmitTags(tag_chunks("r1", "bob", _tags(100), 4), _as("curator", "bob"))
    assert ok.tags_received == 100
    state.tags.clear()
    got = _aborted(lambda: service.SubmitTags(tag_chunks("r1", "bob", _tags(101), 4), _as("curator", "bob")))
    assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-rows" in got.details
    assert "bob" not in state.tags


def test_a_follower_learns_the_leaders_refusal_within_seconds(tmp_path: Path) -> None:
    service, state = _leading()
    port_file = tmp_path / "port"
    server = start_server(_config("alice", port_file=str(port_file)), service, EventLog("curator", "alice"))
    try:
        state.add_tags("alice", _tags(50), 6)
        leader = threading.Thread(target=lambda: _swallow(lambda: state.collect(10.0)))
        leader.start()
        bob = _config("bob", leader=False, leader_address=f"127.0.0.1:{int(port_file.read_text())}")
        t0 = time.monotonic()
        with pytest.raises(AgreementError) as info:  # disjoint ids: no id common to all curators
            follow_leader(bob, _tags(40, offset=500), 4, EventLog("curator", "bob"), Deadline(30.0))
        took = time.monotonic() - t0
        leader.join(5)
        assert "FAILED_PRECONDITION" in str(info.value) and took < 5.0, (str(info.value), took)
        assert state.wait_all_told(0.1)
    finally:
        server.stop(0).wait()


def test_a_follower_over_the_leaders_max_rows_fails_at_once(tmp_path: Path) -> None:
    """--max-rows is a bound, not a busy slot: the follower must not retry it until its timeout."""
    service = CuratorService("alice", SCHEMA, EventLog("curator", "alice"), max_rows=30)
    state = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.OTP, ("res",), SEED)
    service.lead(state)
    port_file = tmp_path / "port"
    server = start_server(_config("alice", port_file=str(port_file)), service, EventLog("curator", "alice"))
    try:
        bob = _config("bob", leader=False, leader_address=f"127.0.0.1:{int(port_file.read_text())}")
        t0 = time.monotonic()
        with pytest.raises(AgreementError) as info:
            follow_leader(bob, _tags(40), 4, EventLog("curator", "bob"), Deadline(30.0))
        took = time.monotonic() - t0
        assert "RESOURCE_EXHAUSTED" in str(info.value) and "--max-rows" in str(info.value)
        assert took < 5.0, took  # before the fix: retried for the whole 30 s deadline
    finally:
        server.stop(0).wait()


def _swallow(fn: Any) -> None:
    with contextlib.suppress(Exception):  # the leader's own failure; the follower's side is under test
        fn()


def test_get_agreement_refusals() -> None:
    service, state = _leading()
    # a leader that never got bob's tags (it restarted after bob sent them) asks for them again
    missing = _aborted(
        lambda: service.GetAgreement(pb.AgreementRequest(release_id="r1", curator="bob"), _as("curator", "bob", 0.01))
    )
    assert missing.code == grpc.StatusCode.UNAVAILABLE and "TagsMissingError" in missing.details
    state.add_tags("bob", _tags(10), 4)
    not_ready = _aborted(
        lambda: service.GetAgreement(pb.AgreementRequest(release_id="r1", curator="bob"), _as("curator", "bob", 0.01))
    )
    assert not_ready.code == grpc.StatusCode.UNAVAILABLE and "AgreementNotReadyError" in not_ready.details
    impostor = _aborted(
        lambda: service.GetAgreement(pb.AgreementRequest(release_id="r1", curator="bob"), _as("curator", "carol"))
    )
    assert impostor.code == grpc.StatusCode.PERMISSION_DENIED
    state.fail("the leader gave up")
    failed = _aborted(
        lambda: service.GetAgreement(pb.AgreementRequest(release_id="r1", curator="bob"), _as("curator", "bob"))
    )
    assert failed.code == grpc.StatusCode.FAILED_PRECONDITION and "the leader gave up" in failed.details


def test_release_key_only_to_granted_researchers() -> None:
    service = CuratorService("alice", SCHEMA, EventLog("curator", "alice"))
    pad = new_release_pad(CipherMode.OTP, 6, CHUNK_ROWS + 5)  # two KeyChunks
    service.add_release("r1", pad, ["res"])
    unknown = _aborted(lambda: service.ReleaseKey(pb.KeyRequest(release_id="r2"), _as("researcher", "res")))
    assert unknown.code == grpc.StatusCode.NOT_FOUND
    intruder = _aborted(lambda: service.ReleaseKey(pb.KeyRequest(release_id="r1"), _as("researcher", "eve")))
    assert intruder.code == grpc.StatusCode.PERMISSION_DENIED and "not granted 'eve'" in intruder.details
    assert not service.wait_keys_served("r1", timeout=0.01)
    chunks = list(service.ReleaseKey(pb.KeyRequest(release_id="r1"), _as("researcher", "res")))
    assert cipher_from_pb(chunks[0].cipher) is CipherMode.OTP and chunks[0].schema.curator == "alice"
    assert [c.sequence for c in chunks] == [0, 1] and chunks[1].last
    symbols = np.concatenate([unpack_symbols(c.otp_pad, 6) for c in chunks])
    assert np.array_equal(symbols, pad.pad())
    assert service.wait_keys_served("r1", timeout=0.01)


def test_release_key_chacha20_is_one_chunk() -> None:
    service = CuratorService("alice", SCHEMA, EventLog("curator", "alice"))
    pad = new_release_pad(CipherMode.CHACHA20, 6, 10)
    service.add_release("r1", pad, ["res"])
    (chunk,) = service.ReleaseKey(pb.KeyRequest(release_id="r1"), _as("researcher", "res"))
    assert pad.key is not None and chunk.chacha20_key == pad.key.reveal() and chunk.last and chunk.m == 10


def _config(name: str, **kw: Any) -> CuratorConfig:
    return curator_config(name, **kw)


def test_follower_gets_the_leaders_agreement_over_grpc(tmp_path: Path) -> None:
    service, state = _leading()
    port_file = tmp_path / "port"
    server = start_server(_config("alice", port_file=str(port_file)), service, EventLog("curator", "alice"))
    port = int(port_file.read_text())
    try:
        state.add_tags("alice", _tags(50), 6)
        # the leader's run thread: fix the agreement, (register it,) publish it
        leader = threading.Thread(target=lambda: (state.collect(10.0), state.publish()))
        leader.start()
        bob = _config("bob", leader=False, leader_address=f"127.0.0.1:{port}", timeout=5.0)
        variant = follow_leader(bob, _tags(40, offset=20), 4, EventLog("curator", "bob"), Deadline(5.0))
        leader.join(5.0)
        assert state.agreement is not None
        fixed, got = state.agreement.base, variant.base
        assert got.spec == fixed.spec and got.spec.n == 30
        assert got.seed.reveal() == SEED.reveal() and got.common.size == 0  # rows travel instead
        assert variant.own_rows is not None
        assert np.array_equal(variant.own_rows, align(_tags(40, offset=20), fixed.common).row_order)
        address = f"127.0.0.1:{port}"
        with secure_channel(address, None, "res", insecure=True, role="researcher") as channel:
            with pytest.raises(grpc.RpcError) as info:  # the access table: researchers may not send tags
                pb_grpc.CuratorStub(channel).SubmitTags(tag_chunks("r1", "res", _tags(1), 4), timeout=5)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert check(channel, SERVICE_NAME) == "SERVING"
    finally:
        server.stop(0).wait()


def test_the_leader_forgets_tags_once_the_agreement_is_fixed_but_knows_a_resubmission() -> None:
    from secure_release.curator.errors import AgreementFixedError

    _, state = _leading()
    state.add_tags("alice", _tags(50), 6)
    state.add_tags("bob", _tags(40, offset=20), 4)
    digests = state.tag_digests()
    state.forget_tags()  # before the agreement: nothing is dropped
    assert set(state.tags) == {"alice", "bob"}
    state.collect(5.0)
    state.forget_tags()
    assert state.tags == {} and state.tag_digests() == digests
    state.add_tags("bob", _tags(40, offset=20), 4)  # the same tags again: a no-op
    with pytest.raises(AgreementFixedError):
        state.add_tags("bob", _tags(40, offset=21), 4)
