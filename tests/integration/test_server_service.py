"""The ReleaseServer over in-process mutual TLS: storage rules, status codes, PRAM once."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from support import SIZES, chunks_of, code_of, columns, make_params, register_all, upload

from secure_release.infra import tls
from secure_release.mechanism.primitives.keys import PramKey
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, unpack_symbols
from secure_release.mechanism.primitives.pram import PramChannel, perturb
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server.service import ReleaseService
from secure_release.server.state import ReleaseState
from secure_release.server.store import Store

KEY = PramKey(bytes(range(32)))
M = CHUNK_ROWS + 1000


@pytest.fixture
def env(certs: Path, tmp_path: Path) -> Iterator[tuple[Store, dict[str, pb_grpc.ReleaseServerStub]]]:
    store = Store(tmp_path / "store")
    server = tls.make_grpc_server(max_workers=4)
    pb_grpc.add_ReleaseServerServicer_to_server(ReleaseService(store, lambda: KEY), server)
    port = tls.bind(server, "127.0.0.1", 0, certs / "server", "server")
    server.start()
    names = ("alice", "bob", "carol", "researcher", "mallory")
    chans = {n: tls.secure_channel(f"127.0.0.1:{port}", certs / n, n, peer_role="server") for n in names}
    yield store, {n: pb_grpc.ReleaseServerStub(c) for n, c in chans.items()}
    for c in chans.values():
        c.close()
    server.stop(0).wait()
    store.close()


def test_pram_once_and_exact(env: tuple[Store, dict[str, pb_grpc.ReleaseServerStub]]) -> None:
    store, stubs = env
    register_all(stubs, make_params())
    cols = columns(M)
    fetch = lambda: list(stubs["researcher"].FetchPerturbed(pb.FetchRequest(release_id="r1"), timeout=30))  # noqa: E731
    a = upload(stubs["alice"], "alice", chunks_of(cols[0], 3))
    assert a.committed and a.status.state == pb.RELEASE_STATE_UPLOADING
    assert code_of(fetch) == grpc.StatusCode.FAILED_PRECONDITION
    b = upload(stubs["bob"], "bob", chunks_of(cols[1], 4))
    assert b.status.state == pb.RELEASE_STATE_PERTURBED
    first, second = fetch(), fetch()
    assert first == second and len(first) == 2 and first[-1].last
    # a researcher certificate without a grant for this release gets nothing
    ungranted = lambda: list(stubs["mallory"].FetchPerturbed(pb.FetchRequest(release_id="r1"), timeout=30))  # noqa: E731
    assert code_of(ungranted) == grpc.StatusCode.PERMISSION_DENIED
    expected = perturb(cols, SIZES, PramChannel(make_params().gamma, 12), KEY)
    got = [np.concatenate([unpack_symbols(c.columns[j], k) for c in first]) for j, k in enumerate(SIZES)]
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(e, g)
    digest = hashlib.sha256(b"".join(col for c in first for col in c.columns)).digest()
    assert first[-1].digest == digest == b.status.perturbed_digest
    # after sealing (and PRAM, which erased the pre-PRAM bytes) an identical replay of a chunk
    # or of the whole upload with its commit still succeeds; different bytes are refused
    assert upload(stubs["alice"], "alice", chunks_of(cols[0], 3)).committed
    changed = chunks_of((cols[0] + 1) % 3, 3)[:1]
    assert code_of(lambda: upload(stubs["alice"], "alice", changed, False)) == grpc.StatusCode.FAILED_PRECONDITION
    assert store.chunk_bytes("r1", "alice", 0) == b""  # data minimisation: pre-PRAM bytes erased
    # a second PRAM request never re-perturbs
    assert store.perturb("r1", PramKey.generate).perturbed_digest == digest


def test_a_commit_whose_client_dies_before_closing_the_stream_is_still_perturbed(
    env: tuple[Store, dict[str, pb_grpc.ReleaseServerStub]],
) -> None:
    """The fault found by kill -9 in CI: the last curator's commit message sealed the release,
    then the curator died before half-closing its stream; the server must perturb anyway."""
    store, stubs = env
    register_all(stubs, make_params())
    cols = columns(M)
    upload(stubs["alice"], "alice", chunks_of(cols[0], 3))
    parts = chunks_of(cols[1], 4)
    hold = threading.Event()

    def messages() -> Iterator[pb.UploadChunk]:
        for s, b in enumerate(parts):
            yield pb.UploadChunk(release_id="r1", curator="bob", sequence=s, symbols=b)
        yield pb.UploadChunk(release_id="r1", curator="bob", commit=True, num_chunks=len(parts),
                             digest=hashlib.sha256(b"".join(parts)).digest())  # fmt: skip
        hold.wait(30)  # the stream stays open: no half-close follows the commit

    call = stubs["bob"].UploadCiphertext.future(messages(), timeout=30)
    end = time.monotonic() + 20
    while store.release("r1").state < ReleaseState.SEALED and time.monotonic() < end:
        time.sleep(0.01)
    assert not call.done()  # sealed while the stream is still open (.future() returns at once)
    call.cancel()  # the client dies
    hold.set()
    while store.release("r1").state != ReleaseState.PERTURBED and time.monotonic() < end:
        time.sleep(0.01)
    assert store.release("r1").state == ReleaseState.PERTURBED
    expected = perturb(cols, SIZES, PramChannel(make_params().gamma, 12), KEY)
    first = list(stubs["researcher"].FetchPerturbed(pb.FetchRequest(release_id="r1"), timeout=30))
    got = [np.concatenate([unpack_symbols(c.columns[j], k) for c in first]) for j, k in enumerate(SIZES)]
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(e, g)


def test_chunk_rules(env: tuple[Store, dict[str, pb_grpc.ReleaseServerStub]]) -> None:
    store, stubs = env
    register_all(stubs, make_params())
    c0 = chunks_of(columns(M)[0], 3)
    r = upload(stubs["alice"], "alice", c0[:1], commit=False)
    assert r.chunks_stored == 1 and r.symbols_stored == CHUNK_ROWS
    r = upload(stubs["alice"], "alice", c0[:1], commit=False)  # identical repeat: no-op
    assert r.chunks_stored == 1
    other = bytearray(c0[0])
    other[0] = (other[0] + 1) % 3
    assert code_of(lambda: upload(stubs["alice"], "alice", [bytes(other)], False)) == grpc.StatusCode.ALREADY_EXISTS
    assert store.chunk_bytes("r1", "alice", 0) == c0[0]
    # bad chunks leave nothing behind
    bad_range = bytearray(c0[1])
    bad_range[-1] = 3
    for bad in (bytes(bad_range), c0[1][:-1], b"\x07" * (1 << 20)):
        msgs = [pb.UploadChunk(release_id="r1", curator="alice", sequence=1, symbols=bad)]
        assert (
            code_of(lambda m=msgs: stubs["alice"].UploadCiphertext(iter(m), timeout=5))
            == grpc.StatusCode.INVALID_ARGUMENT
        )
        assert 1 not in store.release("r1").parts["alice"].chunks
    oversized = [pb.UploadChunk(release_id="r1", curator="alice", sequence=1, symbols=b"\0" * ((1 << 20) + 65))]
    assert (
        code_of(lambda: stubs["alice"].UploadCiphertext(iter(oversized), timeout=5)) == grpc.StatusCode.INVALID_ARGUMENT
    )
    # a curator cannot upload for another curator
    assert code_of(lambda: upload(stubs["bob"], "alice", c0[1:], False)) == grpc.StatusCode.PERMISSION_DENIED
    # commit with a wrong digest is refused and the part stays open
    msgs = [
        pb.UploadChunk(release_id="r1", curator="alice", sequence=1, symbols=c0[1]),
        pb.UploadChunk(release_id="r1", curator="alice", commit=True, num_chunks=2, digest=b"\0" * 32),
    ]
    assert (
        code_of(lambda: stubs["alice"].UploadCiphertext(iter(msgs), timeout=5)) == grpc.StatusCode.FAILED_PRECONDITION
    )
    assert not store.release("r1").parts["alice"].committed


def test_registration_errors(env: tuple[Store, dict[str, pb_grpc.ReleaseServerStub]]) -> None:
    _, stubs = env
    p = make_params()
    stubs["alice"].RegisterPart(pb.RegisterPartRequest(params=p, curator="alice"), timeout=5)
    # bob's different spec does not lock alice out: it is a competing candidate that nobody
    # else agreed to; bob, having registered it, cannot register another spec for this id
    stubs["bob"].RegisterPart(pb.RegisterPartRequest(params=make_params(m=M + 1), curator="bob"), timeout=5)
    for wrong in (p, make_params(sizes=(3, 5), m=M)):
        req = pb.RegisterPartRequest(params=wrong, curator="bob")
        assert code_of(lambda r=req: stubs["bob"].RegisterPart(r, timeout=5)) == grpc.StatusCode.FAILED_PRECONDITION
    mine = stubs["alice"].GetReleaseStatus(pb.ReleaseStatusRequest(release_id="r1"), timeout=5)
    assert mine.params.m == M and [c.registered for c in mine.curators] == [True, False]
    wrong_n = pb.ReleaseParams()
    wrong_n.CopyFrom(p)
    wrong_n.n = p.n + 1  # gamma no longer follows from epsilon: invalid outright
    req = pb.RegisterPartRequest(params=wrong_n, curator="bob")
    assert code_of(lambda: stubs["bob"].RegisterPart(req, timeout=5)) == grpc.StatusCode.INVALID_ARGUMENT
    req = pb.RegisterPartRequest(params=p, curator="alice")  # bob registering as alice
    assert code_of(lambda: stubs["bob"].RegisterPart(req, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    # nothing is bound yet, so a researcher sees no release r1
    status_r1 = lambda: stubs["researcher"].GetReleaseStatus(pb.ReleaseStatusRequest(release_id="r1"), timeout=5)  # noqa: E731
    assert code_of(status_r1) == grpc.StatusCode.NOT_FOUND
    assert (
        code_of(lambda: stubs["researcher"].GetReleaseStatus(pb.ReleaseStatusRequest(release_id="nope"), timeout=5))
        == grpc.StatusCode.NOT_FOUND
    )
    assert (
        code_of(lambda: list(stubs["researcher"].FetchPerturbed(pb.FetchRequest(release_id="nope"), timeout=5)))
        == grpc.StatusCode.NOT_FOUND
    )


def test_a_squatter_cannot_lock_out_the_agreed_curators(
    env: tuple[Store, dict[str, pb_grpc.ReleaseServerStub]],
) -> None:
    """carol (a curator certificate) registers release r1 first, naming herself and bob, and
    uploads; alice and bob then register the spec they agreed on: theirs binds, carol's is gone."""
    store, stubs = env
    carol = stubs["carol"]
    squat = pb.ReleaseParams()
    squat.CopyFrom(make_params(m=M))
    squat.curators[:] = ["carol", "bob"]
    carol.RegisterPart(pb.RegisterPartRequest(params=squat, curator="carol"), timeout=5)
    carol_chunk = chunks_of(columns(M)[0], 3)[:1]
    upload(carol, "carol", carol_chunk, commit=False)
    register_all(stubs, make_params(m=M))  # alice and bob: bound
    status = stubs["researcher"].GetReleaseStatus(pb.ReleaseStatusRequest(release_id="r1"), timeout=5)
    assert list(status.params.curators) == ["alice", "bob"] and all(c.registered for c in status.curators)
    assert code_of(lambda: upload(carol, "carol", carol_chunk, commit=False)) == grpc.StatusCode.PERMISSION_DENIED
    for c, col, k in zip(("alice", "bob"), columns(M), SIZES, strict=True):
        assert upload(stubs[c], c, chunks_of(col, k)).committed
    assert store.release("r1").state.name == "PERTURBED"
