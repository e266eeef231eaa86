"""A curator's table as tag shards on an engine (``--engine dask``), and the leader that
intersects shards (:class:`ClusterLeader`).

No process holds the n tags: the partitions are read and hashed on the workers, each shard is
sorted there, the tags leave the curator one shard at a time (ascending: the canonical order),
and a leader puts every follower's tags into its own shards as they arrive (spooled to
``spool`` files, one per shard, 24 bytes a tag with its submission index) and intersects shard
by shard on its workers. What the curator process holds is one shard at a time, the row order
the leader sends (4 bytes a row) and the aligned column (1-4 bytes a row); the sample, the pad
and the upload are then those of the in-process path, so the ciphertext is the same bytes.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.curator import shards as st
from secure_release.curator.engine import Engine
from secure_release.curator.errors import AgreementNotReadyError
from secure_release.curator.leader import LeaderState
from secure_release.curator.table import BadRowsError, TableSpec
from secure_release.infra.logs import EventLog, peak_rss_mib
from secure_release.infra.streams import AgreementError, tags_from_bytes
from secure_release.mechanism import sharding as sh
from secure_release.mechanism.alignment import TAG_DTYPE, TagArray
from secure_release.mechanism.keys import AlignmentKey, Seed
from secure_release.mechanism.plan import plan_release
from secure_release.mechanism.protocol import Agreement
from secure_release.mechanism.spec import ReleaseSpec
from secure_release.mechanism.variants import AlignmentMode, SamplingMode, VariantAgreement

SPOOL_DTYPE = np.dtype([("tag", "V16"), ("submitted", "<u8")])
MAX_REPORTED = 50  # repeated ids located and named in one report
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
    shards: list[Any]  # engine handles of shards.Shard, in shard order
    sizes: list[int]  # rows of each shard

    @property
    def num_rows(self) -> int:
        return int(sum(self.sizes))

    @property
    def alphabet_size(self) -> int:
        return self.spec.schema.alphabet_size

    def tag_pieces(self) -> Iterator[TagArray]:
        """Every tag, ascending, one shard at a time (the next shard is fetched while this one is
        sent)."""
        pending = [self.engine.submit(st.shard_tags, sh) for sh in self.shards[:2]]
        for s in range(len(self.shards)):
            if s + 2 < len(self.shards):
                pending.append(self.engine.submit(st.shard_tags, self.shards[s + 2]))
            handle = pending.pop(0)
            tags = self.engine.result(handle)
            self.engine.release([handle])
            yield tags

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
            return self.engine.submit(sh.gather_symbols, self.shards[s], local, dtype)

        parts = list(in_order(self.engine, task, len(self.shards)))
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)

    def close(self) -> None:
        self.engine.release(self.shards)


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
    engine: Engine, data: str, spec: TableSpec, key: AlignmentKey, log: EventLog, shard_bits: int | None = None
) -> ShardedTable:
    """Read, check, hash and shard the table at ``data`` (a file, directory or glob) on the
    engine. Bad rows anywhere refuse the whole table (:class:`BadRowsError`, each problem with
    its file and line), and so do repeated ids, before any tag leaves the process."""
    from secure_release.curator.partitions import discover

    partitions = discover(data, PARTITION_ROWS)
    known = sum(int(p.num_rows or 0) for p in partitions)
    bits = sh.shard_bits_for(known or len(partitions) << 20) if shard_bits is None else shard_bits
    size = spec.schema.alphabet_size
    results = [engine.submit(st.hash_partition, i, p, spec, key.reveal(), bits, size) for i, p in enumerate(partitions)]
    summaries = engine.results([engine.submit(st.problems_of, r) for r in results], "read")
    problems = [pr for _, probs in summaries for pr in probs]
    if problems:
        engine.release(results)
        raise BadRowsError(str(data), [(p.line, f"{p.path}: {p.message}") for p in problems])
    log("partitions_read", partitions=len(partitions), rows=sum(n for n, _ in summaries), shards=1 << bits,
        peak_rss_mib=peak_rss_mib())  # fmt: skip
    shards = [
        engine.submit(st.merge_shard, [engine.submit(st.piece_of, r, s) for r in results]) for s in range(1 << bits)
    ]
    engine.release(results)  # each partition is dropped once its pieces are merged
    merged = engine.results([engine.submit(st.shard_summary, sh) for sh in shards], "shuffle")
    table = ShardedTable(engine, str(data), partitions, spec, bits, shards, [n for n, _ in merged])
    repeated = [t for _, tags in merged for t in tags]
    if repeated:
        _raise_repeats(table, key, np.asarray(repeated, dtype=TAG_DTYPE)[:MAX_REPORTED], len(repeated))
    log("shards_sorted", shards=len(shards), rows=table.num_rows, peak_rss_mib=peak_rss_mib())
    return table


def _raise_repeats(table: ShardedTable, key: AlignmentKey, wanted: TagArray, total: int) -> None:
    """The repeated ids as :class:`BadRowsError`: every occurrence's file and line (error path:
    the partitions are read once more to find them)."""
    found = table.engine.results(
        [table.engine.submit(st.locate_tags, p, table.spec, key.reveal(), wanted) for p in table.partitions], "locate"
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


class SpooledRows:
    """A follower's row order as the leader keeps it: uint32 in a file, read a slice at a time
    (``row_pieces`` asks for ``size`` and slices)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.size = path, size

    def __getitem__(self, part: slice) -> npt.NDArray[np.uint32]:
        start, stop, _ = part.indices(self.size)
        with self.path.open("rb") as fh:
            fh.seek(4 * start)
            return np.fromfile(fh, dtype="<u4", count=max(0, stop - start))


@dataclass
class ClusterLeader(LeaderState):
    """The leader on an engine: its own rows are a :class:`ShardedTable`; each follower's tags
    are put into the same shards as they arrive (spooled to disk, never held whole), and the
    agreement intersects shard by shard. Keyed-hash alignment and seed sampling only."""

    engine: Engine | None = None
    own: ShardedTable | None = None
    spool: Path | None = None
    own_counts: list[int] = field(default_factory=list)  # common rows of each own shard
    row_files: dict[str, SpooledRows] = field(default_factory=dict)
    streaming: set[str] = field(default_factory=set)  # followers whose tag stream is arriving now
    count: int = 0

    def attach(self, own: ShardedTable, spool_parent: Path | None) -> None:
        """The leader's own shards; follower tags spool under ``spool_parent`` (0700)."""
        self.own, self.engine = own, own.engine
        self.spool = Path(tempfile.mkdtemp(prefix=f"spool-{self.release_id}-", dir=spool_parent))

    def _shard_files(self, curator: str) -> list[Path]:
        assert self.spool is not None and self.own is not None
        return [self.spool / f"{curator}-{s:05d}.tags" for s in range(1 << self.own.shard_bits)]

    def add_tag_stream(
        self, curator: str, pieces: Iterable[bytes], alphabet_size: int, alignment: AlignmentMode
    ) -> int:
        """A follower's tags, in any order, into the leader's shards (24 bytes a tag on disk,
        with the tag's index in the stream); returns how many arrived. Then as :meth:`add_tags`."""
        self.check_alignment(curator, alignment)
        if self.own is None:
            raise AgreementNotReadyError(f"the leader of {self.release_id!r} is still reading its own table; retry")
        with self.cond:
            if curator in self.streaming:
                raise AgreementNotReadyError(f"{curator!r} is already sending its tags for {self.release_id!r}; retry")
            self.streaming.add(curator)
            spool = self.agreement is None  # once fixed, a resend is only compared (by digest), never stored
        try:
            digest, received = self._spool_stream(curator, pieces, spool)
        finally:
            with self.cond:
                self.streaming.discard(curator)
        self._record(curator, digest, alphabet_size)
        return received

    def _spool_stream(self, curator: str, pieces: Iterable[bytes], spool: bool) -> tuple[str, int]:
        """The stream's digest and tag count; with ``spool``, each tag written to its shard's file."""
        assert self.own is not None
        digest, received = hashlib.sha256(), 0
        files = self._shard_files(curator)
        handles = [path.open("wb") for path in files] if spool else []
        try:
            for piece in pieces:
                digest.update(piece)
                tags = tags_from_bytes(piece)
                if spool:
                    self._write_piece(tags, received, handles)
                received += int(tags.size)
        finally:
            for fh in handles:
                fh.close()
        return digest.hexdigest(), received

    def _write_piece(self, tags: TagArray, first: int, handles: list[Any]) -> None:
        """One piece of a stream into the shard files (each tag with its index in the stream)."""
        assert self.own is not None
        shard = sh.shard_of(tags, self.own.shard_bits)
        order = np.argsort(shard, kind="stable")
        record = np.empty(tags.size, dtype=SPOOL_DTYPE)
        record["tag"] = np.ascontiguousarray(tags, dtype=TAG_DTYPE).view("V16").reshape(-1)[order]
        record["submitted"] = order + first
        bounds = np.searchsorted(shard[order], np.arange(len(handles) + 1))
        for s in np.flatnonzero(np.diff(bounds)).tolist():
            handles[s].write(record[bounds[s] : bounds[s + 1]].tobytes())

    def _record(self, curator: str, digest: str, alphabet_size: int) -> None:
        with self.cond:
            if self.error is not None:
                raise self._failure()
            size = self._checked_size(curator, alphabet_size)
            if self.agreement is not None:
                if self._is_resubmission(curator, digest, size):
                    return
                from secure_release.curator.errors import AgreementFixedError

                raise AgreementFixedError(f"the agreement of release {self.release_id!r} is already fixed")
            self.tags[curator] = np.zeros(0, dtype=TAG_DTYPE)  # arrived (the tags are in the spool)
            self.digests[curator] = digest
            self.sizes[curator] = size
            self.cond.notify_all()

    def add_tags(
        self, curator: str, tags: TagArray, alphabet_size: int, alignment: AlignmentMode | None = None
    ) -> None:
        """The leader's own part (its tags are its shards) or a follower's whole tag array."""
        if curator == self.curators[0]:
            self._record(curator, "own", alphabet_size)
            return
        self.add_tag_stream(
            curator, [np.ascontiguousarray(tags, dtype=TAG_DTYPE).tobytes()], alphabet_size, alignment or self.alignment
        )

    def restore(self, *args: Any, **kwargs: Any) -> None:
        raise AgreementError(
            f"release {self.release_id!r}: a leader on a cluster does not resume an agreement it fixed before "
            "preparing; abort it ('release abort') and start the release again under a new id"
        )

    def agree(self) -> VariantAgreement:
        """Intersect shard by shard on the engine; each follower's row order goes to the spool."""
        with self.cond:
            if self.agreement is not None:
                return self.agreement
            try:
                self.agreement = self._intersect_and_agree()
            except Exception as exc:
                self._fail(f"{type(exc).__name__}: {exc}")
                raise
            self.cond.notify_all()
            return self.agreement

    def _intersect_and_agree(self) -> VariantAgreement:
        assert self.own is not None and self.engine is not None and self.spool is not None
        if self.alignment is not AlignmentMode.KEYED_HASH or self.sampling is not SamplingMode.SEED:
            raise AgreementError("a leader on a cluster aligns by keyed hash and samples by seed only")
        followers = list(self.curators[1:])
        files = {c: self._shard_files(c) for c in followers}
        outs = {c: (self.spool / f"rows-{c}.u32").open("wb") for c in followers}
        own_out = (self.spool / "rows-own.u32").open("wb")
        own = self.own

        def task(s: int) -> Any:
            others = []
            for c in followers:
                path = files[c][s]
                rec = np.fromfile(path, dtype=SPOOL_DTYPE) if path.exists() else np.zeros(0, SPOOL_DTYPE)
                path.unlink(missing_ok=True)  # shipped with the task
                others.append((rec["tag"].view(TAG_DTYPE), rec["submitted"].astype(np.int64)))
            return self.engine.submit(sh.intersect_shard, own.shards[s], others)  # type: ignore[union-attr]

        try:
            for own_rows, follower_rows in in_order(self.engine, task, len(own.shards)):
                own_out.write(own_rows.astype("<u4").tobytes())
                self.own_counts.append(int(own_rows.size))
                for c, rows in zip(followers, follower_rows, strict=True):
                    outs[c].write(rows.astype("<u4").tobytes())
        finally:
            for fh in [own_out, *outs.values()]:
                fh.close()
        self.count = sum(self.own_counts)
        self.row_files = {c: SpooledRows(self.spool / f"rows-{c}.u32", self.count) for c in followers}
        plan = plan_release(self.count, [self.sizes[c] for c in self.curators], self.epsilon, self.m)
        spec = ReleaseSpec(self.release_id, self.curators, self.cipher, plan, self.researchers).validate()
        base = Agreement(spec, self.seed or Seed.generate(), np.zeros(0, dtype=TAG_DTYPE))
        return VariantAgreement(base, self.sampling, self.alignment, count=self.count)

    def rows_of(self, curator: str) -> Any:
        with self.cond:
            return self.row_files.get(curator)

    def own_aligned(self) -> npt.NDArray[Any]:
        """The leader's symbols of the common ids in canonical order (gathered on the engine)."""
        assert self.own is not None and self.engine is not None and self.spool is not None
        own, engine = self.own, self.engine
        dtype = sh.symbol_dtype(own.alphabet_size)
        starts = np.concatenate([[0], np.cumsum(self.own_counts)]).astype(np.int64)
        rows = SpooledRows(self.spool / "rows-own.u32", self.count)

        def task(s: int) -> Any:
            return engine.submit(sh.gather_symbols, own.shards[s], rows[int(starts[s]) : int(starts[s + 1])], dtype)

        parts = list(in_order(engine, task, len(own.shards)))
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)

    def cleanup(self) -> None:
        """Remove the spool (follower tags and row orders) once every follower has its rows."""
        if self.spool is not None:
            shutil.rmtree(self.spool, ignore_errors=True)
