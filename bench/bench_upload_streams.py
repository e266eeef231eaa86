"""One curator's upload over 1, 2 and 4 concurrent UploadCiphertext streams (a script).

Run:  PYTHONPATH=. python bench/bench_upload_streams.py [--json] [--m 10000000] [--streams 1,2,4]

A fresh project CA (``init_pki``) and a release server started as a child process, as
``secure-release demo`` starts it (``python -m secure_release.server`` over mutual TLS, SQLite
store in a temporary directory). For every number of streams, alice registers a release of her
own (a new release id, so every run uploads all m symbols) and ``ServerLink.upload`` sends her
ciphertext of m random symbols (alphabet ``--alphabet``, 1 byte a symbol by default): the digest
pass, the status call, the missing chunks in that many ordered runs at once, and the commit,
which the server checks by reading every stored chunk back. Seconds are wall time of that call,
the best of ``--reps`` (the streams interleaved within each repetition); ratio = seconds / the
seconds of streams = 1 in the same run (below 1: faster). The server's peak RSS is its VmHWM
(/proc/<pid>/status), reset before each upload (``/proc/<pid>/clear_refs`` 5) where the kernel
allows, so each figure is that upload's own peak.

``--ingest-chunks N`` (default 400, 0 skips) also times ``Store.put_chunk`` in this process for
N full chunks of one curator: total seconds and the ms a chunk over the first and the last tenth
of them. Before the store stopped deep-copying the whole release for every chunk the last tenth
cost more per chunk than the first (O(chunks^2) an upload); now both should be alike.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from secure_release.cluster import PARTIES, Cluster  # noqa: E402
from secure_release.curator.config import CuratorConfig  # noqa: E402
from secure_release.curator.release.upload import ServerLink  # noqa: E402
from secure_release.curator.waits import Deadline  # noqa: E402
from secure_release.infra.logs import EventLog  # noqa: E402
from secure_release.infra.pki import init_pki  # noqa: E402
from secure_release.mechanism.primitives.keys import AlignmentKey  # noqa: E402
from secure_release.mechanism.primitives.packing import CHUNK_ROWS  # noqa: E402
from secure_release.mechanism.primitives.pads import CipherMode  # noqa: E402
from secure_release.mechanism.privacy.plan import plan_release  # noqa: E402
from secure_release.mechanism.protocol.spec import ReleaseSpec  # noqa: E402
from secure_release.server.state import ServerLimits  # noqa: E402
from secure_release.server.store import Store  # noqa: E402

CURATORS = ("alice", "bob")


def vm_hwm_mib(pid: int) -> float | None:
    """Peak resident memory of a live process in MiB (None where /proc has no answer)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def reset_peak(pid: int) -> bool:
    """Reset a process's VmHWM to its current RSS (Linux >= 4.0); False where refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def release_spec(release_id: str, m: int, sizes: tuple[int, int]) -> ReleaseSpec:
    """A two-curator ChaCha20 release of m rows out of n = m at epsilon 1."""
    return ReleaseSpec(release_id, CURATORS, CipherMode.CHACHA20, plan_release(m, sizes, 1.0, m), ("researcher",))


def curator_config(name: str, release_id: str, port: int, certs: Path, root: Path) -> CuratorConfig:
    """What ServerLink reads of a curator's configuration (the rest is never used here)."""
    return CuratorConfig(
        name=name, release_id=release_id, epsilon=1.0, m=None, cipher=CipherMode.CHACHA20, curators=CURATORS,
        leader=name == "alice", leader_address=None, expected_sizes=None, notify="researcher", grants=(),
        data=root / "x.csv", schema=root / "x.json", dataset="d", keystore=root / f"ks-{name}",
        server=f"127.0.0.1:{port}", certs=certs / name, listen_host="127.0.0.1", listen_port=0, port_file=None,
        insecure=False, timeout=600.0, exit_after_keys=True, alignment_key=AlignmentKey(bytes(32)),
    )  # fmt: skip


def timed_upload(
    port: int, certs: Path, root: Path, release_id: str, ciphertext: np.ndarray, sizes: tuple[int, int], streams: int
) -> float:
    """Register ``release_id`` (both curators) and time alice's whole upload of ``ciphertext``."""
    spec = release_spec(release_id, int(ciphertext.size), sizes)
    log = EventLog("curator", "bench")
    links = {c: ServerLink(curator_config(c, release_id, port, certs, root), log, Deadline(600.0)) for c in CURATORS}
    try:
        for link in links.values():
            link.register(spec)
        start = time.perf_counter()
        links["alice"].upload(spec, ciphertext, streams=streams)
        return time.perf_counter() - start
    finally:
        for link in links.values():
            link.close()


def bench_streams(m: int, streams: list[int], reps: int, alphabet: int) -> dict[str, Any]:
    """Seconds and server peak RSS of alice's upload at each number of streams (best of reps)."""
    sizes = (alphabet, 4)
    ciphertext = np.random.default_rng(1).integers(0, alphabet, m, dtype=np.uint32)
    seconds: dict[int, list[float]] = {s: [] for s in streams}
    peaks: dict[int, list[float]] = {s: [] for s in streams}
    with tempfile.TemporaryDirectory(prefix="bench-upload-") as tmp:
        root = Path(tmp)
        certs = root / "certs"
        init_pki(certs, PARTIES, force=True)
        cluster = Cluster(root)
        try:
            port = cluster.start(
                "server",
                ["-m", "secure_release.server", "--listen", "127.0.0.1:0", "--store", str(root / "store"),
                 "--certs", str(certs / "server"), "--name", "server", "--max-m", str(max(m, 10**8)),
                 "--max-n", str(max(m, 10**8))],
            )  # fmt: skip
            assert port is not None
            pid = cluster.procs["server"].pid
            resettable = True
            for rep in range(reps):
                for s in streams:
                    resettable = reset_peak(pid) and resettable
                    seconds[s].append(timed_upload(port, certs, root, f"r{rep}-s{s}", ciphertext, sizes, s))
                    peaks[s].append(vm_hwm_mib(pid) or 0.0)
        finally:
            cluster.close()
    best = {s: min(v) for s, v in seconds.items()}
    base = best[streams[0]]
    return {
        "m": m,
        "chunks": -(-m // CHUNK_ROWS),
        "alphabet": alphabet,
        "reps": reps,
        "peak_rss_per_upload": resettable,
        "runs": [
            {
                "streams": s,
                "seconds": round(best[s], 3),
                "all_seconds": [round(x, 3) for x in seconds[s]],
                "ratio_to_first": round(best[s] / base, 3),
                "server_peak_rss_mib": round(max(peaks[s]), 1),
            }
            for s in streams
        ],
    }


def bench_ingest(chunks: int) -> dict[str, Any]:
    """Store.put_chunk for ``chunks`` full chunks of alice (in this process, a fresh store)."""
    m = chunks * CHUNK_ROWS
    spec = release_spec("ingest", m, (16, 4))
    data = bytes(CHUNK_ROWS)
    times = np.empty(chunks)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        store = Store(Path(tmp), ServerLimits(max_m=m, max_n=m))
        try:
            for c in CURATORS:
                store.register(spec, c, c)
            for seq in range(chunks):
                start = time.perf_counter()
                store.put_chunk("ingest", "alice", "alice", seq, data)
                times[seq] = time.perf_counter() - start
        finally:
            store.close()
    tenth = max(1, chunks // 10)
    return {
        "chunks": chunks,
        "seconds": round(float(times.sum()), 3),
        "ms_per_chunk_first_tenth": round(1000 * float(times[:tenth].mean()), 3),
        "ms_per_chunk_last_tenth": round(1000 * float(times[-tenth:].mean()), 3),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--m", type=int, default=10_000_000, help="symbols alice uploads (default 10^7)")
    p.add_argument("--streams", default="1,2,4", help="comma-separated numbers of streams (the first is the base)")
    p.add_argument("--reps", type=int, default=2, help="repetitions; the best of them is reported")
    p.add_argument("--alphabet", type=int, default=16, help="alice's alphabet size (<= 256: 1 byte a symbol)")
    p.add_argument("--ingest-chunks", type=int, default=400, help="chunks for the store ingest timing (0 skips)")
    args = p.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    if args.m < 1 or args.reps < 1 or min(streams) < 1 or args.alphabet < 2 or args.ingest_chunks < 0:
        p.error("--m, --reps and every --streams must be >= 1, --alphabet >= 2, --ingest-chunks >= 0")
    out: dict[str, Any] = {"cpus": os.cpu_count(), "upload": bench_streams(args.m, streams, args.reps, args.alphabet)}
    if args.ingest_chunks:
        out["ingest"] = bench_ingest(args.ingest_chunks)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    up = out["upload"]
    print(f"alice uploads m = {up['m']} symbols ({up['chunks']} chunks, k = {up['alphabet']}), best of {up['reps']}, "
          f"{out['cpus']} cpus; server in its own process")  # fmt: skip
    rss = "server peak RSS MiB" + ("" if up["peak_rss_per_upload"] else " (cumulative: VmHWM reset refused)")
    print(f"{'streams':>8} {'seconds':>9} {'ratio':>7} {rss:>30}   all seconds")
    for r in up["runs"]:
        print(f"{r['streams']:>8} {r['seconds']:>9.2f} {r['ratio_to_first']:>7.2f} {r['server_peak_rss_mib']:>30.1f}"
              f"   {r['all_seconds']}")  # fmt: skip
    if "ingest" in out:
        ing = out["ingest"]
        first, last = ing["ms_per_chunk_first_tenth"], ing["ms_per_chunk_last_tenth"]
        print(f"store ingest: {ing['chunks']} chunks in {ing['seconds']:.2f} s; ms a chunk over the first tenth "
              f"{first:.2f}, the last tenth {last:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
