"""An audit after a whole demo release (four processes over mutual TLS): no file the deployment
wrote is readable by group or others (certificates, which are public, aside), and the server's
store holds no pre-PRAM ciphertext once the release is perturbed."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_leaves_no_readable_secret_and_no_pre_pram_ciphertext(tmp_path: Path) -> None:
    keep = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "secure_release", "demo", "--json", "--rows", "3000", "--keep", str(keep)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["release_id"]
    loose = []
    for path in keep.rglob("*"):
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.suffix == ".pem":
            continue  # certificates are public
        if mode & 0o077:
            loose.append(f"{path.relative_to(keep)} {oct(mode)}")
    assert loose == []
    stores = list(keep.rglob("releases.sqlite3"))
    assert len(stores) == 1
    with sqlite3.connect(stores[0]) as db:
        states = [s for (s,) in db.execute("SELECT state FROM releases")]
        leftover = db.execute("SELECT COUNT(*) FROM chunks WHERE length(data) > 0").fetchone()[0]
        perturbed = db.execute("SELECT COUNT(*) FROM perturbed").fetchone()[0]
    assert states == [4] and perturbed > 0  # PERTURBED, with its rows
    assert leftover == 0  # the pre-PRAM ciphertext was erased in PRAM's transaction
