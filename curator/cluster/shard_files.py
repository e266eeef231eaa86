"""A curator's shards as compressed files in its own store (``--engine dask`` on a cluster whose
workers share this host's files: an embedded one).

The store holds the ids, not their tags: a 128-bit tag of each of n ids is random, so n tags
cannot be written in fewer than about ``16 - log2(n)/8`` bytes each (12.4 at 10^9), twice what the
bench's whole input takes a row, while the ids compress as they do in the input. A tag is
recomputed from its id wherever it is needed (AES-256-CMAC: about 6 ns an id, against the 20-40
ns an id the store's compression and reads cost); no file ever holds a tag.

The stages, each a plain function of its arguments run on a worker:

1. :func:`partition_to_files`: read and check one partition (as
   :func:`~secure_release.curator.cluster.shards.hash_partition`), hash its ids, and write its
   rows ``(id, symbol)`` split by shard to one Arrow IPC file (zstd) per group of shards
   (``p<partition>-g<group>.arrow``, a record batch a shard).
2. :func:`merge_group_files`: for each shard of a group, its batches of every partition's file,
   hashed again and sorted by tag; repeated ids found; written as the shard's ids in tag order
   with their symbols (``s<shard>.arrow``, batches of :data:`BATCH_ROWS`).
   The group's partition files are removed once its shards are written (a marker records the
   shards' sizes first, so a rerun of the task after a lost worker reads the marker).
3. :func:`shard_rows`: rows ``start .. stop`` of a shard, tags recomputed: what a tag slice, a
   leader's match and a follower's gather read (:class:`ShardFile` is the handle the other
   stages take in place of an in-memory shard).

Every file is written to a temporary name and renamed; a full disk is :class:`DiskFullError`
naming the store and what the write needed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.curator.cluster.sealed import Sealed, opened
from secure_release.infra.fileio import DISK_FULL_ERRNOS, DiskFullError
from secure_release.infra.memory import release_free_memory
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray, id_tags
from secure_release.mechanism.alignment.sharding import (
    WORK_DTYPE,
    HoldsArrays,
    Piece,
    Shard,
    ShardError,
    shard_of,
    sort_tags_once,
    symbol_dtype,
    top_bits,
)
from secure_release.mechanism.primitives.keys import AlignmentKey

#: Rows of a shard file's record batch: a tag slice (2^20) reads four, a unit's match its own run.
BATCH_ROWS = 1 << 18
#: A partition's rows go to at most 2^FILE_GROUP_BITS files (one a group of shards), so a group's
#: files can go as soon as its shards are merged, and there are not partitions x shards files.
FILE_GROUP_BITS = 4
#: A shard's sub-ranges whose starts a :class:`ShardFile` keeps (a leader's unit is one or more).
RUN_BITS = 4
_WRITE_OPTIONS: Any = None


@dataclass(frozen=True)
class RowProblem:
    """A row a partition refused: its file, its line and what was wrong."""

    path: str
    line: int
    message: str


@dataclass(frozen=True)
class PartitionResult(HoldsArrays):
    """One partition after :func:`hash_partition`: its rows split by shard, or its bad rows."""

    pieces: tuple[Piece, ...]
    num_rows: int
    problems: tuple[RowProblem, ...] = ()


@dataclass(frozen=True)
class ShardFile:
    """A shard in the store: its ids ascending by tag and their symbols (``ids``: an Arrow IPC
    file of columns ``id`` and ``symbol``, ``dtype``), ``size`` rows; ``runs``: where each of its ``2^RUN_BITS``
    sub-ranges of tags begins (and ``size`` last). It carries the alignment key, sealed, since its
    readers recompute tags (:func:`shard_rows`)."""

    index: int
    shard_bits: int
    ids: str
    size: int
    dtype: str
    runs: tuple[int, ...]
    key: Sealed

    def unit_bounds(self, unit: int, bits: int) -> tuple[int, int]:
        """Rows ``start .. stop`` of the unit whose top ``bits`` bits are ``unit`` (the shard's
        bits and at most :data:`RUN_BITS` more)."""
        extra = bits - self.shard_bits
        if not 0 <= extra <= RUN_BITS or unit >> extra != self.index:
            raise ShardError(f"unit {unit} of {bits} bits is not a run of shard {self.index}")
        step = 1 << (RUN_BITS - extra)
        local = unit & ((1 << extra) - 1)
        return self.runs[local * step], self.runs[(local + 1) * step]


def piece_path(store: str, partition: int, group: int) -> str:
    return os.path.join(store, f"p{partition:05d}-g{group:03d}.arrow")


def file_group_bits(shard_bits: int) -> int:
    return min(shard_bits, FILE_GROUP_BITS)


@contextmanager
def disk_full_named(store: str, what: str, needed: int) -> Iterator[None]:
    """An ENOSPC/EDQUOT ``OSError`` inside as :class:`DiskFullError` naming the store, what was
    being written and how many bytes that write needed, and the space left."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        try:
            free = shutil.disk_usage(store).free
        except OSError:
            free = -1
        raise DiskFullError(
            f"the disk holding {store} is full ({os.strerror(exc.errno)}) while writing {what}: that write needed "
            f"{needed:,} bytes; {max(free, 0):,} bytes are free. Free space there, or point the keystore at a larger "
            "disk, and run the command again; nothing of this release was kept"
        ) from None


def _write_options() -> Any:
    global _WRITE_OPTIONS
    if _WRITE_OPTIONS is None:
        import pyarrow as pa

        _WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))
    return _WRITE_OPTIONS


def _private(path: str) -> int:
    """``path`` created (or truncated) 0600, open for writing: a descriptor."""
    return os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)


def _write_batches(path: str, schema: Any, batches: Sequence[Any], store: str, what: str) -> None:
    """An Arrow IPC file of ``batches`` at ``path``: written to a temporary name and renamed."""
    import pyarrow as pa

    temp = f"{path}.{os.getpid()}.tmp"
    needed = sum(int(b.nbytes) for b in batches)
    try:
        with disk_full_named(store, what, needed):
            os.close(_private(temp))  # 0600 before a byte is in it
        with (
            disk_full_named(store, what, needed),
            pa.OSFile(temp, "wb") as sink,
            pa.ipc.new_file(sink, schema, options=_write_options()) as writer,
        ):
            for batch in batches:
                writer.write_batch(batch)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def _arrow_ids(ids: Any) -> Any:
    """The ids as one Arrow array; ids of one width as fixed-size binary: without their offsets
    (4 bytes a row that zstd leaves at 2.8) they compress as in a Parquet file."""
    import pyarrow as pa

    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if not isinstance(ids, pa.Array):
        ids = pa.array(ids)
    if not (pa.types.is_string(ids.type) or pa.types.is_binary(ids.type)) or len(ids) == 0 or ids.null_count:
        return ids
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32)[ids.offset : ids.offset + len(ids) + 1]
    width = int(offsets[1] - offsets[0])
    if width == 0 or int(offsets[-1] - offsets[0]) != width * len(ids) or not bool(np.all(np.diff(offsets) == width)):
        return ids
    data = ids.buffers()[2].slice(int(offsets[0]), width * len(ids))
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(ids), [None, data])


def _concat_ids(parts: Sequence[Any]) -> Any:
    """One array of every partition's ids of a shard (partitions may differ in their ids' type or
    width: then all as binary, with the bytes :func:`_hashable` hashes), compacted again."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not parts:
        return pa.array([], pa.binary())
    if len({p.type for p in parts}) > 1:
        large = any(pa.types.is_large_string(p.type) or pa.types.is_large_binary(p.type) for p in parts)
        target = pa.large_binary() if large else pa.binary()
        as_text = [pc.cast(p, pa.string()) if pa.types.is_integer(p.type) else _hashable(p) for p in parts]
        parts = [p.cast(target) for p in as_text]
    return _arrow_ids(pa.concat_arrays(parts))


def _hashable(ids: Any) -> Any:
    """Stored ids as :func:`~secure_release.mechanism.alignment.keyed_hash.id_tags` takes them
    (fixed-size binary back to binary: the same bytes, so the same tags)."""
    import pyarrow as pa

    if not pa.types.is_fixed_size_binary(ids.type):
        return ids
    width, count = ids.type.byte_width, len(ids)
    offsets = pa.py_buffer(np.arange(0, (count + 1) * width, width, dtype=np.int32))
    data = ids.buffers()[1].slice(ids.offset * width, count * width)
    return pa.BinaryArray.from_buffers(pa.binary(), count, [None, offsets, data])


def _schema(ids: Any, dtype: str) -> Any:
    import pyarrow as pa

    return pa.schema([("id", ids.type), ("symbol", pa.from_numpy_dtype(np.dtype(dtype)))])


def partition_to_files(
    index: int, partition: Any, spec: Any, alignment_key_bytes: Sealed | bytes, shard_bits: int, alphabet_size: int,
    store: str,
) -> Any:  # fmt: skip
    """Stage 1 for partition ``index`` into the store: bad rows come back as problems (nothing
    written); else its rows split by shard, one IPC file a group of shards. Returns a
    :class:`PartitionResult` with no pieces (the rows are in the files)."""
    import pyarrow as pa

    from secure_release.curator.partitions import read_partition
    from secure_release.curator.table import BadRowsError

    try:
        table = read_partition(partition, spec, check_repeats=False)
    except BadRowsError as exc:
        problems = tuple(RowProblem(str(partition.path), line, message) for line, message in exc.problems)
        return PartitionResult((), 0, problems)
    dtype = symbol_dtype(alphabet_size)
    ids = _arrow_ids(table.id_values())
    symbols = np.asarray(table.symbols()).astype(dtype, copy=False)
    del table
    shards = shard_of(id_tags(_hashable(ids), AlignmentKey(opened(alignment_key_bytes))), shard_bits).astype(np.uint16)
    order = np.argsort(shards, kind="stable")
    bounds = np.searchsorted(shards[order], np.arange((1 << shard_bits) + 1)).tolist()
    del shards
    ids = ids.take(pa.array(order))
    symbols = symbols[order]
    del order
    schema = _schema(ids, dtype)
    group_bits = file_group_bits(shard_bits)
    per_group = 1 << (shard_bits - group_bits)
    for group in range(1 << group_bits):
        batches = []
        for shard in range(group * per_group, (group + 1) * per_group):
            start, stop = bounds[shard], bounds[shard + 1]
            columns = [ids.slice(start, stop - start), pa.array(symbols[start:stop])]
            batches.append(pa.record_batch(columns, schema=schema))
        _write_batches(piece_path(store, index, group), schema, batches, store, f"partition {index}'s rows")
    num_rows = len(ids)
    del ids, symbols, batches
    release_free_memory()
    return PartitionResult((), num_rows, ())


def merge_group_files(
    group: int, shard_bits: int, partitions: Sequence[Any], store: str, alignment_key_bytes: Sealed | bytes,
    alphabet_size: int,
) -> list[tuple[ShardFile, TagArray]]:  # fmt: skip
    """Stage 2 for one group of shards: each shard's batches of every partition's file, hashed and
    sorted by tag, written as a :class:`ShardFile`; with its repeated tags. ``partitions``: the
    partitions' read results (a partition with bad rows wrote nothing: then nothing is merged)."""
    import pyarrow as pa

    if any(r.problems for r in partitions):
        return []
    marker = os.path.join(store, f"g{group:03d}.done")
    key = Sealed(opened(alignment_key_bytes))
    if os.path.exists(marker):  # a rerun after a lost worker: the shards are written, the pieces gone
        return _read_marker(marker, key)
    dtype = symbol_dtype(alphabet_size)
    per_group = 1 << (shard_bits - file_group_bits(shard_bits))
    readers = [pa.ipc.open_file(pa.memory_map(piece_path(store, p, group))) for p in range(len(partitions))]
    out: list[tuple[ShardFile, TagArray]] = []
    for k in range(per_group):
        shard = group * per_group + k
        batches = [reader.get_batch(k) for reader in readers]
        ids = _concat_ids([b.column(0) for b in batches])
        symbols = np.concatenate([b.column(1).to_numpy(zero_copy_only=False) for b in batches]).astype(dtype)
        del batches
        out.append(_write_shard(store, shard, shard_bits, ids, symbols, key, dtype))
        del ids, symbols
        release_free_memory()
    del readers
    _write_marker(marker, out, store)
    for p in range(len(partitions)):
        Path(piece_path(store, p, group)).unlink(missing_ok=True)
    return out


def _write_shard(
    store: str, shard: int, shard_bits: int, ids: Any, symbols: npt.NDArray[Any], key: Sealed, dtype: str
) -> tuple[ShardFile, TagArray]:
    import pyarrow as pa

    tags = id_tags(_hashable(ids), AlignmentKey(opened(key))).astype(WORK_DTYPE)
    order, tags, repeated = sort_tags_once(tags)
    sub = top_bits(tags["hi"], shard_bits + RUN_BITS) & ((1 << RUN_BITS) - 1)
    runs = tuple(int(x) for x in np.searchsorted(sub, np.arange((1 << RUN_BITS) + 1)))
    del tags, sub
    ids = ids.take(pa.array(order))
    symbols = symbols[order]
    del order
    schema = _schema(ids, dtype)
    batches = [
        pa.record_batch([ids.slice(start, BATCH_ROWS), pa.array(symbols[start : start + BATCH_ROWS])], schema=schema)
        for start in range(0, max(len(ids), 1), BATCH_ROWS)
    ]
    path = os.path.join(store, f"s{shard:05d}.arrow")
    _write_batches(path, schema, batches, store, f"shard {shard}'s rows")
    return ShardFile(shard, shard_bits, path, len(ids), dtype, runs, key), repeated


def _write_marker(path: str, shards: Sequence[tuple[ShardFile, TagArray]], store: str) -> None:
    """What a group's merge produced (each shard's size, runs and repeated tags), for a rerun."""
    data = [
        {"index": f.index, "bits": f.shard_bits, "size": f.size, "dtype": f.dtype, "runs": list(f.runs),
         "repeated": np.ascontiguousarray(rep, dtype=TAG_DTYPE).tobytes().hex()}
        for f, rep in shards
    ]  # fmt: skip
    temp = f"{path}.{os.getpid()}.tmp"
    with disk_full_named(store, "a merge's marker", 1024), open(_private(temp), "w") as fh:
        fh.write(json.dumps(data))
    os.replace(temp, path)


def _read_marker(path: str, key: Sealed) -> list[tuple[ShardFile, TagArray]]:
    store = os.path.dirname(path)
    out = []
    for d in json.loads(Path(path).read_text()):
        repeated = np.frombuffer(bytes.fromhex(d["repeated"]), dtype=TAG_DTYPE).copy()
        path = os.path.join(store, f"s{d['index']:05d}.arrow")
        shard = ShardFile(d["index"], d["bits"], path, d["size"], d["dtype"], tuple(d["runs"]), key)
        out.append((shard, repeated))
    return out



def shard_rows(shard: ShardFile, start: int = 0, stop: int | None = None) -> Shard:
    """Rows ``start .. stop`` of a stored shard as an in-memory :class:`Shard` (ascending), its
    tags recomputed from the ids; only the batches holding them are read."""

    stop = shard.size if stop is None else stop
    if not 0 <= start <= stop <= shard.size:
        raise ShardError(f"rows {start}..{stop} are outside shard {shard.index}'s {shard.size} rows")
    if stop == start:
        return Shard(np.zeros(0, dtype=WORK_DTYPE), np.zeros(0, dtype=shard.dtype), np.zeros(0, dtype=TAG_DTYPE))
    ids, symbols = _columns(shard, start, stop, (0, 1))
    tags = id_tags(_hashable(ids), AlignmentKey(opened(shard.key))).astype(WORK_DTYPE)
    return Shard(tags, symbols.to_numpy(zero_copy_only=False).astype(shard.dtype, copy=False),
                 np.zeros(0, dtype=TAG_DTYPE))  # fmt: skip


def shard_symbols(shard: ShardFile, start: int = 0, stop: int | None = None) -> npt.NDArray[np.unsignedinteger]:
    """Rows ``start .. stop`` of a stored shard's symbols (its ids are not read)."""
    stop = shard.size if stop is None else stop
    if stop == start:
        return np.zeros(0, dtype=shard.dtype)
    (symbols,) = _columns(shard, start, stop, (1,))
    out: npt.NDArray[np.unsignedinteger] = symbols.to_numpy(zero_copy_only=False).astype(shard.dtype, copy=False)
    return out


def _columns(shard: ShardFile, start: int, stop: int, fields: tuple[int, ...]) -> list[Any]:
    """Columns ``fields`` of rows ``start .. stop`` of a stored shard: only the batches holding
    them are read, and of them only those columns decompressed."""
    import pyarrow as pa

    options = pa.ipc.IpcReadOptions(included_fields=list(fields))
    reader = pa.ipc.open_file(pa.memory_map(shard.ids), options=options)
    first, last = start // BATCH_ROWS, (stop - 1) // BATCH_ROWS
    batches = [reader.get_batch(b) for b in range(first, last + 1)]
    skip = start - first * BATCH_ROWS
    return [pa.concat_arrays([b.column(i) for b in batches]).slice(skip, stop - start) for i in range(len(fields))]


def stored_bytes(store: str | Path) -> int:
    """Bytes on disk under ``store`` (what the engine's files take now)."""
    total = 0
    for root, _, files in os.walk(store):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total
