"""The leader's PSI mailbox: every ring list of one release, as slices (issue 41).

A list is the owner's blinded points after some hops. The owner fixes its slices at hop 1: slice
``i`` of ``slices`` is points ``first .. first + count - 1`` of a list of ``total`` points (a list
sent whole is one slice). Every later hop of that owner's list has the same slices. A curator on a
cluster sends and receives a slice at a time, so nobody holds a whole list. A curator in one
process sends and receives whole lists, and the mailbox joins or splits them, so the two kinds of
curator can share one ring.

The slices are kept in memory, or in files under ``directory`` (0700; one file per slice, 0600,
written to a temporary name and renamed, so a reader never sees half a slice). With files, the
leader holds no list: at 10^7 ids a list is 330 MB, and a ring of two keeps four of them. A slice
sent again must be identical (a follower restarted with its kept scalar resends exactly what it
sent before); anything else is a :class:`PsiStreamError` and the caller fails the release.

**Kept for a restart (issue 47).** The files outlive the leader's process: a leader killed during
the ring and run again with the same flags opens the same directory and takes every slice found
there (:meth:`PsiMailbox.kept`), with the public key each follower's re-blindings were pinned to;
with the scalar it kept in its keystore it resends identical lists, so neither it nor its
followers start over. Each file carries a header (owner, hop, slice shape, SHA-256 of its points)
checked when the directory is opened again: a temporary file left by a kill, or a file that is
short, altered or does not fit the owner's slices, is removed and ignored (its sender's resend
fills the gap).

Security note: the kept mailbox holds blinded group points only (H(id) raised to one or more
curators' secret scalars; never an id, a tag or a scalar), the owner's curator name, hop and
slice bounds, and the followers' public re-blinding keys: the lists the leader's process held in
memory before, no more. Points under a follower's scalar say nothing about any id without it;
together with the leader's own kept scalar (beside it in the keystore) they show at most which
of the leader's own rows the follower holds, which the leader learns in the protocol anyway and
its persisted agreement records. It lives in the leader's keystore directory,
``<keystore>/psi-mailbox-<release>/`` (the directory 0700, each file 0600, links and other users'
files refused), so only the leader's own user (and root) can read it. On disk it costs 33 bytes a
point and list, plus about 100 bytes a slice: at N curators each owner's list at its N hops, N * N
lists (a ring of two keeps four: 1.3 GB at 10^7 ids a curator). It is deleted once the leader
saves its release record sealed (every curator then has its own record and never runs the ring
again), or when the release is dropped or aborted (``Keystore.drop_record``: the failure path,
``release abort``); a leader whose run ends with an error and no abort keeps it, as a follower
keeps its scalar, so a rerun resumes.

Pure state and files: no RPC, no locking (the leader's condition variable guards every call).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from secure_release.infra.fileio import UnsafePathError, open_nofollow, private_dir
from secure_release.infra.streams import PsiStreamError
from secure_release.mechanism.alignment.psi import POINT_BYTES

#: Slices a list may have at most (a file each at a leader on a cluster): at the default 65,536
#: points a slice, 4 * 10^9 points.
MAX_SLICES = 1 << 16
#: A kept slice file: this magic, then hop, index, slices, first, count, total (6 x uint64 LE),
#: the owner's name (uint16 LE length, UTF-8), the points' SHA-256, then the points.
MAGIC = b"SRPSIMB1"
_FIXED = struct.Struct("<6QH")
_DIGEST = 32
SLICE_SUFFIX = ".pts"
PIN_SUFFIX = ".pub"
TEMP_SUFFIX = ".part"


@dataclass(frozen=True)
class SliceShape:
    """Where one slice lies in its list: slice ``index`` of ``slices``, points ``first`` ..
    ``first + count - 1`` of a list of ``total`` points."""

    index: int
    slices: int
    first: int
    count: int
    total: int

    def check(self) -> SliceShape:
        """This shape, or :class:`PsiStreamError` if it cannot lie in its list: a slice holds at
        least one point (an empty list is one empty slice), a list at most :data:`MAX_SLICES`."""
        if not 1 <= self.slices <= MAX_SLICES:
            raise PsiStreamError(f"a PSI list has 1 to {MAX_SLICES} slices, not {self.slices}")
        if not (0 <= self.index < self.slices and self.first >= 0 and (self.count >= 1 or self.total == 0)
                and self.first + self.count <= self.total):  # fmt: skip
            raise PsiStreamError(
                f"PSI slice {self.index} of {self.slices} (points {self.first} .. {self.first + self.count - 1} "
                f"of {self.total}) does not lie in its list"
            )
        return self

    @property
    def wire(self) -> tuple[int, int, int, int]:
        """(index, slices, first point, points of the list): how a PsiChunk carries it."""
        return self.index, self.slices, self.first, self.total


def from_wire(wire: tuple[int, int, int, int], count: int) -> SliceShape:
    """The shape a PsiChunk announced (``wire``) for a slice of ``count`` points."""
    index, slices, first, total = wire
    return SliceShape(index, slices, first, count, total).check()


def whole_shape(count: int) -> SliceShape:
    """The shape of a list sent whole: its one slice."""
    return SliceShape(0, 1, 0, count, count)


class PsiMailbox:
    """Every ring list of one release, slice by slice (module doc). ``directory``: keep the
    points in files there (created 0700, removed by :meth:`close`); what a killed run left there
    is taken again (:attr:`kept`, :attr:`ignored`); None: in memory."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self._memory: dict[tuple[str, int, int], bytes] = {}
        self._stored: set[tuple[str, int, int]] = set()
        self.shapes: dict[str, dict[int, SliceShape]] = {}  # owner -> slice -> its shape (fixed at hop 1)
        self.slice_counts: dict[str, int] = {}  # owner -> its list's slices
        self.totals: dict[str, int] = {}  # owner -> points of its list
        self.pins: dict[str, bytes] = {}  # sender -> the public key its re-blindings are proved against
        self.kept = 0  # slices a killed run of the leader left here, taken again
        self.ignored = 0  # files found here and removed (a temporary file, a torn or altered slice)
        if directory is not None:
            private_dir(directory)
            self._reopen()

    # ---------------------------------------------------------------------------- shapes
    def admit(self, owner: str, hop: int, shape: SliceShape) -> None:
        """:class:`PsiStreamError` unless a slice of this shape may be stored for ``owner`` at
        ``hop``: at hop 1 it agrees with the owner's slices so far (their number, the list's
        size, no overlap with another slice); later, the owner's hop-1 slice of that index
        arrived and has this shape."""
        shape.check()
        known = self.shapes.get(owner, {})
        if hop == 1:
            fixed_list = (self.slice_counts.get(owner), self.totals.get(owner))
            if owner in self.slice_counts and fixed_list != (shape.slices, shape.total):
                raise PsiStreamError(
                    f"{owner!r}'s PSI list has {fixed_list[0]} slices of {fixed_list[1]} points in all; "
                    f"a slice says {shape.slices} and {shape.total}"
                )
            held = known.get(shape.index)
            if held is not None and held != shape:
                raise PsiStreamError(f"{owner!r}'s PSI slice {shape.index} was sent before with other bounds")
            if held is None and any(
                s.first < shape.first + shape.count and shape.first < s.first + s.count for s in known.values()
            ):
                raise PsiStreamError(f"{owner!r}'s PSI slice {shape.index} overlaps another of its slices")
            return
        fixed = known.get(shape.index)
        if fixed is None or not self.has(owner, hop - 1, shape.index):
            raise PsiStreamError(f"{owner!r}'s PSI slice {shape.index} at hop {hop} came before its hop {hop - 1}")
        if fixed != shape:
            raise PsiStreamError(f"{owner!r}'s PSI slice {shape.index} at hop {hop} has other bounds than at hop 1")

    def shape(self, owner: str, index: int) -> SliceShape | None:
        """The shape of ``owner``'s slice ``index`` (None until it arrived at hop 1)."""
        return self.shapes.get(owner, {}).get(index)

    def complete(self, owner: str, hop: int) -> bool:
        """Every slice of ``owner``'s list at ``hop`` arrived (and the slices tile the list)."""
        count = self.slice_counts.get(owner)
        if count is None or not all(self.has(owner, hop, i) for i in range(count)):
            return False
        return sum(s.count for s in self.shapes[owner].values()) == self.totals[owner]

    # ---------------------------------------------------------------------------- points
    def has(self, owner: str, hop: int, index: int) -> bool:
        return (owner, hop, index) in self._stored

    def stored_keys(self) -> list[tuple[str, int, int]]:
        """Every slice held, as (owner, hop, slice index), sorted."""
        return sorted(self._stored)

    def put(self, owner: str, hop: int, shape: SliceShape, points: bytes) -> bool:
        """Store one slice (after :meth:`admit`); False if it was stored before, identical.
        :class:`PsiStreamError` if its points are not ``shape.count`` points, or differ from
        those stored before."""
        self.admit(owner, hop, shape)
        if len(points) != shape.count * POINT_BYTES:
            raise PsiStreamError(
                f"PSI slice {shape.index} announced {shape.count} points and holds {len(points)} bytes"
            )
        key = (owner, hop, shape.index)
        if key in self._stored:
            if self.get(owner, hop, shape.index) != points:
                raise PsiStreamError(
                    f"the PSI slice {shape.index} of {owner!r} at hop {hop} was resent with other points"
                )
            return False
        if self.directory is None:
            self._memory[key] = bytes(points)
        else:
            self._write(self._path(key), _header(owner, hop, shape, points), points)
        self._note(owner, hop, shape)
        return True

    def _note(self, owner: str, hop: int, shape: SliceShape) -> None:
        self._stored.add((owner, hop, shape.index))
        if hop == 1:
            self.shapes.setdefault(owner, {})[shape.index] = shape
            self.slice_counts[owner], self.totals[owner] = shape.slices, shape.total

    def pin(self, sender: str, public: bytes) -> bytes:
        """The public key ``sender``'s re-blindings are proved against: the one it sent with its
        first re-blinded list (kept with the slices, so a restarted leader holds it to the same
        key), pinned now if it has none."""
        held = self.pins.get(sender)
        if held is not None:
            return held
        if self.directory is not None:
            self._write(self.directory / f"pin-{_safe(sender)}{PIN_SUFFIX}", b"", public)
        self.pins[sender] = bytes(public)
        return self.pins[sender]

    def _write(self, path: Path, header: bytes, points: bytes) -> None:
        """``header`` and ``points`` to ``path`` (0600) by a temporary name, renamed: a kill
        leaves the old file, or none, or a temporary file the next open removes."""
        part = path.with_name(path.name + TEMP_SUFFIX)
        fd = open_nofollow(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "wb") as fh:
            fh.write(header)
            fh.write(points)
        os.replace(part, path)

    def get(self, owner: str, hop: int, index: int) -> bytes | None:
        """The points of one slice (None until it arrived)."""
        key = (owner, hop, index)
        if key not in self._stored:
            return None
        if self.directory is None:
            return self._memory[key]
        fd = open_nofollow(self._path(key), os.O_RDONLY, None)
        with os.fdopen(fd, "rb") as fh:
            fixed = fh.read(len(MAGIC) + _FIXED.size)
            fh.seek(len(fixed) + _FIXED.unpack_from(fixed, len(MAGIC))[-1] + _DIGEST)
            return fh.read()

    def whole(self, owner: str, hop: int) -> bytes | None:
        """``owner``'s whole list at ``hop``, its slices joined (None until every slice arrived)."""
        if not self.complete(owner, hop):
            return None
        return b"".join(self.get(owner, hop, i) or b"" for i in range(self.slice_counts[owner]))

    def split(self, owner: str, points: bytes) -> list[tuple[SliceShape, bytes]]:
        """A whole list of ``owner`` cut into its slices (its hop-1 shapes); :class:`PsiStreamError`
        if its size is not the owner's."""
        total = self.totals.get(owner)
        if total is None or len(points) != total * POINT_BYTES:
            raise PsiStreamError(f"a PSI list of {owner!r} holds {len(points) // POINT_BYTES} points, its list {total}")
        shapes = [self.shapes[owner][i] for i in range(self.slice_counts[owner])]
        return [(s, points[s.first * POINT_BYTES : (s.first + s.count) * POINT_BYTES]) for s in shapes]

    def _path(self, key: tuple[str, int, int]) -> Path:
        assert self.directory is not None
        return self.directory / _slice_name(*key)

    # ---------------------------------------------------------------------------- a restart
    def _reopen(self) -> None:
        """Take what a killed run left in the directory: every slice whose header and digest
        check and that fits its owner's slices (hop by hop, as :meth:`put` admits them), and the
        pinned public keys; every other file there is removed (:attr:`ignored`)."""
        assert self.directory is not None
        found: list[tuple[int, str, SliceShape, Path]] = []
        for path in sorted(self.directory.iterdir()):
            slice_ = _read_slice(path) if path.name.endswith(SLICE_SUFFIX) else None
            if slice_ is not None and path.name == _slice_name(slice_[1], slice_[0], slice_[2].index):  # named as kept
                found.append((slice_[0], slice_[1], slice_[2], path))
                continue
            pin = _read_pin(path)
            if pin is not None:
                self.pins[path.name[len("pin-") : -len(PIN_SUFFIX)]] = pin
            else:
                self._discard(path)
        for hop, owner, shape, path in sorted(found, key=lambda f: (f[0], f[1], f[2].index)):
            try:
                self.admit(owner, hop, shape)
            except PsiStreamError:  # its earlier hop was ignored, or it contradicts the owner's slices
                self._discard(path)
                continue
            self._note(owner, hop, shape)
            self.kept += 1

    def _discard(self, path: Path) -> None:
        self.ignored += 1
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Drop every list (the files too: the kept mailbox is gone)."""
        self._memory.clear()
        self._stored.clear()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def _safe(name: str) -> str:
    """A curator name as part of a file name (names are checked at the service; this refuses a
    path separator whatever the caller)."""
    if not name or "/" in name or "\0" in name or name.startswith("."):
        raise PsiStreamError(f"{name!r} cannot name a PSI mailbox file")
    return name


def _slice_name(owner: str, hop: int, index: int) -> str:
    """The file of ``owner``'s slice ``index`` at ``hop``."""
    return f"{_safe(owner)}-{hop}-{index:06d}{SLICE_SUFFIX}"


def _read_pin(path: Path) -> bytes | None:
    """A pinned public key file's key (a group point), or None if ``path`` is none."""
    if not (path.name.startswith("pin-") and path.name.endswith(PIN_SUFFIX) and _is_file(path)):
        return None
    with contextlib.suppress(OSError, UnsafePathError):
        raw = _read(path)
        return raw if len(raw) == POINT_BYTES else None
    return None


def _header(owner: str, hop: int, shape: SliceShape, points: bytes) -> bytes:
    name = owner.encode()
    fixed = _FIXED.pack(hop, shape.index, shape.slices, shape.first, shape.count, shape.total, len(name))
    return MAGIC + fixed + name + hashlib.sha256(points).digest()


def _is_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _read(path: Path) -> bytes:
    fd = open_nofollow(path, os.O_RDONLY, None)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _read_slice(path: Path) -> tuple[int, str, SliceShape] | None:
    """(hop, owner, shape) of a kept slice file, or None if it is no whole, unaltered slice
    (a torn or truncated file, another file, a link, another user's file)."""
    if not _is_file(path):
        return None
    with contextlib.suppress(OSError, UnsafePathError, ValueError, struct.error, PsiStreamError):
        raw = _read(path)
        if not raw.startswith(MAGIC):
            return None
        hop, index, slices, first, count, total, size = _FIXED.unpack_from(raw, len(MAGIC))
        at = len(MAGIC) + _FIXED.size
        owner = raw[at : at + size].decode()
        digest, points = raw[at + size : at + size + _DIGEST], raw[at + size + _DIGEST :]
        shape = SliceShape(index, slices, first, count, total).check()
        _safe(owner)
        if hop >= 1 and len(points) == count * POINT_BYTES and hashlib.sha256(points).digest() == digest:
            return hop, owner, shape
    return None
