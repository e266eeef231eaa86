"""Errors that name what the user typed (issue 26, item 8): a missing file exits 2 with one line
naming the flag and the path; an unreachable peer is reported with its address within seconds;
a follower that fails before the agreement makes the leader abort for every party at once."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import child_env, demo_world

from secure_release.cluster import Cluster, launch_release

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return child_env(testing=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_world(tmp_path_factory.mktemp("errors"), rows=1200, seed=5)


def _curator(world: Path, tmp: Path, **override: str) -> list[str]:
    data = world / "data"
    flags = {"--data": str(data / "bob.csv"), "--schema": str(data / "bob.json"), "--name": "bob",
             "--keystore": str(tmp / "ks"), "--release-id": "r1", "--epsilon": "0.5", "--server": "127.0.0.1:9",
             "--certs": str(world / "certs" / "bob"), "--curators": "alice,bob", "--leader-address": "127.0.0.1:9",
             "--alignment-key-file": str(world / "align.key"), "--timeout": "30"}  # fmt: skip
    flags.update(override)
    return [sys.executable, "-m", "secure_release.curator", "run", *(x for kv in flags.items() for x in kv)]


@pytest.mark.parametrize("flag", ["--data", "--schema", "--alignment-key-file", "--certs"])
def test_a_missing_file_exits_2_naming_the_flag_and_the_path(world: Path, tmp_path: Path, flag: str) -> None:
    missing = str(tmp_path / "no-such-file")
    proc = subprocess.run(_curator(world, tmp_path, **{flag: missing}), capture_output=True, text=True,
                          timeout=60, env=_env())  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{flag} {missing}: does not exist" in proc.stderr
    assert "Errno" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "secure_release.server", "--listen", "127.0.0.1:0", "--store", "s", "--certs", "{missing}"],
        ["-m", "secure_release.researcher", "fetch", "--release-id", "r1", "--server", "127.0.0.1:9",
         "--certs", "{missing}"],
        ["-m", "secure_release", "plan", "--n", "100", "--epsilon", "1", "--schema", "{missing}", "--schema", "x"],
    ],
)
def test_every_command_names_a_missing_file(tmp_path: Path, command: list[str]) -> None:
    missing = str(tmp_path / "nope")
    cmd = [sys.executable, *(c.replace("{missing}", missing) for c in command)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=_env(), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{missing}: does not exist" in proc.stderr and "Errno" not in proc.stderr


def test_an_unreachable_leader_and_server_are_named_within_seconds(world: Path, tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "secure_release.curator", "budget", "set", "--keystore",
                    str(tmp_path / "ks"), "--data", str(world / "data" / "bob.csv"), "--epsilon", "1",
                    "--certs", str(world / "certs" / "bob"), "--name", "bob"],
                   check=True, env=_env(), capture_output=True)  # fmt: skip
    log = tmp_path / "bob.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(_curator(world, tmp_path), stdout=fh, stderr=subprocess.STDOUT, env=_env())
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and "cannot reach the leader alice at 127.0.0.1:9" not in log.read_text():
            time.sleep(0.2)
        assert "cannot reach the leader alice at 127.0.0.1:9" in log.read_text(), log.read_text()[-2000:]
        while time.monotonic() < deadline and "cannot reach the release server at 127.0.0.1:9" not in log.read_text():
            time.sleep(0.2)
        assert "cannot reach the release server at 127.0.0.1:9 (--server)" in log.read_text(), log.read_text()[-2000:]
        assert proc.poll() is None  # said at once, long before its --timeout of 30 s
    finally:
        proc.kill()
        proc.wait()


def test_a_follower_with_bad_rows_makes_the_leader_abort_for_everybody_at_once(world: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(world / "data", data)
    with (data / "bob.csv").open("a") as fh:
        fh.write("bob-extra-1,not-a-category,not-a-category\n")
    cluster = Cluster(tmp_path, env=_env())
    try:
        launch_release(cluster, data, world / "certs", "r-bad", 0.5, 200, "chacha20", world / "align.key",
                       alice_extra=["--timeout", "60"],
                       bob_extra=["--timeout", "60", "--bad-rows", str(tmp_path / "bob-bad.csv")])  # fmt: skip
        started = time.monotonic()
        codes = {name: cluster.procs[name].wait(timeout=50) for name in ("alice", "bob")}
        took = time.monotonic() - started
    finally:
        cluster.close()
    # bob's own bad input exits 2 at bob (his operator fixes the file); alice hears a data-class
    # refusal naming bob and exits 3, as every other party of a refused release (docs/deployment.md, "Exit codes")
    assert codes == {"alice": 3, "bob": 2}, cluster.tail("alice") + cluster.tail("bob")
    assert took < 20, took  # not the leader's --timeout of 60 s
    tail = cluster.tail("alice", 5)
    # heard from bob's declaration ("before the agreement") or from the server's record of it,
    # whichever reaches alice first: both name bob, the class and the count only
    heard = (r"refused: bob refuses release 'r-bad'( before the agreement)?: "
             r"data \(BadRowsError: the curator's table has 1 bad row\(s\)")
    assert re.search(heard, tail), tail
    assert "timed out" not in tail, tail
    assert "not-a-category" not in tail  # the value stays on bob's machine: only the count crossed
    assert "not-a-category" in cluster.tail("bob", 8)  # bob's owner sees it on bob's own terminal
    bad = tmp_path / "bob-bad.csv"  # and every bad cell in a file only bob's owner can read
    assert stat.S_IMODE(bad.stat().st_mode) == 0o600
    rows = bad.read_text().splitlines()
    assert len(rows) == 3 and all("not-a-category" in row for row in rows[1:]), rows
