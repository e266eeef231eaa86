"""release_free_memory hands freed heap pages back to the OS (glibc, as on the CI machine)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow  # noqa: F401  (imported first, so its own memory does not enter the figures)
import pytest

from secure_release.infra import memory
from secure_release.infra.memory import release_free_memory


def _rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def test_freed_heap_pages_go_back_to_the_os() -> None:
    pieces = [np.ones(8000) for _ in range(5000)]  # 5000 x 64 kB: below glibc's mmap threshold, on the heap
    keep = pieces[-1]  # the heap's top stays in use, so free() alone cannot trim it
    del pieces
    before = _rss_mib()
    release_free_memory()
    after = _rss_mib()
    assert keep.sum() == 8000
    assert before - after > 200, (before, after)  # about 305 MiB were free but still resident


def test_glibc_takes_the_fixed_thresholds_and_a_libc_without_mallopt_is_not_claimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thresholds are glibc's mallopt parameters (with 256 KiB a fresh process frees 300 arrays of
    1 MiB at once, 300 MiB, where glibc's own threshold keeps them resident after a 20 MiB block
    was freed: measured by hand; in a test process earlier tests leave free heap chunks that
    serve such arrays whatever the threshold). Where there is no mallopt, nothing is claimed."""
    assert memory.return_freed_memory_promptly() is True
    monkeypatch.setattr(memory, "_libc", lambda: object())
    assert memory.return_freed_memory_promptly() is False


def test_the_trim_watch_trims_above_its_threshold_only() -> None:
    """One look of the watch: above its fraction of the limit it trims (and counts it), below it
    does nothing; the thread stops when told."""
    rss = memory.resident_bytes()
    assert rss is not None and rss > 0
    low, high = memory.TrimWatch(rss, fraction=0.5), memory.TrimWatch(rss, fraction=4.0)
    assert low.threshold == rss // 2 and low.check() is True and low.trims == 1
    assert high.check() is False and high.trims == 0
    started = memory.TrimWatch(rss, fraction=0.5).start()
    deadline = time.monotonic() + 5
    while started.trims == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    started.stop()
    assert started.trims >= 1
