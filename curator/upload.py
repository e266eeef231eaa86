"""The upload step: register this curator's part at the release server, stream the packed
ciphertext in CHUNK_ROWS-symbol chunks and commit with a digest (every call retried and
idempotent at the server)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from secure_release.curator.config import CuratorConfig
from secure_release.infra.logs import EventLog
from secure_release.infra.retry import with_retries
from secure_release.infra.tls import secure_channel
from secure_release.infra.wire import spec_to_pb
from secure_release.mechanism.errors import ShapeMismatchError
from secure_release.mechanism.packing import CHUNK_ROWS, digest_of, pack_symbols
from secure_release.mechanism.schema import SymbolArray
from secure_release.mechanism.spec import ReleaseSpec
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

REGISTER_TIMEOUT_S = 30.0
UPLOAD_TIMEOUT_S = 120.0


def _progress(done: int, total: int, label: str) -> None:
    """A progress bar on stderr, only when it is a terminal."""
    if not sys.stderr.isatty() or total <= 0:
        return
    width = 30
    filled = int(width * done / total)
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def pack_chunks(ciphertext: SymbolArray, alphabet_size: int) -> list[bytes]:
    """The ciphertext packed CHUNK_ROWS symbols a chunk (one numpy pack per chunk)."""
    return [
        pack_symbols(ciphertext[start : start + CHUNK_ROWS], alphabet_size)
        for start in range(0, int(ciphertext.size), CHUNK_ROWS)
    ]


def upload_messages(release_id: str, curator: str, chunks: list[bytes]) -> Iterator[pb.UploadChunk]:
    """The UploadCiphertext stream: every chunk, then the commit with digest and count."""
    for seq, data in enumerate(chunks):
        _progress(seq + 1, len(chunks), f"{curator} upload")
        yield pb.UploadChunk(release_id=release_id, curator=curator, sequence=seq, symbols=data)
    yield pb.UploadChunk(
        release_id=release_id, curator=curator, commit=True, digest=digest_of(chunks), num_chunks=len(chunks)
    )


def upload(config: CuratorConfig, spec: ReleaseSpec, ciphertext: SymbolArray, log: EventLog) -> None:
    """Step 3: register ``spec`` as this curator's part, upload ``ciphertext`` (m symbols of
    this curator's alphabet) and commit; :class:`ShapeMismatchError` if the server does not."""
    if int(ciphertext.size) != spec.m:
        raise ShapeMismatchError(f"{config.name} has {ciphertext.size} ciphertext symbols, the spec says m = {spec.m}")
    chunks = pack_chunks(ciphertext, spec.alphabet_of(config.name))
    channel = secure_channel(
        config.server, config.certs, config.name, config.insecure, role="curator", peer_role="server"
    )
    try:
        stub = pb_grpc.ReleaseServerStub(channel)
        register = pb.RegisterPartRequest(params=spec_to_pb(spec), curator=config.name)
        with_retries(lambda: stub.RegisterPart(register, timeout=REGISTER_TIMEOUT_S), "register", log, attempts=12)
        log("registered", release_id=spec.release_id, n=spec.n, m=spec.m)
        resp = with_retries(
            lambda: stub.UploadCiphertext(
                upload_messages(spec.release_id, config.name, chunks), timeout=UPLOAD_TIMEOUT_S
            ),
            "upload",
            log,
            attempts=8,
        )
    finally:
        channel.close()
    if not resp.committed:
        raise ShapeMismatchError(f"the server did not commit {config.name}'s upload of release {spec.release_id!r}")
    log("committed", release_id=spec.release_id, chunks=len(chunks), stored=int(resp.symbols_stored))
