"""The Researcher gRPC service (behind ``infra.auth.AuthInterceptor``, which checks each RPC's
roles in ``infra.auth.ACCESS`` before these methods run).

- ``NotifyReady`` (server): the release is perturbed; start processing it in the background.
- ``GetEstimate`` (analyst, researcher): the finished :class:`ReleaseReport` as an
  ``EstimateResponse`` (``infra.wire.report_to_pb``). With ``wait`` it blocks until the estimate
  exists, starting the processing if nobody notified us, within the call's deadline.
- ``ListReleases`` (analyst, researcher): the releases estimated so far.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc

from secure_release.infra.auth import caller
from secure_release.infra.errors import abort_with
from secure_release.infra.logs import EventLog
from secure_release.infra.wire import report_to_pb, tables_to_pb
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError
from secure_release.mechanism.estimation.report import ReleaseReport, TablesReport
from secure_release.mechanism.protocol.spec import check_name
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.errors import EstimateNotFoundError, NotAReaderError, ReleaseFailedError
from secure_release.researcher.storage import AnyReport

#: ``process(release_id, notified_digest)``: estimate one release (and write its files).
Processor = Callable[[str, bytes], AnyReport]
#: The longest a GetEstimate(wait) without a deadline blocks.
MAX_WAIT_SECONDS = 3600.0
#: Releases estimated at once (a fixed pool: a flood of distinct release ids starts no threads).
PROCESS_WORKERS = 2
#: Releases queued or being estimated at once; past it a new one is refused (RESOURCE_EXHAUSTED).
MAX_PENDING = 32
#: Failures remembered (the oldest are forgotten first; asking again retries).
MAX_FAILURES_KEPT = 1024


class TooManyPendingError(SecureReleaseError):
    """Too many releases are queued for estimation; ask again once some have finished."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


def as_project_error(exc: Exception) -> SecureReleaseError:
    """``exc`` if it is a project error (it names its kind), else a ReleaseFailedError."""
    if isinstance(exc, SecureReleaseError):
        return exc
    if isinstance(exc, grpc.RpcError):
        return ReleaseFailedError(f"an RPC failed: {exc.code().name}: {exc.details()}")
    return ReleaseFailedError(f"{type(exc).__name__}: {exc}")


class ReleaseTracker:
    """Which releases are being processed, finished (their reports) or failed (their errors),
    and the background threads that process them; thread safe."""

    def __init__(self, process: Processor, log: EventLog, reports: Mapping[str, AnyReport]) -> None:
        self.process, self.log = process, log
        self.reports: dict[str, AnyReport] = dict(reports)
        self.failures: dict[str, SecureReleaseError] = {}
        self.running: set[str] = set()
        self.changed = threading.Condition()
        self._pool = ThreadPoolExecutor(PROCESS_WORKERS, thread_name_prefix="estimate")

    def close(self) -> None:
        """Wait for the releases being processed (queued ones still run); a stopped service
        calls it so no estimation thread outlives it."""
        self._pool.shutdown(wait=True)

    def start(self, release_id: str, notified_digest: bytes = b"") -> bool:
        """Queue ``release_id`` on the fixed pool unless it is done, queued or running;
        :class:`TooManyPendingError` once :data:`MAX_PENDING` are."""
        with self.changed:
            if release_id in self.running or release_id in self.reports:
                return False
            if len(self.running) >= MAX_PENDING:
                raise TooManyPendingError(
                    f"{len(self.running)} releases are queued for estimation, the most this researcher takes at once; "
                    f"ask for {release_id!r} again once some have finished"
                )
            self.running.add(release_id)
            self.failures.pop(release_id, None)
        self._pool.submit(self._run, release_id, notified_digest)
        return True

    def _run(self, release_id: str, notified_digest: bytes) -> None:
        """Process one release; record its report or its error (never crash the service)."""
        report: AnyReport | None = None
        failure: SecureReleaseError | None = None
        try:
            report = self.process(release_id, notified_digest)
        except Exception as exc:
            failure = as_project_error(exc)
            self.log.error("process_failed", release_id=release_id, error=f"{type(failure).__name__}: {failure}")
        with self.changed:
            if report is not None:
                self.reports[release_id] = report
            if failure is not None:
                self.failures[release_id] = failure
                while len(self.failures) > MAX_FAILURES_KEPT:
                    del self.failures[next(iter(self.failures))]
            self.running.discard(release_id)
            self.changed.notify_all()

    def wait(self, release_id: str, timeout: float) -> None:
        """Block until ``release_id`` has a report or has failed (at most ``timeout`` seconds)."""
        with self.changed:
            self.changed.wait_for(
                lambda: release_id in self.reports or (release_id in self.failures and release_id not in self.running),
                timeout,
            )

    def outcome(self, release_id: str) -> AnyReport | SecureReleaseError | None:
        """The release's report, else its failure, else None (unknown or still running)."""
        with self.changed:
            if release_id in self.reports:
                return self.reports[release_id]
            return self.failures.get(release_id)

    def finished(self) -> list[str]:
        """The release ids with a report, sorted."""
        with self.changed:
            return sorted(self.reports)


class ResearcherService(pb_grpc.ResearcherServicer):
    """Serves the reports of a :class:`ReleaseTracker` to analysts."""

    def __init__(
        self, tracker: ReleaseTracker, log: EventLog, default_wait: float, readers: frozenset[str] = frozenset()
    ) -> None:
        """``readers``: the identities (``role/name``) that may read this researcher's estimates."""
        self.tracker, self.log, self.default_wait, self.readers = tracker, log, default_wait, readers

    def _check_reader(self, context: grpc.ServicerContext, release_id: str = "") -> None:
        """PERMISSION_DENIED unless the caller is one of this researcher's readers."""
        who = str(caller(context))
        if who not in self.readers:
            self.log("estimate_refused", release_id=release_id, caller=who)
            abort_with(context, NotAReaderError(f"{who} may not read this researcher's estimates"))

    def NotifyReady(self, request: pb.ReadyNotice, context: grpc.ServicerContext) -> pb.ReadyAck:  # noqa: N802
        """The server says a release is perturbed: start estimating it."""
        release_id = self._release_id(request.release_id, context)
        try:
            started = self.tracker.start(release_id, bytes(request.perturbed_digest))
        except SecureReleaseError as exc:
            abort_with(context, exc)
        self.log("notified", release_id=release_id, by=str(caller(context)), started=started)
        return pb.ReadyAck(accepted=True)

    def GetEstimate(  # noqa: N802
        self, request: pb.EstimateRequest, context: grpc.ServicerContext
    ) -> pb.EstimateResponse:
        """The finished estimate of a release (waiting for it if ``request.wait``)."""
        release_id = self._release_id(request.release_id, context)
        self._check_reader(context, release_id)
        if request.wait:
            try:
                self.tracker.start(release_id)
            except SecureReleaseError as exc:
                abort_with(context, exc)
            self.tracker.wait(release_id, self._wait_seconds(context))
        outcome = self.tracker.outcome(release_id)
        if isinstance(outcome, ReleaseReport):
            self.log("estimate_served", release_id=release_id, to=str(caller(context)))
            return report_to_pb(outcome)
        if isinstance(outcome, TablesReport):
            self.log("estimate_served", release_id=release_id, to=str(caller(context)), tables=len(outcome.tables))
            return tables_to_pb(outcome)
        if isinstance(outcome, SecureReleaseError):
            abort_with(context, outcome)
        if request.wait:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"release {release_id!r} is still being estimated")
        abort_with(
            context,
            EstimateNotFoundError(f"no estimate of release {release_id!r} yet; ask with wait=true to start one"),
        )

    def ListReleases(  # noqa: N802
        self, request: pb.ListReleasesRequest, context: grpc.ServicerContext
    ) -> pb.ListReleasesResponse:
        """The ids of the releases estimated so far."""
        self._check_reader(context)
        return pb.ListReleasesResponse(release_ids=self.tracker.finished())

    def _wait_seconds(self, context: grpc.ServicerContext) -> float:
        """How long a waiting GetEstimate may block: the call's deadline, capped."""
        remaining = context.time_remaining()
        return self.default_wait if remaining is None else min(float(remaining), MAX_WAIT_SECONDS)

    @staticmethod
    def _release_id(release_id: str, context: grpc.ServicerContext) -> str:
        """The asked release id if it follows the name grammar; else INVALID_ARGUMENT."""
        try:
            return check_name(release_id, "release id")
        except SecureReleaseError as exc:
            abort_with(context, exc)
