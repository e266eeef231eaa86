"""The agree step: the agreement on this curator's tags (as leader or follower,
:func:`~secure_release.curator.release.agreement.agree`), kept by the leader for a restart; then
this curator's epsilon reserved on its ledger (or the release refused visibly), and the leader
registers the release and publishes the agreement, so the followers align while it prepares."""

from __future__ import annotations

from secure_release.curator.cluster.matching import ClusterLeader
from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import DesignRefusedError, SpecRefusedError
from secure_release.curator.leader import LeaderState
from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.witness import BudgetWitness
from secure_release.curator.release.agreement import agree
from secure_release.curator.release.aligning import OwnData
from secure_release.curator.release.budget import LedgerSettings, reserve
from secure_release.curator.release.failing import refuse_visibly
from secure_release.curator.release.upload import ServerLink
from secure_release.infra.exitcodes import refusal_reason
from secure_release.infra.logs import EventLog
from secure_release.infra.memory import release_free_memory
from secure_release.mechanism.alignment.keyed_hash import TagArray
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.protocol.architectures import AlignmentMode, VariantAgreement, sample_fingerprint


def agree_on_release(
    config: CuratorConfig, own: OwnData, state: LeaderState | None, keystore: Keystore, link: ServerLink,
    witness: BudgetWitness, log: EventLog,
) -> VariantAgreement:  # fmt: skip
    """The agree step: the agreement on ``own``'s tags (``state``: the leader's, None on a
    follower), persisted by the leader, this curator's epsilon reserved (:func:`reserve_or_refuse`),
    then registered and published by the leader."""
    agreement = reach_agreement(config, own, state, link, log)
    if state is not None and not isinstance(state, ClusterLeader):  # a cluster leader never resumes one
        persist_agreement(config.alignment, keystore, agreement, own.tags, state)
    reserve_or_refuse(LedgerSettings.of(config), config.name, keystore, own.fingerprint, agreement, link, witness, log,
                      state)  # fmt: skip
    if state is not None:  # followers may align while the leader prepares its own part
        publish_agreement(link, state, agreement)
    return agreement


def reach_agreement(
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
            # a mismatch exits 1 at every party; another design is a refusal, exit 3 at every party
            why = f"{config.name} refuses the agreed spec: {exc}"
            if isinstance(exc, DesignRefusedError):
                why = refusal_reason(exc, config.name)
            refuse_visibly(link, exc.spec, why)
        raise


def persist_agreement(
    alignment: AlignmentMode, keystore: Keystore, agreement: VariantAgreement, own_tags: TagArray, state: LeaderState
) -> None:
    """The leader keeps ``agreement`` in the keystore with the followers' tag digests and row
    orders (and, with PSI ``alignment``, its ``own_tags``), so a restarted leader resumes it;
    then it drops the followers' tags."""
    psi_own = own_tags if alignment is AlignmentMode.PSI else None
    keystore.save_agreement(agreement, state.tag_digests(), psi_own, state.rows)
    state.forget_tags()
    release_free_memory()


def reserve_or_refuse(
    settings: LedgerSettings,
    name: str,
    keystore: Keystore,
    fingerprint: str,
    agreement: VariantAgreement,
    link: ServerLink,
    witness: BudgetWitness,
    log: EventLog,
    state: LeaderState | None = None,
) -> None:
    """:func:`~secure_release.curator.release.budget.reserve` the agreed release's epsilon for
    the table of ``fingerprint``; a curator (``name``) that cannot aborts the release visibly
    through ``link`` before raising. The leader (``state`` given) has not registered the release
    yet (it registers once reserved), so it tells its followers first, then registers only to
    abort: the researcher sees the refusal (a reused seed, a budget spent meanwhile) at once, not
    at the end of its --timeout."""
    try:
        reserve(settings, keystore, fingerprint, sample_fingerprint(agreement), log, witness)
    except SecureReleaseError as exc:
        log.warning("ledger_refuses", release_id=settings.release_id, reason=f"{type(exc).__name__}: {exc}")
        reason = refusal_reason(exc, f"{name} cannot reserve its budget")
        if state is not None:
            state.fail(reason)  # the followers stop now, whatever the server takes to answer
        refuse_visibly(link, agreement.base.spec, reason)
        raise


def publish_agreement(link: ServerLink, state: LeaderState, agreement: VariantAgreement) -> None:
    """The leader registers the agreed release at the server, then hands the agreement to its
    followers (they align while it prepares its own part)."""
    link.register(agreement.base.spec)
    state.publish()
