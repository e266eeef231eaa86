"""A refusal before the agreement reaches every party within seconds, through the real processes.

The leader whose data set has no budget left refuses before the agreement, when the server holds
no spec of the release yet: the followers hear it from the leader, and the researcher's fetch
reads the leader's refusal record at the server (``DeclareRelease``, confirmed by the follower's
declaration of its parties) instead of waiting its whole ``--timeout``. A follower whose data
check fails (a bad row) is heard the same way: the leader and the researcher exit 3, the follower
itself 2 (its own bad input). Each names the refusing curator and the reason class, never the data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import child_env, demo_world

from secure_release.cluster import Cluster, launch_release, set_budgets

#: Every party must have exited by then (the --timeout of each is twice as long).
WITHIN_S = 30.0
FETCH_TIMEOUT = "60"


def _env() -> dict[str, str]:
    return child_env(testing=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_world(tmp_path_factory.mktemp("refusal-early"), rows=1500, seed=5)


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, env=_env())
    try:
        yield c
    finally:
        c.close()


def _fetch(cluster: Cluster, world: Path, server: str, rid: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "secure_release.researcher", "fetch", "--release-id", rid, "--certs",
         str(world / "certs" / "researcher"), "--server", server, "--out", str(cluster.root / "fetched"),
         "--timeout", FETCH_TIMEOUT],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip


def _exits(cluster: Cluster, fetch: subprocess.Popen[str], t0: float) -> tuple[dict[str, int], dict[str, float], str]:
    """Exit codes and seconds since ``t0`` of alice, bob and the fetch; the fetch's stderr."""
    codes: dict[str, int] = {}
    took: dict[str, float] = {}
    procs = {"alice": cluster.procs["alice"], "bob": cluster.procs["bob"], "fetch": fetch}
    end = t0 + WITHIN_S + 60
    while len(codes) < len(procs) and time.monotonic() < end:
        for name, proc in procs.items():
            if name not in codes and proc.poll() is not None:
                codes[name], took[name] = int(proc.returncode), time.monotonic() - t0
        time.sleep(0.05)
    if fetch.poll() is None:
        fetch.kill()
    _, err = fetch.communicate(timeout=30)
    return codes, took, err


def test_a_leader_without_budget_refuses_and_every_party_exits_3_within_seconds(
    cluster: Cluster, world: Path
) -> None:
    data = world / "data"
    set_budgets(cluster, {cluster.root / "keystore-bob": data / "bob.csv"}, 1.0, world / "certs")  # none for alice
    fast = ["--timeout", FETCH_TIMEOUT]
    addrs = launch_release(cluster, data, world / "certs", "r-nobudget", 0.5, 300, "chacha20", world / "align.key",
                           alice_extra=fast, bob_extra=fast, budgets=False)  # fmt: skip
    t0 = time.monotonic()
    codes, took, err = _exits(cluster, _fetch(cluster, world, addrs["server"], "r-nobudget"), t0)
    print("seconds until exit:", {k: round(v, 1) for k, v in took.items()})
    assert codes == {"alice": 3, "bob": 3, "fetch": 3}, (codes, err[-1500:], cluster.tail("alice"), cluster.tail("bob"))
    assert max(took.values()) < WITHIN_S, took
    last = err.strip().splitlines()[-1]
    assert last.startswith("secure-release-researcher: refused: "), last
    assert "alice refuses release 'r-nobudget'" in last and ": budget (NoBudgetError)" in last, last
    assert "not PERTURBED" not in err
    for name in ("alice", "bob"):
        assert "NoBudgetError" in cluster.tail(name, 5), cluster.tail(name, 5)


def test_a_follower_whose_data_check_fails_is_heard_by_every_party_within_seconds(
    cluster: Cluster, world: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(world / "data", data)
    with (data / "bob.csv").open("a") as fh:
        fh.write("bob-extra-1,not-a-category,not-a-category\n")
    fast = ["--timeout", FETCH_TIMEOUT]
    bob = [*fast, "--bad-rows", str(tmp_path / "bob-bad.csv")]
    addrs = launch_release(cluster, data, world / "certs", "r-badrow", 0.5, 300, "chacha20", world / "align.key",
                           alice_extra=fast, bob_extra=bob)  # fmt: skip
    t0 = time.monotonic()
    codes, took, err = _exits(cluster, _fetch(cluster, world, addrs["server"], "r-badrow"), t0)
    print("seconds until exit:", {k: round(v, 1) for k, v in took.items()})
    # every OTHER party hears a refusal and exits 3: alice from bob's marked failure report, the
    # researcher's fetch from bob's refusal record. bob himself exits 2, not 3: his own input is
    # bad and his operator must fix the file (docs/deployment.md, "Exit codes"; tests/system/test_owndata_errors.py)
    assert codes == {"alice": 3, "bob": 2, "fetch": 3}, (codes, err[-1500:], cluster.tail("alice"), cluster.tail("bob"))
    assert max(took.values()) < WITHIN_S, took
    last = err.strip().splitlines()[-1]
    assert last.startswith("secure-release-researcher: refused: "), last
    assert "bob refuses release 'r-badrow'" in last and ": data (BadRowsError" in last, last
    assert "not-a-category" not in err  # the value stays on bob's machine
    alice_last = cluster.tail("alice", 1)
    assert "refused: " in alice_last and "bob refuses release 'r-badrow'" in alice_last, alice_last
    assert ": data (BadRowsError: the curator's table has 1 bad row(s)" in alice_last, alice_last
    assert "not-a-category" not in cluster.tail("alice", 50)


def test_a_leader_whose_data_check_fails_is_heard_by_every_party_within_seconds(
    cluster: Cluster, world: Path, tmp_path: Path
) -> None:
    """The leader's own bad row: it exits 2 (its operator fixes the file), the follower hears a
    marked refusal from it and the researcher reads its record: both exit 3 naming alice and "data"."""
    data = tmp_path / "data"
    shutil.copytree(world / "data", data)
    with (data / "alice.csv").open("a") as fh:
        fh.write("alice-extra-1,not-a-category,not-a-category\n")
    fast = ["--timeout", FETCH_TIMEOUT]
    alice = [*fast, "--bad-rows", str(tmp_path / "alice-bad.csv")]
    addrs = launch_release(cluster, data, world / "certs", "r-badlead", 0.5, 300, "chacha20", world / "align.key",
                           alice_extra=alice, bob_extra=fast)  # fmt: skip
    t0 = time.monotonic()
    codes, took, err = _exits(cluster, _fetch(cluster, world, addrs["server"], "r-badlead"), t0)
    print("seconds until exit:", {k: round(v, 1) for k, v in took.items()})
    assert codes == {"alice": 2, "bob": 3, "fetch": 3}, (codes, err[-1500:], cluster.tail("alice"), cluster.tail("bob"))
    assert max(took.values()) < WITHIN_S, took
    last = err.strip().splitlines()[-1]
    assert last.startswith("secure-release-researcher: refused: "), last
    assert "alice refuses release 'r-badlead'" in last and ": data (BadRowsError" in last, last
    bob_last = cluster.tail("bob", 1)
    assert "refused: " in bob_last and "alice refuses release 'r-badlead'" in bob_last, bob_last
    assert ": data (BadRowsError" in bob_last, bob_last
    assert "not-a-category" not in err and "not-a-category" not in cluster.tail("bob", 50)


def test_a_follower_that_cannot_reach_the_refusing_leader_reads_its_refusal_at_the_server(
    cluster: Cluster, world: Path
) -> None:
    """The curators' waits read the record too: bob never reaches alice (a wrong --leader-address),
    so only the server can tell him that alice refused; he exits 3 within seconds, not at --timeout."""
    data = world / "data"
    set_budgets(cluster, {cluster.root / "keystore-bob": data / "bob.csv"}, 1.0, world / "certs")  # none for alice
    fast = ["--timeout", FETCH_TIMEOUT]
    addrs = launch_release(cluster, data, world / "certs", "r-apart", 0.5, 300, "chacha20", world / "align.key",
                           alice_extra=["--timeout", "4"], bob_extra=[*fast, "--leader-address", "127.0.0.1:9"],
                           budgets=False)  # fmt: skip
    t0 = time.monotonic()
    codes, took, err = _exits(cluster, _fetch(cluster, world, addrs["server"], "r-apart"), t0)
    print("seconds until exit:", {k: round(v, 1) for k, v in took.items()})
    assert codes == {"alice": 3, "bob": 3, "fetch": 3}, (codes, err[-1500:], cluster.tail("alice"), cluster.tail("bob"))
    assert max(took.values()) < WITHIN_S, took  # alice lingers (here 4 s, her --timeout) for bob, who never asks
    assert took["bob"] < 15, took
    last = cluster.tail("bob", 1)
    assert "refused: " in last and "alice refuses release 'r-apart'" in last and "budget" in last, last


def test_a_leader_that_a_failing_follower_cannot_reach_reads_its_refusal_at_the_server(
    cluster: Cluster, world: Path, tmp_path: Path
) -> None:
    """bob's data check fails and he cannot reach alice: alice's wait for the tags reads his
    refusal at the server and stops within seconds (exit 3, naming bob and "data")."""
    data = tmp_path / "data"
    shutil.copytree(world / "data", data)
    with (data / "bob.csv").open("a") as fh:
        fh.write("bob-extra-1,not-a-category,not-a-category\n")
    fast = ["--timeout", FETCH_TIMEOUT]
    bob = [*fast, "--leader-address", "127.0.0.1:9", "--bad-rows", str(tmp_path / "bob-bad.csv")]
    addrs = launch_release(cluster, data, world / "certs", "r-apart2", 0.5, 300, "chacha20", world / "align.key",
                           alice_extra=fast, bob_extra=bob)  # fmt: skip
    t0 = time.monotonic()
    codes, took, err = _exits(cluster, _fetch(cluster, world, addrs["server"], "r-apart2"), t0)
    print("seconds until exit:", {k: round(v, 1) for k, v in took.items()})
    assert codes == {"alice": 3, "bob": 2, "fetch": 3}, (codes, err[-1500:], cluster.tail("alice"), cluster.tail("bob"))
    assert max(took.values()) < WITHIN_S, took
    assert took["alice"] < 10, took  # no linger: bob, who refused, needs no telling
    last = cluster.tail("alice", 1)
    assert "refused: " in last and "bob refuses release 'r-apart2'" in last and "data" in last, last
    assert "not-a-category" not in cluster.tail("alice", 50)
