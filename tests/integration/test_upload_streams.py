"""A curator's upload in several ordered streams against a real (in-process, mutual TLS) release
server: the same stored bytes and the same seal whatever the number of streams, a resumed upload
that sends only the missing chunks, two interleaved streams of one curator both stored, and
refused chunks that leave the release exactly as it was."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from support import SIZES, code_of, columns, make_spec
from test_lifecycle_resume import _config

from secure_release.curator.errors import ReleaseAbortedError, UploadRefusedError
from secure_release.curator.release.upload import (
    ServerLink,
    UploadStreamsError,
    chunk_packer,
    pack_chunks,
    split_runs,
)
from secure_release.curator.waits import Deadline
from secure_release.infra import tls
from secure_release.infra.logs import EventLog
from secure_release.mechanism.errors import ShapeMismatchError
from secure_release.mechanism.primitives.keys import PramKey
from secure_release.mechanism.primitives.packing import CHUNK_ROWS
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server.service import ReleaseService
from secure_release.server.store import Store

LOG = EventLog("curator", "test")
KEY = PramKey(bytes(range(32)))
M = 6 * CHUNK_ROWS + 1000  # 7 chunks, the last one short
SPEC = make_spec(m=M, n=8 * CHUNK_ROWS)
COMMIT = "commit"


class RecordingService(ReleaseService):
    """The release service, recording what each UploadCiphertext call carried (its sequence
    numbers, or COMMIT) in the order the server read it; ``drop`` holds (curator, seq) pairs to
    refuse once with UNAVAILABLE, as a server that went away mid-stream would."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, lambda: KEY)
        self.calls: list[tuple[str, list[int | str]]] = []  # (curator, what the call carried)
        self.reads: list[tuple[str, int | str]] = []  # (curator, seq or COMMIT) of every message, as read
        self.drop: set[tuple[str, int]] = set()
        self.changed = threading.Condition()

    def UploadCiphertext(self, request_iterator: Iterator[pb.UploadChunk], context: Any) -> pb.UploadResponse:  # noqa: N802
        carried: list[int | str] = []
        with self.changed:
            self.calls.append(("", carried))
            index = len(self.calls) - 1

        def recorded() -> Iterator[pb.UploadChunk]:
            for msg in request_iterator:
                with self.changed:
                    self.calls[index] = (msg.curator, carried)
                    carried.append(COMMIT if msg.commit else int(msg.sequence))
                    self.reads.append((msg.curator, carried[-1]))
                    self.changed.notify_all()
                if not msg.commit and (msg.curator, msg.sequence) in self.drop:
                    self.drop.discard((msg.curator, msg.sequence))
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the server went away (test)")
                yield msg

        return super().UploadCiphertext(recorded(), context)

    def received(self, curator: str) -> list[int]:
        """Every data chunk ``curator`` sent, in the order the server read them (repeats kept)."""
        with self.changed:
            return [s for who, s in self.reads if who == curator and isinstance(s, int)]

    def calls_of(self, curator: str) -> list[list[int | str]]:
        with self.changed:
            return [list(carried) for who, carried in self.calls if who == curator]

    def wait_received(self, curator: str, count: int, timeout: float = 20.0) -> None:
        """Block until the server has read ``count`` data chunks of ``curator``."""
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.received(curator)) >= count, timeout), "no chunk came"


@dataclass
class Served:
    """One in-process release server and the curators' links to it."""

    service: RecordingService
    store: Store
    links: dict[str, ServerLink]


@pytest.fixture
def serve(certs: Path, tmp_path: Path) -> Iterator[Callable[[str], Served]]:
    """Start a server with its own store (named ``name``), both curators registered for SPEC."""
    started: list[tuple[grpc.Server, Served]] = []

    def start(name: str) -> Served:
        store = Store(tmp_path / name)
        service = RecordingService(store)
        server = tls.make_grpc_server(max_workers=8)
        pb_grpc.add_ReleaseServerServicer_to_server(service, server)
        port = tls.bind(server, "127.0.0.1", 0, certs / "server", "server")
        server.start()
        links = {c: ServerLink(_config(c, port, certs, tmp_path), LOG, Deadline(30.0)) for c in SPEC.curators}
        served = Served(service, store, links)
        started.append((server, served))
        for link in links.values():
            link.register(SPEC)
        return served

    yield start
    for server, served in started:
        for link in served.links.values():
            link.close()
        server.stop(0).wait()
        served.store.close()


def _send(link: ServerLink, messages: list[pb.UploadChunk]) -> pb.UploadResponse:
    """One UploadCiphertext call of exactly ``messages`` (a crashed or hand-made upload)."""
    response: pb.UploadResponse = link.stub.UploadCiphertext(iter(messages), timeout=30)
    return response


def _chunk(curator: str, seq: int, data: bytes) -> pb.UploadChunk:
    return pb.UploadChunk(release_id="r1", curator=curator, sequence=seq, symbols=data)


def test_one_stream_or_three_store_the_same_bytes_and_seal_the_same(serve: Callable[[str], Served]) -> None:
    cols = columns(M)
    outcome = {}
    for streams in (1, 3):
        served = serve(f"store-{streams}")
        served.links["alice"].upload(SPEC, cols[0], streams=streams)
        stored = [served.store.chunk_bytes("r1", "alice", seq) for seq in range(SPEC.num_chunks)]
        part = served.store.release("r1", "alice").parts["alice"]
        served.links["bob"].upload(SPEC, cols[1], streams=streams)
        sealed = served.links["bob"].wait_sealed()
        outcome[streams] = (stored, part.committed, part.digest, sealed.state, sealed.perturbed_digest)
        # the missing chunks went as ordered contiguous runs, one call each; the commit alone, last
        data_calls, commit_call = served.service.calls_of("alice")[:-1], served.service.calls_of("alice")[-1]
        assert sorted(data_calls) == [list(run) for run in split_runs(range(SPEC.num_chunks), streams)]
        assert commit_call == [COMMIT]
    assert outcome[1] == outcome[3]
    stored, committed, _, state, _ = outcome[3]
    assert stored == pack_chunks(cols[0], SIZES[0]) and committed and state == pb.RELEASE_STATE_PERTURBED


@pytest.mark.parametrize("streams", [1, 3])
def test_an_interrupted_upload_resumes_sending_only_the_missing_chunks(
    serve: Callable[[str], Served], streams: int
) -> None:
    served = serve("store")
    served.service.drop = {("alice", 4)}  # the server goes away when chunk 4 arrives, once
    col = columns(M)[0]
    served.links["alice"].upload(SPEC, col, streams=streams)
    received = served.service.received("alice")
    assert sorted(received) == [0, 1, 2, 3, 4, 4, 5, 6]  # only the chunk that was lost is sent twice
    calls = served.service.calls_of("alice")
    if streams == 1:
        assert calls == [[0, 1, 2, 3, 4], [4, 5, 6], [COMMIT]]
    else:
        assert sorted(calls[:3]) == [[0, 1, 2], [3, 4], [5, 6]] and calls[3:] == [[4], [COMMIT]]
    assert [served.store.chunk_bytes("r1", "alice", s) for s in range(SPEC.num_chunks)] == pack_chunks(col, SIZES[0])
    assert served.store.release("r1", "alice").parts["alice"].committed


def test_a_restarted_upload_sends_only_what_the_server_lacks(serve: Callable[[str], Served]) -> None:
    served = serve("store")
    col = columns(M)[0]
    chunk_of = chunk_packer(col, SIZES[0])
    _send(served.links["alice"], [_chunk("alice", s, chunk_of(s)) for s in (0, 3, 6)])  # then it "crashed"
    served.links["alice"].upload_chunks(SPEC, SPEC.num_chunks, chunk_of, streams=2)
    calls = served.service.calls_of("alice")
    assert sorted(calls[1:3]) == [[1, 2], [4, 5]] and calls[3:] == [[COMMIT]]  # two runs of the missing, commit
    assert served.store.release("r1", "alice").parts["alice"].committed
    served.links["alice"].upload_chunks(SPEC, SPEC.num_chunks, chunk_of, streams=2)  # a replay once committed
    assert len(served.service.calls_of("alice")) == 4  # nothing sent: the server said committed


def test_two_interleaved_streams_of_one_curator_are_both_stored(serve: Callable[[str], Served]) -> None:
    served = serve("store")
    chunk_of = chunk_packer(columns(M)[0], SIZES[0])
    stub = served.links["alice"].stub

    def alternate(seqs: range) -> Iterator[pb.UploadChunk]:
        """Chunk s only once the server has read chunks 0..s-1 (half of them from the other stream)."""
        for seq in seqs:
            served.service.wait_received("alice", seq)
            yield _chunk("alice", seq, chunk_of(seq))

    evens = stub.UploadCiphertext.future(alternate(range(0, SPEC.num_chunks, 2)), timeout=30)
    odds = stub.UploadCiphertext.future(alternate(range(1, SPEC.num_chunks, 2)), timeout=30)
    assert evens.result().chunks_stored + odds.result().chunks_stored >= SPEC.num_chunks
    assert served.service.received("alice") == list(range(SPEC.num_chunks))  # interleaved, one server read each
    assert sorted(served.service.calls_of("alice")) == [[0, 2, 4, 6], [1, 3, 5]]
    digest = served.store.release("r1", "alice").parts["alice"].chunks
    assert sorted(digest) == list(range(SPEC.num_chunks))
    served.links["alice"].upload_chunks(SPEC, SPEC.num_chunks, chunk_of)  # only the commit is left to send
    assert served.service.calls_of("alice")[-1] == [COMMIT]
    assert [served.store.chunk_bytes("r1", "alice", s) for s in range(SPEC.num_chunks)] == [
        chunk_of(s) for s in range(SPEC.num_chunks)
    ]


def test_a_conflicting_chunk_is_refused_and_stores_nothing(serve: Callable[[str], Served]) -> None:
    served = serve("store")
    col = columns(M)[0]
    chunk_of = chunk_packer(col, SIZES[0])
    link = served.links["alice"]
    _send(link, [_chunk("alice", s, chunk_of(s)) for s in range(3)])
    before = served.store.release("r1", "alice")
    other = chunk_packer((col + 1) % SIZES[0], SIZES[0])(1)
    with pytest.raises(grpc.RpcError) as refused:
        _send(link, [_chunk("alice", 1, other)])
    err = refused.value
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and "ConflictingChunkError" in err.details()
    assert served.store.release("r1", "alice") == before
    assert served.store.chunk_bytes("r1", "alice", 1) == chunk_of(1)
    assert _send(link, [_chunk("alice", 1, chunk_of(1))]).chunks_stored == 3  # an identical replay succeeds
    assert served.store.release("r1", "alice") == before
    link.upload(SPEC, col, streams=3)
    assert served.store.release("r1", "alice").parts["alice"].committed


def test_a_refused_chunk_leaves_the_release_as_it_was(serve: Callable[[str], Served]) -> None:
    """Chunks are checked on the server's live state (no copy a chunk): a refused chunk, or one
    whose write fails, must not change it, not even REGISTERED -> UPLOADING."""
    served = serve("store")
    store, link = served.store, served.links["alice"]
    good = chunk_packer(columns(M)[0], SIZES[0])(0)
    before = store.release("r1", "alice")
    assert before.state.name == "REGISTERED"
    refused = [
        (_chunk("alice", 0, good[:-1]), grpc.StatusCode.INVALID_ARGUMENT),  # one symbol short
        (_chunk("alice", 0, bytes([SIZES[0]]) * CHUNK_ROWS), grpc.StatusCode.INVALID_ARGUMENT),  # symbol 3 of Z_3
        (_chunk("alice", SPEC.num_chunks, good), grpc.StatusCode.INVALID_ARGUMENT),  # past the last chunk
        (_chunk("bob", 0, good), grpc.StatusCode.PERMISSION_DENIED),  # alice acting for bob
    ]
    for msg, code in refused:
        assert code_of(lambda msg=msg: _send(link, [msg])) == code
        assert store.release("r1", "alice") == before
    (pages,) = store._db.execute("PRAGMA page_count").fetchone()
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # the write fails: a full disk
    assert code_of(lambda: _send(link, [_chunk("alice", 0, good)])) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert store.release("r1", "alice") == before
    store._db.execute("PRAGMA max_page_count = 1073741823")
    _send(link, [_chunk("alice", 0, good)])
    after = store.release("r1", "alice")
    assert after.state.name == "UPLOADING" and list(after.parts["alice"].chunks) == [0]


def test_refusals_are_reported_as_refused_or_aborted(serve: Callable[[str], Served]) -> None:
    served = serve("store")
    col = columns(M)[0]
    link = served.links["alice"]
    chunk_of = chunk_packer(col, SIZES[0])
    with pytest.raises(ShapeMismatchError):
        link.upload_chunks(SPEC, SPEC.num_chunks - 1, chunk_of)
    with pytest.raises(UploadStreamsError):
        link.upload_chunks(SPEC, SPEC.num_chunks, chunk_of, streams=0)
    assert served.service.calls_of("alice") == []  # refused before anything was sent
    _send(link, [_chunk("alice", s, chunk_of(s)) for s in range(3)])
    changed = chunk_packer((col + 1) % SIZES[0], SIZES[0])  # the curator's bytes changed since
    with pytest.raises(UploadRefusedError, match="digest mismatch"):
        link.upload_chunks(SPEC, SPEC.num_chunks, changed, streams=3)
    served.links["bob"].abort("the operator stopped it")
    with pytest.raises(ReleaseAbortedError, match="the operator stopped it"):
        link.upload(SPEC, col, streams=3)
