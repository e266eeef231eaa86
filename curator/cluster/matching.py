"""The leader on a cluster (``--engine dask``): its own rows are tag shards on its workers, each
follower's tags are spooled into the same shards as they arrive, and they are matched while
the tags still arrive.

A follower on a cluster streams its tags ascending, in one stream or in P concurrent parts (one
a run of whole shards: ``TagChunk.part``), so the units of the leader's shards (a quarter of a
shard each: :data:`UNIT_BITS` more tag bits) complete one after another within each part. As
soon as every follower's tags of a unit have arrived, the matcher thread ships them straight to
the worker that holds the leader's shard (not through the scheduler) and intersects them there
(:func:`~secure_release.curator.cluster.shards.match_shard`). The leader's symbols of the common tags
stay on the workers until the release gathers them; each follower's row order comes back as
uint32 and is appended to its rows file, unit by unit. A part that is not ascending is matched
once it has ended; a part sent again (a resend before the agreement is fixed) starts the
matching over. A part writes only the shards it holds (two parts holding one shard, or parts
whose rows do not tile the follower's, fail the agreement: :class:`TagPartsError`).

What this process holds: one unit's follower tags at a time (the spool is on disk: 20 bytes a
tag in two files a shard, ``.tags`` and ``.rows``, under the keystore, 0700), the row orders as
files (one a unit), and the aligned column once gathered. On an engine whose workers share this
host's files each match also leaves the leader's symbols of its common tags in a file (1-2 bytes
a common row) and its handle is released: nothing of a match lives only on a worker, so a worker
lost after it costs no re-match, and the aligned column's runs are read from those files. A
shard's spool files are removed as soon as its units are matched, so the spool holds what has
arrived and is not matched yet, not every follower tag (20 GB at 10^9 rows). A resend then
re-matches only the shards it rewrites;
it fails the agreement (:class:`TagPartsError`) only where a re-match would need removed tags
(another follower's, or a part's own tags when it stops ascending after they were matched).
The rest is removed at the end of the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from secure_release.curator.cluster import shards as st
from secure_release.curator.cluster.aligned import AlignedPieces, leader_pieces
from secure_release.curator.cluster.engine import Engine
from secure_release.curator.cluster.shard_files import disk_full_named
from secure_release.curator.cluster.sharded import WINDOW, ShardedTable, in_order
from secure_release.curator.cluster.spool import SpoolError, SpoolRange, read_unit_rows, suffixed, write_unit_rows
from secure_release.curator.errors import AgreementNotReadyError
from secure_release.curator.leader import LeaderState, TagParts, TagPartsError
from secure_release.infra.streams import TAG_BYTES, WHOLE_STREAM, AgreementError, TagPart
from secure_release.mechanism.alignment import sharding as sh
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray
from secure_release.mechanism.errors import ShapeMismatchError
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode, VariantAgreement
from secure_release.mechanism.protocol.in_memory import Agreement
from secure_release.mechanism.protocol.spec import ReleaseSpec, designed_spec


class SpooledRows:
    """A follower's row order as the leader keeps it: one file a unit (``counts[i]`` rows in
    ``paths[i]``, in unit order; :func:`~secure_release.curator.cluster.spool.write_unit_rows`),
    read a slice at a time (``row_pieces`` asks for ``size`` and slices; the last unit read is
    kept, as the slices come in order)."""

    def __init__(self, paths: list[Path], counts: list[int]) -> None:
        self.paths = paths
        self.counts = [int(c) for c in counts]
        self.ends = np.cumsum(np.asarray(counts, dtype=np.int64))
        self.size = int(self.ends[-1]) if len(counts) else 0
        self._last: tuple[int, npt.NDArray[np.uint32]] | None = None

    def _unit(self, unit: int) -> npt.NDArray[np.uint32]:
        if self._last is None or self._last[0] != unit:
            self._last = (unit, read_unit_rows(self.paths[unit], self.counts[unit]))
        return self._last[1]

    def __getitem__(self, part: slice) -> npt.NDArray[np.uint32]:
        start, stop, _ = part.indices(self.size)
        out = [np.zeros(0, dtype="<u4")]
        unit = int(np.searchsorted(self.ends, start, side="right"))
        while start < stop:  # each unit the slice touches
            first = int(self.ends[unit - 1]) if unit else 0
            count = min(stop, int(self.ends[unit])) - start
            out.append(self._unit(unit)[start - first : start - first + count])
            start, unit = start + count, unit + 1
        return np.concatenate(out)


def _opened(path: Path, append: bool) -> BinaryIO:
    return path.open("ab") if append else path.open("wb")


#: Follower tags (and their rows: 20 bytes a tag) the spool holds ahead of the matching before an
#: ascending stream is held (:meth:`ClusterLeader._wait_for_matching`).
SPOOL_AHEAD_BYTES = 1 << 30
#: Each shard is matched in 2^UNIT_BITS units (ranges of the next tag bits), so that the last
#: unit of an ascending stream is all that is left to match once the stream ends.
UNIT_BITS = 2


class _Spooler:
    """One part of a follower's tags (the whole stream is part 0 of 1) into the leader's shard
    files: ``<curator>-<shard>.tags`` (the tags as they came, 16 bytes each) and ``.rows`` (each
    tag's row: the part's first row plus its index in the part, uint32). A part writes only the
    shards it claimed (:meth:`ClusterLeader._claim`: a shard held by another part refuses it),
    opening their files when it first writes one. An ascending part (a sharded follower's) is
    written as it arrives, slices of the received bytes, claims every shard from its first tag's
    (part 0: from shard 0) to its current one, and completes its units one after another; any
    other piece is split by shard and completes nothing before the part ends."""

    def __init__(self, leader: ClusterLeader, curator: str, part: TagPart) -> None:
        assert leader.own is not None
        self.leader, self.curator, self.part, self.bits = leader, curator, part, leader.own.shard_bits
        self.paths = leader.shard_files(curator)
        self.files: dict[int, tuple[BinaryIO, BinaryIO]] = {}  # shard -> its (.tags, .rows), opened lazily
        self.opened: set[int] = set()  # shards whose files this part created (later opens append)
        self.last: tuple[int, int] | None = (-1, -1)  # the last tag while the part ascends, else None
        self.reach: int | None = 0 if part.index == 0 else None  # ascending: the first shard not claimed yet
        self.done = 0  # units complete (ascending)
        self.written = [0] * len(self.paths)  # tags in each shard's files
        self.starts: dict[int, int] = {}  # ascending: where each unit begins in its shard's files

    def add(self, piece: bytes, first: int) -> None:
        """``piece``'s tags, the first of them at row ``first``."""
        tags = np.frombuffer(piece, dtype=TAG_DTYPE)
        hi, lo = sh.tag_words(tags)
        if self.last is not None and (int(hi[0]), int(lo[0])) > self.last and sh.ascending(hi, lo):
            self._add_ascending(piece, first, hi, lo)
            return
        if self.last is not None:  # no longer ascending: shards handed to the matcher may grow now
            self.last = None
            if self.done:
                with self.leader.cond:
                    self.leader._invalidate(self.curator, self.leader.shards_of(self.curator, {self.part.index}), False)
        rows = np.arange(first, first + tags.size, dtype=np.uint32)  # split with the tags, as symbols are
        split = sh.split_by_shard(tags, self.bits, rows)
        with self.leader.cond:
            self.leader._claim(self.curator, self.part.index, [s for s, p in enumerate(split) if p.tags.size])
        for shard, part in enumerate(split):
            if part.tags.size:
                self._write(shard, part.tags.tobytes(), part.symbols)

    def _add_ascending(self, piece: bytes, first: int, hi: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64]) -> None:
        units = sh.top_bits(hi, self.bits + UNIT_BITS)
        top = units >> UNIT_BITS  # the shard of each tag: its top bits
        low, high = int(top[0]), int(top[-1])
        bounds = np.searchsorted(top, np.arange(low, high + 2)).tolist()  # ascending: one run a shard
        view = memoryview(piece)
        reach = low if self.reach is None else self.reach  # the shards it moved over are its own too
        with self.leader.cond:
            self.leader._claim(self.curator, self.part.index, range(reach, high + 1))
            self.reach = high + 1
            for unit in units[np.flatnonzero(np.diff(units, prepend=-1))].tolist():  # ascending: each unit once
                self.starts.setdefault(unit, self.written[unit >> UNIT_BITS] + int(np.searchsorted(units, unit)) -
                                       bounds[(unit >> UNIT_BITS) - low])  # fmt: skip
        for shard in range(low, high + 1):
            start, stop = bounds[shard - low], bounds[shard - low + 1]
            self._write(shard, view[TAG_BYTES * start : TAG_BYTES * stop],
                        np.arange(first + start, first + stop, dtype="<u4"))  # fmt: skip
        self.last = (int(hi[-1]), int(lo[-1]))
        for shard in range(low, high + 1):  # the matcher reads what is written, not what is buffered
            if shard in self.files:
                for fh in self.files[shard]:
                    fh.flush()
        for shard in [s for s in self.files if s < high]:  # moved past (so never written again): closed
            for fh in self.files.pop(shard):  # before the matcher may remove them (an open file keeps its disk)
                fh.close()
        self._complete(int(units[-1]))

    def _write(self, shard: int, raw: bytes | memoryview, rows: npt.NDArray[np.integer]) -> None:
        if shard not in self.files:  # claimed by this part: a file another part left is replaced
            append = shard in self.opened
            self.files[shard] = (_opened(suffixed(self.paths[shard], ".tags"), append),
                                 _opened(suffixed(self.paths[shard], ".rows"), append))  # fmt: skip
            self.opened.add(shard)
        tags, row_file = self.files[shard]
        tags.write(raw)
        row_file.write(np.ascontiguousarray(rows, dtype="<u4").data)
        self.written[shard] += int(rows.size)

    def unit_range(self, unit: int) -> tuple[int, int] | None:
        """(Under the leader's ``cond``, for a complete unit of a shard this part holds.) Where
        the unit's tags are in its shard's files, if the part ascends (else None: they may be
        anywhere in them)."""
        if self.last is None:
            return None
        if unit not in self.starts:
            return 0, 0
        shard = unit >> UNIT_BITS
        later = [at for other, at in self.starts.items() if other > unit and other >> UNIT_BITS == shard]
        return self.starts[unit], min(later, default=self.written[shard])

    def moved_past(self, unit: int) -> bool:
        """(Under the leader's ``cond``.) The part ascends and its tags have moved past ``unit``."""
        return self.last is not None and self.done > unit

    def _complete(self, below: int) -> None:
        """Units below ``below`` get no more tags of this part (it ascends and moved past them)."""
        if below > self.done:
            with self.leader.cond:
                self.done = below
                self.leader.cond.notify_all()

    def close(self) -> None:
        for pair in self.files.values():
            for fh in pair:
                fh.close()


class _RestartMatchingError(Exception):
    """The matching must start over (a follower's stream started again) or stop (closing)."""


@dataclass
class ClusterLeader(LeaderState):
    """The leader on an engine: keyed-hash alignment (or PSI with one follower: its PSI tags in
    the follower's domain are matched as keyed-hash tags are) and seed sampling only (see the
    module)."""

    engine: Engine | None = None
    own: ShardedTable | None = None
    spool: Path | None = None
    own_counts: list[int] = field(default_factory=list)  # common rows of each unit
    matches: list[Any] = field(default_factory=list)  # engine handles of shards.Match, in unit order
    results: dict[int, tuple[Any, int]] = field(default_factory=dict)  # unit -> (its Match, common rows) so far
    stale: set[int] = field(default_factory=set)  # shards whose matches the next generation drops
    removed: dict[int, dict[str, int]] = field(default_factory=dict)  # shard -> follower -> its tags removed
    row_files: dict[str, SpooledRows] = field(default_factory=dict)
    spoolers: dict[tuple[str, int], _Spooler] = field(default_factory=dict)  # (follower, part) -> its last stream's
    owners: dict[str, dict[int, int]] = field(default_factory=dict)  # follower -> shard -> the part that holds it
    generation: int = 0  # counts restarts (a part sent again, a part no longer ascending): the matching starts over
    matched_generation: int = -1  # the generation whose matching finished
    matcher_error: BaseException | None = None
    closing: bool = False
    matcher: threading.Thread | None = None
    count: int = 0
    #: At least the spool's unmatched bytes: the last :meth:`_spool_backlog` plus every piece
    #: spooled since (removals only shrink the spool); None: not measured yet, or held since.
    backlog_bound: int | None = None

    # ------------------------------------------------------------------ set-up and tag arrival
    def attach(self, own: ShardedTable, spool_parent: Path | None) -> None:
        """The leader's own shards; follower tags spool under ``spool_parent`` (0700), where a
        spool an earlier run of this release left (killed before its cleanup: follower tags,
        the leader's matched symbols) is removed first; the matcher starts (it waits for the
        followers' shards)."""
        self.own, self.engine = own, own.engine
        if spool_parent is not None:  # a run of this release killed before its cleanup left its spool: no use now
            left = re.compile(rf"spool-{re.escape(self.release_id)}-[a-z0-9_]{{8}}")
            for stale in Path(spool_parent).glob(f"spool-{self.release_id}-*"):
                if left.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale, ignore_errors=True)
        self.spool = Path(tempfile.mkdtemp(prefix=f"spool-{self.release_id}-", dir=spool_parent))
        self.matcher = threading.Thread(target=self._match_all, name=f"match-{self.release_id}", daemon=True)
        self.matcher.start()

    @property
    def num_shards(self) -> int:
        assert self.own is not None
        return len(self.own.shards)

    @property
    def num_units(self) -> int:
        return self.num_shards << UNIT_BITS

    def shard_files(self, curator: str) -> list[Path]:
        """Where ``curator``'s part of each shard is spooled (``.tags`` and ``.rows`` files)."""
        assert self.spool is not None
        return [self.spool / f"{curator}-{s:05d}" for s in range(self.num_shards)]

    def add_tag_stream(
        self, curator: str, pieces: Iterable[bytes], alphabet_size: int, alignment: AlignmentMode,
        part: TagPart = WHOLE_STREAM,
    ) -> int:  # fmt: skip
        """A follower's tags, or one ``part`` of them (its parts arrive concurrently), in any
        order, into the leader's shards; returns how many arrived. Recorded once every part
        ended and the parts tile the follower's rows."""
        self.check_alignment(curator, alignment)
        if self.own is None:
            raise AgreementNotReadyError(f"the leader of {self.release_id!r} is still reading its own table; retry")
        with self.cond:
            spool = self.agreement is None  # once fixed, a resend is only compared (by digest), never stored
            parts = self._start_part(curator, part, spool)
            spooler = self.spoolers[(curator, part.index)] if spool else None
        try:
            digest, received = self._spool_stream(parts, part, pieces, spooler)
        except BaseException:
            with self.cond:
                parts.stop(part.index)
            raise
        with self.cond:
            parts.end(part.index, digest)
            self.cond.notify_all()  # every unit of the part's shards is complete now
            if not parts.complete:
                return received
            self._checked_tiling(parts)
            digest = parts.digest()
        self._record(curator, digest, alphabet_size)
        return received

    def _start_part(self, curator: str, part: TagPart, spool: bool) -> TagParts:
        """(Under ``cond``.) ``curator``'s parts with ``part`` starting: a new set for another
        part count (the old set's files removed). A part sent again replaces the one received
        (its files removed, its shards free again) and restarts the matching; with ``spool``
        the part gets its spooler."""
        parts = self.parts.get(curator)
        if parts is None or parts.count != part.count:
            if parts is not None and parts.streaming:
                raise AgreementNotReadyError(
                    f"{curator!r} is already sending its tags in {parts.count} parts; retry when they ended"
                )
            if parts is not None and spool:
                self._invalidate(curator, self._free_shards(curator, set(parts.records)), True)
            parts = self.parts[curator] = TagParts(curator, part.count)
            self.owners[curator] = {}
        if parts.start(part) and spool:
            self._invalidate(curator, self._free_shards(curator, {part.index}), True)
        if spool:
            self.spoolers[(curator, part.index)] = _Spooler(self, curator, part)
        return parts

    def shards_of(self, curator: str, indices: set[int]) -> list[int]:
        """(Under ``cond``.) The shards parts ``indices`` of ``curator`` hold."""
        return [s for s, index in self.owners.get(curator, {}).items() if index in indices]

    def _free_shards(self, curator: str, indices: set[int]) -> list[int]:
        """(Under ``cond``.) The shards parts ``indices`` of ``curator`` held: files removed,
        free for any part again; returns them."""
        owners = self.owners.get(curator, {})
        paths = self.shard_files(curator)
        freed = self.shards_of(curator, indices)
        for shard in freed:
            del owners[shard]
            suffixed(paths[shard], ".tags").unlink(missing_ok=True)
            suffixed(paths[shard], ".rows").unlink(missing_ok=True)
        return freed

    def _invalidate(self, curator: str, shards: Iterable[int], rewritten: bool) -> None:
        """(Under ``cond``.) ``curator``'s tags of ``shards`` change: sent again from the start
        (``rewritten``) or growing in place (a part that stopped ascending). Their matches are
        dropped and the matching starts over (:meth:`_restart`). If a re-match would need tags
        whose spool was removed once matched (another follower's; or, growing in place, the
        part's own), the agreement fails: :class:`TagPartsError`."""
        shards = list(shards)
        lost = sorted(s for s in shards for c, count in self.removed.get(s, {}).items()
                      if count and (c != curator or not rewritten))  # fmt: skip
        if lost:
            how = "were sent again" if rewritten else "no longer ascend"
            exc = TagPartsError(
                f"{curator!r}'s tags of shard(s) {lost[:8]} {how} after those shards were matched and their spooled "
                "tags removed (the leader keeps no follower tags it has matched): start the release again"
            )
            self._part_failure(exc)
            raise exc
        for shard in shards:
            self.removed.pop(shard, None)
        self._restart(shards)

    def _claim(self, curator: str, index: int, shards: Iterable[int]) -> None:
        """(Under ``cond``.) Part ``index`` of ``curator`` writes ``shards``: a shard another part
        holds fails the agreement (:class:`TagPartsError` naming both) before a tag of it is written."""
        owners = self.owners[curator]
        for shard in shards:
            units = range(shard << UNIT_BITS, (shard + 1) << UNIT_BITS)
            if shard not in owners and shard not in self.stale and any(u in self.results for u in units):
                # matched while no part held it (against none of this curator's tags): again
                self._invalidate(curator, [shard], True)
            held = owners.setdefault(shard, index)
            if held != index:
                exc = TagPartsError(
                    f"parts {min(held, index)} and {max(held, index)} of {curator!r}'s tags both hold tags of shard "
                    f"{shard}: each part is a run of whole shards, and no two parts share one"
                )
                self._part_failure(exc)
                raise exc

    def _restart(self, shards: Iterable[int]) -> None:
        """(Under ``cond``.) What was matched of ``shards`` may change: their matches are dropped
        and the matching starts over (the units of other shards keep theirs)."""
        self.stale.update(shards)
        self.generation += 1
        self.cond.notify_all()

    def _spool_stream(
        self, parts: TagParts, part: TagPart, pieces: Iterable[bytes], spooler: _Spooler | None
    ) -> tuple[str, int]:
        """The part's digest and tag count; its rows checked against the other parts' at every
        piece; with a ``spooler``, each tag written to its shard's files."""
        digest, received = hashlib.sha256(), 0
        try:
            for piece in pieces:
                digest.update(piece)
                if len(piece) % TAG_BYTES:
                    raise ShapeMismatchError(f"{len(piece)} tag bytes is not a multiple of {TAG_BYTES}")
                with self.cond:
                    self._checked_growth(parts, part.index, len(piece) // TAG_BYTES)
                if spooler is not None and piece:
                    self._wait_for_matching(spooler)
                    with disk_full_named(str(self.spool), "a follower's tags (20 bytes a tag)", len(piece) * 5 // 4):
                        spooler.add(piece, part.first_row + received)
                    with self.cond:  # after the write: a measure that missed it still counts it
                        if self.backlog_bound is not None:
                            self.backlog_bound += len(piece) * 5 // 4
                received += len(piece) // TAG_BYTES
        finally:
            if spooler is not None:
                spooler.close()
        return digest.hexdigest(), received

    def _wait_for_matching(self, spooler: _Spooler) -> None:
        """Hold an ascending part's next piece while the spool holds more than
        :data:`SPOOL_AHEAD_BYTES` of follower tags not matched yet and the matcher has a unit it
        can match (its work shrinks the spool; with none ready, waiting could not): the stream
        then goes at the matching's pace, and the spool stays about that size rather than
        growing with n (5 GB at 10^9 rows, where the matching fell behind the streams). A part
        that does not ascend completes no unit before it ends: never held. The spool's files are
        measured (a stat of each shard's files) only once :attr:`backlog_bound` passes the limit,
        not at every piece (at 10^9 rows: a thousand pieces a stream, 256 shards each)."""
        if spooler.last is None:
            return
        with self.cond:
            while not self._stale(self.generation) and self.matcher_error is None:
                if self.backlog_bound is None or self.backlog_bound > SPOOL_AHEAD_BYTES:
                    self.backlog_bound = self._spool_backlog()
                if self.backlog_bound <= SPOOL_AHEAD_BYTES or not self._ready_units(self._unmatched(), 1):
                    return
                self.cond.wait(1.0)
                self.backlog_bound = None  # the matcher may have removed files meanwhile

    def _spool_backlog(self) -> int:
        """Bytes of follower tags in the spool (each shard's are removed once it is matched)."""
        total = 0
        for c in self.curators[1:]:
            for path in self.shard_files(c):
                with contextlib.suppress(FileNotFoundError):
                    total += suffixed(path, ".tags").stat().st_size * 5 // 4  # and its rows
        return total

    def _unmatched(self) -> list[int]:
        """(Under ``cond``.) The units with no match yet (ready ones are matched, or about to be)."""
        return [u for u in range(self.num_units) if u not in self.results]

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

    # ------------------------------------------------------------------------------ matching
    def _match_all(self) -> None:
        """The matcher thread: match the units in order as they become complete; start over
        whenever a stream starts again (before the agreement is fixed); stop at
        :meth:`cleanup` or on a failure."""
        while True:
            with self.cond:
                if self.closing or self.error is not None:
                    return
                generation = self.generation
            try:
                self._match_generation(generation)
            except _RestartMatchingError:
                continue
            except Exception as exc:  # e.g. ShardError: agree() reports it
                with self.cond:
                    self.matcher_error = exc
                    self.cond.notify_all()
                return
            with self.cond:
                if self.generation == generation:
                    self.matched_generation = generation
                    self.cond.notify_all()
                    self.cond.wait_for(partial(self._stale, generation))

    def _ready(self, unit: int) -> bool:
        """(Under ``cond``.) Every follower's tags of ``unit`` arrived."""
        return all(self._unit_complete(c, unit) for c in self.curators[1:])

    def _unit_complete(self, curator: str, unit: int) -> bool:
        """(Under ``cond``.) ``curator``'s tags of ``unit`` all arrived: the part holding its
        shard ended or (ascending) moved past it; a shard no part holds, once every part ended."""
        parts = self.parts.get(curator)
        if parts is None:
            return False
        owner = self.owners[curator].get(unit >> UNIT_BITS)
        if owner is None:
            return parts.complete
        return parts.records[owner].ended or self.spoolers[(curator, owner)].moved_past(unit)

    def _match_generation(self, generation: int) -> None:
        """Every unit not matched yet (or whose shard is stale) matched once, at most
        :data:`WINDOW` in flight, each as soon as it is ready whatever the others (concurrent
        parts complete units in different places: matched in order, a later part's units would
        wait in the spool for the earlier part to end), each follower's rows of it written to
        the unit's row file; a shard's spool removed once its units are matched:
        :class:`_RestartMatchingError` if the generation changes or the leader closes first."""
        assert self.spool is not None and self.engine is not None
        followers = list(self.curators[1:])
        with self.cond:  # results change under cond only: a part's claim reads them (_claim)
            stale, self.stale = self.stale, set()
            dropped = [self.results.pop(u)[0] for u in list(self.results) if u >> UNIT_BITS in stale]
            dropped = [m for m in dropped if m is not None]
            waiting = [u for u in range(self.num_units) if u not in self.results]  # ascending
        self.engine.release(dropped)
        pending: deque[tuple[int, Any, Any]] = deque()
        try:
            while waiting or pending:
                with self.cond:
                    if not pending:
                        self.cond.wait_for(partial(self._stale_or_ready, generation, waiting))
                    if self._stale(generation):
                        raise _RestartMatchingError
                    ready = self._ready_units(waiting, WINDOW - len(pending))
                for unit in ready:
                    waiting.remove(unit)
                    pending.append((unit, *self._submit_match(unit)))
                unit, match, rows = pending.popleft()
                count, follower_rows = self.engine.result(rows)
                self.engine.release([rows])
                for c, part in zip(followers, follower_rows or [None] * len(followers), strict=True):
                    if part is not None:  # else the worker wrote them (match_spooled)
                        write_unit_rows(self.unit_rows(c, unit), part)
                if self.engine.shares_files:  # its symbols are in their file too: nothing lives only on a worker
                    self.engine.release([match])
                    match = None
                with self.cond:
                    self.results[unit] = (match, int(count))
                    self._remove_matched(unit >> UNIT_BITS, generation)
                    self.cond.notify_all()
        except SpoolError:
            with self.cond:  # a resend removed the files under a match: that match was stale anyway
                if self._stale(generation):
                    raise _RestartMatchingError from None
            raise
        finally:
            for _, match, rows in pending:
                self.engine.release([match, rows])

    def unit_rows(self, curator: str, unit: int) -> Path:
        """The file of ``curator``'s rows of the common tags of ``unit`` (uint32, in order)."""
        assert self.spool is not None
        return self.spool / f"rows-{curator}-{unit:06d}.u32"

    def unit_symbols(self, unit: int) -> Path:
        """The file of the leader's symbols of the common tags of ``unit`` (in order), written by
        its match on an engine that shares this host's files."""
        assert self.spool is not None
        return self.spool / f"sym-{unit:06d}.bin"

    def _remove_matched(self, shard: int, generation: int) -> None:
        """(Under ``cond``.) Once every unit of ``shard`` is matched in this generation, the
        followers' spooled tags of it are removed (how many each had is kept: a re-match that
        needs them fails, :meth:`_invalidate`). No part writes the shard again: its units were
        complete (each part holding it ended or ascended past it, and closed its files), and a
        part that stops ascending invalidates its shards, under ``cond``, before it writes."""
        units = range(shard << UNIT_BITS, (shard + 1) << UNIT_BITS)
        if generation != self.generation or not all(u in self.results for u in units):
            return
        removed = self.removed.setdefault(shard, {})
        for c in self.curators[1:]:
            path = self.shard_files(c)[shard]
            rows = suffixed(path, ".rows")
            with contextlib.suppress(FileNotFoundError):
                removed[c] = removed.get(c, 0) + rows.stat().st_size // 4
            rows.unlink(missing_ok=True)
            suffixed(path, ".tags").unlink(missing_ok=True)

    def _stale(self, generation: int) -> bool:
        return self.closing or self.error is not None or self.generation != generation

    def _ready_units(self, waiting: list[int], most: int) -> list[int]:
        """(Under ``cond``.) The first ``most`` units of ``waiting`` that are ready."""
        ready: list[int] = []
        for unit in waiting:
            if len(ready) >= most:
                break
            if self._ready(unit):
                ready.append(unit)
        return ready

    def _stale_or_ready(self, generation: int, waiting: list[int]) -> bool:
        return self._stale(generation) or bool(self._ready_units(waiting, 1))

    def _submit_match(self, unit: int) -> tuple[Any, Any]:
        """Unit ``unit``'s follower tags matched on the worker that holds the leader's shard
        (the shard's own rows of the unit's tag range, in order). On an engine whose workers
        share this host's files (an embedded cluster) the worker reads them from the spool and
        writes each follower's rows to the unit's row file: neither crosses a connection.
        Else they are sent to it, and the rows come back."""
        assert self.own is not None and self.engine is not None
        shard, bits = unit >> UNIT_BITS, self.own.shard_bits + UNIT_BITS
        ranges = []
        for c in self.curators[1:]:
            with self.cond:
                owner = self.owners[c].get(shard)
                spooler = None if owner is None else self.spoolers[(c, owner)]
                where = (0, 0) if spooler is None else spooler.unit_range(unit)
                written = 0 if spooler is None else spooler.written[shard]
            path = str(self.shard_files(c)[shard])
            # no part holds the shard, or an ascending one: the unit's run of the files; else all it wrote
            ranges.append(SpoolRange(path, *where) if where is not None else SpoolRange(path, 0, written, unit, bits))
        dtype = sh.symbol_dtype(self.own.alphabet_size)
        own = self.own.shards[shard]
        if self.engine.shares_files:
            rows = [str(self.unit_rows(c, unit)) for c in self.curators[1:]]
            match = self.engine.submit(st.match_spooled, own, ranges, dtype, rows, (unit, bits),
                                       str(self.unit_symbols(unit)))  # fmt: skip
        else:
            sent = self.engine.put([r.read() for r in ranges], near=own)
            match = self.engine.submit(st.match_shard, own, sent, dtype, (unit, bits))
        return match, self.engine.submit(st.match_rows, match)

    # ------------------------------------------------------------------------------ agreement
    def agree(self) -> VariantAgreement:
        """The agreement, once every unit is matched (most of them were while the tags arrived)."""
        with self.cond:
            if self.agreement is not None:
                return self.agreement
            try:
                self.agreement = self._agree_when_matched()
            except Exception as exc:
                self._fail(f"{type(exc).__name__}: {exc}")
                raise
            self.cond.notify_all()
            return self.agreement

    def _agree_when_matched(self) -> VariantAgreement:
        """(Under ``cond``.) Wait for the matcher, then plan the release over the common rows."""
        assert self.own is not None and self.spool is not None
        psi_pair = self.alignment is AlignmentMode.PSI and len(self.curators) == 2
        if (self.alignment is not AlignmentMode.KEYED_HASH and not psi_pair) or self.sampling is not SamplingMode.SEED:
            raise AgreementError("a leader on a cluster aligns by keyed hash (or PSI with one follower) and samples by "
                                 "seed only")  # fmt: skip
        self.cond.wait_for(
            lambda: (
                self.matcher_error is not None or self.error is not None or self.matched_generation == self.generation
            )
        )
        if self.matcher_error is not None:
            raise self.matcher_error
        if self.error is not None:
            raise self._failure()
        followers = list(self.curators[1:])
        for c in followers:  # matched: the spooled tags are not needed again
            for path in self.shard_files(c):
                suffixed(path, ".tags").unlink(missing_ok=True)
                suffixed(path, ".rows").unlink(missing_ok=True)
        self.own.close()  # the own shards too: the matches hold the leader's common symbols
        units = range(self.num_units)
        self.matches = [self.results[u][0] for u in units]
        self.own_counts = [self.results[u][1] for u in units]
        self.results = {}  # the release takes the matches from here on (a resend is only compared now)
        self.count = sum(self.own_counts)
        self.row_files = {c: SpooledRows([self.unit_rows(c, u) for u in units], self.own_counts) for c in followers}
        if self.tables is not None:  # --design: the design's tables for this n (as LeaderState's agreement)
            spec = designed_spec(self.release_id, self.curators, self.cipher, self.count, self.tables,
                                 self.researchers)  # fmt: skip
        else:
            plan = plan_release(self.count, [self.sizes[c] for c in self.curators], self.epsilon, self.m)
            spec = ReleaseSpec(self.release_id, self.curators, self.cipher, plan, self.researchers).validate()
        base = Agreement(spec, self.seed or Seed.generate(), np.zeros(0, dtype=TAG_DTYPE))
        return VariantAgreement(base, self.sampling, self.alignment, count=self.count)

    def rows_of(self, curator: str) -> Any:
        with self.cond:
            return self.row_files.get(curator)

    def own_aligned(self) -> npt.NDArray[Any]:
        """The leader's symbols of the common ids in canonical order (from the matches' files, or
        from the matches on the workers)."""
        assert self.own is not None and self.engine is not None
        engine, matches = self.engine, self.matches
        dtype = sh.symbol_dtype(self.own.alphabet_size)
        if engine.shares_files:
            parts = [np.fromfile(self.unit_symbols(u), dtype=dtype) for u in range(len(matches))]
        else:
            parts = list(in_order(engine, lambda s: engine.submit(st.match_symbols, matches[s]), len(matches)))
            engine.release(matches)
        self.matches = []
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)

    def aligned_pieces(self, dtype: str) -> AlignedPieces:
        """The leader's aligned column as runs on the cluster, one a shard: read from the matches'
        files by any worker (an engine that shares this host's files: a lost worker's run is
        read again), else the symbols the matches keep on their workers."""
        assert self.engine is not None and self.own is not None
        engine, matches, per_shard = self.engine, self.matches, 1 << UNIT_BITS
        stored = sh.symbol_dtype(self.own.alphabet_size)  # as the matches wrote them
        self.matches = []
        if not engine.shares_files:
            pieces = leader_pieces(engine, matches, per_shard, dtype, self.own_counts)
            engine.release(matches)  # the runs hold what the release needs of them
            return pieces
        sources, sizes = [], []
        for first in range(0, len(matches), per_shard):
            units = range(first, min(first + per_shard, len(matches)))
            files = [(str(self.unit_symbols(u)), stored, dtype) for u in units]
            sources.append(engine.submit_many(st.symbols_from, files))
            sizes.append(int(sum(self.own_counts[u] for u in units)))
        return AlignedPieces(engine, sources, sizes, dtype)

    def cleanup(self) -> None:
        """Stop the matcher; remove the spool (follower tags and row orders) and the PSI ring's
        mailbox."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
            if self._psi_mailbox is not None or self.psi_dir is not None:
                self.psi_mailbox.close()
        if self.matcher is not None and self.matcher is not threading.current_thread():
            self.matcher.join(timeout=10.0)
        if self.spool is not None:
            shutil.rmtree(self.spool, ignore_errors=True)
