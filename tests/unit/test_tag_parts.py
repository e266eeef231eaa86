"""A follower's tags in parts (``TagChunk.part``, ``parts``, ``first_row``): concurrent streams,
one a run of whole shards. The leader on a cluster (:class:`ClusterLeader`) and the in-process
leader (:class:`LeaderState`) must agree exactly as on one stream, whatever the parts' number and
arrival order, and refuse parts that overlap or leave a gap.

Everything runs on the in-process engine (the stage functions a Dask worker runs);
tests/integration/test_tag_streams.py sends the parts over gRPC."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import SplitWorld as World
from support import split_world

from secure_release.curator.cli import build_parser
from secure_release.curator.cluster.engine import InlineEngine
from secure_release.curator.cluster.matching import ClusterLeader
from secure_release.curator.cluster.sharded import ShardedTable
from secure_release.curator.cluster.spool import SpoolError, SpoolRange
from secure_release.curator.config import config_from_args
from secure_release.curator.errors import AgreementFixedError
from secure_release.curator.leader import LeaderState, TagPartsError
from secure_release.curator.release.follower import shard_runs
from secure_release.infra.config import ConfigError, apply_env_and_config, subcommand_parser
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import (
    MAX_TAG_PARTS,
    TAG_BYTES,
    WHOLE_STREAM,
    AgreementError,
    TagLimitError,
    TagPart,
    TagStream,
    TagStreamError,
    tag_chunks,
)
from secure_release.mechanism.alignment import sharding as sh
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE
from secure_release.mechanism.primitives.keys import AlignmentKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

KEY = AlignmentKey(bytes(range(32)))
LOG = EventLog("curator", "test")
SHARD_BITS = 3  # 8 shards


@dataclass(frozen=True)
class OneStream:
    """What the leader on a cluster makes of bob's tags in one ascending stream."""

    count: int
    rows: bytes
    own: bytes
    digest: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return split_world(tmp_path_factory.mktemp("parts"), rows=5000, seed=11)


def _table(engine: InlineEngine, world: World, curator: str, shard_bits: int = SHARD_BITS) -> ShardedTable:
    return world.sharded(engine, curator, KEY, shard_bits)


@pytest.fixture(scope="module")
def bob(engine: InlineEngine, world: World) -> ShardedTable:
    return _table(engine, world, "bob")


def _leader(engine: InlineEngine, world: World, spool: Path) -> ClusterLeader:
    leader = ClusterLeader("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                           seed=Seed(bytes(32)))  # fmt: skip
    alice = _table(engine, world, "alice")
    leader.attach(alice, spool)
    leader.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), alice.alphabet_size)
    return leader


def _outcome(leader: ClusterLeader) -> tuple[int, bytes, bytes]:
    agreement = leader.agree()
    rows = leader.rows_of("bob")[0 : agreement.count]
    return agreement.count, rows.tobytes(), leader.own_aligned().tobytes()


@pytest.fixture(scope="module")
def one_stream(
    engine: InlineEngine, world: World, bob: ShardedTable, tmp_path_factory: pytest.TempPathFactory
) -> OneStream:
    leader = _leader(engine, world, tmp_path_factory.mktemp("one"))
    pieces = [t.tobytes() for t in bob.tag_pieces()]
    assert leader.add_tag_stream("bob", pieces, bob.alphabet_size, leader.alignment) == bob.num_rows
    count, rows, own = _outcome(leader)
    digest = leader.tag_digests()["bob"]
    leader.cleanup()
    assert count > 0 and digest == hashlib.sha256(b"".join(pieces)).hexdigest()
    return OneStream(count, rows, own, digest)


def _parts(table: ShardedTable, runs: list[tuple[int, int]]) -> list[tuple[TagPart, list[bytes]]]:
    """Each run of shards as a part (its first row where its first shard's rows begin)."""
    offsets = table.row_offsets
    return [
        (TagPart(i, len(runs), int(offsets[first])), [t.tobytes() for t in table.tag_pieces_of(first, stop)])
        for i, (first, stop) in enumerate(runs)
    ]


def _send(
    leader: LeaderState, parts: list[tuple[TagPart, list[bytes]]], schedule: list[int], size: int = 4
) -> list[BaseException]:
    """Every part on its own thread, as concurrent streams would arrive, the pieces interleaved
    as ``schedule`` says (part indices: each occurrence lets that part's next piece through once
    the leader asks for it). Returns the errors the parts' streams ended with."""
    turn = [0]
    lock = threading.Condition()
    errors: list[BaseException] = []

    def pieces(index: int, own: list[bytes]) -> Iterator[bytes]:
        for piece in own:
            with lock:
                if not lock.wait_for(lambda: turn[0] < len(schedule) and schedule[turn[0]] == index, 20.0):
                    raise TimeoutError(f"part {index} never got its turn")
            yield piece
            with lock:
                turn[0] += 1
                lock.notify_all()

    def stream(part: TagPart, own: list[bytes]) -> None:
        try:
            leader.add_tag_stream("bob", pieces(part.index, own), size, leader.alignment, part)
        except BaseException as exc:  # handed back to the test
            errors.append(exc)
            with lock:  # the others go on
                while turn[0] < len(schedule) and schedule[turn[0]] == part.index:
                    turn[0] += 1
                lock.notify_all()

    threads = [threading.Thread(target=stream, args=(part, own)) for part, own in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30.0)
    return errors


def _round_robin_from_last(parts: list[tuple[TagPart, list[bytes]]]) -> list[int]:
    """One piece of each part in turn, the last part first: part P-1 starts before part 0."""
    left = {p.index: len(own) for p, own in parts}
    schedule: list[int] = []
    while any(left.values()):
        for index in sorted(left, reverse=True):
            if left[index]:
                schedule.append(index)
                left[index] -= 1
    return schedule


def _one_after_another_last_first(parts: list[tuple[TagPart, list[bytes]]]) -> list[int]:
    return [p.index for p, own in sorted(parts, key=lambda item: -item[0].index) for _ in own]


# ------------------------------------------------------------------------------------ runs
def test_shard_runs_split_the_shards_into_contiguous_runs_of_about_equal_rows() -> None:
    offsets = np.array([0, 100, 200, 300, 400, 500, 600, 700, 800])
    assert shard_runs(offsets, 1) == [(0, 8)]
    assert shard_runs(offsets, 2) == [(0, 4), (4, 8)]
    assert shard_runs(offsets, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert shard_runs(offsets, 20) == [(s, s + 1) for s in range(8)]  # more streams than shards: one a shard
    skewed = np.array([0, 700, 710, 720, 800])  # one big shard: it is a run of its own
    assert shard_runs(skewed, 2) == [(0, 1), (1, 4)]
    assert shard_runs(np.zeros(5, dtype=np.int64), 3) == [(0, 1), (1, 4)]  # no rows: still whole shards
    assert shard_runs(np.array([0, 10]), 4) == [(0, 1)]


def test_a_sharded_tables_runs_hold_every_tag_once_in_order(bob: ShardedTable) -> None:
    offsets = bob.row_offsets
    assert offsets[0] == 0 and offsets[-1] == bob.num_rows and np.array_equal(np.diff(offsets), bob.sizes)
    whole = np.concatenate(list(bob.tag_pieces()))
    parts = [np.concatenate(list(bob.tag_pieces_of(a, b))) for a, b in shard_runs(offsets, 3)]
    assert np.array_equal(np.concatenate(parts), whole)
    assert [p.size for p in parts] == [int(offsets[b] - offsets[a]) for a, b in shard_runs(offsets, 3)]


# ------------------------------------------------------------------------------------ the leader on a cluster
@pytest.mark.parametrize("streams", [1, 2, 3, 20])
@pytest.mark.parametrize("arrival", ["round robin, last part first", "one after another, last part first"])
def test_parts_give_the_agreement_and_rows_of_one_stream(
    engine: InlineEngine, world: World, bob: ShardedTable, one_stream: OneStream, tmp_path: Path, streams: int,
    arrival: str,
) -> None:  # fmt: skip
    runs = shard_runs(bob.row_offsets, streams)
    assert len(runs) == min(streams, 1 << SHARD_BITS)
    parts = _parts(bob, runs)
    schedule = (_round_robin_from_last if arrival.startswith("round") else _one_after_another_last_first)(parts)
    leader = _leader(engine, world, tmp_path)
    assert _send(leader, parts, schedule) == []
    assert _outcome(leader) == (one_stream.count, one_stream.rows, one_stream.own)  # byte for byte
    digests = [hashlib.sha256(b"".join(own)).hexdigest() for _, own in parts]
    expected = digests[0] if len(parts) == 1 else hashlib.sha256("".join(digests).encode()).hexdigest()
    assert leader.tag_digests()["bob"] == expected
    assert leader.generation == 0  # parts that fit together restart nothing
    leader.cleanup()


@pytest.mark.parametrize("shares_files", [True, False], ids=["workers read the spool", "tags sent to the workers"])
def test_the_leaders_workers_match_the_same_whether_they_read_the_spool_or_are_sent_the_tags(
    world: World, bob: ShardedTable, one_stream: OneStream, tmp_path: Path, shares_files: bool
) -> None:
    """An embedded cluster's workers read the follower tags from the leader's spool and write
    its rows; a cluster elsewhere is sent the tags and sends the rows back: the same rows."""
    engine = InlineEngine(2, shares_files=shares_files)
    try:
        parts = _parts(bob, shard_runs(bob.row_offsets, 3))
        leader = _leader(engine, world, tmp_path)
        assert _send(leader, parts, _round_robin_from_last(parts)) == []
        assert _outcome(leader) == (one_stream.count, one_stream.rows, one_stream.own)
        leader.cleanup()
    finally:
        engine.close()


def test_a_part_sent_again_restarts_the_matching_and_gives_the_same_rows(
    engine: InlineEngine, world: World, bob: ShardedTable, one_stream: OneStream, tmp_path: Path
) -> None:
    parts = _parts(bob, shard_runs(bob.row_offsets, 3))
    leader = _leader(engine, world, tmp_path)
    assert _send(leader, parts, _round_robin_from_last(parts)) == []
    _wait_matched(leader, leader.num_units)
    assert not list(leader.spool.glob("bob-*.tags"))  # every shard matched: its spool removed
    digest = leader.tag_digests()["bob"]
    part, pieces = parts[1]

    def broken() -> Iterator[bytes]:
        yield pieces[0]
        raise ConnectionResetError("the stream broke")

    with pytest.raises(ConnectionResetError):
        leader.add_tag_stream("bob", broken(), 4, leader.alignment, part)  # cut short ...
    assert leader.generation == 1
    assert leader.add_tag_stream("bob", pieces, 4, leader.alignment, part) == sum(len(p) for p in pieces) // 16
    assert leader.generation == 2  # ... and sent again: each start over a received part restarts the matching
    assert _outcome(leader) == (one_stream.count, one_stream.rows, one_stream.own)
    assert leader.tag_digests()["bob"] == digest
    # once the agreement is fixed, the same part again is recognised and never spooled; another is refused
    last, last_pieces = parts[-1]
    assert leader.add_tag_stream("bob", last_pieces, 4, leader.alignment, last) > 0
    assert not list(leader.spool.glob("bob-*.tags"))
    with pytest.raises(AgreementFixedError):
        leader.add_tag_stream("bob", last_pieces[:-1], 4, leader.alignment, last)
    leader.cleanup()


def test_a_leader_on_a_cluster_refuses_two_parts_that_hold_one_shard_before_writing_it(
    engine: InlineEngine, world: World, bob: ShardedTable, tmp_path: Path
) -> None:
    """Rows that do not overlap, but part 1 holds tags of shard 4, which part 0 holds."""
    offsets = bob.row_offsets
    parts = [
        (TagPart(0, 2, 0), [t.tobytes() for t in bob.tag_pieces_of(0, 5)]),
        (TagPart(1, 2, int(offsets[5])), [t.tobytes() for t in bob.tag_pieces_of(4, 8)]),
    ]
    leader = _leader(engine, world, tmp_path)
    errors = _send(leader, parts, [0] * 5 + [1] * 4)
    assert len(errors) == 1 and isinstance(errors[0], TagPartsError)
    assert "parts 0 and 1 of 'bob'" in str(errors[0]) and "shard 4" in str(errors[0])
    assert leader.spoolers[("bob", 1)].written[4] == 0  # part 1 wrote nothing of it
    assert leader.spoolers[("bob", 0)].written[4] == bob.sizes[4]  # (the file may be matched and removed by now)
    with pytest.raises(AgreementError, match="shard 4"):  # the agreement failed for every party
        leader.agree()
    leader.cleanup()


def test_parts_whose_rows_overlap_are_refused_as_they_arrive(
    engine: InlineEngine, world: World, bob: ShardedTable, tmp_path: Path
) -> None:
    offsets = bob.row_offsets
    parts = _parts(bob, [(0, 4), (4, 8)])
    parts[1] = (TagPart(1, 2, int(offsets[4]) - 1), parts[1][1])  # its first tag names part 0's last row
    leader = _leader(engine, world, tmp_path)
    errors = _send(leader, parts, _one_after_another_last_first(parts))
    assert len(errors) == 1 and isinstance(errors[0], TagPartsError)
    assert f"both name row {int(offsets[4]) - 1}" in str(errors[0])
    with pytest.raises(AgreementError, match="both name row"):
        leader.agree()
    leader.cleanup()


@pytest.mark.parametrize(("shifts", "message"), [((0, 5), "part 1 of 'bob'.* starts at row"), ((3, 3), "not at row 0")])
def test_parts_that_leave_a_gap_are_refused_when_the_last_one_ends(
    engine: InlineEngine, world: World, bob: ShardedTable, tmp_path: Path, shifts: tuple[int, int], message: str
) -> None:
    parts = [(TagPart(p.index, p.count, p.first_row + shift), own)
             for (p, own), shift in zip(_parts(bob, [(0, 4), (4, 8)]), shifts, strict=True)]  # fmt: skip
    leader = _leader(engine, world, tmp_path)
    errors = _send(leader, parts, _round_robin_from_last(parts))
    assert len(errors) == 1 and isinstance(errors[0], TagPartsError)
    assert "bob" not in leader.tags  # never recorded
    with pytest.raises(AgreementError, match=message):
        leader.agree()
    leader.cleanup()


def test_a_new_part_count_starts_the_parts_afresh(
    engine: InlineEngine, world: World, bob: ShardedTable, one_stream: OneStream, tmp_path: Path
) -> None:
    """A follower that sent 2 parts (one of them cut short) and then sends 3: the files of the
    first set are removed, and the 3 parts alone give the rows."""
    leader = _leader(engine, world, tmp_path)
    two = _parts(bob, shard_runs(bob.row_offsets, 2))
    assert _send(leader, [two[0], (two[1][0], two[1][1][:1])], [0] * len(two[0][1]) + [1]) == []
    three = _parts(bob, shard_runs(bob.row_offsets, 3))
    assert _send(leader, three, _round_robin_from_last(three)) == []
    assert leader.generation >= 1
    assert _outcome(leader) == (one_stream.count, one_stream.rows, one_stream.own)
    leader.cleanup()


# ------------------------------------------------------------------------------------ the spool, removed as matched
def _wait_matched(leader: ClusterLeader, units: int) -> None:
    with leader.cond:
        assert leader.cond.wait_for(lambda: len(leader.results) >= units or leader.error is not None, 30.0)


def _spooled(leader: ClusterLeader, curator: str = "bob") -> set[int]:
    return {int(p.name.split("-")[1].split(".")[0]) for p in leader.spool.glob(f"{curator}-*.tags")}


def test_a_match_never_reads_fewer_spooled_tags_than_arrived(bob: ShardedTable, tmp_path: Path) -> None:
    """A worker reads a unit's run of the spool (or, filtered by unit, all a part wrote); once a
    shard's files are removed, a match redone there (a worker lost) is a SpoolError, never a
    match against no tags."""
    tags = np.concatenate(list(bob.tag_pieces_of(0, 1))).astype(TAG_DTYPE)
    rows = np.arange(5, 5 + tags.size, dtype="<u4")
    path = tmp_path / "bob-00000"
    Path(f"{path}.tags").write_bytes(tags.tobytes())
    Path(f"{path}.rows").write_bytes(rows.tobytes())
    got_tags, got_rows = SpoolRange(str(path), 2, 7).read()
    assert got_tags.tobytes() == tags[2:7].tobytes() and np.array_equal(got_rows, rows[2:7])
    unit = int(sh.top_bits(sh.tag_words(tags)[0], SHARD_BITS + 2)[-1])
    in_unit, _ = SpoolRange(str(path), 0, tags.size, unit, SHARD_BITS + 2).read()
    assert 0 < in_unit.size < tags.size and in_unit.tobytes() == tags[-in_unit.size :].tobytes()
    Path(f"{path}.tags").unlink()
    Path(f"{path}.rows").unlink()
    assert SpoolRange(str(path), 0, 0).read()[0].size == 0  # a unit no part sent a tag of
    with pytest.raises(SpoolError, match="holds 0 of the 5 tags a match needs"):
        SpoolRange(str(path), 2, 7).read()


def test_a_shard_is_removed_from_the_spool_once_matched_and_the_rows_are_those_of_one_stream(
    engine: InlineEngine, world: World, bob: ShardedTable, one_stream: OneStream, tmp_path: Path
) -> None:
    """One ascending stream: once it is past shard 3, shards 0-2 are matched and their spool
    files gone (the spool holds what is not matched yet, not every tag), and the agreement and
    rows are still those of one stream."""
    leader = _leader(engine, world, tmp_path)
    seen: list[set[int]] = []

    def pieces() -> Iterator[bytes]:
        yield from (t.tobytes() for t in bob.tag_pieces_of(0, 4))
        _wait_matched(leader, 3 << 2)  # 4 units a shard
        seen.append(_spooled(leader))
        yield from (t.tobytes() for t in bob.tag_pieces_of(4, 1 << SHARD_BITS))

    assert leader.add_tag_stream("bob", pieces(), 4, leader.alignment) == bob.num_rows
    assert seen[0] <= {3} and {0, 1, 2}.isdisjoint(seen[0])
    assert {s: leader.removed[s]["bob"] for s in range(3)} == {s: int(bob.sizes[s]) for s in range(3)}
    assert _outcome(leader) == (one_stream.count, one_stream.rows, one_stream.own)
    leader.cleanup()


def test_a_later_parts_shards_are_matched_and_removed_before_an_earlier_part_arrives(
    engine: InlineEngine, world: World, bob: ShardedTable, one_stream: OneStream, tmp_path: Path
) -> None:
    """Concurrent parts complete units in different places: the units of part 1 (shards 4-7)
    are matched, and their spool removed, while part 0 has not sent a tag (matched in order
    they would wait in the spool for all of part 0)."""
    (first, first_pieces), (second, second_pieces) = _parts(bob, [(0, 4), (4, 8)])
    leader = _leader(engine, world, tmp_path)
    assert leader.add_tag_stream("bob", second_pieces, 4, leader.alignment, second) > 0
    _wait_matched(leader, 4 << 2)
    assert set(leader.results) == set(range(4 << 2, 8 << 2)) and not _spooled(leader)
    assert leader.add_tag_stream("bob", first_pieces, 4, leader.alignment, first) > 0
    assert _outcome(leader) == (one_stream.count, one_stream.rows, one_stream.own)
    leader.cleanup()


def test_a_shard_matched_while_no_part_held_it_is_matched_again_once_a_part_claims_it(
    engine: InlineEngine, world: World, bob: ShardedTable, one_stream: OneStream, tmp_path: Path
) -> None:
    """Two parts end, the second cut short: shards no part held are matched against none of
    bob's tags. The same tags then come in 3 parts, which claim those shards: they are matched
    again, and the rows are those of one stream (not of the empty matches kept)."""
    leader = _leader(engine, world, tmp_path)
    two = _parts(bob, shard_runs(bob.row_offsets, 2))
    assert _send(leader, [two[0], (two[1][0], two[1][1][:1])], [0] * len(two[0][1]) + [1]) == []
    _wait_matched(leader, leader.num_units)  # all of them, the unheld shards against nothing
    unheld = set(range(1 << SHARD_BITS)) - set(leader.owners["bob"])
    assert unheld
    three = _parts(bob, shard_runs(bob.row_offsets, 3))
    assert _send(leader, three, _round_robin_from_last(three)) == []
    assert _outcome(leader) == (one_stream.count, one_stream.rows, one_stream.own)
    leader.cleanup()


def test_a_resend_that_needs_another_followers_removed_tags_fails_the_agreement(
    engine: InlineEngine, world: World, bob: ShardedTable, tmp_path: Path
) -> None:
    """Three curators (carol sends bob's tags): once every shard is matched and removed, bob's
    stream sent again would need carol's tags of its shards again: a named failure for every
    party, not a silent match against nothing."""
    leader = ClusterLeader("r1", ("alice", "bob", "carol"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                           seed=Seed(bytes(32)))  # fmt: skip
    alice = _table(engine, world, "alice")
    leader.attach(alice, tmp_path)
    leader.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), alice.alphabet_size)
    pieces = [t.tobytes() for t in bob.tag_pieces()]
    for curator in ("bob", "carol"):
        assert leader.add_tag_stream(curator, pieces, 4, leader.alignment) == bob.num_rows
    _wait_matched(leader, leader.num_units)
    with pytest.raises(TagPartsError, match=r"'bob'.s tags of shard\(s\) \[0, 1, .*were sent again after"):
        leader.add_tag_stream("bob", pieces, 4, leader.alignment)
    with pytest.raises(AgreementError, match="start the release again"):
        leader.agree()
    leader.cleanup()


def test_a_part_that_stops_ascending_after_its_tags_were_removed_fails_the_agreement(
    engine: InlineEngine, world: World, bob: ShardedTable, tmp_path: Path
) -> None:
    leader = _leader(engine, world, tmp_path)
    first = [t.tobytes() for t in bob.tag_pieces_of(0, 4)]

    def pieces() -> Iterator[bytes]:
        yield from first
        _wait_matched(leader, 3 << 2)
        yield first[0]  # shard 0 again: not ascending, into a shard already matched and removed

    with pytest.raises(TagPartsError, match=r"shard\(s\) \[0, 1, 2\] no longer ascend"):
        leader.add_tag_stream("bob", pieces(), 4, leader.alignment)
    with pytest.raises(AgreementError, match="no longer ascend"):
        leader.agree()
    leader.cleanup()


# ------------------------------------------------------------------------------------ the in-process leader
def _local_leader(alice: ShardedTable) -> LeaderState:
    leader = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                         seed=Seed(bytes(32)))  # fmt: skip
    leader.add_tags("alice", np.concatenate(list(alice.tag_pieces())), alice.alphabet_size)
    return leader


@pytest.mark.parametrize("streams", [2, 3, 20])
def test_a_local_leader_joins_the_parts_into_the_rows_of_one_stream(
    engine: InlineEngine, world: World, bob: ShardedTable, streams: int
) -> None:
    alice = _table(engine, world, "alice")
    reference = _local_leader(alice)
    reference.add_tag_stream("bob", [t.tobytes() for t in bob.tag_pieces()], 4, reference.alignment)
    expected = reference.agree()
    leader = _local_leader(alice)
    parts = _parts(bob, shard_runs(bob.row_offsets, streams))
    assert _send(leader, parts, _round_robin_from_last(parts)) == []
    got = leader.agree()
    assert got.num_common == expected.num_common and np.array_equal(got.base.common, expected.base.common)
    assert leader.rows["bob"].tobytes() == reference.rows["bob"].tobytes()
    assert leader.tag_digests() == reference.tag_digests()  # the joined tags are the one stream's
    assert "bob" not in leader.parts  # joined: no copy of the parts is kept


def test_a_local_leader_refuses_parts_that_overlap_or_leave_a_gap(engine: InlineEngine, bob: ShardedTable) -> None:
    offsets = bob.row_offsets
    for first_row, message in ((int(offsets[4]) + 2, "starts at row"), (int(offsets[4]) - 2, "both name row")):
        leader = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",))
        parts = _parts(bob, [(0, 4), (4, 8)])
        parts[1] = (TagPart(1, 2, first_row), parts[1][1])
        errors = _send(leader, parts, _one_after_another_last_first(parts))
        assert len(errors) == 1 and isinstance(errors[0], TagPartsError) and message in str(errors[0])
        assert leader.error is not None and message in leader.error and "bob" not in leader.tags


def test_a_local_leader_takes_a_resend_of_every_part_as_a_new_set(
    engine: InlineEngine, world: World, bob: ShardedTable
) -> None:
    alice = _table(engine, world, "alice")
    leader = _local_leader(alice)
    parts = _parts(bob, shard_runs(bob.row_offsets, 3))
    assert _send(leader, parts, _round_robin_from_last(parts)) == []
    first = leader.agree()
    digests = leader.tag_digests()
    assert _send(leader, parts, _one_after_another_last_first(parts)) == []  # the same parts after the fix: a no-op
    assert leader.agreement is first and leader.tag_digests() == digests
    shorter = [*parts[:2], (parts[2][0], parts[2][1][:-1])]
    errors = _send(leader, shorter, _round_robin_from_last(shorter))
    assert len(errors) == 1 and isinstance(errors[0], AgreementFixedError)


# ------------------------------------------------------------------------------------ the wire
def _tags(count: int) -> np.ndarray:
    tags = np.zeros(count, dtype=TAG_DTYPE)
    tags["hi"] = np.arange(count, dtype=np.uint64)
    return tags


def test_a_whole_stream_is_sent_and_read_as_before_parts() -> None:
    """Old clients: no part field on the wire, and a stream without them is the whole tags."""
    chunks = list(tag_chunks("r1", "bob", _tags(70000), 4))
    assert len(chunks) == 2
    assert all({f.name for f, _ in c.ListFields()}.isdisjoint({"part", "parts", "first_row"}) for c in chunks)
    old = pb.TagChunk(release_id="r1", curator="bob", sequence=0, tags=_tags(3).tobytes(), last=True, alphabet_size=4)
    stream = TagStream([old], "bob", lambda _r: 1 << 20)
    assert b"".join(stream.pieces()) == _tags(3).tobytes() and stream.part == WHOLE_STREAM and stream.part.whole


def test_a_part_travels_on_every_chunk_of_its_stream() -> None:
    part = TagPart(2, 3, 1000)
    chunks = list(tag_chunks("r1", "bob", _tags(70000), 4, part=part))
    assert [(c.part, c.parts, c.first_row) for c in chunks] == [(2, 3, 1000)] * 2
    stream = TagStream(chunks, "bob", lambda _r: 1 << 30)
    assert len(b"".join(stream.pieces())) == 70000 * TAG_BYTES and stream.part == part


def _chunk(**fields: Any) -> pb.TagChunk:
    return pb.TagChunk(**{"release_id": "r1", "curator": "bob", "alphabet_size": 4, "last": True, **fields})


@pytest.mark.parametrize(
    ("chunks", "error", "message"),
    [
        ([_chunk(part=3, parts=3)], TagStreamError, "numbered 0 to 2"),
        ([_chunk(part=0, parts=MAX_TAG_PARTS + 1)], TagStreamError, f"at most {MAX_TAG_PARTS} parts"),
        ([_chunk(first_row=5)], TagStreamError, "part 0 from row 0"),
        ([_chunk(part=1, parts=0)], TagStreamError, "part 0 from row 0"),
        ([_chunk(part=0, parts=2, last=False), _chunk(sequence=1, part=1, parts=2)], TagStreamError, "one part"),
        ([_chunk(part=1, parts=2, first_row=99, tags=_tags(2).tobytes())], TagLimitError, "more than 100 tags.*part 1"),
        ([_chunk(last=False, tags=_tags(2).tobytes())], TagStreamError, "before its last chunk"),
    ],
)
def test_a_tag_stream_refuses_a_part_it_cannot_be(chunks: list[pb.TagChunk], error: type, message: str) -> None:
    stream = TagStream(chunks, "bob", lambda _r: 100 * TAG_BYTES)
    with pytest.raises(error, match=message):
        b"".join(stream.pieces())


def test_a_part_within_the_row_bound_is_taken() -> None:
    chunk = _chunk(part=1, parts=2, first_row=98, tags=_tags(2).tobytes())
    stream = TagStream([chunk], "bob", lambda _r: 100 * TAG_BYTES)
    assert len(b"".join(stream.pieces())) == 2 * TAG_BYTES


# ------------------------------------------------------------------------------------ the flag
def _run_config(tmp_path: Path, *extra: str) -> Any:
    (tmp_path / "align.key").write_text("ab" * 32)
    for name in ("bob.csv", "bob.json"):
        (tmp_path / name).write_text("")
    argv = ["--data", str(tmp_path / "bob.csv"), "--schema", str(tmp_path / "bob.json"), "--release-id", "r1",
            "--epsilon", "0.5", "--server", "127.0.0.1:7000", "--name", "bob", "--curators", "alice,bob",
            "--leader-address", "127.0.0.1:7101", "--insecure", "--alignment-key-file", str(tmp_path / "align.key"),
            *extra]  # fmt: skip
    parser = build_parser()
    apply_env_and_config(subcommand_parser(parser, "run"), argv)
    return config_from_args(parser.parse_args(["run", *argv]))


def test_tag_streams_is_one_a_worker_by_default_and_one_stream_on_the_local_engine(tmp_path: Path) -> None:
    assert _run_config(tmp_path).tag_streams == 0
    assert _run_config(tmp_path, "--engine", "dask").tag_streams == 0
    assert _run_config(tmp_path, "--engine", "dask", "--tag-streams", "3").tag_streams == 3
    assert _run_config(tmp_path, "--tag-streams", "1").tag_streams == 1
    with pytest.raises(ConfigError, match="--tag-streams 2 needs --engine dask"):
        _run_config(tmp_path, "--tag-streams", "2")
    for bad in ("-1", str(MAX_TAG_PARTS + 1)):
        with pytest.raises(ConfigError, match=f"from 0 .* to {MAX_TAG_PARTS}"):
            _run_config(tmp_path, "--engine", "dask", "--tag-streams", bad)
