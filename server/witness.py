"""The server's budget witness: per curator and per keyed data-set fingerprint, how many
reservations and how much epsilon that curator's ledger has recorded. It only moves up.

The server sits in another trust domain than a curator's keystore, so a ledger rolled back to an
older copy, replaced by a fresh one or deleted is behind the witness, and the curator refuses
to release (``curator/records/witness.py``). The key is an HMAC under a key only the curator holds: the
server learns neither the data set's name nor its table, and cannot test guesses of either.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from dataclasses import dataclass

from secure_release.mechanism.errors import ErrorKind
from secure_release.server.sqltx import transaction
from secure_release.server.state import LimitExceededError, NotACuratorError, ServerStateError

WITNESS_SCHEMA = """
CREATE TABLE IF NOT EXISTS witness (
    curator TEXT NOT NULL,
    dataset_key BLOB NOT NULL,
    reservations INTEGER NOT NULL,
    epsilon_total REAL NOT NULL,
    PRIMARY KEY (curator, dataset_key)
);
"""
DATASET_KEY_BYTES = 32
#: Data sets one curator may have witnessed (each row is ~100 bytes).
MAX_WITNESSED_PER_CURATOR = 4096
#: Largest count or total a witness takes (a ledger never gets near; bounds the arithmetic).
MAX_WITNESS_VALUE = 1e12


class WitnessArgumentError(ServerStateError):
    """A witness request with a malformed key or a count or total out of range."""

    kind = ErrorKind.INVALID_ARGUMENT


@dataclass(frozen=True)
class WitnessCount:
    """What the witness holds for one (curator, data set)."""

    reservations: int
    epsilon_total: float


def check_witness_request(curator: str, caller: str, dataset_key: bytes, reservations: int, total: float) -> None:
    """The caller acts for itself, the key is 32 bytes, the counts are finite and in range."""
    if curator != caller:
        raise NotACuratorError(f"caller {caller!r} may not read or move the witness of curator {curator!r}")
    if len(dataset_key) != DATASET_KEY_BYTES:
        raise WitnessArgumentError(f"dataset_key must be {DATASET_KEY_BYTES} bytes, got {len(dataset_key)}")
    if not 0 <= reservations <= MAX_WITNESS_VALUE:
        raise WitnessArgumentError(f"reservations must be in [0, {MAX_WITNESS_VALUE:.0e}], got {reservations}")
    if not (math.isfinite(total) and 0 <= total <= MAX_WITNESS_VALUE):
        raise WitnessArgumentError(f"epsilon_total must be finite and in [0, {MAX_WITNESS_VALUE:.0e}], got {total!r}")


class Witness:
    """The witness rows in the store's database (its connection and lock)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self._db, self._lock = db, lock
        self._db.executescript(WITNESS_SCHEMA)

    def _row(self, curator: str, dataset_key: bytes) -> WitnessCount | None:
        row = self._db.execute(
            "SELECT reservations, epsilon_total FROM witness WHERE curator = ? AND dataset_key = ?",
            (curator, dataset_key),
        ).fetchone()
        return None if row is None else WitnessCount(int(row[0]), float(row[1]))

    def observe(
        self, curator: str, caller: str, dataset_key: bytes, reservations: int, total: float, record: bool
    ) -> WitnessCount:
        """The witness of (curator, data set) after, with ``record``, moving it up to the given
        counts (never down). Durable before it returns."""
        check_witness_request(curator, caller, dataset_key, reservations, total)
        with self._lock:
            held = self._row(curator, dataset_key)
            if not record:
                return held or WitnessCount(0, 0.0)
            if held is None:
                (count,) = self._db.execute("SELECT COUNT(*) FROM witness WHERE curator = ?", (curator,)).fetchone()
                if int(count) >= MAX_WITNESSED_PER_CURATOR:
                    raise LimitExceededError(
                        f"curator {curator!r} already has {count} witnessed data sets, the most this server keeps"
                    )
                held = WitnessCount(0, 0.0)
            new = WitnessCount(max(held.reservations, reservations), max(held.epsilon_total, total))
            if new != held:
                with transaction(self._db):
                    self._db.execute(
                        "INSERT OR REPLACE INTO witness (curator, dataset_key, reservations, epsilon_total) "
                        "VALUES (?, ?, ?, ?)",
                        (curator, dataset_key, new.reservations, new.epsilon_total),
                    )
            return new
