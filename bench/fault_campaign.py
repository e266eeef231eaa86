"""A randomized fault campaign (issue 47, item 4): K concurrent releases of the same two
organisations against one server, under a fault schedule drawn from a seed, then one invariant.

Run:  PYTHONPATH=. python bench/fault_campaign.py --schedules 200 [--first-seed 1] [--releases 3]
          [--dask-share 0.25] [--out DIR] [--json]
      PYTHONPATH=. python bench/fault_campaign.py --replay SEED      (one schedule, printed)

One schedule (:func:`draw_schedule`, a pure function of its seed):

* K releases ``r0 .. r{K-1}``, each with its own alice (the leader), bob and researcher ``fetch``
  processes, all against one server. Every alice shares one keystore (one ledger), and so does
  every bob: concurrent releases of one organisation. A release's curators run on a Dask
  cluster of their own (``--engine dask``, Parquet input) with probability ``dask_share``.
* Every connection between two parties goes through a TCP proxy of the harness (follower to
  leader, curator to server, researcher to server and to each curator), so a link can be cut.
* 1 to 4 faults at random times in the first seconds, each one of:
  - ``kill``: SIGKILL of any party (the server, a leader, a follower, a researcher), then the
    same command again after a random delay;
  - ``pause``: SIGSTOP of a party for 2-8 s (longer than a gRPC keepalive), then SIGCONT;
  - ``blackhole`` / ``delay``: a link holds every byte, or delays each, for 1-6 s (one
    blackhole in ten outlasts every ``--timeout``);
  - ``worker``: SIGKILL of one Dask worker of a curator on a cluster, right after the event that
    starts a stage drawn at random (read, shuffle, agreement, match and align, sample) shows in
    that curator's log.

The invariant (:func:`check`), after every process has ended (or been stopped once its
``--timeout`` and a grace passed):

* every release is either released, with the cells an uninterrupted run with the same injected
  keys gives (:func:`reference_cells`), fetched by its researcher; or aborted, with its
  reservation refunded at every curator; or, only where its researcher's link was cut for longer
  than every ``--timeout`` (and so past the curators' ``--key-retention``), committed at every
  curator and never fetched (``committed-unfetched``: spent, as a sealed release is);
* every ledger's spent epsilon equals the sum of the epsilons of the releases it released (or
  committed unfetched), and none stays reserved;
* no process outlived its ``--timeout`` (plus :data:`GRACE_S`);
* the server still answers (a ``GetRefusals`` call after the schedule).

A failure prints the schedule and its seed: ``--replay SEED`` runs that one schedule again.
``tests/system/test_fault_campaign.py`` runs a bounded campaign in the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

CURATORS = ("alice", "bob")
EPSILON = 0.5
M = 2000
ROWS = 6000
BUDGET = 10.0
#: Each party's --timeout (the researcher's too): the longest a party may live.
TIMEOUT_S = 45.0
#: How long past its --timeout a party may take to exit before it counts as hung: its start-up
#: before the deadline begins, and the bounded wind-down that tells the others (past the
#: deadline, its aborts and declarations at the server share one 10 s).
GRACE_S = 20.0
#: A curator's --key-retention: how long it serves a sealed release's key at most (within its
#: --timeout budget, so a sealed release's curator too ends by then).
RETENTION_S = 10.0
#: The share of link faults that outlast every --timeout (the link never comes back in time).
LONG_SHARE = 0.1
KINDS = ("kill", "pause", "blackhole", "delay", "worker")


# --------------------------------------------------------------------------------- schedules
@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` at ``at_s`` seconds after the start, on ``target`` (a party such as
    ``alice0``, ``server``; a link ``bob0>alice0``), lasting ``for_s`` (a kill: the delay before
    the rerun)."""

    kind: str
    at_s: float
    target: str
    for_s: float


@dataclass(frozen=True)
class Schedule:
    seed: int
    releases: int
    dask: tuple[bool, ...]  # per release: its curators on a Dask cluster
    faults: tuple[Fault, ...]

    def describe(self) -> str:
        engines = "".join("D" if d else "L" for d in self.dask)
        faults = "; ".join(f"{f.kind} {f.target} at {f.at_s:.1f}s for {f.for_s:.1f}s" for f in self.faults)
        return f"seed {self.seed}: {self.releases} releases [{engines}], {faults or 'no faults'}"


def parties(releases: int) -> list[str]:
    return ["server", *(f"{role}{i}" for i in range(releases) for role in ("alice", "bob", "researcher"))]


def links(releases: int) -> list[str]:
    """Every proxied link, ``client>target``."""
    out = []
    for i in range(releases):
        out += [f"alice{i}>server", f"bob{i}>server", f"researcher{i}>server", f"bob{i}>alice{i}",
                f"researcher{i}>alice{i}", f"researcher{i}>bob{i}"]  # fmt: skip
    return out


def draw_schedule(seed: int, releases: int, dask_share: float, window_s: float = 12.0) -> Schedule:
    """The schedule of ``seed``: pure (the same seed draws the same schedule)."""
    rng = random.Random(seed)
    dask = tuple(rng.random() < dask_share for _ in range(releases))
    faults = []
    for _ in range(rng.randint(1, 4)):
        kinds = [k for k in KINDS if k != "worker" or any(dask)]
        kind = rng.choice(kinds)
        at = round(rng.uniform(0.5, window_s), 2)
        if kind in ("blackhole", "delay"):
            lasts = TIMEOUT_S + 15 if kind == "blackhole" and rng.random() < LONG_SHARE else rng.uniform(1.0, 6.0)
            faults.append(Fault(kind, at, rng.choice(links(releases)), round(lasts, 2)))
        elif kind == "worker":  # at a stage: right after the event that starts it, in that curator's log
            i = rng.choice([i for i, d in enumerate(dask) if d])
            event = rng.choice([e for e, _ in _STAGE_EVENTS[:5]])
            faults.append(Fault(kind, 0.3, f"{rng.choice(CURATORS)}{i}@{event}", 0.0))
        elif kind == "pause":
            faults.append(Fault(kind, at, rng.choice(parties(releases)), round(rng.uniform(2.0, 8.0), 2)))
        else:
            faults.append(Fault(kind, at, rng.choice(parties(releases)), round(rng.uniform(0.0, 3.0), 2)))
    return Schedule(seed, releases, dask, tuple(sorted(faults, key=lambda f: f.at_s)))


# ------------------------------------------------------------------------------------ proxy
class Proxy:
    """A TCP forwarder on 127.0.0.1 (port 0) to ``target_port``: ``pass``, ``blackhole`` (no
    byte moves either way, connections stay open: the link holds) or ``delay`` (each read is
    held ``delay_s`` before it is sent on)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode, self.delay_s = "pass", 0.0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pair, args=(client,), daemon=True).start()

    def _pair(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:
            client.close()
            return
        ends = {client: upstream, upstream: client}
        watch = selectors.DefaultSelector()  # epoll: no limit on descriptor numbers, unlike select()
        for end in ends:
            watch.register(end, selectors.EVENT_READ)
        try:
            while not self.closed.is_set():
                if self.mode == "blackhole":
                    time.sleep(0.05)
                    continue
                for key, _ in watch.select(0.2):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    if not data:
                        return
                    if self.mode == "delay":
                        time.sleep(self.delay_s)
                    ends[src].sendall(data)
        except OSError:
            return
        finally:
            watch.close()
            client.close()
            upstream.close()

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


# ------------------------------------------------------------------------------------ world
def key32(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def make_world(base: Path) -> dict[str, Any]:
    """Demo data (CSV and Parquet), the PKI and an alignment key, shared by every schedule."""
    from secure_release.cluster import PARTIES
    from secure_release.curator.table import load_schema, read_table
    from secure_release.demo_data import write_demo_data
    from secure_release.infra.pki import init_pki
    from secure_release.mechanism.primitives.keys import AlignmentKey

    write_demo_data(base / "data", rows=ROWS, seed=11)
    for c in CURATORS:
        _parquet(base / "data" / f"{c}.csv", base / "parquet" / c, 3)
    init_pki(base / "certs", list(PARTIES))
    akey = AlignmentKey(key32("campaign alignment"))
    (base / "align.key").write_text(akey.reveal().hex())
    tables = [read_table(base / "data" / f"{c}.csv", load_schema(base / "data" / f"{c}.json")) for c in CURATORS]
    return {"base": base, "akey": akey, "tables": tables}


def _parquet(csv: Path, out: Path, files: int) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pacsv.read_csv(csv, convert_options=pacsv.ConvertOptions(column_types={"id": pa.string()}))
    out.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    for i in range(files):
        pq.write_table(table.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])), out / f"part-{i:03d}.parquet")


def release_keys(index: int) -> dict[str, bytes]:
    return {"seed": key32(f"seed {index}"), **{c: key32(f"pad {c} {index}") for c in CURATORS}}


PRAM_KEY = key32("campaign pram")


def reference_cells(world: dict[str, Any], release_id: str, index: int) -> list[float]:
    """The raw estimate of an uninterrupted run of ``release_id`` with the injected keys."""
    import secure_release.mechanism.protocol.in_memory as protocol
    from secure_release.mechanism.primitives.keys import PadKey, PramKey, Seed

    keys = release_keys(index)
    ref = protocol.run_release(world["tables"], EPSILON, M, "chacha20", release_id, seed=Seed(keys["seed"]),
                               alignment_key=world["akey"], pram_key=PramKey(PRAM_KEY),
                               pad_keys=[PadKey(keys[c]) for c in CURATORS])  # fmt: skip
    return [float(x) for x in np.asarray(ref.estimate.raw)]


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


# ---------------------------------------------------------------------------------- a run
@dataclass
class Run:
    """The processes of one schedule, restartable with identical commands."""

    world: dict[str, Any]
    root: Path
    schedule: Schedule
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)  # first start of each party (monotonic)
    proxies: dict[str, Proxy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k = self.schedule.releases
        names = ["server", *(f"{c}{i}" for i in range(k) for c in CURATORS)]
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        for link in links(k):
            self.proxies[link] = Proxy(self.ports[link.split(">")[1]])
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "SECURE_RELEASE_TESTING": "1"}
        from secure_release.curator.records.ledgerfile import LedgerFile
        from secure_release.curator.records.ledgersign import HeadSigner

        certs = Path(self.world["base"]) / "certs"
        for c in CURATORS:
            for table in (f"{c}.csv", c):  # the CSV and the Parquet directory: one data set name each
                LedgerFile(self.root / f"ks-{c}", HeadSigner.from_certs(certs / c, c)).set_budget(
                    table, table, BUDGET
                )

    def via(self, client: str, target: str) -> str:
        return f"127.0.0.1:{self.proxies[f'{client}>{target}'].port}"

    def args(self, party: str) -> list[str]:
        base, certs = Path(self.world["base"]), Path(self.world["base"]) / "certs"
        if party == "server":
            return ["-m", "secure_release.server", "--listen", f"127.0.0.1:{self.ports['server']}", "--store",
                    str(self.root / "store"), "--certs", str(certs / "server"), "--name", "server",
                    "--insecure-test-pram-key", PRAM_KEY.hex(), "--grace", "0.5"]  # fmt: skip
        role, index = party.rstrip("0123456789"), int(party[len(party.rstrip("0123456789")) :])
        rid = f"r{index}"
        if role == "researcher":
            return ["-m", "secure_release.researcher", "fetch", "--release-id", rid,
                    "--server", self.via(party, "server"),
                    "--certs", str(certs / "researcher"), "--name", "researcher", "--out", str(self.root / "results"),
                    "--timeout", str(TIMEOUT_S),
                    *(x for c in CURATORS for x in ("--curator", f"{c}={self.via(party, f'{c}{index}')}"))]  # fmt: skip
        keys = release_keys(index)
        dask = self.schedule.dask[index]
        data = ["--data", str(base / "parquet" / role), "--engine", "dask", "--workers", "2",
                "--worker-memory", "1GiB"] if dask else ["--data", str(base / "data" / f"{role}.csv")]  # fmt: skip
        own = ["--leader", "--insecure-test-seed", keys["seed"].hex()] if role == "alice" else [
            "--leader-address", self.via(party, f"alice{index}")]  # fmt: skip
        return ["-m", "secure_release.curator", "run", *data, "--schema", str(base / "data" / f"{role}.json"),
                "--release-id", rid, "--epsilon", str(EPSILON), "--m", str(M), "--server", self.via(party, "server"),
                "--certs", str(certs / role), "--name", role, "--curators", ",".join(CURATORS), *own,
                "--listen", f"127.0.0.1:{self.ports[party]}", "--keystore", str(self.root / f"ks-{role}"),
                "--alignment-key-file", str(base / "align.key"), "--grant", "researcher",
                "--insecure-test-pad-key", keys[role].hex(), "--timeout", str(TIMEOUT_S), "--exit-after-keys",
                "--key-retention", str(RETENTION_S)]  # fmt: skip

    def log(self, party: str) -> Path:
        return self.root / f"{party}.log"

    def start(self, party: str) -> None:
        self.started.setdefault(party, time.monotonic())
        with self.log(party).open("ab") as fh:
            fh.write(f"=== start at {time.monotonic() - self.started[party]:.2f}s\n".encode())
            fh.flush()
            self.procs[party] = subprocess.Popen([sys.executable, *self.args(party)], stdout=fh,
                                                 stderr=subprocess.STDOUT, env=self.env, stdin=subprocess.DEVNULL,
                                                 start_new_session=True)  # fmt: skip

    def alive(self, party: str) -> bool:
        proc = self.procs.get(party)
        return proc is not None and proc.poll() is None

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        for proxy in self.proxies.values():
            proxy.close()


def _worker_pids(pid: int) -> list[int]:
    import psutil

    out = []
    for proc in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if not proc.children() and not any("resource_tracker" in p for p in proc.cmdline()):
                out.append(proc.pid)
    return out


_STAGE_EVENTS = (("engine_started", "read"), ("partitions_read", "shuffle"), ("shards_sorted", "agreement"),
                 ("agreed", "match/align"), ("aligned", "sample"), ("prepared", "upload"),
                 ("committed", "serve"))  # fmt: skip


def stage_now(log: Path) -> str:
    """The Dask engine's stage a curator is in, from its log's last stage event."""
    text = log.read_text(errors="replace") if log.exists() else ""
    stage = "start"
    for event, name in _STAGE_EVENTS:
        if f'"event": "{event}"' in text:
            stage = name
    return stage


def kill_worker_at(run: Run, fault: Fault, notes: list[str]) -> None:
    """Kill one Dask worker of the curator ``party@event`` names right after ``event`` shows in
    its log (the stage it starts: :data:`_STAGE_EVENTS`), its first run or a rerun."""
    party, event = fault.target.split("@")
    stage = dict(_STAGE_EVENTS)[event]
    end = time.monotonic() + TIMEOUT_S
    while time.monotonic() < end:
        log = run.log(party)
        proc = run.procs.get(party)
        if proc is not None and proc.poll() is None and log.exists() and f'"event": "{event}"' in log.read_text(
            errors="replace"
        ):
            with contextlib.suppress(Exception):
                workers = _worker_pids(proc.pid)
                if workers:
                    os.kill(random.Random(fault.target).choice(workers), signal.SIGKILL)
                    notes.append(f"worker of {party} killed in stage {stage}")
                    return
        time.sleep(0.02)
    notes.append(f"worker of {party}: the {stage} stage never came with a worker running")


def inject(run: Run, fault: Fault, notes: list[str]) -> None:
    """Start ``fault`` now (its end runs on a timer thread)."""
    if fault.kind in ("blackhole", "delay"):
        proxy = run.proxies[fault.target]
        proxy.mode, proxy.delay_s = fault.kind, 0.2
        threading.Timer(fault.for_s, lambda: setattr(proxy, "mode", "pass")).start()
        notes.append(f"{fault.kind} {fault.target}")
        return
    if fault.kind == "worker":
        threading.Thread(target=kill_worker_at, args=(run, fault, notes), daemon=True).start()
        return
    proc = run.procs.get(fault.target)
    if proc is None or proc.poll() is not None:
        notes.append(f"{fault.kind} {fault.target}: already ended")
        return
    if fault.kind == "pause":
        os.killpg(proc.pid, signal.SIGSTOP)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)

        threading.Timer(fault.for_s, resume).start()
        notes.append(f"pause {fault.target}")
        return
    with contextlib.suppress(ProcessLookupError):  # kill: the whole group (a curator's workers too)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    threading.Timer(fault.for_s, run.start, args=(fault.target,)).start()
    notes.append(f"kill {fault.target}")


@dataclass
class Result:
    seed: int
    schedule: str
    outcomes: dict[str, str]  # release -> released | aborted
    violations: list[str]
    reasons: dict[str, str]  # an aborted release -> the researcher's last line (why)
    injected: list[str]
    seconds: float


def run_schedule(world: dict[str, Any], schedule: Schedule, root: Path) -> Result:
    """Run ``schedule`` in a fresh ``root`` and check the invariant."""
    t0 = time.monotonic()
    run = Run(world, root, schedule)
    notes: list[str] = []
    try:
        for party in parties(schedule.releases):
            run.start(party)
        for fault in schedule.faults:
            time.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
            inject(run, fault, notes)
        restart_by = max((f.at_s + f.for_s for f in schedule.faults if f.kind == "kill"), default=0.0)
        time.sleep(max(0.0, t0 + restart_by + 0.5 - time.monotonic()))  # every rerun has started
        limit = max(run.started.values()) + TIMEOUT_S + GRACE_S
        hung: list[str] = []
        for party in parties(schedule.releases):
            if party == "server":
                continue
            proc = run.procs[party]
            try:
                proc.wait(timeout=max(0.1, limit - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(party)
        violations = [f"{p} still running {TIMEOUT_S + GRACE_S:.0f} s after its last start" for p in hung]
        if not server_answers(run):
            violations.append("the server does not answer after the schedule")
    finally:
        run.stop_all()
    outcomes, more = check(world, run)
    violations += more
    taken = [p for p in run.procs if "BindError: could not listen" in run.log(p).read_text(errors="replace")]
    if taken:  # the harness picked ports in advance and another program took one: not the system's doing
        notes.append(f"void: a port the harness picked for {', '.join(taken)} was taken by another process")
        violations = []
    took = round(time.monotonic() - t0, 1)
    reasons = {rid: last_line(run.log(f"researcher{rid[1:]}")) for rid, o in outcomes.items() if o != "released"}
    return Result(schedule.seed, schedule.describe(), outcomes, violations, reasons, notes, took)


def last_line(log: Path) -> str:
    """The last line a party printed (its error, if it failed)."""
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return lines[-1][:300] if lines else ""


def server_answers(run: Run) -> bool:
    """A GetRefusals call by the researcher gets an answer (the server restarted if it was killed)."""
    if not run.alive("server"):
        run.start("server")
    from secure_release.infra.tls import secure_channel
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
    from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

    certs = Path(run.world["base"]) / "certs" / "researcher"
    end = time.monotonic() + 20
    while time.monotonic() < end:
        channel = secure_channel(f"127.0.0.1:{run.ports['server']}", certs, "researcher", False, role="researcher",
                                 peer_role="server")  # fmt: skip
        try:
            pb_grpc.ReleaseServerStub(channel).GetRefusals(pb.RefusalQuery(release_id="r0"), timeout=3)
            return True
        except Exception:
            time.sleep(0.5)
        finally:
            channel.close()
    return False


def researcher_cut_off(schedule: Schedule, index: int) -> bool:
    """Whether a link of release ``index``'s researcher was cut for longer than every --timeout."""
    return any(f.kind == "blackhole" and f.for_s > TIMEOUT_S and f.target.startswith(f"researcher{index}>")
               for f in schedule.faults)  # fmt: skip


def check(world: dict[str, Any], run: Run) -> tuple[dict[str, str], list[str]]:
    """Each release's outcome and every violation of the invariant."""
    from secure_release.curator.records.keystore import Keystore
    from secure_release.mechanism.privacy.ledger import EntryKind

    outcomes: dict[str, str] = {}
    violations: list[str] = []
    ledgers = {c: Keystore(run.root / f"ks-{c}").ledger.read() for c in CURATORS}
    for index in range(run.schedule.releases):
        rid = f"r{index}"
        charges = {c: led.releases().get(rid) for c, led in ledgers.items()}
        states = {c: (charge.state if charge is not None else None) for c, charge in charges.items()}
        result = run.root / "results" / f"{rid}.json"
        if result.exists():
            got = [float(c["raw"]) for c in json.loads(result.read_text())["cells"]]
            if got != reference_cells(world, rid, index):
                violations.append(f"{rid}: released cells differ from the uninterrupted run's")
            if any(s is not EntryKind.COMMIT for s in states.values()):
                violations.append(f"{rid}: released but the ledgers say {states}")
            outcomes[rid] = "released"
        elif all(s in (None, EntryKind.REFUND) for s in states.values()):
            outcomes[rid] = "aborted"
        elif all(s is EntryKind.COMMIT for s in states.values()) and researcher_cut_off(run.schedule, index):
            # sealed and committed, but its researcher could not reach the server or a curator for
            # longer than its --timeout and the curators' --key-retention: spent, never fetched
            outcomes[rid] = "committed-unfetched"
        else:
            outcomes[rid] = "stuck"
            violations.append(f"{rid}: no result at the researcher and the ledgers say "
                              f"{ {c: (s.value if s else None) for c, s in states.items()} }")  # fmt: skip
    for c, led in ledgers.items():
        charged = [rid for rid, o in outcomes.items() if o in ("released", "committed-unfetched")]
        spent = sum(led.spent(ds) for ds in {r.dataset for r in led.releases().values()})
        if not np.isclose(spent, EPSILON * len(charged)):
            violations.append(f"{c}'s ledger spent {spent:g}, the released releases {EPSILON * len(charged):g}")
        reserved = [rid for rid, r in led.releases().items() if r.state is EntryKind.RESERVE]
        if reserved:
            violations.append(f"{c}'s ledger keeps {reserved} reserved")
    return outcomes, violations


def campaign(world: dict[str, Any], seeds: list[int], releases: int, dask_share: float, out: Path,
             keep: bool = False, say: Any = print) -> list[Result]:  # fmt: skip
    """Every schedule of ``seeds``, one after another; each result said as it ends."""
    results = []
    for seed in seeds:
        schedule = draw_schedule(seed, releases, dask_share)
        root = out / f"s{seed}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        result = run_schedule(world, schedule, root)
        results.append(result)
        mark = "OK  " if not result.violations else "FAIL"
        say(f"{mark} {result.schedule} -> {result.outcomes} in {result.seconds} s")
        for v in result.violations:
            say(f"     violation: {v}  (replay: --replay {seed})")
        for rid, why in result.reasons.items():
            say(f"     {rid} not released: {why}")
        if not result.violations and not keep:
            shutil.rmtree(root, ignore_errors=True)
    return results


def summary(results: list[Result]) -> dict[str, Any]:
    faults: dict[str, int] = {}
    worker_stages: dict[str, int] = {}
    for r in results:
        for note in r.injected:
            kind = note.split()[0].rstrip(":")
            faults[kind] = faults.get(kind, 0) + 1
            found = re.search(r"killed in stage (\S+)", note)
            if found:
                worker_stages[found.group(1)] = worker_stages.get(found.group(1), 0) + 1
    outcomes: dict[str, int] = {}
    for r in results:
        for o in r.outcomes.values():
            outcomes[o] = outcomes.get(o, 0) + 1
    why: dict[str, int] = {}
    for r in results:
        for line in r.reasons.values():
            found = re.search(r"(\w+Error)", line)
            name = found.group(1) if found else "other"
            why[name] = why.get(name, 0) + 1
    return {
        "schedules": len(results),
        "void_schedules": [r.seed for r in results if any(n.startswith("void") for n in r.injected)],
        "not_released_because": why,
        "releases": sum(len(r.outcomes) for r in results),
        "faults_injected": faults,
        "worker_kills_by_stage": worker_stages,
        "outcomes": outcomes,
        "schedules_with_violations": [r.seed for r in results if r.violations],
        "violations": [v for r in results for v in r.violations],
        "seconds": round(sum(r.seconds for r in results), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", type=int, default=20, help="how many schedules (seeds first-seed ..)")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--replay", type=int, help="run only the schedule of this seed, keeping its logs")
    ap.add_argument("--releases", type=int, default=3, help="concurrent releases a schedule (K)")
    ap.add_argument("--dask-share", type=float, default=0.25, help="chance a release's curators run on Dask")
    ap.add_argument("--out", default="/tmp/fault-campaign", help="where each schedule runs (kept if it fails)")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    world = make_world(Path(_fresh(out / "world")))
    seeds = [args.replay] if args.replay is not None else list(range(args.first_seed, args.first_seed + args.schedules))
    results = campaign(world, seeds, args.releases, args.dask_share, out, keep=args.replay is not None,
                       say=(lambda s: print(s, file=sys.stderr, flush=True)))  # fmt: skip
    figures = summary(results)
    if args.json:
        print(json.dumps({"summary": figures, "results": [asdict(r) for r in results]}))
    else:
        for key, value in figures.items():
            print(f"{key:>28}: {value}")
    return 1 if figures["violations"] else 0


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
