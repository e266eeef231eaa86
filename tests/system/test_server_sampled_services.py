"""The server-sampled release kind across the services (rekeyed path): real processes over
mutual TLS. The curators store the table once (``store-table``), then run releases from it with
no data file (``run --sampling server``); each release's estimate equals the in-memory
``mechanism.protocol.architectures.run_server_sampled_release`` with the same injected randomness; the second
release has another sample and the ledger is charged twice; a third past the budget is refused
with nothing spent. The researcher never receives a position; after PRAM the server's store holds
no re-key column, gathered row or position, and the stored table stays."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import file_fingerprint
from secure_release.curator.table import load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.infra import tls
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.protocol.architectures import StoredRelease, run_server_sampled_release
from secure_release.mechanism.protocol.server_sampling import TableKey, server_draw_sample, table_ledger_name
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
CURATORS = ("alice", "bob")
AKEY = AlignmentKey(bytes([7]) * 32)
TABLE_KEYS = {"alice": TableKey(bytes([11]) * 32), "bob": TableKey(bytes([12]) * 32)}
PADS = {"alice": PadKey(bytes([1]) * 32), "bob": PadKey(bytes([2]) * 32)}
PRAM = PramKey(bytes([8]) * 32)
SAMPLE_SEED = Seed(bytes([5]) * 32)
ROWS, M, EPS, BUDGET = 3000, 400, 0.4, 1.0


class World:
    """One server, the curators' keystores and data, and helpers to start processes."""

    def __init__(self, base: Path, certs: Path) -> None:
        self.base, self.certs = base, certs
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "SECURE_RELEASE_TESTING": "1"}
        self.procs: list[subprocess.Popen[bytes]] = []
        write_demo_data(base / "data", rows=ROWS, seed=3)
        (base / "align.key").write_text(AKEY.reveal().hex())
        self.server = f"127.0.0.1:{self.start('server', ['-m', 'secure_release.server', '--store', str(base / 'store'), '--certs', str(certs / 'server'), '--name', 'server', '--insecure-test-pram-key', PRAM.reveal().hex(), '--insecure-test-sample-seed', SAMPLE_SEED.reveal().hex(), '--grace', '0.5'])}"  # noqa: E501

    def start(self, name: str, args: list[str], port: bool = True) -> int:
        pf = self.base / f"{name}.port"
        pf.unlink(missing_ok=True)
        log = (self.base / f"{name}.log").open("ab")
        cmd = [sys.executable, *args, *(["--port-file", str(pf)] if port else [])]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        if not port:
            return 0
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if pf.exists() and pf.read_text().strip():
                return int(pf.read_text())
            assert proc.poll() is None, self.log(name)
            time.sleep(0.05)
        raise AssertionError(f"{name} reported no port: {self.log(name)}")

    def log(self, name: str) -> str:
        path = self.base / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def curator(self, command: str, name: str, extra: list[str], leader_port: int | None = None) -> int:
        role = ["--leader"] if leader_port is None else ["--leader-address", f"127.0.0.1:{leader_port}"]
        if command == "run":
            role = []  # a release from a stored table needs no leader
        args = ["-m", "secure_release.curator", command, "--server", self.server, "--certs", str(self.certs / name),
                "--name", name, "--curators", ",".join(CURATORS), "--listen", "127.0.0.1:0",
                "--keystore", str(self.base / f"ks-{name}"), "--timeout", "60", *role, *extra]  # fmt: skip
        return self.start(f"{name}-{command}-{extra[extra.index('--table-id') + 1]}", args)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait(procs: list[subprocess.Popen[bytes]], seconds: float = 60) -> list[int | None]:
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    return [p.poll() for p in procs]


@pytest.fixture(scope="module")
def world(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("server-sampled"), certs)
    try:
        yield w
    finally:
        w.close()


def store(world: World) -> None:
    data = world.base / "data"
    for c in CURATORS:
        ledger = ["-m", "secure_release.curator", "budget", "set", "--keystore", str(world.base / f"ks-{c}"),
                  "--data", str(data / f"{c}.csv"), "--epsilon", str(BUDGET), "--certs", str(world.certs / c),
                  "--name", c]  # fmt: skip
        subprocess.run([sys.executable, *ledger], env=world.env, check=True, capture_output=True, timeout=60)
    common = ["--table-id", "t1", "--alignment-key-file", str(world.base / "align.key")]
    per = {c: ["--data", str(data / f"{c}.csv"), "--schema", str(data / f"{c}.json"),
               "--insecure-test-table-key", TABLE_KEYS[c].reveal().hex(), *common] for c in CURATORS}  # fmt: skip
    lead = world.curator("store-table", "alice", per["alice"])
    world.curator("store-table", "bob", per["bob"], leader_port=lead)
    codes = wait(world.procs[-2:])
    assert codes == [0, 0], world.log("alice-store-table-t1") + world.log("bob-store-table-t1")


def release(world: World, rid: str) -> tuple[list[int | None], Path]:
    ports = {}
    for c in CURATORS:
        extra = ["--sampling", "server", "--table-id", "t1", "--release-id", rid, "--epsilon", str(EPS), "--m", str(M),
                 "--grant", "researcher", "--insecure-test-pad-key", PADS[c].reveal().hex(), "--exit-after-keys",
                 "--key-retention", "600"]  # fmt: skip
        ports[c] = world.curator("run", c, extra)
    out = world.base / "results"
    world.start(f"researcher-{rid}", ["-m", "secure_release.researcher", "fetch", "--release-id", rid, "--server",
                                      world.server, "--certs", str(world.certs / "researcher"),
                                      "--name", "researcher", "--out",
                                      str(out), "--timeout", "60",
                                      *(x for c in CURATORS for x in ("--curator", f"{c}=127.0.0.1:{ports[c]}"))],
                port=False)  # fmt: skip
    return wait(world.procs[-3:]), out


@pytest.mark.slow
def test_two_releases_from_one_stored_table_equal_the_in_memory_run_and_a_third_is_refused(world: World) -> None:
    store(world)
    tables = [read_table(world.base / "data" / f"{c}.csv", load_schema(world.base / "data" / f"{c}.json"))
              for c in CURATORS]  # fmt: skip
    # the in-memory ledger keys reuse by the server seed's fingerprint, so one call per release (the
    # services record the positions' fingerprint, which differs: the release id enters each draw)
    refs = [run_server_sampled_release(
        tables, [StoredRelease(rid, EPS, M)], table_id="t1", budget=BUDGET, alignment_key=AKEY,
        table_keys=[TABLE_KEYS[c] for c in CURATORS], server_seeds=[SAMPLE_SEED], pram_keys=[PRAM],
        pad_keys=[[PADS[c] for c in CURATORS]],
    ) for rid in ("s1", "s2")]  # fmt: skip
    ref = refs[0]
    # the stored table at the server is what the curators' in-memory encryption gives
    record = Keystore(world.base / "ks-alice").load_table("t1")
    assert record is not None and record.n == ref.n and record.curators == CURATORS
    assert np.array_equal(refs[0].server_view["stored"][0], refs[1].server_view["stored"][0])
    for i, rid in enumerate(("s1", "s2")):
        codes, out = release(world, rid)
        assert codes == [0, 0, 0], world.log("alice-run-t1") + world.log(f"researcher-{rid}")
        got = np.array([c["raw"] for c in json.loads((out / f"{rid}.json").read_text())["cells"]])
        assert np.array_equal(got, refs[i].releases[0].estimate.raw), rid
    # the two samples differ; each curator's ledger was charged twice, on the table's data set
    p1, _ = server_draw_sample(ref.n, M, "s1", SAMPLE_SEED)
    p2, _ = server_draw_sample(ref.n, M, "s2", SAMPLE_SEED)
    assert not np.array_equal(np.sort(p1), np.sort(p2))
    for c in CURATORS:
        ledger = Keystore(world.base / f"ks-{c}").ledger.read()
        states = {r: v.state.value for r, v in ledger.releases().items()}
        assert states == {"s1": "commit", "s2": "commit"}, states
        # one budget: the data set's (the table's record names it), not a second one for the table
        assert ledger.remaining(f"{c}.csv") == pytest.approx(BUDGET - 2 * EPS)
        assert ledger.tables(f"{c}.csv") == [file_fingerprint(world.base / "data" / f"{c}.csv")]
        assert ledger.budget(table_ledger_name("t1")) is None
    # a third release past the budget: refused at both curators, nothing spent, aborted at the server
    codes, _ = release(world, "s3")
    assert codes[:2] == [3, 3] and codes[2] != 0, (codes, world.log("alice-run-t1")[-1500:])
    for c in CURATORS:
        ledger = Keystore(world.base / f"ks-{c}").ledger.read()
        assert "s3" not in ledger.releases() and ledger.remaining(f"{c}.csv") == pytest.approx(0.2)
    # after PRAM: no re-key column and no position is left at the server; the stored table stays
    db = sqlite3.connect(world.base / "store" / "releases.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE length(data) > 0").fetchone() == (0,)
    assert db.execute("SELECT COUNT(*) FROM samples WHERE length(packed) > 0").fetchone() == (0,)
    assert db.execute("SELECT COUNT(DISTINCT curator) FROM table_chunks WHERE length(data) > 0").fetchone() == (2,)
    db.close()
    # the researcher never receives a position: nothing it is sent has such a field, it may not
    # call FetchSample, and its files and logs hold no packed position tuple
    from secure_release.mechanism.protocol.index_sharing import pack_indices

    for msg in (pb.ReleaseStatus, pb.ReleaseParams, pb.PerturbedChunk, pb.KeyChunk, pb.CuratorProgress):
        assert not [f.name for f in msg.DESCRIPTOR.fields if "position" in f.name or "sample" in f.name], msg
    with tls.secure_channel(world.server, world.certs / "researcher", "researcher", peer_role="server") as ch:
        with pytest.raises(grpc.RpcError) as err:
            request = pb.SampleRequest(release_id="s1", curator="alice")
            list(pb_grpc.ReleaseServerStub(ch).FetchSample(request, timeout=5))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    seen = world.log("researcher-s1") + (world.base / "results" / "s1.json").read_text()
    assert pack_indices(p1, ref.n).hex()[:32] not in seen
    for c in CURATORS:  # keys and positions never reach the curators' logs either
        text = world.log(f"{c}-run-t1") + world.log(f"{c}-store-table-t1")
        assert TABLE_KEYS[c].reveal().hex() not in text and pack_indices(p1, ref.n).hex()[:32] not in text
        assert '"sample_received"' in text
    # the operator commands: status, then delete (the table key is forgotten), then status refused
    def table_cmd(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "secure_release.curator", "table", *args, "t1", "--server", world.server,
               "--certs", str(world.certs / "alice"), "--name", "alice",
               "--keystore", str(world.base / "ks-alice")]  # fmt: skip
        return subprocess.run(cmd, env=world.env, capture_output=True, text=True, timeout=60)

    shown = table_cmd("status")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["server"]["complete"] is True
    gone = table_cmd("delete")
    assert gone.returncode == 0 and json.loads(gone.stdout)["table_key"] == "forgotten", gone.stdout + gone.stderr
    assert Keystore(world.base / "ks-alice").load_table("t1") is None
    again = table_cmd("status")
    assert again.returncode == 1 and "error" in json.loads(again.stdout)["server"]


def test_store_table_on_dask_clusters_stores_the_in_memory_ciphertext(certs: Path, tmp_path: Path) -> None:
    """Both curators run store-table with --engine dask on Parquet directories (the leader
    intersects shards on its workers): the server holds, for each curator, exactly the digest of
    the whole aligned column encrypted under its table key, computed here in memory."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from secure_release.curator.release.upload import pack_chunks
    from secure_release.mechanism.alignment.keyed_hash import align_all, id_tags
    from secure_release.mechanism.primitives.packing import digest_of
    from secure_release.mechanism.protocol.server_sampling import curator_store_table

    w = World(tmp_path, certs)
    try:
        data = tmp_path / "data"
        per = {}
        for c in CURATORS:
            folder = tmp_path / "parts" / c
            folder.mkdir(parents=True)
            table = pacsv.read_csv(data / f"{c}.csv")
            for i, start in enumerate(range(0, table.num_rows, 700)):
                pq.write_table(table.slice(start, 700), folder / f"part-{i}.parquet")
            per[c] = ["--data", str(folder), "--schema", str(data / f"{c}.json"), "--engine", "dask", "--workers", "1",
                      "--insecure-test-table-key", TABLE_KEYS[c].reveal().hex(), "--table-id", "t1",
                      "--alignment-key-file", str(tmp_path / "align.key")]  # fmt: skip
        lead = w.curator("store-table", "alice", per["alice"])
        w.curator("store-table", "bob", per["bob"], leader_port=lead)
        codes = wait(w.procs[-2:], 120)
        assert codes == [0, 0], w.log("alice-store-table-t1") + w.log("bob-store-table-t1")
        assert "shards_sorted" in w.log("alice-store-table-t1") and "shards_sorted" in w.log("bob-store-table-t1")
        assert not list((tmp_path / "ks-alice").glob("spool-*")), "the leader's spool outlived store-table"
    finally:
        w.close()
    tables = [read_table(data / f"{c}.csv", load_schema(data / f"{c}.json")) for c in CURATORS]
    _, alignments = align_all([id_tags(t.id_values(), AKEY) for t in tables])
    expected = {}
    for c, t, a in zip(CURATORS, tables, alignments, strict=True):
        k = t.schema.alphabet_size
        ciphertext, _ = curator_store_table(t.symbols()[a.row_order], k, "t1", TABLE_KEYS[c])
        expected[c] = digest_of(pack_chunks(ciphertext, k)).hex().upper()
    with sqlite3.connect(tmp_path / "store" / "releases.sqlite3") as db:
        got = dict(db.execute("SELECT curator, hex(digest) FROM table_parts WHERE table_id='t1'").fetchall())
    assert got == expected
