"""The leader's spool files, as its matcher and (on a cluster that shares this host's files) its
workers read them: a follower's part of a shard is two files, ``.tags`` (each tag as it came, 16
bytes) and ``.rows`` (each tag's row in the follower's stream, uint32). No grpc, no engine: a
worker task imports this."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from secure_release.mechanism import sharding as sh
from secure_release.mechanism.alignment import TAG_DTYPE, TagArray

TAG_BYTES = TAG_DTYPE.itemsize


def suffixed(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def read_spool(path: Path, start: int = 0, stop: int | None = None) -> tuple[TagArray, npt.NDArray[np.uint32]]:
    """A follower's part of a shard as spooled so far (records ``start`` to ``stop``): the tags
    and their stream indices, as many records as both files hold whole (the stream may be
    appending to them)."""
    parts = []
    for suffix, size in ((".tags", TAG_BYTES), (".rows", 4)):
        file = suffixed(path, suffix)
        with contextlib.suppress(FileNotFoundError), file.open("rb") as fh:
            fh.seek(size * start)
            parts.append(fh.read(-1 if stop is None else size * (stop - start)))
            continue
        parts.append(b"")
    count = min(len(parts[0]) // TAG_BYTES, len(parts[1]) // 4)
    return np.frombuffer(parts[0], TAG_DTYPE, count), np.frombuffer(parts[1], "<u4", count)


@dataclass(frozen=True)
class SpoolRange:
    """Where one unit's tags of one follower are: records ``start`` to ``stop`` of the shard's
    files ``path`` (an ascending part's run), or (``unit`` given) the tags of the whole files
    whose top ``bits`` bits are ``unit`` (a part that did not ascend)."""

    path: str
    start: int = 0
    stop: int | None = None
    unit: int | None = None
    bits: int = 0

    def read(self) -> tuple[TagArray, npt.NDArray[np.uint32]]:
        tags, rows = read_spool(Path(self.path), self.start, self.stop)
        if self.unit is None:
            return tags, rows
        inside = np.flatnonzero(sh.top_bits(sh.tag_words(tags)[0], self.bits) == self.unit)
        return tags[inside], rows[inside]
