"""The leader's PSI mailbox: the ring lists of one release still to be read, as slices (issues 41, 49).

A list is the owner's blinded points after some hops. The owner fixes its slices at hop 1: slice
``i`` of ``slices`` is points ``first .. first + count - 1`` of a list of ``total`` points (a list
sent whole is one slice). Every later hop of that owner's list has the same slices. A curator on a
cluster sends and receives a slice at a time, so nobody holds a whole list. A curator in one
process sends and receives whole lists, and the mailbox joins or splits them, so the two kinds of
curator can share one ring.

The slices are kept in memory, or in files under ``directory`` (0700; one file per slice, 0600,
written to a temporary name and renamed, so a reader never sees half a slice). With files, the
leader holds no list: at 10^7 ids a list is 330 MB. A slice sent again must be identical (a
follower restarted with its kept scalar resends exactly what it sent before); anything else is a
:class:`PsiStreamError` and the caller fails the release.

**Deleted once passed on (issue 49).** A list at hop h is read by the one curator it is routed
to, which re-blinds it into hop h + 1 (the leader checks each slice of hop h + 1 against the same
slice of hop h as it arrives); the last hop is read by its owner, which turns it into tags. So
every slice of a list is deleted as soon as every slice of its next hop is stored
(:meth:`PsiMailbox.complete`), and a last hop (it has no next) is kept until the mailbox is. Not
slice by slice as the next hop's slices arrive: a curator in one process fetches and sends whole
lists, and if the leader is killed while it stores one, the curator sends it again and the
leader checks it against the whole list it was made from, which must still be there. A deleted
slice leaves its file as its header alone (owner, hop, bounds, the SHA-256 of its points; no
point). A hop-1 resend of it is compared by that digest (identical: a no-op; else the release
fails, as before); a curator that runs the ring again (restarted with its kept scalar, or
retrying a call the leader had answered) and asks for a deleted list, or sends a slice of the
hop made from it, is answered :class:`PsiListConsumedError` (ALREADY_EXISTS on the wire, not a
failure): that hop is complete at the leader, so it goes on to its next list. Nothing deleted
is stored again.

So the mailbox holds, of each owner's list, its last complete hop and the slices that have
arrived of the hops after it (each such hop no more slices than the one before it). Where a hop
is read only once it is complete (a curator in one process fetches whole lists; in a ring of two
the second hop is the last), that is at most 2 hops of each owner's list at once: **2N lists at
the peak, not N * N** (a ring of two: still 4, but only while the second hops arrive; then N
lists, the last hops, until the end; a ring of three: 6, not 9). Only in a ring of three or more
where a curator on a cluster re-blinds a list that another curator on a cluster is still sending
can a hop begin before the one before it is complete, and an owner's list then be held at more
hops at once, their slices trailing one another (at most its N hops, as before issue 49).

**Kept for a restart (issue 47).** The files outlive the leader's process: a leader killed during
the ring and run again with the same flags opens the same directory and takes every slice found
there (:meth:`PsiMailbox.kept`), with the public key each follower's re-blindings were pinned to;
with the scalar it kept in its keystore it resends identical lists, so neither it nor its
followers start over. Each file carries a header (owner, hop, slice shape, SHA-256 of its points)
checked when the directory is opened again (a deleted slice's header is taken too): a temporary
file left by a kill, or a file that is short, altered or does not fit the owner's slices, is
removed and ignored (its sender's resend fills the gap). A slice lost so whose hop before is
deleted could not be made again: the directory is then refused (:class:`PsiStreamError`), so the
release fails at once instead of waiting out ``--timeout``.

Security note: the kept mailbox holds blinded group points only (H(id) raised to one or more
curators' secret scalars; never an id, a tag or a scalar), the owner's curator name, hop and
slice bounds, and the followers' public re-blinding keys: the lists the leader's process held in
memory before, no more. Points under a follower's scalar say nothing about any id without it;
together with the leader's own kept scalar (beside it in the keystore) they show at most which
of the leader's own rows the follower holds, which the leader learns in the protocol anyway and
its persisted agreement records. It lives in the leader's keystore directory,
``<keystore>/psi-mailbox-<release>/`` (the directory 0700, each file 0600, links and other users'
files refused), so only the leader's own user (and root) can read it. On disk it costs 33 bytes a
point of each list held, plus about 100 bytes a slice (a deleted slice's header too): at most 2N
lists where no hop overlaps the one before (above), so a ring of two at 10^7 ids a curator peaks
at 1.3 GB (4 lists of 330 MB, while the second hops arrive) and holds 0.66 GB (the 2 last hops)
from then until the end; at 10^8, 13 GB at the peak, then 6.6 GB. It is deleted once the leader
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
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError

#: Slices a list may have at most (a file each at a leader on a cluster): at the default 65,536
#: points a slice, 4 * 10^9 points.
MAX_SLICES = 1 << 16
#: A kept slice file: this magic, then hop, index, slices, first, count, total (6 x uint64 LE),
#: the owner's name (uint16 LE length, UTF-8), the points' SHA-256, then the points.
MAGIC = b"SRPSIMB1"
#: A deleted slice's file: this magic, then the same header (its points' SHA-256 included), no point.
DELETED_MAGIC = b"SRPSIMD1"
_FIXED = struct.Struct("<6QH")
_DIGEST = 32
SLICE_SUFFIX = ".pts"
PIN_SUFFIX = ".pub"
TEMP_SUFFIX = ".part"


class PsiListConsumedError(SecureReleaseError):
    """The list asked for, or the one a slice sent was made from, was re-blinded and deleted: its
    next hop is complete at the leader (module doc). Not a failure: a curator that runs the ring
    again is told so and goes on to its next list."""

    kind = ErrorKind.ALREADY_EXISTS


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
    """The ring lists of one release still to be read, slice by slice (module doc).
    ``directory``: keep the points in files there (created 0700, removed by :meth:`close`); what
    a killed run left there is taken again (:attr:`kept`, :attr:`ignored`); None: in memory."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self._memory: dict[tuple[str, int, int], bytes] = {}
        self._stored: set[tuple[str, int, int]] = set()  # slices held, points and all
        self._digests: dict[tuple[str, int, int], bytes] = {}  # every slice arrived (held or deleted) -> SHA-256
        self.shapes: dict[str, dict[int, SliceShape]] = {}  # owner -> slice -> its shape (fixed at hop 1)
        self.slice_counts: dict[str, int] = {}  # owner -> its list's slices
        self.totals: dict[str, int] = {}  # owner -> points of its list
        self.pins: dict[str, bytes] = {}  # sender -> the public key its re-blindings are proved against
        self.kept = 0  # slices a killed run of the leader left here, taken again
        self.kept_deleted = 0  # ... and deleted slices' headers
        self.ignored = 0  # files found here and removed (a temporary file, a torn or altered slice)
        if directory is not None:
            private_dir(directory)
            self._reopen()

    # ---------------------------------------------------------------------------- shapes
    def admit(self, owner: str, hop: int, shape: SliceShape) -> None:
        """:class:`PsiStreamError` unless a slice of this shape may be stored for ``owner`` at
        ``hop``: at hop 1 it agrees with the owner's slices so far (their number, the list's
        size, no overlap with another slice); later, the owner's hop-1 slice of that index
        arrived and has this shape. :class:`PsiListConsumedError` if the slice it was made from
        (``hop - 1``) is deleted: ``hop`` is complete, this is a resend."""
        self._fits(owner, hop, shape)
        if hop > 1 and self.deleted(owner, hop - 1, shape.index):
            raise PsiListConsumedError(
                f"{owner!r}'s PSI list at hop {hop} is complete at the leader (its hop {hop - 1} was deleted): "
                f"slice {shape.index} is taken already"
            )

    def _fits(self, owner: str, hop: int, shape: SliceShape) -> None:
        """:meth:`admit` less the resend of a complete hop (as a restart takes the files)."""
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
        """Every slice of ``owner``'s list at ``hop`` arrived (and the slices tile the list; some
        or all of them may since be deleted)."""
        count = self.slice_counts.get(owner)
        if count is None or not all(self.has(owner, hop, i) for i in range(count)):
            return False
        return sum(s.count for s in self.shapes[owner].values()) == self.totals[owner]

    # ---------------------------------------------------------------------------- points
    def has(self, owner: str, hop: int, index: int) -> bool:
        """The slice arrived (it may since be deleted: :meth:`get` then says so)."""
        return (owner, hop, index) in self._digests

    def held(self, owner: str, hop: int, index: int) -> bool:
        """The slice arrived and is not deleted: its points are here."""
        return (owner, hop, index) in self._stored

    def deleted(self, owner: str, hop: int, index: int) -> bool:
        """The slice arrived and was deleted (its next hop is complete)."""
        key = (owner, hop, index)
        return key in self._digests and key not in self._stored

    def stored_keys(self) -> list[tuple[str, int, int]]:
        """Every slice held, as (owner, hop, slice index), sorted."""
        return sorted(self._stored)

    def deleted_keys(self) -> list[tuple[str, int, int]]:
        """Every slice deleted, as (owner, hop, slice index), sorted."""
        return sorted(self._digests.keys() - self._stored)

    def put(self, owner: str, hop: int, shape: SliceShape, points: bytes) -> bool:
        """Store one slice (after :meth:`admit`); False if it was stored before, identical (held
        or deleted: a deleted slice is not stored again). :class:`PsiStreamError` if its points
        are not ``shape.count`` points, or differ from those stored before. Every slice of the
        list ``hop - 1`` is deleted once this completes ``hop``."""
        self.admit(owner, hop, shape)
        if len(points) != shape.count * POINT_BYTES:
            raise PsiStreamError(
                f"PSI slice {shape.index} announced {shape.count} points and holds {len(points)} bytes"
            )
        key = (owner, hop, shape.index)
        digest = hashlib.sha256(points).digest()
        if key in self._digests:
            if self._digests[key] != digest:
                raise PsiStreamError(
                    f"the PSI slice {shape.index} of {owner!r} at hop {hop} was resent with other points"
                )
            return False
        if self.directory is None:
            self._memory[key] = bytes(points)
        else:
            self._write(self._path(key), _header(MAGIC, owner, hop, shape, digest), points)
        self._note(owner, hop, shape, digest)
        self._delete_before(owner, hop)
        return True

    def _note(self, owner: str, hop: int, shape: SliceShape, digest: bytes, held: bool = True) -> None:
        key = (owner, hop, shape.index)
        self._digests[key] = digest
        if held:
            self._stored.add(key)
        if hop == 1:
            self.shapes.setdefault(owner, {})[shape.index] = shape
            self.slice_counts[owner], self.totals[owner] = shape.slices, shape.total

    def _delete_before(self, owner: str, hop: int) -> None:
        """Delete every slice held of ``owner``'s list at ``hop - 1`` once ``hop`` is complete:
        its one reader re-blinded all of it (module doc). The file of a slice becomes its header
        (by a temporary name, renamed over it: a kill leaves the slice or its header)."""
        if hop < 2 or not self.complete(owner, hop):
            return
        for index in range(self.slice_counts[owner]):
            key = (owner, hop - 1, index)
            if key not in self._stored:
                continue
            if self.directory is None:
                del self._memory[key]
            else:
                self._write(self._path(key), _header(DELETED_MAGIC, owner, hop - 1, self.shapes[owner][index],
                                                     self._digests[key]), b"")  # fmt: skip
            self._stored.discard(key)

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
        """The points of one slice (None until it arrived; :class:`PsiListConsumedError` once
        deleted)."""
        key = (owner, hop, index)
        if key not in self._stored:
            if key in self._digests:
                raise _consumed(owner, hop)
            return None
        if self.directory is None:
            return self._memory[key]
        fd = open_nofollow(self._path(key), os.O_RDONLY, None)
        with os.fdopen(fd, "rb") as fh:
            fixed = fh.read(len(MAGIC) + _FIXED.size)
            fh.seek(len(fixed) + _FIXED.unpack_from(fixed, len(MAGIC))[-1] + _DIGEST)
            return fh.read()

    def whole(self, owner: str, hop: int) -> bytes | None:
        """``owner``'s whole list at ``hop``, its slices joined (None until every slice arrived;
        :class:`PsiListConsumedError` once deleted)."""
        if not self.complete(owner, hop):
            return None
        if any(self.deleted(owner, hop, i) for i in range(self.slice_counts[owner])):
            raise _consumed(owner, hop)
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
        """Take what a killed run left in the directory: every slice (or deleted slice's header)
        whose header and digest check and that fits its owner's slices (hop by hop, as
        :meth:`put` admits them), and the pinned public keys; every other file there is removed
        (:attr:`ignored`). A list whose next hop is complete is deleted now if a kill came
        between (:meth:`_delete_before`); :class:`PsiStreamError` if a slice is missing that
        could not be sent again (module doc)."""
        assert self.directory is not None
        found: list[tuple[int, str, SliceShape, bytes, bool, Path]] = []
        for path in sorted(self.directory.iterdir()):
            slice_ = _read_slice(path) if path.name.endswith(SLICE_SUFFIX) else None
            if slice_ is not None and path.name == _slice_name(slice_[1], slice_[0], slice_[2].index):  # named as kept
                found.append((*slice_, path))
                continue
            pin = _read_pin(path)
            if pin is not None:
                self.pins[path.name[len("pin-") : -len(PIN_SUFFIX)]] = pin
            else:
                self._discard(path)
        for hop, owner, shape, digest, held, path in sorted(found, key=lambda f: (f[0], f[1], f[2].index)):
            try:
                self._fits(owner, hop, shape)
            except PsiStreamError:  # its earlier hop was ignored, or it contradicts the owner's slices
                self._discard(path)
                continue
            self._note(owner, hop, shape, digest, held)
            if held:
                self.kept += 1
            else:
                self.kept_deleted += 1
        for owner, hop in sorted({(o, h) for o, h, _ in self._digests}):
            self._delete_before(owner, hop)
        for owner, hop, index in self.deleted_keys():
            if not self.complete(owner, hop + 1):
                raise PsiStreamError(
                    f"the kept PSI mailbox {self.directory} lacks part of {owner!r}'s list at hop {hop + 1}, and its "
                    f"hop {hop} (slice {index}) is deleted: it cannot be sent again, so the release cannot resume"
                )

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
        self._digests.clear()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def _consumed(owner: str, hop: int) -> PsiListConsumedError:
    return PsiListConsumedError(
        f"{owner!r}'s PSI list at hop {hop} was re-blinded and deleted: its hop {hop + 1} is complete at the leader"
    )


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


def _header(magic: bytes, owner: str, hop: int, shape: SliceShape, digest: bytes) -> bytes:
    name = owner.encode()
    fixed = _FIXED.pack(hop, shape.index, shape.slices, shape.first, shape.count, shape.total, len(name))
    return magic + fixed + name + digest


def _is_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _read(path: Path) -> bytes:
    fd = open_nofollow(path, os.O_RDONLY, None)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _read_slice(path: Path) -> tuple[int, str, SliceShape, bytes, bool] | None:
    """(hop, owner, shape, its points' SHA-256, held) of a kept slice file (held: its points
    are there; else the header of a deleted slice), or None if it is neither, whole and
    unaltered (a torn or truncated file, another file, a link, another user's file)."""
    if not _is_file(path):
        return None
    with contextlib.suppress(OSError, UnsafePathError, ValueError, struct.error, PsiStreamError):
        raw = _read(path)
        held = raw.startswith(MAGIC)
        if not held and not raw.startswith(DELETED_MAGIC):
            return None
        hop, index, slices, first, count, total, size = _FIXED.unpack_from(raw, len(MAGIC))
        at = len(MAGIC) + _FIXED.size
        owner = raw[at : at + size].decode()
        digest, points = raw[at + size : at + size + _DIGEST], raw[at + size + _DIGEST :]
        shape = SliceShape(index, slices, first, count, total).check()
        _safe(owner)
        if len(digest) != _DIGEST or hop < 1:
            return None
        if held and len(points) == count * POINT_BYTES and hashlib.sha256(points).digest() == digest:
            return hop, owner, shape, digest, True
        if not held and not points:
            return hop, owner, shape, digest, False
    return None
