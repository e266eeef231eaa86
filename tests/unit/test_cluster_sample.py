"""The seed's sample taken on the cluster (curator/cluster/sample.py) and the follower's row order
gathered as it streams (curator/cluster/aligned.py): exactly the tuple and the symbols of the
in-process path, checked by enumeration against mechanism.primitives.sampling.sample_positions (no
statistics); and the sample file a release record names (records/keystore.py)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from support import split_parquet
from test_curator_sharded import KEY, LOG, _leader, _local_aligned

from secure_release.curator.cluster import sample as cs
from secure_release.curator.cluster.aligned import AlignedPieces, ShardRowSink
from secure_release.curator.cluster.engine import InlineEngine
from secure_release.curator.cluster.sharded import load_sharded
from secure_release.curator.records.keystore import Keystore, KeystoreError, ReleaseRecord
from secure_release.curator.table import load_schema
from secure_release.demo_data import write_demo_data
from secure_release.infra.fileio import UnsafePathError
from secure_release.infra.streams import AgreementError, TagStream, tag_chunks
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE
from secure_release.mechanism.primitives import sampling
from secure_release.mechanism.primitives.keys import PadKey, Seed
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols
from secure_release.mechanism.primitives.pads import CipherMode, ReleasePad, new_release_pad
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.spec import ReleaseSpec

SEED = Seed(bytes(range(32)))


def _runs_of(engine: InlineEngine, column: np.ndarray, cuts: list[int]) -> AlignedPieces:
    """``column`` as runs split at ``cuts`` (some split again into two parts, as a leader's units)."""
    bounds = [0, *cuts, column.size]
    sources, sizes = [], []
    for lo, hi in itertools.pairwise(bounds):
        mid = (lo + hi) // 2
        sources.append([engine.put(column[lo:mid]), engine.put(column[mid:hi])])
        sizes.append(hi - lo)
    return AlignedPieces(engine, sources, sizes, str(column.dtype))


@pytest.mark.parametrize(
    ("n", "m", "cuts"),
    [(1, 1, []), (50, 50, [7]), (1000, 10, [3, 400, 401]), (5000, 4999, [8, 16, 2500]), (20000, 700, [9999]),
     (3, 2, [1, 2])],
)  # fmt: skip
def test_the_cluster_sample_is_the_seed_rule_tuple(n: int, m: int, cuts: list[int]) -> None:
    """The column holds each position's own number, so the sample's symbols are its positions:
    equal to sample_positions for every split into runs."""
    engine = InlineEngine(2)
    try:
        pieces = _runs_of(engine, np.arange(n, dtype=np.uint32), cuts)
        got = np.concatenate(list(cs.sample_runs(pieces, SEED, "r1", m)))
    finally:
        engine.close()
    assert np.array_equal(got, sampling.sample_positions(SEED, n, m, "r1"))


@pytest.mark.parametrize("cut", [0, 1 << 40, 1 << 60])
def test_too_few_keys_below_the_cut_keep_every_key_and_give_the_same_tuple(cut: int) -> None:
    engine = InlineEngine(2)
    try:
        pieces = _runs_of(engine, np.arange(3000, dtype=np.uint32), [1000, 2000])
        got = np.concatenate(list(cs.sample_runs(pieces, SEED, "r1", 2500, cut=cut)))
    finally:
        engine.close()
    assert np.array_equal(got, sampling.sample_positions(SEED, 3000, 2500, "r1"))


def test_many_key_ranges_give_the_same_tuple(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges of a few keys each (so the m-th key falls inside one range, cut there)."""
    monkeypatch.setattr(cs, "num_key_ranges", lambda n, m: 97)
    engine = InlineEngine(2)
    try:
        pieces = _runs_of(engine, np.arange(4000, dtype=np.uint32), [100, 1999])
        got = np.concatenate(list(cs.sample_runs(pieces, SEED, "r9", 321)))
    finally:
        engine.close()
    assert np.array_equal(got, sampling.sample_positions(SEED, 4000, 321, "r9"))


def test_a_range_orders_equal_keys_by_position() -> None:
    """Ties of the 64-bit key (never seen with real keys, forced here) go by position: the
    runs' parts are concatenated in run order, which is position order."""
    keys = [np.array([5, 3, 5], dtype=np.uint64), np.array([3, 5], dtype=np.uint64)]
    symbols = [np.array([10, 11, 12], dtype=np.uint8), np.array([13, 14], dtype=np.uint8)]
    got = cs.merge_range(list(zip(keys, symbols, strict=True)), 4)
    assert got.tolist() == [11, 13, 10, 12]


def test_range_takes_stop_at_m_and_refuse_too_few() -> None:
    assert sampling.range_takes(np.array([3, 0, 4, 9]), 6) == [(0, 0, 3), (1, 3, 0), (2, 3, 3)]
    with pytest.raises(sampling.InvalidSampleSizeError, match="2 keys kept"):
        sampling.range_takes(np.array([1, 1]), 3)


def test_keys_at_any_start_are_the_keystream_words() -> None:
    key = sampling.sampling_key(SEED, "x")
    whole = sampling.position_keys(key, 0, 200)
    for start in (0, 1, 7, 8, 9, 63, 150):
        assert np.array_equal(sampling.keys_at_positions(key, start, 200 - start), whole[start:])


# ------------------------------------------------------------------ the follower's row order
@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster-sample")
    write_demo_data(root, rows=5000, seed=11)
    return root


@pytest.mark.parametrize(
    ("piece_rows", "handoff", "shares"),
    [(1, False, True), (97, False, True), (4096, False, False), (10**6, False, True), (97, True, True),
     (10**6, True, False)],
)  # fmt: skip
def test_the_leader_and_a_follower_sample_on_their_clusters_what_the_local_path_samples(
    world: Path, tmp_path: Path, piece_rows: int, handoff: bool, shares: bool
) -> None:
    """Alice leads, bob follows; bob's row order arrives in pieces of ``piece_rows`` (shard
    boundaries fall inside pieces, and pieces inside shards); both samples equal the in-process
    path's. ``handoff``: as on an embedded cluster, the tags and each shard's rows pass between
    the curator process and the workers as files in the engine's handoff directory. ``shares``:
    the workers share the leader's files, so each match leaves its symbols in a file and the
    leader's runs are read from them; else they stay with the matches on the workers."""
    seed = Seed(bytes(32))
    n, expected = _local_aligned(world, seed)
    engine = InlineEngine(2, shares_files=shares)
    if handoff:
        engine.handoff = tmp_path / "handoff"
        engine.handoff.mkdir()
    try:
        tables = {
            c: load_sharded(engine, str(split_parquet(world / f"{c}.csv", tmp_path / c, 3, groups=2)),
                            load_schema(world / f"{c}.json"), KEY, LOG, shard_bits=3)
            for c in ("alice", "bob")
        }
        leader = _leader()
        leader.attach(tables["alice"], tmp_path)
        leader.add_tags("alice", np.zeros(0, dtype=TAG_DTYPE), tables["alice"].alphabet_size)
        stream = TagStream(tag_chunks("r1", "bob", tables["bob"].tag_pieces(), tables["bob"].alphabet_size), "bob",
                           lambda _r: 1 << 40)  # fmt: skip
        stream.start()
        leader.add_tag_stream("bob", stream.pieces(), stream.alphabet_size, stream.alignment)
        agreement = leader.agree()
        m = agreement.base.spec.m
        rows = leader.rows_of("bob")
        sink = ShardRowSink(tables["bob"])
        sink.reset()
        for start in range(0, rows.size, piece_rows):
            sink.add(rows[start : start + piece_rows])
        sink.finish(rows.size)
        assert sink.pieces is not None
        assert len(list(tmp_path.glob("handoff/rows-*"))) == (len(sink.pieces.sizes) if handoff else 0)
        bob = np.concatenate(list(cs.sample_runs(sink.pieces, seed, "r1", m)))
        dtype = str(expected["alice"].dtype) if expected["alice"].dtype.itemsize < 4 else "uint16"
        symbol_files = sorted(tmp_path.glob("spool-*/sym-*.bin"))
        assert len(symbol_files) == (len(leader.matches) if shares else 0)
        assert all(m is None for m in leader.matches) == shares  # nothing of a match lives only on a worker
        alice_pieces = leader.aligned_pieces(dtype)
        alice = np.concatenate(list(cs.sample_runs(alice_pieces, seed, "r1", m)))
        leader.cleanup()
    finally:
        engine.close()
    assert alice_pieces.num_rows == sink.pieces.num_rows == n
    assert np.array_equal(bob, expected["bob"]) and np.array_equal(alice, expected["alice"])


def _sink_of_sizes(sizes: list[int]) -> ShardRowSink:
    class _Table:  # what the sink reads of a ShardedTable
        def __init__(self) -> None:
            self.engine, self.sizes, self.alphabet_size = InlineEngine(1), sizes, 4
            self.shards = [self.engine.put(None) for _ in sizes]

        @property
        def num_rows(self) -> int:
            return sum(self.sizes)

    sink = ShardRowSink(_Table())  # type: ignore[arg-type]
    sink.reset()
    return sink


def test_a_row_order_that_is_not_ascending_or_leaves_the_table_is_refused() -> None:
    sink = _sink_of_sizes([5, 5])
    sink.add(np.array([0, 3], dtype=np.uint32))
    with pytest.raises(AgreementError, match="not ascending"):
        sink.add(np.array([3, 4], dtype=np.uint32))
    with pytest.raises(AgreementError, match="not ascending"):
        _sink_of_sizes([5]).add(np.array([2, 1], dtype=np.uint32))
    with pytest.raises(AgreementError, match="outside this curator's 10 rows"):
        _sink_of_sizes([5, 5]).add(np.array([9, 10], dtype=np.uint32))
    short = _sink_of_sizes([5])
    short.add(np.array([1, 2], dtype=np.uint32))
    with pytest.raises(AgreementError, match="holds 2 rows, the agreement says 3"):
        short.finish(3)


# ------------------------------------------------------------------ the record's sample file
def _record(tmp_path: Path, m: int, k: int = 300) -> tuple[Keystore, ReleaseRecord, np.ndarray]:
    keystore = Keystore(tmp_path / "ks")
    rng = np.random.default_rng(1)
    sample = rng.integers(0, k, m).astype(np.uint32)
    pieces = [sample[i : i + 1000] for i in range(0, m, 1000)]
    sample_file = keystore.write_sample("r1", iter(pieces), k)
    plan = plan_release(m, [k, 2], 1.0, m)
    spec = ReleaseSpec("r1", ("alice", "bob"), CipherMode.CHACHA20, plan, ("researcher",)).validate()
    pad = ReleasePad(CipherMode.CHACHA20, k, m, key=PadKey(bytes(range(32))))
    record = ReleaseRecord(spec, pad, np.zeros(0, dtype=np.uint32), "fp", "ds", "seedfp", sample_file=sample_file)
    return keystore, record, sample


def test_a_sample_file_round_trips_and_gives_the_chunks_of_the_inline_record(tmp_path: Path) -> None:
    m = CHUNK_ROWS + 1234
    keystore, record, sample = _record(tmp_path, m)
    assert (os.stat(record.sample_file.path).st_mode & 0o777) == 0o600  # type: ignore[union-attr]
    keystore.save_record(record)
    loaded = keystore.load_record("r1")
    assert loaded is not None and loaded.sample_file is not None and loaded.sample.size == 0
    inline = ReleaseRecord(record.spec, record.pad, sample, "fp", "ds", "seedfp")
    chunks = [loaded.ciphertext_chunk(s) for s in range(record.spec.num_chunks)]
    assert b"".join(chunks) == pack_symbols(inline.ciphertext(), 300)
    assert np.array_equal(loaded.ciphertext(), inline.ciphertext())
    with pytest.raises(KeystoreError, match="outside"):
        loaded.ciphertext_chunk(record.spec.num_chunks)
    keystore.drop_record("r1")
    assert not record.sample_file.path.exists()  # type: ignore[union-attr]


def test_a_changed_or_missing_sample_file_is_refused_on_load(tmp_path: Path) -> None:
    keystore, record, _ = _record(tmp_path, 5000)
    keystore.save_record(record)
    path = record.sample_file.path  # type: ignore[union-attr]
    raw = bytearray(path.read_bytes())
    raw[17] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(KeystoreError, match="does not hold the sample its record names"):
        keystore.load_record("r1")
    path.write_bytes(bytes(raw[:-2]))
    with pytest.raises(KeystoreError, match="does not hold"):
        keystore.load_record("r1")
    path.unlink()
    with pytest.raises(KeystoreError, match="missing"):
        keystore.load_record("r1")
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePathError):
        keystore.load_record("r1")


def test_a_record_naming_a_file_outside_the_keystore_is_malformed(tmp_path: Path) -> None:
    keystore, record, _ = _record(tmp_path, 100)
    data = record.to_dict()
    data["sample_file"] = "../release-r1.json"
    with pytest.raises(ValueError, match="not a sample file"):
        ReleaseRecord.from_dict(data, keystore.directory)


def test_new_pads_are_fresh_per_release_so_a_sample_file_never_meets_another_pad(tmp_path: Path) -> None:
    first = new_release_pad(CipherMode.CHACHA20, 300, 10)
    second = new_release_pad(CipherMode.CHACHA20, 300, 10)
    assert first.key is not None and second.key is not None
    assert first.key.reveal() != second.key.reveal()


def test_tags_leave_in_slices_that_do_not_grow_with_the_shards(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The curator process fetches at most TAG_SLICE tags at once (here 300), and the slices in
    order are every shard's tags in order; a run of shards gives its own slice of them."""
    from secure_release.curator.cluster import sharded

    monkeypatch.setattr(sharded, "TAG_SLICE", 300)
    engine = InlineEngine(2)
    try:
        table = load_sharded(engine, str(split_parquet(world / "bob.csv", tmp_path / "bob", 2)),
                             load_schema(world / "bob.json"), KEY, LOG, shard_bits=2)  # fmt: skip
        whole = [engine.result(engine.submit(lambda s: s.tags.copy(), shard)) for shard in table.shards]
        pieces = list(table.tag_pieces())
        run = list(table.tag_pieces_of(1, 3))
    finally:
        engine.close()
    assert max(p.size for p in pieces) == 300 and len(pieces) > len(whole)
    assert all(p.dtype == TAG_DTYPE for p in pieces)  # as the wire carries them

    def words(arrays: list[np.ndarray]) -> list[tuple[int, int]]:
        return [(int(h), int(lo)) for a in arrays for h, lo in zip(a["hi"], a["lo"], strict=True)]

    assert words(pieces) == words(whole)
    assert words(run) == words(whole[1:3])
