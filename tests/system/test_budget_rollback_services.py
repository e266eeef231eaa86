# tier: system
"""Issue 24, item 1 where an operator meets it: real processes (server, two curators, the
researcher) over mutual TLS. Alice's keystore is rolled back to the copy taken before release
rA (validly signed by her key, so only the server's witness can tell); the next release rB is then
refused by alice with ``LedgerBehindError`` before anything is uploaded, and bob is told. Before
issue 24 the rolled-back ledger reserved rB as if rA had never happened."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from test_faults_kill import CURATORS, EPSILON, Deployment, make_world

from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _wait(dep: Deployment, roles: tuple[str, ...], seconds: float) -> dict[str, int | None]:
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(dep.procs[r].poll() is None for r in roles):
        time.sleep(0.05)
    return {r: dep.procs[r].poll() for r in roles}


def test_a_rolled_back_ledger_is_refused_by_the_running_curator(certs: Path, tmp_path: Path) -> None:
    world = make_world(tmp_path / "world")
    root = tmp_path / "dep"
    root.mkdir()
    (root / "data").symlink_to(Path(str(world["base"])) / "data")
    (root / "align.key").write_text((Path(str(world["base"])) / "align.key").read_text())
    for c in CURATORS:
        LedgerFile(root / f"ks-{c}", HeadSigner.from_certs(certs / c, c)).set_budget(f"{c}.csv", f"{c}.csv", 1.0)
    old = tmp_path / "old-alice"
    shutil.copytree(root / "ks-alice", old)  # what the attacker keeps
    first = Deployment(root, certs, "rA", timeout=60.0)
    try:
        for role in ("server", "alice", "bob"):
            first.start(role)
        end = time.monotonic() + 60
        while not all(first.seen(c, '"ledger_committed"') for c in CURATORS) and time.monotonic() < end:
            time.sleep(0.05)
        assert first.seen("alice", '"ledger_committed"'), first.log("alice").read_text()[-2000:]
    finally:
        first.close()
    spent = Keystore(root / "ks-alice").ledger.read().spent("alice.csv")
    assert spent == pytest.approx(EPSILON)
    for name in ("ledger.jsonl", "ledger.head"):
        shutil.copy(old / name, root / "ks-alice" / name)  # rolled back: rA never happened, says the ledger
    assert Keystore(root / "ks-alice").ledger.read().spent("alice.csv") == 0.0
    second = Deployment(root, certs, "rB", timeout=30.0)  # the same server store: the witness persists
    try:
        for role in ("server", "alice", "bob"):
            second.start(role)
        codes = _wait(second, ("alice", "bob"), 40)
    finally:
        second.close()
    text = second.log("alice").read_text()
    assert codes["alice"] not in (None, 0) and codes["bob"] not in (None, 0), codes
    assert "LedgerBehindError" in text and "witness has seen 1" in text
    assert "rB" not in Keystore(root / "ks-alice").ledger.read().releases()  # nothing reserved
    assert not (root / "ks-alice" / "release-rB.json").exists()  # nothing prepared or uploaded
