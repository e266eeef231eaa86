"""The exit-code table of docs/deployment.md, row by row, through the real processes (issue 26, item 6):
0 released at every curator; 1 a runtime failure (a peer unreachable); 2 usage at every
command; 130 interrupted; 3 a refusal (no budget, past the budget) at every party, leader and followers alike,
and at a researcher fetching a release a follower refused (a leader refuses before the
agreement, so that release never reaches the server)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import child_env, demo_world

from secure_release.cluster import Cluster, get_estimate, launch_release, set_budgets

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--timeout", "30"]


def _env() -> dict[str, str]:
    return child_env(testing=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_world(tmp_path_factory.mktemp("exitcodes"), rows=1500, seed=3)


@pytest.fixture()
def cluster(world: Path, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, env=_env())
    try:
        yield c
    finally:
        c.close()


def _codes(cluster: Cluster, names: tuple[str, ...], timeout: float = 60.0) -> dict[str, int]:
    return {name: cluster.procs[name].wait(timeout=timeout) for name in names}


def _launch(
    cluster: Cluster, world: Path, rid: str, epsilon: float, budgets: dict[str, float] | None
) -> dict[str, str]:
    data = world / "data"
    if budgets is not None:
        for name, eps in budgets.items():
            set_budgets(cluster, {cluster.root / f"keystore-{name}": data / f"{name}.csv"}, eps, world / "certs")
    extra = FAST  # a curator exits 0 by default once the researcher acknowledged its key
    return launch_release(
        cluster, data, world / "certs", rid, epsilon, 300, "chacha20", world / "align.key",
        alice_extra=extra, bob_extra=extra, budgets=budgets is None,
    )  # fmt: skip


def test_released_exits_0_at_every_curator(cluster: Cluster, world: Path) -> None:
    addrs = _launch(cluster, world, "r-ok", 0.5, None)
    resp = get_estimate(addrs["researcher"], world / "certs", "r-ok", timeout=60)
    assert resp.privacy.m == 300
    assert _codes(cluster, ("alice", "bob")) == {"alice": 0, "bob": 0}, cluster.tail("alice") + cluster.tail("bob")


@pytest.mark.parametrize(
    ("budgets", "refuser"),
    [
        ({"alice": 1.0}, "bob"),  # the follower has no budget for its data set
        ({"bob": 1.0}, "alice"),  # the leader has none
        ({"alice": 1.0, "bob": 0.2}, "bob"),  # the release is past the follower's budget
        ({"alice": 0.2, "bob": 1.0}, "alice"),  # past the leader's
    ],
)
def test_a_refusal_exits_3_at_every_party(
    cluster: Cluster, world: Path, budgets: dict[str, float], refuser: str
) -> None:
    addrs = _launch(cluster, world, "r-no", 0.5, budgets)
    codes = _codes(cluster, ("alice", "bob"))
    assert codes == {"alice": 3, "bob": 3}, cluster.tail("alice") + "\n" + cluster.tail("bob")
    reason = "NoBudgetError" if len(budgets) == 1 else "BudgetExceededError"
    for name in ("alice", "bob"):
        assert reason in cluster.tail(name, 5), cluster.tail(name, 5)
        assert "curator: refused: " in cluster.tail(name, 1)  # the last line says which row it was
    if refuser != "bob":
        return  # the leader refuses before the agreement: the release never reaches the server
    fetch = subprocess.run(
        [sys.executable, "-m", "secure_release.researcher", "fetch", "--release-id", "r-no", "--certs",
         str(world / "certs" / "researcher"), "--server", addrs["server"], "--out", str(cluster.root / "fetched"),
         "--timeout", "10"],
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert fetch.returncode == 3, fetch.stderr[-2000:]
    assert "researcher: refused: " in fetch.stderr
    assert f"refused: {refuser}" in fetch.stderr


def test_an_unreachable_leader_exits_1(world: Path, tmp_path: Path) -> None:
    data = world / "data"
    cmd = [sys.executable, "-m", "secure_release.curator", "run", "--data", str(data / "bob.csv"), "--schema",
           str(data / "bob.json"), "--name", "bob", "--keystore", str(tmp_path / "ks"), "--release-id", "r1",
           "--epsilon", "0.5", "--server", "127.0.0.1:9", "--certs", str(world / "certs" / "bob"), "--curators",
           "alice,bob", "--leader-address", "127.0.0.1:9", "--alignment-key-file", str(world / "align.key"),
           "--timeout", "4"]  # fmt: skip
    subprocess.run([sys.executable, "-m", "secure_release.curator", "budget", "set", "--keystore", str(tmp_path / "ks"),
                    "--data", str(data / "bob.csv"), "--epsilon", "1", "--certs", str(world / "certs" / "bob"),
                    "--name", "bob"], check=True, env=_env(), capture_output=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 1, proc.stderr[-2000:]


def test_an_interrupt_exits_130(world: Path, tmp_path: Path) -> None:
    data = world / "data"
    cmd = [sys.executable, "-m", "secure_release.curator", "run", "--data", str(data / "bob.csv"), "--schema",
           str(data / "bob.json"), "--name", "bob", "--keystore", str(tmp_path / "ks"), "--release-id", "r1",
           "--epsilon", "0.5", "--server", "127.0.0.1:9", "--certs", str(world / "certs" / "bob"), "--curators",
           "alice,bob", "--leader-address", "127.0.0.1:9", "--alignment-key-file", str(world / "align.key"),
           "--timeout", "60"]  # fmt: skip
    log = tmp_path / "bob.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env())
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "listening" not in log.read_text():
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "secure_release.curator", "run", "--no-such-flag"],
        ["-m", "secure_release.curator", "budget", "set", "--epsilon", "x"],
        ["-m", "secure_release.server", "--no-such-flag"],
        ["-m", "secure_release.researcher", "fetch", "--no-such-flag"],
        ["-m", "secure_release", "plan", "--n", "10"],
    ],
)
def test_usage_exits_2_at_every_command(command: list[str]) -> None:
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 2, proc.stderr[-2000:]
