"""A follower on a cluster sends its tags to the leader over several concurrent gRPC streams,
one a run of shards (``--tag-streams``; each its own channel, plaintext in this tier), through
the real Curator service: the row order it gets back is byte for byte the one a single stream
gives, with a leader on a cluster or an in-process one, and a retried submit sends every part
again."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import SplitWorld as World
from support import curator_config, split_world

from secure_release.curator.cluster.engine import InlineEngine
from secure_release.curator.cluster.matching import ClusterLeader
from secure_release.curator.cluster.sharded import ShardedTable
from secure_release.curator.config import CuratorConfig
from secure_release.curator.leader import LeaderState
from secure_release.curator.release.follower import LEADER_CALLS_PER_PEER, follow_leader
from secure_release.curator.release.opening import start_server
from secure_release.curator.service import CuratorService
from secure_release.curator.table import load_schema
from secure_release.curator.waits import Deadline
from secure_release.infra.logs import EventLog
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE
from secure_release.mechanism.primitives.keys import AlignmentKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.architectures import VariantAgreement

KEY = AlignmentKey(bytes(range(32)))
LOG = EventLog("curator", "test")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return split_world(tmp_path_factory.mktemp("streams"), rows=4000, seed=5)


def _table(engine: InlineEngine, world: World, curator: str, shard_bits: int) -> ShardedTable:
    return world.sharded(engine, curator, KEY, shard_bits)


def _one_stream_rows(engine: InlineEngine, world: World) -> tuple[int, bytes]:
    """n and bob's rows by the in-process leader from both whole tag arrays (no parts, no gRPC)."""
    state = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("res",), Seed(bytes(32)))
    for curator in ("alice", "bob"):
        table = _table(engine, world, curator, 0)
        state.add_tags(curator, np.concatenate(list(table.tag_pieces()), dtype=TAG_DTYPE), table.alphabet_size)
    agreement = state.agree()
    return agreement.num_common, state.rows["bob"].astype("<u4").tobytes()


@pytest.fixture(scope="module")
def expected(engine: InlineEngine, world: World) -> tuple[int, bytes]:
    return _one_stream_rows(engine, world)


def _config(name: str, **kw: Any) -> CuratorConfig:
    changes = dict(cipher=CipherMode.CHACHA20, timeout=30.0, alignment_key=KEY, engine="dask")
    return curator_config(name, **{**changes, **kw})


def _follow(
    state: LeaderState, world: World, bob: ShardedTable, tmp_path: Path, streams: int, ready: Any = None
) -> VariantAgreement:
    """Serve ``state`` (its run thread fixes and publishes the agreement; ``ready`` runs first,
    while the follower already tries) and follow it with bob's sharded tags in ``streams``."""
    schema = load_schema(world.root / "alice.json").schema
    service = CuratorService("alice", schema, EventLog("curator", "alice"))
    service.lead(state)
    port_file = tmp_path / "port"
    server = start_server(_config("alice", port_file=str(port_file)), service, EventLog("curator", "alice"))
    try:

        def lead() -> None:
            if ready is not None:
                ready()
            state.collect(30.0)
            state.publish()

        leader = threading.Thread(target=lead)
        leader.start()
        bob_config = _config("bob", leader=False, leader_address=f"127.0.0.1:{int(port_file.read_text())}",
                             tag_streams=streams)  # fmt: skip
        log = EventLog("curator", "bob")
        variant = follow_leader(bob_config, bob.tag_pieces, bob.alphabet_size, log, Deadline(30.0))
        leader.join(10.0)
        return variant
    finally:
        server.stop(0).wait()


def _submitted(caplog: pytest.LogCaptureFixture) -> list[tuple[int, int]]:
    return [(r.tags, r.streams) for r in caplog.records if r.getMessage() == "tags_submitted"]  # type: ignore[attr-defined]


def _parts_received(caplog: pytest.LogCaptureFixture) -> list[tuple[int, int]]:
    return sorted(
        (getattr(r, "part", 0), getattr(r, "parts", 1)) for r in caplog.records if r.getMessage() == "tags_received"
    )


@pytest.mark.parametrize(("streams", "shard_bits"), [(1, 3), (2, 3), (3, 3), (3, 1)])  # the last: 3 streams, 2 shards
def test_a_cluster_leader_gives_the_rows_of_one_stream_whatever_the_streams(
    engine: InlineEngine, world: World, expected: tuple[int, bytes], tmp_path: Path, caplog: pytest.LogCaptureFixture,
    streams: int, shard_bits: int,
) -> None:  # fmt: skip
    bob = _table(engine, world, "bob", shard_bits)
    alice = _table(engine, world, "alice", shard_bits)
    state = ClusterLeader("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("res",), Seed(bytes(32)))
    state.attach(alice, tmp_path)
    state.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), alice.alphabet_size)
    with caplog.at_level(logging.INFO, logger="secure_release"):
        variant = _follow(state, world, bob, tmp_path, streams)
    sent = min(streams, 1 << shard_bits)
    assert variant.own_rows is not None and variant.num_common == expected[0]
    assert variant.own_rows.astype("<u4").tobytes() == expected[1]  # byte for byte
    assert _submitted(caplog) == [(bob.num_rows, sent)]
    whole = [(0, 1)] if sent == 1 else [(i, sent) for i in range(sent)]
    assert _parts_received(caplog) == whole  # the leader got one stream a part
    state.cleanup()


def test_a_local_leader_gives_a_parted_follower_the_rows_of_one_stream(
    engine: InlineEngine, world: World, expected: tuple[int, bytes], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alice = _table(engine, world, "alice", 3)
    state = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("res",), Seed(bytes(32)))
    state.add_tags("alice", np.concatenate(list(alice.tag_pieces()), dtype=TAG_DTYPE), alice.alphabet_size)
    with caplog.at_level(logging.INFO, logger="secure_release"):
        variant = _follow(state, world, _table(engine, world, "bob", 3), tmp_path, 3)
    assert variant.own_rows is not None and variant.own_rows.astype("<u4").tobytes() == expected[1]
    assert _submitted(caplog)[0][1] == 3


def test_more_streams_than_the_leader_takes_at_once_are_capped_not_refused(
    engine: InlineEngine, world: World, expected: tuple[int, bytes], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A curator's service takes a few calls of one peer at once (RESOURCE_EXHAUSTED beyond):
    a follower asked for more streams sends that many, and says so."""
    bob, alice = _table(engine, world, "bob", 4), _table(engine, world, "alice", 4)
    state = ClusterLeader("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("res",), Seed(bytes(32)))
    state.attach(alice, tmp_path)
    state.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), alice.alphabet_size)
    with caplog.at_level(logging.INFO, logger="secure_release"):
        variant = _follow(state, world, bob, tmp_path, 2 * LEADER_CALLS_PER_PEER)
    assert variant.own_rows is not None and variant.own_rows.astype("<u4").tobytes() == expected[1]
    assert _submitted(caplog) == [(bob.num_rows, LEADER_CALLS_PER_PEER)]
    assert any(r.getMessage() == "tag_streams_capped" for r in caplog.records)
    state.cleanup()


def test_a_retried_submit_sends_every_part_again(
    engine: InlineEngine, world: World, expected: tuple[int, bytes], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The leader is still reading its own table when the parts first arrive (refused: not
    ready); the retry sends all of them again and they fit together."""
    bob, alice = _table(engine, world, "bob", 3), _table(engine, world, "alice", 3)
    state = ClusterLeader("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("res",), Seed(bytes(32)))

    def ready() -> None:
        time.sleep(0.5)
        state.attach(alice, tmp_path)
        state.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), alice.alphabet_size)

    with caplog.at_level(logging.INFO, logger="secure_release"):
        variant = _follow(state, world, bob, tmp_path, 3, ready)
    assert variant.own_rows is not None and variant.own_rows.astype("<u4").tobytes() == expected[1]
    refused = [r for r in caplog.records if r.getMessage() == "tags_refused"]
    reasons = [str(r.reason) for r in refused]  # type: ignore[attr-defined]
    # the first attempt's parts are refused as not ready; a part of it that arrived just after the
    # leader became ready may still be open when the retry's part comes (also not ready: retried);
    # a part the follower cancelled (another part failed) before its first chunk left is empty
    assert any("still reading its own table" in r for r in reasons)
    allowed = ("AgreementNotReadyError", "TagStreamError: an empty tag stream")
    assert all(r.startswith(allowed) for r in reasons), reasons
    assert _parts_received(caplog) == [(0, 3), (1, 3), (2, 3)]
    state.cleanup()


def test_the_tag_and_agreement_calls_get_time_for_their_bytes(
    engine: InlineEngine, world: World, expected: tuple[int, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call that moves a follower's tags, or its row order back, may take its fixed time
    plus its bytes at the slowest rate allowed (a fixed 60 s could not carry the 4.8 GB of tags
    of 3 * 10^8 rows: every attempt ran out and started again). With no fixed time at all the
    tags' call here still has time for its 4,005 tags at 16 kB/s."""
    from secure_release.curator.release import follower

    calls: list[float] = []
    real = follower.retry_until

    def spy(fn: Any, what: str, deadline: Any, log: Any, per_call_s: float) -> Any:
        calls.append(per_call_s)
        return real(fn, what, deadline, log, per_call_s=per_call_s)

    monkeypatch.setattr(follower, "retry_until", spy)
    monkeypatch.setattr(follower, "SUBMIT_TIMEOUT_S", 0.0)
    monkeypatch.setattr(follower, "SLOWEST_BYTES_PER_S", 16_000)
    bob, alice = _table(engine, world, "bob", 3), _table(engine, world, "alice", 3)
    rows = bob.num_rows
    assert follower.tag_count(bob.tag_pieces) == rows > 0
    state = ClusterLeader("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("res",), Seed(bytes(32)))
    state.attach(alice, tmp_path)
    state.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), alice.alphabet_size)
    variant = _follow(state, world, bob, tmp_path, 2)
    assert variant.own_rows is not None and variant.own_rows.astype("<u4").tobytes() == expected[1]
    assert calls == [rows * 16 / 16_000, follower.AGREEMENT_CALL_S + rows * 20 / 16_000]
    state.cleanup()


def test_a_call_deadline_is_its_fixed_part_and_its_bytes_at_the_slowest_rate() -> None:
    from secure_release.curator.release.follower import SLOWEST_BYTES_PER_S, call_seconds, tag_count

    assert SLOWEST_BYTES_PER_S == 8 << 20
    assert call_seconds(60.0, 0) == 60.0
    assert call_seconds(60.0, 300_000_000 * 16) == 60.0 + 300_000_000 * 16 / (8 << 20)  # 632 s at 3 * 10^8
    assert tag_count(np.zeros(7, dtype=TAG_DTYPE)) == 7 and tag_count(lambda: iter(())) == 0
