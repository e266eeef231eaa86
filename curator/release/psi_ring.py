"""``--alignment psi``: one curator's part of the N-party ECDH ring (:mod:`mechanism.alignment.psi`) over
the Curator service.

Followers talk only to the leader, so the leader is the ring's mailbox: curator j blinds its own
ids (``psi_start``) and hands the list to curator j+1 through the leader (``PsiSend``); at each hop
h = 1 .. N-1 it fetches the list of owner j-h routed to it (``PsiReceive``), raises it to its own
scalar (``psi_reblind``) and hands it on; finally it fetches its own list after N blindings and
unmasks it into F and 128-bit tags in its own tag domain (``psi_finish_points``, ``psi_tags``).
Those tags go to the leader as keyed-hash tags do (``SubmitTags``); the leader, which does the
same against its own mailbox without RPCs, keeps its own tags in every domain and matches each
follower's tags against its own rows only (``psi_leader_view``), so it learns its pairwise
intersection with each curator and nothing about ids it does not hold; each follower is sent its
own rows of the N-way intersection (``mechanism/alignment/psi.py``, issue 23).

On a curator's cluster (``--engine dask``, :func:`run_cluster_ring`) the same ring runs a slice of
each list at a time (:mod:`secure_release.curator.cluster.ring`): the leader's own slices go
straight into its mailbox (``psi_put_slice`` / ``psi_get_slice``), a follower's over one
``PsiSend`` / ``PsiReceive`` stream a slice, each retried alone.

The scalar is fresh from the OS per release. Every curator keeps it in its keystore (0600) from
before its first list leaves until its release record is saved (or dropped): restarted with the
same flags after a kill during the ring, it takes the kept scalar, so every list it sends again is
identical and the leader's mailbox takes it as a resend. The mailbox deletes a list once its next
hop is complete (issue 49; a list's last hop it keeps for the release): a list this curator would
fetch or send again whose next hop the leader holds complete already is answered
:class:`~secure_release.curator.psi_mailbox.PsiListConsumedError`, and the ring goes on to its
next list (:func:`ring`; on a cluster :func:`~secure_release.curator.cluster.ring.pass_on`).
The leader keeps its mailbox too, as files in its keystore (:mod:`secure_release.curator.psi_mailbox`,
issue 47): a leader killed at any point of the ring and run again takes its kept scalar and its
kept lists, resends its own (identical, so no-ops) and goes on from where it was; its followers
keep waiting for it within their ``--timeout`` (each call retried while the leader is
unreachable) and resend or fetch again only the list or slice they were at, never starting over.
Every wait of the ring is logged by what it waits for at least every :data:`WAIT_LOG_S` seconds
(:class:`WaitLog`). Only point counts and timings are logged.

Per element: a hash to the group and N + 1 scalar multiplications (2 at N = 2) on secp256k1 (about
0.12 ms of CPU per id per curator at N = 2, 0.22 ms at N = 3 on this loaded machine, issue 41;
``--psi-workers`` spreads them over processes; ``docs/architectures.md``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from secure_release.curator.cluster.ring import Transport
from secure_release.curator.cluster.sharded import ShardedTable
from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import PsiNotReadyError
from secure_release.curator.leader import LeaderState
from secure_release.curator.psi_mailbox import PsiListConsumedError, SliceShape, from_wire
from secure_release.curator.records.keystore import Keystore
from secure_release.curator.waits import Deadline, retry_until
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import AgreementError, point_chunks, read_point_stream
from secure_release.infra.tls import secure_channel
from secure_release.mechanism.alignment.keyed_hash import TagArray
from secure_release.mechanism.alignment.psi import (
    POINT_BYTES,
    PsiKey,
    PsiWorkers,
    psi_finish_points,
    psi_reblind,
    psi_start,
    psi_tags,
)
from secure_release.mechanism.alignment.psi_proof import proof_context, prove_reblind, public_point
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

SEND_CALL_S = 60.0
RECEIVE_CALL_S = 5.0  # one PsiReceive waits this long at most (then asks again)
#: A wait of the ring that lasts is logged (``psi_waiting``, naming what it waits for) this often.
WAIT_LOG_S = 30.0


class WaitLog:
    """Says what this curator's ring waits for while a wait lasts: ``psi_waiting`` (what, and
    the seconds so far) every ``every`` seconds of one wait, from a thread of its own, whatever
    the waits' own calls do (a PsiReceive that waits 5 s and is retried logs only now and then,
    a leader waiting on its own mailbox not at all). Used as a context manager around the ring;
    each wait inside is ``with watch.waiting(what):``."""

    def __init__(self, log: EventLog, every: float = WAIT_LOG_S) -> None:
        self.log, self.every = log, every
        self._what: str | None = None
        self._since = self._said = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="psi-wait-log", daemon=True)

    def __enter__(self) -> WaitLog:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """The block waits for ``what``."""
        with self._lock:
            self._what, self._since = what, time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._what = None

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.every / 4)):
            with self._lock:
                what, since = self._what, self._since
                now = time.monotonic()
                due = what is not None and now - since >= self.every and now - self._said >= self.every
                if due:
                    self._said = now
            if due:
                self.log("psi_waiting", what=what, waited_s=round(now - since, 1),
                         note=f"still waiting for {what} ({now - since:.0f} s so far; until --timeout)")  # fmt: skip


Send = Callable[[str, int, bytes, bytes, bytes], None]  # owner, hop, points, proof, public key
Receive = Callable[[str, int], bytes]
T = TypeVar("T")


def consumed_at_leader(call: Callable[[], T]) -> T:
    """``call()`` (an RPC to the leader), with the leader's answer that the list asked for or
    sent was re-blinded and deleted (ALREADY_EXISTS, :class:`PsiListConsumedError`: its next hop
    is complete there) raised as that error; any other RPC error as it is."""
    try:
        return call()
    except grpc.RpcError as exc:
        details = exc.details() or ""
        if exc.code() == grpc.StatusCode.ALREADY_EXISTS and details.startswith(f"{PsiListConsumedError.__name__}:"):
            raise PsiListConsumedError(details.split(":", 1)[1].strip()) from None
        raise


def _local(state: LeaderState, me: str, deadline: Deadline, watch: WaitLog) -> tuple[Send, Receive]:
    """The leader's own sends and receives: straight into and out of its mailbox."""

    def send(owner: str, hop: int, points: bytes, proof: bytes = b"", public: bytes = b"") -> None:
        state.psi_put(me, owner, hop, points, proof, public)

    def receive(owner: str, hop: int) -> bytes:
        what = f"{owner}'s PSI list at hop {hop}"
        with watch.waiting(what):
            while True:
                got = state.psi_get(me, owner, hop, min(RECEIVE_CALL_S, deadline.check(what)))
                if got is not None:
                    return got

    return send, receive


def _remote(
    stub: pb_grpc.CuratorStub, config: CuratorConfig, log: EventLog, deadline: Deadline, watch: WaitLog
) -> tuple[Send, Receive]:
    """A follower's sends and receives: RPCs to the leader, retried while it is not ready (or
    unreachable: killed and run again, it takes its kept mailbox, so only this call is repeated)."""
    rid, me, leader = config.release_id, config.name, config.curators[0]

    def send(owner: str, hop: int, points: bytes, proof: bytes = b"", public: bytes = b"") -> None:
        what = f"the leader {leader} to take {owner}'s PSI list at hop {hop}"
        with watch.waiting(what):
            retry_until(
                lambda t: consumed_at_leader(
                    lambda: stub.PsiSend(point_chunks(rid, me, owner, hop, points, proof, public), timeout=t)
                ),
                what,
                deadline,
                log,
                per_call_s=SEND_CALL_S,
            )

    def fetch(owner: str, hop: int, timeout: float) -> bytes:
        request = pb.PsiRequest(release_id=rid, curator=me, owner=owner, hop=hop)
        got = consumed_at_leader(lambda: read_point_stream(iter(stub.PsiReceive(request, timeout=timeout)), None))
        if (got.release_id, got.owner, got.hop) != (rid, owner, hop):
            raise PsiNotReadyError(f"the leader answered with another PSI list than {owner}'s at hop {hop}")
        return got.points

    def receive(owner: str, hop: int) -> bytes:
        what = f"{owner}'s PSI list at hop {hop} from the leader {leader}"
        with watch.waiting(what):
            return retry_until(lambda t: fetch(owner, hop, t), what, deadline, log, per_call_s=RECEIVE_CALL_S)

    return send, receive


def ring(me: str, curators: tuple[str, ...], ids: npt.NDArray[np.str_], key: PsiKey, send: Send,
         receive: Receive, workers: int = 1) -> bytes:  # fmt: skip
    """The ring as one curator sees it, over any transport (``send(owner, hop, points)``,
    ``receive(owner, hop)``): start (masked by the one-time r), N-1 re-blinding hops, finish
    (unmask and apply the own scalar last); the per-element calls shared by ``workers``
    processes. Every re-blinded list goes with a proof that it is the received list raised to
    this curator's key (:mod:`secure_release.mechanism.alignment.psi_proof`), which the leader checks.
    A list the leader answers as re-blinded and deleted (:class:`PsiListConsumedError`: this
    curator runs the ring again, and its next hop is complete at the leader) is skipped, and a
    re-blinding it answers so is taken already. Returns F of every own row, packed in own row
    order (:func:`psi_finish_points`)."""
    num, at = len(curators), curators.index(me)
    public = public_point(key)
    with PsiWorkers(workers) as pool:
        own = psi_start(ids, key, pool, num)  # N = 2: unmasked (mechanism/alignment/psi.py)
        send(me, 1, own.sent, b"", b"")
        for hop in range(1, num):
            owner = curators[(at - hop) % num]
            try:
                received = receive(owner, hop)
            except PsiListConsumedError:
                continue  # hop + 1 of it is at the leader already: nothing left to do for it
            out = psi_reblind(received, key, pool)
            with contextlib.suppress(PsiListConsumedError):  # taken before (a retried call): nothing lost
                send(owner, hop + 1, out, prove_reblind(key, proof_context(owner, hop + 1), received, out), public)
        return psi_finish_points(own, receive(me, num), pool)


@contextlib.contextmanager
def leader_stub(config: CuratorConfig) -> Iterator[pb_grpc.CuratorStub]:
    """A follower's stub to its leader over TLS (the handshake fails against any other peer),
    closed on exit; an RPC error inside becomes :class:`AgreementError` naming the leader."""
    assert config.leader_address is not None
    leader = config.curators[0]
    channel = secure_channel(config.leader_address, config.certs, config.name, config.insecure,
                             role="curator", peer_role="curator", peer_name=leader)  # fmt: skip
    try:
        yield pb_grpc.CuratorStub(channel)
    except grpc.RpcError as exc:
        raise AgreementError(f"the leader {leader} refused: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()


def leader_domain(num_curators: int) -> int:
    """The tag domain of the leader's own tags as it matches them: 0 (its follower's tags are
    mapped into it, ``psi_leader_view``), or at N = 2 its one follower's domain 1, which it
    compares directly; so the canonical order at N = 2 is ascending domain-1 tag, as on a
    cluster (:func:`~secure_release.curator.cluster.ring.tag_domain`), and both engines agree on
    the same rows in the same order."""
    return 1 if num_curators == 2 else 0


def ring_key(config: CuratorConfig, state: LeaderState | None) -> tuple[PsiKey, bool]:
    """This release's PSI key (fresh from the OS, or the test's), and whether it is one this
    curator kept from an earlier run (kept until its record is saved, so a restart resumes the
    ring). A follower keeps it always, the leader (``state``) when it keeps its mailbox
    (``state.psi_dir``: a release's leader; a stored table's keeps neither)."""
    key = config.test_psi_key or PsiKey.generate()
    if state is not None and state.psi_dir is None:
        return key, False
    return Keystore(config.keystore).psi_key(config.release_id, key)


def run_ring(
    config: CuratorConfig, ids: npt.NDArray[np.str_], state: LeaderState | None, log: EventLog, deadline: Deadline
) -> TagArray:
    """This curator's PSI tags (own row order), through the leader (``state`` given: this
    curator leads and is the mailbox). Failures raise :class:`AgreementError` (the leader's
    refusal) or a wait timeout, like the agreement step."""
    key, kept = ring_key(config, state)
    t0 = time.perf_counter()
    log("psi_started", release_id=config.release_id, ids=int(ids.size), curators=len(config.curators),
        workers=config.psi_workers, resumed=kept)  # fmt: skip
    if state is not None:
        with WaitLog(log) as watch:
            send, receive = _local(state, config.name, deadline, watch)
            points = ring(config.name, config.curators, ids, key, send, receive, config.psi_workers)
        # the leader matches follower j's tags (domain j) against its own rows in domain j
        state.psi_domain_tags = [psi_tags(points, d) for d in range(len(config.curators))]
        tags = state.psi_domain_tags[leader_domain(len(config.curators))]
    else:
        with leader_stub(config) as stub, WaitLog(log) as watch:
            send, receive = _remote(stub, config, log, deadline, watch)
            points = ring(config.name, config.curators, ids, key, send, receive, config.psi_workers)
            tags = psi_tags(points, config.curators.index(config.name))  # in this follower's own domain
    log("psi_aligned", release_id=config.release_id, ids=int(ids.size), point_bytes=int(ids.size) * POINT_BYTES,
        seconds=round(time.perf_counter() - t0, 3))  # fmt: skip
    return tags


# ------------------------------------------------------------------------ on the curator's cluster
def _local_slices(state: LeaderState, me: str, deadline: Deadline, watch: WaitLog) -> Transport:
    """The leader's own slices: straight into and out of its mailbox."""

    def send(owner: str, hop: int, shape: SliceShape, points: bytes, proof: bytes, public: bytes) -> None:
        state.psi_put_slice(me, owner, hop, shape, points, proof, public)

    def receive(owner: str, hop: int, index: int) -> tuple[SliceShape, bytes]:
        what = f"slice {index} of {owner}'s PSI list at hop {hop}"
        with watch.waiting(what):
            while True:
                got = state.psi_get_slice(me, owner, hop, index, min(RECEIVE_CALL_S, deadline.check(what)))
                if got is not None:
                    return got

    return Transport(send, receive)


def _remote_slices(
    stub: pb_grpc.CuratorStub, config: CuratorConfig, log: EventLog, deadline: Deadline, watch: WaitLog
) -> Transport:
    """A follower's slices: one PsiSend or PsiReceive stream each, retried while the leader is
    not ready or unreachable (a slice is 2 MiB: a retry resends one slice, not a list)."""
    rid, me, leader = config.release_id, config.name, config.curators[0]

    def send(owner: str, hop: int, shape: SliceShape, points: bytes, proof: bytes, public: bytes) -> None:
        what = f"the leader {leader} to take slice {shape.index} of {owner}'s PSI list at hop {hop}"
        with watch.waiting(what):
            retry_until(
                lambda t: consumed_at_leader(
                    lambda: stub.PsiSend(point_chunks(rid, me, owner, hop, points, proof, public, shape.wire),
                                         timeout=t)
                ),
                what,
                deadline,
                log,
                per_call_s=SEND_CALL_S,
            )  # fmt: skip

    def fetch(owner: str, hop: int, index: int, timeout: float) -> tuple[SliceShape, bytes]:
        request = pb.PsiRequest(release_id=rid, curator=me, owner=owner, hop=hop, sliced=True, slice=index)
        got = consumed_at_leader(lambda: read_point_stream(iter(stub.PsiReceive(request, timeout=timeout)), None))
        if (got.release_id, got.owner, got.hop) != (rid, owner, hop) or got.slice is None or got.slice[0] != index:
            raise PsiNotReadyError(f"the leader answered with another PSI slice than {owner}'s {index} at hop {hop}")
        return from_wire(got.slice, len(got.points) // POINT_BYTES), got.points

    def receive(owner: str, hop: int, index: int) -> tuple[SliceShape, bytes]:
        what = f"slice {index} of {owner}'s PSI list at hop {hop} from the leader {leader}"
        with watch.waiting(what):
            return retry_until(lambda t: fetch(owner, hop, index, t), what, deadline, log, per_call_s=RECEIVE_CALL_S)

    return Transport(send, receive)


def run_cluster_ring(
    config: CuratorConfig, table: ShardedTable, key: PsiKey, kept: bool, state: LeaderState | None, log: EventLog,
    deadline: Deadline, workers: int,
) -> ShardedTable:  # fmt: skip
    """This curator's PSI tags as shards on its cluster (:func:`~secure_release.curator.cluster.ring.cluster_ring`),
    its point table (:func:`~secure_release.curator.cluster.ring.load_points`, blinded with
    ``key``) released; the slices go through the leader (``state`` given: this curator leads and
    is the mailbox). Failures raise as :func:`run_ring`'s."""
    from secure_release.curator.cluster.ring import cluster_ring

    t0 = time.perf_counter()
    log("psi_started", release_id=config.release_id, ids=table.num_rows, curators=len(config.curators),
        workers=workers, resumed=kept, engine="dask")  # fmt: skip
    if state is not None:
        with WaitLog(log) as watch:
            tags = cluster_ring(config.name, config.curators, table, key,
                                _local_slices(state, config.name, deadline, watch), log, workers,
                                config.psi_slice_points)  # fmt: skip
    else:
        with leader_stub(config) as stub, WaitLog(log) as watch:
            tags = cluster_ring(config.name, config.curators, table, key,
                                _remote_slices(stub, config, log, deadline, watch), log, workers,
                                config.psi_slice_points)  # fmt: skip
    log("psi_aligned", release_id=config.release_id, ids=tags.num_rows, point_bytes=tags.num_rows * POINT_BYTES,
        seconds=round(time.perf_counter() - t0, 3))  # fmt: skip
    return tags
