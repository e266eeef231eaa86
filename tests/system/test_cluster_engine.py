"""``--engine dask`` through the four services: the same bytes as ``--engine local``.

Two releases with the same release id, seed, pad keys and PRAM key, in two separate worlds: one
reads each curator's CSV in-process, the other reads the same rows as Parquet files on Dask
(an embedded cluster, or the real ``dask scheduler`` / ``dask worker`` command-line programs).
The server's stored ciphertext (each curator's upload digest and every perturbed chunk) and the
researcher's report must be byte-identical."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from support import child_env, split_parquet, stored_release

from secure_release.cluster import PARTIES, Cluster, get_estimate, launch_release, set_budgets, wait_exit
from secure_release.demo_data import write_demo_data
from secure_release.infra.pki import init_pki
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SEED, PRAM = Seed(bytes(range(32))), PramKey(bytes(range(1, 33)))
PADS = {"alice": PadKey(bytes(range(2, 34))), "bob": PadKey(bytes(range(3, 35)))}
DASK = str(Path(sys.executable).with_name("dask"))


def _env() -> dict[str, str]:
    return child_env(testing=True)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster-src")
    write_demo_data(root / "data", rows=200_000, seed=5)
    init_pki(root / "certs", list(PARTIES))
    (root / "align.key").write_text(AlignmentKey(bytes(range(4, 36))).reveal().hex())
    return root


def release(source: Path, world: Path, extra: dict[str, list[str]], data_dirs: dict[str, Path] | None = None) -> dict:
    """One release ``r1`` in ``world``: the researcher's report and what the server stored."""
    world.mkdir()
    cluster = Cluster(world, env=_env())
    data = source / "data"
    tables = {world / f"keystore-{c}": (data_dirs or {}).get(c, data / f"{c}.csv") for c in ("alice", "bob")}
    set_budgets(cluster, tables, 1.0, source / "certs")
    curator_extra = {
        c: [
            *extra.get(c, []),
            "--insecure-test-pad-key",
            PADS[c].reveal().hex(),
            *(["--data", str(data_dirs[c])] if data_dirs else []),
        ]
        for c in ("alice", "bob")
    }
    curator_extra["alice"] += ["--insecure-test-seed", SEED.reveal().hex()]
    try:
        addrs = launch_release(
            cluster,
            data,
            source / "certs",
            "r1",
            0.5,
            20_000,
            "chacha20",
            source / "align.key",
            curator_extra=curator_extra,
            server_extra=["--insecure-test-pram-key", PRAM.reveal().hex()],
            budgets=False,
        )
        resp = get_estimate(addrs["researcher"], source / "certs", "r1", timeout=240)
        wait_exit(cluster, ["alice", "bob"], 60)
    except Exception:
        sys.stderr.write(cluster.tails(30))
        raise
    finally:
        cluster.close()
    stored = stored_release(world, "r1")
    logs = {c: (world / f"{c}.log").read_text() for c in ("alice", "bob")}
    return {"n": resp.privacy.n, **stored, "logs": logs}


@pytest.fixture(scope="module")
def local(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return release(source, tmp_path_factory.mktemp("local") / "w", {})


def test_dask_engine_gives_the_bytes_of_the_local_engine(source: Path, local: dict, tmp_path: Path) -> None:
    """Both curators on embedded clusters, alice's table in 1 Parquet file, bob's in 64 (the
    7-file case is the next test's, on the real command-line cluster); alice's workers hold her
    shards, bob's are stored on disk (``--shard-store disk``: ids, the tags recomputed)."""
    files = (1, 64)
    dirs = {
        c: split_parquet(source / "data" / f"{c}.csv", tmp_path / "parts" / c, k)
        for c, k in zip(("alice", "bob"), files, strict=True)
    }
    flags = ["--engine", "dask", "--workers", "2", "--shards", "8"]
    got = release(source, tmp_path / "w", {"alice": flags, "bob": [*flags, "--shard-store", "disk"]}, dirs)
    assert got["n"] == local["n"] and got["n"] > 180_000
    assert got["digests"] == local["digests"] and len(got["digests"]) == 2
    assert got["perturbed"] == local["perturbed"] and got["perturbed"]
    assert got["report"] == local["report"]
    for name in ("alice", "bob"):
        assert "engine_started" in got["logs"][name] and "shards_sorted" in got["logs"][name]
        assert "engine_started" not in local["logs"][name]
    assert '"stored_bytes"' in got["logs"]["bob"] and '"stored_bytes"' not in got["logs"]["alice"]


class DaskCli:
    """A real ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1 (the curator's own
    cluster), as an operator starts them."""

    def __init__(self, root: Path, workers: int) -> None:
        self.file = root / "scheduler.json"
        env = _env()
        self.scheduler = subprocess.Popen(
            [
                DASK,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(self.file),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(root / "scheduler.log").open("w"),
        )
        deadline = time.monotonic() + 60
        while not self.file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.workers = [
            subprocess.Popen(
                [
                    DASK,
                    "worker",
                    "--scheduler-file",
                    str(self.file),
                    "--nworkers",
                    "1",
                    "--nthreads",
                    "1",
                    "--memory-limit",
                    "1GiB",
                    "--no-dashboard",
                    "--local-directory",
                    str(root / f"w{i}"),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=(root / f"worker{i}.log").open("w"),
            )
            for i in range(workers)
        ]
        self.address = json.loads(self.file.read_text())["address"]
        self.wait_workers(workers)

    def wait_workers(self, count: int, timeout: float = 60) -> None:
        from distributed import Client

        with Client(self.address, timeout="20s") as client:
            client.wait_for_workers(count, timeout=timeout)

    def worker_pids(self) -> list[int]:
        """The worker processes (each ``dask worker`` runs a nanny and one worker below it)."""
        from distributed import Client

        with Client(self.address, timeout="20s") as client:
            return sorted(client.run(os.getpid).values())

    def close(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            proc.send_signal(signal.SIGTERM)
        for proc in [*self.workers, self.scheduler]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_a_release_on_the_curators_own_cluster_survives_a_killed_worker(
    source: Path, local: dict, tmp_path: Path
) -> None:
    """alice on ``dask scheduler`` + two ``dask worker`` processes (--scheduler; her table in 7
    Parquet files), bob with the CSV in-process: both engines in one release. Once alice's shards
    are sorted (they sit on the workers) one worker gets SIGKILL: Dask recomputes the lost shards
    from the files, and the release has the local world's bytes."""
    dask = DaskCli(tmp_path, 2)
    killed: list[int] = []

    def kill_when_sorted(world: Path) -> None:
        log = world / "alice.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.exists() and "shards_sorted" in log.read_text():
                pid = dask.worker_pids()[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    import threading

    world = tmp_path / "w"
    watcher = threading.Thread(target=kill_when_sorted, args=(world,), daemon=True)
    watcher.start()
    try:
        dirs = {
            "alice": split_parquet(source / "data" / "alice.csv", tmp_path / "parts" / "alice", 7),
            "bob": source / "data" / "bob.csv",
        }
        got = release(source, world, {"alice": ["--engine", "dask", "--scheduler", dask.address]}, dirs)
    finally:
        watcher.join(5)
        dask.close()
    assert killed, "the worker was never killed"
    assert got["n"] == local["n"] and got["digests"] == local["digests"]
    assert got["perturbed"] == local["perturbed"] and got["report"] == local["report"]
    assert f"the curator's cluster at {dask.address} (2 workers)" in got["logs"]["alice"]


#: After which event of its own log each curator loses a worker (leader and follower alike).
KILL_AFTER = ("partitions_read", "shards_sorted", "agreed", "aligned")


def curator_pid(world: Path, name: str) -> int | None:
    """The curator process of ``world`` named ``name`` (not its forkserver or workers)."""
    keystore = str(world / f"keystore-{name}")
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if keystore in cmd and "run" in cmd:
            parent = proc.parent()
            if parent is None or keystore not in (parent.cmdline() or []):
                return int(proc.info["pid"])
    return None


def worker_pids(curator: int) -> list[int]:
    """The embedded cluster's worker processes: the curator's descendants but its forkserver
    (the one with children: the first workers) and multiprocessing's resource tracker. A worker
    its nanny restarts is spawned as the curator's own child."""
    out: list[int] = []
    for proc in psutil.Process(curator).children(recursive=True):
        try:
            if proc.children() or any("resource_tracker" in part for part in proc.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(proc.pid)
    return sorted(out)


class Killer(threading.Thread):
    """Kills one worker of ``name`` right after each event of :data:`KILL_AFTER` shows in its log."""

    def __init__(self, world: Path, name: str) -> None:
        super().__init__(daemon=True)
        self.world, self.name = world, name
        self.killed: list[tuple[str, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        log = self.world / f"{self.name}.log"
        pending = list(KILL_AFTER)
        while pending and not self.stop.wait(0.02):
            text = log.read_text(errors="replace") if log.exists() else ""
            if f'"event": "{pending[0]}"' not in text:
                continue
            pid = curator_pid(self.world, self.name)
            workers = worker_pids(pid) if pid is not None else []
            if not workers:  # between a kill and the nanny's restart: look again
                continue
            victim = workers[len(self.killed) % len(workers)]
            os.kill(victim, signal.SIGKILL)
            self.killed.append((pending.pop(0), victim))


def test_workers_killed_after_every_stage_are_recomputed_and_the_release_keeps_its_bytes(
    source: Path, local: dict, tmp_path: Path
) -> None:
    """Both curators on embedded clusters (6 Parquet files each): one worker of each is killed
    (SIGKILL) right after each of its stages (:data:`KILL_AFTER`), the leader's after its
    matching, when the follower tags it matched are gone from its spool. Dask recomputes what
    was lost (the leader's matches left their outcome in files) and the release has the bytes of
    the local world's (issue 47, item 3; before, the kill after "agreed" ended it: SpoolError).
    Alice's shards are stored on disk (a merge run again after its kill reads its marker; her
    matches read her shards' files), bob's held by his workers."""
    dirs = {c: split_parquet(source / "data" / f"{c}.csv", tmp_path / "parts" / c, 6) for c in ("alice", "bob")}
    flags = ["--engine", "dask", "--workers", "2", "--shards", "8"]
    stored = [*flags, "--shard-store", "disk"]
    reference = local
    world = tmp_path / "w"
    killers = [Killer(world, c) for c in ("alice", "bob")]
    for k in killers:
        k.start()
    try:
        got = release(source, world, {"alice": stored, "bob": flags}, dirs)
    finally:
        for k in killers:
            k.stop.set()
            k.join(5)
    for k in killers:  # every kill landed (a stage that had no worker left to kill would show here)
        assert [stage for stage, _ in k.killed] == list(KILL_AFTER), (k.name, k.killed)
    assert got["n"] == reference["n"] and got["digests"] == reference["digests"]
    assert got["perturbed"] == reference["perturbed"] and got["report"] == reference["report"]
    assert "SpoolError" not in got["logs"]["alice"] and "WorkerLostError" not in got["logs"]["alice"]


def test_an_embedded_cluster_takes_no_work_from_a_client_without_its_certificate(tmp_path: Path) -> None:
    """The embedded cluster listens on 127.0.0.1 over TLS with throw-away certificates: another
    local process (plaintext, or TLS with a certificate of its own) cannot submit tasks."""
    from distributed import Client
    from distributed.security import Security

    from secure_release.curator.cluster.engine import DaskEngine, open_engine

    engine = open_engine("dask", workers=1, worker_memory="1GiB", spill_dir=str(tmp_path))
    try:
        assert isinstance(engine, DaskEngine)
        address = engine.client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        assert engine.result(engine.submit(sum, [1, 2])) == 3  # the curator's own client works
        for security in (None, Security.temporary()):  # no certificate / a certificate of another CA
            with pytest.raises((OSError, TimeoutError)):
                Client(address.replace("tls://", "tcp://") if security is None else address, security=security,
                       timeout="3s")  # fmt: skip
    finally:
        engine.close()


def test_many_tasks_reach_the_scheduler_in_one_message(tmp_path: Path) -> None:
    """``submit_many`` is one ``update-graph`` message to the scheduler however many tasks it
    holds (one a task cost the curator process 2-3 times the CPU at 10^8 rows), and its tasks
    resolve handles nested in lists as ``submit`` does: the shuffle's merges take lists of pieces."""
    from secure_release.curator.cluster.engine import DaskEngine, open_engine

    engine = open_engine("dask", workers=1, worker_memory="1GiB", spill_dir=str(tmp_path))
    try:
        assert isinstance(engine, DaskEngine) and engine._cluster is not None
        scheduler = engine._cluster.scheduler
        messages = []
        handler = scheduler.stream_handlers["update-graph"]

        async def counted(**kw: Any) -> Any:  # the scheduler awaits a coroutine function's result
            messages.append(1)
            return await handler(**kw)

        scheduler.stream_handlers["update-graph"] = counted
        parts = engine.submit_many(sum, [([i, i + 1],) for i in range(40)])
        totals = engine.submit_many(sum, [(parts[:20],), (parts[20:],)])
        assert engine.results(totals, "t") == [sum(2 * i + 1 for i in range(20)), sum(2 * i + 1 for i in range(20, 40))]
        assert len(messages) == 2  # 40 tasks, then 2
        assert engine.submit_many(sum, []) == [] and len(messages) == 2
        assert engine.result(engine.submit(sum, parts[:2])) == 4 and len(messages) == 3  # submit: one a task
    finally:
        engine.close()


def test_every_worker_hands_its_free_heap_back_when_it_runs_high(tmp_path: Path) -> None:
    """A worker's freed pieces stay in glibc's heap (Dask counts them as unmanaged memory and
    cannot spill them): the trim plugin on every worker hands them back once the worker passes
    its threshold (65% of its memory limit). Here a worker of 1 GiB fills small arrays until it
    is 48 MiB above the threshold, frees all but the last (so free() cannot trim the heap's top)
    and must fall back below the threshold within 10 s; without the plugin it stays up
    (measured: it does not move)."""
    import numpy as np

    from secure_release.curator.cluster.engine import DaskEngine, open_engine
    from secure_release.infra.memory import TRIM_ABOVE, resident_bytes

    engine = open_engine("dask", workers=1, worker_memory="1GiB", spill_dir=str(tmp_path))
    try:
        assert isinstance(engine, DaskEngine)
        client = engine.client
        plugin = "secure-release-trim"
        [threshold] = client.run(lambda dask_worker: dask_worker.plugins[plugin].watch.threshold).values()
        assert threshold == int((1 << 30) * TRIM_ABOVE)

        def fill_and_free(dask_worker: Any) -> int:
            pieces = []
            while int(resident_bytes() or 0) < threshold + (48 << 20):
                pieces += [np.ones(8000) for _ in range(256)]  # 256 x 64 kB, below glibc's mmap threshold
            dask_worker.kept_piece = pieces[-1]  # the heap's top stays in use
            del pieces
            return int(resident_bytes() or 0)

        [peak] = client.run(fill_and_free).values()
        assert peak > threshold
        deadline, now = time.monotonic() + 10, peak
        while now > threshold and time.monotonic() < deadline:
            time.sleep(0.25)
            [now] = client.run(lambda: int(resident_bytes() or 0)).values()
        [trims] = client.run(lambda dask_worker: dask_worker.plugins[plugin].watch.trims).values()
        assert now < threshold and trims >= 1, (peak, now, trims)
    finally:
        engine.close()


def test_sigterm_ends_a_wait_on_the_cluster_within_a_second_or_two(tmp_path: Path) -> None:
    """The stop event (SIGTERM) ends a wait for one task, as for a stage: StoppedError and the
    task cancelled (before, the curator's run never handed its stop event to the engine, and a
    SIGTERM during the read waited for the whole shuffle)."""
    import threading

    from secure_release.curator.cluster.engine import DaskEngine, open_engine
    from secure_release.curator.errors import StoppedError

    stop = threading.Event()
    engine = open_engine("dask", workers=1, worker_memory="1GiB", spill_dir=str(tmp_path), stop=stop)
    try:
        assert isinstance(engine, DaskEngine)
        sleeping = engine.submit(time.sleep, 60)
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        with pytest.raises(StoppedError, match="SIGTERM"):
            engine.result(sleeping)
        assert time.monotonic() - started < 3.0
        deadline = time.monotonic() + 5
        while sleeping.status != "cancelled" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sleeping.status == "cancelled"
    finally:
        engine.close()


def test_a_two_level_shuffle_on_dask_gives_the_shards_of_one_level(tmp_path: Path) -> None:
    """The two-level shuffle releases its intermediate handles as soon as they are queued: on a
    real cluster (2 workers) every shard is still the one-level shard, tag for tag."""
    import numpy as np
    from support import split_world

    from secure_release.curator.cluster.engine import open_engine

    world = split_world(tmp_path / "world", rows=3000, seed=3)
    engine = open_engine("dask", workers=2, worker_memory="1GiB", spill_dir=str(tmp_path / "spill"))
    try:
        one, two = (world.sharded(engine, "bob", AlignmentKey(bytes(32)), 4, group_bits=g) for g in (0, 2))
        assert one.num_rows == two.num_rows > 2900
        for a, b in zip(one.shards, two.shards, strict=True):
            left, right = engine.result(a), engine.result(b)
            assert left.size and np.array_equal(left.tags, right.tags) and np.array_equal(left.symbols, right.symbols)
    finally:
        engine.close()
