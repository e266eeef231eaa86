"""A real PostgreSQL server for the system tests (Debian's ``postgresql`` package, installed by
``.ci/run``): a throwaway cluster in a temporary directory, listening on 127.0.0.1 at a port the
OS gives, password logins only (SCRAM), stopped at the end. As root it runs as the ``postgres``
user the package creates (initdb refuses root). Tables are loaded from Arrow through ADBC."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from secure_release.cluster import free_port

SUPERUSER = "postgres"


def _bindir() -> Path:
    """The server's programs (initdb, pg_ctl): Debian keeps them under /usr/lib/postgresql/N/bin."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("no PostgreSQL server programs: install Debian's postgresql (apt-get install postgresql)")
    return Path(initdb).parent


class PostgresServer:
    """One running server: :attr:`port`, :meth:`url` of a role, :meth:`execute` SQL as the
    superuser, :meth:`load` an Arrow table, :meth:`role` a login role with a password."""

    def __init__(self, root: Path, port: int, password: str, run_as: list[str]) -> None:
        self.root, self.port, self._password, self._run_as = root, port, password, run_as
        self.data = root / "data"

    def url(self, user: str = SUPERUSER, database: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    @contextmanager
    def connection(self) -> Iterator[Any]:
        import adbc_driver_postgresql.dbapi as dbapi

        kept = os.environ.get("PGPASSWORD")
        os.environ["PGPASSWORD"] = self._password
        try:
            conn = dbapi.connect(self.url(), autocommit=True)
        finally:
            if kept is None:
                os.environ.pop("PGPASSWORD", None)
            else:
                os.environ["PGPASSWORD"] = kept
        try:
            yield conn
        finally:
            conn.close()

    def execute(self, *statements: str) -> None:
        with self.connection() as conn:
            cursor = conn.cursor()
            for statement in statements:
                cursor.execute(statement)
            cursor.close()

    def load(self, name: str, table: pa.Table) -> None:
        """``table`` as the new database table ``name`` (replacing one of that name)."""
        with self.connection() as conn:
            cursor = conn.cursor()
            cursor.execute(f'DROP TABLE IF EXISTS "{name}"')
            cursor.adbc_ingest(name, table, mode="create")
            cursor.close()

    def role(self, name: str, tables: list[str]) -> str:
        """A new login role that may only read ``tables``; its (random) password."""
        password = "pw-" + secrets.token_hex(12)
        self.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'",
                     *(f'GRANT SELECT ON "{t}" TO {name}' for t in tables))  # fmt: skip
        return password

    def stop(self) -> None:
        subprocess.run([*self._run_as, str(_bindir() / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60, check=False)  # fmt: skip


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a throwaway server (a few seconds) and stop and remove it on leaving."""
    root = Path(tempfile.mkdtemp(prefix="sr-postgres-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        runuser = shutil.which("runuser") or next(p for p in ("/usr/sbin/runuser", "/sbin/runuser") if Path(p).exists())
        run_as = [runuser, "-u", "postgres", "--"]  # CI's PATH has no sbin
    password = "su-" + secrets.token_hex(12)
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    if run_as:
        os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
    bindir = _bindir()
    server = None
    try:
        subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(root / "data"), "-U", SUPERUSER, "-A",
                        "scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        pwfile.unlink()
        for _ in range(3):
            port = free_port()
            options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
            started = subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(root / "data"), "-w", "-t", "60",
                                      "-o", options, "-l", str(root / "server.log"), "start"],
                                     capture_output=True, timeout=120, check=False)  # fmt: skip
            if started.returncode == 0:
                server = PostgresServer(root, port, password, run_as)
                break
        if server is None:
            raise RuntimeError(f"the PostgreSQL server did not start: {(root / 'server.log').read_text()[-2000:]}")
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
