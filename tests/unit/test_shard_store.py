"""The engine's shard store (``curator/cluster/shard_files.py``): ids, not tags, on disk; the
same shards as the workers held; a merge that can run twice; the free space checked first.

Exact checks throughout (the tags are recomputed from the stored ids, and compared with the
tags of the in-memory path bit for bit)."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support import split_parquet

from secure_release.curator.cluster import shard_files as sf
from secure_release.curator.cluster import sharded
from secure_release.curator.cluster.engine import InlineEngine
from secure_release.curator.cluster.sealed import Sealed
from secure_release.curator.cluster.sharded import load_sharded
from secure_release.curator.partitions import discover
from secure_release.curator.table import load_schema
from secure_release.demo_data import write_demo_data
from secure_release.infra.fileio import DiskFullError
from secure_release.infra.logs import EventLog
from secure_release.mechanism.alignment import sharding as sh
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, id_tags
from secure_release.mechanism.primitives.keys import AlignmentKey

KEY = AlignmentKey(bytes(range(32)))
LOG = EventLog("curator", "test")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    write_demo_data(root, rows=5000, seed=11)
    return root


def _tables(world: Path, tmp_path: Path, engine: InlineEngine) -> tuple[sharded.ShardedTable, sharded.ShardedTable]:
    data = str(split_parquet(world / "alice.csv", tmp_path / "alice", 5, groups=2))
    schema = load_schema(world / "alice.json")
    store = tmp_path / "store"
    store.mkdir(exist_ok=True)
    held = load_sharded(engine, data, schema, KEY, LOG, shard_bits=5)
    stored = load_sharded(engine, data, schema, KEY, LOG, shard_bits=5, store_parent=store, store_name="r1")
    return held, stored


def test_stored_shards_hold_ids_not_tags_and_give_the_held_shards_tags(world: Path, tmp_path: Path) -> None:
    engine = InlineEngine(2)
    try:
        held, stored = _tables(world, tmp_path, engine)
        assert stored.store is not None and stored.store.parent == tmp_path / "store"
        assert stored.store.name.startswith("shards-r1-") and stored.store.stat().st_mode & 0o777 == 0o700
        assert held.sizes == stored.sizes and sum(stored.sizes) == 5005
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in stored.store.iterdir())  # the user's only
        names = sorted(p.name for p in stored.store.iterdir())
        assert names == sorted([f"s{i:05d}.arrow" for i in range(32)] + [f"g{g:03d}.done" for g in range(16)])
        every_tag = b"".join(engine.result(h).tags.astype(TAG_DTYPE).tobytes() for h in held.shards)
        on_disk = b"".join(p.read_bytes() for p in stored.store.iterdir())
        for i in range(0, len(every_tag), 16 * 97):  # no file holds a tag (a sample of them, each in full)
            assert every_tag[i : i + 16] not in on_disk
        for handle, shard in zip(held.shards, stored.shards, strict=True):
            mine = engine.result(handle)
            with pa.ipc.open_file(shard.ids) as reader:
                assert reader.schema.names == ["id", "symbol"]
            again = sf.shard_rows(shard)
            assert np.array_equal(again.tags, mine.tags) and np.array_equal(again.symbols, mine.symbols)
            assert np.array_equal(sf.shard_symbols(shard), mine.symbols)
            for start, stop in ((0, 0), (3, 40), (0, shard.size), (shard.size // 2, shard.size)):
                part = sf.shard_rows(shard, start, stop)
                assert np.array_equal(part.tags, mine.tags[start:stop])
                assert np.array_equal(part.symbols, mine.symbols[start:stop])
            with pytest.raises(sh.ShardError, match="outside shard"):
                sf.shard_rows(shard, 0, shard.size + 1)
            for bits in range(5, 5 + sf.RUN_BITS + 1):  # every unit a leader may match: its run of the shard
                for unit in range(shard.index << (bits - 5), (shard.index + 1) << (bits - 5)):
                    assert shard.unit_bounds(unit, bits) == sh.unit_run(mine.tags, unit, bits)
            with pytest.raises(sh.ShardError, match="not a run of shard"):
                shard.unit_bounds((shard.index + 1) % 32 << 2, 7)
        stored.close()
        assert not stored.store.exists()
    finally:
        engine.close()


def test_a_merge_run_again_after_its_pieces_are_gone_gives_the_same_shards(world: Path, tmp_path: Path) -> None:
    """A worker lost after a group's merge: Dask runs the task again, and the marker the first
    run left (its pieces already removed) gives the same shards."""
    schema = load_schema(world / "bob.json")
    parts = discover(str(split_parquet(world / "bob.csv", tmp_path / "bob", 3)), 1 << 22)
    store = tmp_path / "st"
    store.mkdir()
    key = Sealed(KEY.reveal())
    size = schema.schema.alphabet_size
    results = [sf.partition_to_files(i, p, schema, key, 4, size, str(store)) for i, p in enumerate(parts)]
    assert len(list(store.glob("p*.arrow"))) == 3 * 16
    first = sf.merge_group_files(2, 4, results, str(store), key, size)
    assert not list(store.glob("p*-g002.arrow")) and len(list(store.glob("p*.arrow"))) == 3 * 15
    again = sf.merge_group_files(2, 4, results, str(store), key, size)
    fields = ("index", "shard_bits", "ids", "size", "dtype", "runs")
    assert [[getattr(f, n) for n in fields] for f, _ in again] == [[getattr(f, n) for n in fields] for f, _ in first]
    assert all(r.size == 0 for _, r in again)


def test_ids_of_one_width_are_stored_without_offsets_and_hash_alike() -> None:
    ids = pa.array([f"p{i:011d}" for i in range(1000)])
    for arr in (ids, ids.slice(7, 500)):
        fixed = sf._arrow_ids(arr)
        assert pa.types.is_fixed_size_binary(fixed.type) and fixed.type.byte_width == 12
        assert np.array_equal(id_tags(sf._hashable(fixed), KEY), id_tags(arr, KEY))
        assert np.array_equal(id_tags(sf._hashable(fixed.slice(3, 9)), KEY), id_tags(arr.slice(3, 9), KEY))
    mixed = pa.array(["a", "bb", "ccc"])
    assert sf._arrow_ids(mixed).type == pa.string()
    joined = sf._concat_ids([sf._arrow_ids(ids.slice(0, 4)), mixed, pa.array([7, 8], pa.int64())])
    expect = id_tags(pa.array([*(f"p{i:011d}" for i in range(4)), "a", "bb", "ccc", "7", "8"]), KEY)
    assert np.array_equal(id_tags(sf._hashable(joined), KEY), expect)


Usage = namedtuple("Usage", "total used free")


def test_too_little_free_space_is_refused_before_anything_is_read(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = split_parquet(world / "alice.csv", tmp_path / "alice", 4)
    inputs = sum(p.stat().st_size for p in data.iterdir())
    estimate = sharded.store_estimate(inputs, 5005)
    assert estimate == int(sharded.STORE_PER_INPUT_BYTE * inputs + sharded.STORE_PER_ROW * 5005)
    store = tmp_path / "store"
    store.mkdir()

    def never(*_: object) -> None:
        raise AssertionError("a partition was read")

    monkeypatch.setattr(sf, "partition_to_files", never)
    monkeypatch.setattr(sharded.shutil, "disk_usage", lambda _p: Usage(10**9, 10**9 - estimate + 1, estimate - 1))
    engine = InlineEngine(2)
    try:
        with pytest.raises(DiskFullError, match=rf"{estimate - 1:,} bytes free.*needs about {estimate:,}") as info:
            load_sharded(engine, str(data), load_schema(world / "alice.json"), KEY, LOG, store_parent=store)
        assert str(store) in str(info.value) and "no budget reserved" in str(info.value)
        assert not list(store.iterdir())
        monkeypatch.setattr(sharded.shutil, "disk_usage", lambda _p: Usage(10**9, 0, estimate))  # exactly enough
        with pytest.raises(AssertionError, match="a partition was read"):
            load_sharded(engine, str(data), load_schema(world / "alice.json"), KEY, LOG, store_parent=store)
    finally:
        engine.close()


def test_a_full_disk_is_named_with_its_store_and_the_bytes_a_write_needed(tmp_path: Path) -> None:
    named = rf"{tmp_path} is full .* shard 3's rows: that write needed 1,234 bytes"
    with pytest.raises(DiskFullError, match=named), sf.disk_full_named(str(tmp_path), "shard 3's rows", 1234):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(DiskFullError, match="Disk quota exceeded"), sf.disk_full_named(str(tmp_path), "x", 1):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")
    with pytest.raises(PermissionError), sf.disk_full_named(str(tmp_path), "x", 1):
        raise PermissionError(errno.EACCES, "denied")
    assert shutil.disk_usage(tmp_path).free > 0


def test_auto_stores_on_disk_exactly_past_the_share_of_the_workers_memory() -> None:
    """``--shard-store auto``: held while 17 bytes a row are at most 60% of the workers' memory,
    stored past it (the boundary to the row); unknown memory: stored; disk and memory: as said."""
    memory = 4 << 30  # 2 workers of 2 GiB
    edge = int(sharded.HOLD_FRACTION * memory) // sharded.HELD_BYTES_A_ROW
    assert not sharded.stores_on_disk("auto", memory, edge)
    assert sharded.stores_on_disk("auto", memory, edge + 1)
    assert not sharded.stores_on_disk("auto", memory, 10**8)  # 10^8 rows: held, as measured (1.4 GiB a worker)
    assert sharded.stores_on_disk("auto", memory, 3 * 10**8)
    assert sharded.stores_on_disk("auto", None, 1)
    assert sharded.stores_on_disk("disk", memory, 1) and not sharded.stores_on_disk("memory", None, 10**12)
    with pytest.raises(sh.ShardError, match="auto, disk or memory"):
        sharded.stores_on_disk("tape", memory, 1)


@pytest.mark.parametrize(
    "rows",
    [[], [0], [3, 4, 5, 9, 4_000_000_000], [7, 2, 9, 0, 4_294_967_295, 1], list(range(0, 3_000_000, 3))],
    ids=["empty", "one", "ascending", "any-order", "a-million"],
)
def test_a_units_row_order_is_kept_compressed_and_read_back_exactly(tmp_path: Path, rows: list[int]) -> None:
    from secure_release.curator.cluster.spool import SpoolError, read_unit_rows, write_unit_rows

    path = tmp_path / "rows-bob-000001.u32"
    want = np.asarray(rows, dtype=np.uint32)
    write_unit_rows(path, want)
    got = read_unit_rows(path, len(rows))
    assert got.dtype == np.dtype("<u4") and np.array_equal(got, want)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    assert path.stat().st_mode & 0o777 == 0o600
    if len(rows) > 1000:
        assert path.stat().st_size < len(rows) // 8  # ascending: far below 4 bytes a row
    if rows:
        with pytest.raises(SpoolError, match=r"holds|cannot be read"):
            read_unit_rows(path, len(rows) + 1)
        path.write_bytes(path.read_bytes()[:-3])
        with pytest.raises(SpoolError, match=r"cannot be read|holds"):
            read_unit_rows(path, len(rows))
