"""kill -9 the real server process mid-upload and after PRAM; acknowledged data survives."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from secure_release.infra import tls as security
from secure_release.mechanism.primitives.keys import PramKey
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols, unpack_symbols
from secure_release.mechanism.primitives.pram import PramChannel, perturb
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from tests import support

ROOT = Path(__file__).resolve().parents[2]
KEY_HEX = "11" * 32
SIZES = (5, 2)
M = 2 * CHUNK_ROWS + 123


def start(store: Path, certs: Path) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, SECURE_RELEASE_TESTING="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "secure_release.server",
            "--listen",
            "127.0.0.1:0",
            "--store",
            str(store),
            "--certs",
            str(certs / "server"),
            "--name",
            "server",
            "--insecure-test-pram-key",
            KEY_HEX,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("secure-release server listening on 127.0.0.1:"), line
    return proc, int(line.rsplit(":", 1)[1])


def kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def test_kill9_mid_upload_and_after_pram(tmp_path: Path, certs: Path) -> None:
    params = support.make_params(rid="r", m=M, n=3 * CHUNK_ROWS, sizes=SIZES)
    rng = np.random.default_rng(3)
    cols = [rng.integers(0, k, M).astype(np.uint32) for k in SIZES]
    chunks = {
        c: [pack_symbols(col[i : i + CHUNK_ROWS], k) for i in range(0, M, CHUNK_ROWS)]
        for c, col, k in zip(("alice", "bob"), cols, SIZES, strict=True)
    }

    def stubs(port: int) -> dict[str, pb_grpc.ReleaseServerStub]:
        return {
            n: pb_grpc.ReleaseServerStub(security.secure_channel(f"127.0.0.1:{port}", certs / n, n, peer_role="server"))
            for n in ("alice", "bob", "researcher")
        }

    def put(
        stub: pb_grpc.ReleaseServerStub, c: str, seqs: list[int], commit: bool = False
    ) -> pb.UploadResponse:
        msgs = [
            pb.UploadChunk(release_id="r", curator=c, sequence=s, symbols=chunks[c][s])
            for s in seqs
        ]
        if commit:
            msgs.append(
                pb.UploadChunk(
                    release_id="r",
                    curator=c,
                    commit=True,
                    num_chunks=3,
                    digest=hashlib.sha256(b"".join(chunks[c])).digest(),
                )
            )
        return stub.UploadCiphertext(iter(msgs), timeout=30)

    store = tmp_path / "store"
    proc, port = start(store, certs)
    try:
        s = stubs(port)
        for c in ("alice", "bob"):
            s[c].RegisterPart(pb.RegisterPartRequest(params=params, curator=c), timeout=10)
        assert put(s["alice"], "alice", [0]).chunks_stored == 1  # acknowledged
        assert put(s["alice"], "alice", [1]).chunks_stored == 2  # acknowledged
        assert put(s["bob"], "bob", [2]).chunks_stored == 1
    finally:
        kill9(proc)

    proc, port = start(store, certs)
    try:
        s = stubs(port)
        status = s["researcher"].GetReleaseStatus(pb.ReleaseStatusRequest(release_id="r"), timeout=10)
        assert status.state == pb.RELEASE_STATE_UPLOADING
        assert [c.symbols_stored for c in status.curators] == [2 * CHUNK_ROWS, 123]
        # identical re-sends are no-ops (a changed byte would be ALREADY_EXISTS): chunks intact
        assert put(s["alice"], "alice", [0, 1]).chunks_stored == 2
        assert put(s["alice"], "alice", [2], commit=True).committed
        done = put(s["bob"], "bob", [0, 1], commit=True)
        assert done.status.state == pb.RELEASE_STATE_PERTURBED
        before = list(s["researcher"].FetchPerturbed(pb.FetchRequest(release_id="r"), timeout=30))
    finally:
        kill9(proc)

    proc, port = start(store, certs)
    try:
        s = stubs(port)
        after = list(s["researcher"].FetchPerturbed(pb.FetchRequest(release_id="r"), timeout=30))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    assert before == after
    expected = perturb(cols, SIZES, PramChannel(params.gamma, 10), PramKey.from_hex(KEY_HEX))
    for j, k in enumerate(SIZES):
        got = np.concatenate([unpack_symbols(c.columns[j], k) for c in after])
        np.testing.assert_array_equal(got, expected[j])


def test_test_pram_key_refused_without_testing_env(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SECURE_RELEASE_TESTING"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "secure_release.server",
            "--store",
            str(tmp_path),
            "--insecure",
            "--insecure-test-pram-key",
            KEY_HEX,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "tests only" in out.stderr
