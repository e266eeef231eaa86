"""Server-side sampling at a curator (rekeyed path): store a table once, then take part
in any number of releases the server samples from it.

``store-table`` (:func:`store_table`): read the table -> id tags (keyed hash, or the PSI ring
through the leader) -> the agreement exactly as for a release (leader or follower; the spec is a
placeholder under the table id and its seed is never used) -> align -> encrypt the whole aligned
column under a fresh :class:`~secure_release.mechanism.protocol.server_sampling.TableKey`
(``curator_store_table``) -> persist the table record (key, n, every curator's alphabet size,
schema, ciphertext digest; 0600, fsync) before any byte leaves -> upload what the server lacks
(``StoreTable``, chunks <= 1 MiB, digest) -> wait until every curator committed. A rerun reuses
the recorded key and uploads only if it re-derives exactly the recorded ciphertext (a pad is
never applied to other plaintext).

``run --sampling server`` (:func:`run_server_sampled`): the spec follows from the table record
(n, alphabet sizes), ``--epsilon``, ``--m`` and ``--cipher``, so every curator computes the same
one and registers it; no curator-to-curator agreement and no data file are needed. Then:
check the table's ledger (refused: register and abort, so everybody stops) -> fetch the server's
positions once every curator registered (``FetchSample``) -> reserve epsilon on the table's
ledger (``charge_table_release``) -> re-key column delta = (w - v_p) mod k for a fresh release
pad w (``curator_rekey``), persisted in the release record before upload -> upload it as the
release's ciphertext, commit, wait until sealed (ledger: commit; abort: refund) -> serve the
release key to granted researchers. Positions, keys and pads are never logged.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from secure_release.curator.cluster.matching import ClusterLeader
from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import UploadRefusedError
from secure_release.curator.leader import LeaderState
from secure_release.curator.partitions import dataset_fingerprint
from secure_release.curator.records.keystore import (
    Keystore,
    KeystoreError,
    ReleaseRecord,
    TableChangedError,
    TableRecord,
)
from secure_release.curator.records.witness import BudgetWitness
from secure_release.curator.release.agreement import agree, leader_state
from secure_release.curator.release.agreement_checks import own_alignment
from secure_release.curator.release.aligning import ClusterSettings, TableSource, shard_table
from secure_release.curator.release.budget import settle
from secure_release.curator.release.failing import abort_and_settle
from secure_release.curator.release.opening import (
    ListenSettings,
    load_table,
    open_keystore,
    own_schema,
    start_server,
    stop_on_sigterm,
)
from secure_release.curator.release.preparing import cluster_aligned
from secure_release.curator.release.serving import ServeSettings, serve_until_acknowledged
from secure_release.curator.release.upload import (
    STATUS_CALL_S,
    UPLOAD_CALL_S,
    ServerChannel,
    ServerLink,
    pack_chunks,
    raise_if_aborted,
)
from secure_release.curator.service import CuratorService
from secure_release.curator.table import TableSpec
from secure_release.curator.waits import TRANSIENT, Deadline, retry_until
from secure_release.infra.config import ConfigError
from secure_release.infra.exitcodes import refusal_reason
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import ServerSample, TableDeclaration, sample_from_chunks, table_chunks
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError
from secure_release.mechanism.primitives.packing import digest_of
from secure_release.mechanism.primitives.pads import decrypt
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.architectures import AlignmentMode, VariantAgreement
from secure_release.mechanism.protocol.in_memory import curator_tags
from secure_release.mechanism.protocol.server_sampling import (
    TableKey,
    charge_table_release,
    curator_rekey,
    curator_store_table,
)
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.schema import SymbolArray
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

POLL_S = 0.25


class TableNotStoredError(SecureReleaseError):
    """``run --sampling server`` names a table this curator never stored (no table record)."""

    kind = ErrorKind.FAILED_PRECONDITION


# ------------------------------------------------------------------------------ the server
class TableLink(ServerChannel):
    """One curator's calls about a stored table: status, resumable upload, completion."""

    def status(self, table_id: str) -> pb.TableStatus | None:
        """The table's status (None: the server holds no such table yet)."""
        request = pb.TableStatusRequest(table_id=table_id)
        try:
            status: pb.TableStatus = retry_until(
                lambda t: self.stub.GetTableStatus(request, timeout=min(t, STATUS_CALL_S)),
                "the server's table status",
                self.deadline,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return status

    def upload(self, declaration: TableDeclaration, chunks: Sequence[bytes]) -> pb.TableStatus:
        """Send the chunks the server does not hold, then commit (a committed column is only
        re-committed: the server checks the digest)."""

        def once(timeout: float) -> pb.TableStatus:
            status = self.status(declaration.table_id)
            mine = None if status is None else next((p for p in status.parts if p.curator == self.config.name), None)
            held = frozenset(int(s) for s in mine.chunks_held) if mine is not None else frozenset()
            messages = table_chunks(declaration, chunks, held)
            response: pb.TableStatus = self.stub.StoreTable(messages, timeout=min(timeout, UPLOAD_CALL_S))
            return response

        try:
            status = retry_until(once, "the server to take our table", self.deadline, self.log, UPLOAD_CALL_S)
        except grpc.RpcError as exc:
            raise UploadRefusedError(f"the server refused {self.config.name}'s table: {exc.details()}") from exc
        self.log("table_committed", table_id=declaration.table_id, chunks=len(chunks))
        return status

    def wait_complete(self, table_id: str) -> pb.TableStatus:
        """Until every curator of the table committed its column."""
        while True:
            status = self.status(table_id)
            if status is not None and status.complete:
                return status
            pending = [p.curator for p in status.parts if not p.committed] if status is not None else []
            missing = [c for c in self.config.curators if status is None or c not in {p.curator for p in status.parts}]
            self.deadline.sleep(POLL_S, f"{', '.join(pending + missing) or 'the curators'} to store table {table_id!r}")


# ------------------------------------------------------------------------------ store-table
def _store_service(config: CuratorConfig, log: EventLog) -> tuple[CuratorService, LeaderState | None]:
    """The Curator service for the agreement (the leader's state under the table id)."""
    spec = own_schema(config.schema, config.name)
    service = CuratorService(config.name, spec.schema, log, config.max_rows)
    kind = ClusterLeader if config.engine == "dask" else LeaderState
    state = leader_state(config, spec.schema.alphabet_size, kind) if config.leader else None
    if state is not None:
        service.lead(state)
    return service, state


def store_table(config: CuratorConfig) -> int:
    """Align with the other curators, encrypt the whole aligned column under a table key and
    upload it once; 0 once every curator of the table committed."""
    assert config.table_id is not None
    table_id = config.table_id
    log = EventLog("curator", config.name)
    stop = stop_on_sigterm()
    service, state = _store_service(config, log)
    server = start_server(ListenSettings.of(config), service, log)
    deadline = Deadline(config.timeout, stop)
    link = TableLink(config, log, deadline)
    try:
        spec = own_schema(config.schema, config.name)
        keystore = Keystore(config.keystore)
        fingerprint = dataset_fingerprint(config.data)
        known = keystore.load_table(table_id)
        if known is not None and known.table_fingerprint != fingerprint:
            raise TableChangedError(
                f"table {table_id!r} was stored from a file with SHA-256 {known.table_fingerprint[:16]}..., "
                f"{config.data} hashes to {fingerprint[:16]}...; a stored table never changes: store the new "
                "file under a new --table-id"
            )
        k = spec.schema.alphabet_size
        if config.engine == "dask":
            agreement, aligned = _cluster_aligned(config, spec, state, log, deadline)
        else:
            agreement, aligned = _aligned(config, spec, state, log, deadline)
        base = agreement.base
        key: TableKey | None = known.key if known is not None else config.test_table_key
        ciphertext, key = curator_store_table(aligned, k, table_id, key)
        chunks = pack_chunks(ciphertext, k)
        digest = digest_of(chunks).hex()
        if known is not None and known.ciphertext_digest != digest:
            raise TableChangedError(
                f"table {table_id!r} would now encrypt to other bytes than were stored (the alignment differs, "
                "e.g. another curator's ids changed, or PSI gave another order); nothing was sent. Delete the "
                "table ('table delete') and store it under a new --table-id"
            )
        record = TableRecord(
            table_id, key, base.spec.curators, base.spec.n, base.spec.plan.alphabet_sizes, spec.schema,
            fingerprint, config.dataset, digest, config.alignment,
        )  # fmt: skip
        keystore.save_table(record)
        log("table_encrypted", table_id=table_id, n=base.spec.n, bytes=sum(len(c) for c in chunks), digest=digest[:16])
        declaration = TableDeclaration(table_id, config.name, base.spec.curators, base.spec.n, k)
        link.upload(declaration, chunks)
        status = link.wait_complete(table_id)
        log("table_stored", table_id=table_id, n=int(status.n), curators=list(status.curators))
        return 0
    except (SecureReleaseError, grpc.RpcError) as exc:
        if state is not None:
            state.fail(f"{type(exc).__name__}: {exc}")
            state.wait_all_told(min(10.0, config.timeout))
        raise
    finally:
        link.close()
        if isinstance(state, ClusterLeader):
            state.cleanup()
        server.stop(grace=1.0)
        log("stopped")


def _aligned(
    config: CuratorConfig, spec: TableSpec, state: LeaderState | None, log: EventLog, deadline: Deadline
) -> tuple[VariantAgreement, SymbolArray]:
    """The agreement and this curator's whole aligned column, in this process."""
    table = load_table(config.data, config.query, log, spec)
    if config.alignment is AlignmentMode.PSI:
        from secure_release.curator.release.psi_ring import run_ring

        tags = run_ring(config, table.ids, state, log, deadline)
    else:
        assert config.alignment_key is not None
        tags = curator_tags(table, config.alignment_key)
    agreement = agree(config, tags, spec.schema.alphabet_size, state, log, deadline)
    if state is not None:
        state.publish()  # nothing to register first: the placeholder spec never reaches the server
    alignment = own_alignment(agreement, tags, leader_rows=state.rows_of(config.name) if state else None)
    log("aligned", matched=alignment.num_matched, unmatched=alignment.num_unmatched, rows=alignment.num_rows)
    return agreement, table.symbols()[alignment.row_order]


def _cluster_aligned(
    config: CuratorConfig, spec: TableSpec, state: LeaderState | None, log: EventLog, deadline: Deadline
) -> tuple[VariantAgreement, SymbolArray]:
    """:func:`_aligned` on the curator's cluster (``--engine dask``): the same column."""
    sharded = shard_table(ClusterSettings.of(config), TableSource.of(config), log, spec, state, stop=deadline.stop)
    try:
        agreement = agree(config, sharded.tag_pieces, spec.schema.alphabet_size, state, log, deadline)
        if state is not None:
            state.publish()
        aligned = cluster_aligned(sharded, agreement, state, log)
        log("aligned", matched=int(aligned.size), rows=sharded.num_rows)
        return agreement, aligned.astype(np.uint32)
    finally:
        sharded.engine.close()  # a leader's spool (its followers' row orders) stays until store_table ends


# ------------------------------------------------------------------------------ run --sampling server
def stored_spec(config: CuratorConfig, table: TableRecord) -> ReleaseSpec:
    """The release spec every curator of the table computes alike (the server binds it once every
    curator registered the same one)."""
    if config.curators != table.curators:
        raise ConfigError(
            f"--curators {','.join(config.curators)} differs from stored table {table.table_id!r}'s curators "
            f"{','.join(table.curators)} (joint-code order)"
        )
    plan = plan_release(table.n, table.alphabet_sizes, config.epsilon, config.m)
    spec = ReleaseSpec(config.release_id, config.curators, config.cipher, plan, config.researchers, table.table_id)
    return spec.validate()


@dataclass
class StoredRun:
    """The pieces of one server-sampled run the steps share."""

    config: CuratorConfig
    log: EventLog
    keystore: Keystore
    table: TableRecord
    service: CuratorService
    link: ServerLink


def fetch_sample(run: StoredRun, spec: ReleaseSpec) -> ServerSample:
    """Wait until every curator registered the release (ABORTED raises with the reason), then
    fetch and validate the server's positions."""
    link = run.link
    while True:
        status = link.status("the release's registrations")
        raise_if_aborted(status)
        if status is not None and all(p.registered for p in status.curators):
            break
        pending = [p.curator for p in status.curators if not p.registered] if status is not None else ["anyone"]
        link.deadline.sleep(POLL_S, f"{', '.join(pending)} to register release {spec.release_id!r} of the same spec")
    request = pb.SampleRequest(release_id=spec.release_id, curator=run.config.name)
    sample: ServerSample = retry_until(
        lambda t: sample_from_chunks(iter(link.stub.FetchSample(request, timeout=min(t, UPLOAD_CALL_S))), spec),
        "the server's sample",
        link.deadline,
        run.log,
        retry=TRANSIENT,
    )
    run.log("sample_received", release_id=spec.release_id, m=spec.m, sample_fingerprint=sample.fingerprint)
    return sample


def refuse(run: StoredRun, spec: ReleaseSpec, exc: SecureReleaseError) -> None:
    """This curator's ledger refuses: join the release at the server and abort it with the reason
    (everyone polling its status stops)."""
    reason = refusal_reason(exc, f"{run.config.name} cannot reserve its budget")
    with contextlib.suppress(SecureReleaseError, grpc.RpcError):
        run.link.register(spec)
    run.link.abort(reason)


def prepare_stored(run: StoredRun, spec: ReleaseSpec) -> ReleaseRecord:
    """Register, get the positions, reserve epsilon on the table's ledger, re-key, persist."""
    config, table = run.config, run.table
    dataset = config.dataset or table.dataset_name  # one budget for the data set, however it is released
    witness = BudgetWitness(run.link.stub, config.name, run.keystore.ledger.signer, run.link.deadline)
    try:
        ledger = run.keystore.ledger.read()
        ledger.check_reserve(dataset, config.release_id, config.epsilon, None)
        witness.check(ledger, dataset, reread=run.keystore.ledger.read)
    except SecureReleaseError as exc:
        run.log.warning("ledger_refuses", release_id=config.release_id, reason=f"{type(exc).__name__}: {exc}")
        refuse(run, spec, exc)
        raise
    run.link.register(spec)
    sample = fetch_sample(run, spec)
    try:
        _, entry = run.keystore.ledger.update(
            lambda led: charge_table_release(
                copy.deepcopy(led), table.table_id, config.release_id, spec.plan.epsilon, sample.fingerprint,
                time.time(), dataset, table.table_fingerprint,
            )
        )  # fmt: skip
    except SecureReleaseError as exc:  # e.g. a repeated sample: nothing reserved; everybody stops
        run.link.abort(refusal_reason(exc, f"{config.name} cannot reserve its budget"))
        raise
    witness.check(run.keystore.ledger.read(), dataset, record=True, reread=run.keystore.ledger.read)
    run.log("ledger_reserved", release_id=config.release_id, epsilon=spec.plan.epsilon, dataset=dataset,
            new=entry is not None, remaining=run.keystore.ledger.read().remaining(dataset))  # fmt: skip
    k = spec.alphabet_of(config.name)
    delta, pad = curator_rekey(sample.positions, table.key, table.table_id, k, spec.cipher, config.test_pad_key)
    negated_pads = decrypt(delta, pad.pad(), k)  # -v_p mod k: record.ciphertext() re-derives delta
    record = ReleaseRecord(
        spec, pad, negated_pads, table.ciphertext_digest, dataset, sample.fingerprint, table_id=table.table_id
    )
    run.keystore.save_record(record)
    run.log("prepared", release_id=spec.release_id, m=spec.m, sampling="server", table_id=table.table_id,
            sample_fingerprint=sample.fingerprint)  # fmt: skip
    return record


def fail_stored(run: StoredRun, exc: Exception) -> None:
    """Abort the release at the server with the reason; refund the reservation once the server
    confirms ABORTED (or never knew the release)."""
    abort_and_settle(run.config.name, run.config.release_id, run.keystore, run.link, run.log, exc)


def serve_stored_keys(run: StoredRun, record: ReleaseRecord, stop: threading.Event) -> None:
    """Serve the release key to the granted researchers (as a run does: ``serving.serve_until_acknowledged``)."""
    serve_until_acknowledged(ServeSettings.of(run.config), run.service, run.log, record, stop)


def _resumable(config: CuratorConfig, keystore: Keystore) -> ReleaseRecord | None:
    record = keystore.load_record(config.release_id)
    if record is None:
        return None
    if record.table_id != config.table_id or record.spec.plan.epsilon != config.epsilon:
        raise ConfigError(
            f"release {config.release_id!r} was prepared from table {record.table_id or '(none: curator-sampled)'!r} "
            f"at epsilon {record.spec.plan.epsilon}; a resume must use the same --table-id and --epsilon"
        )
    return record


def run_server_sampled(config: CuratorConfig) -> int:
    """Take part in one release the server samples from a stored table, then serve keys."""
    assert config.table_id is not None
    log = EventLog("curator", config.name)
    stop = stop_on_sigterm()
    keystore = open_keystore(config.keystore, config.certs, config.name, config.insecure)
    table = keystore.load_table(config.table_id)
    if table is None:
        raise TableNotStoredError(
            f"{config.name} has no record of stored table {config.table_id!r} in {config.keystore}; store it "
            "first with 'secure-release-curator store-table --table-id ...'"
        )
    service = CuratorService(config.name, table.schema, log, config.max_rows)
    service.hold_key(config.release_id, "the release is not sealed yet")
    server = start_server(ListenSettings.of(config), service, log)
    link = ServerLink(config, log, Deadline(config.timeout, stop))
    run = StoredRun(config, log, keystore, table, service, link)
    try:
        try:
            record = _resumable(config, keystore)
            if record is None:
                record = prepare_stored(run, stored_spec(config, table))
            else:
                log("resumed", release_id=config.release_id, retention_until=record.retention_until)
            link.register(record.spec)
            link.upload(record.spec, record.ciphertext())
            link.wait_sealed()
            settle(config.release_id, keystore, sealed=True, log=log)
        except (SecureReleaseError, grpc.RpcError) as exc:
            if not isinstance(exc, KeystoreError | ConfigError):
                fail_stored(run, exc)
            raise
        record = keystore.set_retention(record, time.time() + config.key_retention)
        serve_stored_keys(run, record, stop)
        return 0
    finally:
        link.close()
        server.stop(grace=1.0)
        log("stopped")
