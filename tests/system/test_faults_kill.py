"""Fault injection: kill -9 of each role (server, leader, follower, researcher) at each phase of
a release (agree, register, upload, commit, PRAM, fetch, key release), restart it with the same
flags, and require that every release ends released with an estimate bit-identical to the
uninterrupted protocol with the same injected keys (or aborted with its budget refunded), with no
acknowledged chunk lost.

The default suite injects ~12 kills (random combinations with other faults are the fault
campaign's: ``tests/system/test_fault_campaign.py``); ``SECURE_RELEASE_FAULTS=120`` runs the full
loop (at least that many kills) and prints the figures.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import secure_release.mechanism.protocol.in_memory as protocol
from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.curator.table import load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CURATORS = ("alice", "bob")
ROLES = ("server", "alice", "bob", "researcher")
#: phase -> (role whose log marks it, event, roles that may be killed in it)
PHASES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "agree": ("bob", '"tags_submitted"', ("alice", "bob")),
    "register": ("alice", '"agreed"', ("alice", "bob", "server")),
    "upload": ("bob", '"registered"', ("alice", "bob", "server")),
    "commit": ("alice", '"committed"', ("alice", "bob", "server")),
    "pram": ("bob", '"committed"', ("server", "alice", "bob")),
    "fetch": ("researcher", '"fetched"', ("researcher", "server", "alice")),
    "key_release": ("researcher", '"key_received"', ("alice", "bob", "researcher")),
}
SEED = Seed(bytes([9]) * 32)
PRAM = PramKey(bytes([8]) * 32)
PADS = {"alice": PadKey(bytes([1]) * 32), "bob": PadKey(bytes([2]) * 32)}
EPSILON = 0.5
M = 3000


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Deployment:
    """One release's processes with fixed ports, restartable with identical flags."""

    root: Path
    certs: Path
    release_id: str
    timeout: float = 90.0
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    extra: dict[str, list[str]] = field(default_factory=dict)  # per role, appended to its flags

    def __post_init__(self) -> None:
        self.ports = dict(zip(("server", "alice", "bob"), free_ports(3), strict=True))
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "SECURE_RELEASE_TESTING": "1"}

    def args(self, role: str) -> list[str]:
        """The role's command line (the same at every restart)."""
        return [*self._args(role), *self.extra.get(role, [])]

    def _args(self, role: str) -> list[str]:
        server = f"127.0.0.1:{self.ports['server']}"
        net = ["--certs", str(self.certs / role), "--name", role]
        if role == "server":
            return ["-m", "secure_release.server", "--listen", server, "--store", str(self.root / "store"), *net,
                    "--insecure-test-pram-key", PRAM.reveal().hex(), "--grace", "0.5"]  # fmt: skip
        if role == "researcher":
            return ["-m", "secure_release.researcher", "fetch", "--release-id", self.release_id, "--server", server,
                    *net, "--out", str(self.root / "results"), "--timeout", str(self.timeout),
                    *(x for c in CURATORS for x in ("--curator", f"{c}=127.0.0.1:{self.ports[c]}"))]  # fmt: skip
        data = self.root / "data"
        own = ["--leader", "--insecure-test-seed", SEED.reveal().hex()] if role == "alice" else [
            "--leader-address", f"127.0.0.1:{self.ports['alice']}"]  # fmt: skip
        return ["-m", "secure_release.curator", "run", "--data", str(data / f"{role}.csv"),
                "--schema", str(data / f"{role}.json"), "--release-id", self.release_id, "--epsilon", str(EPSILON),
                "--m", str(M), "--server", server, *net, "--curators", ",".join(CURATORS), *own,
                "--listen", f"127.0.0.1:{self.ports[role]}", "--keystore", str(self.root / f"ks-{role}"),
                "--alignment-key-file", str(self.root / "align.key"), "--grant", "researcher",
                "--insecure-test-pad-key", PADS[role].reveal().hex(), "--timeout", str(self.timeout),
                "--key-retention", "600"]  # fmt: skip

    def log(self, role: str) -> Path:
        return self.root / f"{role}.log"

    def start(self, role: str) -> None:
        """Start (or restart) ``role``; its output is appended to its log."""
        self.starts[role] = self.starts.get(role, 0) + 1
        with self.log(role).open("ab") as fh:
            fh.write(f"=== start {self.starts[role]}\n".encode())
            fh.flush()
            cmd = [sys.executable, *self.args(role)]
            self.procs[role] = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env, stdin=subprocess.DEVNULL
            )

    def kill(self, role: str) -> None:
        """kill -9 ``role`` and reap it."""
        proc = self.procs[role]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()

    def seen(self, role: str, event: str) -> bool:
        """True once ``event`` appears in ``role``'s log (any run)."""
        path = self.log(role)
        return path.exists() and event in path.read_text(errors="replace")

    def close(self) -> None:
        """SIGTERM every process still running, then kill stragglers."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def make_world(base: Path) -> dict[str, object]:
    """Demo data and an alignment key in ``base`` (and the tables, for reference estimates)."""
    write_demo_data(base / "data", rows=8000, seed=11)
    akey = AlignmentKey(bytes([7]) * 32)
    (base / "align.key").write_text(akey.reveal().hex())
    tables = [read_table(base / "data" / f"{c}.csv", load_schema(base / "data" / f"{c}.json")) for c in CURATORS]
    return {"base": base, "akey": akey, "tables": tables}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Demo data, an alignment key and the tables of the reference estimates."""
    return make_world(tmp_path_factory.mktemp("faults"))


def reference(world: dict[str, object], release_id: str) -> np.ndarray:
    """The uninterrupted protocol's raw estimate for ``release_id`` with the injected keys."""
    tables = world["tables"]
    ref = protocol.run_release(tables, EPSILON, M, "chacha20", release_id, seed=SEED,  # type: ignore[arg-type]
                               alignment_key=world["akey"], pram_key=PRAM,  # type: ignore[arg-type]
                               pad_keys=[PADS[c] for c in CURATORS])  # fmt: skip
    return np.asarray(ref.estimate.raw)


def new_deployment(world: dict[str, object], certs: Path, release_id: str, tmp: Path) -> Deployment:
    """A fresh directory with the data, the key and a budget set at each curator."""
    root = tmp / release_id
    root.mkdir()
    (root / "data").symlink_to(Path(str(world["base"])) / "data")
    (root / "align.key").write_text((Path(str(world["base"])) / "align.key").read_text())
    for c in CURATORS:
        LedgerFile(root / f"ks-{c}", HeadSigner.from_certs(certs / c, c)).set_budget(f"{c}.csv", f"{c}.csv", 2.0)
    return Deployment(root, certs, release_id)


@dataclass
class Outcome:
    """What one release ended with."""

    released: bool
    identical: bool
    aborted_refunded: bool
    kills: int
    fault_to_outcome_s: list[float]
    detail: str = ""


def run_with_kills(dep: Deployment, kills: Sequence[tuple[str, str]], ref: np.ndarray, rng: random.Random,
                   budget_s: float = 120.0) -> Outcome:  # fmt: skip
    """Run one release, killing (and restarting) ``role`` once ``phase`` is reached, for every
    (phase, role) in ``kills`` in order; then check the outcome."""
    for role in ROLES:
        dep.start(role)
    done_kills: list[float] = []
    try:
        for phase, role in kills:
            marker_role, event, _ = PHASES[phase]
            end = time.monotonic() + budget_s
            while not dep.seen(marker_role, event) and time.monotonic() < end:
                if dep.procs["researcher"].poll() is not None:
                    break
                time.sleep(0.02)
            if dep.procs[role].poll() is not None:
                continue  # it already finished: nothing to kill in this phase
            time.sleep(rng.uniform(0.0, 0.15))
            dep.kill(role)
            done_kills.append(time.monotonic())
            time.sleep(rng.uniform(0.0, 0.3))
            dep.start(role)
        return _finish(dep, ref, done_kills, budget_s)
    finally:
        dep.close()


def _finish(dep: Deployment, ref: np.ndarray, kills: list[float], budget_s: float) -> Outcome:
    end = time.monotonic() + budget_s
    researcher = dep.procs["researcher"]
    while researcher.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    finished = time.monotonic()
    lags = [finished - k for k in kills]
    result = dep.root / "results" / f"{dep.release_id}.json"
    if researcher.returncode == 0 and result.exists():
        got = np.array([c["raw"] for c in json.loads(result.read_text())["cells"]])
        identical = got.shape == ref.shape and bool(np.array_equal(got, ref))
        return Outcome(True, identical, False, len(kills), lags, "" if identical else "estimate differs")
    states = _ledger_states(dep)
    refunded = all(s in ("refund", "unknown") for s in states.values())
    tail = dep.log("researcher").read_text()[-2000:]
    return Outcome(False, False, refunded, len(kills), lags, f"researcher rc={researcher.returncode}; {states}\n{tail}")


def _ledger_states(dep: Deployment) -> dict[str, str]:
    out = {}
    for c in CURATORS:
        known = Keystore(dep.root / f"ks-{c}").ledger.read().releases().get(dep.release_id)
        out[c] = known.state.value if known else "unknown"
    return out


def plan_kills(rng: random.Random, total: int) -> list[list[tuple[str, str]]]:
    """Releases, each a list of (phase, role) kills in phase order, covering every role at
    every phase it can be in, until ``total`` kills."""
    pairs = [(phase, role) for phase, (_, _, roles) in PHASES.items() for role in roles]
    order = list(PHASES)
    releases: list[list[tuple[str, str]]] = []
    count = 0
    while count < total:
        rng.shuffle(pairs)
        for start in range(0, len(pairs), 4):
            chosen = sorted(pairs[start : start + 4], key=lambda p: order.index(p[0]))
            releases.append(chosen)
            count += len(chosen)
            if count >= total:
                break
    return releases


def test_kills_at_every_phase_end_released_identically(world: dict[str, object], certs: Path, tmp_path: Path) -> None:
    total = int(os.environ.get("SECURE_RELEASE_FAULTS", "12"))  # 19 (phase, role) pairs: the full loop covers each
    rng = random.Random(20240601)
    figures = {"kills": 0, "released_identical": 0, "aborted_refunded": 0, "stuck_or_wrong": 0, "releases": 0}
    lags: list[float] = []
    failures: list[str] = []
    for index, kills in enumerate(plan_kills(rng, total)):
        rid = f"f{index}"
        dep = new_deployment(world, certs, rid, tmp_path)
        outcome = run_with_kills(dep, kills, reference(world, rid), rng)
        figures["releases"] += 1
        figures["kills"] += outcome.kills
        lags += outcome.fault_to_outcome_s
        if outcome.released and outcome.identical:
            figures["released_identical"] += 1
            assert _ledger_states(dep) == {c: "commit" for c in CURATORS}, (rid, _ledger_states(dep))
        elif outcome.aborted_refunded:
            figures["aborted_refunded"] += 1
            sys.stderr.write(f"\nABORTED {rid} kills={kills}: {outcome.detail[:300]}\n")
        else:
            figures["stuck_or_wrong"] += 1
            failures.append(f"{rid} kills={kills}: {outcome.detail}")
    lag = np.array(lags or [0.0])
    sys.stderr.write(
        f"\nFAULTS {json.dumps(figures)} fault->outcome s: median {np.median(lag):.2f} "
        f"p95 {np.percentile(lag, 95):.2f} max {lag.max():.2f}\n"
    )
    assert not failures, "\n".join(failures)
    assert figures["kills"] >= min(total, 12)
