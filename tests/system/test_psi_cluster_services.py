"""``--engine dask --alignment psi`` through the four services (issue 41): the bytes of PSI in
one process, with every curator on its own cluster, with a follower killed (kill -9) mid-ring and
run again, and with a worker of the leader's own ``dask scheduler`` cluster killed mid-ring.

At N = 2 both engines agree on the same rows in the same order (ascending tag in the follower's
domain), so with the same PSI keys, seed, pad keys and PRAM key the server's stored ciphertext
and the researcher's report are byte-identical whatever engine each curator runs."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import child_env, split_parquet, stored_release
from test_cluster_engine import DaskCli

from secure_release.cluster import PARTIES, Cluster, get_estimate, launch_release, set_budgets, wait_exit
from secure_release.demo_data import write_demo_data
from secure_release.infra.pki import init_pki
from secure_release.mechanism.alignment.psi import PsiKey
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed

pytestmark = pytest.mark.slow
SEED, PRAM = Seed(bytes(range(32))), PramKey(bytes(range(1, 33)))
PADS = {"alice": PadKey(bytes(range(2, 34))), "bob": PadKey(bytes(range(3, 35)))}
PSI = {"alice": PsiKey(bytes(range(5, 37))), "bob": PsiKey(bytes(range(6, 38)))}
ROWS = 12_000
SLICE = ["--psi-slice-points", "400"]  # 15 slices a list: a kill lands mid-ring
DASK = ["--engine", "dask", "--workers", "2", "--shards", "4", *SLICE]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster-psi-src")
    write_demo_data(root / "data", rows=ROWS, seed=9)
    init_pki(root / "certs", list(PARTIES))
    (root / "align.key").write_text(AlignmentKey(bytes(range(4, 36))).reveal().hex())  # unused with psi
    for c in ("alice", "bob"):
        split_parquet(root / "data" / f"{c}.csv", root / "parts" / c, 3)
    return root


def release(
    source: Path, world: Path, extra: dict[str, list[str]], parquet: tuple[str, ...] = (),
    during: Callable[[Cluster], None] | None = None,
) -> dict:  # fmt: skip
    """One PSI release ``r1`` in ``world``: what the server stored, the report, the logs.
    ``parquet``: the curators that read their Parquet parts (the others their CSV);
    ``during(cluster)``: runs beside the release (a fault)."""
    world.mkdir()
    cluster = Cluster(world, env=child_env(testing=True))
    data = source / "data"
    tables = {world / f"keystore-{c}": source / "parts" / c if c in parquet else data / f"{c}.csv"
              for c in ("alice", "bob")}  # fmt: skip
    set_budgets(cluster, tables, 1.0, source / "certs")
    curator_extra = {
        c: [*extra.get(c, []), "--insecure-test-pad-key", PADS[c].reveal().hex(), "--insecure-test-psi-key",
            PSI[c].reveal().hex(), *(["--data", str(source / "parts" / c)] if c in parquet else [])]
        for c in ("alice", "bob")
    }  # fmt: skip
    curator_extra["alice"] += ["--insecure-test-seed", SEED.reveal().hex()]
    fault = None
    try:
        addrs = launch_release(
            cluster, data, source / "certs", "r1", 0.5, 3_000, "chacha20", source / "align.key",
            curator_extra=curator_extra, server_extra=["--insecure-test-pram-key", PRAM.reveal().hex()],
            budgets=False, alignment="psi",
        )  # fmt: skip
        if during is not None:
            fault = threading.Thread(target=during, args=(cluster,), daemon=True)
            fault.start()
        resp = get_estimate(addrs["researcher"], source / "certs", "r1", timeout=240)
        wait_exit(cluster, ["alice", "bob"], 60)
    except Exception:
        sys.stderr.write(cluster.tails(30))
        raise
    finally:
        if fault is not None:
            fault.join(30)
        cluster.close()
    stored = stored_release(world, "r1")
    logs = {c: "".join(p.read_text() for p in sorted(world.glob(f"{c}*.log"))) for c in ("alice", "bob")}
    return {"n": resp.privacy.n, **stored, "logs": logs}


@pytest.fixture(scope="module")
def local(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return release(source, tmp_path_factory.mktemp("local") / "w", {})


def _same(got: dict, local: dict) -> None:
    assert got["n"] == local["n"] and got["n"] > 0.8 * ROWS
    assert got["digests"] == local["digests"] and len(got["digests"]) == 2
    assert got["perturbed"] == local["perturbed"] and got["perturbed"]
    assert got["report"] == local["report"]


def test_psi_on_both_curators_clusters_gives_the_bytes_of_psi_in_process(
    source: Path, local: dict, tmp_path: Path
) -> None:
    got = release(source, tmp_path / "w", {"alice": DASK, "bob": DASK}, parquet=("alice", "bob"))
    _same(got, local)
    for name in ("alice", "bob"):
        assert "psi_ring_done" in got["logs"][name] and "psi_shards_sorted" in got["logs"][name]
        assert "psi_ring_done" not in local["logs"][name]
    assert '"slice": "1/' in got["logs"]["alice"]  # the leader took and served slices, not lists
    keystore = tmp_path / "w" / "keystore-alice"
    assert not list(keystore.glob("psi-r1-*")) and not list(keystore.glob("spool-*"))  # the mailbox is gone


def _logged(log: str, event: str, **fields: object) -> bool:
    """Some JSON line of ``log`` records ``event`` with these ``fields``."""
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event and all(record.get(k) == v for k, v in fields.items()):
            return True
    return False


def _kill_and_rerun(cluster: Cluster, name: str, when: Callable[[str], bool], done: list[str]) -> None:
    """kill -9 ``name`` once ``when(leader's log)``, then start it again with the same command."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        log = (cluster.root / "alice.log").read_text() if (cluster.root / "alice.log").exists() else ""
        if when(log):
            proc = cluster.procs[name]
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            ring_was = "psi_ring_done" in (cluster.root / f"{name}.log").read_text()
            done.append("after the ring" if ring_was else "mid-ring")
            (cluster.root / f"{name}.log").rename(cluster.root / f"{name}-killed.log")
            args = list(proc.args)[1:]
            at = args.index("--port-file")
            cluster.spawn(name, args[:at] + args[at + 2 :])
            return
        time.sleep(0.02)


def test_a_follower_killed_mid_ring_on_its_cluster_runs_again_and_resumes_with_its_kept_key(
    source: Path, local: dict, tmp_path: Path
) -> None:
    """bob is killed (SIGKILL) once the leader has its own list and the first slice of its
    re-blinding of alice's: run again with the same flags, it takes its kept PSI key, resends
    identical slices (the leader's mailbox takes them again) and the release is the local one."""
    killed: list[str] = []

    def fault(cluster: Cluster) -> None:
        _kill_and_rerun(cluster, "bob", lambda log: _logged(log, "psi_received", owner="alice", hop=2), killed)

    got = release(source, tmp_path / "w", {"alice": DASK, "bob": DASK}, parquet=("alice", "bob"), during=fault)
    assert killed == ["mid-ring"]
    _same(got, local)
    assert _logged(got["logs"]["bob"], "psi_started", resumed=True)


def test_a_leaders_worker_killed_mid_ring_is_redone_by_the_cluster(source: Path, local: dict, tmp_path: Path) -> None:
    """alice leads on ``dask scheduler`` + two ``dask worker`` processes, bob runs PSI in one
    process (both engines in one ring: the mailbox joins and cuts his whole lists); one of
    alice's workers gets SIGKILL once the ring started: its tasks run again on the other."""
    dask = DaskCli(tmp_path, 2)
    killed: list[int] = []

    def fault(cluster: Cluster) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            log = (cluster.root / "alice.log").read_text() if (cluster.root / "alice.log").exists() else ""
            if _logged(log, "psi_started"):
                if not _logged(log, "psi_ring_done"):
                    pid = dask.worker_pids()[0]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                return
            time.sleep(0.02)

    try:
        got = release(source, tmp_path / "w", {"alice": ["--engine", "dask", "--scheduler", dask.address, *SLICE]},
                      parquet=("alice",), during=fault)  # fmt: skip
    finally:
        dask.close()
    assert killed, "the worker was not killed during the ring"
    _same(got, local)
