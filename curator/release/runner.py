"""One curator's part of a release, as explicit steps with one explicit outcome.

start the Curator service from the schema (it listens while the table is read) -> load the table
and fingerprint it -> (a stored release record? resume it) -> check the ledger (a budget is set
and enough remains; nothing recorded) -> id tags (keyed hash; with ``--alignment psi`` the ECDH
ring through the leader, :mod:`secure_release.curator.release.psi_ring`, once agreeing starts) ->
**agree** (leader or follower; the sample is a seed or, with ``--sampling indices``, the leader's
packed index tuple; the leader persists the agreement, reserves, registers, then publishes it, so
the followers align while it prepares) -> **reserve** epsilon -> **prepare** (align, sample,
encrypt, persist pad and sample before any upload) -> **upload** what the server lacks and commit
-> **wait** until SEALED (ledger: commit) or ABORTED (ledger: refund) -> **serve keys** until the
key retention ends. :func:`run` calls these steps in this order; each takes the values it needs
and returns what it made (no shared context object).

Every failure before sealing ends the release for everybody: the curator aborts it at the server
with the reason (the others poll the status and stop), the leader also keeps telling followers
the failure for a while, and the reservation is refunded once the server confirms ABORTED.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
import numpy as np
import numpy.typing as npt

from secure_release.curator.cluster.aligned import AlignedPieces, ShardRowSink, leader_pieces
from secure_release.curator.cluster.engine import Engine
from secure_release.curator.cluster.matching import UNIT_BITS, ClusterLeader
from secure_release.curator.cluster.sample import sample_runs
from secure_release.curator.cluster.sharded import ShardedTable
from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import ReleaseAbortedError, ReleaseRefusedError, SpecRefusedError
from secure_release.curator.leader import LeaderState
from secure_release.curator.partitions import dataset_fingerprint
from secure_release.curator.records.keystore import Keystore, ReleaseRecord, SampleFile
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.curator.records.witness import BudgetWitness
from secure_release.curator.release.agreement import (
    TagSource,
    agree,
    cluster_workers,
    leader_state,
    own_alignment,
    report_failure_to_leader,
)
from secure_release.curator.release.upload import ServerLink
from secure_release.curator.service import CALLS_PER_PEER, SERVICE_NAME, CuratorService
from secure_release.curator.table import EncodedTable, TableSpec, load_schema, raise_repeats, read_table
from secure_release.infra import metrics
from secure_release.infra.config import ConfigError, write_port_file
from secure_release.infra.entry import stop_on_signals
from secure_release.infra.exitcodes import refusal_reason
from secure_release.infra.fileio import UnsafePathError, atomic_write, read_nofollow
from secure_release.infra.health import add_health_and_reflection
from secure_release.infra.logs import EventLog, peak_rss_mib
from secure_release.infra.memory import release_free_memory
from secure_release.infra.streams import AgreementError
from secure_release.infra.tls import bind, make_grpc_server
from secure_release.mechanism.alignment import sharding as sh
from secure_release.mechanism.alignment.keyed_hash import (
    TAG_DTYPE,
    DuplicateIdError,
    RowOrder,
    SortedTags,
    TagArray,
    has_repeated_tag,
    sort_tags,
)
from secure_release.mechanism.alignment.psi import PsiKey
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.primitives.pads import new_release_pad
from secure_release.mechanism.privacy.ledger import PrivacyLedger
from secure_release.mechanism.protocol.architectures import (
    AlignmentMode,
    SamplingMode,
    VariantAgreement,
    agreement_positions,
    sample_fingerprint,
)
from secure_release.mechanism.protocol.in_memory import CuratorTable, curator_tags
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.schema import SymbolArray
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from secure_release.curator.waits import Deadline

POLL_S = 0.5
LINGER_S = 10.0  # how long a failed leader keeps answering followers with the failure


@dataclass(frozen=True)
class OwnData:
    """This curator's table, its fingerprint and the keyed tags of its ids."""

    table: CuratorTable | None  # None on a cluster: the rows are ``sharded``
    tags: TagArray
    fingerprint: str = ""
    sorted_tags: SortedTags | None = None  # the tags sorted for align (and the repeat check)
    sharded: ShardedTable | None = None  # --engine dask: the rows as tag shards on the cluster
    rows_sink: ShardRowSink | None = None  # a follower on a cluster: its row order, gathered as it arrives
    psi_key: PsiKey | None = None  # PSI on a cluster: the key ``sharded``'s points are blinded with
    psi_kept: bool = False  # ... kept from an earlier run of this follower (the ring resumes)

    @property
    def alphabet_size(self) -> int:
        """Number of symbols of this curator's joint attribute code."""
        if self.table is None:
            assert self.sharded is not None
            return self.sharded.alphabet_size
        return self.table.schema.alphabet_size

    def tag_source(self) -> TagSource:
        """The tags as :func:`agree` sends them: the array, or the shards one at a time."""
        return self.sharded.tag_pieces if self.sharded is not None else self.tags


def own_schema(config: CuratorConfig) -> TableSpec:
    """The schema file, which must be this curator's (cheap: read before the table)."""
    spec = load_schema(config.schema)
    if spec.schema.name != config.name:
        raise ConfigError(f"schema {config.schema} is for curator {spec.schema.name!r}, not {config.name!r}")
    return spec


def load_table(
    config: CuratorConfig, log: EventLog, spec: TableSpec | None = None, check_repeats: bool = True
) -> CuratorTable:
    """Read the table against its schema (which must be this curator's). ``check_repeats=False``:
    the caller finds repeated ids in its own tag sort (:func:`hashed_tags`)."""
    spec = spec or own_schema(config)
    table = read_table(config.data, spec, query=config.query, check_repeats=check_repeats)
    preprocessing = [d for d in (a.describe() for a in spec.schema.attributes) if d]
    extra: dict[str, Any] = {"preprocessing": preprocessing} if preprocessing else {}
    log("table_loaded", rows=table.num_rows, alphabet_size=spec.schema.alphabet_size, peak_rss_mib=peak_rss_mib(),
        **extra)
    return table


def open_keystore(config: CuratorConfig) -> Keystore:
    """The keystore, its ledger head signed with this curator's certificate key (unsigned only
    in insecure mode)."""
    return Keystore(config.keystore, None if config.insecure else HeadSigner.from_certs(config.certs, config.name))


def check_ledger(config: CuratorConfig, keystore: Keystore, witness: BudgetWitness | None = None) -> PrivacyLedger:
    """The verified ledger; raises now (nothing recorded) if this release could not reserve its
    epsilon: the ledger is behind the server's witness, no budget is set for the data set, too
    little is left, or the release id was used differently."""
    ledger = keystore.ledger.read()
    ledger.check_reserve(config.dataset, config.release_id, config.epsilon, None)
    if witness is not None:
        witness.check(ledger, config.dataset)
    return ledger


def reserve(
    config: CuratorConfig, keystore: Keystore, fingerprint: str, seed_fingerprint: str, log: EventLog,
    witness: BudgetWitness | None = None,
) -> None:
    """Reserve this release's epsilon on the data set (idempotent for the same release, data set
    and seed), recording the table's fingerprint, unless the ledger is behind the server's witness;
    then move the witness up to it."""
    if witness is not None:
        witness.check(keystore.ledger.read(), config.dataset)
    _, entry = keystore.ledger.update(
        lambda led: led.reserve(
            config.dataset, config.dataset, config.release_id, config.epsilon, seed_fingerprint, time.time(),
            table=fingerprint,
        )
    )  # fmt: skip
    ledger = keystore.ledger.read()
    if witness is not None:
        witness.check(ledger, config.dataset, record=True)
    log(
        "ledger_reserved",
        release_id=config.release_id,
        epsilon=config.epsilon,
        dataset=config.dataset,
        new=entry is not None,
        remaining=ledger.remaining(config.dataset),
    )


def settle(config: CuratorConfig, keystore: Keystore, sealed: bool, log: EventLog) -> None:
    """Commit (sealed) or refund (aborted before sealing) this release's reservation, if any."""
    ledger = keystore.ledger.read()
    if config.release_id not in ledger.releases():
        return
    _, entry = keystore.ledger.update(
        lambda led: (led.commit if sealed else led.refund)(config.release_id, time.time())
    )
    log("ledger_committed" if sealed else "ledger_refunded", release_id=config.release_id, new=entry is not None)


def start_server(config: CuratorConfig, service: CuratorService, log: EventLog) -> grpc.Server:
    """The Curator service with health and reflection, listening (port written if asked)."""
    server = make_grpc_server(
        insecure=config.insecure, interceptors=metrics.interceptors(), calls_per_peer=CALLS_PER_PEER
    )
    pb_grpc.add_CuratorServicer_to_server(service, server)
    add_health_and_reflection(server, [SERVICE_NAME])
    port = bind(server, config.listen_host, config.listen_port, config.certs, config.name, config.insecure)
    server.start()
    write_port_file(config.port_file, port)
    log("listening", address=f"{config.listen_host}:{port}", leader=config.leader)
    return server


def prepare(
    config: CuratorConfig,
    own: OwnData,
    agreement: VariantAgreement,
    keystore: Keystore,
    log: EventLog,
    leader_rows: RowOrder | None = None,
    aligned: SymbolArray | None = None,
    pieces: AlignedPieces | None = None,
) -> ReleaseRecord:
    """Align to the common tags, take the agreed m rows (from the seed, or the leader's index
    tuple), encrypt them under a fresh pad and persist pad, sample and table fingerprint (0600,
    fsync) before anything is uploaded. ``aligned``: the symbols of the common rows in canonical
    order, as a cluster gathered them (then nothing is aligned here); ``pieces``: the same left
    on the cluster, sampled there into the record's sample file (seed sampling)."""
    spec = agreement.base.spec
    positions: npt.NDArray[np.int64]
    sample_file: SampleFile | None = None
    if pieces is not None:
        log("aligned", matched=pieces.num_rows, rows=own.sharded.num_rows if own.sharded else None,
            runs=len(pieces.sizes), peak_rss_mib=peak_rss_mib())  # fmt: skip
        if agreement.sampling is not SamplingMode.SEED:  # config refuses --sampling indices on a cluster
            raise AgreementError("a curator on a cluster samples by seed only (--sampling seed)")
        runs = sample_runs(pieces, agreement.base.seed, spec.release_id, spec.m, log)
        sample_file = keystore.write_sample(spec.release_id, runs, own.alphabet_size)
        pieces.release()
    if sample_file is not None:
        sample = np.zeros(0, dtype=np.uint32)
    elif aligned is not None:
        log("aligned", matched=int(aligned.size), rows=own.sharded.num_rows if own.sharded else None,
            peak_rss_mib=peak_rss_mib())  # fmt: skip
        positions = agreement_positions(agreement)
        sample = aligned[positions].astype(np.uint32)
        del positions  # 8 bytes a sampled row, not needed for the pad and the record
        release_free_memory()
    else:
        assert own.table is not None
        if agreement.own_rows is None and leader_rows is None:  # match the common tags ourselves
            alignment = own_alignment(agreement, own.tags, own.sorted_tags)
        else:  # the row order the leader computed (a follower checks it)
            alignment = own_alignment(agreement, own.tags, leader_rows=leader_rows)
        release_free_memory()
        log(
            "aligned",
            matched=alignment.num_matched,
            unmatched=alignment.num_unmatched,
            rows=alignment.num_rows,
            peak_rss_mib=peak_rss_mib(),
        )
        positions = agreement_positions(agreement)
        sample = own.table.symbols()[alignment.row_order[positions]]  # gathers m rows, not n
    pad = new_release_pad(spec.cipher, own.alphabet_size, spec.m, config.test_pad_key)
    fingerprint = sample_fingerprint(agreement)
    record = ReleaseRecord(spec, pad, sample, own.fingerprint, config.dataset, fingerprint, sampling=agreement.sampling,
                           sample_file=sample_file)  # fmt: skip
    keystore.save_record(record)
    log(
        "prepared",
        release_id=spec.release_id,
        m=spec.m,
        sampling=agreement.sampling.value,
        sampling_randomness=agreement.sampling.randomness,
        sample_fingerprint=fingerprint,
        peak_rss_mib=peak_rss_mib(),
    )
    return record


def refuse_visibly(link: ServerLink, spec: object, reason: str) -> None:
    """A refusal of the agreed ``spec`` through ``link``: join its candidate at the server
    (registering uploads and reserves nothing; the server then shows researchers the candidate's
    status even before it is bound), then abort it with ``reason``. A follower's refusal reaches
    the leader and the researcher this way (they poll the status and stop); a leader's reaches
    the researcher, who would otherwise wait for a release the server never heard of (the
    followers hear it from the leader). Only the caller's own candidate is aborted: the server
    lets a curator abort only a release whose spec names it."""
    assert isinstance(spec, ReleaseSpec)
    with contextlib.suppress(SecureReleaseError, grpc.RpcError):
        link.register(spec)
    link.abort(reason)


def setup_release(
    config: CuratorConfig,
    own: OwnData,
    state: LeaderState | None,
    keystore: Keystore,
    link: ServerLink,
    witness: BudgetWitness,
    refusal: SecureReleaseError | None,
    restored_tags: TagArray | None,
    log: EventLog,
) -> ReleaseRecord:
    """Agree, reserve and prepare a release this curator has no record of yet: the record of its
    prepared part. ``state``: the leader's (None on a follower); ``refusal``: the ledger's, found
    before agreeing (a leader fails the agreement with it, so every follower is told the reason);
    ``restored_tags``: a PSI leader's own tags, persisted with a restored agreement."""
    if refusal is not None and state is not None:
        raise refusal  # the leader fails the agreement: every follower is told the reason
    if config.alignment is AlignmentMode.PSI and own.sharded is not None:
        own = cluster_psi(config, own, state, link.deadline, log)
    elif config.alignment is AlignmentMode.PSI:
        own = replace(own, tags=psi_tags(config, own.table, state, restored_tags, link.deadline, log))
    agreement = agree_on_release(config, own, state, link, log)
    if state is not None and not isinstance(state, ClusterLeader):  # a cluster leader never resumes one
        persist_agreement(config, keystore, agreement, own.tags, state)
    reserve_or_refuse(config, keystore, own.fingerprint, agreement, link, witness, log, state)
    if state is not None:  # followers may align while the leader prepares its own part
        publish_agreement(link, state, agreement)
    return prepare_own_part(config, own, agreement, state, keystore, log)


def psi_tags(
    config: CuratorConfig,
    table: CuratorTable | None,
    state: LeaderState | None,
    restored_tags: TagArray | None,
    deadline: Deadline,
    log: EventLog,
) -> TagArray:
    """This curator's PSI tags (of ``table``'s ids): from the ECDH ring through the leader, or (a
    leader resuming a fixed agreement) ``restored_tags``, the tags it persisted with it (its
    scalar was never kept)."""
    from secure_release.curator.release.psi_ring import run_ring

    if restored_tags is not None:
        return restored_tags
    if state is not None and state.agreement is not None:
        from secure_release.curator.records.keystore import KeystoreError

        raise KeystoreError(f"the stored agreement of {config.release_id!r} lacks the leader's own PSI tags")
    assert table is not None
    return run_ring(config, table.ids, state, log, deadline)


def cluster_psi(config: CuratorConfig, own: OwnData, state: LeaderState | None, deadline: Deadline,
                log: EventLog) -> OwnData:  # fmt: skip
    """The PSI ring on this curator's cluster: ``own``'s point shards become its PSI tag shards
    (:func:`~secure_release.curator.release.psi_ring.run_cluster_ring`), which the agreement then
    uses as a keyed-hash curator's (a leader spools its follower's tags against them)."""
    from secure_release.curator.release.psi_ring import run_cluster_ring

    assert own.sharded is not None and own.psi_key is not None
    workers = cluster_workers(own.sharded.engine)
    tags = run_cluster_ring(config, own.sharded, own.psi_key, own.psi_kept, state, log, deadline, workers)
    if isinstance(state, ClusterLeader):
        state.attach(tags, config.keystore)
    return replace(own, sharded=tags, rows_sink=None if state is not None else ShardRowSink(tags), psi_key=None)


def agree_on_release(
    config: CuratorConfig, own: OwnData, state: LeaderState | None, link: ServerLink, log: EventLog
) -> VariantAgreement:
    """The agreement on ``own``'s tags, as the leader (``state`` given: its matching reuses its
    own sort) or a follower (which refuses an agreed spec it cannot accept visibly, through
    ``link``, before raising)."""
    if state is not None:
        state.own_sorted = own.sorted_tags
    try:
        return agree(config, own.tag_source(), own.alphabet_size, state, log, link.deadline, own.rows_sink)
    except SpecRefusedError as exc:
        if state is None:
            refuse_visibly(link, exc.spec, f"{config.name} refuses the agreed spec: {exc}")  # a mismatch: exit 1
        raise


def persist_agreement(
    config: CuratorConfig, keystore: Keystore, agreement: VariantAgreement, own_tags: TagArray, state: LeaderState
) -> None:
    """The leader keeps ``agreement`` in the keystore with the followers' tag digests and row
    orders (and, with PSI, its ``own_tags``), so a restarted leader resumes it; then it drops the
    followers' tags."""
    psi_own = own_tags if config.alignment is AlignmentMode.PSI else None
    keystore.save_agreement(agreement, state.tag_digests(), psi_own, state.rows)
    state.forget_tags()
    release_free_memory()


def reserve_or_refuse(
    config: CuratorConfig,
    keystore: Keystore,
    fingerprint: str,
    agreement: VariantAgreement,
    link: ServerLink,
    witness: BudgetWitness,
    log: EventLog,
    state: LeaderState | None = None,
) -> None:
    """:func:`reserve` the agreed release's epsilon for the table of ``fingerprint``; a curator
    that cannot aborts the release visibly through ``link`` before raising. The leader (``state``
    given) has not registered the release yet (it registers once reserved), so it tells its
    followers first, then registers only to abort: the researcher sees the refusal (a reused
    seed, a budget spent meanwhile) at once, not at the end of its --timeout."""
    try:
        reserve(config, keystore, fingerprint, sample_fingerprint(agreement), log, witness)
    except SecureReleaseError as exc:
        log.warning("ledger_refuses", release_id=config.release_id, reason=f"{type(exc).__name__}: {exc}")
        reason = refusal_reason(exc, f"{config.name} cannot reserve its budget")
        if state is not None:
            state.fail(reason)  # the followers stop now, whatever the server takes to answer
        refuse_visibly(link, agreement.base.spec, reason)
        raise


def publish_agreement(link: ServerLink, state: LeaderState, agreement: VariantAgreement) -> None:
    """The leader registers the agreed release at the server, then hands the agreement to its
    followers (they align while it prepares its own part)."""
    link.register(agreement.base.spec)
    state.publish()


def prepare_own_part(
    config: CuratorConfig,
    own: OwnData,
    agreement: VariantAgreement,
    state: LeaderState | None,
    keystore: Keystore,
    log: EventLog,
) -> ReleaseRecord:
    """:func:`prepare` this curator's part of ``agreement``: on a cluster from the symbols its
    engine gathers (:func:`cluster_aligned`), else from ``own``'s table, aligned here (a leader
    reuses the row order it matched); the record persisted."""
    if own.sharded is not None:
        return prepare(config, own, agreement, keystore, log, pieces=cluster_pieces(own, agreement, state))
    leader_rows = state.rows_of(config.name) if state is not None else None
    return prepare(config, own, agreement, keystore, log, leader_rows)


def cluster_pieces(own: OwnData, agreement: VariantAgreement, state: LeaderState | None) -> AlignedPieces:
    """The aligned column as runs left on the cluster: the leader's own matched symbols, shard
    by shard, or the runs a follower's workers gathered as its row order arrived."""
    assert own.sharded is not None
    if isinstance(state, ClusterLeader):
        assert state.engine is not None
        dtype = sh.symbol_dtype(own.sharded.alphabet_size)
        pieces = leader_pieces(state.engine, state.matches, 1 << UNIT_BITS, dtype, state.own_counts)
        state.engine.release(state.matches)  # the runs hold what the release needs of them
        state.matches = []
        return pieces
    sink = own.rows_sink
    if sink is None or sink.pieces is None or agreement.count is None:
        raise AgreementError("the leader sent the common tags, not this curator's row order; a curator on a "
                             "cluster needs its rows (upgrade the leader)")  # fmt: skip
    return sink.pieces


def cluster_aligned(
    sharded: ShardedTable, agreement: VariantAgreement, state: LeaderState | None, log: EventLog
) -> SymbolArray:
    """The symbols of the common rows in canonical order, gathered on the cluster: the leader's
    own (it matched them there), or a follower's in the row order the leader sent."""
    if isinstance(state, ClusterLeader):
        return state.own_aligned()
    if agreement.own_rows is None:
        raise AgreementError("the leader sent the common tags, not this curator's row order; a curator on a "
                             "cluster needs its rows (upgrade the leader)")  # fmt: skip
    return sharded.aligned_symbols(agreement.own_rows, log)


def resume(config: CuratorConfig, state: LeaderState | None, record: ReleaseRecord, log: EventLog) -> ReleaseRecord:
    """A release this curator prepared before it stopped: ``record`` as stored (a leader hands its
    restored agreement to the followers again)."""
    log("resumed", release_id=config.release_id, retention_until=record.retention_until)
    if state is not None:
        state.publish()
    return record


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


def await_seal(config: CuratorConfig, keystore: Keystore, link: ServerLink, log: EventLog) -> pb.ReleaseStatus:
    """Wait until the release is sealed, then commit the ledger's reservation; the final status."""
    status = link.wait_sealed()
    settle(config, keystore, sealed=True, log=log)
    return status


def abort_and_settle(
    config: CuratorConfig, keystore: Keystore, link: ServerLink, log: EventLog, exc: Exception
) -> None:
    """If this curator reserved budget (or the release was aborted), abort the release at the
    server with the reason, then refund once the server confirms ABORTED or never knew the
    release (the record is dropped, so a restart cannot resume it); a release that sealed after
    all is left to commit, and an unknown outcome keeps the reservation."""
    reserved = config.release_id in keystore.ledger.read().releases()
    if not (reserved or isinstance(exc, ReleaseAbortedError)):
        return
    passed_on = isinstance(exc, ReleaseAbortedError | ReleaseRefusedError)  # another party's reason
    status, unknown = link.abort(str(exc) if passed_on else refusal_reason(exc, config.name))
    if status is not None and status.state in (pb.RELEASE_STATE_SEALED, pb.RELEASE_STATE_PERTURBED):
        log.warning("sealed_after_all", release_id=config.release_id)
    elif (status is not None and status.state == pb.RELEASE_STATE_ABORTED) or unknown:
        keystore.drop_record(config.release_id)
        settle(config, keystore, sealed=False, log=log)
    else:
        log.warning(
            "outcome_unknown",
            release_id=config.release_id,
            hint="the reservation stays until a rerun or 'release abort' settles it",
        )


def fail_release(
    config: CuratorConfig,
    state: LeaderState | None,
    keystore: Keystore,
    link: ServerLink,
    log: EventLog,
    exc: Exception,
) -> None:
    """Tell every party the release failed with ``exc`` (abort at the server; a leader that never
    published the agreement also keeps telling followers) and refund the reservation once the
    server confirms ABORTED, or the server never knew the release (the record is then dropped, so
    a restart cannot resume it)."""
    reason = refusal_reason(exc, config.name)
    if state is not None:
        state.fail(reason)
    abort_and_settle(config, keystore, link, log, exc)
    if state is not None and not state.published:
        state.wait_all_told(min(LINGER_S, config.timeout))


def announce_release(
    config: CuratorConfig, keystore: Keystore, fingerprint: str, record: ReleaseRecord, log: EventLog
) -> None:
    """Log the sealed release: its sizes, the epsilon spent, the budget left on its data set (the
    ledger's key: ``config.dataset``, not the table's ``fingerprint``) and who gets the result."""
    spec = record.spec
    left = keystore.ledger.read().remaining(config.dataset)
    left_text = f"{left:g}" if left is not None else "?"
    to = ", ".join(config.grants) or "nobody"
    log("released", release_id=config.release_id, n=spec.n, m=spec.m, epsilon=spec.plan.epsilon, budget_left=left,
        dataset=config.dataset,
        note=f"released {config.release_id}: n={spec.n}, m={spec.m}; epsilon {spec.plan.epsilon:g} spent, "
             f"{left_text} left on data set {config.dataset}; the result goes to {to}")  # fmt: skip


PROBE_S = 3.0


def probe_server(config: CuratorConfig, log: EventLog) -> None:
    """Say within seconds if the release server at --server cannot be reached (a typo in the
    address shows at once, not at the end of --timeout); the run itself goes on and retries."""
    from secure_release.infra.tls import secure_channel

    try:
        channel = secure_channel(config.server, config.certs, config.name, config.insecure, role="curator",
                                 peer_role="server")  # fmt: skip
    except Exception as exc:  # a note only: the run reports the error itself
        log.warning("server_unreachable", server=config.server, error=type(exc).__name__)
        return
    try:
        grpc.channel_ready_future(channel).result(timeout=PROBE_S)
    except grpc.FutureTimeoutError:
        log.warning("server_unreachable", server=config.server,
                    note=f"cannot reach the release server at {config.server} (--server) after {PROBE_S:g} s; "
                         "check the address; retrying until --timeout")  # fmt: skip
    finally:
        channel.close()


def _acks_file(config: CuratorConfig) -> Path | None:
    """Where this release's key acknowledgements are kept (None without a keystore)."""
    keystore = getattr(config, "keystore", None)
    if keystore is None or not Path(keystore).is_dir():
        return None
    return Path(keystore) / f"acknowledged-{config.release_id}.json"


def _load_acks(acks: Path | None, log: EventLog) -> set[str]:
    """The researchers a restarted curator already heard from (never through a link; a file that
    is not a JSON list of names counts as none, logged)."""
    if acks is None or not acks.exists():
        return set()
    try:
        names = json.loads(read_nofollow(acks).decode("utf-8"))
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return set(names)
    except UnsafePathError:
        raise  # a planted link is refused, never read
    except (ValueError, UnicodeDecodeError):
        pass
    log.warning("acknowledgements_unreadable", path=str(acks), note="ignored: waiting for every researcher again")
    return set()


def _save_acks(acks: Path | None, now: set[str], saved: set[str]) -> set[str]:
    """Persist the acknowledgements (0600) when they changed; what is saved now."""
    if acks is not None and now != saved:
        atomic_write(acks, json.dumps(sorted(now)).encode("utf-8"))
    return now


def fail_before_agreement(
    config: CuratorConfig, state: LeaderState | None, log: EventLog, exc: SecureReleaseError
) -> None:
    """A curator that fails before the agreement stops every party at once: a follower tells
    the leader; the leader fails its agreement and keeps answering until every follower was told
    (a few seconds at most), so none waits for its --timeout."""
    reason = refusal_reason(exc, config.name)
    if state is None:
        report_failure_to_leader(config, reason, log)
        return
    state.fail(reason)
    state.wait_all_told(min(LINGER_S, config.timeout))


def serve_until_acknowledged(
    config: CuratorConfig, service: CuratorService, log: EventLog, record: ReleaseRecord, stop: threading.Event
) -> None:
    """Serve ``record``'s key through ``service`` to the granted researchers until every one
    acknowledged it (it stored its result durably; a fetch alone is not enough), the key
    retention ends, or ``stop`` (SIGTERM); with --serve-until-stopped only the last two end it.
    Shared with server-side sampling. The acknowledgements are kept in the keystore
    (``acknowledged-<release>.json``), so a curator restarted after a researcher acknowledged
    does not wait for it again."""
    service.add_release(config.release_id, record.pad, config.grants)
    acks = _acks_file(config)
    saved = _load_acks(acks, log) & set(config.grants)
    service.keys[config.release_id].acknowledged.update(saved)
    until = record.retention_until or time.time()
    waiting = ", ".join(service.unacknowledged(config.release_id)) or "nobody"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(until))
    finish = "until each acknowledges it or" if config.exit_after_keys else "until"
    log(
        "serving_keys",
        release_id=config.release_id,
        grants=sorted(config.grants),
        retention_s=round(until - time.time(), 1),
        note=f"serving the key to {waiting} {finish} {stamp}, Ctrl-C to stop",
    )
    while not stop.is_set() and time.time() < until:
        saved = _save_acks(acks, set(service.keys[config.release_id].acknowledged), saved)
        if config.exit_after_keys and service.wait_keys_acknowledged(config.release_id, timeout=POLL_S):
            _save_acks(acks, set(service.keys[config.release_id].acknowledged), saved)
            log("keys_acknowledged", release_id=config.release_id, note="every granted researcher stored its result")
            return
        if not config.exit_after_keys:
            stop.wait(min(POLL_S, max(0.0, until - time.time())))
    if not stop.is_set():
        log("key_retention_ended", release_id=config.release_id)


def stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM or SIGINT (installed only on the main thread, where Python
    allows it). SIGINT raises KeyboardInterrupt as usual too; the event is what still ends the
    run at its next wait should a library swallow that exception."""
    return stop_on_signals((signal.SIGTERM, signal.SIGINT), sigint_raises=True)


def resumable_record(config: CuratorConfig, keystore: Keystore, fingerprint: str) -> ReleaseRecord | None:
    """The stored record of this release, checked against the table and the settings."""
    record = keystore.load_record(config.release_id)
    if record is None:
        return None
    record.check_table(fingerprint)
    if (
        record.spec.plan.epsilon != config.epsilon
        or record.spec.curators != config.curators
        or record.sampling is not config.sampling
    ):
        raise ConfigError(
            f"release {config.release_id!r} was prepared with epsilon {record.spec.plan.epsilon}, curators "
            f"{list(record.spec.curators)} and --sampling {record.sampling.value}; a resume must use the same settings"
        )
    return record


class OpenedService(NamedTuple):
    """What :func:`open_service` builds before the table is read."""

    spec: TableSpec
    service: CuratorService
    state: LeaderState | None  # the leader's (None on a follower)
    restored_tags: TagArray | None = None  # PSI leader: own tags of a restored agreement


def open_service(config: CuratorConfig, log: EventLog) -> OpenedService:
    """The Curator service (and the leader's state) from the schema alone, so the curator can
    listen and answer health while it reads its table; keys stay held until the release seals."""
    spec = own_schema(config)
    service = CuratorService(config.name, spec.schema, log, config.max_rows)
    service.hold_key(config.release_id, "the release is not sealed yet")
    if not config.leader:
        return OpenedService(spec, service, None)
    state = leader_state(config, spec.schema.alphabet_size, ClusterLeader if config.engine == "dask" else LeaderState)
    if config.engine == "dask" and config.alignment is AlignmentMode.PSI:
        state.psi_dir = psi_mailbox_dir(config)
    restored_tags = restore_agreement(config, state)
    service.lead(state)
    return OpenedService(spec, service, state, restored_tags)


def psi_mailbox_dir(config: CuratorConfig) -> Path:
    """Where a leader on a cluster keeps the PSI ring's lists: a fresh directory (0700) in its
    keystore directory, removed with the spool at the end of the run. One a killed run of this
    leader left for the same release is removed first (without its scalar, kept by nobody, its
    lists are of no use)."""
    parent = Path(config.keystore)
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for stale in parent.glob(f"psi-{config.release_id}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"psi-{config.release_id}-", dir=parent))


def restore_agreement(config: CuratorConfig, state: LeaderState) -> TagArray | None:
    """A restarted leader takes up the agreement it fixed before (from the keystore; its own row
    order says its n) into ``state``; the own PSI tags persisted with it, if any."""
    stored = Keystore(config.keystore).load_agreement(config.release_id)
    if stored is None:
        return None
    restored = stored.agreement
    if config.name in stored.rows:  # persisted as row orders: the leader's own rows say n
        restored = replace(restored, own_rows=stored.rows[config.name])
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
    :func:`setup_release`). On a cluster: :func:`open_cluster_run`."""
    if config.engine == "dask":
        return open_cluster_run(config, log, stop, spec, state)
    table, fingerprint = read_and_fingerprint(config, log, spec)
    keystore = open_keystore(config)
    record = resumable_record(config, keystore, fingerprint)
    link, witness = open_link(config, log, stop, keystore)
    refusal = ledger_refusal(config, keystore, witness, record, log)
    return OpenedRun(own_data(config, table, fingerprint), keystore, link, witness, record, refusal)


def open_cluster_run(
    config: CuratorConfig, log: EventLog, stop: threading.Event, spec: TableSpec, state: LeaderState | None
) -> OpenedRun:
    """:func:`open_run` on a cluster: the engine starts (worker processes, imports) while the
    data is fingerprinted, the stored record or the ledger checked and the server reached; then
    it reads, hashes and shards the table (:func:`shard_table`). A resume needs no cluster (its
    sample is in the record): none is started."""
    keystore = open_keystore(config)
    resuming = keystore.load_record(config.release_id) is not None
    with ThreadPoolExecutor(1, thread_name_prefix="engine") as pool:
        starting = None if resuming else pool.submit(start_engine, config, log, stop)
        try:
            fingerprint = dataset_fingerprint(config.data)
            record = resumable_record(config, keystore, fingerprint)
            link, witness = open_link(config, log, stop, keystore)
            refusal = ledger_refusal(config, keystore, witness, record, log)
        except BaseException:
            if starting is not None and starting.exception() is None:
                starting.result().close()
            raise
    engine = starting.result() if starting is not None else None
    if config.alignment is AlignmentMode.PSI:
        return OpenedRun(psi_points(config, log, spec, state, engine, fingerprint), keystore, link, witness, record,
                         refusal)  # fmt: skip
    sharded = shard_table(config, log, spec, state, engine) if engine is not None else None
    sink = ShardRowSink(sharded) if sharded is not None and state is None else None
    own = OwnData(None, np.zeros(0, dtype=TAG_DTYPE), fingerprint, None, sharded, sink)
    return OpenedRun(own, keystore, link, witness, record, refusal)


def psi_points(
    config: CuratorConfig, log: EventLog, spec: TableSpec, state: LeaderState | None, engine: Engine | None,
    fingerprint: str,
) -> OwnData:  # fmt: skip
    """PSI on a cluster: the table read, checked and blinded into point shards under this
    release's PSI key (:func:`~secure_release.curator.cluster.ring.load_points`; a follower's
    kept key if it ran before); nothing on a resume (no ``engine``)."""
    from secure_release.curator.cluster.ring import load_points
    from secure_release.curator.release.psi_ring import ring_key

    if engine is None:
        return OwnData(None, np.zeros(0, dtype=TAG_DTYPE), fingerprint)
    try:
        key, kept = ring_key(config, state is not None)
        points = load_points(engine, str(config.data), spec, key, len(config.curators), log, config.shard_bits)
    except BaseException:
        engine.close()
        raise
    return OwnData(None, np.zeros(0, dtype=TAG_DTYPE), fingerprint, None, points, psi_key=key, psi_kept=kept)


def read_and_fingerprint(config: CuratorConfig, log: EventLog, spec: TableSpec) -> tuple[CuratorTable, str]:
    """The table read against ``spec`` (repeated ids are found later, in :func:`hashed_tags`,
    when the ids are hashed) and the data's fingerprint (SHA-256, hashed beside the read)."""
    with ThreadPoolExecutor(1, thread_name_prefix="fingerprint") as pool:
        hashing = pool.submit(dataset_fingerprint, config.data)
        table = load_table(config, log, spec, check_repeats=config.alignment_key is None)
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


def ledger_refusal(
    config: CuratorConfig, keystore: Keystore, witness: BudgetWitness, record: ReleaseRecord | None, log: EventLog
) -> SecureReleaseError | None:
    """Why the ledger refuses a new release (logged, not raised: the refusal is made visible
    during the agreement, so the others are told), else None; the witness is asked right before
    reserving. A resume (``record`` given) needs an intact ledger: the witness checks it now."""
    if record is not None:
        witness.check(keystore.ledger.read(), config.dataset)
        return None
    try:
        check_ledger(config, keystore)
    except SecureReleaseError as exc:
        log.warning("ledger_refuses", release_id=config.release_id, reason=f"{type(exc).__name__}: {exc}")
        return exc
    return None


def own_data(config: CuratorConfig, table: CuratorTable, fingerprint: str) -> OwnData:
    """``table`` with the keyed tags of its ids (:func:`hashed_tags`); with PSI no tags yet (the
    ring computes them once the release is set up; a resume needs none)."""
    if config.alignment_key is None:
        return OwnData(table, np.zeros(0, dtype=TAG_DTYPE), fingerprint)
    table, sorted_tags = hashed_tags(config, table)
    return OwnData(table, sorted_tags.tags, fingerprint, sorted_tags)


def start_engine(config: CuratorConfig, log: EventLog, stop: threading.Event | None = None) -> Engine:
    """The engine ``--engine`` names, its workers warmed up (the stage modules imported); ``stop``
    (SIGTERM) ends any stage it waits for within a second."""
    from secure_release.curator.cluster.engine import open_engine

    return open_engine(config.engine, scheduler=config.scheduler, scheduler_file=config.scheduler_file,
                       workers=config.workers, worker_memory=config.worker_memory, log=log,
                       spill_dir=spill_dir(config), stop=stop)  # fmt: skip


def shard_table(
    config: CuratorConfig, log: EventLog, spec: TableSpec, state: LeaderState | None, engine: Engine | None = None,
    stop: threading.Event | None = None,
) -> ShardedTable:  # fmt: skip
    """The table read, hashed and sharded by the curator's engine (started here unless given;
    closed again if that fails); a cluster leader spools its followers' tags in the keystore
    directory."""
    from secure_release.curator.cluster.sharded import load_sharded

    assert config.alignment_key is not None
    engine = engine if engine is not None else start_engine(config, log, stop)
    try:
        sharded = load_sharded(engine, str(config.data), spec, config.alignment_key, log, config.shard_bits)
    except BaseException:
        engine.close()
        raise
    if isinstance(state, ClusterLeader):
        state.attach(sharded, config.keystore)
    return sharded


def spill_dir(config: CuratorConfig) -> str:
    """Where an embedded cluster's workers spill (tags and symbols): ``<keystore>/dask-spill``,
    0700 like the keystore, never a shared /tmp."""
    path = Path(config.keystore) / "dask-spill"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return str(path)


def close_cluster(sharded: ShardedTable | None, state: LeaderState | None) -> None:
    """The cluster's part of a run is over (nothing to do without ``sharded``): the leader's
    spool removed, the engine closed."""
    if sharded is None:
        return
    if isinstance(state, ClusterLeader):
        state.cleanup()
    sharded.engine.close()


def hashed_tags(config: CuratorConfig, table: CuratorTable) -> tuple[CuratorTable, SortedTags]:
    """The table without its ids and its keyed tags, sorted for :func:`align` (the sort the
    leader's matching reuses); :class:`BadRowsError` (every repeated id with its lines) if two
    tags are equal, before any tag leaves this process. ``table`` must have been read with
    ``check_repeats=False`` or checked already (a repeat costs no second hash and sort here)."""
    assert config.alignment_key is not None
    sorted_tags = sort_tags(curator_tags(table, config.alignment_key))
    if isinstance(table, EncodedTable):
        if has_repeated_tag(sorted_tags):
            raise_repeats(config.data, table, config.query)
        table = table.without_ids()  # hashed: the ids are not needed again
    elif has_repeated_tag(sorted_tags):
        raise DuplicateIdError("an id occurs more than once in this curator's table; ids must be unique")
    release_free_memory()
    return table, sorted_tags


def run(config: CuratorConfig) -> int:
    """Take part in one release, then serve keys. 0 once the release is sealed and the keys
    were served; a failed or aborted release raises (after telling every party)."""
    log = EventLog("curator", config.name)
    stop = stop_on_sigterm()
    try:
        spec, service, state, restored_tags = open_service(config, log)
    except SecureReleaseError as exc:  # a wrong schema: the leader (if we follow) stops everybody now
        report_failure_to_leader(config, refusal_reason(exc, config.name), log)
        raise
    server = start_server(config, service, log)  # listening before the table is read
    threading.Thread(target=probe_server, args=(config, log), daemon=True).start()
    own: OwnData | None = None
    link: ServerLink | None = None
    try:
        try:
            own, keystore, link, witness, record, refusal = open_run(config, log, stop, spec, state)
        except SecureReleaseError as exc:  # bad rows, a table that changed: every party stops at once
            fail_before_agreement(config, state, log, exc)
            raise
        try:
            if record is None:  # agree, reserve, prepare
                record = setup_release(config, own, state, keystore, link, witness, refusal, restored_tags, log)
            else:
                record = resume(config, state, record, log)
            upload_record(link, record)
            await_seal(config, keystore, link, log)
        except (SecureReleaseError, grpc.RpcError) as exc:
            fail_release(config, state, keystore, link, log, exc)
            raise
        record = keystore.set_retention(record, time.time() + config.key_retention)
        announce_release(config, keystore, own.fingerprint, record, log)
        serve_until_acknowledged(config, service, log, record, stop)
        log("finished", release_id=config.release_id, note=f"done: {config.release_id} released, exiting 0")
        return 0
    finally:
        if link is not None:
            link.close()
        close_cluster(own.sharded if own is not None else None, state)
        server.stop(grace=1.0)
        log("stopped")
