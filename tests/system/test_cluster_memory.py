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

from secure_release.curator.records.keystore import Keystore

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_task_that_cannot_fit_in_a_worker_fails_the_release_by_name_within_seconds(
    tmp_path: Path, store: str
) -> None:
    """Whether the workers hold the shards or the store keeps them on disk (then a partition's
    read is the task that cannot fit)."""
    made = cluster_world(tmp_path, 2_000_000, 8, 1 << 18)
    world = made.world
    extra = made.flags("--timeout", "300", "--workers", "2", "--worker-memory", "100MiB", "--shard-store", store)
    try:
        codes = made.release_until_exit("r-mem", 100_000, extra)
        ended = time.time()
    finally:
        made.cluster.close()
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
