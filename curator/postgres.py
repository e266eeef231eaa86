"""A curator's table from its own PostgreSQL database: ``--data postgresql://HOST[:PORT]/DB
--query "SELECT ..."``, the connection, its credentials and its one snapshot (the rows are read,
checked and fingerprinted in :mod:`curator.postgres_read`).

* The URL names the server and the database, never a password: a URL that carries one (in its
  user part or as ``?password=``) is refused by name (:class:`PasswordInUrlError`), so no
  password reaches an argv, a log line or the ledger. libpq finds the password in its own places
  (``PGPASSFILE`` or ``~/.pgpass``, ``PGPASSWORD``, a service file named by ``?service=``), or
  the curator reads it from ``--data-password-file`` (the file's first line) and hands it to
  libpq for the one connect, through this process's environment, restored at once: never an
  argument of a child process. TLS is libpq's: ``?sslmode=verify-full&sslrootcert=...``.
* The driver is ADBC's PostgreSQL driver (``adbc-driver-postgresql``, libpq underneath: the
  optional extra ``postgresql``); rows arrive as Arrow record batches, which the readers consume.
* :func:`snapshot` opens one transaction ``ISOLATION LEVEL REPEATABLE READ READ ONLY``: the query
  sees one snapshot of the database, whatever commits meanwhile, and can change nothing. A
  cluster's workers join the coordinator's snapshot (:func:`exported_snapshot`,
  ``pg_export_snapshot()``) with ``SET TRANSACTION SNAPSHOT``, so every slice reads one table.
* Errors are named: :class:`DatabaseUnreachableError` (exit 1: try again once the server is
  up), :class:`DatabaseLoginError` (the server refused the role or its password: exit 2),
  :class:`PasswordInUrlError`, and :class:`~secure_release.curator.columnar.DataSourceError` for a
  failing query or a missing driver.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from secure_release.curator.columnar import DataSourceError
from secure_release.mechanism.errors import ErrorKind

#: The URL schemes libpq accepts for a connection URI.
SCHEMES = ("postgresql", "postgres")
#: Bytes of Arrow data the driver gathers before it hands a record batch over (bounded memory).
BATCH_BYTES = 1 << 24
#: URL parameters that would carry a secret in the command line.
_SECRET_PARAMETERS = ("password", "sslpassword")
_CONNECT_LOCK = threading.Lock()  # the password is in this process's environment for one connect only
_PASSWORD_FILE: list[Path | None] = [None]
_QUERIES: dict[str, str] = {}  # URL -> the --query of this process's source
_HELD: dict[str, tuple[Any, Any, str]] = {}  # URL -> (connection, cursor, exported snapshot id)
_HELD_LOCK = threading.Lock()


class PasswordInUrlError(DataSourceError):
    """A ``--data`` URL carries a password (it would be in the argv, the logs and the ledger)."""


class DatabaseUnreachableError(DataSourceError):
    """The database server cannot be reached (down, a wrong host or port, a network failure)."""

    kind = ErrorKind.UNAVAILABLE


class DatabaseLoginError(DataSourceError):
    """The database server refused the login: an unknown role, a wrong or missing password, a
    database the role may not connect to, or TLS that ``sslmode`` requires and the server lacks."""


@dataclass(frozen=True)
class DatabaseUrl:
    """A checked ``postgresql://`` URL (no password in it) and its parts for messages."""

    url: str
    host: str
    port: int
    database: str

    @property
    def name(self) -> str:
        """The server and database, for messages and bad-row reports (nothing secret)."""
        return f"postgresql {self.host}:{self.port}/{self.database}"


def is_database_url(data: str | Path | None) -> bool:
    """True if ``data`` is a PostgreSQL URL (also once a ``Path`` has folded its ``//``)."""
    text = str(data or "")
    return any(text.startswith(f"{scheme}:/") for scheme in SCHEMES)


def _unfolded(text: str) -> str:
    """``text`` with the ``//`` after the scheme that ``pathlib.Path`` folds to ``/`` put back."""
    scheme, _, rest = text.partition(":")
    return f"{scheme}://{rest.lstrip('/')}" if not rest.startswith("//") else text


def check_url(data: str | Path) -> DatabaseUrl:
    """``data`` as a :class:`DatabaseUrl`; :class:`PasswordInUrlError` if it carries a password,
    :class:`DataSourceError` if it names no host or no database."""
    url = _unfolded(str(data))
    try:
        parts = urlsplit(url)
        port = parts.port or 5432
    except ValueError as exc:
        raise DataSourceError(f"--data {parts_hidden(url)}: not a PostgreSQL URL ({exc})") from None
    parameters = dict(parse_qsl(parts.query))
    if parts.password is not None or any(key in parameters for key in _SECRET_PARAMETERS):
        raise PasswordInUrlError(
            f"--data {parts_hidden(url)}: the URL carries a password, which would be in the command line, the "
            "logs and the ledger; put it in ~/.pgpass (or PGPASSFILE), PGPASSWORD, a service file, or a file "
            "named by --data-password-file, and give the URL as postgresql://USER@HOST[:PORT]/DB"
        )
    database = parts.path.lstrip("/")
    if not parts.hostname or not database:
        raise DataSourceError(
            f"--data {url}: a PostgreSQL URL names a host and a database: postgresql://[USER@]HOST[:PORT]/DB "
            "(a unix socket directory goes in ?host=/run/postgresql)"
        )
    return DatabaseUrl(url, parts.hostname, port, database)


def query_dataset_name(data: str | Path, query: str | None) -> str:
    """The default data set (budget) name of a query on a database: the database's name and the
    first 12 hex digits of the SHA-256 of the server, the database and the query's text. Any
    other text of the query (a space, a comment, a new column) is another data set: a data
    office names its data set with ``--dataset`` so that one population keeps one budget."""
    url = check_url(data)
    text = f"{url.host}:{url.port}/{url.database}\0{query or ''}".encode("utf-8", "surrogateescape")
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in url.database)[:100]
    safe = safe if safe[:1].isalnum() else f"db{safe}"
    return f"{safe}-{hashlib.sha256(text).hexdigest()[:12]}"


def parts_hidden(url: str) -> str:
    """``url`` with everything after the scheme's host part elided if it may hold a password."""
    scheme, _, rest = url.partition("://")
    host = rest.rpartition("@")[2].split("/")[0].split("?")[0]
    return f"{scheme}://...@{host}/..."


def set_password_file(path: str | Path | None) -> None:
    """The ``--data-password-file`` of this process's connections (None: libpq's own places)."""
    _PASSWORD_FILE[0] = Path(path) if path else None


def register_query(data: str | Path, query: str | None) -> None:
    """The ``--query`` of the database ``data`` for this process: the callers that are handed
    only ``--data`` (the ledger's fingerprint, a cluster's partitions) find it here."""
    if query:
        _QUERIES[check_url(data).url] = query


def registered_query(data: str | Path) -> str | None:
    """The query :func:`register_query` named for ``data``, if any."""
    return _QUERIES.get(check_url(data).url)


def held_snapshot(url: DatabaseUrl) -> str:
    """The id of this process's one snapshot of ``url``: a read-only, repeatable-read transaction
    opened on first use and held until the process ends (:func:`release_snapshots`), so every
    read of the database in this process (the fingerprint, the table, a cluster's slices on
    other connections) sees the same rows."""
    with _HELD_LOCK:
        if url.url not in _HELD:
            connection = connect(url)
            cursor = connection.cursor()
            try:
                cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            except _driver().Error as exc:
                connection.close()
                raise query_error(url, exc) from None
            if not _HELD:
                atexit.register(release_snapshots)
            _HELD[url.url] = (connection, cursor, exported_snapshot(cursor, url))
        return _HELD[url.url][2]


def current_snapshot(url: DatabaseUrl) -> str | None:
    """The id of this process's held snapshot of ``url``, if one is held."""
    with _HELD_LOCK:
        held = _HELD.get(url.url)
    return None if held is None else held[2]


def release_snapshots() -> None:
    """End every held snapshot's transaction (it changed nothing) and close its connection."""
    with _HELD_LOCK:
        for connection, cursor, _ in _HELD.values():
            try:
                cursor.close()
                connection.close()
            except Exception:
                pass
        _HELD.clear()


def password_file() -> Path | None:
    """The password file :func:`set_password_file` named, if any."""
    return _PASSWORD_FILE[0]


def _read_password(path: Path) -> str:
    """The first line of the password file (without its line end); a named error if unreadable,
    or if the group or others may read or write it (libpq refuses such a ~/.pgpass too)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise DataSourceError(f"--data-password-file {path}: cannot be read ({type(exc).__name__})") from None
    if mode & 0o077:
        raise DataSourceError(f"--data-password-file {path}: its mode is {mode & 0o777:o}, so others may read the "
                              f"password; allowed: readable by its owner only (chmod 600 {path})")  # fmt: skip
    try:
        with path.open(encoding="utf-8") as handle:
            line = handle.readline()
    except (OSError, UnicodeError) as exc:
        raise DataSourceError(f"--data-password-file {path}: cannot be read ({type(exc).__name__})") from None
    password = line.rstrip("\r\n")
    if not password:
        raise DataSourceError(f"--data-password-file {path}: the first line is empty (it holds the password)")
    return password


def _driver() -> Any:
    """ADBC's PostgreSQL DB-API module; a named error if the optional extra is missing."""
    try:
        import adbc_driver_postgresql.dbapi as dbapi  # type: ignore[import-untyped]  # the postgresql extra
    except ImportError as exc:
        raise DataSourceError(
            "reading PostgreSQL needs ADBC's driver: pip install 'secure-release[postgresql]' "
            "(adbc-driver-postgresql)"
        ) from exc
    return dbapi


def _connect_error(url: DatabaseUrl, exc: BaseException) -> DataSourceError:
    """The named error of a failed connect (libpq's message names no password)."""
    text = " ".join(str(exc).split())
    refused = ("password authentication failed", "no password supplied", "does not exist", "pg_hba.conf",
               "permission denied", "authentication", "SSL", "certificate")
    if any(marker in text for marker in refused) and "Connection refused" not in text:
        return DatabaseLoginError(f"{url.name}: the server refused the login ({text}); give the role's password "
                                  "in ~/.pgpass, PGPASSWORD, a service file or --data-password-file")
    return DatabaseUnreachableError(f"{url.name}: cannot reach the database server ({text})")


def connect(url: DatabaseUrl, password_path: Path | None = None) -> Any:
    """An ADBC connection to ``url`` (autocommit: :func:`snapshot` opens its own transaction);
    the password from ``password_path`` (default: :func:`password_file`), else libpq's places."""
    dbapi = _driver()
    path = password_path or password_file()
    password = _read_password(path) if path is not None else None
    with _CONNECT_LOCK:
        kept = os.environ.get("PGPASSWORD")
        if password is not None:
            os.environ["PGPASSWORD"] = password
        try:
            return dbapi.connect(url.url, autocommit=True)
        except dbapi.Error as exc:
            raise _connect_error(url, exc) from None
        finally:
            if password is not None:
                if kept is None:
                    os.environ.pop("PGPASSWORD", None)
                else:
                    os.environ["PGPASSWORD"] = kept


def query_error(url: DatabaseUrl, exc: BaseException) -> DataSourceError:
    """The named error of a failing query (libpq's message, one line)."""
    text = " ".join(str(exc).split())
    return DataSourceError(f"{url.name}: the query failed ({text})")


@contextmanager
def snapshot(url: DatabaseUrl, snapshot_id: str | None = None, password_path: Path | None = None) -> Iterator[Any]:
    """A cursor inside one read-only, repeatable-read transaction (at ``snapshot_id``, one
    :func:`exported_snapshot` gave, if set); the transaction is rolled back and the connection
    closed on leaving (it changed nothing)."""
    connection = connect(url, password_path)
    try:
        cursor = connection.cursor()
        dbapi = _driver()
        try:
            cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if snapshot_id is not None:
                cursor.execute(f"SET TRANSACTION SNAPSHOT '{_snapshot_literal(snapshot_id)}'")
        except dbapi.Error as exc:
            raise query_error(url, exc) from None
        try:
            yield cursor
        finally:
            try:
                cursor.execute("ROLLBACK")
                cursor.close()
            except dbapi.Error:
                pass  # the connection is closed next: the server ends the transaction
    finally:
        connection.close()


def _snapshot_literal(snapshot_id: str) -> str:
    """An exported snapshot's id, checked to be one (hex digits and dashes: no quoting needed)."""
    if not snapshot_id or any(c not in "0123456789ABCDEFabcdef-" for c in snapshot_id):
        raise DataSourceError(f"not a PostgreSQL snapshot id: {snapshot_id!r}")
    return snapshot_id


def exported_snapshot(cursor: Any, url: DatabaseUrl) -> str:
    """The id of the open transaction's snapshot (``pg_export_snapshot()``), valid while it is
    open: other connections join it with ``SET TRANSACTION SNAPSHOT``."""
    try:
        cursor.execute("SELECT pg_export_snapshot()")
        row = cursor.fetchone()
    except _driver().Error as exc:
        raise query_error(url, exc) from None
    return str(row[0])


def record_batches(cursor: Any, url: DatabaseUrl, query: str) -> Any:
    """A ``pyarrow.RecordBatchReader`` of ``query``'s rows (batches of about
    :data:`BATCH_BYTES`, streamed from the server: the result is never held whole)."""
    dbapi = _driver()
    try:
        cursor.adbc_statement.set_options(**{"adbc.postgresql.batch_size_hint_bytes": str(BATCH_BYTES)})
        cursor.execute(query)
        return cursor.fetch_record_batch()
    except dbapi.Error as exc:
        raise query_error(url, exc) from None
