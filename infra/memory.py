"""Giving freed memory back to the operating system between the big steps of a role.

Two allocators keep freed memory: Arrow's pool (mimalloc or jemalloc), which holds the CSV
parser's buffers, and glibc's heap, where numpy's arrays below its mmap threshold (up to 32 MiB,
raised dynamically) live, so a step's 1 MiB temporaries stay resident after the step. At
n = 10^7 rows that is 300-800 MB of a curator's resident set; :func:`release_free_memory` hands
it back (``release_unused`` and glibc's ``malloc_trim``). Nothing is freed that is in use."""

from __future__ import annotations

import contextlib
import ctypes
from functools import cache
from typing import Any


@cache
def _libc() -> Any:
    """The C library already loaded in this process (``dlopen(NULL)``: no ``ldconfig`` child
    process, which ``ctypes.util.find_library`` would start)."""
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
