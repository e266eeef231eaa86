"""The process an embedded Dask cluster forks its workers from (multiprocessing's
``forkserver``), and what it imports.

A worker that is a fork of a process with distributed, numpy, pandas, pyarrow and the stage code
imported starts in a fraction of a second; four workers each importing them competed for the
cores (:func:`start_method`). ``curator run --engine dask`` forks that server from the curator
process itself before it starts anything (:func:`start_forkserver` with ``in_process``), so the
modules are imported once; any other caller gets multiprocessing's own server, a new
interpreter that imports them. The server holds no data and no key: it only forks.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import multiprocessing
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

#: What a worker's first stage would import (pyarrow's Parquet reader, cryptography, the stage
#: modules, about 0.5 s of CPU): imported by the forkserver, so every worker starts with them.
WARM_MODULES = (
    "pyarrow.parquet",
    "secure_release.curator.partitions",
    "secure_release.curator.cluster.shards",
    "secure_release.curator.cluster.shard_files",
    "pyarrow.ipc",
    "secure_release.curator.cluster.psi_stages",
    "secure_release.curator.cluster.sealed",
    "secure_release.curator.cluster.sample",
    "secure_release.curator.cluster.trim",
)


def start_method() -> str:
    """How an embedded cluster starts its worker processes: ``forkserver`` where there is one
    (a server process with distributed, numpy and pandas imported, each worker a fork of it: at
    10^7 rows this took the cluster's start from about 6.5 s to 4.5 s of a release's wall time on
    2 cores, where four workers importing the same modules competed for the CPU; the curator's
    run forks that server from itself before it starts anything, :func:`start_forkserver`),
    else ``spawn``. Never plain ``fork`` of a running curator: it runs gRPC threads."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


#: What an embedded cluster's forkserver imports before it forks a worker, besides
#: :data:`WARM_MODULES`: what of Dask's own preload list a worker here uses (pandas: pyarrow
#: imports it on its first ``pa.array`` or ``pa.scalar``, whatever the input, to ask whether
#: that is a pandas object; the schema checks make such arrays).
FORKSERVER_MODULES = ("distributed", "numpy", "pandas")


def start_forkserver(in_process: bool = False) -> None:
    """Start the server an embedded cluster forks its workers from, now (a no-op without
    ``forkserver``, or if it runs already); each worker is then a fork of it with
    :data:`FORKSERVER_MODULES` and :data:`WARM_MODULES` imported. Call before anything else of
    the engine.

    By default the server is a new interpreter that imports them (1-1.5 s of CPU) while this
    process goes on. ``in_process``, for a curator process that has started nothing yet (no
    thread of its own, no socket, no key or table read): this process imports them (it needs
    distributed, numpy and pyarrow itself) and the server is a fork of it, so they are imported
    once, not twice. The fork keeps no descriptor but the server's own and the standard streams,
    as a new interpreter would."""
    if start_method() != "forkserver" or importlib.util.find_spec("distributed") is None:
        return  # (without dask, open_engine says what to install)
    wanted = (*FORKSERVER_MODULES, *WARM_MODULES)
    names = [name for name in wanted if importlib.util.find_spec(name.split(".")[0]) is not None]
    forkserver = importlib.import_module("multiprocessing.forkserver")
    if not (in_process and threading.active_count() == 1):
        multiprocessing.get_context("forkserver").set_forkserver_preload(names)
        forkserver.ensure_running()
        return
    for name in names:
        importlib.import_module(name)
    importlib.import_module("multiprocessing.resource_tracker").ensure_running()  # a new interpreter, as ever
    multiprocessing.get_context("forkserver").set_forkserver_preload([])
    with _server_forked():
        forkserver.ensure_running()


@contextlib.contextmanager
def _server_forked() -> Iterator[None]:
    """While open, multiprocessing starts its forkserver as a fork of this process running the
    same command it would give a new interpreter; anything else it starts, as before."""
    util: Any = importlib.import_module("multiprocessing.util")  # spawnv_passfds: not in its stubs
    spawn = util.spawnv_passfds

    def fork(path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
        command = args[-1] if len(args) >= 2 and args[-2] == "-c" else ""
        if not command.startswith("from multiprocessing.forkserver import main;"):
            return int(spawn(path, args, passfds))
        pid = os.fork()
        if pid:
            return pid
        try:
            _close_descriptors_except({0, 1, 2, *passfds})
            exec(command, {"__name__": "__forkserver__"})  # multiprocessing's own command
        except SystemExit:  # the server ends once every process that may use it has ended
            os._exit(0)
        finally:
            os._exit(1)

    util.spawnv_passfds = fork
    try:
        yield
    finally:
        util.spawnv_passfds = spawn


#: Above every descriptor a process here has open (the fork closes those below it).
MAX_DESCRIPTOR = 1 << 20


def _close_descriptors_except(keep: set[int]) -> None:
    """Close every descriptor below :data:`MAX_DESCRIPTOR` but ``keep``."""
    start = 0
    for fd in [*sorted(keep), MAX_DESCRIPTOR]:
        if start < fd:  # never an empty range: os.closerange(0, 0) closes every descriptor (3.11)
            os.closerange(start, fd)
        start = fd + 1


def keep_forkserver_preload() -> None:
    """Dask sets its own preload list when a nanny starts its first worker, importing every
    package of the list in this process first (pandas: 0.5 s of CPU the curator never uses);
    the server of :func:`start_forkserver` runs already, so mark Dask's list as set."""
    utils = importlib.import_module("distributed.utils")
    if hasattr(utils, "_forkserver_preload_set"):  # else Dask sets its list: slower, as correct
        setattr(utils, "_forkserver_preload_set", True)  # noqa: B010 (a private flag of Dask)
