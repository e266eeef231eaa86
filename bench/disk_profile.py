"""Disk profile of a run: the bytes on disk under some directories over time, and a plot of it.

``DiskPoller`` is a thread that every ``interval`` seconds walks each named directory (recursive
``os.scandir``, symlinks not followed) and sums ``st_blocks * 512`` of every entry under it, i.e.
the space allocated on disk (sparse files count what they use, not their length; a file with
several hard links under one directory counts once), as ``du`` does; plus the free bytes of the
first directory's filesystem (``os.statvfs``: blocks available to an unprivileged process). Files
and directories that vanish during a walk are skipped (an engine deletes its spill and shard files
as it goes), so a scan is a slightly blurred snapshot, and a peak that lasts less than
``interval`` can be missed. Each scan's own duration is kept: the poller's cost.

``input_bytes`` sums the sizes (``st_size``) of a run's input files; ``plot_disk`` draws a series
against those inputs (Agg backend, PNG).
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from cluster_data import IntervalPoller  # bench/ is on sys.path wherever this module is imported

#: One sample: seconds since the poller started, bytes on disk of each directory, free bytes.
Sample = tuple[float, dict[str, int], int]


def disk_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (sum of ``st_blocks * 512`` of every file and
    directory below it, not following symlinks; hard links counted once). 0 if ``root`` is gone."""
    total, stack = 0, [os.fspath(root)]
    seen: set[tuple[int, int]] = set()
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except (FileNotFoundError, NotADirectoryError):
                        continue  # deleted between the listing and the stat
                    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except (FileNotFoundError, NotADirectoryError):
            continue  # the directory went away (or was replaced by a file) before we listed it
    return total


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged process can still write on ``path``'s filesystem (``f_bavail *
    f_frsize``); if ``path`` is gone, of its nearest existing ancestor."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    vfs = os.statvfs(path)
    return vfs.f_bavail * vfs.f_frsize


class DiskPoller(IntervalPoller):
    """Samples the disk use of ``dirs`` (name -> directory) every ``interval`` seconds until ``stop()``.

    ``series``: every sample, ``(seconds since the poller was created, {name: bytes}, free bytes)``;
    ``peak`` / ``peak_seconds``: each name's highest bytes and when; ``min_free``: the lowest free
    bytes; ``scan_seconds``: each scan's wall time (``max_scan_seconds`` the longest). ``sample()``
    can also be called directly (before ``start()`` for a baseline, after ``stop()`` for a last one)."""

    def __init__(self, dirs: Mapping[str, Path], interval: float = 1.0) -> None:
        super().__init__(interval, name="disk-poller")
        if not dirs:
            raise ValueError("no directories to poll")
        self.dirs = {name: Path(d) for name, d in dirs.items()}
        self.series: list[Sample] = []
        self.peak: dict[str, int] = dict.fromkeys(self.dirs, 0)
        self.peak_seconds: dict[str, float] = dict.fromkeys(self.dirs, 0.0)
        self.min_free: int | None = None
        self.scan_seconds: list[float] = []
        self._t0 = time.monotonic()
        self.started_at = time.time()  # the wall clock at seconds 0 (to place other clocks' events)

    def sample(self) -> Sample:
        """Scan every directory once, record the result and return it."""
        start = time.monotonic()
        sizes = {name: disk_bytes(d) for name, d in self.dirs.items()}
        free = free_bytes(next(iter(self.dirs.values())))
        end = time.monotonic()
        point = (round(start - self._t0, 3), sizes, free)
        with self._lock:
            self.series.append(point)
            self.scan_seconds.append(end - start)
            for name, size in sizes.items():
                if size > self.peak[name]:
                    self.peak[name], self.peak_seconds[name] = size, point[0]
            self.min_free = free if self.min_free is None else min(self.min_free, free)
        return point

    @property
    def max_scan_seconds(self) -> float:
        with self._lock:
            return max(self.scan_seconds, default=0.0)


def downsample(series: Sequence[Sample], limit: int = 600) -> list[Sample]:
    """At most ``limit`` samples: consecutive samples merged in equal buckets, each keeping its
    first time, the highest bytes of each name and the lowest free bytes (peaks survive)."""
    if len(series) <= limit:
        return list(series)
    step = math.ceil(len(series) / limit)
    out: list[Sample] = []
    for i in range(0, len(series), step):
        bucket = series[i : i + step]
        sizes = {name: max(s[1][name] for s in bucket) for name in bucket[0][1]}
        out.append((bucket[0][0], sizes, min(s[2] for s in bucket)))
    return out


def input_bytes(paths: Iterable[Path]) -> int:
    """Total size (``st_size``) of the input files: each path a file, or a directory whose regular
    files (recursively) all count."""
    total = 0
    for p in map(Path, paths):
        if p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        else:
            total += p.stat().st_size
    return total


def plot_disk(
    series: Sequence[Sample],
    inputs: Mapping[str, int],
    path: Path,
    title: str,
    stages: Mapping[str, float] | None = None,
    baseline: Mapping[str, int] | None = None,
) -> None:
    """Write a PNG at ``path``: each name's bytes on disk (minus its ``baseline``) in GB (10^9)
    against minutes since the poller started; per name a dashed line at its input size and a
    dotted one at twice it; ``stages`` (label -> seconds) as thin vertical lines, in a name's colour
    if the label starts with that name."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    minutes = [t / 60 for t, _, _ in series]
    base = baseline or {}
    for i, name in enumerate(inputs):
        color = f"C{i}"
        ax.plot(minutes, [(s[1][name] - base.get(name, 0)) / 1e9 for s in series], color=color, label=f"{name} engine")
        gb = inputs[name] / 1e9
        ax.axhline(gb, color=color, linestyle="--", linewidth=0.9, label=f"{name} input {gb:.2f} GB")
        ax.axhline(2 * gb, color=color, linestyle=":", linewidth=0.9, label=f"{name} 2x input")
    for label, seconds in sorted((stages or {}).items(), key=lambda kv: kv[1]):
        color = next((f"C{i}" for i, name in enumerate(inputs) if label.startswith(name)), "0.4")
        ax.axvline(seconds / 60, color=color, linewidth=0.5, alpha=0.6)
        ax.text(seconds / 60, 1.0, f" {label}", transform=ax.get_xaxis_transform(), rotation=90, fontsize=6,
                va="top", ha="right", color=color)  # fmt: skip
    ax.set_xlabel("minutes since launch")
    ax.set_ylabel("GB on disk")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
