"""The refusal and abort paths of a release, in one place: the ledger's refusal found when the run
opens, a refusal made visible at the server, a failure before the agreement (every party stops at
once) and a failed release (aborted at the server with the reason, the reservation refunded once
the server confirms ABORTED)."""

from __future__ import annotations

import contextlib

import grpc

from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import ReleaseAbortedError, ReleaseRefusedError
from secure_release.curator.leader import LeaderState
from secure_release.curator.records.keystore import Keystore, ReleaseRecord
from secure_release.curator.records.witness import BudgetWitness
from secure_release.curator.release.agreement import report_failure_to_leader
from secure_release.curator.release.budget import LedgerSettings, check_ledger, settle
from secure_release.curator.release.upload import ServerLink
from secure_release.infra.exitcodes import refusal_reason
from secure_release.infra.logs import EventLog
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

LINGER_S = 10.0  # how long a failed leader keeps answering followers with the failure


def ledger_refusal(
    settings: LedgerSettings, keystore: Keystore, witness: BudgetWitness, record: ReleaseRecord | None, log: EventLog
) -> SecureReleaseError | None:
    """Why the ledger refuses a new release (logged, not raised: the refusal is made visible
    during the agreement, so the others are told), else None; the witness is asked right before
    reserving. A resume (``record`` given) needs an intact ledger: the witness checks it now."""
    if record is not None:
        witness.check(keystore.ledger.read(), settings.dataset)
        return None
    try:
        check_ledger(settings, keystore)
    except SecureReleaseError as exc:
        log.warning("ledger_refuses", release_id=settings.release_id, reason=f"{type(exc).__name__}: {exc}")
        return exc
    return None


def raise_leader_refusal(refusal: SecureReleaseError | None, state: LeaderState | None) -> None:
    """A leader whose ledger refuses the release (``refusal``, found when the run opened) fails the
    agreement with it, so every follower is told the reason. A follower's refusal shows when it
    reserves (:func:`~secure_release.curator.release.agreeing.reserve_or_refuse`)."""
    if refusal is not None and state is not None:
        raise refusal


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


def abort_and_settle(
    name: str, release_id: str, keystore: Keystore, link: ServerLink, log: EventLog, exc: Exception
) -> None:
    """If this curator reserved budget (or the release was aborted), abort the release at the
    server with the reason, then refund once the server confirms ABORTED or never knew the
    release (the record is dropped, so a restart cannot resume it); a release that sealed after
    all is left to commit, and an unknown outcome keeps the reservation."""
    reserved = release_id in keystore.ledger.read().releases()
    if not (reserved or isinstance(exc, ReleaseAbortedError)):
        return
    passed_on = isinstance(exc, ReleaseAbortedError | ReleaseRefusedError)  # another party's reason
    status, unknown = link.abort(str(exc) if passed_on else refusal_reason(exc, name))
    if status is not None and status.state in (pb.RELEASE_STATE_SEALED, pb.RELEASE_STATE_PERTURBED):
        log.warning("sealed_after_all", release_id=release_id)
    elif (status is not None and status.state == pb.RELEASE_STATE_ABORTED) or unknown:
        keystore.drop_record(release_id)
        settle(release_id, keystore, sealed=False, log=log)
    else:
        log.warning(
            "outcome_unknown",
            release_id=release_id,
            hint="the reservation stays until a rerun or 'release abort' settles it",
        )


def fail_release(
    name: str,
    release_id: str,
    timeout: float,
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
    reason = refusal_reason(exc, name)
    if state is not None:
        state.fail(reason)
    abort_and_settle(name, release_id, keystore, link, log, exc)
    if state is not None and not state.published:
        state.wait_all_told(min(LINGER_S, timeout))
