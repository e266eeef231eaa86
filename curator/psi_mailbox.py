"""The leader's PSI mailbox: every ring list of one release, as slices (issue 41).

A list is the owner's blinded points after some hops. The owner fixes its slices at hop 1: slice
``i`` of ``slices`` is points ``first .. first + count - 1`` of a list of ``total`` points (a list
sent whole is one slice). Every later hop of that owner's list has the same slices. A curator on a
cluster sends and receives a slice at a time, so nobody holds a whole list. A curator in one
process sends and receives whole lists, and the mailbox joins or splits them, so the two kinds of
curator can share one ring.

The slices are kept in memory, or in files under ``directory`` (0700; one file per slice,
written to a temporary name and renamed, so a reader never sees half a slice). With files, the
leader holds no list: at 10^7 ids a list is 330 MB, and a ring of two keeps four of them. A slice
sent again must be identical (a follower restarted with its kept scalar resends exactly what it
sent before); anything else is a :class:`PsiStreamError` and the caller fails the release.

Pure state and files: no RPC, no locking (the leader's condition variable guards every call).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from secure_release.infra.streams import PsiStreamError
from secure_release.mechanism.alignment.psi import POINT_BYTES

#: Slices a list may have at most (a file each at a leader on a cluster): at the default 65,536
#: points a slice, 4 * 10^9 points.
MAX_SLICES = 1 << 16


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
    points in files there (created 0700, removed by :meth:`close`); None: in memory."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        if directory is not None:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            directory.chmod(0o700)
        self._memory: dict[tuple[str, int, int], bytes] = {}
        self._stored: set[tuple[str, int, int]] = set()
        self.shapes: dict[str, dict[int, SliceShape]] = {}  # owner -> slice -> its shape (fixed at hop 1)
        self.slice_counts: dict[str, int] = {}  # owner -> its list's slices
        self.totals: dict[str, int] = {}  # owner -> points of its list

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
            path = self._path(key)
            part = path.with_suffix(".part")
            with part.open("wb") as fh:
                fh.write(points)
            os.replace(part, path)
        self._stored.add(key)
        if hop == 1:
            self.shapes.setdefault(owner, {})[shape.index] = shape
            self.slice_counts[owner], self.totals[owner] = shape.slices, shape.total
        return True

    def get(self, owner: str, hop: int, index: int) -> bytes | None:
        """The points of one slice (None until it arrived)."""
        key = (owner, hop, index)
        if key not in self._stored:
            return None
        return self._memory[key] if self.directory is None else self._path(key).read_bytes()

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
        owner, hop, index = key
        return self.directory / f"{owner}-{hop}-{index:06d}.pts"

    def close(self) -> None:
        """Drop every list (the files too)."""
        self._memory.clear()
        self._stored.clear()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
