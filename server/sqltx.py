"""One SQLite transaction of the server's store, and what a full disk becomes.

``BEGIN IMMEDIATE ... COMMIT``, rolled back on any error. A write that fails because the disk
(or the database's page limit) is full raises :class:`StoreFullError`, RESOURCE_EXHAUSTED over
gRPC, with a message saying so; the rollback means nothing of the call was stored.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import NoReturn

from secure_release.mechanism.errors import ErrorKind
from secure_release.server.state import ServerStateError


class StoreFullError(ServerStateError):
    """The store's disk is full; the call stored nothing (retry once space is freed)."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


def is_full(exc: BaseException) -> bool:
    """True if ``exc`` is SQLite's "database or disk is full" (SQLITE_FULL)."""
    return isinstance(exc, sqlite3.Error) and (
        getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    )


def raise_full(exc: BaseException) -> NoReturn:
    """:class:`StoreFullError` from SQLite's error ``exc``."""
    raise StoreFullError(
        "the server's store is full (no space left on its disk); nothing of this call was stored: the "
        "operator must free space, then the call can be repeated"
    ) from exc


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error; a full disk is :class:`StoreFullError`."""
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
                db.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        if is_full(exc):
            raise_full(exc)
        raise
