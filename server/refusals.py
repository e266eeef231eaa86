"""The server's declarations: per (release, curator), the parties that curator takes part with
and, once it refuses the release, why. A refusal before the agreement (no budget, a data check, a
key, a seed) reaches every party this way within seconds, although no spec exists yet.

Security note.

- Who may write: a caller with role curator (``ACCESS``), and only its own record: the
  declaration's curator must be the caller's certificate name, and a party list it gives must
  name itself. Any authenticated curator may write a record for any release id, but a refusal
  *shows* (:func:`shown`) only once a second party confirms that the refusing curator takes part:
  a candidate spec of the release that names it and that another of its curators registered,
  or another curator's declaration of the release that names both. Once a spec is bound, only
  its curators' refusals show. So one outsider certificate cannot make a release look refused
  (two colluding curator certificates could, as they could register and bind a spec of their
  own under that id: the same bar as the release id itself).
- Who may read: any authenticated researcher or curator, the refusals that show (a curator's
  name, the class, an error's name): before a spec exists, the server knows no grants to check.
- What it costs: one row per (release, curator), which the curator's next declaration replaces
  (a rerun under the same id, once the refusal was resolved, clears it). A row holds a release
  id and names checked against the grammar, at most 16 parties, a reason class (an enum) and a
  detail of at most 200 printable characters: under 2 KiB. One curator keeps at most
  :data:`MAX_DECLARATIONS_PER_CURATOR` rows (its oldest is dropped to make room) and the server
  at most :data:`MAX_DECLARATIONS` (then RESOURCE_EXHAUSTED): a few MiB at most.
- What it leaves on disk: the ``declarations`` table of the server's store: release ids, curator
  names, reason classes and the public detail (an error's name and a count). No data, no value of
  a row, no key.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence

from secure_release.infra.wire import Declaration, Refusal, RefusalClass
from secure_release.server.sqltx import transaction
from secure_release.server.state import LimitExceededError, NotACuratorError

DECLARATIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS declarations (
    release_id TEXT NOT NULL,
    curator TEXT NOT NULL,
    parties TEXT NOT NULL,
    reason_class TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT '',
    written_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (release_id, curator)
);
"""
#: Declarations one curator keeps at the server (its oldest is dropped to make room).
MAX_DECLARATIONS_PER_CURATOR = 64
#: Declarations the server keeps at most (each under 2 KiB).
MAX_DECLARATIONS = 4096


def shown(
    declarations: Sequence[Declaration], candidates: Iterable[tuple[Sequence[str], Iterable[str], bool]]
) -> list[Refusal]:
    """The refusals among ``declarations`` (of one release) that show: the refusing curator X is
    confirmed as a party by another curator Y: Y registered a candidate spec naming X, or Y's
    declaration names X. ``candidates``: per candidate spec (its curators, those registered, bound?);
    once one is bound, only its curators' refusals show. Pure."""
    specs = [(tuple(c), set(r), b) for c, r, b in candidates]
    bound = next((set(c) for c, _, b in specs if b), None)
    out = []
    for d in declarations:
        if d.refusal is None or (bound is not None and d.curator not in bound):
            continue
        by_spec = any(d.curator in c and reg - {d.curator} for c, reg, _ in specs)
        by_peer = any(o.curator != d.curator and d.curator in o.parties for o in declarations)
        if by_spec or by_peer:
            out.append(Refusal(d.release_id, d.curator, d.refusal, d.detail))
    return sorted(out, key=lambda r: r.curator)


class Declarations:
    """The declaration rows in the store's database (its connection and lock)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self._db, self._lock = db, lock
        self._db.executescript(DECLARATIONS_SCHEMA)

    def declare(self, d: Declaration, caller: str) -> None:
        """Write ``d`` (validated by the wire) for ``caller`` in place of its earlier record of
        the release (a rerun clears an old refusal); an empty party list keeps the parties
        recorded before. Durable before it returns."""
        if d.curator != caller:
            raise NotACuratorError(f"caller {caller!r} may not declare for curator {d.curator!r}")
        with self._lock:
            row = self._db.execute(
                "SELECT parties FROM declarations WHERE release_id = ? AND curator = ?", (d.release_id, d.curator)
            ).fetchone()
            parties = list(d.parties) if d.parties or row is None else json.loads(row[0])
            with transaction(self._db):
                if row is None:
                    self._make_room(d.curator)
                self._db.execute(
                    "INSERT OR REPLACE INTO declarations (release_id, curator, parties, reason_class, detail, "
                    "written_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (d.release_id, d.curator, json.dumps(parties), d.refusal.value if d.refusal else "", d.detail,
                     time.time()),
                )  # fmt: skip

    def _make_room(self, curator: str) -> None:
        """Before a new row: drop the curator's oldest if it holds its most; refuse at the total."""
        (mine,) = self._db.execute("SELECT COUNT(*) FROM declarations WHERE curator = ?", (curator,)).fetchone()
        if int(mine) >= MAX_DECLARATIONS_PER_CURATOR:
            self._db.execute(
                "DELETE FROM declarations WHERE rowid = (SELECT rowid FROM declarations WHERE curator = ? "
                "ORDER BY written_at LIMIT 1)",
                (curator,),
            )
            return
        (total,) = self._db.execute("SELECT COUNT(*) FROM declarations").fetchone()
        if int(total) >= MAX_DECLARATIONS:
            raise LimitExceededError(f"the server holds {total} release declarations, the most it keeps")

    def of(self, release_id: str) -> list[Declaration]:
        """Every declaration of ``release_id``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT curator, parties, reason_class, detail FROM declarations WHERE release_id = ?", (release_id,)
            ).fetchall()
        return [
            Declaration(release_id, str(cur), tuple(json.loads(parties)), RefusalClass(cls) if cls else None, str(det))
            for cur, parties, cls, det in rows
        ]
