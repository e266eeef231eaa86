"""Issue 47, item 2: the PSI leader resumes. Through the four services (``--alignment psi``, two
curators, alice leads), alice is killed (kill -9) during the ring, once her mailbox holds a list
(a slice, on a cluster) bob sent, and run again with her command, without the injected PSI key
(only the scalar she kept can make her lists match those her kept mailbox holds). She takes her
kept scalar and kept mailbox, bob waits for her within his --timeout without starting over, and
the release's cells are those of the uninterrupted in-memory protocol with the same injected keys
(the PSI keys, the seed, the pads, the server's PRAM key), once with ``--engine local`` (whole
lists) and once with both curators on ``--engine dask`` (slices)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support import child_env, split_parquet

from secure_release.cluster import PARTIES, Cluster, get_estimate, launch_release, set_budgets, wait_exit
from secure_release.curator.table import load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.infra.pki import init_pki
from secure_release.mechanism.alignment.psi import PsiKey
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.protocol.architectures import run_variant_release

pytestmark = pytest.mark.slow
CURATORS = ("alice", "bob")
SEED, PRAM = Seed(bytes(range(40, 72))), PramKey(bytes(range(41, 73)))
PADS = {"alice": PadKey(bytes(range(42, 74))), "bob": PadKey(bytes(range(43, 75)))}
PSI = {"alice": PsiKey(bytes(range(44, 76))), "bob": PsiKey(bytes(range(45, 77)))}
ROWS, EPS, M, RID = 3000, 0.5, 1500, "r1"
DASK = ["--engine", "dask", "--workers", "2", "--shards", "4", "--psi-slice-points", "200"]  # 13 slices a list


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("psi-leader-src")
    write_demo_data(root / "data", rows=ROWS, seed=21)
    init_pki(root / "certs", list(PARTIES))
    (root / "align.key").write_text(AlignmentKey(bytes(range(4, 36))).reveal().hex())  # unused with psi
    for c in CURATORS:
        split_parquet(root / "data" / f"{c}.csv", root / "parts" / c, 3)
    return root


@pytest.fixture(scope="module")
def reference(source: Path) -> np.ndarray:
    """The uninterrupted in-memory protocol's raw cells with the injected keys (at N = 2 both
    engines agree on the same rows in the same order)."""
    data = source / "data"
    tables = [read_table(data / f"{c}.csv", load_schema(data / f"{c}.json")) for c in CURATORS]
    ref = run_variant_release(tables, EPS, M, "seed", "psi", "chacha20", RID, seed=SEED,
                              psi_keys=[PSI[c] for c in CURATORS], pram_key=PRAM,
                              pad_keys=[PADS[c] for c in CURATORS])  # fmt: skip
    return np.asarray(ref.estimate.raw)


def _events(log: str) -> list[dict]:
    out = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _logged(log: str, event: str, **fields: object) -> list[dict]:
    """The JSON lines of ``log`` that record ``event`` with these ``fields``."""
    return [r for r in _events(log) if r.get("event") == event and all(r.get(k) == v for k, v in fields.items())]


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


#: When alice is killed: her ring started (her scalar is kept) and her mailbox took bob's own list
#: (in one process: she then re-blinds it), or on a cluster the first slice of bob's re-blinding
#: of her list (her own list went out, bob's came in, and her hop of it is under way).
MID_RING = {
    "local": [("psi_started", {}), ("psi_received", {"sender": "bob", "owner": "bob", "hop": 1})],
    "dask": [("psi_started", {}), ("psi_received", {"sender": "bob", "owner": "alice", "hop": 2})],
}


def _kill_leader_mid_ring(cluster: Cluster, engine: str, done: list[str]) -> None:
    """kill -9 alice once her log shows every event of ``MID_RING[engine]``, then run her
    again with her command less the injected PSI key."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        log = _read(cluster.root / "alice.log")
        if all(_logged(log, event, **fields) for event, fields in MID_RING[engine]):
            proc = cluster.procs["alice"]
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            log = _read(cluster.root / "alice.log")
            done.append("after the ring" if "psi_aligned" in log else "mid-ring")
            (cluster.root / "alice.log").rename(cluster.root / "alice-killed.log")
            args = list(proc.args)[1:]
            at = args.index("--port-file")
            args = args[:at] + args[at + 2 :]
            at = args.index("--insecure-test-psi-key")
            cluster.spawn("alice", args[:at] + args[at + 2 :])
            return
        time.sleep(0.01)


def _release(source: Path, world: Path, engine: str) -> dict:
    """Release ``r1`` in ``world`` with the leader killed mid-ring and run again: the report,
    the logs and what the kill hit."""
    world.mkdir()
    extra, parquet = (DASK, True) if engine == "dask" else ([], False)
    cluster = Cluster(world, env=child_env(testing=True))
    data = source / "data"
    tables = {world / f"keystore-{c}": source / "parts" / c if parquet else data / f"{c}.csv" for c in CURATORS}
    set_budgets(cluster, tables, 1.0, source / "certs")
    curator_extra = {
        c: [*extra, "--insecure-test-pad-key", PADS[c].reveal().hex(), "--insecure-test-psi-key",
            PSI[c].reveal().hex(), "--timeout", "60", *(["--data", str(source / "parts" / c)] if parquet else [])]
        for c in CURATORS
    }  # fmt: skip
    curator_extra["alice"] += ["--insecure-test-seed", SEED.reveal().hex()]
    killed: list[str] = []
    fault = None
    try:
        addrs = launch_release(
            cluster, data, source / "certs", RID, EPS, M, "chacha20", source / "align.key",
            curator_extra=curator_extra, server_extra=["--insecure-test-pram-key", PRAM.reveal().hex()],
            budgets=False, alignment="psi",
        )  # fmt: skip
        fault = threading.Thread(target=_kill_leader_mid_ring, args=(cluster, engine, killed), daemon=True)
        fault.start()
        resp = get_estimate(addrs["researcher"], source / "certs", RID, timeout=120)
        wait_exit(cluster, list(CURATORS), 60)
    except Exception:
        sys.stderr.write(cluster.tails(40))
        raise
    finally:
        if fault is not None:
            fault.join(30)
        cluster.close()
    report = json.loads((world / "results" / f"{RID}.json").read_text())
    logs = {name: _read(world / f"{name}.log") for name in ("alice", "alice-killed", "bob")}
    return {"n": resp.privacy.n, "cells": np.array([c["raw"] for c in report["cells"]]), "logs": logs,
            "killed": killed, "keystore": world / "keystore-alice"}  # fmt: skip


def _check(got: dict, reference: np.ndarray) -> None:
    assert got["killed"] == ["mid-ring"], got["killed"]
    logs = got["logs"]
    # the restarted leader took the slices its killed run kept, and the scalar it kept
    kept = _logged(logs["alice"], "psi_mailbox_kept")
    assert kept and kept[0]["slices"] >= 1 and "bob@1" in kept[0]["lists"] and not kept[0]["ignored"], kept
    assert _logged(logs["alice-killed"], "psi_started", resumed=False)
    assert _logged(logs["alice"], "psi_started", resumed=True) and _logged(logs["alice"], "psi_aligned")
    # bob waited for the leader (told he could not reach it) and never started over
    assert len(_logged(logs["bob"], "psi_started")) == 1 and len(_logged(logs["bob"], "psi_aligned")) == 1
    unreachable = _logged(logs["bob"], "unreachable")
    assert any("the leader alice" in str(r.get("what")) for r in unreachable), unreachable
    # the release is the uninterrupted protocol's, to the bit
    assert got["cells"].shape == reference.shape and np.array_equal(got["cells"], reference)
    assert got["n"] > 0.8 * ROWS
    # sealed: the kept mailbox and the kept scalar are gone from the leader's keystore
    assert not list(got["keystore"].glob("psi-mailbox-*")) and not list(got["keystore"].glob("psi-key-*"))


def test_a_leader_killed_mid_ring_resumes_from_its_kept_scalar_and_mailbox(
    source: Path, reference: np.ndarray, tmp_path: Path
) -> None:
    _check(_release(source, tmp_path / "w", "local"), reference)


def test_a_leader_on_its_cluster_killed_mid_ring_resumes_from_its_kept_scalar_and_slices(
    source: Path, reference: np.ndarray, tmp_path: Path
) -> None:
    got = _release(source, tmp_path / "w", "dask")
    _check(got, reference)
    assert '"slice": "1/' in got["logs"]["alice-killed"] and "psi_ring_done" in got["logs"]["alice"]
    lists = _logged(got["logs"]["alice"], "psi_mailbox_kept")[0]["lists"].split(",")
    assert {"alice@1", "alice@2", "bob@1"} <= set(lists), lists  # deep in the ring: three lists (in part) kept
