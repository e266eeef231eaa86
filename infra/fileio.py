"""Durable file writes shared by the role shells (keystore, PKI, ledger), and the checks that
keep them off planted links: no state path is followed through a symbolic link, and a state
directory must belong to the running user (:func:`private_dir`, :func:`open_nofollow`)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from secure_release.mechanism.errors import ErrorKind, SecureReleaseError

#: errno values that mean "no space left": the device or the user's quota is full.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFullError(SecureReleaseError):
    """A write failed for lack of space (ENOSPC, EDQUOT); nothing of it was kept."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


class UnsafePathError(SecureReleaseError):
    """A state path is a symbolic link, or a directory or file not owned by the running user."""

    kind = ErrorKind.FAILED_PRECONDITION


@contextlib.contextmanager
def disk_full_as_error(what: str) -> Iterator[None]:
    """Turn an ENOSPC/EDQUOT ``OSError`` raised inside into :class:`DiskFullError` naming ``what``."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(
                f"no space left while writing {what} ({os.strerror(exc.errno)}); nothing of it was kept: free "
                "space on that file system (or raise the quota) and run the command again"
            ) from exc
        raise


def check_owned(path: Path, st: os.stat_result, want_dir: bool) -> None:
    """:class:`UnsafePathError` unless ``st`` (an lstat) is a directory (``want_dir``) or a
    regular file owned by the running user; never a symbolic link."""
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symbolic link; state paths are never followed through links")
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        raise UnsafePathError(f"{path} is not a {'directory' if want_dir else 'regular file'}")
    if st.st_uid != os.geteuid():
        raise UnsafePathError(
            f"{path} belongs to user id {st.st_uid}, not to this user ({os.geteuid()}); a state path must be "
            "the running user's own"
        )


def private_dir(directory: Path, fix_mode: bool = True) -> Path:
    """Create ``directory`` (and parents) if needed and (``fix_mode``) make it 0700; refuse it if
    it is a link or not owned by the running user (the mode is set on the opened directory, never
    through a link; a new directory is created 0700 either way)."""
    directory = Path(directory)
    with contextlib.suppress(FileExistsError):
        directory.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(directory, 0o700)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            check_owned(directory, os.lstat(directory), want_dir=True)  # names what it is instead
        raise
    try:
        check_owned(directory, os.fstat(fd), want_dir=True)
        if fix_mode:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return directory


def open_nofollow(path: Path, flags: int, mode: int | None = 0o600) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (:class:`UnsafePathError`) and a file
    of another user; a file it creates gets ``mode``, an existing one is fchmod-ed to it (on the
    descriptor; ``None``: left as it is)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600 if mode is None else mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symbolic link; state paths are never followed through links") from exc
        raise
    try:
        check_owned(Path(path), os.fstat(fd), want_dir=False)
        if mode is not None:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_nofollow(path: Path) -> bytes:
    """The bytes of ``path``, refusing a symbolic link or another user's file."""
    fd = open_nofollow(path, os.O_RDONLY, None)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def atomic_write(path: Path, data: bytes | memoryview | Iterable[bytes], mode: int = 0o600) -> None:
    """Write ``data`` (bytes, or pieces of bytes written as they are made) to ``path``
    atomically with permissions ``mode``: a temporary file in the same directory, fsync, rename,
    then fsync of the directory. A crash leaves the old file or the new one, never a torn one,
    and the bytes never exist with looser permissions. A link planted at ``path`` is replaced,
    never followed; a full disk raises :class:`DiskFullError` and leaves the old file."""
    path = Path(path)
    with disk_full_as_error(str(path)):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as fh:
                if isinstance(data, bytes | bytearray | memoryview):
                    fh.write(data)
                else:
                    for piece in data:
                        fh.write(piece)
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
