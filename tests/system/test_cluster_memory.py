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
import sys
import time
from pathlib import Path

import pytest
from support import child_env

from secure_release.cluster import Cluster, launch_release, set_budgets
from secure_release.curator.records.keystore import Keystore

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from cluster_data import write_partitioned  # noqa: E402


def test_a_task_that_cannot_fit_in_a_worker_fails_the_release_by_name_within_seconds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_partitioned(data, 2_000_000, 8, rows_per_group=1 << 18)
    from secure_release.cluster import PARTIES
    from secure_release.infra.pki import init_pki
    from secure_release.mechanism.primitives.keys import AlignmentKey

    certs = tmp_path / "certs"
    init_pki(certs, list(PARTIES))
    akey = tmp_path / "align.key"
    akey.write_text(AlignmentKey(bytes(range(4, 36))).reveal().hex())
    world = tmp_path / "w"
    world.mkdir()
    cluster = Cluster(world, env=child_env(testing=True))
    dirs = {c: data / c for c in ("alice", "bob")}
    set_budgets(cluster, {world / f"keystore-{c}": d for c, d in dirs.items()}, 2.0, certs)
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
