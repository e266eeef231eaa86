"""Researcher.NotifyReady: the server tells the researcher, over mutual TLS as role 'server',
exactly once, that a release is perturbed, with the digest of its perturbed rows."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from secure_release.infra import tls as security
from secure_release.infra import wire
from secure_release.infra.auth import caller
from secure_release.mechanism.primitives.keys import PramKey
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server.service import ReleaseService, make_notifier
from secure_release.server.store import Store
from tests import support

ROOT = Path(__file__).resolve().parents[2]
KEY = PramKey(bytes(range(32)))
SIZES = (3, 4)
CURATORS = ("alice", "bob")
M = CHUNK_ROWS + 500  # two chunks, the last one partial


class RecordingResearcher(pb_grpc.ResearcherServicer):
    """Records every ReadyNotice and the caller identity seen with it."""

    def __init__(self) -> None:
        self.notices: list[tuple[pb.ReadyNotice, security.Identity]] = []
        self.cond = threading.Condition()

    def NotifyReady(self, request: pb.ReadyNotice, context: grpc.ServicerContext) -> pb.ReadyAck:  # noqa: N802
        ident = caller(context)  # the interceptor admits only role server here
        with self.cond:
            self.notices.append((request, ident))
            self.cond.notify_all()
        return pb.ReadyAck(accepted=True)

    def GetEstimate(self, request: pb.EstimateRequest, context: grpc.ServicerContext) -> pb.EstimateResponse:  # noqa: N802
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "fake researcher")
        raise AssertionError("unreachable")  # pragma: no cover

    def ListReleases(  # noqa: N802
        self, request: pb.ListReleasesRequest, context: grpc.ServicerContext
    ) -> pb.ListReleasesResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "fake researcher")
        raise AssertionError("unreachable")  # pragma: no cover

    def wait(self, count: int, timeout: float) -> list[tuple[pb.ReadyNotice, security.Identity]]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.notices) >= count, timeout)
            return list(self.notices)


@pytest.fixture
def researcher(certs: Path) -> Iterator[tuple[RecordingResearcher, str]]:
    fake = RecordingResearcher()
    server = security.make_grpc_server(max_workers=2)
    pb_grpc.add_ResearcherServicer_to_server(fake, server)
    port = security.bind(server, "127.0.0.1", 0, certs / "researcher", "researcher")
    server.start()
    yield fake, f"127.0.0.1:{port}"
    server.stop(0).wait()


def make_params(rid: str) -> pb.ReleaseParams:
    return support.make_params(rid=rid, m=M)


def run_release(address: str, certs: Path, rid: str) -> pb.ReleaseStatus:
    """Register, upload and commit every curator's part; the status seen after the last commit."""
    params = make_params(rid)
    last: pb.UploadResponse | None = None
    for curator, k, col in zip(CURATORS, SIZES, support.columns(M, SIZES, seed=11), strict=True):
        with security.secure_channel(address, certs / curator, curator, peer_role="server") as channel:
            stub = pb_grpc.ReleaseServerStub(channel)
            stub.RegisterPart(pb.RegisterPartRequest(params=params, curator=curator), timeout=10)
            last = support.upload(stub, curator, support.chunks_of(col, k), rid=rid)
            assert last.committed
    assert last is not None and last.status.state == pb.RELEASE_STATE_PERTURBED
    with security.secure_channel(address, certs / "researcher", "researcher", peer_role="server") as channel:
        status: pb.ReleaseStatus = pb_grpc.ReleaseServerStub(channel).GetReleaseStatus(
            pb.ReleaseStatusRequest(release_id=rid), timeout=10
        )
    assert status.state == pb.RELEASE_STATE_PERTURBED and len(status.perturbed_digest) == 32
    assert status.perturbed_digest == last.status.perturbed_digest
    return status


def check_notified(fake: RecordingResearcher, status: pb.ReleaseStatus) -> None:
    assert fake.wait(1, timeout=20), "the researcher was never notified"
    time.sleep(0.5)  # a duplicate notice would arrive by now
    notices = fake.wait(1, timeout=0)
    assert len(notices) == 1, f"expected exactly one ReadyNotice, got {len(notices)}"
    notice, ident = notices[0]
    assert notice.release_id == status.release_id
    assert notice.perturbed_digest == status.perturbed_digest
    assert ident.role == "server" and ident.name == "server"


def test_notify_ready_in_process(
    certs: Path, tmp_path: Path, researcher: tuple[RecordingResearcher, str]
) -> None:
    fake, res_address = researcher
    store = Store(tmp_path / "store")
    server = security.make_grpc_server(max_workers=4)
    notify = make_notifier(res_address, certs / "server", "server", insecure=False)
    pb_grpc.add_ReleaseServerServicer_to_server(ReleaseService(store, lambda: KEY, notify), server)
    port = security.bind(server, "127.0.0.1", 0, certs / "server", "server")
    server.start()
    try:
        status = run_release(f"127.0.0.1:{port}", certs, "r-notify")
        check_notified(fake, status)
    finally:
        server.stop(0).wait()
        store.close()


def test_notify_ready_from_server_process(
    certs: Path, tmp_path: Path, researcher: tuple[RecordingResearcher, str]
) -> None:
    fake, res_address = researcher
    port_file = tmp_path / "server.port"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [
        sys.executable, "-m", "secure_release.server", "--store", str(tmp_path / "store"),
        "--certs", str(certs / "server"),
        "--name", "server", "--port-file", str(port_file), "--researcher-address", res_address,
    ]  # fmt: skip
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        port = int(port_file.read_text())
        status = run_release(f"127.0.0.1:{port}", certs, "r-notify-proc")
        check_notified(fake, status)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
    assert '"notified"' in (tmp_path / "server.log").read_text()


def test_racing_seals_notify_once(certs: Path, tmp_path: Path) -> None:
    """Two commits that both see the release SEALED must not both perturb-and-notify."""
    store = Store(tmp_path / "store")
    params = make_params("r-race")
    calls: list[str] = []
    service = ReleaseService(store, lambda: KEY, lambda rel: calls.append(rel.spec.release_id))
    rng = np.random.default_rng(5)
    for curator, k in zip(CURATORS, SIZES, strict=True):
        store.register(wire.spec_from_pb(params), curator, curator)
        col = rng.integers(0, k, M).astype(np.uint32)
        parts = [pack_symbols(col[i : i + CHUNK_ROWS], k) for i in range(0, M, CHUNK_ROWS)]
        for seq, data in enumerate(parts):
            store.put_chunk("r-race", curator, curator, seq, data)
        store.commit("r-race", curator, curator, len(parts), hashlib.sha256(b"".join(parts)).digest())
    # Widen the window between "is it SEALED?" and "perturb it": each caller waits (up to 1 s)
    # for the other to get there too before perturbing.
    barrier = threading.Barrier(2)
    real_perturb = store.perturb

    def slow_perturb(*args: object, **kwargs: object) -> object:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(1.0)
        return real_perturb(*args, **kwargs)  # type: ignore[arg-type]

    store.perturb = slow_perturb  # type: ignore[assignment,method-assign]
    threads = [threading.Thread(target=service.perturb_if_sealed, args=("r-race",)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    time.sleep(0.3)  # notify runs on its own thread
    assert calls == ["r-race"]
    store.close()


def test_a_commit_before_the_others_register_is_no_pram_failure(tmp_path: Path) -> None:
    """The leader registers, uploads and commits before a follower registers: the release is
    not bound yet, so there is nothing to perturb and nothing to report as an error."""
    store = Store(tmp_path / "store")
    service = ReleaseService(store, lambda: KEY)
    params = make_params("r-early")
    store.register(wire.spec_from_pb(params), CURATORS[0], CURATORS[0])
    col = np.zeros(M, dtype=np.uint32)
    parts = [pack_symbols(col[i : i + CHUNK_ROWS], SIZES[0]) for i in range(0, M, CHUNK_ROWS)]
    for seq, data in enumerate(parts):
        store.put_chunk("r-early", CURATORS[0], CURATORS[0], seq, data)
    store.commit("r-early", CURATORS[0], CURATORS[0], len(parts), hashlib.sha256(b"".join(parts)).digest())
    rel = service.perturb_if_sealed("r-early", CURATORS[0])  # before the fix: NoSuchReleaseError
    assert rel.state.name == "UPLOADING" and rel.perturbed_digest == b""
    with pytest.raises(Exception, match="registered by all its curators yet"):
        service.perturb_if_sealed("r-early")  # without the curator nobody's candidate is meant
    store.close()
