"""The Dask engine survives what Dask survives, and fails by name where a task cannot fit
(issue 47, item 3), through the real processes: both curators on embedded clusters.

* A worker killed after each stage of each curator is recomputed, with the same bytes:
  ``tests/system/test_cluster_engine.py`` (it compares with the local engine's release there).
* A task that cannot fit in a worker's memory (a read partition of 250,000 rows against 100 MiB
  workers) fails the release within seconds of Dask giving up on it: every curator exits 1 with
  ``WorkerLostError`` naming the stage, ``--worker-memory``, more and smaller files and
  ``--shards``; nothing is reserved.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from support import cluster_world

from secure_release.cluster import launch_release
from secure_release.curator.records.keystore import Keystore

pytestmark = pytest.mark.slow


def test_a_task_that_cannot_fit_in_a_worker_fails_the_release_by_name_within_seconds(tmp_path: Path) -> None:
    made = cluster_world(tmp_path, 2_000_000, 8, 1 << 18)
    data, certs, akey, world, cluster, dirs = made.data, made.certs, made.akey, made.world, made.cluster, made.dirs
    extra = {c: ["--data", str(d), "--schema", str(data / f"{c}.json"), "--engine", "dask", "--timeout", "300",
                 "--workers", "2", "--worker-memory", "100MiB"] for c, d in dirs.items()}  # fmt: skip
    try:
        launch_release(cluster, data, certs, "r-mem", 1.0, 100_000, "chacha20", akey, curator_extra=extra,
                       budgets=False)  # fmt: skip
        end = time.monotonic() + 240
        while time.monotonic() < end and any(cluster.procs[c].poll() is None for c in ("alice", "bob")):
            time.sleep(0.1)
        codes = {c: cluster.procs[c].poll() for c in ("alice", "bob")}
        ended = time.time()
    finally:
        cluster.close()
    logs = {c: (world / f"{c}.log").read_text(errors="replace") for c in ("alice", "bob")}
    assert codes == {"alice": 1, "bob": 1}, (codes, {c: logs[c][-2000:] for c in logs})
    for c in ("alice", "bob"):
        last = logs[c].strip().splitlines()[-1]
        assert "WorkerLostError: the " in last and " stage cannot finish" in last, last
        assert "100MiB" in last and "--worker-memory" in last and "--shards" in last and "files" in last, last
        # within seconds of Dask giving up on the task (it tries a few workers first)
        gave_up = [m.group(1) for m in re.finditer(r"(\d\d:\d\d:\d\d),\d+ - distributed.scheduler - ERROR - Task "
                                                   r"\S+ marked as failed", logs[c])]  # fmt: skip
        if gave_up:  # the curator whose own task failed: it stops within seconds
            first = time.mktime(time.strptime(time.strftime("%Y-%m-%d ") + gave_up[0], "%Y-%m-%d %H:%M:%S"))
            assert ended - first < 30, (gave_up[0], ended)
        releases = Keystore(world / f"keystore-{c}").ledger.read().releases()
        assert "r-mem" not in releases, releases  # nothing reserved
