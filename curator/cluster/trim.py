"""A worker plugin that hands a Dask worker's free heap back to the OS when it runs high.

Registered on every worker of the curator's cluster (embedded or given, and on any worker that
joins later or is restarted by its nanny): :class:`~secure_release.infra.memory.TrimWatch`
with the worker's own memory limit. Imported only where dask.distributed is installed."""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from secure_release.infra.memory import TrimWatch


class TrimPlugin(WorkerPlugin):
    """Start a :class:`TrimWatch` on a worker that has a memory limit; stop it at teardown."""

    name = "secure-release-trim"
    idempotent = True  # registered again by a second release on the same cluster: kept once

    def __init__(self) -> None:
        self.watch: TrimWatch | None = None

    def setup(self, worker: Any) -> None:
        limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
        if limit:
            self.watch = TrimWatch(int(limit)).start()

    def teardown(self, worker: Any) -> None:
        if self.watch is not None:
            self.watch.stop()
