"""A worker plugin that hands a Dask worker's free heap back to the OS when it runs high.

Registered on every worker of the curator's cluster (embedded or given, and on any worker that
joins later or is restarted by its nanny): :class:`~secure_release.infra.memory.TrimWatch`
with the worker's own memory limit.

``dask.distributed`` is the optional cluster extra, so this module imports it lazily: the module
itself imports on a core install (a walk of the package, Sphinx, pydoc), and the plugin's class,
a subclass of Dask's ``WorkerPlugin``, is made on first use (:func:`trim_plugin`, or the module
attribute ``TrimPlugin``). The class is cached and reachable as ``trim.TrimPlugin`` (PEP 562
``__getattr__``), so Dask pickles the plugin by reference and a worker unpickles it by importing
this module, exactly as it would a class defined at the top level."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from secure_release.infra.memory import TrimWatch

if TYPE_CHECKING:
    from distributed.diagnostics.plugin import WorkerPlugin

#: The name the plugin is registered under on every worker (``worker.plugins[PLUGIN_NAME]``).
PLUGIN_NAME = "secure-release-trim"


@functools.cache
def plugin_class() -> type[WorkerPlugin]:
    """The plugin's class, a ``distributed`` ``WorkerPlugin`` (made once; needs the cluster extra,
    ``pip install 'secure-release[cluster]'``, and raises ImportError without it)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class TrimPlugin(WorkerPlugin):
        """Start a :class:`TrimWatch` on a worker that has a memory limit; stop it at teardown."""

        name = PLUGIN_NAME
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

    # pickled by reference, as ``secure_release.curator.cluster.trim.TrimPlugin`` (see __getattr__)
    TrimPlugin.__module__ = __name__
    TrimPlugin.__qualname__ = "TrimPlugin"
    return TrimPlugin


def trim_plugin() -> WorkerPlugin:
    """A new plugin instance, for ``Client.register_plugin`` (needs the cluster extra)."""
    return plugin_class()()


def __getattr__(name: str) -> Any:
    """``TrimPlugin``: the plugin's class, made on first access (so pickle finds it by name)."""
    if name == "TrimPlugin":
        return plugin_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
