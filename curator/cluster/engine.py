"""Who runs a curator's shard stages (:mod:`secure_release.curator.cluster.shards`): the engine.

* :class:`InlineEngine`: in this process, on a small thread pool (numpy and pyarrow release the
  GIL). The stage functions and the merge order are exactly those of the cluster; the tests use
  it to check the sharded path without a cluster.
* :class:`DaskEngine`: a ``dask.distributed`` cluster (``pip install 'secure-release[cluster]'``).
  With no address the curator starts an embedded ``LocalCluster`` on 127.0.0.1 sized to the
  machine (worker processes, threads, a memory limit per worker, spill to a local directory) and
  talks to it over TLS with throw-away certificates (``Security.temporary``), so no other local
  user can submit work to it; ``--scheduler tcp://HOST:PORT`` or ``--scheduler-file`` use the
  curator's own running cluster (its security is the operator's: Dask's ``distributed.comm.tls``
  settings).

The workers are inside the curator's trust domain: they read its files and hold its ids' tags
and symbols (never a key other than the alignment key, never a pad). Only tags (to the leader),
row orders (from the leader) and ciphertext (to the server) leave the curator, through the
curator process, exactly as with the in-process path.

Both engines expose one interface: ``submit(fn, *args) -> handle``, ``submit_many(fn,
arg_lists) -> handles`` (many tasks of one function in one message: a Dask scheduler's cost is
per message as much as per task), ``result(handle)``,
``results(handles, stage)`` (with progress), ``release(handles)`` and ``close()``. A handle is an
opaque future; arguments that are handles are resolved where the task runs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from secure_release.curator.cluster.forkserver import (
    WARM_MODULES,
    keep_forkserver_preload,
    start_forkserver,
    start_method,
)
from secure_release.curator.cluster.trim import trim_plugin
from secure_release.curator.errors import WaitTimeoutError, stopped_error
from secure_release.infra.logs import EventLog
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError

ENGINES = ("local", "dask")
PROGRESS_EVERY_S = 2.0


class EngineError(SecureReleaseError):
    """The engine cannot run as asked (dask missing, a scheduler that cannot be reached, a
    worker lost for good)."""


class Engine(Protocol):
    """Schedules pure stage functions; the only thing that differs between local and cluster."""

    name: str
    description: str
    #: Whether the workers read and write this host's files (the leader's spool): an embedded
    #: cluster's, and the in-process engine's; not a cluster elsewhere
    shares_files: bool
    #: A private directory (0700) where workers leave a large result for this process to read,
    #: rather than send it over the cluster's TLS connection (an embedded cluster's: 2-4 times
    #: the CPU a gigabyte, both ends, measured here); None: results come as results
    handoff: Path | None
    #: The workers' memory limits in all (an embedded cluster's), or None: not known here
    memory_bytes: int | None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any: ...

    def submit_many(self, fn: Callable[..., Any], arg_lists: Sequence[Sequence[Any]]) -> list[Any]: ...

    def put(self, value: Any, near: Any = None) -> Any: ...

    def result(self, handle: Any) -> Any: ...

    def results(self, handles: Sequence[Any], stage: str) -> list[Any]: ...

    def release(self, handles: Sequence[Any]) -> None: ...

    def close(self) -> None: ...


def _progress(log: EventLog | None, stage: str, done: int, total: int, started: float, last: list[float]) -> None:
    now = time.monotonic()
    if log is not None and (done == total or now - last[0] >= PROGRESS_EVERY_S):
        last[0] = now
        log("stage_progress", stage=stage, done=done, total=total, seconds=round(now - started, 2),
            note=progress_note(stage, done, total, now - started))  # fmt: skip


STAGE_UNITS = {
    "read": "partitions read, checked and hashed",
    "shuffle": "shards sorted",
    "merge": "groups of shards sorted and stored",
    "locate": "partitions searched",
    "sample": "runs of the aligned column sampled",
    "psi-send": "slices of the own PSI list sent",
    "psi-hop": "slices of a PSI list re-blinded and handed on",
    "psi-finish": "own PSI slices turned into tags",
}


def progress_note(stage: str, done: int, total: int, seconds: float, width: int = 20) -> str:
    """One readable progress line: ``read [#########-----------] 7/16 partitions ... 3.2 s``."""
    filled = round(width * done / total) if total else width
    return f"{stage:<8} [{'#' * filled}{'-' * (width - filled)}] {done}/{total} {STAGE_UNITS.get(stage, 'tasks')}, " \
        f"{seconds:.1f} s"  # fmt: skip


class InlineEngine:
    """Runs every stage in this process on ``threads`` threads (handles are concurrent futures)."""

    name = "inline"

    def __init__(self, threads: int = 2, log: EventLog | None = None, shares_files: bool = True) -> None:
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="stage")
        self._log = log
        self.shares_files = shares_files
        self.handoff: Path | None = None  # a result here is the object itself
        self.memory_bytes: int | None = None  # this process's: not bounded by the engine
        self.description = f"in-process, {max(1, threads)} threads"

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        deps = [a for a in args if isinstance(a, Future)]
        deps += [x for a in args if isinstance(a, list | tuple) for x in a if isinstance(x, Future)]

        def run() -> Any:
            return fn(*(_resolve(a) for a in args))

        if not deps:
            return self._pool.submit(run)
        for dep in deps:  # dependencies first (they were submitted earlier, so no deadlock)
            dep.result()
        return self._pool.submit(run)

    def submit_many(self, fn: Callable[..., Any], arg_lists: Sequence[Sequence[Any]]) -> list[Future[Any]]:
        """:meth:`submit` of ``fn`` on each argument list, in order."""
        return [self.submit(fn, *args) for args in arg_lists]

    def put(self, value: Any, near: Any = None) -> Future[Any]:
        """``value`` as a handle (an argument of later tasks; ``near``: a handle of their other
        argument, ignored here)."""
        done: Future[Any] = Future()
        done.set_result(value)
        return done

    def result(self, handle: Any) -> Any:
        return handle.result() if isinstance(handle, Future) else handle

    def results(self, handles: Sequence[Any], stage: str) -> list[Any]:
        started, last = time.monotonic(), [0.0]
        out = []
        for done, handle in enumerate(handles, start=1):
            out.append(self.result(handle))
            _progress(self._log, stage, done, len(handles), started, last)
        return out

    def release(self, handles: Sequence[Any]) -> None:
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _resolve(arg: Any) -> Any:
    if isinstance(arg, Future):
        return arg.result()
    if isinstance(arg, list):
        return [x.result() if isinstance(x, Future) else x for x in arg]
    return arg


#: How often a wait for the cluster looks at its futures (and at SIGTERM). Futures are polled
#: (``Future.done()``, a local check) rather than waited on with a timeout: distributed's
#: ``Future.result(timeout=...)`` and ``wait(..., timeout=...)`` run asyncio's ``wait_for`` in
#: the client's loop, where a timeout racing the result can end the call with a CancelledError,
#: which distributed's ``sync`` turns into ``UnboundLocalError: ... 'result'`` (hit once in about
#: 400 one-second waits of a PSI ring at 10^7 ids here; the curator stopped).
POLL_S = 0.05


class DaskEngine:
    """A dask.distributed client (to an embedded LocalCluster or the curator's own cluster)."""

    name = "dask"

    def __init__(
        self, client: Any, cluster: Any | None, log: EventLog | None, description: str,
        stop: threading.Event | None = None, direct: bool | None = None,
    ) -> None:  # fmt: skip
        self.client = client
        self._direct = direct
        self.embedded = cluster is not None
        self.shares_files = self.embedded  # its workers are this host's processes, as this user
        self.handoff: Path | None = None  # set by open_engine for an embedded cluster
        self._cluster = cluster
        self._log = log
        self.description = description
        self._stop = stop or threading.Event()
        self.worker_memory: str | None = None  # an embedded cluster's --worker-memory (named when a task cannot fit)
        self.memory_bytes: int | None = None  # an embedded cluster's workers' memory in all (None: unknown)
        #: The run's --timeout as a monotonic end (None: no end): a stage still waiting then
        #: raises :class:`WaitTimeoutError` naming the stage, its progress and the workers alive.
        self.deadline: float | None = None
        self.timeout_s: float | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.client.submit(fn, *args, pure=False)

    def submit_many(self, fn: Callable[..., Any], arg_lists: Sequence[Sequence[Any]]) -> list[Any]:
        """``[submit(fn, *args) for args in arg_lists]`` as one graph (``Client.map``): one
        message to the scheduler, not one a task. The shuffle's 2,048 small tasks at 10^8 rows,
        submitted one by one, cost the curator process (where an embedded scheduler runs) 2-3
        times the CPU (measured: 5.6-7.4 against 2.2-2.8 CPU seconds for 2,200 tasks)."""
        if not arg_lists:
            return []
        return list(self.client.map(fn, *zip(*arg_lists, strict=True), pure=False))

    def put(self, value: Any, near: Any = None) -> Any:
        """``value`` sent to one worker (straight to it on an embedded cluster: a task's own
        arguments would go through the scheduler, twice the bytes), not hashed; to the worker
        holding ``near`` if given (the task that takes both then moves neither)."""
        workers = self.client.who_has([near]).get(near.key) if near is not None else None
        return self.client.scatter([value], direct=self._direct, hash=False, workers=workers or None)[0]

    def result(self, handle: Any) -> Any:
        """``handle``'s value; :class:`StoppedError` within a second of SIGTERM (the task is
        cancelled), as :meth:`results`."""

        stage = stage_of(handle)
        watch = _StallWatch(self, stage, 1)
        while not handle.done():  # polled: see POLL_S
            if self._stop.wait(POLL_S):
                self.client.cancel([handle])
                raise stopped_error(self._stop, "while waiting for the cluster")
            watch.tick(0, [handle])
        return self._named(lambda: handle.result(), stage)

    def results(self, handles: Sequence[Any], stage: str) -> list[Any]:
        """Every handle's value, in order; progress as they complete; :class:`StoppedError`
        within a second of SIGTERM (the cluster's tasks are cancelled). The first task that
        fails stops the wait at once (the others are cancelled): a task whose workers kept dying
        is :class:`WorkerLostError` naming the stage and what to change, never a wait on tasks
        that a wedged cluster will not run. Past the run's ``--timeout``: :class:`WaitTimeoutError`;
        while nothing completes, a ``stage_waiting`` line a minute says what is awaited."""
        started, last = time.monotonic(), [0.0]
        pending, done = set(handles), 0
        watch = _StallWatch(self, stage, len(handles))
        while pending:
            finished = {handle for handle in pending if handle.done()}  # polled: see POLL_S
            if not finished:
                self._stop.wait(POLL_S)
            if self._stop.is_set():
                self.client.cancel(list(pending))
                raise stopped_error(self._stop, f"during the {stage} stage on the cluster")
            failed = [handle for handle in finished if handle.status == "error"]
            if failed:
                self.client.cancel(list(pending - set(failed)))
                self._named(failed[0].result, stage)  # raises the task's error (named)
            for handle in finished:
                pending.discard(handle)
                done += 1
                _progress(self._log, stage, done, len(handles), started, last)
            watch.tick(done, pending)
        return list(self._named(lambda: self.client.gather(list(handles)), stage))

    def _named(self, get: Callable[[], Any], stage: str) -> Any:
        return _lost_worker_named(get, stage, self.worker_memory)

    def workers_alive(self) -> int | None:
        """Workers the cluster has now (an embedded cluster's, read locally; else None)."""
        if self._cluster is None:
            return None
        try:
            return len(self._cluster.scheduler_info.get("workers", {}))
        except Exception:  # a cluster closing under us: unknown
            return None

    def release(self, handles: Sequence[Any]) -> None:
        for handle in handles:
            handle.release()

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()
        if self.handoff is not None:
            shutil.rmtree(self.handoff, ignore_errors=True)


class WorkerLostError(EngineError):
    """A task whose workers kept dying (Dask gives a task up after it killed a few workers): on
    an embedded cluster, a worker that passes 95% of ``--worker-memory`` is killed by its nanny,
    so a task that cannot fit in a worker's memory ends here. A runtime failure (exit 1): the
    same command can run once the memory, the files or the shards are changed."""

    kind = ErrorKind.UNAVAILABLE


#: The stage each task function belongs to (a task's key starts with its function's name).
TASK_STAGES = {
    "hash_partition": "read", "point_partition": "read", "partition_to_files": "read", "merge_group_files": "merge",
    "gather_shard_symbols": "gather", "regroup": "shuffle", "piece_of": "shuffle",
    "merge_shard": "shuffle", "locate_tags": "locate", "shard_tags": "tags",
    "shard_summary": "shuffle", "problems_of": "read", "match_spooled": "match", "match_shard": "match",
    "match_rows": "match", "match_symbols": "gather", "gather_symbols": "gather", "gather_symbols_from": "gather",
    "shard_tag_slice": "tags", "shard_tag_slice_to": "tags", "keep_run": "sample", "kept_counts": "sample",
    "kept_part": "sample", "merge_range": "sample", "point_slice": "psi-send", "reblind_slice": "psi-hop",
    "finish_slice_tags": "psi-finish", "symbols_from": "sample",
}


def stage_of(handle: Any) -> str:
    """The stage of a task handle, from its key (its function's name), or "a" stage."""
    key = str(getattr(handle, "key", "") or "")
    return next((stage for fn, stage in TASK_STAGES.items() if key.startswith(fn + "-")), "a")


def _lost_worker_named(get: Callable[[], Any], stage: str = "a", worker_memory: str | None = None) -> Any:
    """A task that failed because its workers kept dying (Dask retries a lost task a few
    times) as a :class:`WorkerLostError` naming the stage, the workers' memory and what to
    change; a stage's own error (e.g. BadRowsError) passes through."""
    killed: type[Exception] = importlib.import_module("distributed.scheduler").KilledWorker
    try:
        return get()
    except killed as exc:
        task = str(exc.args[0]) if exc.args else "?"
        allowed = exc.args[2] if len(exc.args) > 2 else None
        tries = f"{allowed + 1} workers died" if isinstance(allowed, int) else "several workers died"
        memory = f" of {worker_memory} each (a worker is killed at 95% of it)" if worker_memory else ""
        raise WorkerLostError(
            f"the {stage} stage cannot finish: its task {task} killed every worker that ran it ({tries}), the "
            f"workers{memory}; a task that cannot fit in a worker's memory ends this way. Give each worker more "
            "memory (--worker-memory), split the input into more and smaller files, or use more shards (--shards), "
            "then run the same command again; nothing was uploaded by this stage"
        ) from None


#: How long a stage may make no progress before a ``stage_waiting`` line says what it awaits.
STALL_LOG_S = 60.0


class _StallWatch:
    """Watches one wait on the cluster: past the engine's deadline, :class:`WaitTimeoutError`
    naming the stage; while nothing completes, a ``stage_waiting`` line a minute."""

    def __init__(self, engine: DaskEngine, stage: str, total: int) -> None:
        self.engine, self.stage, self.total = engine, stage, total
        self.done, self.since, self.said = 0, time.monotonic(), time.monotonic()

    def tick(self, done: int, pending: Any) -> None:
        now = time.monotonic()
        if done != self.done:
            self.done, self.since, self.said = done, now, now
        workers = None
        if now - self.said >= STALL_LOG_S or (self.engine.deadline is not None and now >= self.engine.deadline):
            workers = self.engine.workers_alive()
        alive = "" if workers is None else f"; {workers} workers alive"
        what = f"the {self.stage} stage on the cluster ({done} of {self.total} tasks done{alive})"
        if self.engine.deadline is not None and now >= self.engine.deadline:
            self.engine.client.cancel(list(pending))
            raise WaitTimeoutError(f"gave up after {self.engine.timeout_s:g} s (--timeout) waiting for {what}")
        log = self.engine._log
        if now - self.said >= STALL_LOG_S and log is not None:
            self.said = now
            idle = now - self.since
            note = f"still waiting for {what}, nothing done for {idle:.0f} s"
            log.warning("stage_waiting", stage=self.stage, done=done, total=self.total, workers=workers,
                        idle_s=round(idle, 1), note=note)  # fmt: skip


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def check_scheduler_address(address: str) -> str:
    """A scheduler address the curator may send its work to: TLS anywhere (``tls://``), or a
    plaintext one (``tcp://``, ``ws://``) only on this host. The hash tasks carry the alignment
    key and the workers hand back symbols and tags: over a plaintext network link anybody on the
    path would read them."""
    scheme, _, rest = address.partition("://")
    if not rest:
        scheme, rest = "tcp", address
    host = rest.rsplit(":", 1)[0] if rest.count(":") == 1 or rest.startswith("[") else rest.split(":")[0]
    if scheme in ("tls", "wss", "inproc") or host in LOOPBACK:
        return address
    raise EngineError(
        f"--scheduler {address} is plaintext ({scheme}://) across the network; the hash tasks carry the alignment "
        "key and the workers return tags and symbols: use tls:// (Dask's distributed.comm.tls settings, or "
        "'dask scheduler --tls-ca-file ... --tls-cert ... --tls-key ...'), or run the scheduler on this host"
    )


def _file_address(scheduler_file: str) -> str:
    """The address in a Dask scheduler file (a JSON object with ``address``)."""
    try:
        data = json.loads(Path(scheduler_file).read_text())
        return str(data["address"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"--scheduler-file {scheduler_file}: cannot read a scheduler address ({exc})") from None


METHOD_KEY = "distributed.worker.multiprocessing-method"
#: An embedded cluster's settings, where Dask's defaults cost the curator's CPU for what only a
#: dashboard shows (measured on 2 cores, a cluster of 2 workers doing nothing: 0.15 CPU seconds a
#: second with Dask's defaults, 0.03 with these, for each curator; a 10^7-row release takes 12 s):
#:
#: * no statistical profiler (a thread sampling every thread's stack each 10 ms);
#: * each event loop's tick (the watch that warns of a loop blocked over 3 s) every second, not
#:   every 20 ms: the scheduler's, the client's and every worker's loop woke 50 times a second;
#: * the memory monitor (a worker's spill and pause, its nanny's kill at 95% of the limit) every
#:   250 ms, not 100 ms: at the rates of a worker here (about 100 MB/s) it may overshoot a
#:   threshold by 25 MB before it acts, and a worker's limit is 2 GiB;
#: * the system monitor (CPU, memory, network and disk counters for the dashboard's graphs)
#:   every 2 s, not 500 ms.
EMBEDDED_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.memory.monitor-interval": "250ms",
    "distributed.admin.system-monitor.interval": "2s",
}


def default_workers() -> tuple[int, int]:
    """(worker processes, threads each) for an embedded cluster on this machine."""
    cores = os.cpu_count() or 1
    return max(1, min(cores, 8)), 1 if cores <= 8 else max(1, cores // 8)


def open_engine(
    engine: str,
    *,
    scheduler: str | None = None,
    scheduler_file: str | None = None,
    workers: int | None = None,
    worker_memory: str = "2GiB",
    spill_dir: str | None = None,
    log: EventLog | None = None,
    stop: threading.Event | None = None,
    timeout_s: float | None = None,
) -> Engine:
    """The engine ``--engine`` names: ``local`` (in-process threads) or ``dask``; on Dask, a wait
    still running ``timeout_s`` after the start (the run's ``--timeout``) raises
    :class:`WaitTimeoutError`."""
    if engine == "local":
        return InlineEngine(2, log)
    if engine != "dask":
        raise EngineError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    try:
        dask = _dask()
    except ImportError:
        raise EngineError("--engine dask needs dask.distributed: pip install 'secure-release[cluster]'") from None
    Client, LocalCluster, Security = dask.Client, dask.LocalCluster, dask.security.Security
    try:
        if scheduler is not None or scheduler_file is not None:
            check_scheduler_address(scheduler if scheduler is not None else _file_address(str(scheduler_file)))
            if scheduler_file is None:
                client = Client(scheduler, timeout="20s")
            else:
                client = Client(scheduler_file=scheduler_file, timeout="20s")
            count = len(client.scheduler_info(n_workers=-1).get("workers", {}))
            where = scheduler or f"the scheduler in {scheduler_file}"
            desc = f"the curator's cluster at {where} ({count} workers)"
            eng = DaskEngine(client, None, log, desc, stop)
        else:
            count, threads = default_workers()
            count = workers or count
            security = Security.temporary()
            dashboard = "127.0.0.1:0" if _has_bokeh() else None
            with importlib.import_module("dask").config.set({**EMBEDDED_CONFIG, METHOD_KEY: start_method()}):
                start_forkserver()  # running already if the caller started it earlier
                keep_forkserver_preload()
                cluster = LocalCluster(
                    n_workers=count, threads_per_worker=threads, processes=True, host="127.0.0.1",
                    protocol="tls://", security=security, dashboard_address=dashboard, memory_limit=worker_memory,
                    local_directory=spill_dir,
                )  # fmt: skip
            client = Client(cluster, security=security, direct_to_workers=True)  # results: worker to here, once
            desc = f"an embedded Dask cluster of {count} workers x {threads} threads, {worker_memory} each"
            eng = DaskEngine(client, cluster, log, desc, stop, direct=True)
            eng.worker_memory = worker_memory
            eng.memory_bytes = count * int(importlib.import_module("dask.utils").parse_bytes(worker_memory))
            eng.handoff = Path(tempfile.mkdtemp(prefix="handoff-", dir=spill_dir))  # 0700, removed at close
    except (OSError, TimeoutError) as exc:
        raise EngineError(f"cannot reach the Dask scheduler ({type(exc).__name__}: {exc})") from None
    if timeout_s is not None:
        eng.timeout_s, eng.deadline = timeout_s, time.monotonic() + timeout_s
    try:
        eng.client.run(warm_up, eng.embedded)  # each worker imports the stage modules now, not in its first task
        eng.client.register_plugin(trim_plugin())
    except Exception as exc:  # a worker that died while starting (e.g. its memory limit is below its imports')
        with contextlib.suppress(Exception):
            eng.close()
        memory = f" of {worker_memory} each (a worker is killed at 95% of it)" if eng.worker_memory else ""
        raise WorkerLostError(
            f"the start stage cannot finish: the cluster's workers{memory} died while starting "
            f"({type(exc).__name__}: {exc}). Give each worker more memory (--worker-memory), or check the workers' "
            "logs; split the input into more and smaller files or use more shards (--shards) if they die later"
        ) from None
    if log is not None:
        link = eng.client.dashboard_link if _has_bokeh() or scheduler or scheduler_file else None
        dashboard = link or "not running (pip install bokeh for Dask's dashboard)"
        log("engine_started", engine="dask", cluster=eng.description, scheduler=eng.client.scheduler.address,
            dashboard=dashboard, note=f"working on {eng.description}; dashboard: {dashboard}")  # fmt: skip
    return eng


def warm_up(embedded: bool = False) -> None:
    """Run on every worker once the cluster is up: import :data:`WARM_MODULES`. On an embedded
    cluster (as many worker threads as cores, each task one thread) Arrow's own thread pool is
    also one thread: with a thread a core in every worker, 4 workers x 3 threads competed for 2
    cores (1.76x the in-process engine at 10^7 rows; 1.53x with one)."""
    for name in WARM_MODULES:
        importlib.import_module(name)
    if embedded:
        importlib.import_module("pyarrow").set_cpu_count(1)


def _dask() -> Any:
    """dask.distributed (optional: the ``cluster`` extra), imported when first needed."""
    module = importlib.import_module("distributed")
    importlib.import_module("distributed.security")
    return module


def _has_bokeh() -> bool:
    return importlib.util.find_spec("bokeh") is not None
