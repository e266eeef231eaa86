"""The release's own per-row steps with no engine around them, against DuckDB in the same run.

Run:  PYTHONPATH=. python bench/bench_floor.py [--rows 100000000] [--files 64]
          [--data-root /work/bench-data] [--fraction 0.1] [--json]

What ``bench/bench_cluster.py`` times is the whole release: two curators on Dask clusters, the
four services, the agreement. This script asks how much of that is the per-row work any engine
of this protocol has to do at each curator, and how much the engine adds. For the same files
(``bench/cluster_data.write_partitioned``, generated once under ``--data-root``), each curator in
a process of its own, both at once (as the two curators share this machine's cores):

1. **read**: every partition through the curator's reader (``read_partition``: the Parquet decode,
   the cell rule's checks, the attribute codes);
2. **tag**: the ids' AES-256-CMAC tags (``id_tags``), as the words a worker sorts;
3. **split**: each partition's (tag, symbol) rows split by shard (``split_by_shard``), with the
   shard count the engine picks for n (``shard_bits_for``);
4. **sort**: each shard's pieces merged and sorted by tag (``merge_pieces``, the radix order).

No Dask, no TLS, no agreement, no sample, no encryption: the floor under the read and the shuffle
stages, and a lower bound on the release. The reference is DuckDB in a fresh process, in the same
run (``cluster_data.duckdb_reference``: read both directories, join on the id, keep the m rows of
smallest hash, count the cells; 2 threads). Printed: each curator's CPU seconds per step, the wall
time of both curators together, and that wall time over DuckDB's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_data import duckdb_reference, write_partitioned

STEPS = ("read", "tag", "split", "sort")


def curator_steps(data: str, schema: str, key: bytes) -> dict[str, Any]:
    """One curator's steps over its partitions: CPU and wall seconds of each, and the rows."""
    import numpy as np

    from secure_release.curator.columnar import load_schema
    from secure_release.curator.partitions import discover, read_partition
    from secure_release.mechanism.alignment import sharding as sh
    from secure_release.mechanism.alignment.keyed_hash import id_tags
    from secure_release.mechanism.primitives.keys import AlignmentKey

    spec, alignment_key = load_schema(schema), AlignmentKey(key)
    cpu = dict.fromkeys(STEPS, 0.0)
    started = time.perf_counter()
    partitions = discover(data)
    shard_bits = sh.shard_bits_for(sum(p.num_rows or 0 for p in partitions))  # Parquet: from its metadata
    pieces = []
    for partition in partitions:  # a partition at a time, as the engine's read stage runs them
        t0 = time.process_time()
        table = read_partition(partition, spec, check_repeats=False)
        t1 = time.process_time()
        tags = id_tags(table.id_values(), alignment_key).astype(sh.WORK_DTYPE)
        symbols = table.symbols().astype(np.uint8)
        del table
        t2 = time.process_time()
        pieces.append(sh.split_by_shard(tags, shard_bits, symbols))
        cpu["read"] += t1 - t0
        cpu["tag"] += t2 - t1
        cpu["split"] += time.process_time() - t2
    rows = sum(int(p.tags.size) for parts in pieces for p in parts)
    t0 = time.process_time()
    sizes = [sh.merge_pieces([p[shard] for p in pieces]).size for shard in range(1 << shard_bits)]
    cpu["sort"] = time.process_time() - t0
    assert sum(sizes) == rows
    return {"rows": rows, "shards": 1 << shard_bits, "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()},
            "seconds": round(time.perf_counter() - started, 2)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10**8, help="rows a curator (default 10^8)")
    ap.add_argument("--files", type=int, default=64, help="Parquet files a curator (default 64)")
    ap.add_argument("--data-root", default="/work/bench-data", help="where the data is kept between runs")
    ap.add_argument("--fraction", type=float, default=0.1, help="m = fraction * common ids (DuckDB's top-m)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    data = Path(args.data_root) / f"n{args.rows}"
    manifest = data / "manifest.json"
    if not manifest.exists():
        sys.stderr.write(f"generating {args.rows} rows a curator in {args.files} files under {data}\n")
        write_partitioned(data, args.rows, args.files)
    m = max(1, int(json.loads(manifest.read_text())["n_common"] * args.fraction))
    sys.stderr.write(f"n={args.rows}: duckdb (m={m}) ...\n")
    reference = duckdb_reference(data, m)
    sys.stderr.write(f"n={args.rows}: both curators' steps, in parallel ...\n")
    key = secrets.token_bytes(32)
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        args_of = {c: (str(data / c), str(data / f"{c}.json"), key) for c in ("alice", "bob")}
        runs = [pool.apply_async(curator_steps, a) for a in args_of.values()]
        curators = dict(zip(("alice", "bob"), (r.get() for r in runs), strict=True))
    wall = round(time.perf_counter() - started, 2)
    result = {"rows": args.rows, "m": m, "duckdb_seconds": round(reference["seconds"], 2), "floor_seconds": wall,
              "floor_over_duckdb": round(wall / reference["seconds"], 2), "curators": curators}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"n = {args.rows} a curator, both curators at once (spawn to last shard sorted): {wall} s; "
          f"DuckDB, same run: {result['duckdb_seconds']} s; floor / DuckDB: {result['floor_over_duckdb']}")  # fmt: skip
    for name, run in curators.items():
        steps = ", ".join(f"{k} {v}" for k, v in run["cpu_seconds"].items())
        print(f"  {name}: {run['rows']} rows, {run['shards']} shards; CPU seconds: {steps}; wall {run['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
