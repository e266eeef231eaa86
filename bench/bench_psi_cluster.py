"""The PSI ring's stages on a curator's cluster against its workers (issue 41; a script).

Run:  PYTHONPATH=. python bench/bench_psi_cluster.py [--rows 300000] [--workers 1,2] [--repeat 2] [--json]

One curator's share of a two-curator ring, on an embedded Dask cluster of W workers (1 thread
each, 2 GiB), W in ``--workers``, in turn in the same run (``--repeat`` rounds):

* **blind**: its table (``--rows`` ids, Parquet from ``bench/cluster_data.write_partitioned``,
  8 files) read, checked, hashed to the group and blinded on the workers, then sharded by the
  private order tag (``cluster.ring.load_points``);
* **hop**: a list of as many points re-blinded on the workers a slice at a time, each slice proved
  and handed on through the leader's mailbox in files (``cluster.ring.pass_on``: what a curator
  does with its peer's list);
* **finish**: its own list back, turned into tags on the workers and shuffled into tag shards
  (``cluster.ring.finish``).

The driver (this process) and the mailbox are as deployed; the peer's side is played from the
same process between the stages (not timed). Printed: each stage's seconds and the rows a second,
and the ratio of 1 worker's time to W workers' (the scaling; the same run, so the machine's load
moves both). On this 2-core machine 2 workers are the most that can run at once; the whole
deployed ring (two curators, each its workers, the services) is bench_cluster.py --alignment psi.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cluster_data import write_partitioned  # noqa: E402

from secure_release.curator.cluster import ring as rg  # noqa: E402
from secure_release.curator.cluster.engine import open_engine  # noqa: E402
from secure_release.curator.cluster.ring import Transport  # noqa: E402
from secure_release.curator.leader import LeaderState  # noqa: E402
from secure_release.curator.table import load_schema  # noqa: E402
from secure_release.infra.logs import EventLog  # noqa: E402
from secure_release.mechanism.alignment.psi import PsiKey  # noqa: E402
from secure_release.mechanism.primitives.pads import CipherMode  # noqa: E402
from secure_release.mechanism.protocol.architectures import AlignmentMode  # noqa: E402

CURATORS = ("alice", "bob")


def transport(state: LeaderState, me: str) -> Transport:
    def send(owner: str, hop: int, shape: Any, points: bytes, proof: bytes, public: bytes) -> None:
        state.psi_put_slice(me, owner, hop, shape, points, proof, public)

    def receive(owner: str, hop: int, index: int) -> Any:
        got = state.psi_get_slice(me, owner, hop, index, 600.0)
        assert got is not None
        return got

    return Transport(send, receive)


def one_round(data: Path, workers: int, spill: Path) -> dict[str, float]:
    """The three stages of alice's share on a cluster of ``workers`` workers (seconds each)."""
    log = EventLog("curator", "bench")
    keys = {c: PsiKey.generate() for c in CURATORS}
    engine = open_engine("dask", workers=workers, spill_dir=str(spill))
    try:
        state = LeaderState("bench", CURATORS, None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                            alignment=AlignmentMode.PSI, psi_dir=Path(tempfile.mkdtemp(dir=spill)))  # fmt: skip
        spec = load_schema(data / "alice.json")
        t0 = time.perf_counter()
        table = rg.load_points(engine, str(data / "alice"), spec, keys["alice"], 2, log)
        t_blind = time.perf_counter() - t0
        runs = rg.slice_runs(table.sizes)
        shapes = rg.slice_shapes(runs)
        for shape, (shard, start, stop) in zip(shapes, runs, strict=True):  # alice's own list out (not timed)
            points = engine.result(engine.submit(rg.ps.point_slice, table.shards[shard], start, stop))
            state.psi_put_slice("alice", "alice", 1, shape, points)
        # the hop: bob's share on alice's list is the same work as alice's on bob's (timed here
        # on alice's cluster, as her hop of her peer's list)
        t0 = time.perf_counter()
        rg.pass_on(engine, transport(state, "bob"), "alice", 1, keys["bob"], log, 2 * workers)
        t_hop = time.perf_counter() - t0
        t0 = time.perf_counter()
        tags = rg.finish(engine, table, runs, shapes, transport(state, "alice"), "alice", CURATORS, keys["alice"], log,
                         2 * workers)  # fmt: skip
        t_finish = time.perf_counter() - t0
        rows = tags.num_rows
        tags.close()
        state.psi_mailbox.close()
    finally:
        engine.close()
    return {"blind": round(t_blind, 2), "hop": round(t_hop, 2), "finish": round(t_finish, 2),
            "total": round(t_blind + t_hop + t_finish, 2), "rows": rows}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000, help="ids of the curator")
    ap.add_argument("--workers", default="1,2", help="cluster sizes to compare, comma separated (the first: reference)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds, each running every cluster size in turn")
    ap.add_argument("--data-root", default="/work/bench-data", help="where the generated data sets are kept")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    sizes = [int(w) for w in args.workers.split(",")]
    data = Path(args.data_root) / f"psi-n{args.rows}"
    if not (data / "manifest.json").exists():
        sys.stderr.write(f"generating {args.rows} rows a curator in {data}\n")
        write_partitioned(data, args.rows, 8)
    runs: dict[int, list[dict[str, float]]] = {w: [] for w in sizes}
    with tempfile.TemporaryDirectory(dir=args.data_root) as tmp:
        for round_ in range(args.repeat):
            for w in sizes:
                sys.stderr.write(f"round {round_ + 1}: {w} worker(s) ...\n")
                runs[w].append(one_round(data, w, Path(tmp)))
                sys.stderr.write(json.dumps(runs[w][-1]) + "\n")
    best = {w: {k: min(r[k] for r in rs) for k in ("blind", "hop", "finish", "total")} for w, rs in runs.items()}
    ref = sizes[0]
    speedup = {w: {k: round(best[ref][k] / best[w][k], 2) for k in best[w]} for w in sizes}
    per_round = {w: [round(a["total"] / b["total"], 2) for a, b in zip(runs[ref], runs[w], strict=True)] for w in sizes}
    medians = {w: statistics.median(v) for w, v in per_round.items()}
    out = {"rows": args.rows, "runs": runs, "best_seconds": best, "speedup_over_first": speedup,
           "speedup_by_round": per_round, "median_speedup": medians}  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"one curator's PSI stages, {args.rows:,} ids, best of {args.repeat} rounds:")
    for w in sizes:
        b = best[w]
        print(f"  {w} worker(s): blind {b['blind']} s, hop {b['hop']} s, finish {b['finish']} s, total {b['total']} s "
              f"({args.rows / b['total']:,.0f} ids/s); {ref} worker(s) / {w}: {speedup[w]['total']}x "
              f"(rounds {per_round[w]})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
