"""A curator's table as tag shards on an engine (``--engine dask``).

No process holds the n tags: the partitions are read and hashed on the workers, each shard is
sorted there, and the tags leave the curator one shard at a time (ascending: the canonical
order); a leader matches them with its own shards as they arrive
(:mod:`secure_release.curator.cluster.matching`). What the curator process holds is one shard at
a time, the row order the leader sends (4 bytes a row) and the aligned column (1-4 bytes a
row); the sample, the pad and the upload are then those of the in-process path, so the
ciphertext is the same bytes.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.curator.cluster import shard_files as sf
from secure_release.curator.cluster import shards as st
from secure_release.curator.cluster.engine import Engine
from secure_release.curator.cluster.sealed import Sealed
from secure_release.curator.table import BadRowsError, TableSpec
from secure_release.infra.logs import EventLog, peak_rss_mib
from secure_release.infra.streams import AgreementError
from secure_release.mechanism.alignment import sharding as sh
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray
from secure_release.mechanism.primitives.keys import AlignmentKey

MAX_REPORTED = 50  # repeated ids located and named in one report
#: Tags the curator process fetches from a worker at once to send them on (16 MiB).
TAG_SLICE = 1 << 20
#: Rows a partition holds at most (row groups of one file grouped up to it): 4 M rows is about
#: 250 MB of Arrow data in a worker, and keeps partitions x shards tasks few (2,048 at 10^8).
PARTITION_ROWS = 1 << 22


@dataclass
class ShardedTable:
    """One curator's rows as ``2^shard_bits`` sorted shards held by the engine."""

    engine: Engine
    data: str
    partitions: list[Any]
    spec: TableSpec
    shard_bits: int
    shards: list[Any]  # engine handles of shards.Shard, or the ShardFiles of the store, in shard order
    sizes: list[int]  # rows of each shard
    store: Path | None = None  # the directory of the stored shards (removed at close), if stored

    @property
    def num_rows(self) -> int:
        return int(sum(self.sizes))

    @property
    def alphabet_size(self) -> int:
        return self.spec.schema.alphabet_size

    def tag_pieces(self) -> Iterator[TagArray]:
        """Every tag, ascending (:meth:`tag_pieces_of` all shards)."""
        return self.tag_pieces_of(0, len(self.shards))

    @property
    def row_offsets(self) -> npt.NDArray[np.int64]:
        """Where each shard's rows begin in the tags as sent (ascending), and the row count last
        (``len(shards) + 1`` values): a run of shards ``a .. b`` is rows ``offsets[a] .. offsets[b]``."""
        return np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)]).astype(np.int64)

    def tag_pieces_of(self, first_shard: int, stop_shard: int) -> Iterator[TagArray]:
        """The tags of shards ``first_shard .. stop_shard - 1``, ascending, in slices of at most
        :data:`TAG_SLICE` tags fetched straight from the workers holding them, :data:`WINDOW` ahead
        of the one being sent: what this process holds of its tags (a few slices) does not grow
        with n or with the shards. One part of the tags, sent on its own stream beside the
        others."""
        slices = [
            (shard, start, min(start + TAG_SLICE, size))
            for shard, size in zip(self.shards[first_shard:stop_shard], self.sizes[first_shard:stop_shard], strict=True)
            for start in range(0, size, TAG_SLICE)
        ]

        handoff, name = self.engine.handoff, secrets.token_hex(8)

        def fetch(i: int) -> Any:
            if handoff is None:
                return self.engine.submit(st.shard_tag_slice, *slices[i])
            return self.engine.submit(st.shard_tag_slice_to, *slices[i], str(handoff / f"tags-{name}-{i}"))

        for value in in_order(self.engine, fetch, len(slices), window=2):
            yield value if handoff is None else _taken(value)

    def aligned_symbols(self, rows: npt.NDArray[np.integer], log: EventLog | None = None) -> npt.NDArray[Any]:
        """This curator's symbols of the common ids in canonical order, from the row order the
        leader sent: indices into the tags as this curator submitted them (ascending, so each
        shard's part is one contiguous run). :class:`AgreementError` if the rows are not strictly
        ascending, or name a row outside the table."""
        rows = np.asarray(rows)
        if rows.size > 1 and not bool(np.all(rows[1:] > rows[:-1])):
            raise AgreementError("the leader's row order is not ascending (this curator sent its tags ascending)")
        if rows.size and (int(rows[0]) < 0 or int(rows[-1]) >= self.num_rows):
            raise AgreementError(f"the leader's row order names a row outside this curator's {self.num_rows} rows")
        offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        bounds = np.searchsorted(rows, offsets)
        dtype = sh.symbol_dtype(self.alphabet_size)

        def task(s: int) -> Any:
            local = (rows[bounds[s] : bounds[s + 1]] - offsets[s]).astype(np.uint32)
            return self.engine.submit(st.gather_shard_symbols, self.shards[s], self.engine.put(local), dtype)

        parts = list(in_order(self.engine, task, len(self.shards)))
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)

    def close(self) -> None:
        if self.store is None:
            self.engine.release(self.shards)
        else:
            shutil.rmtree(self.store, ignore_errors=True)


def _taken(path: str) -> TagArray:
    """The tags a worker left at ``path`` (:func:`~.shards.shard_tag_slice_to`), the file removed."""
    tags = np.fromfile(path, dtype=TAG_DTYPE)
    os.unlink(path)
    return tags


WINDOW = 4  # tasks in flight whose arguments the driver ships (bounds what the scheduler holds)


def in_order(engine: Engine, task: Callable[[int], Any], count: int, window: int = WINDOW) -> Iterator[Any]:
    """``task(0) .. task(count - 1)``'s results in order, at most ``window`` submitted ahead;
    each released once fetched."""
    pending: deque[Any] = deque()
    for i in range(min(window, count)):
        pending.append(task(i))
    for i in range(count):
        handle = pending.popleft()
        if i + window < count:
            pending.append(task(i + window))
        value = engine.result(handle)
        engine.release([handle])
        yield value


def load_sharded(
    engine: Engine, data: str, spec: TableSpec, key: AlignmentKey, log: EventLog, shard_bits: int | None = None,
    group_bits: int | None = None, stage: Callable[..., Any] = st.hash_partition, stage_args: tuple[Any, ...] = (),
    store_parent: Path | str | None = None, store_name: str = "table", keep_in: str = "disk",
) -> ShardedTable:  # fmt: skip
    """Read, check, hash and shard the table at ``data`` (a file, directory or glob) on the
    engine. Bad rows anywhere refuse the whole table (:class:`BadRowsError`, each problem with
    its file and line), and so do repeated ids, before any tag leaves the process.
    ``group_bits``: the shuffle's two levels (:func:`~secure_release.mechanism.alignment.sharding.group_bits_for`
    by default; 0: one level); the shards are the same either way. ``stage``: what reads a
    partition (:func:`~.shards.hash_partition`, or the PSI ring's
    :func:`~.psi_stages.point_partition`, which takes ``stage_args`` too). ``store_parent``: with
    the keyed hash on an engine whose workers share this host's files, the shards are stored
    there (:mod:`~secure_release.curator.cluster.shard_files`, in ``shards-<store_name>-*``), not
    held by the workers, as ``keep_in`` says (:func:`stores_on_disk`)."""
    from secure_release.curator.partitions import discover

    partitions = discover(data, PARTITION_ROWS)
    known = sum(int(p.num_rows or 0) for p in partitions)
    bits = sh.shard_bits_for(known or len(partitions) << 20) if shard_bits is None else shard_bits
    keyed = store_parent is not None and engine.shares_files and stage is st.hash_partition
    if keyed and stores_on_disk(keep_in, engine.memory_bytes, known or _input_bytes(partitions) // CSV_ROW_BYTES):
        return _load_stored(engine, data, partitions, spec, key, log, bits, Path(store_parent or "."), store_name)
    groups = sh.group_bits_for(len(partitions), bits) if group_bits is None else group_bits
    if not 0 <= groups <= bits:
        raise sh.ShardError(f"group bits {groups} must be between 0 and the shard bits {bits}")
    size = spec.schema.alphabet_size
    results = engine.submit_many(
        stage, [(i, p, spec, Sealed(key.reveal()), groups or bits, size, *stage_args) for i, p in enumerate(partitions)]
    )
    summaries = engine.submit_many(st.problems_of, [(r,) for r in results])
    # the merges are queued at once: a piece moves to its shard's worker as soon as its partition
    # (or its group's batch of partitions) is read; nothing leaves the cluster before every
    # partition is checked, below
    pieces = _shard_pieces(engine, results, bits, groups)
    shards = engine.submit_many(st.merge_shard, [(shard_pieces,) for shard_pieces in pieces])
    engine.release(results)  # each partition is dropped once its pieces are taken
    del pieces
    read = engine.results(summaries, "read")
    problems = [pr for _, probs in read for pr in probs]
    if problems:
        engine.release(shards)
        raise BadRowsError(str(data), [(p.line, f"{p.path}: {p.message}") for p in problems])
    log("partitions_read", partitions=len(partitions), rows=sum(n for n, _ in read), shards=1 << bits,
        peak_rss_mib=peak_rss_mib())  # fmt: skip
    merged = engine.results(engine.submit_many(st.shard_summary, [(shard,) for shard in shards]), "shuffle")
    table = ShardedTable(engine, str(data), partitions, spec, bits, shards, [n for n, _ in merged])
    repeated = [t for _, tags in merged for t in tags]
    if repeated:
        _raise_repeats(table, key, np.asarray(repeated, dtype=TAG_DTYPE)[:MAX_REPORTED], len(repeated))
    log("shards_sorted", shards=len(shards), rows=table.num_rows, peak_rss_mib=peak_rss_mib())
    return table


def _shard_pieces(engine: Engine, results: list[Any], bits: int, groups: int) -> list[list[Any]]:
    """Every shard's pieces, shard by shard. One level: one piece a partition. Two levels: each
    partition split into ``2^groups`` groups; the group's pieces of ``2^groups`` partitions at a
    time joined and split into the group's shards (:func:`~secure_release.curator.cluster.shards.regroup`);
    a shard's pieces are then one a batch."""
    if groups == 0:
        flat = engine.submit_many(st.piece_of, [(r, s) for s in range(1 << bits) for r in results])
        return [flat[s * len(results) : (s + 1) * len(results)] for s in range(1 << bits)]
    batch, per_group = 1 << groups, 1 << (bits - groups)
    pieces: list[list[Any]] = [[] for _ in range(1 << bits)]
    for first in range(0, len(results), batch):
        members = results[first : first + batch]
        parts = engine.submit_many(st.piece_of, [(r, group) for group in range(1 << groups) for r in members])
        blocks = engine.submit_many(
            st.regroup, [(parts[g * len(members) : (g + 1) * len(members)], bits, groups) for g in range(1 << groups)]
        )
        subs = engine.submit_many(st.piece_of, [(block, sub) for block in blocks for sub in range(per_group)])
        for shard, piece in enumerate(subs):  # block g's sub-pieces are shards g * per_group ...
            pieces[shard].append(piece)
        engine.release([*parts, *blocks])  # dropped once the group's shards took their pieces
    return pieces


def _raise_repeats(table: ShardedTable, key: AlignmentKey, wanted: TagArray, total: int) -> None:
    """The repeated ids as :class:`BadRowsError`: every occurrence's file and line (error path:
    the partitions are read once more to find them)."""
    found = table.engine.results(
        [table.engine.submit(st.locate_tags, p, table.spec, Sealed(key.reveal()), wanted) for p in table.partitions],
        "locate",
    )
    places: dict[int, list[tuple[str, int]]] = {}
    for hits in found:
        for path, line, which in hits:
            places.setdefault(which, []).append((path, line))
    problems = []
    for where in places.values():
        (first_path, first_line), rest = where[0], where[1:]
        problems += [
            (line, f"{path}: repeated id (first at {first_path} line {first_line}); ids must be unique")
            for path, line in rest
        ]
    if total > len(wanted):
        problems.append((0, f"{total - len(wanted)} more repeated ids not located"))
    table.close()
    raise BadRowsError(table.data, problems)


#: What the store takes at its peak, per byte of the input files (measured: the ids and symbols
#: compressed as the input is, 0.8-0.9 of it on the bench's data) and per row (a leader's row
#: orders, 4 bytes a follower's common row, and its symbols of them; a follower's symbols).
STORE_PER_INPUT_BYTE = 1.0
STORE_PER_ROW = 6


#: What the workers hold of a row between the stages when they keep the shards (a tag and a
#: symbol; twice that for a moment during the shuffle), and the share of their memory past which
#: ``--shard-store auto`` stores the shards on disk instead (where Dask would start to spill).
HELD_BYTES_A_ROW = 17
HOLD_FRACTION = 0.6


def stores_on_disk(keep_in: str, memory_bytes: int | None, rows: int) -> bool:
    """``--shard-store``: ``disk``, ``memory``, or ``auto``: on disk once the rows' held bytes
    pass :data:`HOLD_FRACTION` of the workers' memory (``memory_bytes``; unknown: on disk)."""
    if keep_in not in ("auto", "disk", "memory"):
        raise sh.ShardError(f"--shard-store must be auto, disk or memory, got {keep_in!r}")
    if keep_in != "auto":
        return keep_in == "disk"
    return memory_bytes is None or rows * HELD_BYTES_A_ROW > HOLD_FRACTION * memory_bytes


#: A CSV's rows are not known before it is read: bytes / this, for :func:`stores_on_disk`.
CSV_ROW_BYTES = 8


def _input_bytes(partitions: list[Any]) -> int:
    """The input files' bytes (each file once)."""
    sizes: dict[str, int] = {}
    for p in partitions:
        with contextlib.suppress(OSError):
            sizes[str(p.path)] = os.stat(p.path).st_size
    return sum(sizes.values())


def store_estimate(input_bytes: int, rows: int) -> int:
    """Bytes the engine's files are expected to take at their peak for this input."""
    return int(STORE_PER_INPUT_BYTE * input_bytes + STORE_PER_ROW * rows)


def check_free_space(parent: Path, partitions: list[Any]) -> int:
    """:class:`~secure_release.infra.fileio.DiskFullError` now, before anything is read or
    reserved, if the disk under ``parent`` has less room than :func:`store_estimate` for these
    partitions; else the estimate."""
    from secure_release.infra.fileio import DiskFullError

    files, inputs = len({str(p.path) for p in partitions}), _input_bytes(partitions)
    rows = sum(int(p.num_rows or 0) for p in partitions) or inputs // CSV_ROW_BYTES
    estimate = store_estimate(inputs, rows)
    free = shutil.disk_usage(parent).free
    if free < estimate:
        raise DiskFullError(
            f"the disk holding {parent} has {free:,} bytes free, and this table needs about {estimate:,} for the "
            f"engine's files ({files} input files of {inputs:,} bytes, {rows:,} rows: "
            f"{STORE_PER_INPUT_BYTE:g} x the input + {STORE_PER_ROW} bytes a row). Free space there or point the "
            "keystore at a larger disk; nothing was read and no budget reserved"
        )
    return estimate


def _load_stored(
    engine: Engine, data: str, partitions: list[Any], spec: TableSpec, key: AlignmentKey, log: EventLog, bits: int,
    parent: Path, name: str,
) -> ShardedTable:  # fmt: skip
    """:func:`load_sharded` into the store: each partition's rows to files by group of shards,
    then each group's shards merged into files; the workers hold one partition or one shard at a
    time. A store a killed run of the same release left is removed first."""
    estimate = check_free_space(parent, partitions)
    left = re.compile(rf"shards-{re.escape(name)}-[a-z0-9_]{{8}}")
    for stale in parent.glob(f"shards-{name}-*"):
        if left.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    store = Path(tempfile.mkdtemp(prefix=f"shards-{name}-", dir=parent))  # 0700
    try:
        size = spec.schema.alphabet_size
        sealed = Sealed(key.reveal())
        results = engine.submit_many(
            sf.partition_to_files, [(i, p, spec, sealed, bits, size, str(store)) for i, p in enumerate(partitions)]
        )
        groups = 1 << sf.file_group_bits(bits)
        merges = engine.submit_many(
            sf.merge_group_files, [(g, bits, results, str(store), sealed, size) for g in range(groups)]
        )
        read = engine.results(engine.submit_many(st.problems_of, [(r,) for r in results]), "read")
        problems = [pr for _, probs in read for pr in probs]
        if problems:
            raise BadRowsError(str(data), [(p.line, f"{p.path}: {p.message}") for p in problems])
        log("partitions_read", partitions=len(partitions), rows=sum(n for n, _ in read), shards=1 << bits,
            store=str(store), disk_estimate=estimate, peak_rss_mib=peak_rss_mib())  # fmt: skip
        merged = [pair for group in engine.results(merges, "merge") for pair in group]
        engine.release([*results, *merges])
    except BaseException:
        shutil.rmtree(store, ignore_errors=True)
        raise
    files = [f for f, _ in merged]
    table = ShardedTable(engine, str(data), partitions, spec, bits, files, [f.size for f in files], store)
    repeated = [t for _, tags in merged for t in tags]
    if repeated:
        _raise_repeats(table, key, np.asarray(repeated, dtype=TAG_DTYPE)[:MAX_REPORTED], len(repeated))
    log("shards_sorted", shards=len(files), rows=table.num_rows, stored_bytes=sf.stored_bytes(store),
        peak_rss_mib=peak_rss_mib())  # fmt: skip
    return table
