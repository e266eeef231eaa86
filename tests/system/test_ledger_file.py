"""The ledger on disk: concurrent processes serialize on a file lock and lose nothing, a
tampered, truncated or deleted ledger is detected, the budget is set only by ``budget set``
(never by a run flag), files are 0600 in a 0700 directory, and a data set is its content."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from secure_release.curator.records.ledgerfile import LedgerFile, file_fingerprint
from secure_release.mechanism.privacy.ledger import LedgerTamperedError, NoBudgetError

ROOT = Path(__file__).resolve().parents[2]
D = "d" * 64
PER_PROCESS = 200


def _charge_many(directory: str, prefix: str, count: int) -> None:
    import time

    ledger = LedgerFile(directory)
    for i in range(count):
        ledger.update(lambda led, i=i: led.reserve(D, "adult", f"{prefix}{i}", 0.001, f"{prefix}s{i}", time.time()))


def test_two_processes_charging_concurrently_lose_nothing(tmp_path: Path) -> None:
    LedgerFile(tmp_path).set_budget(D, "adult", 1000.0)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_charge_many, args=(str(tmp_path), p, PER_PROCESS)) for p in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ledger = LedgerFile(tmp_path).read()  # verifies the whole chain and the head
    assert len(ledger.releases()) == 2 * PER_PROCESS and len(ledger.entries) == 2 * PER_PROCESS + 1
    assert ledger.spent(D) == pytest.approx(2 * PER_PROCESS * 0.001)


def _filled(tmp_path: Path) -> LedgerFile:
    ledger = LedgerFile(tmp_path / "ks")
    ledger.set_budget(D, "adult", 1.0)
    for i in range(3):
        ledger.update(lambda led, i=i: led.reserve(D, "adult", f"r{i}", 0.1, f"s{i}", 1.0))
    return ledger


def test_edit_and_truncation_are_detected(tmp_path: Path) -> None:
    ledger = _filled(tmp_path)
    text = ledger.path.read_text()
    ledger.path.write_text(text.replace('"epsilon": 0.1', '"epsilon": 0.01', 1))
    with pytest.raises(LedgerTamperedError):
        ledger.read()
    ledger.path.write_text("".join(text.splitlines(keepends=True)[:-1]))  # last entry removed
    with pytest.raises(LedgerTamperedError, match="truncated"):
        ledger.read()
    with pytest.raises(LedgerTamperedError):  # a tampered ledger takes no new entries either
        ledger.update(lambda led: led.reserve(D, "adult", "r9", 0.1, "s9", 1.0))


def test_a_torn_last_line_past_the_head_is_a_crash_not_tampering(tmp_path: Path) -> None:
    ledger = _filled(tmp_path)
    with ledger.path.open("a") as fh:
        fh.write('{"seq": 4, "kind": "rese')  # killed mid-append, before the head moved
    assert len(ledger.read().entries) == 4
    ledger.update(lambda led: led.reserve(D, "adult", "r9", 0.1, "s9", 1.0))
    assert len(ledger.read().entries) == 5 and ledger.path.read_text().endswith("}\n")


def test_a_deleted_ledger_refuses_releases_until_a_budget_is_set_again(tmp_path: Path) -> None:
    ledger = _filled(tmp_path)
    ledger.path.unlink()
    with pytest.raises(NoBudgetError, match=r"deleted.*budget set"):
        ledger.read()
    ledger.set_budget(D, "adult", 0.5)
    assert ledger.read().remaining(D) == pytest.approx(0.5)


def test_files_are_private(tmp_path: Path) -> None:
    ledger = _filled(tmp_path)
    assert stat.S_IMODE(os.stat(ledger.directory).st_mode) == 0o700
    for name in ("ledger.jsonl", "ledger.head", "ledger.lock"):
        assert stat.S_IMODE(os.stat(ledger.directory / name).st_mode) == 0o600


def test_a_data_set_is_its_content(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("id,x\n1,a\n")
    (tmp_path / "b.csv").write_text("id,x\n1,a\n")
    assert file_fingerprint(tmp_path / "a.csv") == file_fingerprint(tmp_path / "b.csv")  # renaming changes nothing
    (tmp_path / "b.csv").write_text("id,x\n1,b\n")
    assert file_fingerprint(tmp_path / "a.csv") != file_fingerprint(tmp_path / "b.csv")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "secure_release.curator", *args], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip


def test_budget_set_and_show_and_no_run_flag_raises_it(tmp_path: Path) -> None:
    data = tmp_path / "alice.csv"
    data.write_text("id,x\n1,a\n")
    ks = str(tmp_path / "ks")
    assert _cli("budget", "set", "--keystore", ks, "--data", str(data), "--epsilon", "0.5").returncode == 0
    bad = _cli("budget", "set", "--keystore", ks, "--data", str(data), "--epsilon", "nan")
    assert bad.returncode == 2 and "finite" in bad.stderr
    shown = json.loads(_cli("budget", "show", "--keystore", ks).stdout)
    assert shown["datasets"][0]["budget"] == 0.5 and shown["datasets"][0]["name"] == "alice.csv"
    assert shown["datasets"][0]["fingerprint"] == file_fingerprint(data)
    flag = _cli("run", "--budget", "5", "--data", str(data))
    assert flag.returncode == 2 and "unrecognized arguments: --budget" in flag.stderr
    assert LedgerFile(ks).read().budget("alice.csv") == 0.5  # a data set is its name, not its bytes
