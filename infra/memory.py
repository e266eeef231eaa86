"""Giving freed memory back to the operating system between the big steps of a role.

Two allocators keep freed memory: Arrow's pool (mimalloc or jemalloc), which holds the CSV
parser's buffers, and glibc's heap, where numpy's arrays below its mmap threshold (up to 32 MiB,
raised dynamically) live, so a step's 1 MiB temporaries stay resident after the step. At
n = 10^7 rows that is 300-800 MB of a curator's resident set; :func:`release_free_memory` hands
it back (``release_unused`` and glibc's ``malloc_trim``). Nothing is freed that is in use."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from functools import cache
from typing import Any


@cache
def _libc() -> Any:
    """The C library this process already runs on (``dlopen(NULL)``: the symbols of the process
    and its loaded libraries). Not ``ctypes.util.find_library``, which on Linux starts an
    ``ldconfig`` child process at every first call."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def release_free_memory() -> None:
    """Return the free pages of Arrow's pool and of glibc's heap to the OS (a no-op where
    neither applies, e.g. on musl or macOS)."""
    with contextlib.suppress(ImportError):
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


#: glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD and M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Allocations from this size on get their own mapping, returned to the OS when freed: in a
#: curator process on a cluster the tag slices (16 MiB) and other arrays of megabytes, not the
#: 1 MiB messages (a mapping a message, its pages faulted in afresh each time, took a leader's
#: CPU from 31 to 58 s at 10^8 rows with a threshold of 256 KiB; a worker's own pieces with
#: 1 MiB cost its workers a fifth more CPU, so workers keep glibc's default).
MMAP_THRESHOLD = 8 << 20
#: Free memory at the top of glibc's heap past this is returned at once (Dask's own advice).
TRIM_THRESHOLD = 64 * 1024


def return_freed_memory_promptly(mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's thresholds so that freed memory goes back to the OS as it is freed: arrays of
    ``mmap_threshold`` bytes or more each get their own mapping, and the heap's free top is
    trimmed past :data:`TRIM_THRESHOLD`. Without this glibc raises its mmap threshold to the
    largest block freed so far (up to 32 MiB), so a process that streams many arrays of a few
    MiB (a curator's tag slices) keeps them in its heap, where holes between live blocks stay
    resident: a follower's peak grew 1.2-1.5 bytes a row of n from 10^7 to 10^8. Forked children
    inherit the setting. True where glibc took it."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


#: A worker's resident set above this fraction of its memory limit makes :class:`TrimWatch` hand
#: its free heap back: just before Dask's own line (at 70% of the limit it spills managed data
#: until the process is below 60%, but it cannot spill free heap). Below it, nothing is trimmed,
#: so a worker with room never pays the page faults of memory given back and taken again.
TRIM_ABOVE = 0.65
#: How often a :class:`TrimWatch` reads the resident set, and the least time between two trims.
TRIM_POLL_S, TRIM_GAP_S = 0.25, 1.0


def resident_bytes() -> int | None:
    """This process's resident set from ``/proc/self/statm`` (None where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * _page_size()
    except (OSError, ValueError, IndexError):
        return None


@cache
def _page_size() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE")


class TrimWatch:
    """A daemon thread that calls :func:`release_free_memory` whenever the process's resident set
    passes ``fraction`` of ``limit_bytes`` (at most once every :data:`TRIM_GAP_S`).

    Why: a Dask worker spills a shuffle's pieces (hundreds of KB each) to disk when it passes 60%
    of its limit, but glibc keeps the freed pieces in its heap, where the holes between live
    blocks stay resident; the worker counts them as "unmanaged memory", cannot spill them, and is
    paused and then killed by its nanny. Measured at 3 * 10^8 rows a curator on 2 workers of
    2 GiB: a worker at 1.45 GiB resident, of it 1.25 GiB "unmanaged", fell to 0.45 GiB with one
    ``malloc_trim(0)``. The nanny's ``MALLOC_TRIM_THRESHOLD_`` does not reach a worker forked from
    the forkserver (glibc read its settings in the forkserver), and it trims only the heap's top.
    Trimming only above the fraction costs nothing below it (page faults come back only after a
    trim)."""

    def __init__(self, limit_bytes: int, fraction: float = TRIM_ABOVE) -> None:
        self.threshold = int(limit_bytes * fraction)
        self.trims = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trim-watch", daemon=True)

    def start(self) -> TrimWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def check(self) -> bool:
        """One look: trim if the resident set is above the threshold (True if it did)."""
        rss = resident_bytes()
        if rss is None or rss <= self.threshold:
            return False
        release_free_memory()
        self.trims += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(TRIM_POLL_S):
            if self.check():
                self._stop.wait(TRIM_GAP_S)
