"""Durable file writes shared by the role shells (keystore, PKI)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from secure_release.mechanism.errors import SecureReleaseError


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


class MissingInputFileError(SecureReleaseError):
    """A file named on the command line does not exist, is not a file or cannot be read
    (usage: exit 2, naming the flag and the path)."""


def require_dir(path: str | Path, flag: str) -> Path:
    """``path`` if it names a directory; else :class:`MissingInputFileError` naming ``flag``."""
    target = Path(path)
    if target.is_dir():
        return target
    problem = "is not a directory" if target.exists() else "does not exist"
    raise MissingInputFileError(f"{flag} {path}: {problem}")


def require_file(path: str | Path, flag: str) -> Path:
    """``path`` if it names a readable file; else :class:`MissingInputFileError` naming ``flag``
    and the path as typed (one line, no errno)."""
    target = Path(path)
    if not target.exists():
        problem = "does not exist"
    elif not target.is_file():
        problem = "is not a file"
    elif not os.access(target, os.R_OK):
        problem = "cannot be read (permission denied)"
    else:
        return target
    raise MissingInputFileError(f"{flag} {path}: {problem}")
