"""A curator's aligned column on its cluster: pieces in canonical order that stay on the workers.

The aligned column (this curator's symbol of every common id, in the canonical order) is n
symbols; on a cluster no process holds it. It is a list of :class:`AlignedPieces` entries, each
an engine handle of one contiguous run of it (a leader: the own symbols of one shard's matched
units; a follower: one shard's symbols at the rows the leader sent) and the run's size. The
sample (:mod:`secure_release.curator.cluster.sample`) reads them where they are.

A follower's row order arrives from the leader 4 bytes a row; :class:`ShardRowSink` takes it
piece by piece as it streams (``agreement_from_chunks(..., rows_sink)``), checks it (strictly
ascending, inside the table) and hands each shard's part to the worker holding that shard as
soon as the stream moved past it, so the follower's process holds one shard's rows at a time.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.curator.cluster import shards as st
from secure_release.curator.cluster.engine import Engine
from secure_release.curator.cluster.sharded import ShardedTable
from secure_release.curator.cluster.spool import write_unit_rows
from secure_release.infra.streams import AgreementError
from secure_release.mechanism.alignment import sharding as sh


@dataclass
class AlignedPieces:
    """The aligned column as runs on the engine, in canonical order: ``sources[i]`` are the
    handles whose symbols, concatenated, are run i (``sizes[i]`` symbols)."""

    engine: Engine
    sources: list[list[Any]]
    sizes: list[int]
    dtype: str

    @property
    def num_rows(self) -> int:
        return int(sum(self.sizes))

    @property
    def starts(self) -> list[int]:
        """Where each run begins in the canonical order."""
        return [0, *np.cumsum(self.sizes).tolist()][:-1]

    def release(self) -> None:
        self.engine.release([h for run in self.sources for h in run])


def leader_pieces(engine: Engine, matches: Sequence[Any], units_per_shard: int, dtype: str,
                  counts: Sequence[int]) -> AlignedPieces:  # fmt: skip
    """A cluster leader's aligned column: the own symbols of each shard's matched units (the
    units of one shard are on its worker, so a run moves nothing)."""
    sources, sizes = [], []
    for first in range(0, len(matches), units_per_shard):
        units = range(first, min(first + units_per_shard, len(matches)))
        sources.append(engine.submit_many(st.match_symbols, [(matches[u],) for u in units]))
        sizes.append(int(sum(counts[u] for u in units)))
    return AlignedPieces(engine, sources, sizes, dtype)


@dataclass
class ShardRowSink:
    """A follower's row order (indices into the tags it sent, ascending), taken as it streams:
    each shard's rows go to that shard's worker, gathered there into the shard's run of the
    aligned column. :class:`AgreementError` if the rows are not strictly ascending or name a row
    outside the table."""

    table: ShardedTable
    pieces: AlignedPieces | None = None
    _offsets: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    _shard: int = 0
    _pending: list[npt.NDArray[np.uint32]] = field(default_factory=list)
    _last: int = -1
    _count: int = 0

    def reset(self) -> None:
        """Start again (a retried fetch): the runs gathered so far are dropped."""
        if self.pieces is not None:
            self.pieces.release()
        dtype = sh.symbol_dtype(self.table.alphabet_size)
        self.pieces = AlignedPieces(self.table.engine, [], [], dtype)
        self._offsets = np.concatenate([[0], np.cumsum(self.table.sizes)]).astype(np.int64)
        self._shard, self._pending, self._last, self._count = 0, [], -1, 0

    def add(self, rows: npt.NDArray[np.uint32]) -> None:
        """One piece of the row order (in order)."""
        if self.pieces is None:
            self.reset()
        if rows.size == 0:
            return
        if int(rows[0]) <= self._last or (rows.size > 1 and not bool(np.all(rows[1:] > rows[:-1]))):
            raise AgreementError("the leader's row order is not ascending (this curator sent its tags ascending)")
        if int(rows[-1]) >= int(self._offsets[-1]):
            rows_in_table = self.table.num_rows
            raise AgreementError(f"the leader's row order names a row outside this curator's {rows_in_table} rows")
        self._last = int(rows[-1])
        self._count += int(rows.size)
        cuts = np.searchsorted(rows, self._offsets[self._shard + 1 :], side="left")
        at, shard = 0, self._shard
        for cut in cuts.tolist():
            if cut >= rows.size:  # the rest of the piece is in this shard
                break
            self._pending.append(rows[at:cut])
            self._flush(shard)
            shard, at = shard + 1, cut
        self._shard = shard
        self._pending.append(rows[at:])

    def finish(self, count: int) -> None:
        """The stream ended with ``count`` rows: the last shard's run is gathered."""
        if self.pieces is None:
            self.reset()
        if count != self._count:
            raise AgreementError(f"the row order holds {self._count} rows, the agreement says {count}")
        self._flush(self._shard)
        self._shard = len(self.table.sizes)

    def _flush(self, shard: int) -> None:
        """Shard ``shard``'s rows (all pending) to its worker; its run of the aligned column is
        gathered there. A shard none of whose rows are common gives no run."""
        assert self.pieces is not None
        pending, self._pending = self._pending, []
        rows = np.concatenate(pending) if pending else np.zeros(0, dtype=np.uint32)
        if rows.size == 0:
            return
        local = (rows.astype(np.int64) - int(self._offsets[shard])).astype(np.uint32)
        engine, handle = self.table.engine, self.table.shards[shard]
        if engine.handoff is not None:  # left for the worker in a file, not sent over TLS (kept until
            path = engine.handoff / f"rows-{secrets.token_hex(8)}-{shard}"  # the cluster stops: a
            write_unit_rows(path, local)  # worker lost redoes the gather from it; compressed)
            run = engine.submit(st.gather_symbols_from, handle, str(path), self.pieces.dtype)
        else:
            run = engine.submit(st.gather_shard_symbols, handle, engine.put(local, near=handle), self.pieces.dtype)
        self.pieces.sources.append([run])
        self.pieces.sizes.append(int(rows.size))
