"""One curator's part of a release, as explicit steps over one :class:`CuratorConfig`.

load the table -> open the ledger (read once; a release past the budget is refused before
anything leaves) -> id tags -> start the Curator service -> **agree** (leader or follower:
spec, seed, common tags) -> **prepare** (align, check budget, sample, encrypt, persist the pad,
charge the ledger) -> **upload** (register, chunks, commit) -> **serve keys** until SIGTERM (or
until every granted researcher fetched them with --exit-after-keys).
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass

import grpc

from secure_release.curator.agreement import agree, leader_state
from secure_release.curator.config import CuratorConfig
from secure_release.curator.keystore import Keystore
from secure_release.curator.service import SERVICE_NAME, CuratorService
from secure_release.curator.table import load_schema, read_table
from secure_release.curator.upload import upload
from secure_release.infra.config import ConfigError, write_port_file
from secure_release.infra.health import add_health_and_reflection
from secure_release.infra.logs import EventLog
from secure_release.infra.tls import bind, make_grpc_server
from secure_release.mechanism.alignment import TagArray, align
from secure_release.mechanism.ledger import PrivacyLedger
from secure_release.mechanism.pads import ReleasePad
from secure_release.mechanism.protocol import Agreement, CuratorTable, curator_encrypt, curator_tags
from secure_release.mechanism.sampling import sample_positions
from secure_release.mechanism.schema import SymbolArray
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

POLL_S = 0.5
PENDING_SEED = "pending"  # the early budget check runs before any seed exists


@dataclass(frozen=True)
class OwnData:
    """This curator's table and the keyed tags of its ids."""

    table: CuratorTable
    tags: TagArray

    @property
    def alphabet_size(self) -> int:
        """Number of symbols of this curator's joint attribute code."""
        return self.table.schema.alphabet_size


@dataclass(frozen=True)
class Prepared:
    """What ``prepare`` leaves: the ciphertext to upload and the pad to serve."""

    ciphertext: SymbolArray
    pad: ReleasePad


def load_table(config: CuratorConfig, log: EventLog) -> CuratorTable:
    """Read the table against its schema (which must be this curator's)."""
    spec = load_schema(config.schema)
    if spec.schema.name != config.name:
        raise ConfigError(f"schema {config.schema} is for curator {spec.schema.name!r}, not {config.name!r}")
    table = read_table(config.data, spec)
    log("table_loaded", rows=int(table.ids.size), alphabet_size=spec.schema.alphabet_size)
    return table


def open_ledger(config: CuratorConfig, keystore: Keystore) -> PrivacyLedger:
    """The privacy ledger, read once, its budget set to ``--budget``; raises
    BudgetExceededError / SeedReuseError now if this release cannot be run on this data set."""
    ledger = keystore.load_ledger()
    if ledger.budget != config.budget:
        ledger = PrivacyLedger(config.budget, ledger.entries)
        keystore.save_ledger(ledger)
    ledger.check(config.dataset, config.release_id, config.epsilon, PENDING_SEED)
    return ledger


def start_server(config: CuratorConfig, service: CuratorService, log: EventLog) -> grpc.Server:
    """The Curator service with health and reflection, listening (port written if asked)."""
    server = make_grpc_server(insecure=config.insecure)
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
    agreement: Agreement,
    keystore: Keystore,
    ledger: PrivacyLedger,
    log: EventLog,
) -> Prepared:
    """Step 2: align to the common tags, check the budget with the agreed seed, sample the
    agreed m rows, encrypt them under a fresh pad, persist the pad and charge the ledger."""
    spec, seed, common = agreement
    alignment = align(own.tags, common)
    log("aligned", matched=alignment.num_matched, unmatched=alignment.num_unmatched, rows=alignment.num_rows)
    ledger.check(config.dataset, config.release_id, config.epsilon, seed.fingerprint)
    positions = sample_positions(seed, spec.n, spec.m, spec.release_id)
    aligned = own.table.symbols()[alignment.row_order]
    ciphertext, pad = curator_encrypt(aligned, positions, own.alphabet_size, spec.cipher, config.test_pad_key)
    keystore.save_pad(spec.release_id, pad, {"dataset": config.dataset})
    ledger.charge(config.dataset, spec.release_id, config.epsilon, seed.fingerprint)
    keystore.save_ledger(ledger)
    log(
        "ledger_charged",
        dataset=config.dataset,
        epsilon=config.epsilon,
        remaining=ledger.remaining(config.dataset),
        seed_fingerprint=seed.fingerprint,
    )
    return Prepared(ciphertext, pad)


def serve_keys(config: CuratorConfig, service: CuratorService, stop: threading.Event, log: EventLog) -> None:
    """Step 4: serve the key until ``stop`` (SIGTERM), or with --exit-after-keys until every
    granted researcher fetched it."""
    if not config.exit_after_keys:
        log("serving_keys", release_id=config.release_id, grants=sorted(config.grants))
        while not stop.wait(POLL_S):  # short waits: SIGTERM's handler runs between them
            pass
        return
    while not stop.is_set():
        if service.wait_keys_served(config.release_id, timeout=POLL_S):
            log("keys_served", release_id=config.release_id)
            return


def stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM (installed only on the main thread, where Python allows it)."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def run(config: CuratorConfig) -> int:
    """Take part in one release, then serve keys; 0 on success (errors raise)."""
    log = EventLog("curator", config.name)
    table = load_table(config, log)
    keystore = Keystore(config.keystore, budget=config.budget)
    ledger = open_ledger(config, keystore)
    own = OwnData(table, curator_tags(table, config.alignment_key))
    service = CuratorService(config.name, table.schema, log)
    state = leader_state(config, own.alphabet_size) if config.leader else None
    if state is not None:
        service.lead(state)
    server = start_server(config, service, log)
    stop = stop_on_sigterm()
    try:
        agreement = agree(config, own.tags, own.alphabet_size, state, log)
        prepared = prepare(config, own, agreement, keystore, ledger, log)
        service.add_release(config.release_id, prepared.pad, config.grants)
        upload(config, agreement.spec, prepared.ciphertext, log)
        serve_keys(config, service, stop, log)
        return 0
    finally:
        server.stop(grace=1.0)
        log("stopped")
