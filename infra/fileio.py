"""Durable file writes shared by the role shells (keystore, PKI)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes | memoryview, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically with permissions ``mode``: a temporary file in the
    same directory, fsync, rename, then fsync of the directory. A crash leaves the old file or
    the new one, never a torn one, and the bytes never exist with looser permissions."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
