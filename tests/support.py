"""Helpers the server and end-to-end tests share: release parameters, columns, uploads."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest

from secure_release.infra import wire
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from secure_release.curator.cluster.engine import Engine
    from secure_release.curator.cluster.sharded import ShardedTable
    from secure_release.curator.config import CuratorConfig
    from secure_release.mechanism.primitives.keys import AlignmentKey

#: Every party the tests use: three curators, the server, a granted and an ungranted
#: researcher, and an analyst.
PARTIES = [
    ("curator", "alice"),
    ("curator", "bob"),
    ("curator", "carol"),
    ("server", "server"),
    ("researcher", "researcher"),
    ("researcher", "mallory"),
    ("analyst", "analyst"),
]

#: The table-input tests (marker ``inputs``, set by tests/conftest.py), by file name: every
#: reader, the cell rule, binning, schema drafts and the notebook API. ``make test-oldest`` runs
#: the unit tier, these included, on the oldest dependency set (constraints/oldest.txt);
#: ``pytest -m inputs`` runs only them.
INPUT_TESTS = (
    "test_curator_table*.py",
    "test_curator_partitions.py",
    "test_owndata_binning.py",
    "test_owndata_draft.py",
    "test_api.py",
    "test_cell_rule*.py",
    "test_bad_rows_summary.py",
    "test_draft_bins.py",
    "test_postgres_source.py",
)

SIZES = (3, 4)
CURATORS = ("alice", "bob")


def make_spec(
    rid: str = "r1",
    m: int = CHUNK_ROWS + 1000,
    sizes: tuple[int, ...] = SIZES,
    n: int = 4 * CHUNK_ROWS,
    researchers: tuple[str, ...] = ("researcher",),
) -> ReleaseSpec:
    """A valid two-curator ChaCha20 release spec at epsilon = 1."""
    plan = plan_release(n, sizes, 1.0, m)
    return ReleaseSpec(rid, CURATORS, CipherMode.CHACHA20, plan, researchers)


def make_params(**kw: object) -> pb.ReleaseParams:
    """:func:`make_spec` as its wire message."""
    return wire.spec_to_pb(make_spec(**kw))  # type: ignore[arg-type]


def columns(m: int, sizes: Sequence[int] = SIZES, seed: int = 7) -> list[npt.NDArray[np.uint32]]:
    """Random symbol columns, one per curator."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, k, m).astype(np.uint32) for k in sizes]


def chunks_of(col: npt.NDArray[np.uint32], k: int) -> list[bytes]:
    """A column packed into upload chunks of CHUNK_ROWS symbols."""
    return [pack_symbols(col[i : i + CHUNK_ROWS], k) for i in range(0, len(col), CHUNK_ROWS)]


def upload(
    stub: pb_grpc.ReleaseServerStub, curator: str, parts: list[bytes], commit: bool = True, rid: str = "r1"
) -> pb.UploadResponse:
    """Stream ``parts`` (and, with ``commit``, the committing message) as ``curator``."""
    msgs = [pb.UploadChunk(release_id=rid, curator=curator, sequence=s, symbols=b) for s, b in enumerate(parts)]
    if commit:
        msgs.append(
            pb.UploadChunk(
                release_id=rid,
                curator=curator,
                commit=True,
                num_chunks=len(parts),
                digest=hashlib.sha256(b"".join(parts)).digest(),
            )
        )
    return stub.UploadCiphertext(iter(msgs), timeout=30)


def register_all(stubs: dict[str, pb_grpc.ReleaseServerStub], params: pb.ReleaseParams) -> None:
    """RegisterPart for every curator of ``params``."""
    for c in params.curators:
        stubs[c].RegisterPart(pb.RegisterPartRequest(params=params, curator=c), timeout=5)


def code_of(fn: Callable[[], object]) -> grpc.StatusCode:
    """The status code ``fn`` fails with (it must fail)."""
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value.code()  # type: ignore[no-any-return]


def served_serial(port: int, party: Path, name: str) -> int:
    """The serial of the certificate a TLS server on 127.0.0.1:``port`` presents in a fresh
    handshake (read with the stdlib's TLS client, presenting ``party``'s certificate)."""
    import socket
    import ssl

    from cryptography import x509

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.load_cert_chain(party / f"{name}.pem", party / f"{name}.key")
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, ctx.wrap_socket(sock) as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def demo_world(root: Path, rows: int, seed: int) -> Path:
    """A directory with the demo tables of two curators (``data/``), a PKI of :data:`PARTIES`
    (``certs/NAME`` per party) and an alignment key (``align.key``), for system tests."""
    from secure_release.demo_data import write_demo_data
    from secure_release.infra.pki import init_pki
    from secure_release.mechanism.primitives.keys import AlignmentKey

    write_demo_data(root / "data", rows=rows, seed=seed)
    init_pki(root / "certs", list(PARTIES))
    (root / "align.key").write_text(AlignmentKey.generate().reveal().hex())
    return root


def split_parquet(csv: Path, out: Path, files: int, groups: int = 2) -> Path:
    """``csv`` (a demo table) written as ``files`` Parquet files of about ``groups`` row groups
    each in directory ``out``, in the CSV's row order (ids kept as strings)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pacsv.read_csv(csv, convert_options=pacsv.ConvertOptions(column_types={"id": pa.string()}))
    out.mkdir(parents=True)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    for i in range(files):
        part = table.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i]))
        pq.write_table(part, out / f"part-{i:03d}.parquet", row_group_size=max(1, part.num_rows // groups))
    return out


def child_env(testing: bool = False) -> dict[str, str]:
    """This environment for a child process that imports the project from the checkout
    (``PYTHONPATH`` = the repository root); ``testing``: SECURE_RELEASE_TESTING=1 too (the
    --insecure-test-* flags)."""
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    if testing:
        env["SECURE_RELEASE_TESTING"] = "1"
    return env


@dataclass(frozen=True)
class SplitWorld:
    """The demo's two curators' tables: the CSVs and schemas under ``root``, and each table split
    into three Parquet files (``folders[curator]``)."""

    root: Path
    folders: dict[str, Path]

    def sharded(
        self, engine: Engine, curator: str, key: AlignmentKey, shard_bits: int, group_bits: int | None = None
    ) -> ShardedTable:
        """``curator``'s Parquet files read, hashed under ``key`` and sharded on ``engine``
        (``group_bits``: the shuffle's levels, as ``load_sharded`` takes them)."""
        from secure_release.curator.cluster.sharded import load_sharded
        from secure_release.curator.table import load_schema
        from secure_release.infra.logs import EventLog

        schema = load_schema(self.root / f"{curator}.json")
        return load_sharded(engine, str(self.folders[curator]), schema, key, EventLog("curator", "test"),
                            shard_bits=shard_bits, group_bits=group_bits)  # fmt: skip


def curator_config(name: str, **changes: Any) -> CuratorConfig:
    """A ``CuratorConfig`` of curator ``name`` of release ``r1`` (alice leads; bob follows), for
    services run in the test process: no files are read, plaintext, ``changes`` over the rest."""
    from secure_release.curator.config import CuratorConfig
    from secure_release.mechanism.primitives.keys import AlignmentKey

    base: dict[str, Any] = dict(
        name=name, release_id="r1", epsilon=1.0, m=None, cipher=CipherMode.OTP, curators=("alice", "bob"),
        leader=name == "alice", leader_address=None, expected_sizes=None, notify="res", grants=(),
        data=Path("x.csv"), schema=Path("x.json"), dataset="d", keystore=Path("ks"),
        server="127.0.0.1:1", certs=None, listen_host="127.0.0.1", listen_port=0, port_file=None,
        insecure=True, timeout=10.0, exit_after_keys=True, alignment_key=AlignmentKey(bytes(32)),
    )  # fmt: skip
    return CuratorConfig(**{**base, **changes})


def split_world(root: Path, rows: int, seed: int) -> SplitWorld:
    """:class:`SplitWorld` of ``rows`` demo rows a curator (``seed``) written under ``root``."""
    from secure_release.demo_data import write_demo_data

    write_demo_data(root, rows=rows, seed=seed)
    return SplitWorld(root, {c: split_parquet(root / f"{c}.csv", root / c, 3) for c in ("alice", "bob")})


def stored_release(world: Path, release_id: str) -> dict[str, Any]:
    """What a deployment in ``world`` kept of a release: each curator's upload digest and every
    perturbed chunk (the server's store) and the researcher's report without its times."""
    import json
    import sqlite3

    with sqlite3.connect(world / "store" / "releases.sqlite3") as db:
        digests = db.execute(
            "SELECT curator, hex(digest) FROM parts WHERE release_id=? ORDER BY curator", (release_id,)
        ).fetchall()
        perturbed = db.execute(
            "SELECT seq, col, data FROM perturbed WHERE release_id=? ORDER BY seq, col", (release_id,)
        ).fetchall()
    report = json.loads((world / "results" / f"{release_id}.json").read_text())
    for key in ("created_at", "received_at", "timings", "seconds"):
        report.pop(key, None)
    return {"digests": digests, "perturbed": perturbed, "report": report}


@dataclass
class ClusterWorld:
    """Two curators' partitioned Parquet (``bench/cluster_data.py``), a PKI, an alignment key and
    the budgets set, for a release through the real processes (``cluster`` not yet launched)."""

    data: Path
    certs: Path
    akey: Path
    world: Path
    cluster: Any
    dirs: dict[str, Path]

    def flags(self, *more: str) -> dict[str, list[str]]:
        """Each curator's --data and --schema on ``--engine dask``, and ``more``."""
        return {c: ["--data", str(d), "--schema", str(self.data / f"{c}.json"), "--engine", "dask", *more]
                for c, d in self.dirs.items()}  # fmt: skip

    def release_until_exit(self, release_id: str, m: int, extra: dict[str, list[str]], seconds: float = 240) -> dict:
        """Launch ``release_id`` (budgets set already) and wait up to ``seconds`` for both
        curators to exit: their exit codes (None: still running)."""
        import time

        from secure_release.cluster import launch_release

        launch_release(self.cluster, self.data, self.certs, release_id, 1.0, m, "chacha20", self.akey,
                       curator_extra=extra, budgets=False)  # fmt: skip
        end = time.monotonic() + seconds
        while time.monotonic() < end and any(self.cluster.procs[c].poll() is None for c in self.dirs):
            time.sleep(0.1)
        return {c: self.cluster.procs[c].poll() for c in self.dirs}


def cluster_world(root: Path, rows: int, files: int, rows_per_group: int) -> ClusterWorld:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from cluster_data import write_partitioned

    from secure_release.cluster import PARTIES, Cluster, set_budgets
    from secure_release.infra.pki import init_pki
    from secure_release.mechanism.primitives.keys import AlignmentKey

    data = root / "data"
    write_partitioned(data, rows, files, rows_per_group=rows_per_group)
    certs = root / "certs"
    init_pki(certs, list(PARTIES))
    akey = root / "align.key"
    akey.write_text(AlignmentKey(bytes(range(4, 36))).reveal().hex())
    world = root / "w"
    world.mkdir()
    cluster = Cluster(world, env=child_env(testing=True))
    dirs = {c: data / c for c in ("alice", "bob")}
    set_budgets(cluster, {world / f"keystore-{c}": d for c, d in dirs.items()}, 2.0, certs)
    return ClusterWorld(data, certs, akey, world, cluster, dirs)


def run_at_once(*jobs: Callable[[], Any], seconds: float = 120) -> list[Any]:
    """Each job in a thread of its own, all at once (parties that wait for one another's
    messages): their results in order, or the first failure raised."""
    import threading

    out: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = jobs[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds)
    if errors:
        raise errors[0]
    return out
