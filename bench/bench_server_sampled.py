"""Server-side sampling through the real services (rekeyed path): the cost of storing a
table once and of each release from it (a script).

Run:  PYTHONPATH=. python bench/bench_server_sampled.py [--json] [--rows 100000,1000000] [--releases 2]

For every N (rows per curator; synthetic Adult-shaped demo table split between alice and bob):

* store: the server process, then ``store-table`` at alice (leader) and bob (separate processes
  over mutual TLS with a fresh project CA) until both exit (every curator committed). Reported:
  wall time (first curator started -> both exited; includes interpreter start-up, reading the
  CSVs, keyed-hash alignment, encrypting the whole column and the upload), the curators' own
  ``table_loaded`` -> ``table_stored`` span from their logs, and the bytes each curator uploaded
  (the packed ciphertext: 1 byte a symbol here).
* each release: ``run --sampling server`` at both curators and ``researcher fetch`` started
  together, until all three exited (the server draws m = N/10 positions, the curators fetch them,
  charge their ledgers, re-key and upload m symbols, the server gathers, re-keys, applies PRAM,
  the researcher fetches, asks for keys and estimates). epsilon 0.3.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from secure_release.cluster import PARTIES, Cluster  # noqa: E402
from secure_release.demo_data import write_demo_data  # noqa: E402
from secure_release.infra.pki import init_pki  # noqa: E402

EPSILON = 0.3


def _event_time(log: Path, event: str, also: str = "", last: bool = False) -> float | None:
    """The timestamp of the first (``last``: last) JSON log line naming ``event`` (and ``also``)."""
    lines = log.read_text(errors="replace").splitlines()
    for line in reversed(lines) if last else lines:
        if f'"event": "{event}"' in line and also in line:
            match = re.search(r'"(?:ts|time|timestamp)":\s*"?([^",}]+)', line)
            if match:
                text = match.group(1)
                try:
                    return float(text)
                except ValueError:
                    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    return None


def _wait(cluster: Cluster, names: list[str], timeout: float = 1800.0) -> None:
    for name in names:
        code = cluster.procs[name].wait(timeout=timeout)
        if code != 0:
            raise RuntimeError(f"{name} exited with {code}:\n{cluster.tail(name)}")


def bench(rows: int, releases: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-server-sampled-") as tmp:
        root = Path(tmp)
        write_demo_data(root / "data", rows)
        init_pki(root / "certs", list(PARTIES), force=True)
        akey = root / "align.key"
        akey.write_text(secrets.token_hex(32))
        cluster = Cluster(root)
        cluster.env["PYTHONPATH"] = str(ROOT)
        try:
            certs = root / "certs"
            sport = cluster.start("server", ["-m", "secure_release.server", "--listen", "127.0.0.1:0",
                                             "--store", str(root / "store"), "--certs", str(certs / "server"),
                                             "--name", "server"])  # fmt: skip
            net = ["--server", f"127.0.0.1:{sport}", "--curators", "alice,bob",
                   "--timeout", "1800"]  # fmt: skip
            t0 = time.perf_counter()
            lead = 0
            for c in ("alice", "bob"):
                role = ["--leader"] if c == "alice" else ["--leader-address", f"127.0.0.1:{lead}"]
                port = cluster.start(f"{c}-store", ["-m", "secure_release.curator", "store-table", "--table-id", "t",
                                                    "--data", str(root / "data" / f"{c}.csv"), "--schema",
                                                    str(root / "data" / f"{c}.json"), "--name", c, "--keystore",
                                                    str(root / f"ks-{c}"), "--alignment-key-file", str(akey),
                                                    "--listen", "127.0.0.1:0", *net, *role,
                                                    "--certs", str(certs / c)])  # fmt: skip
                lead = lead or int(port or 0)
            _wait(cluster, ["alice-store", "bob-store"])
            store_s = time.perf_counter() - t0
            spans = {}
            for c in ("alice", "bob"):
                log = cluster.logs[f"{c}-store"]
                a, b = _event_time(log, "table_loaded"), _event_time(log, "table_stored")
                spans[c] = None if a is None or b is None else round(b - a, 3)
            sizes = {}
            for c in ("alice", "bob"):
                text = cluster.logs[f"{c}-store"].read_text()
                found = re.search(r'"bytes":\s*(\d+)[^\n]*"event": "table_encrypted"', text)
                sizes[c] = int(found.group(1)) if found else None
                budget = ["-m", "secure_release.curator", "budget", "set", "--keystore", str(root / f"ks-{c}"),
                          "--table-id", "t", "--epsilon", "100"]  # fmt: skip
                subprocess.run([sys.executable, *budget], env=cluster.env, check=True, capture_output=True)
            per_release: list[float] = []
            server_spans: list[float | None] = []  # server: first registration -> perturbed
            protocol_spans: list[float | None] = []  # last registration (just before the re-key upload) -> perturbed
            for r in range(releases):
                rid = f"r{r + 1}"
                t1 = time.perf_counter()
                ports = {}
                for c in ("alice", "bob"):
                    ports[c] = cluster.start(f"{c}-{rid}", ["-m", "secure_release.curator", "run", "--sampling",
                                                            "server", "--table-id", "t", "--release-id", rid,
                                                            "--epsilon", str(EPSILON), "--m", str(rows // 10),
                                                            "--name", c, "--keystore", str(root / f"ks-{c}"),
                                                            "--grant", "researcher", "--exit-after-keys",
                                                            "--listen", "127.0.0.1:0", *net,
                                                            "--certs", str(certs / c)])  # fmt: skip
                cluster.start(f"researcher-{rid}", ["-m", "secure_release.researcher", "fetch", "--release-id", rid,
                                                    "--server", f"127.0.0.1:{sport}",
                                                    "--certs", str(certs / "researcher"), "--name", "researcher",
                                                    "--out", str(root / "results"),
                                                    "--timeout", "1800",
                                                    *(x for c in ("alice", "bob")
                                                      for x in ("--curator", f"{c}=127.0.0.1:{ports[c]}"))],
                              port_file=False)  # fmt: skip
                _wait(cluster, [f"alice-{rid}", f"bob-{rid}", f"researcher-{rid}"])
                per_release.append(round(time.perf_counter() - t1, 2))
                slog, rel = cluster.logs["server"], f'"release": "{rid}"'
                first, done = _event_time(slog, "registered", rel), _event_time(slog, "perturbed", rel)
                last_reg = _event_time(slog, "registered", rel, last=True)
                server_spans.append(None if first is None or done is None else round(done - first, 3))
                protocol_spans.append(None if last_reg is None or done is None else round(done - last_reg, 3))
        finally:
            cluster.close()
    return {
        "rows_per_curator": rows,
        "m": rows // 10,
        "store_wall_s": round(store_s, 2),
        "store_curator_span_s": spans,
        "upload_bytes": sizes,
        "release_wall_s": per_release,
        "release_server_first_register_to_perturbed_s": server_spans,
        "release_upload_to_perturbed_s": protocol_spans,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="100000,1000000", help="rows per curator, comma separated")
    parser.add_argument("--releases", type=int, default=2, help="releases from each stored table")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [bench(int(n), args.releases) for n in args.rows.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
