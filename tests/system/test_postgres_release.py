"""Releases from a real PostgreSQL server through the four services (tests/system/postgres_server.py):
the same rows read from Parquet files and from the database (``--data postgresql://... --query``,
the password in ``--data-password-file``), on ``--engine local`` and on ``--engine dask`` (the
workers read disjoint slices at the coordinator's exported snapshot), give byte-identical
uploads, perturbed chunks and researcher reports. The password never appears in a process's
argv, a log line or a keystore; a resume after the rows changed in the database is refused."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from postgres_server import PostgresServer, postgres_server
from support import child_env, stored_release

from secure_release.cluster import PARTIES, Cluster, _commands, get_estimate, launch_release, set_budgets, wait_exit
from secure_release.demo_data import write_demo_data
from secure_release.infra.pki import init_pki
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed

pytestmark = pytest.mark.slow
SEED, PRAM = Seed(bytes(range(32))), PramKey(bytes(range(1, 33)))
PADS = {"alice": PadKey(bytes(range(2, 34))), "bob": PadKey(bytes(range(3, 35)))}
CURATORS = ("alice", "bob")
QUERY = "SELECT * FROM {name}_people"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("pg-release")
    write_demo_data(root / "data", rows=20_000, seed=5)
    init_pki(root / "certs", list(PARTIES))
    (root / "align.key").write_text(AlignmentKey(bytes(range(4, 36))).reveal().hex())
    with postgres_server() as pg:
        for name in CURATORS:
            table = pacsv.read_csv(root / "data" / f"{name}.csv",
                                   convert_options=pacsv.ConvertOptions(column_types={"id": pa.string()}))
            pq.write_table(table, root / "data" / f"{name}.parquet", row_group_size=4_000)
            pg.load(f"{name}_people", table)
        password = pg.role("office", [f"{name}_people" for name in CURATORS])
        (root / "office.pw").write_text(password + "\n")
        (root / "office.pw").chmod(0o600)
        yield {"root": root, "pg": pg, "password": password}


def _argv_watch(password: str, stop: threading.Event, seen: list[str]) -> None:
    """Every process's argv, every 50 ms until ``stop``: any that holds the password is kept."""
    while not stop.is_set():
        for proc in psutil.process_iter(["cmdline"]):
            line = " ".join(proc.info.get("cmdline") or [])
            if password in line:
                seen.append(line)
        time.sleep(0.05)


def _database_flags(pg: PostgresServer, root: Path, name: str) -> list[str]:
    return ["--data", pg.url("office"), "--query", QUERY.format(name=name), "--data-password-file",
            str(root / "office.pw")]  # fmt: skip


def _pg_budgets(pg: PostgresServer, root: Path, world: Path) -> None:
    for name in CURATORS:
        done = subprocess.run(
            [sys.executable, "-m", "secure_release.curator", "budget", "set", "--keystore",
             str(world / f"keystore-{name}"), "--epsilon", "1.0", "--certs", str(root / "certs" / name), "--name",
             name, *_database_flags(pg, root, name)],
            env=child_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def release(src: dict[str, Any], world: Path, database: bool, extra: list[str]) -> dict[str, Any]:
    """One release ``r1`` in ``world`` (from the database, or from the Parquet files): what the
    researcher and the server got, the logs, and every argv seen with the password."""
    root, pg = src["root"], src["pg"]
    world.mkdir()
    cluster = Cluster(world, env=child_env(testing=True))
    if database:
        _pg_budgets(pg, root, world)
    else:
        set_budgets(cluster, {world / f"keystore-{c}": root / "data" / f"{c}.parquet" for c in CURATORS}, 1.0,
                    root / "certs")  # fmt: skip
    curator_extra = {
        c: [*extra, "--insecure-test-pad-key", PADS[c].reveal().hex(),
            *(_database_flags(pg, root, c) if database else ["--data", str(root / "data" / f"{c}.parquet")])]
        for c in CURATORS
    }  # fmt: skip
    curator_extra["alice"] += ["--insecure-test-seed", SEED.reveal().hex()]
    stop, seen = threading.Event(), []
    watch = threading.Thread(target=_argv_watch, args=(src["password"], stop, seen), daemon=True)
    watch.start()
    try:
        pram = ["--insecure-test-pram-key", PRAM.reveal().hex()]
        addrs = launch_release(cluster, root / "data", root / "certs", "r1", 0.5, 4_000, "chacha20",
                               root / "align.key", curator_extra=curator_extra, server_extra=pram, budgets=False)
        resp = get_estimate(addrs["researcher"], root / "certs", "r1", timeout=240)
        wait_exit(cluster, list(CURATORS), 120)
    except Exception:
        sys.stderr.write(cluster.tails(30))
        raise
    finally:
        stop.set()
        watch.join()
        cluster.close()
    logs = {c: (world / f"{c}.log").read_text() for c in CURATORS}
    return {"n": resp.privacy.n, **stored_release(world, "r1"), "logs": logs, "argv": seen, "addrs": addrs,
            "extra": curator_extra}  # fmt: skip


@pytest.fixture(scope="module")
def from_parquet(source: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return release(source, tmp_path_factory.mktemp("parquet") / "w", False, [])


def _no_password_anywhere(password: str, world: Path, got: dict[str, Any]) -> None:
    assert got["argv"] == []
    for path in world.rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path


def test_a_release_from_postgresql_is_the_release_from_parquet(
    source: dict[str, Any], from_parquet: dict[str, Any], tmp_path: Path
) -> None:
    world = tmp_path / "w"
    got = release(source, world, True, [])
    assert got["n"] == from_parquet["n"] and got["n"] > 15_000
    assert got["digests"] == from_parquet["digests"] and len(got["digests"]) == 2
    assert got["perturbed"] == from_parquet["perturbed"] and got["perturbed"]
    assert got["report"] == from_parquet["report"]
    _no_password_anywhere(source["password"], world, got)
    # the rows change in the database: a resume of r1 is refused by name, before any server is reached
    pg, root = source["pg"], source["root"]
    pg.execute("UPDATE alice_people SET marital = CASE marital WHEN 'single' THEN 'married' ELSE 'single' END "
               "WHERE id = (SELECT min(id) FROM alice_people)")  # fmt: skip
    try:
        argv = _commands(got["addrs"], root / "data", root / "certs", world, "r1", 0.5, 4_000, "chacha20",
                         root / "align.key", None, {c: ["researcher"] for c in CURATORS}, got["extra"], [],
                         "researcher", CURATORS, "seed", "hash")["alice"]  # fmt: skip
        done = subprocess.run([sys.executable, *argv], env=child_env(testing=True), capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    finally:
        pg.execute("UPDATE alice_people SET marital = CASE marital WHEN 'single' THEN 'married' ELSE 'single' END "
                   "WHERE id = (SELECT min(id) FROM alice_people)")  # fmt: skip
    assert done.returncode == 2 and "TableChangedError" in done.stderr, done.stderr[-2000:]


def test_the_dask_engine_reads_slices_at_one_snapshot_and_gives_the_same_release(
    source: dict[str, Any], from_parquet: dict[str, Any], tmp_path: Path
) -> None:
    world = tmp_path / "w"
    got = release(source, world, True, ["--engine", "dask", "--workers", "2", "--shards", "8"])
    assert got["n"] == from_parquet["n"]
    assert got["digests"] == from_parquet["digests"]
    assert got["perturbed"] == from_parquet["perturbed"]
    assert got["report"] == from_parquet["report"]
    for name in CURATORS:
        assert "engine_started" in got["logs"][name] and "shards_sorted" in got["logs"][name]
    _no_password_anywhere(source["password"], world, got)
