"""Curator shell: table reading, bad rows, keystore files, the CLI's refusals before anything
leaves the curator."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from support import make_spec

from secure_release.curator.records.keystore import Keystore, ReleaseRecord
from secure_release.curator.table import BadRowsError, load_schema, read_table
from secure_release.infra.fileio import atomic_write
from secure_release.mechanism.errors import BudgetExceededError
from secure_release.mechanism.primitives.pads import new_release_pad

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"curator": "alice", "id_column": "id",
          "attributes": [{"name": "edu", "categories": ["a", "b", "c"]},
                         {"name": "mar", "categories": ["m", "s"]}]}


def _files(tmp: Path, rows: str) -> tuple[Path, Path]:
    (tmp / "s.json").write_text(json.dumps(SCHEMA))
    (tmp / "d.csv").write_text("id,edu,mar\n" + rows)
    return tmp / "d.csv", tmp / "s.json"


def test_reads_csv_into_symbols(tmp_path: Path) -> None:
    data, schema = _files(tmp_path, "x1,a,m\nx2,c,s\nx3,b,m\n")
    table = read_table(data, load_schema(schema))
    assert list(table.ids) == ["x1", "x2", "x3"]
    assert table.symbols().tolist() == [0, 5, 2]


def test_bad_rows_reported_with_line_numbers(tmp_path: Path) -> None:
    data, schema = _files(tmp_path, "x1,a,m\nx2,z,s\nx3,b,m\nx1,a,s\nx5,b\n")
    with pytest.raises(BadRowsError) as info:
        read_table(data, load_schema(schema))
    lines = [line for line, _ in info.value.problems]
    assert lines == [3, 5, 6]
    assert "edu: 1 row(s) not a category, line(s) 3; values: 'z' (1)" in str(info.value)
    assert "(id): 1 row(s) duplicate id, line(s) 5" in str(info.value)
    assert "(record): 1 row(s) wrong number of fields, expected 3, got 2, line(s) 6" in str(info.value)


def test_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    pq.write_table(pa.table({"id": ["1", "2"], "edu": ["b", "c"], "mar": ["s", "q"]}), tmp_path / "d.parquet")
    with pytest.raises(BadRowsError) as info:
        read_table(tmp_path / "d.parquet", load_schema(tmp_path / "s.json"))
    assert info.value.problems[0][0] == 3


def test_keystore_files_are_0600_and_roundtrip(tmp_path: Path) -> None:
    ks = Keystore(tmp_path / "ks")
    spec = make_spec(m=50, n=200)
    for mode in ("chacha20", "otp"):
        pad = new_release_pad(mode, 6, spec.m)
        sample = np.arange(spec.m, dtype=np.uint32) % 6
        record = ReleaseRecord(replace(spec, release_id=f"r-{mode}"), pad, sample, "f" * 64, "d", "s")
        ks.save_record(record)
        back = ks.load_record(f"r-{mode}")
        assert back is not None and np.array_equal(back.pad.pad(), pad.pad())
        assert np.array_equal(back.ciphertext(), record.ciphertext())
        assert stat.S_IMODE(os.stat(tmp_path / "ks" / f"release-r-{mode}.json").st_mode) == 0o600
    ks.ledger.set_budget("f" * 64, "d", 1.0)
    for name in ("ledger.jsonl", "ledger.head"):
        assert stat.S_IMODE(os.stat(tmp_path / "ks" / name).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "ks").st_mode) == 0o700
    with pytest.raises(BudgetExceededError):
        ks.ledger.read().check_reserve("f" * 64, "r2", 1.5, "fp2")


def test_atomic_write_leaves_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    atomic_write(target, b"old")

    def boom(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_release_past_budget_refused_before_upload(tmp_path: Path) -> None:
    data, schema = _files(tmp_path, "x1,a,m\nx2,c,s\n")
    (tmp_path / "k").write_text("00" * 32)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = [sys.executable, "-m", "secure_release.curator"]
    run = [*cli, "run", "--data", str(data), "--schema", str(schema), "--release-id", "r1", "--epsilon", "0.5",
           "--server", "127.0.0.1:1", "--name", "alice", "--curators", "alice,bob", "--leader", "--insecure",
           "--alignment-key-file", str(tmp_path / "k"), "--keystore", str(tmp_path / "ks"),
           "--timeout", "1"]  # fmt: skip
    unset = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env)
    assert unset.returncode == 3, unset.stderr  # refused: no budget for this data set
    assert "NoBudgetError" in unset.stderr and "budget set" in unset.stderr
    budget = [*cli, "budget", "set", "--keystore", str(tmp_path / "ks"), "--data", str(data), "--epsilon", "0.3"]
    assert subprocess.run(budget, capture_output=True, timeout=60, env=env).returncode == 0
    proc = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 3, proc.stderr  # refused: the budget does not cover it
    assert "BudgetExceededError" in proc.stderr
    assert not list((tmp_path / "ks").glob("release-*")) and not list((tmp_path / "ks").glob("agreement-*"))
    assert '"registered"' not in proc.stderr and '"ledger_reserved"' not in proc.stderr


def test_test_only_flags_need_testing_env(tmp_path: Path) -> None:
    data, schema = _files(tmp_path, "x1,a,m\n")
    env = {k: v for k, v in os.environ.items() if k != "SECURE_RELEASE_TESTING"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "secure_release.curator", "run", "--data", str(data), "--schema", str(schema),
         "--release-id", "r1", "--epsilon", "0.5", "--server", "127.0.0.1:1", "--name", "alice",
         "--curators", "alice,bob", "--insecure", "--insecure-test-seed", "00" * 32],
        capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "SECURE_RELEASE_TESTING=1" in proc.stderr


def test_env_config(tmp_path: Path) -> None:
    from secure_release.curator.cli import build_parser
    from secure_release.infra.config import apply_env_and_config

    (tmp_path / "c.json").write_text(json.dumps({"epsilon": 0.25, "release-id": "fromfile"}))
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr,index]
    os.environ["SECURE_RELEASE_EPSILON"] = "0.75"
    try:
        apply_env_and_config(run, ["--config", str(tmp_path / "c.json")])
        args = parser.parse_args(["run", "--config", str(tmp_path / "c.json")])
    finally:
        del os.environ["SECURE_RELEASE_EPSILON"]
    assert args.epsilon == 0.75 and args.release_id == "fromfile"


def test_run_help_lists_the_flags() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "secure_release.curator", "run", "--help"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--leader-address", "--alphabet-sizes", "--grant", "--exit-after-keys", "--config"):
        assert flag in proc.stdout


def test_unknown_cipher_is_refused_by_name(tmp_path: Path) -> None:
    data, schema = _files(tmp_path, "x1,a,m\n")
    (tmp_path / "c.json").write_text(json.dumps({"cipher": "rot13"}))  # bypasses argparse choices
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "secure_release.curator", "run", "--config", str(tmp_path / "c.json"),
         "--data", str(data), "--schema", str(schema), "--release-id", "r1", "--epsilon", "0.5",
         "--server", "127.0.0.1:1", "--name", "alice", "--curators", "alice,bob", "--leader", "--insecure"],
        capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert "UnknownCipherError" in proc.stderr and "allowed: otp, chacha20" in proc.stderr
