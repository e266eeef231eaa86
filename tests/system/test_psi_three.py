"""``--alignment psi`` with three curators (alice leads, bob, carol) as real processes over mutual
TLS, with the server and the researcher: each list makes two hops through the leader's mailbox
before it comes home. The id sets are cut so that every pair of curators shares ids the third
lacks (each pairwise intersection is larger than the triple one), and bob shares its blinding
with a worker process (``--psi-workers 2``); the release must align every
curator on the triple intersection in one canonical order and give the in-memory
``mechanism.protocol.architectures.run_variant_release`` estimate with the same keys and seed."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from test_faults_kill import PRAM, SEED, free_ports

from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.curator.table import load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.mechanism.alignment.psi import PsiKey, PsiWorkers
from secure_release.mechanism.primitives.keys import PadKey
from secure_release.mechanism.protocol.architectures import agreement_positions, align_tables, run_variant_release

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CURATORS = ("alice", "bob", "carol")
PSI = {c: PsiKey(bytes([20 + j]) * 32) for j, c in enumerate(CURATORS)}
PADS = {c: PadKey(bytes([30 + j]) * 32) for j, c in enumerate(CURATORS)}
ROWS, DROP, M, EPS, RID = 1030, 30, 200, 1.0, "psi3"


def _cut(data: Path) -> None:
    """Curator j drops the ids of block j (ids p0000000 .. : block j = rows DROP*j .. DROP*(j+1)),
    so ids of block k (k != i, j) are held by i and j but not by k."""
    for j, c in enumerate(CURATORS):
        path = data / f"{c}.csv"
        with path.open(newline="") as fh:
            rows = list(csv.reader(fh))
        gone = {f"p{i:07d}" for i in range(DROP * j, DROP * (j + 1))}
        kept = [rows[0], *(r for r in rows[1:] if r[0] not in gone)]
        assert len(kept) == len(rows) - DROP
        with path.open("w", newline="") as fh:
            csv.writer(fh).writerows(kept)


def _args(role: str, root: Path, certs: Path, ports: dict[str, int]) -> list[str]:
    server = f"127.0.0.1:{ports['server']}"
    net = ["--certs", str(certs / role), "--name", role]
    if role == "server":
        return ["-m", "secure_release.server", "--listen", server, "--store", str(root / "store"), *net,
                "--insecure-test-pram-key", PRAM.reveal().hex(), "--grace", "0.5"]  # fmt: skip
    if role == "researcher":
        return ["-m", "secure_release.researcher", "fetch", "--release-id", RID, "--server", server, *net,
                "--out", str(root / "results"), "--timeout", "60",
                *(x for c in CURATORS for x in ("--curator", f"{c}=127.0.0.1:{ports[c]}"))]  # fmt: skip
    own = ["--leader", "--insecure-test-seed", SEED.reveal().hex()] if role == "alice" else [
        "--leader-address", f"127.0.0.1:{ports['alice']}"]  # fmt: skip
    data = root / "data"
    return ["-m", "secure_release.curator", "run", "--data", str(data / f"{role}.csv"),
            "--schema", str(data / f"{role}.json"), "--release-id", RID, "--epsilon", str(EPS), "--m", str(M),
            "--server", server, *net, "--curators", ",".join(CURATORS), *own,
            "--listen", f"127.0.0.1:{ports[role]}", "--keystore", str(root / f"ks-{role}"), "--grant", "researcher",
            "--alignment", "psi", "--insecure-test-psi-key", PSI[role].reveal().hex(),
            "--insecure-test-pad-key", PADS[role].reveal().hex(), "--timeout", "60",
            *(["--psi-workers", "2"] if role == "bob" else [])]  # fmt: skip


def _start(role: str, root: Path, certs: Path, ports: dict[str, int], drop_test_key: bool = False,
           mode: str = "wb") -> subprocess.Popen[bytes]:  # fmt: skip
    args = _args(role, root, certs, ports)
    if drop_test_key:  # a restart that can only succeed with the scalar the curator kept
        at = args.index("--insecure-test-psi-key")
        del args[at : at + 2]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SECURE_RELEASE_TESTING": "1"}
    with (root / f"{role}.log").open(mode) as fh:
        fh.write(f"=== start ({mode})\n".encode())
        fh.flush()
        return subprocess.Popen([sys.executable, *args], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)  # fmt: skip


def _log(root: Path, role: str) -> str:
    path = root / f"{role}.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.parametrize("kill", [None, "carol"])
def test_three_curator_psi_over_the_services_aligns_on_the_triple_intersection(
    certs: Path, tmp_path: Path, kill: str | None
) -> None:
    """``kill``: that follower is killed (-9) right after its own list reached the leader, i.e.
    during the ring, and restarted without its injected PSI key: it resumes with the scalar it
    kept in its keystore, and the release is the same."""
    data = tmp_path / "data"
    write_demo_data(data, rows=ROWS, seed=3, curators=3)
    _cut(data)
    tables = [read_table(data / f"{c}.csv", load_schema(data / f"{c}.json")) for c in CURATORS]
    sets = [set(t.ids.tolist()) for t in tables]
    triple = sets[0] & sets[1] & sets[2]
    assert len(triple) == ROWS - 3 * DROP
    for i, j in combinations(range(3), 2):  # every pair shares DROP ids the third curator lacks
        assert len(sets[i] & sets[j]) == len(triple) + DROP
    for c in CURATORS:
        LedgerFile(tmp_path / f"ks-{c}", HeadSigner.from_certs(certs / c, c)).set_budget(f"{c}.csv", f"{c}.csv", 2.0)

    ports = dict(zip(("server", *CURATORS), free_ports(4), strict=True))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for role in ("server", *CURATORS, "researcher"):
            procs[role] = _start(role, tmp_path, certs, ports)
        end = time.monotonic() + 90
        if kill is not None:
            sent = f'"sender": "{kill}"'
            while time.monotonic() < end and not any(
                '"psi_received"' in line and sent in line and '"hop": 1' in line
                for line in _log(tmp_path, "alice").splitlines()
            ):
                time.sleep(0.01)
            procs[kill].kill()
            procs[kill].wait()
            killed_log = _log(tmp_path, kill)
            assert "psi_aligned" not in killed_log and list((tmp_path / f"ks-{kill}").glob("psi-key-*.json"))
            procs[kill] = _start(kill, tmp_path, certs, ports, drop_test_key=True, mode="ab")
        while time.monotonic() < end and procs["researcher"].poll() is None:
            time.sleep(0.05)
        code = procs["researcher"].poll()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    logs = {r: _log(tmp_path, r) for r in procs}
    assert code == 0, (code, logs["researcher"][-2000:], logs["alice"][-3000:], logs["carol"][-3000:])

    # the in-memory ring with the same scalars: one canonical order, the triple intersection
    aligned = align_tables(tables, "psi", psi_keys=[PSI[c] for c in CURATORS])
    canonical = [t.ids[a.row_order] for t, a in zip(tables, aligned.alignments, strict=True)]
    assert set(canonical[0].tolist()) == triple
    assert np.array_equal(canonical[0], canonical[1]) and np.array_equal(canonical[0], canonical[2])

    stored = Keystore(tmp_path / "ks-alice").load_agreement(RID)
    assert stored is not None and stored.agreement.base.spec.n == len(triple)
    positions = agreement_positions(stored.agreement)
    for j, c in enumerate(CURATORS):
        # every curator matched exactly the triple intersection and sampled the rows of the
        # canonical order: its stored sample is its own symbols in that order at the agreed positions
        assert f'"matched": {len(triple)}' in logs[c] and f'"unmatched": {len(sets[j]) - len(triple)}' in logs[c]
        record = Keystore(tmp_path / f"ks-{c}").load_record(RID)
        assert record is not None and np.array_equal(record.sample, aligned.symbols[j][positions])
        # two hops of the others' lists, then its own list home: no scalar in any log, none kept
        assert logs[c].count('"psi_aligned"') == 1 and PSI[c].reveal().hex() not in logs[c]
        assert not list((tmp_path / f"ks-{c}").glob("psi-key-*"))
    assert '"workers": 2' in logs["bob"] and len(sets[1]) >= PsiWorkers(1).min_points  # bob's lists were split
    if kill is not None:  # the restarted follower took the scalar it kept
        assert logs[kill].count("=== start") == 2 and '"resumed": true' in logs[kill].split("=== start")[-1]

    ref = run_variant_release(tables, EPS, M, "seed", "psi", "chacha20", RID, seed=SEED,
                              psi_keys=[PSI[c] for c in CURATORS], pram_key=PRAM,
                              pad_keys=[PADS[c] for c in CURATORS])  # fmt: skip
    got = np.array([c["raw"] for c in json.loads((tmp_path / "results" / f"{RID}.json").read_text())["cells"]])
    assert got.size == 24 and np.array_equal(got, ref.estimate.raw)
