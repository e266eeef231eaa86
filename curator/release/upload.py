"""The curator's calls to the release server: register its part, upload the chunks the server
does not hold yet (``chunks_held``) and commit, watch the release's state, and abort it.

Every call is retried while the server is unreachable, until the run's deadline; replays of an
identical chunk or commit are idempotent successes at the server, so a restarted curator simply
sends what is missing. The release's outcome comes from its status: SEALED or PERTURBED
(:data:`SEALED_STATES`) or ABORTED (:class:`ReleaseAbortedError` with the reason).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

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
from secure_release.curator.waits import TRANSIENT, Deadline, retry_until
from secure_release.infra.exitcodes import is_refusal
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import upload_chunks
from secure_release.infra.tls import secure_channel
from secure_release.infra.wire import spec_to_pb
from secure_release.mechanism.errors import ShapeMismatchError
from secure_release.mechanism.packing import CHUNK_ROWS, pack_symbols
from secure_release.mechanism.schema import SymbolArray
from secure_release.mechanism.spec import ReleaseSpec
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

UPLOAD_CALL_S = 120.0
STATUS_CALL_S = 5.0
POLL_S = 0.25
SEALED_STATES = frozenset({pb.RELEASE_STATE_SEALED, pb.RELEASE_STATE_PERTURBED})


def pack_chunks(ciphertext: SymbolArray, alphabet_size: int) -> list[bytes]:
    """The ciphertext packed CHUNK_ROWS symbols a chunk (one numpy pack per chunk)."""
    return [
        pack_symbols(ciphertext[start : start + CHUNK_ROWS], alphabet_size)
        for start in range(0, int(ciphertext.size), CHUNK_ROWS)
    ]


def upload_messages(
    release_id: str, curator: str, chunks: Sequence[bytes], skip: frozenset[int] = frozenset()
) -> Iterator[pb.UploadChunk]:
    """The UploadCiphertext stream: every chunk not in ``skip``, then the commit with digest
    and count (over all chunks)."""
    with Progress(
        f"{curator} upload",
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        disable=not sys.stderr.isatty(),
    ) as progress:
        task = progress.add_task("upload", total=len(chunks))
        for msg in upload_chunks(release_id, curator, chunks, skip):
            if not msg.commit:
                progress.update(task, completed=msg.sequence + 1)
            yield msg


def progress_of(status: pb.ReleaseStatus, curator: str) -> pb.CuratorProgress | None:
    """``curator``'s progress in a status (None if it is not listed)."""
    return next((p for p in status.curators if p.curator == curator), None)


def raise_if_aborted(status: pb.ReleaseStatus | None) -> None:
    """:class:`ReleaseAbortedError` with the recorded reason if the release is ABORTED."""
    if status is not None and status.state == pb.RELEASE_STATE_ABORTED:
        if is_refusal(status.abort_reason):
            raise ReleaseAbortedAsRefusedError(f"{status.abort_reason} (release {status.release_id!r} aborted)")
        raise ReleaseAbortedError(f"release {status.release_id!r} was aborted: {status.abort_reason}")


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

    def upload(self, spec: ReleaseSpec, ciphertext: SymbolArray) -> None:
        """Send the chunks the server does not hold and commit (nothing if already committed)."""
        if int(ciphertext.size) != spec.m:
            raise ShapeMismatchError(f"{self.config.name} has {ciphertext.size} symbols, the spec says m = {spec.m}")
        chunks = pack_chunks(ciphertext, spec.alphabet_of(self.config.name))

        def once(timeout: float) -> pb.UploadResponse:
            status = self.status("the server before uploading")
            raise_if_aborted(status)
            mine = None if status is None else progress_of(status, self.config.name)
            if mine is not None and mine.committed:
                return pb.UploadResponse(committed=True, chunks_stored=len(mine.chunks_held))
            held = frozenset(int(s) for s in mine.chunks_held) if mine is not None else frozenset()
            messages = upload_messages(spec.release_id, self.config.name, chunks, held)
            response: pb.UploadResponse = self.stub.UploadCiphertext(messages, timeout=min(timeout, UPLOAD_CALL_S))
            return response

        try:
            what = f"the server at {self.config.server} to take our upload"
            resp = retry_until(once, what, self.deadline, self.log, UPLOAD_CALL_S)
        except grpc.RpcError as exc:
            raise_if_aborted(self.status())
            raise UploadRefusedError(f"the server refused {self.config.name}'s upload: {exc.details()}") from exc
        if not resp.committed:
            raise UploadRefusedError(f"the server did not commit {self.config.name}'s upload of {spec.release_id!r}")
        self.log("committed", release_id=spec.release_id, chunks=len(chunks))

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

    def abort(self, reason: str, give_up_s: float = 10.0) -> tuple[pb.ReleaseStatus | None, bool]:
        """Abort the release at the server with ``reason`` (retried while unreachable or not yet
        registered, for at least ``give_up_s``). Returns the status after it (None if unknown)
        and whether the server answered that it does not know the release at all. A sealed
        release stays sealed."""
        request = pb.AbortRequest(release_id=self.config.release_id, curator=self.config.name, reason=reason[:900])
        grace = Deadline(max(give_up_s, self.deadline.left()))
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
