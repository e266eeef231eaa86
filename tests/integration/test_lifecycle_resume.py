"""Resume against a real (in-process, mutual TLS) release server: a curator restarted mid-upload
sends only the chunks the server does not hold and commits; a replay after the commit is an
idempotent success; a resume whose table changed is refused before any pad is applied."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from support import SIZES, make_spec

from secure_release.curator.config import CuratorConfig
from secure_release.curator.records.keystore import Keystore, ReleaseRecord, TableChangedError
from secure_release.curator.release.opening import resumable_record
from secure_release.curator.release.upload import ServerLink, pack_chunks
from secure_release.curator.waits import Deadline
from secure_release.infra import tls
from secure_release.infra.logs import EventLog
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey
from secure_release.mechanism.primitives.pads import CipherMode, new_release_pad
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server.service import ReleaseService
from secure_release.server.store import Store

LOG = EventLog("curator", "test")


@pytest.fixture
def server(certs: Path, tmp_path: Path) -> Iterator[tuple[int, Store]]:
    store = Store(tmp_path / "store")
    grpc_server = tls.make_grpc_server(max_workers=4)
    pb_grpc.add_ReleaseServerServicer_to_server(ReleaseService(store, lambda: PramKey(bytes(32))), grpc_server)
    port = tls.bind(grpc_server, "127.0.0.1", 0, certs / "server", "server")
    grpc_server.start()
    yield port, store
    grpc_server.stop(0).wait()
    store.close()


def _config(name: str, port: int, certs: Path, tmp_path: Path) -> CuratorConfig:
    return CuratorConfig(
        name=name, release_id="r1", epsilon=1.0, m=None, cipher=CipherMode.CHACHA20, curators=("alice", "bob"),
        leader=name == "alice", leader_address=None, expected_sizes=None, notify="researcher", grants=(),
        data=tmp_path / "x.csv", schema=tmp_path / "x.json", dataset="d", keystore=tmp_path / f"ks-{name}",
        server=f"127.0.0.1:{port}", certs=certs / name, listen_host="127.0.0.1", listen_port=0, port_file=None,
        insecure=False, timeout=30.0, exit_after_keys=True, alignment_key=AlignmentKey(bytes(32)),
    )  # fmt: skip


def _record(name: str) -> ReleaseRecord:
    spec = make_spec()  # m = CHUNK_ROWS + 1000: two chunks
    k = SIZES[spec.curators.index(name)]
    sample = (np.arange(spec.m, dtype=np.uint32) * 7 + len(name)) % k
    pad = new_release_pad(CipherMode.CHACHA20, k, spec.m, PadKey(bytes([len(name)]) * 32))
    return ReleaseRecord(spec, pad, sample, "f" * 64, "d", "s")


def test_a_restarted_curator_sends_only_what_the_server_lacks(
    server: tuple[int, Store], certs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, store = server
    received: list[tuple[str, int]] = []  # (curator, seq) of every chunk the server was sent
    original = store.put_chunk

    def spy(release_id: str, curator: str, caller: str, seq: int, data: bytes) -> bool:
        received.append((curator, seq))
        return original(release_id, curator, caller, seq, data)

    monkeypatch.setattr(store, "put_chunk", spy)
    links = {n: ServerLink(_config(n, port, certs, tmp_path), LOG, Deadline(30.0)) for n in ("alice", "bob")}
    records = {n: _record(n) for n in links}
    try:
        for name, link in links.items():
            link.register(records[name].spec)
        # alice "crashed" after her first chunk was acknowledged
        first = pack_chunks(records["alice"].ciphertext(), SIZES[0])[0]
        links["alice"].stub.UploadCiphertext(
            iter([pb.UploadChunk(release_id="r1", curator="alice", sequence=0, symbols=first)]), timeout=30
        )
        links["alice"].upload(records["alice"].spec, records["alice"].ciphertext())  # the restarted run
        assert received == [("alice", 0), ("alice", 1)]  # chunk 0 once (before the "crash"), then only 1
        links["bob"].upload(records["bob"].spec, records["bob"].ciphertext())
        sealed = links["alice"].wait_sealed()
        assert sealed.state in (pb.RELEASE_STATE_SEALED, pb.RELEASE_STATE_PERTURBED)
        links["alice"].upload(records["alice"].spec, records["alice"].ciphertext())  # a replay after the seal
        assert len(received) == 4  # the server said "committed": nothing was sent the second time
        status, unknown = links["alice"].abort("too late")  # a sealed release cannot be aborted
        assert status is not None and status.state != pb.RELEASE_STATE_ABORTED and not unknown
    finally:
        for link in links.values():
            link.close()


def test_a_resume_with_another_table_is_refused(tmp_path: Path, certs: Path) -> None:
    config = replace(_config("alice", 1, certs, tmp_path), epsilon=1.0)
    keystore = Keystore(config.keystore)
    keystore.save_record(_record("alice"))
    assert resumable_record(config, keystore, "f" * 64) is not None
    with pytest.raises(TableChangedError, match="never applied to different plaintext"):
        resumable_record(config, keystore, "e" * 64)
