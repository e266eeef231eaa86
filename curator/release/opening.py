"""The open step: the Curator service started from the schema alone (it listens and answers
health while the table is read; a leader restores an agreement it fixed before a restart), then
the table read and fingerprinted (on a cluster: sharded on the curator's engine), the keystore
opened, a stored record of this release found (it is resumed) or the ledger checked, and the
link to the release server made. :func:`close_cluster` ends the cluster's part at the end."""

from __future__ import annotations

import re
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import numpy as np

from secure_release.curator.cluster.aligned import ShardRowSink
from secure_release.curator.cluster.matching import ClusterLeader
from secure_release.curator.cluster.sharded import ShardedTable
from secure_release.curator.config import CuratorConfig
from secure_release.curator.leader import LeaderState
from secure_release.curator.partitions import dataset_fingerprint
from secure_release.curator.postgres import is_database_url
from secure_release.curator.records.keystore import Keystore, ReleaseRecord
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.curator.records.witness import BudgetWitness
from secure_release.curator.release.agreement import leader_state
from secure_release.curator.release.aligning import (
    ClusterSettings,
    OwnData,
    TableSource,
    own_data,
    psi_points,
    shard_table,
    start_engine,
)
from secure_release.curator.release.budget import LedgerSettings
from secure_release.curator.release.failing import announce_parties, ledger_refusal
from secure_release.curator.release.upload import ServerLink
from secure_release.curator.service import CALLS_PER_PEER, SERVICE_NAME, CuratorService
from secure_release.curator.table import TableSpec, load_schema, read_table
from secure_release.infra import metrics
from secure_release.infra.config import ConfigError, write_port_file
from secure_release.infra.entry import stop_on_signals
from secure_release.infra.health import add_health_and_reflection
from secure_release.infra.logs import EventLog, peak_rss_mib
from secure_release.infra.tls import bind, make_grpc_server
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray
from secure_release.mechanism.errors import DesignMismatchError, SecureReleaseError
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode
from secure_release.mechanism.protocol.in_memory import CuratorTable
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

PROBE_S = 3.0


def stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM or SIGINT (installed only on the main thread, where Python
    allows it). SIGINT raises KeyboardInterrupt as usual too; the event is what still ends the
    run at its next wait should a library swallow that exception."""
    return stop_on_signals((signal.SIGTERM, signal.SIGINT), sigint_raises=True)


def own_schema(schema: Path, name: str) -> TableSpec:
    """The schema file, which must be curator ``name``'s (cheap: read before the table)."""
    spec = load_schema(schema)
    if spec.schema.name != name:
        raise ConfigError(f"schema {schema} is for curator {spec.schema.name!r}, not {name!r}")
    return spec


def open_keystore(keystore: Path, certs: Path | None, name: str, insecure: bool) -> Keystore:
    """The keystore, its ledger head signed with curator ``name``'s certificate key (unsigned
    only in insecure mode)."""
    return Keystore(keystore, None if insecure else HeadSigner.from_certs(certs, name))


class ListenSettings(NamedTuple):
    """What starting the Curator service's server reads of the config."""

    listen_host: str
    listen_port: int
    certs: Path | None
    name: str
    insecure: bool
    port_file: str | None  # the port is written there if given
    leader: bool  # logged

    @classmethod
    def of(cls, config: CuratorConfig) -> ListenSettings:
        """These fields of ``config``."""
        return cls(config.listen_host, config.listen_port, config.certs, config.name, config.insecure,
                   config.port_file, config.leader)  # fmt: skip


def start_server(settings: ListenSettings, service: CuratorService, log: EventLog) -> grpc.Server:
    """The Curator service with health and reflection, listening (port written if asked)."""
    server = make_grpc_server(
        insecure=settings.insecure, interceptors=metrics.interceptors(), calls_per_peer=CALLS_PER_PEER
    )
    pb_grpc.add_CuratorServicer_to_server(service, server)
    add_health_and_reflection(server, [SERVICE_NAME])
    port = bind(server, settings.listen_host, settings.listen_port, settings.certs, settings.name, settings.insecure)
    server.start()
    write_port_file(settings.port_file, port)
    log("listening", address=f"{settings.listen_host}:{port}", leader=settings.leader)
    return server


def probe_server(server: str, certs: Path | None, name: str, insecure: bool, log: EventLog) -> None:
    """Say within seconds if the release server at --server cannot be reached (a typo in the
    address shows at once, not at the end of --timeout); the run itself goes on and retries."""
    from secure_release.infra.tls import secure_channel

    try:
        channel = secure_channel(server, certs, name, insecure, role="curator", peer_role="server")
    except Exception as exc:  # a note only: the run reports the error itself
        log.warning("server_unreachable", server=server, error=type(exc).__name__)
        return
    try:
        grpc.channel_ready_future(channel).result(timeout=PROBE_S)
    except grpc.FutureTimeoutError:
        log.warning("server_unreachable", server=server,
                    note=f"cannot reach the release server at {server} (--server) after {PROBE_S:g} s; "
                         "check the address; retrying until --timeout")  # fmt: skip
    finally:
        channel.close()


class OpenedService(NamedTuple):
    """What :func:`open_service` builds before the table is read."""

    spec: TableSpec
    service: CuratorService
    state: LeaderState | None  # the leader's (None on a follower)
    restored_tags: TagArray | None = None  # PSI leader: own tags of a restored agreement


def open_service(config: CuratorConfig, log: EventLog) -> OpenedService:
    """The Curator service (and the leader's state) from the schema alone, so the curator can
    listen and answer health while it reads its table; keys stay held until the release seals.
    The curator's parties are declared to the server meanwhile (:func:`announce_parties`)."""
    spec = own_schema(config.schema, config.name)
    announce_parties(config, log)  # in the background: confirms another curator's early refusal
    service = CuratorService(config.name, spec.schema, log, config.max_rows)
    service.hold_key(config.release_id, "the release is not sealed yet")
    if not config.leader:
        return OpenedService(spec, service, None)
    state = leader_state(config, spec.schema.alphabet_size, ClusterLeader if config.engine == "dask" else LeaderState)
    if config.alignment is AlignmentMode.PSI:
        state.psi_dir = psi_mailbox_dir(config.keystore, config.release_id)
        kept = state.psi_mailbox  # what a killed run of this leader left there, taken again
        if kept.kept or kept.ignored:
            log("psi_mailbox_kept", release_id=config.release_id, slices=kept.kept, ignored=kept.ignored,
                lists=",".join(sorted({f"{o}@{h}" for o, h, _ in kept.stored_keys()})))  # fmt: skip
    restored_tags = restore_agreement(config.keystore, config.release_id, config.name, state)
    service.lead(state)
    return OpenedService(spec, service, state, restored_tags)


def psi_mailbox_dir(keystore: Path, release_id: str) -> Path:
    """Where a leader keeps the PSI ring's lists (:mod:`secure_release.curator.psi_mailbox`): one
    directory (0700) in its keystore directory, the same at every run of the release, so a
    leader killed during the ring and run again takes them again, with the scalar it kept
    (:func:`~secure_release.curator.release.psi_ring.ring_key`). Deleted by the keystore once the
    release record is saved sealed, or the release is dropped. A temporary directory an older
    version made for the release (``psi-<id>-XXXXXXXX``, of no use without its scalar) is removed."""
    parent = Path(keystore)
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    older = re.compile(rf"psi-{re.escape(release_id)}-[a-z0-9_]{{8}}")
    for stale in parent.glob(f"psi-{release_id}-*"):
        if older.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    return Keystore(parent).psi_mailbox_dir(release_id)


def restore_agreement(keystore: Path, release_id: str, name: str, state: LeaderState) -> TagArray | None:
    """A restarted leader (curator ``name``) takes up the agreement it fixed before (from the
    keystore; its own row order says its n) into ``state``; the own PSI tags persisted with it,
    if any."""
    stored = Keystore(keystore).load_agreement(release_id)
    if stored is None:
        return None
    restored = stored.agreement
    if name in stored.rows:  # persisted as row orders: the leader's own rows say n
        restored = replace(restored, own_rows=stored.rows[name])
    state.restore(restored, stored.digests, stored.rows)
    return stored.own_tags


class OpenedRun(NamedTuple):
    """What :func:`open_run` opens once the service listens."""

    own: OwnData
    keystore: Keystore
    link: ServerLink
    witness: BudgetWitness
    record: ReleaseRecord | None  # a stored record of this release: resume it
    refusal: SecureReleaseError | None  # the ledger refuses this release (found before agreeing)


def open_run(
    config: CuratorConfig, log: EventLog, stop: threading.Event, spec: TableSpec, state: LeaderState | None
) -> OpenedRun:
    """After the service started: the table read against ``spec`` and fingerprinted, the
    keystore, the stored record or the ledger's refusal, the link to the server (ended early by
    ``stop``) and the tags (keyed hash only: PSI tags come from the ring, in
    :func:`~secure_release.curator.release.aligning.align_ids`). On a cluster: :func:`open_cluster_run`."""
    if config.engine == "dask":
        return open_cluster_run(config, log, stop, spec, state)
    source = TableSource.of(config)
    table, fingerprint = read_and_fingerprint(source, log, spec)
    keystore = open_keystore(config.keystore, config.certs, config.name, config.insecure)
    record = resumable_record(ResumeSettings.of(config), keystore, fingerprint)
    link, witness = open_link(config, log, stop, keystore)
    refusal = ledger_refusal(LedgerSettings.of(config), keystore, witness, record, log)
    return OpenedRun(own_data(source, table, fingerprint), keystore, link, witness, record, refusal)


def open_cluster_run(
    config: CuratorConfig, log: EventLog, stop: threading.Event, spec: TableSpec, state: LeaderState | None
) -> OpenedRun:
    """:func:`open_run` on a cluster: the engine starts (worker processes, imports) while the
    data is fingerprinted, the stored record or the ledger checked and the server reached; then
    it reads, hashes and shards the table (:func:`~secure_release.curator.release.aligning.shard_table`).
    A resume needs no cluster (its sample is in the record): none is started."""
    keystore = open_keystore(config.keystore, config.certs, config.name, config.insecure)
    resuming = keystore.load_record(config.release_id) is not None
    cluster = ClusterSettings.of(config)
    with ThreadPoolExecutor(1, thread_name_prefix="engine") as pool:
        starting = None if resuming else pool.submit(start_engine, cluster, log, stop)
        try:
            fingerprint = dataset_fingerprint(config.data)
            record = resumable_record(ResumeSettings.of(config), keystore, fingerprint)
            link, witness = open_link(config, log, stop, keystore)
            refusal = ledger_refusal(LedgerSettings.of(config), keystore, witness, record, log)
        except BaseException:
            if starting is not None and starting.exception() is None:
                starting.result().close()
            raise
    engine = starting.result() if starting is not None else None
    if config.alignment is AlignmentMode.PSI:
        return OpenedRun(psi_points(config, log, spec, state, engine, fingerprint), keystore, link, witness, record,
                         refusal)  # fmt: skip
    sharded = shard_table(cluster, TableSource.of(config), log, spec, state, engine) if engine is not None else None
    sink = ShardRowSink(sharded) if sharded is not None and state is None else None
    own = OwnData(None, np.zeros(0, dtype=TAG_DTYPE), fingerprint, None, sharded, sink)
    return OpenedRun(own, keystore, link, witness, record, refusal)


def load_table(
    data: Path, query: str | None, log: EventLog, spec: TableSpec, check_repeats: bool = True
) -> CuratorTable:
    """Read the table at ``data`` (or ``query``'s rows of it) against ``spec``, the schema of
    this curator. ``check_repeats=False``: the caller finds repeated ids in its own tag sort
    (:func:`~secure_release.curator.release.aligning.hashed_tags`)."""
    table = read_table(data, spec, query=query, check_repeats=check_repeats)
    preprocessing = [d for d in (a.describe() for a in spec.schema.attributes) if d]
    extra: dict[str, Any] = {"preprocessing": preprocessing} if preprocessing else {}
    log("table_loaded", rows=table.num_rows, alphabet_size=spec.schema.alphabet_size, peak_rss_mib=peak_rss_mib(),
        **extra)
    return table


def read_and_fingerprint(source: TableSource, log: EventLog, spec: TableSpec) -> tuple[CuratorTable, str]:
    """The table read against ``spec`` (repeated ids are found later, in
    :func:`~secure_release.curator.release.aligning.hashed_tags`, when the ids are hashed) and
    the data's fingerprint (SHA-256, hashed beside the read)."""
    if is_database_url(source.data):  # a database's fingerprint is of the rows as read, in the read's snapshot
        table = load_table(source.data, source.query, log, spec, check_repeats=source.alignment_key is None)
        return table, str(getattr(table, "fingerprint", ""))  # set by the reader
    with ThreadPoolExecutor(1, thread_name_prefix="fingerprint") as pool:
        hashing = pool.submit(dataset_fingerprint, source.data)
        table = load_table(source.data, source.query, log, spec, check_repeats=source.alignment_key is None)
        fingerprint = hashing.result()
    return table, fingerprint


def open_link(
    config: CuratorConfig, log: EventLog, stop: threading.Event, keystore: Keystore
) -> tuple[ServerLink, BudgetWitness]:
    """The link to the release server (calls end at --timeout, or once ``stop`` is set) and the
    server's budget witness of this curator (checking ``keystore``'s signed ledger head)."""
    from secure_release.curator.waits import Deadline

    link = ServerLink(config, log, Deadline(config.timeout, stop))
    return link, BudgetWitness(link.stub, config.name, keystore.ledger.signer, link.deadline)


class ResumeSettings(NamedTuple):
    """What checking a stored record against this run reads of the config."""

    release_id: str
    epsilon: float
    curators: tuple[str, ...]
    sampling: SamplingMode
    design_digest: str = ""  # --design: the digest of the design (none: the whole joint)

    @classmethod
    def of(cls, config: CuratorConfig) -> ResumeSettings:
        """These fields of ``config``."""
        return cls(config.release_id, config.epsilon, config.curators, config.sampling, config.design_digest)


def resumable_record(settings: ResumeSettings, keystore: Keystore, fingerprint: str) -> ReleaseRecord | None:
    """The stored record of this release, checked against the table and the settings."""
    record = keystore.load_record(settings.release_id)
    if record is None:
        return None
    record.check_table(fingerprint)
    if (
        record.spec.plan.epsilon != settings.epsilon
        or record.spec.curators != settings.curators
        or record.sampling is not settings.sampling
    ):
        raise ConfigError(
            f"release {settings.release_id!r} was prepared with epsilon {record.spec.plan.epsilon}, curators "
            f"{list(record.spec.curators)} and --sampling {record.sampling.value}; a resume must use the same settings"
        )
    if record.spec.design_digest != settings.design_digest:
        raise DesignMismatchError(
            f"release {settings.release_id!r} was prepared with design {record.spec.design_digest or 'none'}, this "
            f"run gives {settings.design_digest or 'none'} (--design); a resume must use the same design file"
        )
    return record


def close_cluster(sharded: ShardedTable | None, state: LeaderState | None) -> None:
    """The cluster's part of a run is over: a leader's kept PSI mailbox left for the keystore to
    delete (at the sealed record, or a drop; a run that failed keeps it for a rerun); without
    ``sharded`` nothing more, else the leader's spool removed and the engine closed."""
    if state is not None:
        state.leave_psi_mailbox()
    if sharded is None:
        return
    if isinstance(state, ClusterLeader):
        state.cleanup()
    sharded.engine.close()
