"""A release through the real processes over mutual TLS vs the in-process protocol (a script).

Run:  PYTHONPATH=. python bench/bench_services.py [--json] [--rows N] [--m 100000,1000000]

One synthetic Adult-shaped table of N rows (default 1.5 M, split between alice and bob as in
``secure-release demo``) is written once. For every m:

* services: the same process startup as ``secure-release demo`` (secure_release.cluster
  ``Cluster`` + ``launch_release``: server, alice (leader), bob and the researcher as separate
  processes over mutual TLS with a fresh project CA), then the analyst's ``GetEstimate``. Wall
  time = first process started -> estimate received (includes interpreter start-up, reading the
  CSVs, alignment, upload, PRAM, fetch, decryption and estimation; not the one-time ``budget
  set`` of each data set, done before).
* in-process: ``curator.table.read_table`` of both CSVs + ``mechanism.protocol.in_memory.run_release`` on
  the same tables, same epsilon, m and cipher, measured in the same run.

Throughput is N aligned input rows per second of wall time; ratio = in-process time / services
time (= services throughput / in-process throughput; target >= 0.5). ``x read`` = services wall
time / the time pyarrow takes to read both CSVs in the same run (the target: at most 6 at m <= n/10,
8 at m = n), and the curators' peak RSS against 1.5 GiB. Peak RSS per process is
/proc/<pid>/status VmHWM, polled every 50 ms by a thread and read once more after the estimate
is received, before the processes are stopped (VmHWM is a high-water mark, so the last reading
is the peak). CPU user and kernel seconds per process come from /proc/<pid>/stat at the same last
reading: on a VM whose freed memory goes back to the host, the kernel time of first touching
memory can exceed the work itself.

``x fresh`` = services wall time / the same read as the curators must do it: two new interpreters
started at once, each importing pyarrow and reading one curator's CSV (best of 2; process start
to both exits). The warm reference pays neither start-up nor first touch of fresh memory; the
fresh one shows what this machine gives a new process.

The server never holds more than one upload chunk of ciphertext at once, so its peak RSS should
not grow with m; the script prints the ratio of the server's peaks.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from secure_release.cluster import PARTIES, Cluster, get_estimate, launch_release, set_budgets  # noqa: E402
from secure_release.curator.table import load_schema, read_table  # noqa: E402
from secure_release.demo_data import write_demo_data  # noqa: E402
from secure_release.infra.pki import init_pki  # noqa: E402
from secure_release.mechanism.protocol import in_memory as protocol  # noqa: E402

ROLES = ("server", "alice", "bob", "researcher")


def vm_hwm_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> tuple[float, float] | None:
    """(user, kernel) CPU seconds of a live process, from /proc/<pid>/stat (None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


class RssPoller(threading.Thread):
    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.peak: dict[str, float] = {}
        self.cpu: dict[str, tuple[float, float]] = {}
        self.stop = threading.Event()

    def sample(self) -> None:
        for name, proc in list(self.cluster.procs.items()):
            v = vm_hwm_mib(proc.pid)
            if v is not None:
                self.peak[name] = max(self.peak.get(name, 0.0), v)
            cpu = cpu_seconds(proc.pid)
            if cpu is not None:
                self.cpu[name] = cpu

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.sample()


def run_services(
    root: Path, data: Path, certs: Path, akey: Path, m: int, epsilon: float, cipher: str
) -> dict[str, Any]:
    work = root / f"services-m{m}"
    work.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cluster = Cluster(work, env=env)
    poller = RssPoller(cluster)
    poller.start()
    # the operator sets each curator's budget once per data set, before any release: not timed
    set_budgets(cluster, {work / f"keystore-{c}": data / f"{c}.csv" for c in ("alice", "bob")}, max(1.0, epsilon),
                certs)  # fmt: skip
    try:
        t0 = time.perf_counter()
        addrs = launch_release(cluster, data, certs, f"bench-{m}", epsilon, m, cipher, akey, budgets=False)
        resp = get_estimate(addrs["researcher"], certs, f"bench-{m}", timeout=900)
        wall = time.perf_counter() - t0
        poller.sample()  # every process is still alive here: the last (= peak) VmHWM
    except Exception:
        sys.stderr.write(cluster.tails(15))
        raise
    finally:
        poller.stop.set()
        cluster.close()
    assert resp.privacy.m == m and not resp.marginal, (resp.privacy.m, resp.marginal)
    return {
        "seconds": wall,
        "n": resp.privacy.n,
        "m": resp.privacy.m,
        "gamma": resp.privacy.gamma,
        "estimate": [c.estimate for c in resp.cells],
        "peak_rss_mib": {r: round(poller.peak.get(r, float("nan")), 1) for r in ROLES},
        "cpu_user_kernel_s": {r: [round(x, 2) for x in poller.cpu[r]] for r in ROLES if r in poller.cpu},
    }


def run_inprocess(data: Path, m: int, epsilon: float, cipher: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    tables = [read_table(data / f"{c}.csv", load_schema(data / f"{c}.json")) for c in ("alice", "bob")]
    t1 = time.perf_counter()
    res = protocol.run_release(tables, epsilon, m, cipher, f"bench-{m}")
    t2 = time.perf_counter()
    return {
        "seconds": t2 - t0,
        "read_seconds": t1 - t0,
        "release_seconds": t2 - t1,
        "n": res.plan.n,
        "m": res.plan.m,
        "gamma": res.plan.gamma,
        "l2_error": res.l2_error,
    }


def pyarrow_read_seconds(data: Path, reps: int = 2) -> float:
    """The same-run limit: pyarrow.csv.read_csv of both curators' CSV files (multi-threaded,
    one after the other; best of ``reps``). Reading the input is the least any release must do."""
    import pyarrow.csv as pacsv

    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for c in ("alice", "bob"):
            pacsv.read_csv(data / f"{c}.csv")
        best = min(best, time.perf_counter() - t)
    return best


_FRESH_READ = "import sys, pyarrow.csv; pyarrow.csv.read_csv(sys.argv[1])"


def fresh_read_seconds(data: Path, reps: int = 2) -> float:
    """Both CSVs read as the curators read them: two new interpreters started together, each
    importing pyarrow and reading one file (wall time from start to both exits; best of ``reps``)."""
    import subprocess

    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        files = [str(data / f"{c}.csv") for c in ("alice", "bob")]
        procs = [subprocess.Popen([sys.executable, "-c", _FRESH_READ, f]) for f in files]
        codes = [proc.wait() for proc in procs]
        if any(codes):
            raise RuntimeError(f"a fresh pyarrow read failed (exit codes {codes})")
        best = min(best, time.perf_counter() - t)
    return best


def target_multiple(m: int, n: int) -> float:
    """The target bound on services wall time / pyarrow read: 6x at m <= n/10, 8x above."""
    return 6.0 if 10 * m <= n else 8.0


CURATOR_RSS_TARGET_MIB = 1536.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--rows", type=int, default=1_500_000, help="rows of the table (>= max m)")
    p.add_argument("--m", default="100000,1000000", help="comma-separated sample sizes")
    p.add_argument("--epsilon", type=float, default=0.5)
    p.add_argument("--cipher", choices=["otp", "chacha20"], default="chacha20")
    p.add_argument("--no-inprocess", action="store_true", help="skip the in-process reference (saves memory)")
    args = p.parse_args()
    ms = [int(x) for x in args.m.split(",")]
    if max(ms) > args.rows:
        p.error(f"--rows {args.rows} must be >= every m ({max(ms)})")
    out: dict[str, Any] = {
        "rows": args.rows,
        "epsilon": args.epsilon,
        "cipher": args.cipher,
        "cpus": os.cpu_count(),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-services-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        info = write_demo_data(root / "data", args.rows)
        init_pki(root / "certs", PARTIES, force=True)
        akey = root / "align.key"
        akey.write_text(secrets.token_hex(32))
        akey.chmod(0o600)
        out["setup_seconds"] = time.perf_counter() - t
        for m in ms:
            read = pyarrow_read_seconds(root / "data")
            fresh = fresh_read_seconds(root / "data")
            svc = run_services(root, root / "data", root / "certs", akey, m, args.epsilon, args.cipher)
            ref = None if args.no_inprocess else run_inprocess(root / "data", m, args.epsilon, args.cipher)
            assert svc["n"] == info["n"] and (ref is None or (ref["n"] == svc["n"] and svc["gamma"] == ref["gamma"]))
            n = svc["n"]
            multiple = svc["seconds"] / read
            curator_rss = max(v for k, v in svc["peak_rss_mib"].items() if k not in ("server", "researcher"))
            run: dict[str, Any] = {
                "m": m,
                "n": n,
                "gamma": svc["gamma"],
                "services_seconds": round(svc["seconds"], 3),
                "pyarrow_read_seconds": round(read, 3),
                "multiple_of_pyarrow_read": round(multiple, 2),
                "fresh_read_seconds": round(fresh, 3),
                "multiple_of_fresh_read": round(svc["seconds"] / fresh, 2),
                "target_multiple": target_multiple(m, n),
                "pass_multiple": multiple <= target_multiple(m, n),
                "curator_peak_rss_mib": curator_rss,
                "pass_curator_rss": curator_rss <= CURATOR_RSS_TARGET_MIB,
                "services_rows_per_s": round(n / svc["seconds"]),
                "peak_rss_mib": svc["peak_rss_mib"],
                "cpu_user_kernel_s": svc["cpu_user_kernel_s"],
            }
            if ref is not None:
                run.update(
                    inprocess_seconds=round(ref["seconds"], 3),
                    inprocess_read_seconds=round(ref["read_seconds"], 3),
                    inprocess_release_seconds=round(ref["release_seconds"], 3),
                    inprocess_rows_per_s=round(n / ref["seconds"]),
                    ratio=round(ref["seconds"] / svc["seconds"], 3),
                    target_ratio=0.5,
                    **{"pass": ref["seconds"] / svc["seconds"] >= 0.5},
                )
            out["runs"].append(run)
    runs = out["runs"]
    if len(runs) >= 2:
        lo, hi = runs[0]["peak_rss_mib"]["server"], runs[-1]["peak_rss_mib"]["server"]
        out["server_peak_rss_ratio"] = round(hi / lo, 3)
        out["server_rss_flat"] = hi <= 1.25 * lo
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"table: n = {args.rows} rows (+5 unmatched per curator), epsilon {args.epsilon}, "
        f"cipher {args.cipher}, {out['cpus']} cpus; setup (data + PKI) {out['setup_seconds']:.1f} s"
    )
    print(
        f"{'m':>9} {'services s':>11} {'pyarrow s':>10} {'x read':>7} {'target':>7} {'fresh s':>8} {'x fresh':>8} "
        f"{'in-proc s':>10} "
        f"{'ratio':>6} | peak RSS MiB: " + " ".join(f"{r:>10}" for r in ROLES)
    )
    for r in runs:
        inproc = f"{r['inprocess_seconds']:>10.2f} {r['ratio']:>6.2f}" if "ratio" in r else f"{'-':>10} {'-':>6}"
        print(
            f"{r['m']:>9} {r['services_seconds']:>11.2f} {r['pyarrow_read_seconds']:>10.2f} "
            f"{r['multiple_of_pyarrow_read']:>7.2f} {'<= ' + format(r['target_multiple'], 'g'):>7} "
            f"{r['fresh_read_seconds']:>8.2f} {r['multiple_of_fresh_read']:>8.2f} {inproc} |"
            "               " + " ".join(f"{r['peak_rss_mib'][x]:>10.1f}" for x in ROLES)
        )
    print(
        "x read = services wall time / pyarrow.csv.read_csv of both CSVs in the same run; curator peak RSS "
        f"target <= {CURATOR_RSS_TARGET_MIB:g} MiB: "
        + ", ".join(f"m={r['m']}: {r['curator_peak_rss_mib']:.0f} MiB" for r in runs)
    )
    print(
        "x fresh = services wall time / both CSVs read by two new interpreters at once (start-up and fresh "
        "memory included, as a curator pays them)"
    )
    for r in runs:
        cpu = r["cpu_user_kernel_s"]
        print(
            f"CPU user / kernel s at m={r['m']}: "
            + ", ".join(f"{name} {cpu[name][0]:.2f} / {cpu[name][1]:.2f}" for name in ROLES if name in cpu)
        )
    if any("ratio" in r for r in runs):
        print(
            "in-process split (read CSVs / run_release): "
            + ", ".join(
                f"m={r['m']}: {r['inprocess_read_seconds']:.2f} / {r['inprocess_release_seconds']:.2f} s"
                for r in runs
                if "ratio" in r
            )
        )
    if "server_peak_rss_ratio" in out:
        print(
            f"server peak RSS m={runs[-1]['m']} / m={runs[0]['m']}: {out['server_peak_rss_ratio']:.3f} "
            f"({'flat' if out['server_rss_flat'] else 'GROWS'}; ratio target >= 0.5 per row above)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
