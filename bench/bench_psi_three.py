"""Three curators aligned by PSI through the four services (issue 41; a script).

Run:  PYTHONPATH=. python bench/bench_psi_three.py [--rows 1000000] [--psi-workers 1] [--json]

Three curators (alice leads, bob, carol; ``secure-release demo``'s three-curator data, ``--rows``
ids each, all shared) release through the server and the researcher over mutual TLS, every party
its own process on this machine: first aligned by the keyed hash (the same-run reference), then by
PSI (the N = 3 ring: a one-time mask on each own list, two hops through the leader's mailbox,
every re-blinding proved). Every curator runs in one process (``--engine local``) with
``--psi-workers``: a leader of three curators does not run the ring on a cluster.

Printed: the wall time of each release (first process started -> estimate received), PSI over
the keyed hash, each curator's ring (psi_started -> psi_aligned) and CPU seconds, and the peak RSS
of every process. The ring's CPU is the floor: 3 curators x ids x (1 hash + 4 multiplications)
shared by the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_cluster import Poller, stage_times  # noqa: E402

from secure_release.cluster import Cluster, get_estimate, launch_release, parties, set_budgets  # noqa: E402
from secure_release.demo_data import write_demo_data  # noqa: E402
from secure_release.infra.pki import init_pki  # noqa: E402

CURATORS = ("alice", "bob", "carol")
TIMEOUT_S = "3600"


def ring_seconds(log: Path) -> dict[str, float]:
    """psi_started -> psi_aligned of one curator (its ``seconds`` field) and its ids."""
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "psi_aligned":
            return {"ring_s": float(rec["seconds"]), "ids": int(rec["ids"])}
    return {}


def release(work: Path, data: Path, certs: Path, akey: Path, alignment: str, workers: int) -> dict[str, Any]:
    """One release of the three curators' tables with ``alignment`` (hash or psi)."""
    root = work / alignment
    root.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cluster = Cluster(root, env=env)
    set_budgets(cluster, {root / f"keystore-{c}": data / f"{c}.csv" for c in CURATORS}, 4.0, certs)
    extra = {c: ["--timeout", TIMEOUT_S, *(["--psi-workers", str(workers)] if alignment == "psi" else [])]
             for c in CURATORS}  # fmt: skip
    poller = Poller(cluster)
    poller.start()
    try:
        t0 = time.perf_counter()
        addrs = launch_release(cluster, data, certs, "r3", 1.0, None, "chacha20", akey, curators=CURATORS,
                               curator_extra=extra, budgets=False, alignment=alignment,
                               researcher_extra=["--timeout", TIMEOUT_S])  # fmt: skip
        resp = get_estimate(addrs["researcher"], certs, "r3", timeout=float(TIMEOUT_S))
        wall = time.perf_counter() - t0
        poller.sample()
    except Exception:
        sys.stderr.write(cluster.tails(20))
        raise
    finally:
        poller.stop.set()
        cluster.close()
    return {
        "alignment": alignment,
        "seconds": round(wall, 2),
        "n": resp.privacy.n,
        "m": resp.privacy.m,
        "rings": {c: ring_seconds(root / f"{c}.log") for c in CURATORS},
        "stages": {c: stage_times(root / f"{c}.log") for c in CURATORS},
        "peak_rss_mib": {k: round(v, 1) for k, v in sorted(poller.peak.items())},
        "cpu_seconds": {k: round(v, 2) for k, v in sorted(poller.cpu.items())},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="ids of each curator (all shared)")
    ap.add_argument("--psi-workers", type=int, default=1, help="each curator's --psi-workers")
    ap.add_argument("--data-root", default="/work/bench-data", help="where the generated tables are kept")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    data = Path(args.data_root) / f"three-{args.rows}"
    if not (data / "carol.csv").exists():
        sys.stderr.write(f"writing three curators' tables of {args.rows} rows in {data}\n")
        write_demo_data(data, rows=args.rows, seed=7, curators=3)
    with tempfile.TemporaryDirectory(dir=args.data_root) as tmp:
        work = Path(tmp)
        certs = work / "certs"
        init_pki(certs, parties(CURATORS))
        akey = work / "align.key"
        akey.write_text(secrets.token_hex(32))
        runs = {a: release(work, data, certs, akey, a, args.psi_workers) for a in ("hash", "psi")}
    out = {"rows": args.rows, "psi_workers": args.psi_workers, "runs": runs,
           "psi_over_hash": round(runs["psi"]["seconds"] / runs["hash"]["seconds"], 2),
           "cores": os.cpu_count()}  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    psi = runs["psi"]
    print(f"three curators, {args.rows:,} ids each, n = {psi['n']:,}, m = {psi['m']:,}, {os.cpu_count()} cores:")
    print(f"  keyed hash {runs['hash']['seconds']} s, PSI {psi['seconds']} s ({out['psi_over_hash']}x)")
    for c in CURATORS:
        ring = psi["rings"][c]
        cpu = psi["cpu_seconds"].get(c)
        print(f"  {c}: ring {ring.get('ring_s')} s; CPU {cpu} s; peak {psi['peak_rss_mib'].get(c)} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
