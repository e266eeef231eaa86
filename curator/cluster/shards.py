"""The curator's release stages over one partition or one tag shard (``--engine dask``).

The array steps (shard of a tag, split, sort, intersection, gather) are
:mod:`secure_release.mechanism.alignment.sharding`; this module adds the partition reads and the worker's
memory hand-back around them. Every stage is a plain function of its arguments (no engine, no
I/O but the partition read), so the same function runs in-process or on a Dask worker, and the
engine (:mod:`secure_release.curator.cluster.engine`) only schedules it.

The stages of one curator:

1. :func:`hash_partition`: read one partition against the schema (the same checks as a whole
   table; bad rows come back with their file and line), hash its ids into tags, and split
   ``(tag, symbol)`` by shard.
2. :func:`merge_shard`: one shard's pieces from every partition (or, past
   :data:`~secure_release.mechanism.alignment.sharding.TWO_LEVEL_PIECES`, from every batch of partitions
   :func:`regroup` joined), sorted by tag; equal adjacent
   tags are repeated ids (their tags come back; :func:`locate_tags` then finds each one's file
   and line, on the error path only).
3. The tags leave the curator shard by shard, ascending (:func:`shard_tags`); the leader spools
   every follower's tags into the same shards and matches each unit of a shard where its shard
   is (:func:`match_shard`, driven by :mod:`secure_release.curator.cluster.matching`): its own
   symbols of the common tags stay there (:func:`match_symbols`), each follower's stream
   indices of them come back (:func:`match_rows`), in canonical order.
4. A follower gathers its symbols at those rows shard by shard
   (:func:`~secure_release.mechanism.alignment.sharding.gather_symbols`); the shards' results in order are
   the curator's aligned column, which the seed's sample indexes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.curator.cluster.sealed import Sealed, opened
from secure_release.curator.cluster.shard_files import (
    PartitionResult,
    RowProblem,
    ShardFile,
    disk_full_named,
    shard_rows,
    shard_symbols,
)
from secure_release.curator.cluster.spool import SpoolRange, read_unit_rows, write_unit_rows
from secure_release.infra.memory import release_free_memory
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray, id_tags
from secure_release.mechanism.alignment.sharding import (
    WORK_DTYPE,
    HoldsArrays,
    Piece,
    Shard,
    ShardError,
    gather_symbols,
    intersect_shard,
    merge_pieces,
    owned,
    split_by_shard,
    symbol_dtype,
    unit_run,
    within_unit,
)
from secure_release.mechanism.primitives.keys import AlignmentKey


def piece_of(result: PartitionResult, shard: int) -> Piece:
    """Shard ``shard``'s piece of a partition (a tiny task that runs where the partition is);
    empty for a partition with bad rows (the table is refused once every partition is read)."""
    if result.problems:
        return Piece(np.zeros(0, dtype=WORK_DTYPE), np.zeros(0, dtype=np.uint8))
    piece = result.pieces[shard]
    return Piece(owned(piece.tags), owned(piece.symbols))  # not a view into a partition read back from disk


def regroup(pieces: Sequence[Piece], shard_bits: int, group_bits: int) -> PartitionResult:
    """The second level of a two-level shuffle: one group's pieces from a batch of partitions
    (their tags share the top ``group_bits`` bits), joined and split into the
    ``2^(shard_bits - group_bits)`` shards of the group."""
    tags = np.concatenate([p.tags for p in pieces]) if pieces else np.zeros(0, dtype=WORK_DTYPE)
    symbols = np.concatenate([p.symbols for p in pieces]) if pieces else np.zeros(0, dtype=np.uint8)
    split = split_by_shard(tags, shard_bits, symbols, skip_bits=group_bits)
    del tags, symbols
    release_free_memory()
    return PartitionResult(split, sum(int(p.tags.size) for p in split))


def shard_summary(shard: Shard) -> tuple[int, TagArray]:
    """What the driver needs of a shard: its size and its repeated tags (not its rows)."""
    return shard.size, shard.repeated


def shard_tags(shard: Shard) -> TagArray:
    """A shard's tags, ascending, as the wire carries them (what leaves the curator's domain)."""
    return shard.tags.astype(TAG_DTYPE)


def shard_tag_slice(shard: Shard | ShardFile, start: int, stop: int) -> TagArray:
    """Tags ``start .. stop - 1`` of a shard (ascending), as the wire carries them: a slice at a
    time, so what the curator process holds of its tags does not grow with the shard (a stored
    shard: only the batches of the slice are read, and their tags recomputed)."""
    if isinstance(shard, ShardFile):
        return shard_rows(shard, start, stop).tags.astype(TAG_DTYPE)
    return shard.tags[start:stop].astype(TAG_DTYPE)


def gather_shard_symbols(
    shard: Shard | ShardFile, rows: npt.NDArray[np.integer], dtype: str
) -> npt.NDArray[np.unsignedinteger]:
    """:func:`~secure_release.mechanism.alignment.sharding.gather_symbols` of a shard in memory
    or in the store (only its symbols file is read)."""
    at = np.asarray(rows, dtype=np.int64)
    if not isinstance(shard, ShardFile):
        return gather_symbols(shard, at, dtype)
    if at.size and (int(at.min()) < 0 or int(at.max()) >= shard.size):
        raise ShardError(f"a row order names a row outside this shard's {shard.size} rows")
    out: npt.NDArray[np.unsignedinteger] = shard_symbols(shard)[at].astype(dtype)
    return out


def shard_tag_slice_to(shard: Shard | ShardFile, start: int, stop: int, path: str) -> str:
    """:func:`shard_tag_slice` written to ``path`` (in the engine's handoff directory, which
    the curator process reads and removes) rather than sent: returns ``path``."""
    shard_tag_slice(shard, start, stop).tofile(path)
    return path


def gather_symbols_from(shard: Shard | ShardFile, path: str, dtype: str) -> npt.NDArray[np.unsignedinteger]:
    """:func:`gather_shard_symbols` at the rows the curator process left at ``path`` in the
    engine's handoff directory (:func:`~.spool.write_unit_rows`)."""
    return gather_shard_symbols(shard, read_unit_rows(Path(path)), dtype)


def merge_shard(pieces: Sequence[Piece]) -> Shard:
    """Stage 2: :func:`~secure_release.mechanism.alignment.sharding.merge_pieces`, then the worker hands the
    freed pages back (its memory limit counts them)."""
    shard = merge_pieces(pieces)
    release_free_memory()
    return shard


@dataclass(frozen=True)
class Match(HoldsArrays):
    """One shard matched, as a worker keeps it: the leader's symbols of the common tags and
    each follower's stream indices of them (uint32), both in canonical order."""

    own_symbols: npt.NDArray[np.unsignedinteger]
    follower_rows: tuple[npt.NDArray[np.uint32], ...]


def match_shard(
    own: Shard | ShardFile, others: Sequence[tuple[TagArray, npt.NDArray[np.integer]]], dtype: str,
    unit: tuple[int, int] | None = None,
) -> Match:  # fmt: skip
    """Stage 3 at the leader: :func:`~secure_release.mechanism.alignment.sharding.intersect_shard` of its
    shard with every follower's part of it, then its own symbols gathered at once (the rows
    never leave the worker). ``unit``: ``(unit, bits)``, the followers' tags are the unit's (their
    top ``bits`` bits are ``unit``; :class:`ShardError` if one is not), so only the shard's run of
    the unit is searched: a unit is a quarter of a shard, and each of its matches went over the
    whole shard before."""
    if isinstance(own, ShardFile):  # only the unit's run of the stored shard is read
        own = shard_rows(own, *((0, own.size) if unit is None else own.unit_bounds(*unit)))
    start, stop = (0, own.size) if unit is None else unit_run(own.tags, *unit)
    if unit is not None and not all(within_unit(tags, *unit) for tags, _ in others):
        raise ShardError(f"a follower's tags of unit {unit[0]} lie outside it")
    part = own if (start, stop) == (0, own.size) else Shard(own.tags[start:stop], own.symbols[start:stop], own.repeated)
    own_rows, follower_rows = intersect_shard(part, [(tags, np.asarray(sub, dtype=np.int64)) for tags, sub in others])
    return Match(gather_symbols(part, own_rows, dtype), tuple(r.astype(np.uint32) for r in follower_rows))


def match_spooled(
    own: Shard | ShardFile, ranges: Sequence[SpoolRange], dtype: str, row_files: Sequence[str],
    unit: tuple[int, int] | None = None, symbols_file: str | None = None,
) -> Match:  # fmt: skip
    """:func:`match_shard` on a worker that shares the leader's files (an embedded cluster):
    each follower's tags read from the leader's spool (``ranges``), each follower's rows
    written to its file in ``row_files`` (:func:`~.spool.write_unit_rows`) rather than kept or sent back, and the
    leader's symbols of the common tags to ``symbols_file``: once this task is done nothing of
    the match lives only on a worker, so the spool it read can go and a lost worker costs no
    re-match. Each file is written to a temporary name and renamed (a stray rerun of the task
    writes the same bytes; a reader never sees half a file)."""
    match = match_shard(own, [r.read() for r in ranges], dtype, unit)
    for path, rows in zip(row_files, match.follower_rows, strict=True):
        with disk_full_named(str(Path(path).parent), "a follower's row order of a unit", int(rows.size) // 4):
            write_unit_rows(Path(path), rows)
    if symbols_file is not None:
        where = str(Path(symbols_file).parent)
        with disk_full_named(where, "the leader's symbols of a unit", match.own_symbols.nbytes):
            write_whole(Path(symbols_file), np.ascontiguousarray(match.own_symbols).tobytes())
    return Match(match.own_symbols, ())


def write_whole(path: Path, data: bytes) -> None:
    """``data`` at ``path`` (0600), written to a temporary name beside it and renamed."""
    temp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    with open(os.open(temp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "wb") as fh:  # the user's only
        fh.write(data)
    os.replace(temp, path)


def symbols_from(path: str, stored: str, dtype: str) -> npt.NDArray[np.unsignedinteger]:
    """The leader's symbols of one matched unit, from the file its match wrote as ``stored``
    (:func:`match_spooled`), as ``dtype``: a run of the aligned column that any worker can redo."""
    return np.fromfile(path, dtype=stored).astype(dtype, copy=False)


def match_rows(match: Match) -> tuple[int, tuple[npt.NDArray[np.uint32], ...]]:
    """What the leader's process takes of a match: its common-row count and the followers' rows
    (none if the worker wrote them: :func:`match_spooled`)."""
    return int(match.own_symbols.size), match.follower_rows


def match_symbols(match: Match) -> npt.NDArray[np.unsignedinteger]:
    """The leader's symbols of a shard's common tags (gathered once the release is prepared)."""
    return match.own_symbols


def hash_partition(
    index: int, partition: Any, spec: Any, alignment_key_bytes: Sealed | bytes, shard_bits: int, alphabet_size: int
) -> PartitionResult:
    """Stage 1 for partition ``index`` (a :class:`~secure_release.curator.partitions.Partition`
    read against ``spec``, a ``TableSpec``): bad rows come back as problems (the release is then
    refused as a whole); else its tags and symbols split by shard. Repeats are found by the
    shard merge, across partitions. The alignment key travels as its bytes (an
    :class:`AlignmentKey` refuses to be pickled): only to the curator's own workers."""
    from secure_release.curator.partitions import read_partition
    from secure_release.curator.table import BadRowsError

    try:
        table = read_partition(partition, spec, check_repeats=False)
    except BadRowsError as exc:
        problems = tuple(RowProblem(str(partition.path), line, message) for line, message in exc.problems)
        return PartitionResult((), 0, problems)
    tags = id_tags(table.id_values(), AlignmentKey(opened(alignment_key_bytes))).astype(WORK_DTYPE)
    symbols = table.symbols().astype(symbol_dtype(alphabet_size))
    del table
    pieces = split_by_shard(tags, shard_bits, symbols)
    del tags, symbols
    release_free_memory()  # Arrow's pool and glibc's heap keep freed pages: a worker's limit counts them
    return PartitionResult(pieces, sum(int(p.tags.size) for p in pieces))


def problems_of(result: PartitionResult) -> tuple[int, tuple[RowProblem, ...]]:
    """What the driver needs of a partition before the shuffle: its row count and bad rows."""
    return result.num_rows, result.problems


def locate_tags(
    partition: Any, spec: Any, alignment_key_bytes: Sealed | bytes, wanted: TagArray
) -> list[tuple[str, int, int]]:
    """Error path only: (file, line, which wanted tag) of every row of ``partition`` whose id
    hashes to one of ``wanted`` (the repeated ids a shard merge found)."""
    from secure_release.curator.partitions import read_partition

    table = read_partition(partition, spec, check_repeats=False)
    tags = id_tags(table.id_values(), AlignmentKey(opened(alignment_key_bytes)))
    tags = np.ascontiguousarray(tags, dtype=TAG_DTYPE).view("V16").reshape(-1)
    want = np.ascontiguousarray(wanted, dtype=TAG_DTYPE).view("V16").reshape(-1)
    rows = np.flatnonzero(np.isin(tags, want))
    which = np.searchsorted(np.sort(want), tags[rows])
    first_line = int(partition.first_row) + 2  # header is line 1 (Parquet: row index + 2)
    return [(str(partition.path), first_line + int(r), int(w)) for r, w in zip(rows, which, strict=True)]
