"""``bench/bench_floor.py``'s per-curator steps run the release's own functions on the bench's
data: every row is read, tagged, split and sorted once, into the shard count the engine picks,
and the follower's tags sent over mutual TLS match the leader's in exactly the common ids."""

from __future__ import annotations

import json
import queue
import sys
import threading
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_floor_steps_read_tag_split_sort_and_match_every_row(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    from bench_floor import STEPS, curator_steps
    from cluster_data import write_partitioned

    from secure_release.infra.pki import init_pki
    from secure_release.mechanism.alignment.sharding import shard_bits_for

    data = tmp_path / "data"
    write_partitioned(data, 30_000, 3, rows_per_group=8192)
    init_pki(tmp_path / "pki", [("curator", "alice"), ("curator", "bob")])
    port: queue.Queue[int] = queue.Queue()
    runs: dict[str, Any] = {}

    def run(curator: str, role: str) -> None:
        link = (role, str(tmp_path / "pki" / curator), port)
        try:
            runs[curator] = curator_steps(str(data / curator), str(data / f"{curator}.json"), bytes(range(32)), link)
        except Exception as exc:  # reported by the assertion below
            runs[curator] = repr(exc)

    threads = [threading.Thread(target=run, args=a) for a in (("alice", "leader"), ("bob", "follower"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(runs) == {"alice", "bob"}
    assert all(isinstance(r, dict) for r in runs.values()), runs
    for curator in ("alice", "bob"):
        assert runs[curator]["rows"] == 30_000
        assert runs[curator]["shards"] == 1 << shard_bits_for(30_000)
        assert set(runs[curator]["cpu_seconds"]) == set(STEPS)
    assert runs["alice"]["common"] == json.loads((data / "manifest.json").read_text())["n_common"]
    assert runs["bob"]["common"] is None
