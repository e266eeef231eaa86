"""The sharded release path (``--engine dask``'s stages) against the in-process one, exactly.

Everything here runs on the in-process engine (the same stage functions a Dask worker runs);
tests/integration/test_cluster_engine.py runs them on a real cluster."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import split_parquet

from secure_release.curator.cluster import shards as st
from secure_release.curator.cluster.engine import InlineEngine
from secure_release.curator.cluster.matching import ClusterLeader
from secure_release.curator.cluster.sharded import load_sharded
from secure_release.curator.leader import LeaderState
from secure_release.curator.table import BadRowsError, load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import TagStream, tag_chunks
from secure_release.mechanism.alignment import sharding as sh
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, align_all, id_tags
from secure_release.mechanism.primitives.keys import AlignmentKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.architectures import agreement_positions

KEY = AlignmentKey(bytes(range(32)))
LOG = EventLog("curator", "test")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sharded")
    write_demo_data(root, rows=5000, seed=11)
    return root


def test_shard_bits_give_at_most_four_million_tags_a_shard() -> None:
    assert sh.shard_bits_for(1) == 0 and sh.shard_bits_for(1 << 22) == 0
    assert sh.shard_bits_for((1 << 22) + 1) == 1
    assert sh.shard_bits_for(10**8) == 5 and sh.shard_bits_for(10**9) == 8  # 3.0 M and 3.7 M a shard


def test_merge_sorts_a_shard_ascending_and_names_repeated_tags() -> None:
    tags = id_tags(np.array([f"id{i}" for i in range(3000)]), KEY)
    pieces = sh.split_by_shard(tags, 3, np.arange(3000, dtype=np.uint32))
    assert sum(p.tags.size for p in pieces) == 3000
    merged = [st.merge_shard([p]) for p in pieces]
    joined = np.concatenate([m.tags for m in merged])
    assert np.array_equal(joined, np.sort(tags))  # shard order then tag order = ascending (hi, lo)
    assert all(m.repeated.size == 0 for m in merged)
    symbols = np.concatenate([m.symbols for m in merged])
    assert np.array_equal(tags[symbols], joined)  # each symbol stayed with its tag
    doubled = st.merge_shard([pieces[0], pieces[0]])
    assert np.array_equal(np.sort(doubled.repeated), np.sort(pieces[0].tags))


def test_what_a_worker_holds_counts_its_arrays_for_dask() -> None:
    """Dask sizes a task's result with its own ``sizeof`` (``sys.getsizeof`` for a type it does
    not know): a piece, a partition's pieces, a shard, a match and a sample run each count the
    bytes of their arrays (before: 56 bytes each, so a worker's memory looked "unmanaged")."""
    from dask.sizeof import sizeof

    from secure_release.curator.cluster.sample import KeptRun

    tags = id_tags(np.array([f"id{i}" for i in range(30000)]), KEY)
    pieces = sh.split_by_shard(tags, 3, np.arange(30000, dtype=np.uint32))
    arrays = sum(p.tags.nbytes + p.symbols.nbytes for p in pieces)
    assert arrays == 30000 * (16 + 4)
    assert sizeof(pieces[0]) >= pieces[0].tags.nbytes + pieces[0].symbols.nbytes
    result = st.PartitionResult(pieces, 30000)
    assert arrays <= sizeof(result) <= arrays + 4096
    shard = st.merge_shard(list(pieces))
    assert sizeof(shard) >= shard.tags.nbytes + shard.symbols.nbytes + shard.repeated.nbytes
    rows = np.arange(1000, dtype=np.uint32)
    match = st.Match(np.zeros(1000, dtype=np.uint8), (rows, rows))
    assert sizeof(match) >= 1000 + 2 * 4000
    keys = np.arange(500, dtype=np.uint64)
    assert sizeof(KeptRun((keys, keys), (rows, rows))) >= 2 * 4000 + 2 * 4000


def test_a_piece_of_a_partition_read_back_from_disk_holds_only_its_own_bytes() -> None:
    """Dask reads a spilled object back into one writable buffer and its arrays are views into
    it: the piece a task hands on is an owned copy (else it keeps every piece of its partition
    alive), and so is a key range of a sample run; an array that owns its memory is not copied."""
    from distributed.protocol import deserialize_bytes, serialize_bytes

    from secure_release.curator.cluster.sample import KeptRun, kept_part

    tags = id_tags(np.array([f"id{i}" for i in range(30000)]), KEY)
    pieces = sh.split_by_shard(tags, 3, np.arange(30000, dtype=np.uint32))
    back = deserialize_bytes(bytearray(serialize_bytes(st.PartitionResult(pieces, 30000))))
    viewed = back.pieces[2].tags
    while isinstance(viewed.base, np.ndarray):
        viewed = viewed.base
    assert isinstance(viewed.base, memoryview) and viewed.base.obj.__len__() > 5 * back.pieces[2].tags.nbytes
    piece = st.piece_of(back, 2)
    assert piece.tags.base is None and piece.symbols.base is None
    assert np.array_equal(piece.tags, pieces[2].tags) and np.array_equal(piece.symbols, pieces[2].symbols)
    fresh = np.arange(10, dtype=np.uint64)
    whole_view = fresh.view(np.int64)
    assert sh.owned(fresh) is fresh and sh.owned(whole_view) is whole_view  # a view of all of it: not copied
    assert sh.owned(fresh[2:5]).base is None
    keys = np.arange(4000, dtype=np.uint64)
    run = deserialize_bytes(bytearray(serialize_bytes(KeptRun((keys[:2000], keys[2000:]), (keys[:2000], keys[2000:])))))
    got_keys, got_symbols = kept_part(run, 1)
    assert got_keys.base is None and got_symbols.base is None and np.array_equal(got_keys, keys[2000:])


@pytest.mark.parametrize("shard_bits", [0, 2, 5])
def test_intersection_by_shard_gives_the_rows_align_all_gives(shard_bits: int) -> None:
    rng = np.random.default_rng(5)
    own_ids = np.array([f"p{i}" for i in rng.permutation(4000)[:3000]])
    other_ids = np.array([f"p{i}" for i in rng.permutation(4000)[:3200]])
    own_tags, other_tags = id_tags(own_ids, KEY), id_tags(other_ids, KEY)
    common, (own_align, other_align) = align_all([own_tags, other_tags])
    own_shards = [
        st.merge_shard([p]) for p in sh.split_by_shard(own_tags, shard_bits, np.arange(3000, dtype=np.uint32))
    ]
    shard = sh.shard_of(other_tags, shard_bits)
    got_own, got_other = [], []
    for s, own in enumerate(own_shards):
        mine = np.flatnonzero(shard == s)
        own_rows, (other_rows,) = sh.intersect_shard(own, [(other_tags[mine], mine)])
        got_own.append(own.symbols[own_rows])  # symbols = original row numbers here
        got_other.append(other_rows)
    assert np.array_equal(np.concatenate(got_own), own_align.row_order)
    assert np.array_equal(np.concatenate(got_other), other_align.row_order)
    assert sum(map(len, got_own)) == common.size


def test_a_tag_sent_twice_is_refused_at_the_intersection() -> None:
    tags = id_tags(np.array(["a", "b"]), KEY)
    own = st.merge_shard(sh.split_by_shard(tags, 0, np.zeros(2, dtype=np.uint32)))
    with pytest.raises(sh.ShardError, match="twice"):
        sh.intersect_shard(own, [(np.concatenate([tags, tags[:1]]), np.arange(3))])


@pytest.mark.parametrize("bits", [0, 1, 3, 6])
def test_a_units_run_is_the_rows_whose_top_bits_are_the_unit(bits: int) -> None:
    """Exact, for every unit (the last one included: its end is the shard's), and for tags whose
    high words sit on the units' edges."""
    rng = np.random.default_rng(5)
    tags = np.zeros(3000, dtype=sh.WORK_DTYPE)
    tags["hi"] = rng.integers(0, 1 << 63, 3000, dtype=np.uint64) << np.uint64(1)
    if bits:  # tags on each unit's first and last high word
        edges = np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
        tags["hi"][: 1 << bits] = edges
        tags["hi"][1 << bits : 2 << bits] = edges + ((np.uint64(1) << np.uint64(64 - bits)) - np.uint64(1))
    tags["lo"] = rng.integers(0, 1 << 63, 3000, dtype=np.uint64)
    tags = np.sort(tags, order=["hi", "lo"])
    top = sh.top_bits(tags["hi"], bits)
    for unit in range(1 << bits):
        start, stop = sh.unit_run(tags, unit, bits)
        assert np.array_equal(np.arange(start, stop), np.flatnonzero(top == unit))
        assert sh.within_unit(tags[start:stop], unit, bits)
        assert sh.within_unit(tags[:0], unit, bits)  # no tags: none outside
        assert stop - start == tags.size or not sh.within_unit(tags, unit, bits)


def test_a_units_match_searches_only_its_run_and_matches_as_the_whole_shard() -> None:
    """match_shard with the unit gives the Match of the whole shard, unit by unit (the leader's
    symbols and the follower's rows, in order); a follower tag outside the unit is refused."""
    own_tags = id_tags(np.array([f"p{i}" for i in range(6000)]), KEY)
    shard = st.merge_shard(sh.split_by_shard(own_tags, 0, np.arange(6000, dtype=np.uint32) % 7)[:1])
    rng = np.random.default_rng(9)
    theirs = id_tags(np.array([f"p{i}" for i in rng.permutation(9000)[:5000]]), KEY)  # ids beyond 6000 too
    theirs = np.sort(theirs.astype(sh.WORK_DTYPE), order=["hi", "lo"]).astype(TAG_DTYPE)
    rows = np.arange(theirs.size, dtype=np.int64) + 11
    bits = 2
    top = sh.top_bits(sh.tag_words(theirs)[0], bits)
    whole = st.match_shard(shard, [(theirs, rows)], "uint8")
    parts = []
    for unit in range(1 << bits):
        mine = np.flatnonzero(top == unit)
        parts.append(st.match_shard(shard, [(theirs[mine], rows[mine])], "uint8", (unit, bits)))
    assert sum(p.own_symbols.size for p in parts) == whole.own_symbols.size > 2000
    assert np.array_equal(np.concatenate([p.own_symbols for p in parts]), whole.own_symbols)
    assert np.array_equal(np.concatenate([p.follower_rows[0] for p in parts]), whole.follower_rows[0])
    with pytest.raises(sh.ShardError, match="outside"):
        st.match_shard(shard, [(theirs[top == 1][:5], rows[:5])], "uint8", (0, bits))


def _leader(curators: tuple[str, ...] = ("alice", "bob")) -> ClusterLeader:
    return ClusterLeader("r1", curators, None, 1.0, None, CipherMode.CHACHA20, ("researcher",), seed=Seed(bytes(32)))


def _bob_streams_to_alice_and_both_align_as_in_process(
    tables: dict[str, Any], spool: Path, n: int, expected: dict[str, np.ndarray]
) -> None:
    """Alice leads on her sharded table (spooling under ``spool``), bob's tags stream to her in
    one ascending stream: the agreement's n and both aligned columns at the seed's positions are
    the in-process path's (``expected``); the leader is cleaned up after."""
    leader = _leader()
    leader.attach(tables["alice"], spool)
    leader.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), tables["alice"].alphabet_size)
    stream = TagStream(
        tag_chunks("r1", "bob", tables["bob"].tag_pieces(), tables["bob"].alphabet_size), "bob", lambda _r: 1 << 40
    )
    stream.start()
    sent = leader.add_tag_stream("bob", stream.pieces(), stream.alphabet_size, stream.alignment)
    assert sent == tables["bob"].num_rows
    agreement = leader.agree()
    assert agreement.num_common == n
    positions = agreement_positions(agreement)
    rows = leader.rows_of("bob")
    assert np.array_equal(tables["bob"].aligned_symbols(rows[0 : rows.size].astype(np.int64))[positions],
                          expected["bob"])  # fmt: skip
    assert np.array_equal(leader.own_aligned()[positions], expected["alice"])
    leader.cleanup()


def _local_aligned(root: Path, seed: Seed) -> tuple[int, dict[str, np.ndarray]]:
    """n and each curator's sample by the in-process path (read_table, align_all, the seed)."""
    tables = {c: read_table(root / f"{c}.csv", load_schema(root / f"{c}.json")) for c in ("alice", "bob")}
    leader = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",), seed=seed)
    for c, t in tables.items():
        leader.add_tags(c, id_tags(t.id_values(), KEY), t.schema.alphabet_size)
    agreement = leader.agree()
    positions = agreement_positions(agreement)
    return agreement.num_common, {c: t.symbols()[leader.rows[c][positions]] for c, t in tables.items()}


def test_a_two_level_shuffle_gives_the_shards_of_one_level(world: Path, tmp_path: Path) -> None:
    """Groups first, then the group's shards (7 partitions: batches of 4 and 3, and of 2 for
    one group bit): every shard the same rows, tags and symbols as the one-level shuffle, for
    every number of group bits; the default takes two levels only past TWO_LEVEL_PIECES."""
    assert sh.group_bits_for(64, 5) == 0 and sh.group_bits_for(96, 7) == 3 and sh.group_bits_for(320, 8) == 4
    assert sh.group_bits_for(10_000, 1) == 0  # one shard bit: nothing to split in two
    data = str(split_parquet(world / "alice.csv", tmp_path / "alice", 7, groups=1))
    schema = load_schema(world / "alice.json")
    engine = InlineEngine(2)
    try:

        def shards(group_bits: int) -> list[sh.Shard]:
            table = load_sharded(engine, data, schema, KEY, LOG, shard_bits=4, group_bits=group_bits)
            return [engine.result(h) for h in table.shards]

        one = shards(0)
        assert sum(s.size for s in one) == 5005 and all(s.size for s in one)  # the demo table: 5005 rows
        for groups in (1, 2, 4):
            two = shards(groups)
            assert len(two) == 16
            for a, b in zip(one, two, strict=True):
                assert np.array_equal(a.tags, b.tags) and np.array_equal(a.symbols, b.symbols)
                assert a.repeated.size == b.repeated.size == 0
        with pytest.raises(sh.ShardError, match="between 0 and"):
            load_sharded(engine, data, schema, KEY, LOG, shard_bits=4, group_bits=5)
    finally:
        engine.close()


def test_tags_left_in_the_handoff_directory_are_the_tags_sent_and_are_removed(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedded cluster's workers leave each tag slice as a file for the curator process
    (``Engine.handoff``) rather than send it over TLS: the same tags, in the same slices, and
    nothing left behind once they are read."""
    data = str(split_parquet(world / "bob.csv", tmp_path / "bob", 3))
    engine = InlineEngine(2)
    written: list[str] = []
    original = st.shard_tag_slice_to

    def spy(shard: sh.Shard, start: int, stop: int, path: str) -> str:
        written.append(path)
        return original(shard, start, stop, path)

    try:
        table = load_sharded(engine, data, load_schema(world / "bob.json"), KEY, LOG, shard_bits=3)
        sent = [t.copy() for t in table.tag_pieces()]
        engine.handoff = tmp_path / "handoff"
        engine.handoff.mkdir()
        monkeypatch.setattr(st, "shard_tag_slice_to", spy)
        left = list(table.tag_pieces_of(0, 8))
        assert len(written) == len(sent) and all(Path(p).parent == engine.handoff for p in written)
        assert [t.dtype for t in left] == [TAG_DTYPE] * len(sent)
        assert len(left) == len(sent) and all(np.array_equal(a, b) for a, b in zip(left, sent, strict=True))
        assert sum(t.size for t in left) == table.num_rows
        assert not list(engine.handoff.iterdir())
    finally:
        engine.close()


@pytest.mark.parametrize("stored", [False, True], ids=["held", "stored"])
@pytest.mark.parametrize("files", [1, 7, 64])
def test_the_sharded_release_samples_the_same_rows_as_the_in_process_one(
    world: Path, tmp_path: Path, files: int, stored: bool
) -> None:
    """Held by the workers or stored as files (ids, not tags: the tags recomputed where read),
    the same aligned columns as the in-process path; the store is gone once the tables close."""
    n, expected = _local_aligned(world, Seed(bytes(32)))
    engine = InlineEngine(2)
    store = tmp_path / "store"
    store.mkdir()
    try:
        tables = {
            c: load_sharded(
                engine,
                str(split_parquet(world / f"{c}.csv", tmp_path / c, files, groups=3)),
                load_schema(world / f"{c}.json"),
                KEY,
                LOG,
                shard_bits=3,
                store_parent=store if stored else None,
                store_name=c,
            )
            for c in ("alice", "bob")
        }
        assert [t.store is not None for t in tables.values()] == [stored, stored]
        _bob_streams_to_alice_and_both_align_as_in_process(tables, tmp_path, n, expected)
        assert not list(tmp_path.glob("spool-*"))
        tables["bob"].close()
        assert not list(store.iterdir())  # alice's store went when the leader had matched
    finally:
        engine.close()


@pytest.mark.parametrize("stored", [False, True], ids=["held", "stored"])
def test_bad_rows_in_any_partition_refuse_the_table_naming_the_file(world: Path, tmp_path: Path, stored: bool) -> None:
    folder = split_parquet(world / "alice.csv", tmp_path / "alice", 4)
    bad = pq.read_table(folder / "part-002.parquet").to_pylist()
    bad[5]["education"] = "astronaut"
    pq.write_table(pa.Table.from_pylist(bad), folder / "part-002.parquet")
    engine = InlineEngine(2)
    store = tmp_path / "store"
    store.mkdir()
    try:
        with pytest.raises(BadRowsError, match=r"part-002\.parquet.*astronaut") as info:
            load_sharded(engine, str(folder), load_schema(world / "alice.json"), KEY, LOG,
                         store_parent=store if stored else None)  # fmt: skip
        assert [line for line, _ in info.value.problems] == [7]  # row 5 of the file: line 7 (header is line 1)
        assert not list(store.iterdir())  # nothing of the refused table is left
    finally:
        engine.close()


@pytest.mark.parametrize("stored", [False, True], ids=["held", "stored"])
def test_an_id_repeated_across_files_is_refused_with_both_places(world: Path, tmp_path: Path, stored: bool) -> None:
    folder = split_parquet(world / "alice.csv", tmp_path / "alice", 3)
    first = pq.read_table(folder / "part-000.parquet").to_pylist()
    last = pq.read_table(folder / "part-002.parquet").to_pylist()
    last[0]["id"] = first[4]["id"]
    pq.write_table(pa.Table.from_pylist(last), folder / "part-002.parquet")
    engine = InlineEngine(2)
    store = tmp_path / "store"
    store.mkdir()
    try:
        with pytest.raises(
            BadRowsError, match=r"part-002\.parquet: repeated id \(first at .*part-000\.parquet line 6\)"
        ):
            load_sharded(engine, str(folder), load_schema(world / "alice.json"), KEY, LOG,
                         store_parent=store if stored else None)  # fmt: skip
        assert not list(store.iterdir())
    finally:
        engine.close()


def test_tags_whose_high_words_tie_are_ordered_and_matched_by_their_low_words() -> None:
    """Exact even when 64-bit high words collide (rare with real tags, forced here)."""
    rng = np.random.default_rng(3)
    tags = np.zeros(2000, dtype=TAG_DTYPE)
    tags["hi"] = rng.integers(0, 40, 2000).astype(np.uint64) << np.uint64(58)  # many equal high words
    tags["lo"] = rng.permutation(2000).astype(np.uint64)
    shard = st.merge_shard(sh.split_by_shard(tags, 0, np.arange(2000, dtype=np.uint32)))
    pairs = [(int(h), int(lo)) for h, lo in zip(shard.tags["hi"], shard.tags["lo"], strict=True)]
    assert pairs == sorted(pairs) and shard.repeated.size == 0
    pick = rng.permutation(2000)[:700]
    own_rows, (their_rows,) = sh.intersect_shard(shard, [(tags[pick], np.arange(700))])
    assert own_rows.size == 700
    assert np.array_equal(shard.tags[own_rows], tags[pick][their_rows])


def test_progress_lines_read_as_a_bar_with_counts() -> None:
    from secure_release.curator.cluster.engine import progress_note

    assert progress_note("read", 7, 16, 3.21) == (
        "read     [#########-----------] 7/16 partitions read, checked and hashed, 3.2 s"
    )
    assert progress_note("shuffle", 4, 4, 1.0).startswith("shuffle  [####################] 4/4 shards sorted")


def test_a_leader_on_a_cluster_compares_a_late_resend_and_never_spools_it(world: Path, tmp_path: Path) -> None:
    from secure_release.curator.errors import AgreementFixedError, AgreementNotReadyError

    engine = InlineEngine(2)
    try:
        tables = {
            c: load_sharded(engine, str(split_parquet(world / f"{c}.csv", tmp_path / c, 2)),
                            load_schema(world / f"{c}.json"), KEY, LOG)
            for c in ("alice", "bob")
        }  # fmt: skip
        leader = _leader()
        leader.attach(tables["alice"], tmp_path)
        leader.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), tables["alice"].alphabet_size)
        bob = [t.tobytes() for t in tables["bob"].tag_pieces()]
        started, go_on = threading.Event(), threading.Event()

        def arriving() -> Iterator[bytes]:
            yield bob[0]
            started.set()
            go_on.wait(10.0)
            yield from bob[1:]

        first = threading.Thread(target=leader.add_tag_stream, args=("bob", arriving(), 4, leader.alignment))
        first.start()
        assert started.wait(10.0)  # a stream of bob's is arriving: a second one waits its turn
        with pytest.raises(AgreementNotReadyError, match="already sending"):
            leader.add_tag_stream("bob", bob, 4, leader.alignment)
        go_on.set()
        first.join(10.0)
        leader.add_tag_stream("bob", bob, 4, leader.alignment)  # once it ended, a second stream replaces it
        leader.agree()
        assert leader.add_tag_stream("bob", bob, 4, leader.alignment) == tables["bob"].num_rows  # same: a no-op
        assert not list(leader.spool.glob("bob-*.tags"))  # compared by digest, not written again
        with pytest.raises(AgreementFixedError):
            leader.add_tag_stream("bob", bob[:-1], 4, leader.alignment)
        assert not list(leader.spool.glob("bob-*.tags"))
        leader.cleanup()
    finally:
        engine.close()


def test_tag_order_is_exact_when_packed_prefixes_tie_below_shared_top_bits() -> None:
    """The packed sort keeps the bits of hi below the prefix all tags share; tags that agree
    there but differ in the bits the row number replaced are put in exact (hi, lo) order."""
    rng = np.random.default_rng(5)
    size = 4096  # 12 row bits
    hi = (np.uint64(0b101) << np.uint64(61)) | (rng.integers(0, 8, size).astype(np.uint64) << np.uint64(20))
    hi |= rng.integers(0, 1 << 20, size).astype(np.uint64)  # bits 0-11 differ inside tied prefixes
    hi[:50] = hi[50:100]  # and some high words are equal outright
    lo = rng.integers(0, 1 << 63, size).astype(np.uint64)
    order = sh.tag_order(hi, lo)
    assert np.array_equal(order, np.lexsort((lo, hi)))


def test_merge_finds_every_repeated_tag_inside_runs_of_tied_prefixes() -> None:
    """The merge looks for repeats only among neighbours whose packed prefixes tie: tags made to
    tie there, some repeated (twice and three times) and some not, must give exactly the
    repeated set, the exact order and each symbol with its tag."""
    rng = np.random.default_rng(7)
    size = 3000
    tags = np.zeros(size, dtype=sh.WORK_DTYPE)
    top = rng.integers(0, 64, size).astype(np.uint64) << np.uint64(50)  # 6 varying bits, then ties below
    tags["hi"] = top | rng.integers(0, 1 << 12, size).astype(np.uint64)
    tags["lo"] = rng.integers(0, 1 << 63, size).astype(np.uint64)
    tags[100:140] = tags[200:240]  # repeated once
    tags[300:310] = tags[200:210]  # and a third time
    symbols = np.arange(size, dtype=np.uint32)
    shard = sh.merge_pieces(sh.split_by_shard(tags, 0, symbols))
    assert shard.size == size
    pairs = [(int(h), int(lo)) for h, lo in zip(shard.tags["hi"], shard.tags["lo"], strict=True)]
    assert pairs == sorted(pairs)
    assert np.array_equal(shard.tags, tags[shard.symbols])  # each symbol stayed with its tag
    values, counts = np.unique(tags.astype(TAG_DTYPE), return_counts=True)
    assert np.array_equal(np.sort(shard.repeated), values[counts > 1]) and shard.repeated.size == 40


def _bob_pieces(tables: dict[str, object]) -> list[bytes]:
    return [t.tobytes() for t in tables["bob"].tag_pieces()]  # type: ignore[attr-defined]


@pytest.mark.parametrize("arrival", ["reversed", "resent"])
def test_the_leader_matches_a_stream_out_of_order_or_sent_twice_like_an_ascending_one(
    world: Path, tmp_path: Path, arrival: str
) -> None:
    """Shards are matched while an ascending stream arrives; a stream that is not ascending
    (shards in reverse order) is matched once it has ended, and a second stream before the
    agreement (here after a first one cut short) starts the matching over: the agreement and
    every row order are those of one ascending stream."""
    engine = InlineEngine(2)
    try:
        tables = {
            c: load_sharded(engine, str(split_parquet(world / f"{c}.csv", tmp_path / c, 3)),
                            load_schema(world / f"{c}.json"), KEY, LOG, shard_bits=3)
            for c in ("alice", "bob")
        }  # fmt: skip
        pieces = _bob_pieces(tables)
        reference = _leader()
        reference.attach(tables["alice"], tmp_path)
        reference.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), tables["alice"].alphabet_size)
        reference.add_tag_stream("bob", pieces, 4, reference.alignment)
        expected = reference.agree()
        expected_rows = reference.rows_of("bob")[0 : expected.count].copy()
        expected_own = reference.own_aligned()
        reference.cleanup()
        tables["alice"] = load_sharded(engine, str(tmp_path / "alice"), load_schema(world / "alice.json"), KEY, LOG,
                                       shard_bits=3)  # fmt: skip
        leader = _leader()
        leader.attach(tables["alice"], tmp_path)
        leader.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), tables["alice"].alphabet_size)
        if arrival == "reversed":  # blocks of 700 ascending tags, the last block first: the first piece
            # alone is ascending (shards below its own are handed to the matcher), the second is not
            tags = np.concatenate([np.frombuffer(p, dtype=TAG_DTYPE) for p in pieces]).astype(TAG_DTYPE)  # big-endian
            blocks = [np.arange(i, min(i + 700, tags.size)) for i in range(0, tags.size, 700)][::-1]
            order = np.concatenate(blocks)
            leader.add_tag_stream("bob", [tags[b].tobytes() for b in blocks], 4, leader.alignment)
            assert leader.generation == 1  # the restart when it stopped ascending (a first stream restarts nothing)
        else:
            leader.add_tag_stream("bob", pieces[: len(pieces) // 2], 4, leader.alignment)  # cut short, then resent
            leader.add_tag_stream("bob", pieces, 4, leader.alignment)
        got = leader.agree()
        assert got.count == expected.count
        own = leader.own_aligned()
        assert np.array_equal(own, expected_own)
        rows = leader.rows_of("bob")[0 : got.count]
        if arrival == "reversed":  # rows index the stream as sent: map them back to ascending positions
            assert np.array_equal(np.sort(order[rows]), expected_rows)
            assert np.array_equal(order[rows], expected_rows)
        else:
            assert np.array_equal(rows, expected_rows)
        leader.cleanup()
    finally:
        engine.close()


def test_a_spool_left_by_a_killed_run_of_the_release_is_removed_when_the_leader_attaches(
    world: Path, tmp_path: Path
) -> None:
    """A leader killed before its cleanup leaves ``spool-<release>-XXXXXXXX`` in its keystore
    (follower tags, its own matched symbols); the rerun removes it, and nothing of another
    release whose id begins the same way."""
    left = tmp_path / "spool-r1-abcd_123"
    other = tmp_path / "spool-r10-abcd_123"
    for d in (left, other):
        d.mkdir()
        (d / "sym-000000.bin").write_bytes(b"\x01\x02")
    engine = InlineEngine(2)
    try:
        table = load_sharded(engine, str(split_parquet(world / "alice.csv", tmp_path / "alice", 2)),
                             load_schema(world / "alice.json"), KEY, LOG, shard_bits=2)  # fmt: skip
        leader = _leader()
        leader.attach(table, tmp_path)
        assert not left.exists() and (other / "sym-000000.bin").exists()
        assert leader.spool is not None and leader.spool.parent == tmp_path and leader.spool.exists()
        leader.cleanup()
    finally:
        engine.close()


def _spied_release(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """Bob streams to alice in tag slices of 100 and both align as in process: every measure of
    the leader's spool (:meth:`ClusterLeader._spool_backlog`) and the size of every piece spooled."""
    from secure_release.curator.cluster import matching, sharded

    monkeypatch.setattr(sharded, "TAG_SLICE", 100)
    measured: list[int] = []
    pieces: list[int] = []
    backlog, add = ClusterLeader._spool_backlog, matching._Spooler.add

    def spy(self: ClusterLeader) -> int:
        measured.append(backlog(self))
        return measured[-1]

    def counted(self: matching._Spooler, piece: bytes, first: int) -> None:
        pieces.append(len(piece))
        add(self, piece, first)

    monkeypatch.setattr(ClusterLeader, "_spool_backlog", spy)
    monkeypatch.setattr(matching._Spooler, "add", counted)
    n, expected = _local_aligned(world, Seed(bytes(32)))
    engine = InlineEngine(2)
    try:
        tables = {c: load_sharded(engine, str(split_parquet(world / f"{c}.csv", tmp_path / c, 3)),
                                  load_schema(world / f"{c}.json"), KEY, LOG, shard_bits=3)
                  for c in ("alice", "bob")}  # fmt: skip
        _bob_streams_to_alice_and_both_align_as_in_process(tables, tmp_path, n, expected)
    finally:
        engine.close()
    return measured, pieces


def test_a_stream_held_while_the_spool_runs_ahead_of_the_matching_gives_the_same_rows(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No spool allowed ahead of the matching (``SPOOL_AHEAD_BYTES`` 0) and tag slices of 100:
    the follower's ascending stream is held at each piece while the matcher has a ready unit,
    yet never deadlocks (with no unit ready it goes on), and the rows are the in-process ones."""
    from secure_release.curator.cluster import matching

    monkeypatch.setattr(matching, "SPOOL_AHEAD_BYTES", 0)
    held, pieces = _spied_release(world, tmp_path, monkeypatch)
    assert len(held) >= len(pieces) > 10 and max(held) > 0  # measured at each piece; the spool ran ahead


def test_a_spool_well_under_its_limit_is_measured_once_not_at_every_piece(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default limit (1 GiB) and tag slices of 100, the spool never nears the limit: its
    files are stat'ed once (the first piece), every later piece is counted instead, and the rows
    are the in-process ones."""
    measured, pieces = _spied_release(world, tmp_path, monkeypatch)
    assert len(pieces) > 10 and measured == [0]
