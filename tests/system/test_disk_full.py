"""A disk too small for the engine's files, through the real processes (issue 49).

Bob's engine directory (``<keystore>/dask-spill``: the shard store, Dask's own files, the
handoff) is a tmpfs of a few MiB, mounted in a mount namespace of its own (``unshare --mount``,
as root or, for another user, with ``--map-root-user``) so nothing outside the test sees it. Both
curators run ``--engine dask`` on embedded clusters.

* **Too small from the start** (4 MiB against an estimate of about 12 MB): bob exits 1 with
  ``DiskFullError`` giving the free bytes, the estimate and how it was made, before it reads a
  row; no store is created and nothing is reserved.
* **Filled during the run** (64 MiB, then the test takes all but 64 KiB of it as soon as bob's
  store appears, as another job on a shared disk would): bob exits 1 with ``DiskFullError``
  naming its store and the bytes the failed write needed. The store is removed, alice stops too,
  both ledgers read back (verified) without the release, and both keystores hold no record of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]


def _namespace_prefix() -> list[str]:
    """``unshare`` into a private mount namespace (a user namespace too when not root)."""
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is needed to mount a small tmpfs for this test"
    prefix = [unshare, "--mount", "--propagation", "private"]
    return prefix if os.geteuid() == 0 else [*prefix, "--map-root-user"]


def _run(mode: str, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [*_namespace_prefix(), sys.executable, str(HERE), mode, str(tmp_path), str(out)],
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and out.exists(), (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    result: dict[str, object] = json.loads(out.read_text())
    return result


def test_a_disk_too_small_for_the_estimate_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    result = _run("small", tmp_path)
    codes, last = result["codes"], result["last"]
    assert isinstance(codes, dict) and isinstance(last, dict)
    assert codes["bob"] == 1, result
    line = str(last["bob"])
    assert "DiskFullError" in line and "dask-spill" in line and "bytes free" in line, line
    assert "needs about" in line and "x the input" in line and "no budget reserved" in line, line
    assert result["stores"] == [], result  # nothing read, nothing stored
    assert codes["alice"] != 0, result
    assert result["reserved"] == {"alice": False, "bob": False}, result
    assert result["records"] == {"alice": False, "bob": False}, result


def test_a_disk_filled_during_the_run_fails_by_name_and_leaves_nothing(tmp_path: Path) -> None:
    result = _run("fill", tmp_path)
    codes, last = result["codes"], result["last"]
    assert isinstance(codes, dict) and isinstance(last, dict)
    assert result["filled"] is True, result  # the store appeared and the disk was filled under it
    assert codes["bob"] == 1, result
    line = str(last["bob"])
    assert "DiskFullError" in line and "is full" in line and "shards-r-disk-" in line, line
    assert "that write needed" in line and "bytes are free" in line, line
    assert result["stores"] == [], result  # the store is removed
    assert codes["alice"] in (1, 3), result
    assert result["reserved"] == {"alice": False, "bob": False}, result
    assert result["records"] == {"alice": False, "bob": False}, result


# ------------------------------------------------------------------ run inside the namespace
def _fill(mount: Path, leave: int, stop: threading.Event, filled: list[bool]) -> None:
    """As soon as a store directory appears under ``mount``, take all but ``leave`` bytes."""
    while not stop.is_set():
        if any(p.name.startswith("shards-") for p in mount.iterdir()):
            with open(mount / "filler.bin", "wb") as fh:  # the engine writes too: a MiB at a time, to the end
                while shutil.disk_usage(mount).free > leave:
                    try:
                        fh.write(b"\0" * min(1 << 20, shutil.disk_usage(mount).free - leave))
                        fh.flush()
                    except OSError:
                        break
            filled.append(True)
            return
        time.sleep(0.005)


def main(mode: str, root: Path, out: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from support import cluster_world

    from secure_release.curator.records.keystore import Keystore

    made = cluster_world(root, 1_000_000, 8, 1 << 17)
    world, cluster, dirs = made.world, made.cluster, made.dirs
    mount = world / "keystore-bob" / "dask-spill"
    mount.mkdir(mode=0o700, exist_ok=True)
    size = "4m" if mode == "small" else "64m"
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount)], check=True)
    stop, filled = threading.Event(), []
    filler = threading.Thread(target=_fill, args=(mount, 64 << 10, stop, filled), daemon=True)
    if mode == "fill":
        filler.start()
    extra = made.flags("--timeout", "120", "--workers", "2", "--shard-store", "disk")
    try:
        codes = made.release_until_exit("r-disk", 50_000, extra)
    finally:
        stop.set()
        cluster.close()
    logs = {c: (world / f"{c}.log").read_text(errors="replace").strip().splitlines() for c in ("alice", "bob")}
    result = {
        "codes": codes,
        "last": {c: lines[-1] if lines else "" for c, lines in logs.items()},
        "filled": bool(filled),
        "stores": sorted(p.name for p in mount.iterdir() if p.name.startswith("shards-")),
        "reserved": {c: "r-disk" in Keystore(world / f"keystore-{c}").ledger.read().releases() for c in dirs},
        "records": {c: any("dask-spill" not in p.parts for p in (world / f"keystore-{c}").rglob("*r-disk*"))
                    for c in dirs},
    }
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
