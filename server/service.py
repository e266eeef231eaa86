"""The ReleaseServer servicer: authorization, message checks and status-code mapping only.

All state lives in server/store.py (durable) and server/state.py (pure rules); all math in
mechanism/. Logs carry ids, counts and digests, never key or symbol bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import grpc

from secure_release.infra import streams, wire
from secure_release.infra.auth import caller
from secure_release.infra.errors import abort_with
from secure_release.infra.logs import EventLog
from secure_release.infra.tls import secure_channel
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError
from secure_release.mechanism.primitives.keys import PramKey
from secure_release.mechanism.primitives.packing import CHUNK_ROWS
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server import state as st
from secure_release.server.store import MAX_CHUNK_BYTES, Store
from secure_release.server.tables import StoredTable, TableStreamError

log = EventLog("server", "server")

#: An upload message may exceed its symbol payload by this much (ids, numbers, digest).
MAX_UPLOAD_MESSAGE = MAX_CHUNK_BYTES + 64 + 512
#: A stored-table message may also declare up to 16 curator names of up to 63 characters.
MAX_TABLE_MESSAGE = MAX_UPLOAD_MESSAGE + 16 * 66


class NotGrantedError(SecureReleaseError):
    """The researcher is not among the release's granted researchers."""

    kind = ErrorKind.PERMISSION_DENIED


def _fail(context: grpc.ServicerContext, exc: SecureReleaseError, rpc: str) -> NoReturn:
    log.info("rejected", extra={"rpc": rpc, "error": type(exc).__name__})
    abort_with(context, exc)


def status_to_proto(rel: st.Release) -> pb.ReleaseStatus:
    """The release's state and per-curator progress as a ReleaseStatus message."""
    return pb.ReleaseStatus(
        release_id=rel.spec.release_id,
        state=int(rel.state),  # type: ignore[arg-type]
        params=wire.spec_to_pb(rel.spec),
        curators=[
            pb.CuratorProgress(
                curator=c,
                registered=part.registered,
                symbols_stored=rel.symbols_stored(c),
                committed=part.committed,
                chunks_held=sorted(part.chunks),
            )
            for c, part in rel.parts.items()
        ],
        perturbed_digest=rel.perturbed_digest,
        chunk_rows=CHUNK_ROWS,
        abort_reason=rel.abort_reason,
    )


def table_status_to_proto(table: StoredTable, deleted: bool = False) -> pb.TableStatus:
    """A stored table's status (which chunks each curator stored, complete or not)."""
    return wire.table_status_to_pb(table.table_id, table.curators, table.n, table.views(), deleted)


class ReleaseService(pb_grpc.ReleaseServerServicer):
    """The cloud server's RPCs."""

    def __init__(
        self,
        store: Store,
        key_factory: Callable[[], PramKey] = PramKey.generate,
        notify: Callable[[st.Release], None] | None = None,
    ) -> None:
        self.store = store
        self.key_factory = key_factory
        self.notify = notify
        # Check-and-perturb is one step: two commits racing to seal a release must not both
        # see it SEALED and both notify (store.perturb returns a perturbed release unchanged).
        self._perturb_lock = threading.Lock()

    # ------------------------------------------------------------------ PRAM
    def perturb_if_sealed(self, release_id: str, curator: str | None = None) -> st.Release:
        """Apply PRAM once the release is sealed (``curator``: the candidate that curator
        committed to, which need not be bound yet; then there is nothing to do)."""
        with self._perturb_lock:
            rel = self.store.release(release_id, curator)
            if rel.state != st.ReleaseState.SEALED:
                return rel
            rel = self.store.perturb(release_id, self.key_factory)
        log.info(
            "perturbed",
            extra={"release": release_id, "m": rel.spec.m, "digest": rel.perturbed_digest.hex()},
        )
        if self.notify is not None:
            threading.Thread(target=self._notify, args=(rel,), daemon=True).start()
        return rel

    def _perturb_after_commit(self, release_id: str, curator: str) -> None:
        """PRAM if that commit sealed the release; a failure is logged, not sent to the
        committing curator (its commit is durable; a sealed release is perturbed at restart)."""
        try:
            self.perturb_if_sealed(release_id, curator)
        except Exception as exc:
            log.error("PRAM failed", extra={"release": release_id, "error": type(exc).__name__})

    def _notify(self, rel: st.Release) -> None:
        try:
            assert self.notify is not None
            self.notify(rel)
        except Exception as exc:  # best effort
            log.warning(
                "notify failed",
                extra={"release": rel.spec.release_id, "error": type(exc).__name__},
            )

    # ------------------------------------------------------------------ RPCs
    def RegisterPart(  # noqa: N802
        self, request: pb.RegisterPartRequest, context: Any
    ) -> pb.RegisterPartResponse:
        ident = caller(context)
        try:
            rel = self.store.register(wire.spec_from_pb(request.params), request.curator, ident.name)
        except SecureReleaseError as exc:
            _fail(context, exc, "RegisterPart")
        log.info("registered", extra={"release": rel.spec.release_id, "curator": ident.name})
        return pb.RegisterPartResponse(status=status_to_proto(rel))

    def UploadCiphertext(  # noqa: N802
        self,
        request_iterator: Iterator[pb.UploadChunk],
        context: Any,
    ) -> pb.UploadResponse:
        ident = caller(context)
        stream: tuple[str, str] | None = None  # (release_id, curator) of the first message
        new = 0
        for chunk in request_iterator:
            if chunk.ByteSize() > MAX_UPLOAD_MESSAGE or len(chunk.symbols) > MAX_CHUNK_BYTES:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"an upload message carries at most {MAX_CHUNK_BYTES} symbol bytes "
                    f"(chunks of {CHUNK_ROWS} rows); got {len(chunk.symbols)}",
                )
            if stream is None:
                stream = (chunk.release_id, chunk.curator)
            elif (chunk.release_id, chunk.curator) != stream:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "one upload stream carries one release and one curator",
                )
            release_id, curator = stream
            try:
                if chunk.commit:
                    rel = self.store.commit(release_id, curator, ident.name, int(chunk.num_chunks), bytes(chunk.digest))
                    log.info(
                        "committed",
                        extra={"release": release_id, "curator": curator, "state": rel.state.name},
                    )
                    # PRAM now, before reading on: a client that dies after its commit message
                    # (the stream then ends in an error, not a half-close) must not leave the
                    # release sealed and never perturbed.
                    self._perturb_after_commit(release_id, curator)
                else:
                    if self.store.put_chunk(release_id, curator, ident.name, int(chunk.sequence), bytes(chunk.symbols)):
                        new += 1
            except SecureReleaseError as exc:
                _fail(context, exc, "UploadCiphertext")
        if stream is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an upload stream needs at least one message")
            raise AssertionError("context.abort returned")  # pragma: no cover
        release_id, curator = stream
        log.info("upload", extra={"release": release_id, "curator": curator, "new_chunks": new})
        rel = self.store.release(release_id, curator)
        part = rel.parts[curator]
        return pb.UploadResponse(
            release_id=release_id,
            curator=curator,
            chunks_stored=len(part.chunks),
            symbols_stored=rel.symbols_stored(curator),
            committed=part.committed,
            status=status_to_proto(rel),
        )

    def GetReleaseStatus(self, request: pb.ReleaseStatusRequest, context: Any) -> pb.ReleaseStatus:  # noqa: N802
        ident = caller(context)
        as_curator = ident.name if ident.role == "curator" else None
        try:
            return status_to_proto(self.store.release(request.release_id, as_curator))
        except SecureReleaseError as exc:
            _fail(context, exc, "GetReleaseStatus")

    def FetchPerturbed(self, request: pb.FetchRequest, context: Any) -> Iterator[pb.PerturbedChunk]:  # noqa: N802
        ident = caller(context)
        try:
            rel = self.store.release(request.release_id)
            if ident.name not in rel.spec.researchers:
                raise NotGrantedError(
                    f"researcher {ident.name!r} is not granted release {request.release_id!r}; "
                    f"granted: {list(rel.spec.researchers)}"
                )
            rel.check_fetch()
            chunks = self.store.fetch(request.release_id)
        except SecureReleaseError as exc:
            _fail(context, exc, "FetchPerturbed")
        log.info("fetch", extra={"release": request.release_id, "researcher": ident.name})
        yield from streams.perturbed_chunks(
            request.release_id, ((c.seq, c.first_row, c.columns) for c in chunks), rel.spec.num_chunks,
            rel.perturbed_digest,
        )  # fmt: skip

    def AbortRelease(self, request: pb.AbortRequest, context: Any) -> pb.ReleaseStatus:  # noqa: N802
        """A curator of the release stops it before sealing; every party then sees ABORTED."""
        ident = caller(context)
        try:
            rel = self.store.abort(request.release_id, request.curator, ident.name, request.reason)
        except SecureReleaseError as exc:
            _fail(context, exc, "AbortRelease")
        log.info("aborted", extra={"release": request.release_id, "curator": ident.name})
        return status_to_proto(rel)


    def DeclareRelease(self, request: pb.ReleaseDeclaration, context: Any) -> pb.RefusalList:  # noqa: N802
        """A curator's own record of a release: its parties and, once it refuses, why (the
        security note is server/refusals.py's docstring). Answers the refusals that show."""
        ident = caller(context)
        try:
            declaration = wire.declaration_from_pb(request)
            refusals = self.store.declare(declaration, ident.name)
        except SecureReleaseError as exc:
            _fail(context, exc, "DeclareRelease")
        if declaration.refusal is not None:
            log.info("refused", extra={"release": declaration.release_id, "curator": ident.name,
                                       "reason_class": declaration.refusal.value})  # fmt: skip
        return wire.refusals_to_pb(refusals)

    def GetRefusals(self, request: pb.RefusalQuery, context: Any) -> pb.RefusalList:  # noqa: N802
        """The refusals of a release that show (a curator's refusal once another party confirms
        it takes part): what a researcher's fetch and a curator's wait read before any spec."""
        try:
            release_id = wire.check_release_id(request.release_id)
            return wire.refusals_to_pb(self.store.refusals(release_id))
        except SecureReleaseError as exc:
            _fail(context, exc, "GetRefusals")

    # --------------------------------------------------- stored tables (server-side sampling)
    def StoreTable(  # noqa: N802
        self, request_iterator: Iterator[pb.TableChunk], context: Any
    ) -> pb.TableStatus:
        """A curator's whole encrypted column of a stored table, chunk by chunk (resumable)."""
        ident = caller(context)
        declared: streams.TableDeclaration | None = None
        table: StoredTable | None = None
        new = 0
        for chunk in request_iterator:
            try:
                if chunk.ByteSize() > MAX_TABLE_MESSAGE or len(chunk.symbols) > MAX_CHUNK_BYTES:
                    raise TableStreamError(
                        f"a table message carries at most {MAX_CHUNK_BYTES} symbol bytes "
                        f"(chunks of {CHUNK_ROWS} rows); got {len(chunk.symbols)}"
                    )
                if declared is None:
                    declared = streams.table_declaration_from_pb(chunk)
                elif (chunk.table_id, chunk.curator) != (declared.table_id, declared.curator):
                    raise TableStreamError("one table stream carries one table and one curator")
                if chunk.commit:
                    table = self.store.commit_table(declared, ident.name, int(chunk.num_chunks), bytes(chunk.digest))
                    log.info(
                        "table committed",
                        extra={"table": declared.table_id, "curator": declared.curator, "complete": table.complete},
                    )
                elif self.store.put_table_chunk(declared, ident.name, int(chunk.sequence), bytes(chunk.symbols)):
                    new += 1
            except SecureReleaseError as exc:
                _fail(context, exc, "StoreTable")
        if declared is None:
            _fail(context, TableStreamError("a table stream needs at least one message"), "StoreTable")
        log.info("table upload", extra={"table": declared.table_id, "curator": declared.curator, "new_chunks": new})
        return table_status_to_proto(table or self.store.table(declared.table_id, ident.name))

    def GetTableStatus(self, request: pb.TableStatusRequest, context: Any) -> pb.TableStatus:  # noqa: N802
        ident = caller(context)
        try:
            return table_status_to_proto(self.store.table(request.table_id, ident.name))
        except SecureReleaseError as exc:
            _fail(context, exc, "GetTableStatus")

    def DeleteTable(self, request: pb.DeleteTableRequest, context: Any) -> pb.TableStatus:  # noqa: N802
        ident = caller(context)
        try:
            table = self.store.delete_table(request.table_id, request.curator, ident.name)
        except SecureReleaseError as exc:
            _fail(context, exc, "DeleteTable")
        log.info("table deleted", extra={"table": request.table_id, "curator": ident.name})
        return table_status_to_proto(table, deleted=True)

    def FetchSample(self, request: pb.SampleRequest, context: Any) -> Iterator[pb.SampleChunk]:  # noqa: N802
        """The positions the server drew, to a registered curator of the server-sampled release."""
        ident = caller(context)
        try:
            spec, packed = self.store.sample(request.release_id, request.curator, ident.name)
        except SecureReleaseError as exc:
            _fail(context, exc, "FetchSample")
        log.info("sample sent", extra={"release": request.release_id, "curator": ident.name, "m": spec.m})
        yield from streams.sample_chunks(spec.release_id, spec.table_id, spec.n, spec.m, packed)


    def WitnessLedger(self, request: pb.WitnessRequest, context: Any) -> pb.WitnessReply:  # noqa: N802
        """The caller's budget witness of one keyed data set (moved up first with ``record``)."""
        ident = caller(context)
        try:
            held = self.store.witness.observe(
                request.curator, ident.name, bytes(request.dataset_key), int(request.reservations),
                float(request.epsilon_total), bool(request.record),
            )  # fmt: skip
        except SecureReleaseError as exc:
            _fail(context, exc, "WitnessLedger")
        return pb.WitnessReply(reservations=held.reservations, epsilon_total=held.epsilon_total)


def make_notifier(
    researcher_address: str, cert_dir: Path | None, name: str, insecure: bool
) -> Callable[[st.Release], None]:
    """Best-effort Researcher.NotifyReady with the server's own certificate."""

    def notify(rel: st.Release) -> None:
        if not rel.spec.researchers:
            return
        with secure_channel(
            researcher_address, cert_dir, name, insecure=insecure, role="server", peer_role="researcher"
        ) as channel:
            pb_grpc.ResearcherStub(channel).NotifyReady(
                pb.ReadyNotice(release_id=rel.spec.release_id, perturbed_digest=rel.perturbed_digest),
                timeout=10,
            )
        log.info(
            "notified",
            extra={"release": rel.spec.release_id, "researcher": rel.spec.researchers[0]},
        )

    return notify
