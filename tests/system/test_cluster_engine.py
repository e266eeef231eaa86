"""``--engine dask`` through the four services: the same bytes as ``--engine local``.

Two releases with the same release id, seed, pad keys and PRAM key, in two separate worlds: one
reads each curator's CSV in-process, the other reads the same rows as Parquet files on Dask
(an embedded cluster, or the real ``dask scheduler`` / ``dask worker`` command-line programs).
The server's stored ciphertext (each curator's upload digest and every perturbed chunk) and the
researcher's report must be byte-identical."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from secure_release.cluster import PARTIES, Cluster, get_estimate, launch_release, set_budgets, wait_exit
from secure_release.demo_data import write_demo_data
from secure_release.infra.pki import init_pki
from secure_release.mechanism.keys import AlignmentKey, PadKey, PramKey, Seed

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SEED, PRAM = Seed(bytes(range(32))), PramKey(bytes(range(1, 33)))
PADS = {"alice": PadKey(bytes(range(2, 34))), "bob": PadKey(bytes(range(3, 35)))}
DASK = str(Path(sys.executable).with_name("dask"))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["SECURE_RELEASE_TESTING"] = "1"
    return env


def split_parquet(csv: Path, out: Path, files: int) -> Path:
    """``csv`` as ``files`` Parquet files of a few row groups each, in directory ``out``."""
    table = pacsv.read_csv(csv, convert_options=pacsv.ConvertOptions(column_types={"id": pa.string()}))
    out.mkdir(parents=True)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    for i in range(files):
        part = table.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i]))
        pq.write_table(part, out / f"part-{i:03d}.parquet", row_group_size=max(1, part.num_rows // 2))
    return out


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster-src")
    write_demo_data(root / "data", rows=100_000, seed=5)
    init_pki(root / "certs", list(PARTIES))
    (root / "align.key").write_text(AlignmentKey(bytes(range(4, 36))).reveal().hex())
    return root


def release(source: Path, world: Path, extra: dict[str, list[str]], data_dirs: dict[str, Path] | None = None) -> dict:
    """One release ``r1`` in ``world``: the researcher's report and what the server stored."""
    world.mkdir()
    cluster = Cluster(world, env=_env())
    data = source / "data"
    tables = {world / f"keystore-{c}": (data_dirs or {}).get(c, data / f"{c}.csv") for c in ("alice", "bob")}
    set_budgets(cluster, tables, 1.0, source / "certs")
    curator_extra = {
        c: [*extra.get(c, []), "--insecure-test-pad-key", PADS[c].reveal().hex(),
            *(["--data", str(data_dirs[c])] if data_dirs else [])]
        for c in ("alice", "bob")
    }  # fmt: skip
    curator_extra["alice"] += ["--insecure-test-seed", SEED.reveal().hex()]
    try:
        addrs = launch_release(cluster, data, source / "certs", "r1", 0.5, 20_000, "chacha20", source / "align.key",
                               curator_extra=curator_extra, server_extra=["--insecure-test-pram-key",
                                                                          PRAM.reveal().hex()],
                               budgets=False)  # fmt: skip
        resp = get_estimate(addrs["researcher"], source / "certs", "r1", timeout=240)
        wait_exit(cluster, ["alice", "bob"], 60)
    except Exception:
        for name in cluster.procs:
            sys.stderr.write(f"--- {name} ---\n{cluster.tail(name, 30)}\n")
        raise
    finally:
        cluster.close()
    with sqlite3.connect(world / "store" / "releases.sqlite3") as db:
        digests = db.execute("SELECT curator, hex(digest) FROM parts WHERE release_id='r1' ORDER BY curator").fetchall()
        perturbed = db.execute("SELECT seq, col, data FROM perturbed WHERE release_id='r1' ORDER BY seq, col").fetchall()
    report = json.loads((world / "results" / "r1.json").read_text())
    for key in ("created_at", "received_at", "timings", "seconds"):
        report.pop(key, None)
    logs = {c: (world / f"{c}.log").read_text() for c in ("alice", "bob")}
    return {"n": resp.privacy.n, "digests": digests, "perturbed": perturbed, "report": report, "logs": logs}


@pytest.fixture(scope="module")
def local(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return release(source, tmp_path_factory.mktemp("local") / "w", {})


@pytest.mark.parametrize("files", [1, 7, 64])
def test_dask_engine_gives_the_bytes_of_the_local_engine(source: Path, local: dict, tmp_path: Path,
                                                         files: int) -> None:  # fmt: skip
    dirs = {c: split_parquet(source / "data" / f"{c}.csv", tmp_path / "parts" / c, files) for c in ("alice", "bob")}
    flags = ["--engine", "dask", "--workers", "2", "--shards", "8"]
    got = release(source, tmp_path / "w", {"alice": flags, "bob": flags}, dirs)
    assert got["n"] == local["n"] and got["n"] > 80_000
    assert got["digests"] == local["digests"] and len(got["digests"]) == 2
    assert got["perturbed"] == local["perturbed"] and got["perturbed"]
    assert got["report"] == local["report"]
    for name in ("alice", "bob"):
        assert "engine_started" in got["logs"][name] and "shards_sorted" in got["logs"][name]
        assert "engine_started" not in local["logs"][name]
