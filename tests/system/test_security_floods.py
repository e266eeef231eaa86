"""Floods from one authenticated peer against a real server process: the commit bomb and idle
streams. Measured: the server's peak RSS and a legitimate caller's worst status latency during
each attack (targets: RSS below 300 MiB, latency below 1 s)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from secure_release.infra import retry, tls
from secure_release.mechanism.primitives.packing import CHUNK_ROWS
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from tests import support

ROOT = Path(__file__).resolve().parents[2]
IDLE_SECONDS = 2.0


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def server(certs: Path, tmp_path: Path) -> Iterator[tuple[int, int]]:
    port_file = tmp_path / "port"
    cmd = [
        sys.executable, "-m", "secure_release.server", "--store", str(tmp_path / "store"),
        "--certs", str(certs / "server"), "--port-file", str(port_file),
        "--stream-idle-seconds", str(IDLE_SECONDS), "--calls-per-peer", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield proc.pid, int(port_file.read_text())
    proc.terminate()
    proc.wait(timeout=20)


class LatencyProbe(threading.Thread):
    """A legitimate researcher asking for a status every 50 ms; records the worst latency."""

    def __init__(self, port: int, certs: Path) -> None:
        super().__init__(daemon=True)
        self.channel = tls.secure_channel(f"127.0.0.1:{port}", certs / "researcher", "researcher", peer_role="server")
        self.stub = pb_grpc.ReleaseServerStub(self.channel)
        self.stop, self.worst, self.calls = threading.Event(), 0.0, 0

    def run(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                self.stub.GetReleaseStatus(pb.ReleaseStatusRequest(release_id="r1"), timeout=10)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            self.worst, self.calls = max(self.worst, time.monotonic() - start), self.calls + 1
            time.sleep(0.05)

    def finish(self) -> float:
        self.stop.set()
        self.join(15)
        self.channel.close()
        return self.worst


def test_commit_bomb_is_refused_before_allocation(certs: Path, server: tuple[int, int]) -> None:
    pid, port = server
    probe = LatencyProbe(port, certs)
    probe.start()
    with tls.secure_channel(f"127.0.0.1:{port}", certs / "alice", "alice", peer_role="server") as ch:
        stub = pb_grpc.ReleaseServerStub(ch)
        huge = support.make_params(rid="bomb", n=1 << 62, m=1 << 62)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RegisterPart(pb.RegisterPartRequest(params=huge, curator="alice"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert not retry.is_transient(refused.value)  # a bound, not a busy slot: no client retries it
        big = support.make_params(rid="bomb", n=10**8, m=10**8)  # at the default limit: accepted
        stub.RegisterPart(pb.RegisterPartRequest(params=big, curator="alice"), timeout=10)
        for claimed in (1 << 44, -(-(10**8) // CHUNK_ROWS)):
            msg = pb.UploadChunk(release_id="bomb", curator="alice", commit=True, num_chunks=claimed, digest=b"\0" * 32)
            code = support.code_of(lambda m=msg: stub.UploadCiphertext(iter([m]), timeout=10))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
    worst = probe.finish()
    rss = peak_rss_mib(pid)
    print(f"commit bomb: server peak RSS {rss:.1f} MiB, worst status latency {worst * 1000:.0f} ms")
    assert rss < 300 and worst < 1.0 and probe.calls > 0


def test_idle_streams_from_one_peer_do_not_starve_others(certs: Path, server: tuple[int, int]) -> None:
    pid, port = server
    probe = LatencyProbe(port, certs)
    probe.start()
    hold = threading.Event()

    def silent() -> Iterator[pb.UploadChunk]:
        hold.wait(30)
        yield from ()

    codes: list[grpc.StatusCode] = []
    transient: list[bool] = []
    lock = threading.Lock()

    def idle_upload() -> None:
        with tls.secure_channel(f"127.0.0.1:{port}", certs / "bob", "bob", peer_role="server") as ch:
            try:
                pb_grpc.ReleaseServerStub(ch).UploadCiphertext(silent(), timeout=30)
            except grpc.RpcError as exc:
                with lock:
                    codes.append(exc.code())
                    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        transient.append(retry.is_transient(exc))

    started = time.monotonic()
    threads = [threading.Thread(target=idle_upload) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - started
    hold.set()
    worst = probe.finish()
    names = sorted(c.name for c in codes)
    print(f"12 idle streams: ended after {elapsed:.1f} s, codes {names}, worst latency {worst * 1000:.0f} ms")
    assert len(codes) == 12
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 8  # beyond the 4 slots: refused at once
    assert transient and all(transient)  # a busy slot carries the pushback trailer: clients retry it
    assert codes.count(grpc.StatusCode.CANCELLED) == 4  # the 4 admitted ones: cancelled when idle
    assert elapsed < IDLE_SECONDS + 5 and worst < 1.0 and probe.calls > 0
    assert peak_rss_mib(pid) < 300
