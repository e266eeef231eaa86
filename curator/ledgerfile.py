"""The privacy ledger on disk: ``ledger.jsonl`` (one hash-chained entry a line, append-only),
``ledger.head`` (count and last digest, replaced atomically) and ``ledger.lock`` (fcntl lock).

Every read-decide-append runs under an exclusive ``flock`` so concurrent processes serialize;
an entry is appended and fsynced before the head moves, so a crash in between leaves one entry
past the head (accepted and the head repaired), never a lost acknowledged entry. A history that
is shorter than its head or does not verify is refused (:class:`LedgerTamperedError`). A data
set is identified by :func:`file_fingerprint` (SHA-256 of the table file, streamed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from secure_release.infra.fileio import atomic_write
from secure_release.mechanism.accounting import AccountingPolicy
from secure_release.mechanism.ledger import LedgerEntry, LedgerHead, NoBudgetError, PrivacyLedger

LEDGER_FILE = "ledger.jsonl"
HEAD_FILE = "ledger.head"
LOCK_FILE = "ledger.lock"


def file_fingerprint(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    with Path(path).open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def private_dir(directory: Path) -> Path:
    """Create ``directory`` (and parents) if needed and make it 0700."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    return directory


class LedgerFile:
    """One keystore's ledger files."""

    def __init__(self, directory: str | Path) -> None:
        """The ledger in ``directory`` (created 0700 if missing)."""
        self.directory = private_dir(Path(directory))
        self.path = self.directory / LEDGER_FILE
        self.head_path = self.directory / HEAD_FILE

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _read(self) -> tuple[PrivacyLedger, bool]:
        """The verified ledger, and whether the file is exactly its entries (False: a torn
        last line past the head, left by a crash mid-append and never acknowledged)."""
        head = LedgerHead.from_json(self.head_path.read_text()) if self.head_path.exists() else None
        if not self.path.exists():
            if head is not None and head.count > 0:
                raise NoBudgetError(
                    f"{self.path} is missing although {self.head_path.name} records {head.count} entries: the "
                    "ledger was deleted, so no release may run until a budget is set again "
                    "('secure-release-curator budget set --keystore K --data FILE --epsilon E')"
                )
            return PrivacyLedger(), True
        lines = self.path.read_bytes().decode("utf-8", errors="replace").split("\n")
        clean = lines[-1] == ""
        if not clean and len(lines) - 1 >= (head.count if head is not None else 0):
            lines = lines[:-1]  # drop the torn tail
        return PrivacyLedger.from_lines(lines, head), clean

    def read(self) -> PrivacyLedger:
        """The verified ledger (under the lock)."""
        with self._locked():
            return self._read()[0]

    def _append(self, ledger: PrivacyLedger, entry: LedgerEntry, clean: bool) -> None:
        ledger.append(entry)
        if not clean:  # rewrite the verified history without the torn tail
            atomic_write(self.path, ("\n".join(e.to_json() for e in ledger.entries) + "\n").encode())
        else:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (entry.to_json() + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        atomic_write(self.head_path, ledger.head().to_json().encode())

    def update(self, decide: Callable[[PrivacyLedger], LedgerEntry | None]) -> tuple[PrivacyLedger, LedgerEntry | None]:
        """Under the lock: read and verify, ``decide`` the next entry (None: nothing to add; it
        may raise to refuse), append it durably. Returns the ledger after it and the entry."""
        with self._locked():
            ledger, clean = self._read()
            entry = decide(ledger)
            if entry is not None:
                self._append(ledger, entry, clean)
            return ledger, entry

    def reset_after_deletion(self) -> None:
        """Start a new history when ``ledger.jsonl`` was deleted (its stale head goes too).
        A ledger that exists but does not verify is never reset here."""
        with self._locked():
            if not self.path.exists() and self.head_path.exists():
                os.unlink(self.head_path)

    def set_budget(
        self, dataset: str, name: str, epsilon: float, policy: AccountingPolicy | None = None
    ) -> LedgerEntry:
        """Append a budget entry (a deleted ledger starts a new history); ``policy``: the PLD
        accounting policy fixed with it (``accounting.pld_policy``)."""
        self.reset_after_deletion()
        _, entry = self.update(lambda led: led.set_budget(dataset, name, epsilon, time.time(), policy))
        assert entry is not None
        return entry
