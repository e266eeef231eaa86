"""``secure-release demo``: a whole release on this machine, every party its own process.

PKI (project CA) -> server, alice (leading curator), bob and the researcher as separate
processes talking gRPC over mutual TLS on OS-chosen ports -> one release of the Adult table ->
the analyst asks the researcher for the estimate -> a table of estimate vs truth.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARTIES = (
    ("server", "server"),
    ("curator", "alice"),
    ("curator", "bob"),
    ("researcher", "researcher"),
    ("analyst", "analyst"),
)


def _progress(msg: str) -> None:
    sys.stderr.write(f"[demo] {msg}\n")
    sys.stderr.flush()


@dataclass
class Cluster:
    """Child processes of one local deployment; :meth:`close` terminates them all."""

    root: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def start(self, name: str, args: Sequence[str], port_file: bool = True, timeout: float = 60.0) -> int | None:
        pf = self.root / f"{name}.port"
        if pf.exists():
            pf.unlink()
        cmd = [sys.executable, *args] + (["--port-file", str(pf)] if port_file else [])
        log = self.root / f"{name}.log"
        self.logs[name] = log
        fh = log.open("wb")
        self.procs[name] = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env, stdin=subprocess.DEVNULL
        )
        fh.close()
        if not port_file:
            return None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pf.exists() and pf.read_text().strip():
                return int(pf.read_text())
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited with {self.procs[name].returncode}:\n{self.tail(name)}")
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not report its port within {timeout}s:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join(self.logs[name].read_text(errors="replace").splitlines()[-lines:])
        except (KeyError, OSError):
            return ""

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def launch_release(
    cluster: Cluster,
    data: Path,
    certs: Path,
    release_id: str,
    epsilon: float,
    m: int | None,
    cipher: str,
    align_key_file: Path,
    alphabet_sizes: str | None = None,
    grants: dict[str, list[str]] | None = None,
    alice_extra: Sequence[str] = (),
    bob_extra: Sequence[str] = (),
    server_extra: Sequence[str] = (),
    researcher: str = "researcher",
) -> dict[str, str]:
    """Start server, alice (leader), bob and the researcher; return their addresses."""
    root = cluster.root
    grants = grants or {"alice": [researcher], "bob": [researcher]}
    sport = cluster.start(
        "server",
        [
            "-m",
            "secure_release.server",
            "--listen",
            "127.0.0.1:0",
            "--store",
            str(root / "store"),
            "--certs",
            str(certs),
            "--name",
            "server",
            *server_extra,
        ],
    )
    server = f"127.0.0.1:{sport}"
    _progress(f"server listening on {server}")
    common = [
        "--release-id",
        release_id,
        "--epsilon",
        repr(epsilon),
        "--cipher",
        cipher,
        "--server",
        server,
        "--certs",
        str(certs),
        "--curators",
        "alice,bob",
        "--alignment-key-file",
        str(align_key_file),
        "--researcher",
        researcher,
        "--listen",
        "127.0.0.1:0",
    ] + (["--m", str(m)] if m is not None else [])
    addrs = {"server": server}
    for name, extra in (
        (
            "alice",
            [
                "--leader",
                *(["--alphabet-sizes", alphabet_sizes] if alphabet_sizes else []),
                *alice_extra,
            ],
        ),
        ("bob", ["--leader-address", "LEADER", *bob_extra]),
    ):
        extra = [addrs.get("alice", e) if e == "LEADER" else e for e in extra]
        g = [x for r in grants.get(name, []) for x in ("--grant", r)]
        port = cluster.start(
            name,
            [
                "-m",
                "secure_release.curator",
                "run",
                "--data",
                str(data / f"{name}.csv"),
                "--schema",
                str(data / f"{name}.json"),
                "--name",
                name,
                "--keystore",
                str(root / f"keystore-{name}"),
                *common,
                *g,
                *extra,
            ],
        )
        addrs[name] = f"127.0.0.1:{port}"
        _progress(f"{name} listening on {addrs[name]}")
    rport = cluster.start(
        "researcher",
        [
            "-m",
            "secure_release.researcher",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--certs",
            str(certs),
            "--name",
            researcher,
            "--server",
            server,
            "--curator",
            f"alice={addrs['alice']}",
            "--curator",
            f"bob={addrs['bob']}",
            "--out",
            str(root / "results"),
            "--analyst",
            "analyst",
        ],
    )
    addrs["researcher"] = f"127.0.0.1:{rport}"
    _progress(f"researcher listening on {addrs['researcher']}")
    return addrs


def get_estimate(address: str, certs: Path, release_id: str, name: str = "analyst", timeout: float = 240.0) -> Any:
    from secure_release.infra.tls import secure_channel
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
    from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

    with secure_channel(address, certs, name, peer_role="researcher") as ch:
        return pb_grpc.ResearcherStub(ch).GetEstimate(
            pb.EstimateRequest(release_id=release_id, wait=True), timeout=timeout
        )


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run a whole release locally: PKI, server, two curators, researcher (mTLS)",
        description=(
            "Run one release of the bundled UCI Adult table end to end on this machine: a project "
            "CA, the server, curators alice (education, marital) and bob (sex, salary) and the "
            "researcher as separate processes over mutual TLS; then print the researcher's "
            "estimate beside the truth."
        ),
        epilog="Example: secure-release demo --epsilon 1.0 --cipher otp",
    )
    p.add_argument("--epsilon", type=float, default=0.5, help="privacy level (default 0.5)")
    p.add_argument("--m", type=int, default=None, help="sample size (default: m*)")
    p.add_argument("--cipher", choices=["otp", "chacha20"], default="chacha20", help="pad kind")
    p.add_argument("--rows", type=int, default=None, help="synthetic rows (default: the 45,222 Adult records)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--keep", type=Path, default=None, help="keep the working directory here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from secure_release.demo_data import write_demo_data
    from secure_release.infra.pki import init_pki

    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        root, tmp = args.keep, None
    else:
        tmp = tempfile.TemporaryDirectory(prefix="secure-release-demo-")
        root = Path(tmp.name)
    cluster = Cluster(root)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        _progress(f"working directory {root}")
        info = write_demo_data(root / "data", args.rows)
        _progress(f"demo data: {info['n']} records split between alice and bob")
        init_pki(root / "certs", PARTIES, force=True)
        _progress("PKI created (project CA + 5 certificates)")
        akey = root / "alignment.key"
        akey.write_text(secrets.token_hex(32))
        akey.chmod(0o600)
        addrs = launch_release(
            cluster,
            root / "data",
            root / "certs",
            "demo-1",
            args.epsilon,
            args.m,
            args.cipher,
            akey,
        )
        _progress("release running; asking the researcher for the estimate as analyst")
        resp = get_estimate(addrs["researcher"], root / "certs", "demo-1")
        result = _summary(resp, info)
        if args.json:
            print(json.dumps(result))
        else:
            _print_table(result)
        return 0
    except KeyboardInterrupt:
        _progress("interrupted; stopping every process")
        return 130
    except Exception as exc:
        import grpc

        if isinstance(exc, grpc.RpcError | RuntimeError):
            sys.stderr.write(f"secure-release demo: error: {exc}\n")
            for name in cluster.procs:
                sys.stderr.write(f"--- {name} log (tail) ---\n{cluster.tail(name, 10)}\n")
            return 1
        raise
    finally:
        cluster.close()
        if tmp is not None:
            tmp.cleanup()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _summary(resp: Any, info: dict[str, Any]) -> dict[str, Any]:
    truth = info["truth"]
    cells = []
    err = 0.0
    for c in resp.cells:
        t = truth.get("|".join(c.labels), 0.0)
        err += (c.estimate - t) ** 2
        cells.append(
            {
                "labels": list(c.labels),
                "estimate": c.estimate,
                "projected": c.projected,
                "mle": c.mle,
                "standard_error": c.standard_error,
                "truth": t,
                "observed": c.observed,
            }
        )
    p = resp.privacy
    return {
        "release_id": resp.release_id,
        "epsilon": p.epsilon,
        "gamma": p.gamma,
        "n": p.n,
        "m": p.m,
        "K": p.joint_size,
        "l2_error": math.sqrt(err),
        "predicted_rmse": p.predicted_rmse,
        "bound": p.bound,
        "marginal": resp.marginal,
        "attributes": list(resp.attributes),
        "cells": cells,
    }


def _print_table(r: dict[str, Any]) -> None:
    w = max(len(" / ".join(c["labels"])) for c in r["cells"])
    print(f"{'cell'.ljust(w)}  {'estimate':>9} {'projected':>9} {'truth':>8} {'observed':>8}")
    for c in r["cells"]:
        print(
            f"{' / '.join(c['labels']).ljust(w)}  {c['estimate']:9.4f} {c['projected']:9.4f} "
            f"{c['truth']:8.4f} {c['observed']:8d}"
        )
    print()
    print(f"epsilon {r['epsilon']:g}   gamma {r['gamma']:.4g}   m {r['m']}   n {r['n']}   K {r['K']}")
    print(f"l2 error {r['l2_error']:.4f}   (predicted RMSE {r['predicted_rmse']:.4f})")
