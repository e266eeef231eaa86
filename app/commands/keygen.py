"""``secure-release keygen alignment FILE``: the curators' shared alignment key (64 hex digits, 0600)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from secure_release.mechanism.errors import ErrorKind, SecureReleaseError
from secure_release.mechanism.primitives.keys import AlignmentKey


class KeyFileExistsError(SecureReleaseError):
    """The key file exists already; a new key would break the curators' shared alignment."""

    kind = ErrorKind.ALREADY_EXISTS


def register(sub: Any) -> None:
    p = sub.add_parser(
        "keygen",
        help="create the alignment key file the curators share (0600)",
        description=(
            "Create a fresh 256-bit alignment key: every curator keys the hash of its ids with it, so "
            "the curators can match records without showing ids to anyone. Give the same file to every "
            "curator over a channel you trust; never to the server, the researcher or an analyst."
        ),
        epilog="Example: secure-release keygen alignment align.key",
    )
    ksub = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    a = ksub.add_parser("alignment", help="the curators' shared alignment key")
    a.add_argument("file", type=Path, metavar="FILE", help="where to write it (must not exist)")
    a.add_argument("--force", action="store_true", help="replace an existing file (curators must all get the new one)")
    a.set_defaults(func=run)


def write_key_file(path: Path, force: bool = False) -> None:
    """Write a fresh key as 64 hex digits with mode 0600 (never wider, not even for a moment)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise KeyFileExistsError(f"{path} exists; keep it, or pass --force to replace it everywhere") from None
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (AlignmentKey.generate().reveal().hex() + "\n").encode())
    finally:
        os.close(fd)


def run(args: argparse.Namespace) -> int:
    write_key_file(args.file, args.force)
    sys.stderr.write(f"wrote {args.file} (0600): give it to every curator, and to nobody else\n")
    return 0
