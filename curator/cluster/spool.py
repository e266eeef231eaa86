"""The leader's spool files, as its matcher and (on a cluster that shares this host's files) its
workers read them: a follower's part of a shard is two files, ``.tags`` (each tag as it came, 16
bytes) and ``.rows`` (each tag's row in the follower's stream, uint32). No grpc, no engine: a
worker task imports this."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.alignment import sharding as sh
from secure_release.mechanism.alignment.keyed_hash import TAG_BYTES, TAG_DTYPE, TagArray
from secure_release.mechanism.errors import SecureReleaseError


class SpoolError(SecureReleaseError):
    """A match needs follower tags the spool no longer holds (a shard's are removed once its
    units are matched: a worker that lost a match after that cannot recompute it)."""


def suffixed(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def read_spool(path: Path, start: int, stop: int) -> tuple[TagArray, npt.NDArray[np.uint32]]:
    """Records ``start`` to ``stop`` of a follower's part of a shard: the tags and their stream
    indices, as many of them as both files hold whole (none if the files are gone)."""
    parts = []
    for suffix, size in ((".tags", TAG_BYTES), (".rows", 4)):
        try:
            with suffixed(path, suffix).open("rb") as fh:
                fh.seek(size * start)
                parts.append(fh.read(size * (stop - start)))
        except FileNotFoundError:
            parts.append(b"")
    count = min(len(parts[0]) // TAG_BYTES, len(parts[1]) // 4)
    return np.frombuffer(parts[0], TAG_DTYPE, count), np.frombuffer(parts[1], "<u4", count)


@dataclass(frozen=True)
class SpoolRange:
    """Where one unit's tags of one follower are: records ``start`` to ``stop`` of the shard's
    files ``path`` (an ascending part's run), or (``unit`` given) those of them whose top
    ``bits`` bits are ``unit`` (all the part wrote, if it did not ascend)."""

    path: str
    start: int
    stop: int
    unit: int | None = None
    bits: int = 0

    def read(self) -> tuple[TagArray, npt.NDArray[np.uint32]]:
        """The unit's tags and rows; :class:`SpoolError` if the spool no longer holds them all
        (never a match against fewer tags than arrived)."""
        path = Path(self.path)
        tags, rows = read_spool(path, self.start, self.stop)
        if tags.size != self.stop - self.start:
            raise SpoolError(
                f"the leader's spool {path.name} holds {tags.size} of the {self.stop - self.start} tags a match needs "
                "(a shard's tags are removed once it is matched: a worker that lost its match cannot redo it); "
                "start the release again"
            )
        if self.unit is None:
            return tags, rows
        inside = np.flatnonzero(sh.in_unit(tags, self.unit, self.bits))
        return tags[inside], rows[inside]
