"""``bench/bench_floor.py``'s per-curator steps run the release's own functions on the bench's
data: every row is read, tagged, split and sorted once, into the shard count the engine picks."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_floor_steps_read_tag_split_and_sort_every_row(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    from bench_floor import STEPS, curator_steps
    from cluster_data import write_partitioned

    from secure_release.mechanism.alignment.sharding import shard_bits_for

    write_partitioned(tmp_path, 30_000, 3, rows_per_group=8192)
    run = curator_steps(str(tmp_path / "bob"), str(tmp_path / "bob.json"), bytes(range(32)))
    assert run["rows"] == 30_000
    assert run["shards"] == 1 << shard_bits_for(30_000)
    assert set(run["cpu_seconds"]) == set(STEPS)
    assert all(v >= 0 for v in run["cpu_seconds"].values())
