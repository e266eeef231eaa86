"""The privacy ledger on disk: ``ledger.jsonl`` (one hash-chained entry a line, append-only),
``ledger.head`` (count and last digest, signed with the curator's key when it has one, replaced
atomically) and ``ledger.lock`` (fcntl lock).

Every read-decide-append runs under an exclusive ``flock`` so concurrent processes serialize. An
entry is acknowledged once the head covers it: the entry is appended and fsynced, then the head
moves. Entries past the head (a crash in between, a write that failed for lack of space, or
lines someone appended) are never counted and are cut on the next write, so a failed write leaves
no charge. A history shorter than its head, an entry that does not validate or chain, or (with a
signing key) a head not signed by it is refused (:class:`LedgerTamperedError`). No path here is
followed through a symbolic link. A data set is keyed by its name; :func:`file_fingerprint`
(SHA-256 of the table file, streamed; a directory's: ``curator.partitions.dataset_fingerprint``) is
recorded with each release.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.infra.fileio import (
    atomic_write,
    disk_full_as_error,
    open_nofollow,
    private_dir,
    read_nofollow,
)
from secure_release.mechanism.privacy.accounting import AccountingPolicy
from secure_release.mechanism.privacy.ledger import (
    LedgerEntry,
    LedgerHead,
    LedgerTamperedError,
    NoBudgetError,
    PrivacyLedger,
)

__all__ = ["LedgerFile", "file_fingerprint", "private_dir"]

LEDGER_FILE = "ledger.jsonl"
HEAD_FILE = "ledger.head"
LOCK_FILE = "ledger.lock"


def file_fingerprint(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    with Path(path).open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


class LedgerFile:
    """One keystore's ledger files; ``signer``: the key that signs and verifies the head (None:
    an unsigned head, as in insecure mode)."""

    def __init__(self, directory: str | Path, signer: HeadSigner | None = None) -> None:
        """The ledger in ``directory`` (created 0700 if missing; a link or another user's
        directory is refused)."""
        self.directory = private_dir(Path(directory))
        self.path = self.directory / LEDGER_FILE
        self.head_path = self.directory / HEAD_FILE
        self.signer = signer

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with disk_full_as_error(str(self.directory / LOCK_FILE)):
            fd = open_nofollow(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _head(self) -> LedgerHead | None:
        if not os.path.lexists(self.head_path):
            return None
        head = LedgerHead.from_json(read_nofollow(self.head_path).decode("utf-8", errors="replace"))
        if self.signer is not None and not self.signer.verifies(head):
            raise LedgerTamperedError(
                f"{self.head_path} is not signed by this curator's key (id {self.signer.key_id}): the ledger was "
                "rewritten, replaced or written without --certs; restore it from a backup (see docs/privacy.md, "
                "'When the ledger is refused')"
            )
        return head

    def _read(self) -> tuple[PrivacyLedger, bool]:
        """The verified ledger, and whether the file is exactly its entries (False: lines past
        the head, left by a crash or a failed write and never acknowledged)."""
        head = self._head()
        if not os.path.lexists(self.path):
            if head is not None and head.count > 0:
                raise NoBudgetError(
                    f"{self.path} is missing although {self.head_path.name} records {head.count} entries: the "
                    "ledger was deleted, so no release may run until a budget is set again ('secure-release-curator "
                    "budget set --keystore K --data FILE --epsilon E', which carries over what the server's witness "
                    "knows was spent)"
                )
            return PrivacyLedger(), True
        raw = read_nofollow(self.path)
        if head is None and self.signer is not None and raw.strip():
            raise LedgerTamperedError(
                f"{self.path} holds entries but {self.head_path.name} is missing: a signed ledger always has a head"
            )
        lines = raw.decode("utf-8", errors="replace").split("\n")
        complete = lines[:-1]  # the last piece is "" or a torn line
        keep = complete if head is None else complete[: head.count]
        clean = len(keep) == len(complete) and lines[-1] == ""
        return PrivacyLedger.from_lines(keep, head), clean

    def read(self) -> PrivacyLedger:
        """The verified ledger (under the lock)."""
        with self._locked():
            return self._read()[0]

    def _append(self, ledger: PrivacyLedger, entry: LedgerEntry, clean: bool) -> None:
        """Append ``entry`` durably, then move the head; if either write fails, the file is cut
        back to what the old head covers (an entry past the head is never counted anyway)."""
        ledger.append(entry)
        with disk_full_as_error(f"the ledger entry {entry.seq} ({self.path})"):
            if not clean:  # rewrite the acknowledged history without what lies past the head
                atomic_write(self.path, ("\n".join(e.to_json() for e in ledger.entries) + "\n").encode())
                self._write_head(ledger)
                return
            fd = open_nofollow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            size = os.fstat(fd).st_size
            try:
                os.write(fd, (entry.to_json() + "\n").encode())
                os.fsync(fd)
                self._write_head(ledger)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                raise
            finally:
                os.close(fd)

    def _write_head(self, ledger: PrivacyLedger) -> None:
        head = ledger.head()
        atomic_write(self.head_path, (head if self.signer is None else self.signer.sign(head)).to_json().encode())

    def update(self, decide: Callable[[PrivacyLedger], LedgerEntry | None]) -> tuple[PrivacyLedger, LedgerEntry | None]:
        """Under the lock: read and verify, ``decide`` the next entry (None: nothing to add; it
        may raise to refuse), append it durably. Returns the ledger after it and the entry."""
        with self._locked():
            ledger, clean = self._read()
            entry = decide(ledger)
            if entry is not None:
                self._append(ledger, entry, clean)
            return ledger, entry

    def was_deleted(self) -> bool:
        """True if ``ledger.jsonl`` is gone but the head says it held entries."""
        with self._locked():
            if os.path.lexists(self.path) or not os.path.lexists(self.head_path):
                return False
            head = LedgerHead.from_json(read_nofollow(self.head_path).decode("utf-8", errors="replace"))
            return head.count > 0

    def reset_after_deletion(self) -> None:
        """Start a new history when ``ledger.jsonl`` was deleted (its stale head goes too).
        A ledger that exists but does not verify is never reset here."""
        with self._locked():
            if not os.path.lexists(self.path) and os.path.lexists(self.head_path):
                os.unlink(self.head_path)

    def adopt_unsigned(self) -> bool:
        """Sign the head of a ledger written without a key (the operator vouches for it, e.g.
        ``budget set`` with --certs after runs without). True if it was unsigned. A head signed
        by another key is never re-signed."""
        if self.signer is None:
            return False
        with self._locked():
            if not os.path.lexists(self.head_path):
                return False
            head = LedgerHead.from_json(read_nofollow(self.head_path).decode("utf-8", errors="replace"))
            if head.signature:
                return False
            signer, self.signer = self.signer, None
            try:
                ledger, _ = self._read()
            finally:
                self.signer = signer
            with disk_full_as_error(str(self.head_path)):
                atomic_write(self.head_path, signer.sign(ledger.head()).to_json().encode())
            return True

    def set_budget(
        self, dataset: str, name: str, epsilon: float, table: str = "", policy: AccountingPolicy | None = None
    ) -> LedgerEntry:
        """Append a budget entry (a deleted ledger starts a new history); ``policy``: the PLD
        accounting policy fixed with it (``accounting.pld_policy``)."""
        self.reset_after_deletion()
        _, entry = self.update(lambda led: led.set_budget(dataset, name, epsilon, time.time(), table, policy))
        assert entry is not None
        return entry
