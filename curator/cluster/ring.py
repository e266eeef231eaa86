"""The PSI ring on a curator's cluster (``--engine dask --alignment psi``, issue 41).

The ring of :mod:`secure_release.curator.release.psi_ring`, with every list in slices of at most
:data:`SLICE_POINTS` points and every per-point call on the curator's workers
(:mod:`~secure_release.curator.cluster.psi_stages`):

1. :func:`load_points`: the table read, checked, blinded (H(id)^r, on the workers, a partition at
   a time) and sharded by a private keyed tag, as the keyed hash shards its tags.
2. :func:`cluster_ring`: the own list leaves a slice at a time (shard after shard); each list
   that passes through is fetched a slice at a time, re-blinded on a worker, proved and handed
   on (:data:`WINDOW_PER_WORKER` slices in flight a worker); the own list comes back a slice at a
   time, each turned into F and tags in the curator's domain on the worker holding its rows.
   A second shuffle sorts the tags into the keyed-hash engine's shards, and from there the
   agreement is the keyed hash's (the leader's spool, the row order, the gather).

This process holds a few slices at a time (2 MiB each), never a list: the drivers stay O(slices).
A slice of a hop goes to a worker as its task's argument and the task is released once its
result is sent on, so a lost worker's tasks run again elsewhere (the point shards they need are
recomputed from the partitions, their lineage) and the scheduler (in this process, on an
embedded cluster) holds only the slices in flight. A returned own slice goes by a file in the
engine's handoff directory (:func:`_hand_over`), since its finish task's result is kept until the
tags are shuffled: a task's arguments stay with the scheduler as long as its result, and as
arguments the whole list would (measured at 10^7 ids: 330 MB more in each curator process).
The transport is a pair of callables (:class:`Transport`): the leader's mailbox directly, or a
follower's RPCs to it. Every scalar a task carries is :class:`~.sealed.Sealed`.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from secure_release.curator.cluster import psi_stages as ps
from secure_release.curator.cluster import shards as st
from secure_release.curator.cluster.engine import Engine, _progress
from secure_release.curator.cluster.sealed import Sealed
from secure_release.curator.cluster.sharded import ShardedTable, _shard_pieces, in_order, load_sharded
from secure_release.curator.psi_mailbox import MAX_SLICES, PsiListConsumedError, SliceShape
from secure_release.curator.table import TableSpec
from secure_release.infra.logs import EventLog, peak_rss_mib
from secure_release.infra.streams import AgreementError
from secure_release.mechanism.alignment import sharding as sh
from secure_release.mechanism.alignment.psi import PsiKey, first_scalar, unmask_scalar
from secure_release.mechanism.alignment.psi_proof import prove_reblind, public_point, slice_context
from secure_release.mechanism.primitives.keys import AlignmentKey

#: Points a slice holds at most (2.1 MB on the wire; about 2.5 s of one worker a hop here).
SLICE_POINTS = 1 << 16
#: Slices a worker has in flight during a hop (its next one is there when it finishes one).
WINDOW_PER_WORKER = 2


@dataclass(frozen=True)
class Transport:
    """How a curator's slices reach the leader's mailbox and come back: ``send(owner, hop,
    shape, points, proof, public_key)``, ``receive(owner, hop, slice) -> (shape, points)``."""

    send: Callable[[str, int, SliceShape, bytes, bytes, bytes], None]
    receive: Callable[[str, int, int], tuple[SliceShape, bytes]]


def order_key(key: PsiKey) -> AlignmentKey:
    """The private key of the own list's order (derived from the PSI key, which a follower
    keeps: a restarted follower sends its slices again in the same order, identical)."""
    return AlignmentKey(key.derive("psi-list-order"))


def load_points(
    engine: Engine, data: str, spec: TableSpec, key: PsiKey, num_curators: int, log: EventLog,
    shard_bits: int | None = None,
) -> ShardedTable:  # fmt: skip
    """The table read, checked and blinded on ``engine`` (:func:`psi_stages.point_partition`),
    sharded by the private order tag: bad rows and repeated ids refuse it with their files and
    lines, as with the keyed hash."""
    return load_sharded(engine, data, spec, order_key(key), log, shard_bits,
                        stage=ps.point_partition, stage_args=(Sealed(first_scalar(key, num_curators)),))  # fmt: skip


def slice_runs(sizes: Sequence[int], most: int | None = None) -> list[tuple[int, int, int]]:
    """The own list's slices as ``(shard, start, stop)``: each shard's rows in runs of at most
    ``most`` (:data:`SLICE_POINTS`) points, shard after shard (one empty slice for an empty table)."""
    most = most or SLICE_POINTS
    runs = [(s, a, min(a + most, size)) for s, size in enumerate(sizes) for a in range(0, size, most)]
    return runs or [(0, 0, 0)]


def slice_shapes(runs: Sequence[tuple[int, int, int]]) -> list[SliceShape]:
    """The :class:`SliceShape` of every run, in list order."""
    counts = [stop - start for _, start, stop in runs]
    firsts = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
    return [SliceShape(i, len(runs), firsts[i], c, firsts[-1]) for i, c in enumerate(counts)]


def tag_domain(me: str, curators: Sequence[str]) -> int:
    """The tag domain of this curator's PSI tags: a follower's own (its index); the leader's,
    at N = 2, its follower's (domain 1), against which it matches (``mechanism/alignment/psi.py``, step
    4). A leader on a cluster at N >= 3 would need its tags in every domain: not supported
    (the configuration refuses it)."""
    at = list(curators).index(me)
    if at == 0 and len(curators) != 2:
        raise AgreementError("a leader on a cluster runs the PSI ring with one follower only (two curators)")
    return at if at else 1


def cluster_ring(
    me: str, curators: Sequence[str], table: ShardedTable, key: PsiKey, transport: Transport, log: EventLog,
    workers: int = 1, slice_points: int | None = None,
) -> ShardedTable:  # fmt: skip
    """This curator's part of the ring on its cluster (module doc); returns its PSI tags (in
    :func:`tag_domain`) as shards, symbols beside, and releases ``table``. ``slice_points``: the
    most points a slice of its own list holds (:data:`SLICE_POINTS`)."""
    engine, num, at = table.engine, len(curators), list(curators).index(me)
    window = max(2, WINDOW_PER_WORKER * workers)
    runs = slice_runs(table.sizes, slice_points)
    if len(runs) > MAX_SLICES:
        size = slice_points or SLICE_POINTS
        raise AgreementError(f"{table.num_rows} ids in slices of {size} points make {len(runs)} slices; a list "
                             f"has at most {MAX_SLICES}: raise --psi-slice-points")  # fmt: skip
    shapes = slice_shapes(runs)
    t0 = time.perf_counter()

    def own_slice(i: int) -> Any:
        return engine.submit(ps.point_slice, table.shards[runs[i][0]], runs[i][1], runs[i][2])

    started, last = time.monotonic(), [0.0]
    for shape, points in zip(shapes, in_order(engine, own_slice, len(runs), window), strict=True):
        transport.send(me, 1, shape, points, b"", b"")
        _progress(log, "psi-send", shape.index + 1, len(shapes), started, last)
    for hop in range(1, num):
        pass_on(engine, transport, curators[(at - hop) % num], hop, key, log, window)
    tags = finish(engine, table, runs, shapes, transport, me, curators, key, log, window)
    log("psi_ring_done", ids=table.num_rows, slices=len(runs), seconds=round(time.perf_counter() - t0, 3),
        peak_rss_mib=peak_rss_mib())  # fmt: skip
    return tags


def pass_on(engine: Engine, transport: Transport, owner: str, hop: int, key: PsiKey, log: EventLog,
            window: int) -> None:  # fmt: skip
    """One hop of ``owner``'s list: each slice fetched, re-blinded on a worker, proved and handed
    on, ``window`` slices in flight. Once the leader answers a slice fetched or sent as
    re-blinded and deleted (:class:`PsiListConsumedError`: this curator runs the ring again, or
    retried a send the leader had taken, and hop ``hop + 1`` is complete there), the hop is done."""
    scalar, public = Sealed(key.scalar()), public_point(key)
    pending: deque[tuple[SliceShape, bytes, Any]] = deque()
    started, last = time.monotonic(), [0.0]
    try:
        first = transport.receive(owner, hop, 0)
        slices = first[0].slices

        def submit(index: int) -> None:
            shape, points = first if index == 0 else transport.receive(owner, hop, index)
            if shape.slices != slices:
                raise AgreementError(f"{owner}'s PSI list at hop {hop} changed its number of slices")
            # the slice goes with its task (not scattered to one worker): a worker lost mid-hop takes
            # only the task, which the scheduler runs again elsewhere from its arguments
            pending.append((shape, points, engine.submit(ps.reblind_slice, scalar, points)))

        for index in range(min(window, slices)):
            submit(index)
        for index in range(slices):
            shape, points, task = pending[0]
            if index + window < slices:
                submit(index + window)
            pending.popleft()
            out = engine.result(task)
            engine.release([task])
            proof = prove_reblind(key, slice_context(owner, hop + 1, shape.index, shape.slices), points, out)
            transport.send(owner, hop + 1, shape, out, proof, public)
            _progress(log, "psi-hop", index + 1, slices, started, last)
    except PsiListConsumedError:
        engine.release([task for _, _, task in pending])
        log("psi_hop_taken", owner=owner, hop=hop + 1,
            note=f"{owner}'s PSI list at hop {hop + 1} is complete at the leader: nothing left to send")  # fmt: skip


def finish(
    engine: Engine, table: ShardedTable, runs: Sequence[tuple[int, int, int]], shapes: Sequence[SliceShape],
    transport: Transport, me: str, curators: Sequence[str], key: PsiKey, log: EventLog, window: int,
) -> ShardedTable:  # fmt: skip
    """The own list back after N blindings, a slice at a time, as F and tags in this
    curator's domain on the worker holding the slice's rows; then shuffled into tag shards."""
    unmask = Sealed(unmask_scalar(key, len(curators)))
    domain = tag_domain(me, curators)
    results: list[Any] = []
    pending: deque[Any] = deque()
    files: list[Path] = []
    started, last = time.monotonic(), [0.0]
    try:
        for shape, (shard, start, stop) in zip(shapes, runs, strict=True):
            got, points = transport.receive(me, len(curators), shape.index)
            if got != shape:
                raise AgreementError(f"{me}'s own PSI list came back with slice {shape.index} moved or resized")
            returned = _hand_over(engine, points, table.shards[shard], files)
            result = engine.submit(ps.finish_slice_tags, table.shards[shard], start, stop, returned, unmask, domain,
                                   table.shard_bits, table.alphabet_size)  # fmt: skip
            results.append(result)
            pending.append(engine.submit(st.problems_of, result))
            while len(pending) >= window or (pending and shape.index == len(shapes) - 1):
                done = pending.popleft()
                engine.result(done)  # raises a slice's error (a point that is not on the curve)
                engine.release([done])
                _progress(log, "psi-finish", len(results) - len(pending), len(shapes), started, last)
        return shuffle_tags(engine, table, results, log)
    finally:
        for path in files:
            path.unlink(missing_ok=True)


def _hand_over(engine: Engine, points: bytes, near: Any, files: list[Path]) -> Any:
    """How a returned slice reaches the finish task that keeps its result: a file in the
    engine's handoff directory (an embedded cluster's workers read this host's files; the task
    keeps only the path, so its result can be recomputed until the tags are shuffled, and no
    process holds the list: a task's arguments stay with the scheduler, in this process, for as
    long as its result is kept), or else scattered to the worker holding its rows (a worker lost
    then fails the release by name; run it again)."""
    if engine.handoff is None:
        return engine.put(points, near=near)
    path = engine.handoff / f"psi-back-{secrets.token_hex(8)}"
    path.write_bytes(points)
    files.append(path)
    return str(path)


def shuffle_tags(engine: Engine, table: ShardedTable, results: list[Any], log: EventLog) -> ShardedTable:
    """The finished slices' tags and symbols into sorted tag shards (the keyed hash's second and
    third stages); ``table``'s point shards released. Equal tags would mean the ring returned
    one point for two ids: refused."""
    bits = table.shard_bits
    groups = sh.group_bits_for(len(results), bits)
    pieces = _shard_pieces(engine, results, bits, groups)
    shards = engine.submit_many(st.merge_shard, [(shard_pieces,) for shard_pieces in pieces])
    engine.release(results)
    del pieces
    merged = engine.results(engine.submit_many(st.shard_summary, [(shard,) for shard in shards]), "shuffle")
    table.close()
    tagged = ShardedTable(engine, table.data, table.partitions, table.spec, bits, shards, [n for n, _ in merged])
    if any(len(tags) for _, tags in merged):
        tagged.close()
        raise AgreementError("the PSI ring returned one point for two of this curator's ids: a member did not "
                             "re-blind honestly")  # fmt: skip
    log("psi_shards_sorted", shards=len(shards), rows=tagged.num_rows, peak_rss_mib=peak_rss_mib())
    return tagged
