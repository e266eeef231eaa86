"""A release whose curators run on Dask clusters, through the four services, vs DuckDB (a script).

Run:  PYTHONPATH=. python bench/bench_cluster.py [--rows 10000000,100000000] [--fractions 0.1,1]
          [--files 16,64] [--workers 2] [--data-root /work/bench-data] [--no-local] [--repeat 5]
          [--alignment psi] [--shard-store auto|disk|memory] [--disk-interval 1.0] [--disk-plot disk.png] [--json]

``--alignment psi`` (issue 41): the curators align by the ECDH ring on their clusters; the same
run also releases with the keyed hash on the same clusters (the ratio psi / hash), and the stage
times add psi_started, psi_ring_done (the ring) and psi_shards_sorted (the tags' shuffle).

For every n (rows per curator), two curators' partitioned Parquet (90% id overlap, Adult-shaped
categories; ``bench/cluster_data.write_partitioned``, generated once with bounded memory and kept
under ``--data-root``). For every m = fraction * n_common:

* **dask**: server, alice (leader), bob and the researcher as separate processes over mutual TLS
  (the demo's start-up), each curator with ``--engine dask`` on an embedded cluster of
  ``--workers`` worker processes (1 thread each, 2 GiB memory limit each, spilling above).
  Wall time = first process started -> estimate received; the budgets are set before (not timed).
  Per-stage times come from the curators' own log events (seconds after the curator started):
  engine started, partitions read (read + check + hash + split), shards sorted (the shuffle),
  agreed (tags to the leader, intersection, agreement back), aligned (gather of the aligned
  column), prepared (sample, pad, keystore), committed (upload), released (sealed at the server).
* **duckdb** (the reference, the same run): a fresh process reads the same files, joins them on
  the id, keeps the m rows with the smallest hash of the id and counts the cells
  (``bench/cluster_data.duckdb_reference``): its time and peak RSS.
* **local** (n = 10^7 only, unless ``--no-local``): the same release with ``--engine local``
  (the curator reads the directory in-process). ``--repeat N``: N such dask/local pairs in turn
  (the machine is shared, so one pair's ratio moves by 20%): every ratio and their median.

Peak RSS: VmHWM of every process (each curator's driver, which also runs its scheduler and its
workers' nannies; its forkserver, worker processes and resource tracker; the server, the
researcher), polled every 0.25 s (one scan of /proc a poll) and read once more before the processes
are stopped. Ratios printed: dask / duckdb at the same m, dask / local at 10^7, and the server's
and researcher's peak at m = n over their peak at m = n / 10 (flat in m: <= 1.2).

Disk profile (``bench/disk_profile.py``): every release (dask and local) polls each curator's
keystore directory, under which its engine keeps all its working files (Dask spill, the handoff
directory, the shard store, the leader's spool, sample files), every ``--disk-interval`` seconds
(default 1; bytes allocated: st_blocks * 512 of every file, as du counts) and the filesystem's
free bytes. The keystore also holds small files from before the run (ledger, keys, certificates):
a baseline is measured right before the release is launched, and the peak minus that baseline is
reported as the engine's extra disk (``disk_peak_bytes``, at ``disk_peak_seconds`` after launch),
over the curator's input (the size of its Parquet directory: ``disk_ratio``), with the lowest free
bytes seen and a downsampled series (at most 600 points). A peak shorter than the interval can be
missed. ``--disk-plot PATH``: a PNG of the last entry's dask run (GB against minutes, each
curator's input and twice it as horizontal lines, the curators' stages as vertical ones).
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import secrets
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cluster_data import child_map, descendants, duckdb_reference, vm_hwm_mib, write_partitioned  # noqa: E402
from disk_profile import DiskPoller, downsample, input_bytes  # noqa: E402

from secure_release.cluster import PARTIES, Cluster, get_estimate, launch_release, set_budgets  # noqa: E402
from secure_release.infra.pki import init_pki  # noqa: E402

ROLES = ("server", "alice", "bob", "researcher")
WORKER_MEMORY = ["2GiB"]  # --worker-memory of each curator's embedded workers (set from the command line)
TAG_STREAMS = ["0"]  # --tag-streams of the follower (0: one a worker)
SHARD_STORE = ["auto"]  # --shard-store of both curators (auto: on disk past 60% of the workers' memory)
TIMEOUT_S = "7200"  # every party's --timeout: a release of 3 * 10^8 rows a curator takes minutes here
STAGES = ("engine_started", "partitions_read", "shards_sorted", "psi_started", "psi_ring_done", "psi_shards_sorted",
          "tags_submitted", "agreed", "aligned", "prepared", "committed", "released")  # fmt: skip
ALIGNMENT = ["hash"]  # --alignment of every curator (psi: the ECDH ring on the curators' clusters, issue 41)
DISK_INTERVAL = [1.0]  # --disk-interval: seconds between two scans of the curators' keystores


POLL_S = 0.25  # the poller's interval


class Poller(threading.Thread):
    """Per-process VmHWM and CPU time of every role and its descendants (an embedded cluster's
    forkserver, workers and resource tracker)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster, self.stop = cluster, threading.Event()
        self.peak: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def sample(self) -> None:
        kids = child_map()  # one scan of /proc for every tree
        for role, proc in list(self.cluster.procs.items()):
            pids = descendants(proc.pid, kids)  # the role first, then its children
            for i, pid in enumerate(pids):
                hwm = vm_hwm_mib(pid)
                if hwm is None:
                    continue
                name = role if i == 0 else f"{role}/{_kind(pid, proc.pid)}-{pid}"
                self.peak[name] = max(self.peak.get(name, 0.0), hwm)
                self.cpu[name] = max(self.cpu.get(name, 0.0), cpu_seconds(pid))

    def run(self) -> None:
        # VmHWM is the kernel's own peak, so a poll only has to come before a process exits:
        # every 0.25 s costs the measured run about 1% of a core here (every 50 ms, with a scan
        # of /proc a process, it was 21%)
        while not self.stop.wait(POLL_S):
            self.sample()


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used (/proc/PID/stat), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def _kind(pid: int, role_pid: int) -> str:
    """What a process under a role is: the embedded cluster's resource tracker, its forkserver
    (a child of the role) or a worker (a child of the forkserver)."""
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return "proc"
    if "resource_tracker" in text:
        return "tracker"
    return "forkserver" if parent == role_pid else "worker"


def stage_times(log: Path) -> dict[str, float]:
    """Seconds after the curator's first log line at which each stage event was logged."""
    first: float | None = None
    out: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        stamp = rec.get("time")
        if not stamp:
            continue
        t = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + stamp[19:23].rstrip("Z"))
        first = t if first is None else first
        if rec.get("event") in STAGES and rec["event"] not in out:
            out[rec["event"]] = round(t - first, 2)
    return out


def log_start(log: Path) -> float | None:
    """The wall-clock time (seconds since the epoch) of the curator's first log line (its stamps are
    UTC), which ``stage_times`` counts from; None if it has none."""
    for line in log.read_text(errors="replace").splitlines():
        try:
            stamp = json.loads(line).get("time")
        except (ValueError, AttributeError):
            continue
        if stamp:
            fraction = float("0" + stamp[19:23].rstrip("Z"))
            return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + fraction
    return None


def run_release(root: Path, data: Path, certs: Path, akey: Path, m: int, engine: str, workers: int,
                tag: str, alignment: str | None = None) -> dict[str, Any]:  # fmt: skip
    alignment = alignment or ALIGNMENT[0]
    work = root / tag
    work.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cluster = Cluster(work, env=env)
    dirs = {c: data / c for c in ("alice", "bob")}
    set_budgets(cluster, {work / f"keystore-{c}": d for c, d in dirs.items()}, 4.0, certs)
    extra = {c: ["--data", str(d), "--schema", str(data / f"{c}.json"), "--engine", engine, "--timeout", TIMEOUT_S]
             for c, d in dirs.items()}  # fmt: skip
    if engine == "dask":
        for c in extra:
            extra[c] += ["--workers", str(workers), "--worker-memory", WORKER_MEMORY[0]]
            extra[c] += ["--tag-streams", TAG_STREAMS[0], "--shard-store", SHARD_STORE[0]]
    poller = Poller(cluster)
    poller.start()
    disk = DiskPoller({c: work / f"keystore-{c}" for c in dirs}, DISK_INTERVAL[0])
    baseline = disk.sample()[1]  # the keystore's ledger and keys, before the release
    disk.start()
    try:
        t0 = time.perf_counter()
        addrs = launch_release(cluster, data, certs, tag, 1.0, m, "chacha20", akey, curator_extra=extra, budgets=False,
                               researcher_extra=["--timeout", TIMEOUT_S], alignment=alignment)  # fmt: skip
        resp = get_estimate(addrs["researcher"], certs, tag, timeout=float(TIMEOUT_S))
        wall = time.perf_counter() - t0
        poller.sample()
        disk.stop()
        disk.sample()  # the last one, while the curators still run
    except Exception:
        sys.stderr.write(cluster.tails(20))
        raise
    finally:
        poller.stop.set()
        disk.stop()
        cluster.close()
    if os.environ.get("BENCH_KEEP_LOGS"):  # for a closer look at one run
        keep = Path(os.environ["BENCH_KEEP_LOGS"]) / tag
        keep.mkdir(parents=True, exist_ok=True)
        for log in work.glob("*.log"):
            shutil.copy(log, keep / log.name)
    inputs = {c: input_bytes([d]) for c, d in dirs.items()}  # each curator's Parquet directory
    return {
        "engine": engine,
        "alignment": alignment,
        "seconds": round(wall, 2),
        "n": resp.privacy.n,
        "m": resp.privacy.m,
        "stages": {c: stage_times(work / f"{c}.log") for c in ("alice", "bob")},
        "peak_rss_mib": {k: round(v, 1) for k, v in sorted(poller.peak.items())},
        "cpu_seconds": {k: round(v, 2) for k, v in sorted(poller.cpu.items())},
        "disk": disk_report(disk, baseline, inputs, {c: log_start(work / f"{c}.log") for c in dirs}),
    }


def disk_report(disk: DiskPoller, baseline: dict[str, int], inputs: dict[str, int],
                log_starts: dict[str, float | None]) -> dict[str, Any]:  # fmt: skip
    """Per curator: the engine's peak extra disk (peak - baseline), when (seconds after launch),
    its input and their ratio, and when its log starts (``log_offset_seconds`` after launch: add it
    to its stage times to place them on the disk profile's clock); the lowest free bytes, the
    scans' cost and the series (at most 600 points)."""
    curators: dict[str, dict[str, Any]] = {}
    for c, size in inputs.items():
        extra = disk.peak[c] - baseline[c]
        start = log_starts[c]
        curators[c] = {"disk_peak_bytes": extra, "disk_peak_seconds": disk.peak_seconds[c], "input_bytes": size,
                       "disk_ratio": round(extra / size, 3) if size else None, "baseline_bytes": baseline[c],
                       "log_offset_seconds": None if start is None else round(start - disk.started_at, 2)}  # fmt: skip
    return {
        "curators": curators,
        "free_min_bytes": disk.min_free,
        "interval_s": disk.interval,
        "scans": len(disk.scan_seconds),
        "scan_seconds_max": round(disk.max_scan_seconds, 4),
        "series": downsample(disk.series, 600),
    }


def write_disk_plot(entry: dict[str, Any], path: Path, workers: int) -> None:
    """The disk profile of one entry's dask run as a PNG at ``path``, the curators' stages marked
    (moved from the curator's log clock to the launch's)."""
    from disk_profile import plot_disk

    run, disk = entry["dask"], entry["dask"]["disk"]
    offset = {c: d["log_offset_seconds"] or 0.0 for c, d in disk["curators"].items()}
    stages = {f"{c} {name}": t + offset[c] for c, times in run["stages"].items() for name, t in times.items()}
    title = f"engine disk: n={entry['rows']:,} m={entry['m']:,}, {run['alignment']}, {workers} workers a curator"
    plot_disk(disk["series"], {c: d["input_bytes"] for c, d in disk["curators"].items()}, path, title, stages,
              {c: d["baseline_bytes"] for c, d in disk["curators"].items()})  # fmt: skip
    sys.stderr.write(f"disk profile written to {path}\n")


def peak_growth(results: list[dict[str, Any]]) -> dict[str, Any]:
    """How much each role's peak RSS grows per row of n between the smallest and the largest n
    measured at the same fraction m / n (the first fraction of each): (peak at the larger n -
    peak at the smaller) / (difference of n), in bytes. Workers (and other children of a role)
    are summed by kind: the largest worker of each curator."""
    firsts: dict[int, dict[str, Any]] = {}
    for r in results:
        firsts.setdefault(r["rows"], r)
    if len(firsts) < 2:
        return {}
    small, big = firsts[min(firsts)], firsts[max(firsts)]

    def by_kind(peaks: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, mib in peaks.items():
            role, _, child = name.partition("/")
            key = role if not child else f"{role}/{child.rsplit('-', 1)[0]}"
            out[key] = max(out.get(key, 0.0), mib)
        return out

    lo, hi = by_kind(small["dask"]["peak_rss_mib"]), by_kind(big["dask"]["peak_rss_mib"])
    rows = big["rows"] - small["rows"]
    per_row = {k: round((hi[k] - lo[k]) * 2**20 / rows, 2) for k in sorted(hi) if k in lo}
    return {"from": small["rows"], "to": big["rows"], "bytes_per_row": per_row}


def same_data(manifest: Path, n: int, files: int, compression: str) -> bool:
    """Whether the kept data set at ``manifest`` is the one asked for (data written before the
    manifest named its compression was snappy)."""
    if not manifest.exists():
        return False
    info = json.loads(manifest.read_text())
    return (info["n"], info["files_per_curator"], info.get("compression", "snappy")) == (n, files, compression)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="10000000,100000000",
                    help="rows per curator, comma separated (one n twice: two runs of it)")
    ap.add_argument("--files", default="16,64", help="Parquet files per curator for each --rows entry")
    ap.add_argument("--fractions", default="0.1,1", help="m as fractions of the common ids")
    ap.add_argument("--workers", type=int, default=2, help="Dask worker processes per curator")
    ap.add_argument("--data-root", default="/work/bench-data", help="where the generated data sets are kept")
    ap.add_argument("--worker-memory", default="2GiB", help="memory limit of each worker (they spill above 60%%)")
    ap.add_argument("--tag-streams", default="0", help="the follower's tag streams (0: one a worker)")
    ap.add_argument("--shard-store", default="auto", choices=("auto", "disk", "memory"),
                    help="both curators' --shard-store (auto: memory at 10^8 rows on 2 workers of 2 GiB, disk past)")
    ap.add_argument("--duckdb-max-rows", type=int, default=10**12,
                    help="skip the DuckDB reference above this n (it ran out of 16 GB at 3 * 10^8 here)")
    ap.add_argument("--no-local", action="store_true", help="skip the --engine local run at 10^7")
    ap.add_argument("--repeat", type=int, default=1,
                    help="at 10^7: this many dask/local pairs, each in turn; prints every ratio and the median")
    ap.add_argument("--compression", default="zstd", choices=("zstd", "snappy"),
                    help="the generated Parquet's compression (zstd: 6.1 bytes a row, snappy 10.6); data kept "
                         "under --data-root is generated again if its rows, files or compression differ")
    ap.add_argument("--alignment", default="hash", choices=("hash", "psi"),
                    help="every curator's --alignment; psi also runs the keyed-hash release on the clusters as "
                         "its same-run reference (psi / hash)")
    ap.add_argument("--disk-interval", type=float, default=1.0,
                    help="seconds between two scans of the curators' keystores (the disk profile)")
    ap.add_argument("--disk-plot", metavar="PATH",
                    help="write a PNG of the disk profile of the last entry's dask run (the last --rows, --fractions)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    WORKER_MEMORY[0], TAG_STREAMS[0], ALIGNMENT[0] = args.worker_memory, args.tag_streams, args.alignment
    SHARD_STORE[0] = args.shard_store
    DISK_INTERVAL[0] = args.disk_interval
    rows = [int(r) for r in args.rows.split(",")]
    files = [int(f) for f in args.files.split(",")]
    fractions = [float(f) for f in args.fractions.split(",")]
    root = Path(args.data_root)
    results: list[dict[str, Any]] = []
    import tempfile

    with tempfile.TemporaryDirectory(dir=root) as tmp:
        work = Path(tmp)
        certs = work / "certs"
        init_pki(certs, list(PARTIES))
        akey = work / "align.key"
        akey.write_text(secrets.token_hex(32))
        for index, (n, nfiles) in enumerate(zip(rows, files, strict=False)):
            again = rows[:index].count(n)  # --rows may name one n more than once: each run its own name
            run = f"-r{again}" if again else ""
            data = root / f"n{n}"
            if not same_data(data / "manifest.json", n, nfiles, args.compression):
                sys.stderr.write(f"generating {n} rows a curator, {nfiles} {args.compression} files each, in {data}\n")
                write_partitioned(data, n, nfiles, compression=args.compression)
            common = json.loads((data / "manifest.json").read_text())["n_common"]
            for fraction in fractions:
                m = max(1, int(common * fraction))
                sys.stderr.write(f"n={n} m={m}: duckdb ...\n")
                try:
                    if n > args.duckdb_max_rows:
                        raise RuntimeError(f"not run above --duckdb-max-rows {args.duckdb_max_rows}")
                    ref: dict[str, Any] = duckdb_reference(data, m)
                except RuntimeError as exc:  # reported, not fatal: the release is measured all the same
                    ref = {"seconds": None, "error": str(exc)}
                sys.stderr.write(f"n={n} m={m}: dask ... (duckdb {ref['seconds'] or ref.get('error')})\n")
                dask = run_release(work, data, certs, akey, m, "dask", args.workers, f"dask-{n}-{m}{run}")
                ratio = round(dask["seconds"] / ref["seconds"], 2) if ref["seconds"] else None
                entry: dict[str, Any] = {"rows": n, "m": m, "duckdb": ref, "dask": dask, "dask_over_duckdb": ratio}
                if args.alignment == "psi":
                    sys.stderr.write(f"n={n} m={m}: dask, keyed hash (the reference) ...\n")
                    hashed = run_release(work, data, certs, akey, m, "dask", args.workers, f"hash-{n}-{m}{run}", "hash")
                    entry["dask_hash"] = hashed
                    entry["psi_over_hash"] = round(dask["seconds"] / hashed["seconds"], 2)
                if n <= 10**7 and not args.no_local:
                    sys.stderr.write(f"n={n} m={m}: local ...\n")
                    local = run_release(work, data, certs, akey, m, "local", args.workers, f"local-{n}-{m}{run}")
                    entry["local"] = local
                    entry["dask_over_local"] = round(dask["seconds"] / local["seconds"], 2)
                    pairs = [(dask["seconds"], local["seconds"])]
                    for i in range(1, args.repeat):  # the machine is shared: more pairs, each in turn
                        sys.stderr.write(f"n={n} m={m}: pair {i + 1} of {args.repeat} ...\n")
                        name = f"{n}-{m}{run}-{i}"
                        pair = [run_release(work, data, certs, akey, m, engine, args.workers, f"{engine}-{name}")
                                for engine in ("dask", "local")]  # fmt: skip
                        pairs.append((pair[0]["seconds"], pair[1]["seconds"]))
                    if len(pairs) > 1:
                        ratios = sorted(round(d / loc, 2) for d, loc in pairs)
                        entry["pairs"] = [{"dask": d, "local": loc, "ratio": round(d / loc, 2)} for d, loc in pairs]
                        entry["dask_over_local_median"] = round(statistics.median(ratios), 3)
                results.append(entry)
                sys.stderr.write(json.dumps({k: v for k, v in entry.items() if k != "duckdb"}, indent=1) + "\n")
    growth = peak_growth(results)
    for n in rows:
        runs = [r for r in results if r["rows"] == n]
        if len(runs) >= 2:
            lo, hi = runs[0]["dask"]["peak_rss_mib"], runs[-1]["dask"]["peak_rss_mib"]
            for role in ("server", "researcher"):
                runs[-1].setdefault("flat_in_m", {})[role] = round(hi[role] / lo[role], 2)
    if args.disk_plot and results:
        write_disk_plot(results[-1], Path(args.disk_plot), args.workers)
    if args.json:
        print(json.dumps({"runs": results, "peak_growth_bytes_per_row": growth}, indent=1))
    else:
        for r in results:
            duck = f"{r['duckdb']['seconds']} s" if r["duckdb"]["seconds"] else r["duckdb"]["error"]
            print(f"n={r['rows']:,} m={r['m']:,}: dask {r['dask']['seconds']} s, duckdb {duck} "
                  f"({r['dask_over_duckdb']}x)" + (f", local {r['local']['seconds']} s ({r['dask_over_local']}x)"
                                                  if "local" in r else ""))  # fmt: skip
            if "pairs" in r:
                print(f"  dask/local in {len(r['pairs'])} pairs: {[p['ratio'] for p in r['pairs']]}, "
                      f"median {r['dask_over_local_median']}")  # fmt: skip
            if "dask_hash" in r:
                print(f"  psi {r['dask']['seconds']} s over keyed hash {r['dask_hash']['seconds']} s on the same "
                      f"clusters: {r['psi_over_hash']}x")  # fmt: skip
            print(f"  stages alice: {r['dask']['stages']['alice']}")
            print(f"  stages bob: {r['dask']['stages']['bob']}")
            print(f"  peak RSS MiB: {r['dask']['peak_rss_mib']}")
            disk = r["dask"]["disk"]
            for c, d in disk["curators"].items():
                ratio = f"{d['disk_ratio']:.2f}x" if d["disk_ratio"] is not None else "? x"
                print(f"  {c}: peak engine disk {d['disk_peak_bytes'] / 1e9:.2f} GB at {d['disk_peak_seconds']:.0f} s "
                      f"= {ratio} its input ({d['input_bytes'] / 1e9:.2f} GB); "
                      f"free at least {disk['free_min_bytes'] / 1e9:.1f} GB")  # fmt: skip
            print(f"  disk scans: {disk['scans']} every {disk['interval_s']} s, longest {disk['scan_seconds_max']} s")
            if "flat_in_m" in r:
                print(f"  server/researcher peak at m=n over m=n/10: {r['flat_in_m']}")
        if growth:
            print(f"peak growth in bytes per row of n, {growth['from']:,} -> {growth['to']:,} rows (m = n/10 "
                  f"both; target <= 1 for every process but the workers, which spill at their memory limit):")
            for role, value in growth["bytes_per_row"].items():
                print(f"  {role}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
