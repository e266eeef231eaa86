# tier: system
"""Issue 24 through the real curator command line (child processes) against a release server on
127.0.0.1 port 0 with mutual TLS: ``budget show --data`` works (it crashed with AttributeError);
after ``ledger.jsonl`` is deleted, ``budget set`` carries over what the server's witness knows
instead of resetting spent from 0.8 to 0 (items 3 and 6); a refreshed table under the same data-set
name keeps spending from the same budget (item 9); ``--max-epsilon`` caps a run (item 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from secure_release.curator.records.ledgerfile import LedgerFile, file_fingerprint
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.curator.records.witness import BudgetWitness
from secure_release.infra import tls
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server.service import ReleaseService
from secure_release.server.store import Store

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(certs: Path, tmp_path: Path) -> Iterator[str]:
    store = Store(tmp_path / "store")
    srv = tls.make_grpc_server(max_workers=4)
    pb_grpc.add_ReleaseServerServicer_to_server(ReleaseService(store), srv)
    port = tls.bind(srv, "127.0.0.1", 0, certs / "server", "server")
    srv.start()
    yield f"127.0.0.1:{port}"
    srv.stop(0).wait()
    store.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "secure_release.curator", *args], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip


def test_budget_show_data_recovery_and_refreshed_tables(tmp_path: Path, certs: Path, server: str) -> None:
    data = tmp_path / "alice.csv"
    data.write_text("id,x\n1,a\n")
    ks = str(tmp_path / "ks")
    who = ["--certs", str(certs / "alice"), "--name", "alice"]
    made = _cli("budget", "set", "--keystore", ks, "--data", str(data), "--epsilon", "1.0", *who, "--server", server)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["signed"] is True
    # two releases of 0.4 reserved and committed as the runner does (the witness moves up with each)
    signer = HeadSigner.from_certs(certs / "alice", "alice")
    ledger = LedgerFile(ks, signer)
    with tls.secure_channel(server, certs / "alice", "alice", role="curator", peer_role="server") as channel:
        witness = BudgetWitness(pb_grpc.ReleaseServerStub(channel), "alice", signer)
        for rid in ("r1", "r2"):
            ledger.update(lambda led, rid=rid: led.reserve("alice.csv", "alice.csv", rid, 0.4, f"s-{rid}", 1.0,
                                                            table=file_fingerprint(data)))  # fmt: skip
            witness.check(ledger.read(), "alice.csv", record=True)
            ledger.update(lambda led, rid=rid: led.commit(rid, 2.0))
    shown = _cli("budget", "show", "--keystore", ks, "--data", str(data), *who)
    assert shown.returncode == 0, shown.stderr  # before: AttributeError: 'Namespace' ... 'dataset'
    summary = json.loads(shown.stdout)["datasets"][0]
    assert summary["dataset"] == "alice.csv" and summary["spent"] == pytest.approx(0.8)
    # a refreshed table under the same name is the same data set: same budget, same spending
    data.write_text("id,x\n1,a\n2,b\n")
    refreshed = json.loads(_cli("budget", "show", "--keystore", ks, "--data", str(data), *who).stdout)
    assert refreshed["datasets"][0]["spent"] == pytest.approx(0.8) and refreshed["datasets"][0]["budget"] == 1.0
    # the documented recovery: the ledger is deleted, the budget set again; spending is carried over
    (Path(ks) / "ledger.jsonl").unlink()
    blind = _cli("budget", "set", "--keystore", ks, "--data", str(data), "--epsilon", "1.0", *who)
    assert blind.returncode == 2 and "--server" in blind.stderr  # it would forget: refused, saying how to proceed
    again = _cli("budget", "set", "--keystore", ks, "--data", str(data), "--epsilon", "1.0", *who, "--server", server)
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["carried_over"] == {"reservations": 2, "epsilon": pytest.approx(0.8)}
    assert out["spent"] == pytest.approx(0.8) and out["remaining"] == pytest.approx(0.2)  # before: 0 and 1.0
    led = LedgerFile(ks, signer).read()
    with pytest.raises(Exception, match="exceeds the budget"):
        led.check_reserve("alice.csv", "r3", 0.4, None)
    shown = json.loads(_cli("budget", "show", "--keystore", ks, "--dataset", "alice.csv", *who,
                            "--server", server).stdout)  # fmt: skip
    assert shown["witness"] == {"reservations": 2, "epsilon_total": pytest.approx(0.8)}


def test_a_run_past_the_curators_epsilon_cap_is_refused_before_anything(tmp_path: Path) -> None:
    (tmp_path / "align.key").write_text("ab" * 32)
    (tmp_path / "x.csv").write_text("id,a\n1,u\n")  # the files exist: the cap is what refuses the run
    (tmp_path / "x.json").write_text('{"attributes": [{"name": "a", "categories": ["u", "v"]}]}')
    done = _cli("run", "--data", str(tmp_path / "x.csv"), "--schema", str(tmp_path / "x.json"), "--release-id", "r1",
                "--epsilon", "25",
                "--server", "127.0.0.1:1", "--insecure", "--name", "alice", "--curators", "alice,bob", "--leader",
                "--alignment-key-file", str(tmp_path / "align.key"))  # fmt: skip
    assert done.returncode == 2 and "--max-epsilon" in done.stderr and "cap of 20" in done.stderr


def test_a_mistyped_path_leaves_no_keystore_behind(tmp_path: Path) -> None:
    """``budget set`` with a missing --data file, and ``budget show`` of a keystore that does not
    exist, exit 2 naming the path and create nothing (a typo never looks like an empty ledger)."""
    ks = tmp_path / "ks"
    done = _cli("budget", "set", "--keystore", str(ks), "--data", str(tmp_path / "nope.csv"), "--epsilon", "1")
    assert done.returncode == 2 and "nope.csv: does not exist" in done.stderr and not ks.exists()
    shown = _cli("budget", "show", "--keystore", str(ks), "--dataset", "adult")
    assert shown.returncode == 2 and "no such keystore" in shown.stderr and not ks.exists()
