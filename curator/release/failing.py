"""The refusal and abort paths of a release, in one place: the ledger's refusal found when the run
opens, a refusal made visible at the server, a failure before the agreement (every party stops at
once) and a failed release (aborted at the server with the reason, the reservation refunded once
the server confirms ABORTED).

A refusal before the agreement (no budget or too little, a data check, a key or certificate, a
reused seed) has no spec at the server to abort: the curator declares it instead
(:func:`declare_refusal`, ``DeclareRelease``: its name, the reason class and the error's name,
never the data), and every curator declares the parties it takes part with when it starts
(:func:`announce_parties`), which is what lets another's refusal show to the researcher."""

from __future__ import annotations

import contextlib
import threading
import time

import grpc

from secure_release.curator.badrows import BadRowsError
from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import ReleaseAbortedError, ReleaseRefusedError
from secure_release.curator.leader import LeaderState
from secure_release.curator.records.keystore import Keystore, ReleaseRecord, TableChangedError
from secure_release.curator.records.ledgersign import SigningKeyError
from secure_release.curator.records.witness import BudgetWitness
from secure_release.curator.release.budget import LedgerSettings, check_ledger, settle
from secure_release.curator.release.follower import report_failure_to_leader
from secure_release.curator.release.upload import ABORT_GIVE_UP_S, ServerLink
from secure_release.infra.exitcodes import REFUSAL_MARK, grpc_status_name, is_refusal, refusal_reason
from secure_release.infra.identity import PkiError
from secure_release.infra.logs import EventLog
from secure_release.infra.tls import secure_channel
from secure_release.infra.wire import MAX_REFUSAL_DETAIL, Declaration, RefusalClass, declaration_to_pb
from secure_release.mechanism.alignment.keyed_hash import DuplicateIdError
from secure_release.mechanism.errors import (
    BudgetExceededError,
    PadReuseError,
    PolicyEpsilonError,
    SecureReleaseError,
    SeedReuseError,
)
from secure_release.mechanism.privacy.ledger import LedgerTamperedError, NoBudgetError
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

LINGER_S = 10.0  # how long a failed leader keeps answering followers with the failure
DECLARE_S = 5.0  # how long a refusal is offered to the server (best effort)
ANNOUNCE_S = 30.0  # how long a starting curator keeps offering its party list to the server
_RETRY_S = 0.3
#: This process's own refusals, by (release id, curator): its announcement must not replace them
#: at the server. The lock orders the two: an announcement attempt in flight ends before a refusal is sent.
_REFUSED: set[tuple[str, str]] = set()
#: (release, curator) whose party list the server has stored (announced at the start or confirmed on failing).
_ANNOUNCED: set[tuple[str, str]] = set()
_DECLARING = threading.Lock()
_CLASSES: tuple[tuple[tuple[type[BaseException], ...], RefusalClass], ...] = (
    ((NoBudgetError, BudgetExceededError, PolicyEpsilonError, LedgerTamperedError), RefusalClass.BUDGET),
    ((BadRowsError, DuplicateIdError, TableChangedError), RefusalClass.DATA),
    ((SigningKeyError, PkiError), RefusalClass.KEY),
    ((SeedReuseError, PadReuseError), RefusalClass.SEED),
)


_CREDENTIAL_STATUSES = ("PERMISSION_DENIED", "UNAUTHENTICATED")


def _refused_credentials(exc: BaseException) -> BaseException | None:
    """The peer's gRPC error if ``exc`` says a peer refused this curator's certificate or identity
    (PERMISSION_DENIED or UNAUTHENTICATED, its own: not a refusal it passes on, whose reason is
    marked): ``exc`` itself, or the error a :class:`ReleaseRefusedError` was raised from (the
    leader's access check refused our certificate, e.g. one its CRL revokes). Else None."""
    peer: BaseException | None = exc
    if isinstance(exc, ReleaseRefusedError):  # the follower's agreement raises it "from None": the context stays
        peer = exc.__cause__ or exc.__context__
    if peer is None or grpc_status_name(peer) not in _CREDENTIAL_STATUSES:
        return None
    details = getattr(peer, "details", None)
    return None if is_refusal(str(details() if callable(details) else "") or "") else peer


def refusal_class(exc: BaseException) -> RefusalClass | None:
    """The reason class of this curator's own refusal ``exc`` (None: not one of the classes, or
    a refusal passed on from another party, which that party declares). A peer that refused
    this curator's certificate is this curator's key refusal, whether the call's error reached
    here as it is or as the :class:`ReleaseRefusedError` a follower makes of the leader's answer."""
    if isinstance(exc, ReleaseRefusedError) and _refused_credentials(exc) is not None:
        return RefusalClass.KEY  # the leader refused our certificate: nobody else declares it
    if isinstance(exc, ReleaseAbortedError | ReleaseRefusedError):
        return None
    for types, cls in _CLASSES:
        if isinstance(exc, types):
            return cls
    if _refused_credentials(exc) is not None:
        return RefusalClass.KEY  # the server or a peer refused our certificate
    return None


def _public_detail(exc: BaseException) -> str:
    """The error's name and, if it has one, its public message (a count, never a value); for a
    certificate a peer refused, the status and the peer's words (a name and a serial, no data)."""
    public = getattr(exc, "public_message", None)
    text = type(exc).__name__ + (f": {public}" if isinstance(public, str) else "")
    peer = _refused_credentials(exc)
    if peer is not None:
        details = getattr(peer, "details", None)
        said = details() if callable(details) else ""
        text = f"{type(exc).__name__}: {exc}" if peer is not exc else f"{grpc_status_name(peer)}: {said}"
    return "".join(ch if ch.isprintable() else " " for ch in text)[:MAX_REFUSAL_DETAIL]


def classed_reason(name: str, release_id: str, exc: BaseException) -> str:
    """The abort reason curator ``name`` sends the other parties for ``exc``
    (:func:`~secure_release.infra.exitcodes.refusal_reason`); a refusal of one of the classes
    that its own exit code does not mark (a data check, a signing key or certificate: exit 2 or
    1 at this curator, whose operator must fix its input) is marked all the same, naming this
    curator and the class, so every other party exits 3 (README, "Exit codes"). Never the data:
    only the error's name and its public message."""
    reason = refusal_reason(exc, name)
    cls = refusal_class(exc)
    if cls is None or is_refusal(reason):
        return reason
    # the shape of a refusal record's message (infra.wire.Refusal), which may also come after the agreement
    return f"{REFUSAL_MARK}{name} refuses release {release_id!r}: {cls.value} ({_public_detail(exc)})"


def _declare(config: CuratorConfig, declaration: Declaration, seconds: float, log: EventLog) -> bool:
    """Offer ``declaration`` to the server for up to ``seconds`` (retrying while it is not
    reachable); True once it is stored. Never raises: the run's own outcome does not depend on it.
    An announcement (no refusal) is given up once this process refused the release."""
    end = time.monotonic() + seconds
    try:
        channel = secure_channel(config.server, config.certs, config.name, config.insecure,
                                 role="curator", peer_role="server")  # fmt: skip
    except Exception as exc:  # best effort: the run reports its own error
        log.warning("declaration_unsent", release_id=declaration.release_id, error=type(exc).__name__)
        return False
    try:
        stub = pb_grpc.ReleaseServerStub(channel)
        while True:
            left = end - time.monotonic()
            try:
                if declaration.refusal is not None:
                    stub.DeclareRelease(declaration_to_pb(declaration), timeout=max(0.2, min(left, DECLARE_S)))
                    return True
                with _DECLARING:
                    if (declaration.release_id, declaration.curator) in _REFUSED:
                        return False
                    stub.DeclareRelease(declaration_to_pb(declaration), timeout=max(0.2, min(left, DECLARE_S)))
                return True
            except grpc.RpcError as exc:
                transient = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if not transient or left <= _RETRY_S:
                    log.warning("declaration_unsent", release_id=declaration.release_id, error=exc.code().name)
                    return False
            time.sleep(_RETRY_S)
    finally:
        channel.close()


def announce_parties(config: CuratorConfig, log: EventLog) -> threading.Thread:
    """Tell the server, in the background, which curators this curator takes part with in the
    release (its ``--curators``): what confirms another curator's refusal before any spec exists,
    so the researcher hears it within seconds. A daemon thread, best effort."""

    def run() -> None:
        declaration = Declaration(config.release_id, config.name, tuple(config.curators))
        try:
            declaration.validate()
        except SecureReleaseError as exc:
            log.warning("declaration_unsent", release_id=config.release_id, error=f"{type(exc).__name__}: {exc}")
            return
        if _declare(config, declaration, min(ANNOUNCE_S, config.timeout), log):
            _ANNOUNCED.add((config.release_id, config.name))
            log.debug("parties_declared", release_id=config.release_id, parties=",".join(config.curators))

    thread = threading.Thread(target=run, name="announce-parties", daemon=True)
    thread.start()
    return thread


def confirm_parties(config: CuratorConfig, log: EventLog, seconds: float = DECLARE_S) -> None:
    """Store this curator's party list now, unless its start-up announcement already landed: a
    curator that stops because another refused must not exit before its list reaches the server,
    since that list is what lets the other's refusal show to the researcher (bounded by DECLARE_S)."""
    if (config.release_id, config.name) in _ANNOUNCED:
        return
    declaration = Declaration(config.release_id, config.name, tuple(config.curators))
    try:
        declaration.validate()
    except SecureReleaseError:
        return
    if _declare(config, declaration, min(seconds, config.timeout), log):
        _ANNOUNCED.add((config.release_id, config.name))


def declare_refusal(
    config: CuratorConfig, exc: BaseException, log: EventLog, seconds: float = DECLARE_S
) -> RefusalClass | None:
    """If ``exc`` is this curator's own refusal of one of the classes, record it at the server
    (``DeclareRelease``: curator, class, the error's name; never the data), so the researcher and
    every curator hear it though the release never reached the agreement. Its class, else None."""
    cls = refusal_class(exc)
    if cls is None:
        return None
    with _DECLARING:  # an announcement in flight lands first; none is sent after this
        _REFUSED.add((config.release_id, config.name))
    parties = tuple(config.curators) if config.name in config.curators else ()
    declaration = Declaration(config.release_id, config.name, parties, cls, _public_detail(exc))
    try:
        declaration.validate()
    except SecureReleaseError as bad:
        log.warning("declaration_unsent", release_id=config.release_id, error=f"{type(bad).__name__}: {bad}")
        return cls
    if _declare(config, declaration, min(seconds, config.timeout), log):
        log("refusal_declared", release_id=config.release_id, reason_class=cls.value)
    return cls


def ledger_refusal(
    settings: LedgerSettings, keystore: Keystore, witness: BudgetWitness, record: ReleaseRecord | None, log: EventLog
) -> SecureReleaseError | None:
    """Why the ledger refuses a new release (logged, not raised: the refusal is made visible
    during the agreement, so the others are told), else None; the witness is asked right before
    reserving. A resume (``record`` given) needs an intact ledger: the witness checks it now."""
    if record is not None:
        witness.check(keystore.ledger.read(), settings.dataset, reread=keystore.ledger.read)
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
    reason = classed_reason(config.name, config.release_id, exc)
    if declare_refusal(config, exc, log) is None:
        confirm_parties(config, log)
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
    # another party's reason (a refusal of our certificate by the leader is ours)
    passed_on = isinstance(exc, ReleaseAbortedError | ReleaseRefusedError) and refusal_class(exc) is None
    status, unknown = link.abort(str(exc) if passed_on else classed_reason(name, release_id, exc))
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
    reason = classed_reason(name, release_id, exc)
    if state is not None:
        state.fail(reason)
    # past the run's --timeout the declaration and the abort share the link's one wind-down
    offer = min(DECLARE_S, link.wind_down(ABORT_GIVE_UP_S).left())
    if declare_refusal(link.config, exc, log, offer) is None:  # a refusal before any spec: the server records it
        confirm_parties(link.config, log, offer)  # another's refusal: our party list lets it show
    abort_and_settle(name, release_id, keystore, link, log, exc)
    if state is not None and not state.published:
        # within the run's --timeout only: a follower still waiting then has timed out as well
        # (a leader whose follower was cut off outlived its --timeout by the whole linger)
        state.wait_all_told(min(LINGER_S, timeout, link.deadline.left()))
