"""A follower's side of the agreement: its tags to the leader, the agreement back, a failure told.

:func:`follow_leader` sends this curator's tags to the leader (one stream, or a sharded table's
shards as runs over several TLS channels at once: :func:`submit_tags`) and fetches the agreement,
each call retried until the release's deadline, with a deadline of its own that grows with its
bytes (:func:`call_seconds`); another curator's refusal recorded at the server ends the wait
(:class:`~secure_release.curator.release.refusal_watch.RefusalWatch`).
:func:`report_failure_to_leader` tells the leader that this curator cannot take part.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import grpc
import numpy as np
import numpy.typing as npt

from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import ReleaseRefusedError
from secure_release.curator.release.refusal_watch import RefusalWatch
from secure_release.curator.service import TAG_STREAMS_PER_PEER
from secure_release.curator.waits import Deadline, retry_until
from secure_release.infra.exitcodes import REFUSED, exit_code_for, is_refusal
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import (
    TAG_BYTES,
    AgreementError,
    RowSink,
    TagPart,
    agreement_from_chunks,
    tag_chunks,
)
from secure_release.infra.tls import secure_channel
from secure_release.mechanism.alignment.keyed_hash import TagArray
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.protocol.architectures import AlignmentMode, VariantAgreement
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

#: A curator's tags: one array, or (a sharded table) a function that makes them shard by shard.
TagSource = TagArray | Callable[[], Iterable[TagArray]]

SUBMIT_TIMEOUT_S = 60.0
#: --tag-streams 0: one stream a worker of the curator's cluster, at most this many.
AUTO_TAG_STREAMS = 8
#: Tag streams a follower sends at once: the leader's service takes at most this many of one peer
#: beside its other calls (``service.CALLS_PER_PEER``), or it would refuse the others.
LEADER_CALLS_PER_PEER = TAG_STREAMS_PER_PEER
AGREEMENT_CALL_S = 20.0  # one GetAgreement call: the leader waits up to half of it, then streams
#: The slowest rate at which a follower's tags, or its row order back, may move before the call is
#: given up and tried again: each such call's deadline is its fixed part plus its bytes at this
#: rate (at 10^8 rows the tags moved at about 60 MB/s here). A fixed 60 s could never carry the
#: 4.8 GB of tags of 3 * 10^8 rows: every attempt ran out and started again.
SLOWEST_BYTES_PER_S = 8 << 20
#: Upper bound of the agreement's bytes a follower's row: its row (4 bytes) and a common tag (16).
AGREEMENT_BYTES_PER_ROW = 20


def call_seconds(fixed_s: float, nbytes: int) -> float:
    """A data-moving call's deadline: ``fixed_s`` plus ``nbytes`` at :data:`SLOWEST_BYTES_PER_S`
    (the release's own --timeout still bounds every call)."""
    return fixed_s + nbytes / SLOWEST_BYTES_PER_S


def tag_count(tags: TagSource) -> int:
    """How many tags ``tags`` holds (a sharded table: its rows; a function of unknown size: 0)."""
    table = sharded_source(tags)
    if table is not None:
        return int(table.row_offsets[-1])
    return 0 if callable(tags) else int(np.asarray(tags).size)


@runtime_checkable
class ShardRuns(Protocol):
    """A curator's tags as shards it can send a run at a time
    (:class:`~secure_release.curator.cluster.sharded.ShardedTable`)."""

    engine: Any

    @property
    def row_offsets(self) -> npt.NDArray[np.int64]: ...

    def tag_pieces_of(self, first_shard: int, stop_shard: int) -> Iterator[TagArray]: ...


def sharded_source(tags: TagSource) -> ShardRuns | None:
    """The sharded table behind ``tags`` (the run hands over its ``tag_pieces``), or None."""
    owner = getattr(tags, "__self__", None) if callable(tags) else None
    return owner if isinstance(owner, ShardRuns) else None


def shard_runs(offsets: npt.NDArray[np.int64], streams: int) -> list[tuple[int, int]]:
    """The shards (``offsets``: where each one's rows begin, then the row count) as at most
    ``streams`` contiguous runs of about equal rows, ``(first_shard, stop_shard)`` each, every
    run at least one shard (fewer runs than streams when there are fewer shards)."""
    shards = offsets.size - 1
    targets = int(offsets[-1]) * np.arange(1, max(1, streams)) / max(1, streams)
    cuts = np.clip(np.searchsorted(offsets, targets), 1, shards)
    bounds = np.unique(np.concatenate([[0], cuts, [shards]])).tolist()
    return list(itertools.pairwise(bounds))


def tag_streams(config: CuratorConfig, table: ShardRuns, log: EventLog) -> int:
    """How many streams a follower on a cluster sends its tags in: ``--tag-streams``, or (0) one
    a worker of its cluster, at most :data:`AUTO_TAG_STREAMS`; never more than the leader's
    service takes from one peer at once (:data:`LEADER_CALLS_PER_PEER`)."""
    wanted = config.tag_streams or min(AUTO_TAG_STREAMS, cluster_workers(table.engine))
    if wanted > LEADER_CALLS_PER_PEER:
        note = f"the leader's service takes at most {LEADER_CALLS_PER_PEER} calls of one curator at once"
        log.warning("tag_streams_capped", asked=wanted, streams=LEADER_CALLS_PER_PEER, note=note)
    return max(1, min(wanted, LEADER_CALLS_PER_PEER))


def cluster_workers(engine: Any) -> int:
    """The workers of a Dask engine's cluster (1 for an engine without a scheduler)."""
    client = getattr(engine, "client", None)
    if client is None:
        return 1
    return max(1, len(client.scheduler_info(n_workers=-1).get("workers", {})))


def _leader_channel(config: CuratorConfig) -> grpc.Channel:
    """A TLS channel of this curator's to the leader (the handshake fails against any other peer)."""
    assert config.leader_address is not None
    return secure_channel(config.leader_address, config.certs, config.name, config.insecure,
                          role="curator", peer_role="curator", peer_name=config.curators[0])  # fmt: skip


def submit_tags(
    stub: pb_grpc.CuratorStub, config: CuratorConfig, tags: TagSource, own_size: int, timeout: float, log: EventLog
) -> tuple[int, int]:
    """Send this curator's tags to the leader: (tags the leader received, streams). A sharded
    table's tags go as runs of whole shards, each one part over its own TLS channel, all at once
    (:func:`submit_parts`); anything else (or one run) as one stream over ``stub``, as always."""
    table = sharded_source(tags)
    runs = shard_runs(table.row_offsets, tag_streams(config, table, log)) if table is not None else []
    if table is None or len(runs) <= 1:
        source = tags() if callable(tags) else tags  # a sharded table streams its shards afresh each time
        resp: pb.SubmitTagsResponse = stub.SubmitTags(
            tag_chunks(config.release_id, config.name, source, own_size, config.alignment), timeout=timeout
        )
        return int(resp.tags_received), 1
    return submit_parts(config, table, runs, own_size, timeout), len(runs)


def submit_parts(
    config: CuratorConfig, table: ShardRuns, runs: list[tuple[int, int]], own_size: int, timeout: float
) -> int:
    """Each run of shards as part ``i`` of ``len(runs)`` (its first row: where its first shard's
    rows begin), over its own TLS channel (so the streams' TLS work can use different cores),
    all at once; returns the tags the leader received. The first part that fails cancels the
    others and is raised (a retried submit sends every part again)."""
    offsets = table.row_offsets
    channels = [_leader_channel(config) for _ in runs]
    calls: list[Any] = []
    try:
        for index, ((first, stop), channel) in enumerate(zip(runs, channels, strict=True)):
            part = TagPart(index, len(runs), int(offsets[first]))
            chunks = tag_chunks(config.release_id, config.name, table.tag_pieces_of(first, stop), own_size,
                                config.alignment, part)  # fmt: skip
            calls.append(pb_grpc.CuratorStub(channel).SubmitTags.future(chunks, timeout=timeout))
        finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for call in calls:
            call.add_done_callback(finished.put)
        return sum(int(finished.get().result().tags_received) for _ in calls)  # raises the first failure
    finally:
        for call in calls:
            call.cancel()  # a no-op for a finished call
        for channel in channels:
            channel.close()


def _fetch_agreement(
    stub: pb_grpc.CuratorStub, config: CuratorConfig, timeout: float, rows_sink: RowSink | None = None
) -> VariantAgreement:
    request = pb.AgreementRequest(release_id=config.release_id, curator=config.name)
    if rows_sink is not None:
        rows_sink.reset()  # a retried fetch starts the row order again
    return agreement_from_chunks(iter(stub.GetAgreement(request, timeout=timeout)), rows_sink)


_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def follow_leader(
    config: CuratorConfig, tags: TagSource, own_size: int, log: EventLog, deadline: Deadline,
    rows_sink: RowSink | None = None,
) -> VariantAgreement:
    """Send this curator's tags and alphabet size to the leader, then fetch the agreement (both
    retried while the leader is unreachable or not ready, until ``deadline``). A refusal by the
    leader (FAILED_PRECONDITION, PERMISSION_DENIED, ...) arrives at once as :class:`AgreementError`.
    ``rows_sink``: where the row order goes as it arrives (a curator on a cluster)."""  # fmt: skip
    assert config.leader_address is not None
    leader = config.curators[0]  # the leader comes first: the handshake fails against any other peer
    channel = secure_channel(
        config.leader_address,
        config.certs,
        config.name,
        config.insecure,
        role="curator",
        peer_role="curator",
        peer_name=leader,
    )
    try:
        stub = pb_grpc.CuratorStub(channel)

        watch = RefusalWatch(config)  # the leader gone: its refusal recorded at the server ends the wait

        def submit(timeout: float) -> int:
            try:
                sent, streams = submit_tags(stub, config, tags, own_size, timeout, log)
            except grpc.RpcError as exc:
                if exc.code() in _TRANSIENT:
                    watch.check()
                raise
            log("tags_submitted", leader=config.leader_address, tags=sent, streams=streams)
            return sent

        def fetch(timeout: float) -> VariantAgreement:
            try:
                return _fetch_agreement(stub, config, timeout, rows_sink)
            except grpc.RpcError as exc:
                if exc.code() in _TRANSIENT:
                    watch.check()
                if "TagsMissingError" in (exc.details() or ""):  # the leader restarted: send again
                    submit(max(0.05, min(deadline.left(), call_seconds(SUBMIT_TIMEOUT_S, rows * TAG_BYTES))))
                raise

        rows = tag_count(tags)
        with _waits_logged(config, log) as waiting:
            with waiting(what := f"the leader {leader} at {config.leader_address} to take our tags"):
                retry_until(submit, what, deadline, log, per_call_s=call_seconds(SUBMIT_TIMEOUT_S, rows * TAG_BYTES))
            with waiting(what := f"the agreement of the leader {leader}"):
                per_call_s = call_seconds(AGREEMENT_CALL_S, rows * AGREEMENT_BYTES_PER_ROW)
                return retry_until(fetch, what, deadline, log, per_call_s=per_call_s)
    except grpc.RpcError as exc:
        if exit_code_for(exc) == REFUSED or is_refusal(exc.details() or ""):
            raise ReleaseRefusedError(f"the leader {leader} refused: {exc.code().name}: {exc.details()}") from None
        raise AgreementError(f"the leader {leader} refused: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()


@contextlib.contextmanager
def _waits_logged(config: CuratorConfig, log: EventLog) -> Iterator[Callable[[str], AbstractContextManager[None]]]:
    """``waiting(what)`` for a follower's waits on its leader: with ``--alignment psi`` each is
    logged at least every half minute while it lasts (a PSI leader killed and run again redoes
    its ring from its kept mailbox before it takes tags;
    :class:`~secure_release.curator.release.psi_ring.WaitLog`); else nothing more than
    :func:`retry_until` logs."""
    if config.alignment is not AlignmentMode.PSI:
        yield lambda what: contextlib.nullcontext()
        return
    from secure_release.curator.release.psi_ring import WaitLog

    with WaitLog(log) as watch:
        yield watch.waiting


def report_failure_to_leader(config: CuratorConfig, reason: str, log: EventLog, seconds: float = 5.0) -> None:
    """A follower that cannot take part (it failed before the agreement) tells the leader, which
    fails the release for every party at once with ``reason`` (best effort, a few seconds: a
    leader that cannot be reached learns it at its own deadline)."""
    if config.leader or config.leader_address is None:
        return
    leader = config.curators[0]
    channel = secure_channel(config.leader_address, config.certs, config.name, config.insecure,
                             role="curator", peer_role="curator", peer_name=leader)  # fmt: skip
    try:
        chunk = pb.TagChunk(release_id=config.release_id, curator=config.name, last=True, failure=reason)

        def send(timeout: float) -> None:
            pb_grpc.CuratorStub(channel).SubmitTags(iter([chunk]), timeout=timeout)

        retry_until(send, f"the leader {leader} at {config.leader_address} to hear our failure",
                    Deadline(seconds, threading.Event()), log, per_call_s=seconds)  # fmt: skip
        log("failure_reported", leader=config.leader_address)
    except (grpc.RpcError, SecureReleaseError) as exc:
        log.warning("failure_unreported", leader=config.leader_address, error=f"{type(exc).__name__}: {exc}")
    finally:
        channel.close()
