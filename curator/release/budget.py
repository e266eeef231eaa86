"""The release's budget on this curator's privacy ledger: checked when the run opens (nothing
recorded), reserved once the release is agreed, settled at the end (committed once the release is
sealed, refunded once it is aborted)."""

from __future__ import annotations

import time
from typing import NamedTuple

from secure_release.curator.config import CuratorConfig
from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.witness import BudgetWitness
from secure_release.infra.logs import EventLog
from secure_release.mechanism.privacy.ledger import PrivacyLedger


class LedgerSettings(NamedTuple):
    """What the ledger's steps read of the config: the data set that pays, the release, its epsilon."""

    dataset: str
    release_id: str
    epsilon: float

    @classmethod
    def of(cls, config: CuratorConfig) -> LedgerSettings:
        """These fields of ``config``."""
        return cls(config.dataset, config.release_id, config.epsilon)


def check_ledger(
    settings: LedgerSettings, keystore: Keystore, witness: BudgetWitness | None = None
) -> PrivacyLedger:
    """The verified ledger; raises now (nothing recorded) if this release could not reserve its
    epsilon: the ledger is behind the server's witness, no budget is set for the data set, too
    little is left, or the release id was used differently."""
    ledger = keystore.ledger.read()
    ledger.check_reserve(settings.dataset, settings.release_id, settings.epsilon, None)
    if witness is not None:
        witness.check(ledger, settings.dataset, reread=keystore.ledger.read)
    return ledger


def reserve(
    settings: LedgerSettings, keystore: Keystore, fingerprint: str, seed_fingerprint: str, log: EventLog,
    witness: BudgetWitness | None = None,
) -> None:  # fmt: skip
    """Reserve this release's epsilon on the data set (idempotent for the same release, data set
    and seed), recording the table's fingerprint, unless the ledger is behind the server's witness;
    then move the witness up to it."""
    if witness is not None:
        witness.check(keystore.ledger.read(), settings.dataset, reread=keystore.ledger.read)
    _, entry = keystore.ledger.update(
        lambda led: led.reserve(
            settings.dataset, settings.dataset, settings.release_id, settings.epsilon, seed_fingerprint, time.time(),
            table=fingerprint,
        )
    )  # fmt: skip
    ledger = keystore.ledger.read()
    if witness is not None:
        witness.check(ledger, settings.dataset, record=True, reread=keystore.ledger.read)
    log(
        "ledger_reserved",
        release_id=settings.release_id,
        epsilon=settings.epsilon,
        dataset=settings.dataset,
        new=entry is not None,
        remaining=ledger.remaining(settings.dataset),
    )


def settle(release_id: str, keystore: Keystore, sealed: bool, log: EventLog) -> None:
    """Commit (sealed) or refund (aborted before sealing) this release's reservation, if any."""
    ledger = keystore.ledger.read()
    if release_id not in ledger.releases():
        return
    _, entry = keystore.ledger.update(lambda led: (led.commit if sealed else led.refund)(release_id, time.time()))
    log("ledger_committed" if sealed else "ledger_refunded", release_id=release_id, new=entry is not None)
