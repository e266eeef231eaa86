"""The upload step and the curator's calls to the release server: register its part, upload the
chunks the server does not hold yet (``chunks_held``) and commit (:func:`upload_record`), watch
the release's state, and abort it.

An upload (:meth:`ServerLink.upload_chunks`) makes each packed chunk on demand from its sequence
number, so the curator never holds all of them: one pass hashes them for the commit, then the
missing ones go out in up to ``streams`` concurrent UploadCiphertext calls, each an ordered run
of sequence numbers, and the commit follows alone in a last call.

Every call is retried while the server is unreachable, until the run's deadline; replays of an
identical chunk or commit are idempotent successes at the server, so a restarted curator simply
sends what is missing. The release's outcome comes from its status: SEALED or PERTURBED
(:data:`SEALED_STATES`) or ABORTED (:class:`ReleaseAbortedError` with the reason).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator, Sequence

import grpc
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress

from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import (
    ReleaseAbortedAsRefusedError,
    ReleaseAbortedError,
    UploadRefusedError,
    WaitTimeoutError,
)
from secure_release.curator.records.keystore import ReleaseRecord
from secure_release.curator.waits import TRANSIENT, Deadline, retry_until
from secure_release.infra.exitcodes import is_refusal
from secure_release.infra.logs import EventLog
from secure_release.infra.retry import is_transient
from secure_release.infra.streams import upload_commit, upload_digest, upload_run
from secure_release.infra.tls import secure_channel
from secure_release.infra.wire import spec_to_pb
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.schema import SymbolArray
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

UPLOAD_CALL_S = 120.0
STATUS_CALL_S = 5.0
POLL_S = 0.25
SEALED_STATES = frozenset({pb.RELEASE_STATE_SEALED, pb.RELEASE_STATE_PERTURBED})


class UploadStreamsError(SecureReleaseError):
    """An upload was asked to use fewer than one stream."""

    kind = ErrorKind.INVALID_ARGUMENT


def num_chunks_of(ciphertext: SymbolArray) -> int:
    """Upload chunks of CHUNK_ROWS symbols the ciphertext takes."""
    return -(-int(ciphertext.size) // CHUNK_ROWS)


def chunk_packer(ciphertext: SymbolArray, alphabet_size: int) -> Callable[[int], bytes]:
    """``chunk_of(seq)``: chunk ``seq`` of the ciphertext, packed when asked (one numpy pack)."""

    def chunk_of(seq: int) -> bytes:
        return pack_symbols(ciphertext[seq * CHUNK_ROWS : (seq + 1) * CHUNK_ROWS], alphabet_size)

    return chunk_of


def pack_chunks(ciphertext: SymbolArray, alphabet_size: int) -> list[bytes]:
    """The ciphertext packed CHUNK_ROWS symbols a chunk (one numpy pack per chunk)."""
    chunk_of = chunk_packer(ciphertext, alphabet_size)
    return [chunk_of(seq) for seq in range(num_chunks_of(ciphertext))]


def split_runs(seqs: Sequence[int], streams: int) -> list[Sequence[int]]:
    """``seqs`` cut into at most ``streams`` contiguous runs of near-equal length, in order
    (no empty run: fewer sequence numbers than streams give fewer runs)."""
    size, extra = divmod(len(seqs), streams)
    bounds = [0]
    for i in range(streams):
        bounds.append(bounds[-1] + size + (i < extra))
    return [seqs[lo:hi] for lo, hi in itertools.pairwise(bounds) if hi > lo]


def upload_progress(curator: str) -> Progress:
    """The one progress bar of an upload, whatever its streams (on stderr, only on a TTY)."""
    return Progress(
        f"{curator} upload",
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        disable=not sys.stderr.isatty(),
    )


class RunMessages:
    """One run's UploadChunk messages as gRPC pulls them on its own thread: ``advance`` is called
    once a message has been taken, and an error raised while making one (``chunk_of``) is kept
    in ``error`` so the caller raises it rather than the CANCELLED gRPC makes of it."""

    def __init__(self, messages: Iterator[pb.UploadChunk], advance: Callable[[], None]) -> None:
        self.messages, self.advance = messages, advance
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[pb.UploadChunk]:
        try:
            for msg in self.messages:
                yield msg
                self.advance()
        except Exception as exc:
            self.error = exc
            raise


def cancel_all(calls: Sequence[grpc.Future[pb.UploadResponse]]) -> None:
    """Cancel every call of ``calls`` still running."""
    for call in calls:
        call.cancel()


def decisive_error(errors: Sequence[grpc.RpcError]) -> grpc.RpcError:
    """The error of a failed attempt to report: a refusal (not retried) over a transient one."""
    return next((e for e in errors if not is_transient(e, TRANSIENT)), errors[0])


def progress_of(status: pb.ReleaseStatus, curator: str) -> pb.CuratorProgress | None:
    """``curator``'s progress in a status (None if it is not listed)."""
    return next((p for p in status.curators if p.curator == curator), None)


def raise_if_aborted(status: pb.ReleaseStatus | None) -> None:
    """:class:`ReleaseAbortedError` with the recorded reason if the release is ABORTED."""
    if status is not None and status.state == pb.RELEASE_STATE_ABORTED:
        if is_refusal(status.abort_reason):
            raise ReleaseAbortedAsRefusedError(f"{status.abort_reason} (release {status.release_id!r} aborted)")
        raise ReleaseAbortedError(f"release {status.release_id!r} was aborted: {status.abort_reason}")


#: Past a run's deadline, how long its aborts and declarations are retried, all together.
ABORT_GIVE_UP_S = 10.0


class ServerChannel:
    """A curator's mutual-TLS channel to the release server, pinning the server's role."""

    def __init__(self, config: CuratorConfig, log: EventLog, deadline: Deadline) -> None:
        """Open the channel; calls end at ``deadline``."""
        self.config, self.log, self.deadline = config, log, deadline
        self.channel = secure_channel(
            config.server, config.certs, config.name, config.insecure, role="curator", peer_role="server"
        )
        self.stub = pb_grpc.ReleaseServerStub(self.channel)

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()


class ServerLink(ServerChannel):
    """One curator's channel to the release server for one run."""

    _after_deadline: Deadline | None = None

    def wind_down(self, give_up_s: float = ABORT_GIVE_UP_S) -> Deadline:
        """How long an abort (or a declaration) may be retried: until the run's deadline, or
        ``give_up_s`` once fewer remain; past the run's deadline all of them share one ``give_up_s``
        (a refusal made visible, then the release failed, each retried 10 s against a server cut
        off: a curator outlived its --timeout by their sum; found by bench/fault_campaign.py)."""
        if self.deadline.left() > give_up_s:
            return Deadline(self.deadline.left())
        if self._after_deadline is None:
            self._after_deadline = Deadline(give_up_s)
        return self._after_deadline

    def status(self, what: str = "the release server") -> pb.ReleaseStatus | None:
        """The release's status as this curator sees it (None: the server does not know it)."""
        request = pb.ReleaseStatusRequest(release_id=self.config.release_id)
        try:
            status: pb.ReleaseStatus = retry_until(
                lambda t: self.stub.GetReleaseStatus(request, timeout=min(t, STATUS_CALL_S)),
                f"{what} (the server at {self.config.server})", self.deadline, self.log,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return status

    def register(self, spec: ReleaseSpec) -> None:
        """Register this curator's part (idempotent); ABORTED raises with the reason."""
        request = pb.RegisterPartRequest(params=spec_to_pb(spec), curator=self.config.name)
        try:
            retry_until(
                lambda t: self.stub.RegisterPart(request, timeout=t),
                f"the server at {self.config.server} to register our part",
                self.deadline,
                self.log,
            )
        except grpc.RpcError as exc:
            raise_if_aborted(self.status())
            raise UploadRefusedError(f"the server refused {self.config.name}'s part: {exc.details()}") from exc
        self.log("registered", release_id=spec.release_id, n=spec.n, m=spec.m)

    def upload(self, spec: ReleaseSpec, ciphertext: SymbolArray, streams: int = 1) -> None:
        """Send the chunks the server does not hold and commit (nothing if already committed):
        :meth:`upload_chunks` with each chunk packed from ``ciphertext`` when it is sent."""
        if int(ciphertext.size) != spec.m:
            raise ShapeMismatchError(f"{self.config.name} has {ciphertext.size} symbols, the spec says m = {spec.m}")
        chunk_of = chunk_packer(ciphertext, spec.alphabet_of(self.config.name))
        self.upload_chunks(spec, num_chunks_of(ciphertext), chunk_of, streams)

    def upload_chunks(
        self, spec: ReleaseSpec, num_chunks: int, chunk_of: Callable[[int], bytes], streams: int = 1
    ) -> None:
        """Upload this curator's ``num_chunks`` packed chunks (``chunk_of(seq)``: deterministic,
        called twice a chunk, from several threads when ``streams`` > 1) and commit.

        One sequential pass hashes every chunk for the commit (one chunk in memory at a time).
        Then, until the deadline (transient failures retried), the server's status says which
        chunks it holds; the missing ones go out as ``streams`` contiguous ordered runs, each
        over its own concurrent UploadCiphertext call packing one chunk at a time, and the
        commit follows alone in a last call. Nothing is sent once the part is committed. A
        refusal raises :class:`UploadRefusedError` with the server's reason, an aborted release
        :class:`ReleaseAbortedError`. Streams beyond the server's calls per peer (4 by default)
        are pushed back and retried."""
        if num_chunks != spec.num_chunks:
            raise ShapeMismatchError(
                f"{self.config.name} has {num_chunks} chunks, m = {spec.m} takes {spec.num_chunks}"
            )
        if streams < 1:
            raise UploadStreamsError(f"an upload needs at least one stream, got {streams}")
        commit = upload_commit(spec.release_id, self.config.name, num_chunks, upload_digest(num_chunks, chunk_of))
        with upload_progress(self.config.name) as progress:
            task = progress.add_task("upload", total=num_chunks)

            def once(timeout: float) -> pb.UploadResponse:
                held = self._held_unless_committed()
                if held is None:
                    return pb.UploadResponse(committed=True)
                progress.update(task, completed=len(held))
                missing = [seq for seq in range(num_chunks) if seq not in held]
                runs = split_runs(missing, streams)
                self._send_runs(spec.release_id, runs, chunk_of, timeout, lambda: progress.advance(task))
                response: pb.UploadResponse = self.stub.UploadCiphertext(iter([commit]), timeout=self._call_s())
                return response

            resp = self._retried_upload(once)
        if not resp.committed:
            raise UploadRefusedError(f"the server did not commit {self.config.name}'s upload of {spec.release_id!r}")
        self.log("committed", release_id=spec.release_id, chunks=num_chunks, streams=streams)

    def _held_unless_committed(self) -> frozenset[int] | None:
        """The chunks the server holds of this curator's part, or None once it is committed
        (ABORTED raises with the reason)."""
        status = self.status("the server before uploading")
        raise_if_aborted(status)
        mine = None if status is None else progress_of(status, self.config.name)
        if mine is not None and mine.committed:
            return None
        return frozenset(int(s) for s in mine.chunks_held) if mine is not None else frozenset()

    def _send_runs(
        self,
        release_id: str,
        runs: Sequence[Sequence[int]],
        chunk_of: Callable[[int], bytes],
        timeout: float,
        advance: Callable[[], None],
    ) -> None:
        """Each run over its own UploadCiphertext call, all at once (gRPC pulls each run's
        messages on a thread of its own, one chunk at a time); returns when every call ended.
        A refusal cancels the other calls; a transient failure lets them finish (their chunks
        are stored, the retry sends what is missing). Raises the decisive failure."""
        name = self.config.name
        sends = [RunMessages(upload_run(release_id, name, run, chunk_of), advance) for run in runs]
        calls = [self.stub.UploadCiphertext.future(iter(send), timeout=timeout) for send in sends]
        errors: list[grpc.RpcError] = []
        try:
            for call in calls:
                try:
                    call.result()
                except grpc.FutureCancelledError:
                    pass  # cancelled below, after another call's refusal
                except grpc.RpcError as exc:
                    errors.append(exc)
                    if not is_transient(exc, TRANSIENT):
                        cancel_all(calls)
        finally:
            cancel_all(calls)  # a no-op for the calls that ended
        made = next((send.error for send in sends if send.error is not None), None)
        if made is not None:
            raise made
        if errors:
            raise decisive_error(errors)

    def _call_s(self) -> float:
        """The timeout of one upload call: what is left of the deadline, at most UPLOAD_CALL_S."""
        return max(0.05, min(UPLOAD_CALL_S, self.deadline.left()))

    def _retried_upload(self, once: Callable[[float], pb.UploadResponse]) -> pb.UploadResponse:
        """``once`` retried until the deadline; a refusal is :class:`UploadRefusedError` (or
        :class:`ReleaseAbortedError` if the release was aborted meanwhile)."""
        try:
            what = f"the server at {self.config.server} to take our upload"
            return retry_until(once, what, self.deadline, self.log, UPLOAD_CALL_S)
        except grpc.RpcError as exc:
            raise_if_aborted(self.status())
            raise UploadRefusedError(f"the server refused {self.config.name}'s upload: {exc.details()}") from exc

    def wait_sealed(self) -> pb.ReleaseStatus:
        """Poll until every curator committed (SEALED or PERTURBED); ABORTED raises with the
        reason; at the deadline :class:`WaitTimeoutError` names the curators not committed."""
        while True:
            status = self.status("the release to be sealed")
            raise_if_aborted(status)
            if status is not None and status.state in SEALED_STATES:
                return status
            pending = [p.curator for p in status.curators if not p.committed] if status is not None else ["anyone"]
            self.deadline.sleep(POLL_S, f"{', '.join(pending)} to commit release {self.config.release_id!r}")

    def abort(self, reason: str, give_up_s: float = ABORT_GIVE_UP_S) -> tuple[pb.ReleaseStatus | None, bool]:
        """Abort the release at the server with ``reason`` (retried while unreachable or not yet
        registered, for at least ``give_up_s``). Returns the status after it (None if unknown)
        and whether the server answered that it does not know the release at all. A sealed
        release stays sealed."""
        request = pb.AbortRequest(release_id=self.config.release_id, curator=self.config.name, reason=reason[:900])
        grace = self.wind_down(give_up_s)
        try:
            status: pb.ReleaseStatus = retry_until(
                lambda t: self.stub.AbortRelease(request, timeout=min(t, STATUS_CALL_S)),
                f"the server at {self.config.server} to record the abort",
                grace,
                self.log,
                retry=TRANSIENT | {grpc.StatusCode.NOT_FOUND},
            )
        except grpc.RpcError as exc:
            self.log.warning("abort_refused", release_id=self.config.release_id, code=exc.code().name)
            return self._status_quietly(), False
        except WaitTimeoutError as exc:  # unreachable, or never registered by anyone
            self.log.warning("abort_unsent", release_id=self.config.release_id, error=str(exc)[:200])
            return None, "NOT_FOUND" in str(exc)
        self.log.warning("aborted", release_id=self.config.release_id, reason=reason[:200])
        return status, False

    def _status_quietly(self) -> pb.ReleaseStatus | None:
        try:
            return self.status()
        except Exception:  # unreachable: unknown
            return None


#: Upload streams of a release whose sample is a file (a curator on a cluster): chunks made one at
#: a time from the file and the pad (bench/bench_upload_streams.py: 2 streams took 0.76-0.93 of
#: one stream's time on 2 cores).
FILE_UPLOAD_STREAMS = 2


def upload_record(link: ServerLink, record: ReleaseRecord) -> None:
    """Register the release, upload what the server lacks of ``record``'s ciphertext (each chunk
    made from the record when it is sent: a chunk in memory at a time) and commit."""
    link.register(record.spec)
    streams = FILE_UPLOAD_STREAMS if record.sample_file is not None else 1
    link.upload_chunks(record.spec, record.spec.num_chunks, record.ciphertext_chunk, streams)
