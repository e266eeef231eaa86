"""Bad input to the command-line tools, one case a row: each exits with the documented code (2:
usage) and one line that names the error, without a traceback, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=full_env
    )


SERVER_CASES = [
    ("listen garbage", ["--listen", "garbage", "--store", "s", "--insecure"], "an address is HOST:PORT"),
    ("port 99999", ["--listen", "127.0.0.1:99999", "--store", "s", "--insecure"], "0..65535"),
    ("grace NaN", ["--grace", "nan", "--store", "s", "--insecure"], "finite"),
    ("grace infinite", ["--grace", "inf", "--store", "s", "--insecure"], "finite"),
    ("negative grace", ["--grace", "-1", "--store", "s", "--insecure"], "--grace"),
    ("no store", ["--insecure"], "--store"),
    ("no certs", ["--store", "s"], "--certs"),
    ("store is a file", ["--store", "afile", "--insecure"], "cannot use"),
    ("non-JSON config", ["--config", "bad.json"], "--config"),
    ("config with an unknown key", ["--config", "unknown.json"], "unknown setting"),
    ("config that is a list", ["--config", "list.json"], "JSON object"),
    ("test key outside tests", ["--store", "s", "--insecure", "--insecure-test-pram-key", "00" * 32], "tests only"),
    ("zero calls per peer", ["--store", "s", "--insecure", "--calls-per-peer", "0"], ">= 1"),
    ("NaN idle seconds", ["--store", "s", "--insecure", "--stream-idle-seconds", "nan"], "finite"),
    ("zero retention", ["--store", "s", "--insecure", "--retention-days", "0"], "> 0"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "argv", "words"), SERVER_CASES, ids=[c[0] for c in SERVER_CASES])
def test_server_cli_bad_input(tmp_path: Path, name: str, argv: list[str], words: str) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "unknown.json").write_text('{"listen": "127.0.0.1:0", "stroe": "s"}')
    (tmp_path / "list.json").write_text("[1, 2]")
    before = sorted(p.name for p in tmp_path.iterdir())
    env = {"SECURE_RELEASE_TESTING": ""}
    proc = run(["secure_release.server", *argv], tmp_path, env)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing half-created


def test_a_port_in_use_is_refused(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run(["secure_release.server", "--listen", f"127.0.0.1:{port}", "--store", "s", "--insecure"], tmp_path)
    assert proc.returncode == 2 and "BindError" in proc.stderr and "in use" in proc.stderr, proc.stderr
