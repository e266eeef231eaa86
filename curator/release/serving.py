"""The serve step: once the release is sealed, announce it (sizes, epsilon spent, budget left)
and serve its key to the granted researchers until each acknowledged it, the key retention ends
or the run is stopped. The acknowledgements are kept in the keystore, so a restarted curator does
not wait for them again. Server-side sampling serves its keys the same way."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import NamedTuple

from secure_release.curator.config import CuratorConfig
from secure_release.curator.records.keystore import Keystore, ReleaseRecord
from secure_release.curator.service import CuratorService
from secure_release.infra.fileio import UnsafePathError, atomic_write, read_nofollow
from secure_release.infra.logs import EventLog

POLL_S = 0.5


class ServeSettings(NamedTuple):
    """What the serve step reads of the config."""

    release_id: str
    dataset: str  # the ledger's key of the budget left
    grants: tuple[str, ...]  # the researchers who get the key
    exit_after_keys: bool  # end once each acknowledged it (else at the end of the retention)
    keystore: Path  # the keystore's directory: the acknowledgements are kept there
    key_retention: float  # seconds the key is served after sealing

    @classmethod
    def of(cls, config: CuratorConfig) -> ServeSettings:
        """These fields of ``config``."""
        return cls(config.release_id, config.dataset, config.grants, config.exit_after_keys, config.keystore,
                   config.key_retention)  # fmt: skip


def serve_keys(
    settings: ServeSettings, keystore: Keystore, service: CuratorService, fingerprint: str, record: ReleaseRecord,
    stop: threading.Event, log: EventLog,
) -> None:  # fmt: skip
    """The sealed release's key retention recorded (kept if set before), the release announced
    (:func:`announce_release`), then its key served (:func:`serve_until_acknowledged`)."""
    record = keystore.set_retention(record, time.time() + settings.key_retention)
    announce_release(settings, keystore, fingerprint, record, log)
    serve_until_acknowledged(settings, service, log, record, stop)


def announce_release(
    settings: ServeSettings, keystore: Keystore, fingerprint: str, record: ReleaseRecord, log: EventLog
) -> None:
    """Log the sealed release: its sizes, the epsilon spent, the budget left on its data set (the
    ledger's key: ``settings.dataset``, not the table's ``fingerprint``) and who gets the result."""
    spec = record.spec
    left = keystore.ledger.read().remaining(settings.dataset)
    left_text = f"{left:g}" if left is not None else "?"
    to = ", ".join(settings.grants) or "nobody"
    log("released", release_id=settings.release_id, n=spec.n, m=spec.m, epsilon=spec.plan.epsilon, budget_left=left,
        dataset=settings.dataset,
        note=f"released {settings.release_id}: n={spec.n}, m={spec.m}; epsilon {spec.plan.epsilon:g} spent, "
             f"{left_text} left on data set {settings.dataset}; the result goes to {to}")  # fmt: skip


def _acks_file(settings: ServeSettings) -> Path | None:
    """Where this release's key acknowledgements are kept (None without a keystore)."""
    keystore = getattr(settings, "keystore", None)
    if keystore is None or not Path(keystore).is_dir():
        return None
    return Path(keystore) / f"acknowledged-{settings.release_id}.json"


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


def serve_until_acknowledged(
    settings: ServeSettings, service: CuratorService, log: EventLog, record: ReleaseRecord, stop: threading.Event
) -> None:
    """Serve ``record``'s key through ``service`` to the granted researchers until every one
    acknowledged it (it stored its result durably; a fetch alone is not enough), the key
    retention ends, or ``stop`` (SIGTERM); with --serve-until-stopped only the last two end it.
    Shared with server-side sampling. The acknowledgements are kept in the keystore
    (``acknowledged-<release>.json``), so a curator restarted after a researcher acknowledged
    does not wait for it again."""
    service.add_release(settings.release_id, record.pad, settings.grants, record.design_json)
    acks = _acks_file(settings)
    saved = _load_acks(acks, log) & set(settings.grants)
    service.keys[settings.release_id].acknowledged.update(saved)
    until = record.retention_until or time.time()
    waiting = ", ".join(service.unacknowledged(settings.release_id)) or "nobody"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(until))
    finish = "until each acknowledges it or" if settings.exit_after_keys else "until"
    log(
        "serving_keys",
        release_id=settings.release_id,
        grants=sorted(settings.grants),
        retention_s=round(until - time.time(), 1),
        note=f"serving the key to {waiting} {finish} {stamp}, Ctrl-C to stop",
    )
    while not stop.is_set() and time.time() < until:
        saved = _save_acks(acks, set(service.keys[settings.release_id].acknowledged), saved)
        if settings.exit_after_keys and service.wait_keys_acknowledged(settings.release_id, timeout=POLL_S):
            _save_acks(acks, set(service.keys[settings.release_id].acknowledged), saved)
            log("keys_acknowledged", release_id=settings.release_id, note="every granted researcher stored its result")
            return
        if not settings.exit_after_keys:
            stop.wait(min(POLL_S, max(0.0, until - time.time())))
    if not stop.is_set():
        log("key_retention_ended", release_id=settings.release_id)
