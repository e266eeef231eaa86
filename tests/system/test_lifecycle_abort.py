"""A release that cannot complete ends ABORTED with its reason, visible to every party within
seconds, and every reservation is refunded: a follower that refuses the spec, a follower whose
budget is used up, a follower that dies and never returns (the leader's deadline), and an
operator's ``release abort``. Exit codes: 1 for an aborted release."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_faults_kill import CURATORS, ROLES, Deployment, make_world

from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Demo data and an alignment key shared by this module's releases."""
    return make_world(tmp_path_factory.mktemp("lifecycle"))


def _deploy(world: dict[str, object], certs: Path, tmp_path: Path, rid: str, **extra: list[str]) -> Deployment:
    root = tmp_path / rid
    root.mkdir()
    (root / "data").symlink_to(Path(str(world["base"])) / "data")
    (root / "align.key").write_text((Path(str(world["base"])) / "align.key").read_text())
    for c in CURATORS:
        LedgerFile(root / f"ks-{c}", HeadSigner.from_certs(certs / c, c)).set_budget(f"{c}.csv", f"{c}.csv", 2.0)
    dep = Deployment(root, certs, rid, timeout=60.0)
    dep.extra = dict(extra)
    return dep


def _wait_all(dep: Deployment, roles: tuple[str, ...], seconds: float) -> dict[str, int | None]:
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(dep.procs[r].poll() is None for r in roles):
        time.sleep(0.05)
    return {r: dep.procs[r].poll() for r in roles}


def _operator(dep: Deployment, certs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``secure-release-curator release ...`` as bob, with bob's certificate and keystore."""
    server = f"127.0.0.1:{dep.ports['server']}"
    flags = ["--server", server, "--certs", str(certs / "bob"), "--name", "bob", "--keystore", str(dep.root / "ks-bob")]
    cmd = [sys.executable, "-m", "secure_release.curator", "release", *args, *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dep.env)


def _ledger_state(dep: Deployment, curator: str) -> str:
    known = Keystore(dep.root / f"ks-{curator}").ledger.read().releases().get(dep.release_id)
    return known.state.value if known else "none"


def test_a_follower_refusing_the_spec_aborts_it_for_everybody(
    world: dict[str, object], certs: Path, tmp_path: Path
) -> None:
    dep = _deploy(world, certs, tmp_path, "a1")
    bob = dep.args("bob")
    bob[bob.index("--epsilon") + 1] = "0.25"  # another epsilon than the leader's 0.5
    dep.extra = {}
    try:
        for role in ("server", "alice", "researcher"):
            dep.start(role)
        dep.procs["bob"] = subprocess.Popen([sys.executable, *bob], stdout=dep.log("bob").open("ab"),
                                            stderr=subprocess.STDOUT, env=dep.env)  # fmt: skip
        t0 = time.monotonic()
        codes = _wait_all(dep, ROLES[1:], 40)
        took = time.monotonic() - t0
    finally:
        dep.close()
    assert codes == {"alice": 1, "bob": 1, "researcher": 1}, codes
    assert took < 20, took  # every party knows within seconds, not at a timeout
    assert "epsilon" in dep.log("researcher").read_text() and "aborted" in dep.log("researcher").read_text()
    assert "refuses the agreed spec" in dep.log("alice").read_text()
    assert _ledger_state(dep, "alice") == "refund" and _ledger_state(dep, "bob") == "none"


def test_a_follower_without_budget_aborts_and_the_leader_is_refunded(
    world: dict[str, object], certs: Path, tmp_path: Path
) -> None:
    dep = _deploy(world, certs, tmp_path, "a2")
    ledger = LedgerFile(dep.root / "ks-bob", HeadSigner.from_certs(certs / "bob", "bob"))
    ledger.set_budget("bob.csv", "bob.csv", 0.5)
    ledger.update(lambda led: led.reserve("bob.csv", "bob.csv", "racing", 0.3, "x", 0.0))  # a concurrent release
    try:
        for role in ROLES:
            dep.start(role)
        codes = _wait_all(dep, ROLES[1:], 40)
    finally:
        dep.close()
    assert codes == {"alice": 3, "bob": 3, "researcher": 3}, codes  # bob refused: 3 at every party (README)
    assert "BudgetExceededError" in dep.log("alice").read_text()
    assert _ledger_state(dep, "alice") == "refund" and _ledger_state(dep, "bob") == "none"


def test_a_follower_that_never_returns_is_aborted_at_the_leaders_deadline(
    world: dict[str, object], certs: Path, tmp_path: Path
) -> None:
    # bob's server address answers nothing (a bound, never listening port), so bob agrees with the
    # leader but can never reach the budget witness, register or commit (before issue 24 it also
    # reserved and prepared offline; a reservation now needs the server's witness): no race
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dep = _deploy(world, certs, tmp_path, "a3", alice=["--timeout", "12"],
                  bob=["--server", f"127.0.0.1:{dead.getsockname()[1]}"])  # fmt: skip
    try:
        for role in ROLES:
            dep.start(role)
        end = time.monotonic() + 30
        while not dep.seen("bob", '"agreed"') and time.monotonic() < end:
            time.sleep(0.01)
        assert dep.seen("bob", '"agreed"') and not dep.seen("bob", '"registered"')
        dep.kill("bob")  # killed before its commit; never restarted
        codes = _wait_all(dep, ("alice", "researcher"), 40)
        # bob never registered, but the server shows researchers an aborted candidate of an
        # unbound release id, so the researcher stops with the reason too
        shown = json.loads(_operator(dep, certs, "status", "a3").stdout)
        # the operator settles bob's reservation: the server already says ABORTED
        abort = _operator(dep, certs, "abort", "a3", "--reason", "bob is gone")
    finally:
        dep.close()
        dead.close()
    assert codes == {"alice": 1, "researcher": 1}, codes
    assert "waiting for bob" in dep.log("researcher").read_text()
    assert shown["server"]["state"] == "ABORTED" and "waiting for bob" in shown["server"]["abort_reason"]
    assert shown["ledger"]["state"] in ("reserve", "none", "unknown")  # bob never reached its witness
    assert abort.returncode == 0, abort.stderr
    assert _ledger_state(dep, "alice") == "refund" and _ledger_state(dep, "bob") in ("refund", "none")
    assert not (dep.root / "ks-bob" / "release-a3.json").exists()
