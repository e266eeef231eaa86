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


def write_unit_rows(path: Path, rows: npt.NDArray[np.integer]) -> None:
    """A follower's rows of one matched unit (its row order's run, in canonical order) to
    ``path``, written to a temporary name beside it and renamed: as the differences of
    consecutive rows in the narrowest signed integer that holds them all (a header of one byte,
    its width, and eight, the count), zstd-compressed. A sharded follower's rows ascend (its tags were sent
    ascending), so the differences are mostly 1 or 2: a fraction of a byte a row on disk, not the
    4 of the rows themselves (3.6 GB at 9 * 10^8 common rows)."""
    import os
    import threading

    import pyarrow as pa

    steps = np.diff(np.asarray(rows, dtype=np.int64), prepend=np.int64(0))
    low, high = (int(steps.min()), int(steps.max())) if steps.size else (0, 0)
    width = next(w for w in (1, 2, 4, 8) if -(1 << (8 * w - 1)) <= low and high < 1 << (8 * w - 1))
    data = pa.Codec("zstd", compression_level=1).compress(steps.astype(f"<i{width}").tobytes(), asbytes=True)
    temp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    with open(os.open(temp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "wb") as fh:  # 0600 from the start
        fh.write(bytes([width]) + int(steps.size).to_bytes(8, "little") + data)
    os.replace(temp, path)


def read_unit_rows(path: Path, count: int | None = None) -> npt.NDArray[np.uint32]:
    """The rows :func:`write_unit_rows` left at ``path``; :class:`SpoolError` if the file does
    not hold exactly ``count`` (if given) or is not whole."""
    import pyarrow as pa

    try:
        data = path.read_bytes()
        width = data[0] if len(data) >= 9 and data[0] in (1, 2, 4, 8) else 0
        if not width:
            raise SpoolError(f"the leader's row order file {path.name} has no valid header")
        held = int.from_bytes(data[1:9], "little")
        if count is not None and held != count:
            raise SpoolError(f"the leader's row order file {path.name} holds {held} rows, not {count}")
        if held == 0:
            return np.zeros(0, dtype="<u4")
        raw = pa.Codec("zstd").decompress(data[9:], decompressed_size=width * held, asbytes=True)
        steps = np.frombuffer(raw, dtype=f"<i{width}").astype(np.int64)
    except (OSError, pa.ArrowException) as exc:
        raise SpoolError(f"the leader's row order file {path.name} cannot be read ({exc})") from None
    if steps.size != held:
        raise SpoolError(f"the leader's row order file {path.name} holds {steps.size} rows, not {held}")
    rows = np.cumsum(steps)
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= 1 << 32):
        raise SpoolError(f"the leader's row order file {path.name} holds a row outside 0 .. 2^32 - 1")
    return rows.astype("<u4")
