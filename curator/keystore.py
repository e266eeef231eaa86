"""A curator's secrets on disk: release pads/keys and the privacy ledger.

Every file is written atomically (temporary file in the same directory, fsync, rename, fsync
of the directory) with mode 0600; the directory itself is 0700. The ledger is a pure value
(:class:`~secure_release.mechanism.ledger.PrivacyLedger`): a run loads it once, checks and
charges it in memory and saves it back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from secure_release.infra.fileio import atomic_write
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.keys import PadKey
from secure_release.mechanism.ledger import PrivacyLedger
from secure_release.mechanism.pads import CipherMode, ReleasePad

LEDGER_FILE = "ledger.json"


class KeystoreError(SecureReleaseError):
    """The keystore is unreadable or a release is missing."""


def _safe(release_id: str) -> str:
    if not release_id or any(c in release_id for c in "/\\\0") or release_id.startswith("."):
        raise KeystoreError(f"release id {release_id!r} is not a safe file name")
    return release_id


class Keystore:
    """Directory of ``ledger.json`` and ``release-<id>.json`` files, all 0600."""

    def __init__(self, directory: str | Path, budget: float = 1.0) -> None:
        """Open (or create, mode 0700) ``directory``; ``budget`` is a new ledger's budget."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        self.default_budget = budget

    # ------------------------------------------------------------ ledger
    def load_ledger(self) -> PrivacyLedger:
        """The stored ledger (an empty one at the default budget if none is stored yet)."""
        path = self.directory / LEDGER_FILE
        if not path.exists():
            return PrivacyLedger(self.default_budget)
        try:
            return PrivacyLedger.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise KeystoreError(f"{path}: unreadable ledger ({exc})") from exc

    def save_ledger(self, ledger: PrivacyLedger) -> None:
        """Persist ``ledger`` atomically (0600)."""
        atomic_write(self.directory / LEDGER_FILE, json.dumps(ledger.to_dict(), indent=1).encode())

    # ------------------------------------------------------------ pads
    def save_pad(self, release_id: str, pad: ReleasePad, extra: dict[str, Any] | None = None) -> None:
        """Persist a release's pad key (chacha20) or pad symbols (otp) before its upload."""
        record: dict[str, Any] = {
            "release_id": release_id,
            "mode": pad.mode.value,
            "alphabet_size": pad.alphabet_size,
            "length": pad.length,
            **(extra or {}),
        }
        if pad.key is not None:
            record["chacha20_key"] = pad.key.reveal().hex()
        else:
            assert pad.pad_symbols is not None
            record["otp_pad"] = np.asarray(pad.pad_symbols, dtype="<u4").tobytes().hex()
        atomic_write(self.directory / f"release-{_safe(release_id)}.json", json.dumps(record).encode())

    def load_pad(self, release_id: str) -> tuple[ReleasePad, dict[str, Any]]:
        """A stored pad and its record (for a restart that resumes a release)."""
        path = self.directory / f"release-{_safe(release_id)}.json"
        if not path.exists():
            raise KeystoreError(f"no pad stored for release {release_id!r}")
        record = json.loads(path.read_text())
        mode = CipherMode(record["mode"])
        if mode is CipherMode.CHACHA20:
            pad = ReleasePad(
                mode,
                record["alphabet_size"],
                record["length"],
                key=PadKey(bytes.fromhex(record["chacha20_key"])),
            )
        else:
            syms = np.frombuffer(bytes.fromhex(record["otp_pad"]), dtype="<u4").astype(np.uint32)
            pad = ReleasePad(mode, record["alphabet_size"], record["length"], pad_symbols=syms)
        return pad, record
