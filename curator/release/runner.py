"""One curator's part of a release, as explicit steps with one explicit outcome: :func:`run`
calls them in this order, each in its own module; each takes the values it needs (the fields of
the config it reads) and returns what it made (no shared context object).

**open** (:mod:`~secure_release.curator.release.opening`): the Curator service from the schema
(it listens while the table is read) -> the table loaded and fingerprinted -> (a stored release
record? resume it) -> the ledger checked (a budget is set and enough remains; nothing recorded)
-> id tags (keyed hash) -> **align** (:mod:`~secure_release.curator.release.aligning`; with
``--alignment psi`` the ECDH ring through the leader, :mod:`secure_release.curator.release.psi_ring`)
-> **agree** (:mod:`~secure_release.curator.release.agreeing`; leader or follower; the sample is
a seed or, with ``--sampling indices``, the leader's packed index tuple; the leader persists the
agreement, reserves, registers, then publishes it, so the followers align while it prepares;
every curator reserves epsilon, :mod:`~secure_release.curator.release.budget`) -> **prepare**
(:mod:`~secure_release.curator.release.preparing`: align, sample, encrypt, persist pad and sample
before any upload) -> **upload** what the server lacks and commit
(:mod:`~secure_release.curator.release.upload`) -> **seal**: wait until SEALED (ledger: commit,
:mod:`~secure_release.curator.release.sealing`) -> **serve** keys until the key retention ends
(:mod:`~secure_release.curator.release.serving`).

Every failure before sealing ends the release for everybody
(:mod:`~secure_release.curator.release.failing`): the curator aborts it at the server with the
reason (the others poll the status and stop), the leader also keeps telling followers the failure
for a while, and the reservation is refunded once the server confirms ABORTED.
"""

from __future__ import annotations

import threading

import grpc

from secure_release.curator.config import CuratorConfig
from secure_release.curator.release.agreeing import agree_on_release
from secure_release.curator.release.aligning import OwnData, align_ids
from secure_release.curator.release.failing import fail_before_agreement, fail_release, raise_leader_refusal
from secure_release.curator.release.opening import (
    ListenSettings,
    close_cluster,
    open_run,
    open_service,
    probe_server,
    start_server,
    stop_on_sigterm,
)
from secure_release.curator.release.preparing import PrepareSettings, prepare_own_part, resume
from secure_release.curator.release.sealing import await_seal
from secure_release.curator.release.serving import ServeSettings, serve_keys
from secure_release.curator.release.upload import ServerLink, upload_record
from secure_release.infra.logs import EventLog
from secure_release.mechanism.errors import SecureReleaseError


def run(config: CuratorConfig) -> int:
    """Take part in one release, then serve keys. 0 once the release is sealed and the keys
    were served; a failed or aborted release raises (after telling every party)."""
    log = EventLog("curator", config.name)
    stop = stop_on_sigterm()
    try:
        spec, service, state, restored_tags = open_service(config, log)
    except SecureReleaseError as exc:  # a wrong schema: the leader (if we follow) stops everybody now
        fail_before_agreement(config, None, log, exc)
        raise
    server = start_server(ListenSettings.of(config), service, log)  # listening before the table is read
    probe = (config.server, config.certs, config.name, config.insecure, log)
    threading.Thread(target=probe_server, args=probe, daemon=True).start()
    own: OwnData | None = None
    link: ServerLink | None = None
    try:
        try:
            own, keystore, link, witness, record, refusal = open_run(config, log, stop, spec, state)
        except SecureReleaseError as exc:  # bad rows, a table that changed: every party stops at once
            fail_before_agreement(config, state, log, exc)
            raise
        try:
            if record is None:  # align, agree (and reserve), prepare
                raise_leader_refusal(refusal, state)
                tagged = align_ids(config, own, state, restored_tags, link.deadline, log)
                agreement = agree_on_release(config, tagged, state, keystore, link, witness, log)
                record = prepare_own_part(PrepareSettings.of(config), tagged, agreement, state, keystore, log)
            else:
                record = resume(config.release_id, state, record, log)
            upload_record(link, record)
            await_seal(config.release_id, keystore, link, log)
        except (SecureReleaseError, grpc.RpcError) as exc:
            fail_release(config.name, config.release_id, config.timeout, state, keystore, link, log, exc)
            raise
        serve_keys(ServeSettings.of(config), keystore, service, own.fingerprint, record, stop, log)
        log("finished", release_id=config.release_id, note=f"done: {config.release_id} released, exiting 0")
        return 0
    finally:
        if link is not None:
            link.close()
        close_cluster(own.sharded if own is not None else None, state)
        server.stop(grace=1.0)
        log("stopped")
