"""Bad input to the release server's RPCs, one case a row: each gets the right status code and
a message that names the problem, and leaves nothing stored (no release, no chunk, no state)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from secure_release.infra import tls
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server.service import ReleaseService
from secure_release.server.store import Store
from tests import support

M = CHUNK_ROWS + 10
C = grpc.StatusCode


@pytest.fixture(scope="module")
def live(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, Any]]]:
    store = Store(tmp_path_factory.mktemp("store"))
    server = tls.make_grpc_server()
    pb_grpc.add_ReleaseServerServicer_to_server(ReleaseService(store), server)
    port = tls.bind(server, "127.0.0.1", 0, certs / "server", "server")
    server.start()
    names = ("alice", "bob", "carol", "researcher", "mallory")
    chans = {n: tls.secure_channel(f"127.0.0.1:{port}", certs / n, n, peer_role="server") for n in names}
    stubs = {n: pb_grpc.ReleaseServerStub(c) for n, c in chans.items()}
    # one release to upload into ("open"), one sealed and perturbed ("done")
    for rid in ("open", "done"):
        support.register_all(stubs, support.make_params(rid=rid, m=M))
    for c, col, k in zip(support.CURATORS, support.columns(M), support.SIZES, strict=True):
        support.upload(stubs[c], c, support.chunks_of(col, k), rid="done")
    yield store, stubs
    for ch in chans.values():
        ch.close()
    server.stop(0).wait()
    store.close()


def params(**change: Any) -> pb.ReleaseParams:
    """A valid release 'bad' with one field changed (after the valid spec was built)."""
    p = support.make_params(rid="bad", m=M)
    for field, value in change.items():
        if isinstance(value, list):
            del getattr(p, field)[:]
            getattr(p, field).extend(value)
        else:
            setattr(p, field, value)
    return p


def register(p: pb.ReleaseParams, curator: str = "alice") -> Callable[[dict[str, Any]], object]:
    return lambda stubs: stubs[curator].RegisterPart(pb.RegisterPartRequest(params=p, curator=curator), timeout=5)


GOOD = support.make_params(rid="bad", m=M)
REGISTER_CASES: list[tuple[str, pb.ReleaseParams, grpc.StatusCode, str]] = [
    ("empty release id", params(release_id=""), C.INVALID_ARGUMENT, "release id"),
    ("release id with newline", params(release_id="bad\n"), C.INVALID_ARGUMENT, "release id"),
    ("release id with slash", params(release_id="a/b"), C.INVALID_ARGUMENT, "release id"),
    ("release id ../x", params(release_id="../x"), C.INVALID_ARGUMENT, "release id"),
    ("release id of 129 characters", params(release_id="r" * 129), C.INVALID_ARGUMENT, "release id"),
    ("empty curator name", params(curators=["alice", ""]), C.INVALID_ARGUMENT, "curator"),
    ("curator name ../x", params(curators=["alice", "../x"]), C.INVALID_ARGUMENT, "curator"),
    ("upper-case curator name", params(curators=["alice", "Bob"]), C.INVALID_ARGUMENT, "DNS label"),
    ("duplicate curators", params(curators=["alice", "alice"]), C.INVALID_ARGUMENT, "distinct"),
    ("one curator", params(curators=["alice"], alphabet_sizes=[3]), C.INVALID_ARGUMENT, "at least 2"),
    ("17 curators", params(curators=[f"c{i}" for i in range(17)], alphabet_sizes=[2] * 17,
                           gamma=support.make_params(rid="bad", m=M, sizes=(2,) * 17).gamma),
     C.RESOURCE_EXHAUSTED, "17 curators"),
    ("n = 0", params(n=0), C.INVALID_ARGUMENT, "n"),
    ("m = 0", params(m=0), C.INVALID_ARGUMENT, "m"),
    ("m > n", params(m=GOOD.n + 1), C.INVALID_ARGUMENT, "m"),
    ("epsilon 0", params(epsilon=0.0), C.INVALID_ARGUMENT, "epsilon"),
    ("negative epsilon", params(epsilon=-1.0), C.INVALID_ARGUMENT, "epsilon"),
    ("NaN epsilon", params(epsilon=math.nan), C.INVALID_ARGUMENT, "epsilon"),
    ("infinite epsilon", params(epsilon=math.inf), C.INVALID_ARGUMENT, "epsilon"),
    ("gamma not from Eq. 2", params(gamma=GOOD.gamma * 1.5), C.INVALID_ARGUMENT, "above the declared"),
    ("gamma one ulp above Eq. 2", params(gamma=math.nextafter(GOOD.gamma, math.inf)), C.INVALID_ARGUMENT, "above the declared"),
    ("gamma well below Eq. 2", params(gamma=GOOD.gamma * 0.5), C.INVALID_ARGUMENT, "does not follow"),
    ("NaN gamma", params(gamma=math.nan), C.INVALID_ARGUMENT, "gamma"),
    ("gamma 1", params(gamma=1.0), C.INVALID_ARGUMENT, "gamma"),
    ("alphabet size 0", params(alphabet_sizes=[0, 4]), C.INVALID_ARGUMENT, "alphabet size"),
    ("alphabet size 2^33", params(alphabet_sizes=[1 << 33, 4]), C.INVALID_ARGUMENT, "exceeds"),
    ("three sizes for two curators", params(alphabet_sizes=[3, 4, 5]), C.INVALID_ARGUMENT, "alphabet sizes"),
    ("joint alphabet overflow", params(alphabet_sizes=[1 << 31, 1 << 31, 1 << 31], curators=["alice", "bob", "carol"]),
     C.INVALID_ARGUMENT, "joint alphabet"),
    ("unspecified cipher", params(cipher=0), C.INVALID_ARGUMENT, "cipher"),
    ("unknown cipher 99", params(cipher=99), C.INVALID_ARGUMENT, "cipher"),
    ("bad researcher name", params(researchers=["Res/1"]), C.INVALID_ARGUMENT, "researcher"),
    ("n = 2^62", support.make_params(rid="bad", n=1 << 62, m=M), C.RESOURCE_EXHAUSTED, "limit"),
    ("m = 2^62", support.make_params(rid="bad", n=1 << 62, m=1 << 62), C.RESOURCE_EXHAUSTED, "limit"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "bad", "code", "words"), REGISTER_CASES, ids=[c[0] for c in REGISTER_CASES])
def test_bad_registration(live: tuple[Store, dict[str, Any]], name: str, bad: pb.ReleaseParams,
                          code: grpc.StatusCode, words: str) -> None:  # fmt: skip
    store, stubs = live
    with pytest.raises(grpc.RpcError) as err:
        register(bad)(stubs)
    assert err.value.code() == code, err.value.details()
    assert words in (err.value.details() or ""), err.value.details()
    assert err.value.details().split(":")[0].endswith("Error")  # a named error
    with pytest.raises(Exception, match="no release"):
        store.release(bad.release_id or "bad")


def chunk(seq: int = 0, data: bytes | None = None, rid: str = "open", curator: str = "alice") -> pb.UploadChunk:
    if data is None:
        data = pack_symbols(support.columns(CHUNK_ROWS)[0], 3)
    return pb.UploadChunk(release_id=rid, curator=curator, sequence=seq, symbols=data)


def commit(num: int, digest: bytes = b"\0" * 32, rid: str = "open") -> pb.UploadChunk:
    return pb.UploadChunk(release_id=rid, curator="alice", commit=True, num_chunks=num, digest=digest)


UPLOAD_CASES: list[tuple[str, str, list[pb.UploadChunk], grpc.StatusCode, str]] = [
    ("unknown release", "alice", [chunk(rid="nope")], C.NOT_FOUND, "no release"),
    ("empty stream", "alice", [], C.INVALID_ARGUMENT, "at least one message"),
    ("two releases in one stream", "alice",
     [chunk(rid="done", data=support.chunks_of(support.columns(M)[0], 3)[0]), chunk()],  # a replay, then another id
     C.INVALID_ARGUMENT, "one release"),
    ("symbol out of range", "alice", [chunk(data=b"\x03" * CHUNK_ROWS)], C.INVALID_ARGUMENT, "outside"),
    ("partial symbol bytes", "bob", [chunk(data=b"\x00" * 3, curator="bob")], C.INVALID_ARGUMENT, ""),
    ("oversized chunk", "alice", [chunk(data=b"\x00" * ((1 << 20) + 65))], C.INVALID_ARGUMENT, "at most"),
    ("sequence out of range", "alice", [chunk(seq=7)], C.INVALID_ARGUMENT, "out of range"),
    ("short chunk", "alice", [chunk(seq=1, data=b"\x00" * 5)], C.INVALID_ARGUMENT, "exactly"),
    ("upload as another curator", "bob", [chunk()], C.PERMISSION_DENIED, "may not act for"),
    ("a non-member uploads", "carol", [chunk(curator="carol")], C.PERMISSION_DENIED, "not a curator"),
    ("commit with the wrong count", "alice", [commit(99)], C.FAILED_PRECONDITION, "needs 2"),
    ("commit with chunks missing", "alice", [commit(2)], C.FAILED_PRECONDITION, "missing"),
    ("upload into a perturbed release", "alice", [chunk(rid="done", data=b"\x01" * CHUNK_ROWS)],
     C.FAILED_PRECONDITION, "perturbed"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "who", "msgs", "code", "words"), UPLOAD_CASES, ids=[c[0] for c in UPLOAD_CASES])
def test_bad_upload(live: tuple[Store, dict[str, Any]], name: str, who: str, msgs: list[pb.UploadChunk],
                    code: grpc.StatusCode, words: str) -> None:  # fmt: skip
    store, stubs = live
    before = {c: dict(p.chunks) for c, p in store.release("open").parts.items()}
    with pytest.raises(grpc.RpcError) as err:
        stubs[who].UploadCiphertext(iter(msgs), timeout=5)
    assert err.value.code() == code, err.value.details()
    assert words in (err.value.details() or ""), err.value.details()
    after = store.release("open")
    assert {c: dict(p.chunks) for c, p in after.parts.items()} == before
    assert not any(p.committed for p in after.parts.values())


def test_conflicting_chunk_and_wrong_digest(live: tuple[Store, dict[str, Any]]) -> None:
    store, stubs = live
    good = chunk()
    stubs["alice"].UploadCiphertext(iter([good]), timeout=5)
    other = chunk(data=bytes((b + 1) % 3 for b in good.symbols))
    with pytest.raises(grpc.RpcError) as err:
        stubs["alice"].UploadCiphertext(iter([other]), timeout=5)
    assert err.value.code() == C.ALREADY_EXISTS and "different bytes" in (err.value.details() or "")
    last = chunk(seq=1, data=b"\x00" * 10)
    digest = hashlib.sha256(good.symbols + last.symbols).digest()
    with pytest.raises(grpc.RpcError) as err:
        stubs["alice"].UploadCiphertext(iter([last, commit(2, b"\1" * 32)]), timeout=5)
    assert err.value.code() == C.FAILED_PRECONDITION and "digest mismatch" in (err.value.details() or "")
    assert not store.release("open").parts["alice"].committed
    assert digest  # the right digest would have committed (not sent: the release stays open)


OTHER_CASES: list[tuple[str, str, Callable[[Any], object], grpc.StatusCode, str]] = [
    ("status of an unknown release", "researcher",
     lambda s: s.GetReleaseStatus(pb.ReleaseStatusRequest(release_id="nope"), timeout=5), C.NOT_FOUND, "no release"),
    ("fetch of an unknown release", "researcher",
     lambda s: list(s.FetchPerturbed(pb.FetchRequest(release_id="nope"), timeout=5)), C.NOT_FOUND, "no release"),
    ("fetch before PRAM", "researcher",
     lambda s: list(s.FetchPerturbed(pb.FetchRequest(release_id="open"), timeout=5)), C.FAILED_PRECONDITION,
     "not perturbed"),
    ("fetch without a grant", "mallory",
     lambda s: list(s.FetchPerturbed(pb.FetchRequest(release_id="done"), timeout=5)), C.PERMISSION_DENIED,
     "not granted"),
    ("abort an unknown release", "alice",
     lambda s: s.AbortRelease(pb.AbortRequest(release_id="nope", curator="alice"), timeout=5), C.NOT_FOUND, "no release"),
    ("abort for another curator", "alice",
     lambda s: s.AbortRelease(pb.AbortRequest(release_id="open", curator="bob"), timeout=5), C.PERMISSION_DENIED,
     "may not act for"),
    ("abort by a non-member", "carol",
     lambda s: s.AbortRelease(pb.AbortRequest(release_id="open", curator="carol"), timeout=5), C.PERMISSION_DENIED,
     "not a curator"),
    ("abort after sealing", "alice",
     lambda s: s.AbortRelease(pb.AbortRequest(release_id="done", curator="alice"), timeout=5), C.FAILED_PRECONDITION,
     "can no longer be aborted"),
    ("register for another curator", "bob",
     lambda s: s.RegisterPart(pb.RegisterPartRequest(params=support.make_params(rid="open", m=M), curator="alice"),
                              timeout=5), C.PERMISSION_DENIED, "may not register"),
    ("register with a different m", "bob",
     lambda s: s.RegisterPart(pb.RegisterPartRequest(params=support.make_params(rid="open", m=M + 1), curator="bob"),
                              timeout=5), C.FAILED_PRECONDITION, "declared different"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "who", "call", "code", "words"), OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_bad_other_calls(live: tuple[Store, dict[str, Any]], name: str, who: str, call: Callable[[Any], object],
                         code: grpc.StatusCode, words: str) -> None:  # fmt: skip
    store, stubs = live
    states = {r: store.release(r).state for r in ("open", "done")}
    with pytest.raises(grpc.RpcError) as err:
        call(stubs[who])
    assert err.value.code() == code, err.value.details()
    assert words in (err.value.details() or ""), err.value.details()
    assert {r: store.release(r).state for r in ("open", "done")} == states


# --------------------------------------------------------------- stored tables (server-side sampling)
TN, TK = 1000, (3, 4)  # a one-chunk stored table


def tchunk(curator: str = "alice", tid: str = "t1", n: int = TN, k: int | None = None, seq: int = 0,
           data: bytes | None = None, curators: tuple[str, ...] = support.CURATORS) -> pb.TableChunk:  # fmt: skip
    k = TK[support.CURATORS.index(curator)] if k is None and curator in support.CURATORS else (k or 3)
    if data is None:
        data = pack_symbols(support.columns(TN, TK)[support.CURATORS.index(curator) if curator != "carol" else 0], k)
    return pb.TableChunk(table_id=tid, curator=curator, curators=list(curators), n=n, alphabet_size=k, sequence=seq,
                         symbols=data)  # fmt: skip


def tcommit(chunk: pb.TableChunk, digest: bytes | None = None) -> pb.TableChunk:
    done = pb.TableChunk()
    done.CopyFrom(chunk)
    done.symbols, done.commit, done.num_chunks = b"", True, 1
    done.digest = digest if digest is not None else hashlib.sha256(chunk.symbols).digest()
    return done


def sspec(rid: str, tid: str = "t1", n: int = TN, sizes: tuple[int, ...] = TK) -> pb.ReleaseParams:
    params = support.make_params(rid=rid, m=100, n=n, sizes=sizes)
    params.kind, params.table_id = pb.RELEASE_KIND_SERVER_SAMPLED, tid
    return params


@pytest.fixture(scope="module")
def tables_live(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, Any]]]:
    """A complete table t1, a table 'half' only alice committed, an open server-sampled release
    'sr' of t1 (sample drawn) and a curator-sampled release 'cs'."""
    from secure_release.server.state import ServerLimits

    store = Store(tmp_path_factory.mktemp("tables"), ServerLimits(max_table_rows=10_000))
    server = tls.make_grpc_server()
    pb_grpc.add_ReleaseServerServicer_to_server(ReleaseService(store), server)
    port = tls.bind(server, "127.0.0.1", 0, certs / "server", "server")
    server.start()
    names = ("alice", "bob", "carol", "researcher")
    chans = {n: tls.secure_channel(f"127.0.0.1:{port}", certs / n, n, peer_role="server") for n in names}
    stubs = {n: pb_grpc.ReleaseServerStub(c) for n, c in chans.items()}
    for c in support.CURATORS:
        first = tchunk(c)
        stubs[c].StoreTable(iter([first, tcommit(first)]), timeout=5)
    half = tchunk("alice", tid="half")
    stubs["alice"].StoreTable(iter([half, tcommit(half)]), timeout=5)
    support.register_all(stubs, sspec("sr"))
    support.register_all(stubs, support.make_params(rid="cs", m=100, n=TN, sizes=TK))
    yield store, stubs
    for ch in chans.values():
        ch.close()
    server.stop(0).wait()
    store.close()


def _table_state(store: Store) -> dict[str, object]:
    return {t: {c: (p.alphabet_size, dict(p.chunks), p.committed) for c, p in tbl.parts.items()}
            for t, tbl in store._tables.items()}  # fmt: skip


def sregister(p: pb.ReleaseParams) -> Callable[[Any], object]:
    return lambda stub: stub.RegisterPart(pb.RegisterPartRequest(params=p, curator="alice"), timeout=5)


def _bad_kind() -> pb.ReleaseParams:
    params = sspec("sk")
    params.table_id = ""
    return params


TABLE_CASES: list[tuple[str, str, Callable[[Any], object], grpc.StatusCode, str]] = [
    ("store: oversized chunk", "alice",
     lambda s: s.StoreTable(iter([tchunk(tid="x", data=b"\0" * ((1 << 20) + 65))]), timeout=5), C.INVALID_ARGUMENT,
     "at most"),
    ("store: empty stream", "alice", lambda s: s.StoreTable(iter([]), timeout=5), C.INVALID_ARGUMENT, "at least one"),
    ("store: bad table id", "alice", lambda s: s.StoreTable(iter([tchunk(tid="../t")]), timeout=5),
     C.INVALID_ARGUMENT, "table id"),
    ("store: one curator", "alice", lambda s: s.StoreTable(iter([tchunk(tid="x", curators=("alice",))]), timeout=5),
     C.INVALID_ARGUMENT, "at least 2"),
    ("store: n over the limit", "alice", lambda s: s.StoreTable(iter([tchunk(tid="x", n=10_001)]), timeout=5),
     C.RESOURCE_EXHAUSTED, "limit"),
    ("store: symbol out of range", "alice",
     lambda s: s.StoreTable(iter([tchunk(tid="x", data=b"\x03" * TN)]), timeout=5), C.INVALID_ARGUMENT, "outside"),
    ("store: short chunk", "alice", lambda s: s.StoreTable(iter([tchunk(tid="x", data=b"\0" * 10)]), timeout=5),
     C.INVALID_ARGUMENT, "exactly"),
    ("store: as another curator", "alice", lambda s: s.StoreTable(iter([tchunk("bob", tid="x")]), timeout=5),
     C.PERMISSION_DENIED, "may not act for"),
    ("store: a non-member", "carol", lambda s: s.StoreTable(iter([tchunk("carol", k=3)]), timeout=5),
     C.PERMISSION_DENIED, "not a curator"),
    ("store: mismatched n", "bob", lambda s: s.StoreTable(iter([tchunk("bob", tid="half", n=TN + 1)]), timeout=5),
     C.FAILED_PRECONDITION, "n = "),
    ("store: mismatched curators", "bob",
     lambda s: s.StoreTable(iter([tchunk("bob", tid="half", curators=("bob", "alice"))]), timeout=5),
     C.FAILED_PRECONDITION, "curators"),
    ("store: mismatched alphabet", "alice", lambda s: s.StoreTable(iter([tchunk(k=5)]), timeout=5),
     C.FAILED_PRECONDITION, "alphabet size"),
    ("store: replay with different bytes", "alice",
     lambda s: s.StoreTable(iter([tchunk(data=b"\x01" * TN)]), timeout=5), C.ALREADY_EXISTS, "different bytes"),
    ("store: commit with another digest", "alice",
     lambda s: s.StoreTable(iter([tcommit(tchunk(), b"\1" * 32)]), timeout=5), C.ALREADY_EXISTS, "never changes"),
    ("status: unknown table", "alice", lambda s: s.GetTableStatus(pb.TableStatusRequest(table_id="nope"), timeout=5),
     C.NOT_FOUND, "no stored table"),
    ("status: a non-member", "carol", lambda s: s.GetTableStatus(pb.TableStatusRequest(table_id="t1"), timeout=5),
     C.PERMISSION_DENIED, "not a curator"),
    ("status: a researcher", "researcher",
     lambda s: s.GetTableStatus(pb.TableStatusRequest(table_id="t1"), timeout=5), C.PERMISSION_DENIED, "may not call"),
    ("delete: unknown table", "alice",
     lambda s: s.DeleteTable(pb.DeleteTableRequest(table_id="nope", curator="alice"), timeout=5), C.NOT_FOUND,
     "no stored table"),
    ("delete: for another curator", "alice",
     lambda s: s.DeleteTable(pb.DeleteTableRequest(table_id="t1", curator="bob"), timeout=5), C.PERMISSION_DENIED,
     "may not act for"),
    ("delete: a non-member", "carol",
     lambda s: s.DeleteTable(pb.DeleteTableRequest(table_id="t1", curator="carol"), timeout=5), C.PERMISSION_DENIED,
     "not a curator"),
    ("delete: a release from it is open", "alice",
     lambda s: s.DeleteTable(pb.DeleteTableRequest(table_id="t1", curator="alice"), timeout=5),
     C.FAILED_PRECONDITION, "abort them first"),
    ("sample: unknown release", "alice",
     lambda s: list(s.FetchSample(pb.SampleRequest(release_id="nope", curator="alice"), timeout=5)), C.NOT_FOUND,
     "no release"),
    ("sample: a curator-sampled release", "alice",
     lambda s: list(s.FetchSample(pb.SampleRequest(release_id="cs", curator="alice"), timeout=5)),
     C.FAILED_PRECONDITION, "not the server"),
    ("sample: a non-member", "carol",
     lambda s: list(s.FetchSample(pb.SampleRequest(release_id="sr", curator="carol"), timeout=5)),
     C.PERMISSION_DENIED, "not a curator"),
    ("sample: as another curator", "alice",
     lambda s: list(s.FetchSample(pb.SampleRequest(release_id="sr", curator="bob"), timeout=5)),
     C.PERMISSION_DENIED, "may not act for"),
    ("sample: a researcher", "researcher",
     lambda s: list(s.FetchSample(pb.SampleRequest(release_id="sr", curator="alice"), timeout=5)),
     C.PERMISSION_DENIED, "may not call"),
    ("register: unknown table", "alice", sregister(sspec("s9", tid="nope")), C.NOT_FOUND, "no stored table"),
    ("register: incomplete table", "alice", sregister(sspec("s9", tid="half")), C.FAILED_PRECONDITION,
     "not complete"),
    ("register: mismatched n", "alice", sregister(sspec("s9", n=TN - 1)), C.FAILED_PRECONDITION, "n = "),
    ("register: mismatched alphabets", "alice", sregister(sspec("s9", sizes=(3, 5))), C.FAILED_PRECONDITION,
     "alphabet sizes"),
    ("register: server-sampled without a table", "alice", sregister(_bad_kind()), C.INVALID_ARGUMENT,
     "must name its stored table"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "who", "call", "code", "words"), TABLE_CASES, ids=[c[0] for c in TABLE_CASES])
def test_bad_stored_table_calls(tables_live: tuple[Store, dict[str, Any]], name: str, who: str,
                                call: Callable[[Any], object], code: grpc.StatusCode, words: str) -> None:  # fmt: skip
    store, stubs = tables_live
    before = _table_state(store)
    states = {r: store.release(r).state for r in ("sr", "cs")}
    with pytest.raises(grpc.RpcError) as err:
        call(stubs[who])
    assert err.value.code() == code, err.value.details()
    assert words in (err.value.details() or ""), err.value.details()
    if "may not call" not in words:
        assert err.value.details().split(":")[0].endswith("Error"), err.value.details()  # a named error
    assert _table_state(store) == before  # nothing half-stored: no new table, part or chunk
    assert {r: store.release(r).state for r in ("sr", "cs")} == states
    with pytest.raises(Exception, match="no release"):
        store.release("s9")
