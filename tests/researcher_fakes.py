"""In-process fakes for the researcher's tests: a release built with ``mechanism.protocol.in_memory``
(sample, encrypt, PRAM), a fake release server serving its perturbed rows and fake curators
serving their keys, each a real gRPC server on 127.0.0.1 (insecure mode, access table on)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from secure_release.infra.tls import bind, make_grpc_server
from secure_release.infra.wire import cipher_to_pb, schema_to_pb, spec_to_pb
from secure_release.mechanism.estimation.report import ReleaseEstimate, ReleaseReport
from secure_release.mechanism.primitives.keys import PadKey, PramKey, Seed
from secure_release.mechanism.primitives.packing import pack_symbols
from secure_release.mechanism.primitives.pads import CipherMode, ReleasePad
from secure_release.mechanism.primitives.sampling import sample_positions
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.in_memory import (
    curator_encrypt,
    researcher_decrypt,
    researcher_estimate,
    server_perturb,
)
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.schema import Attribute, CuratorSchema, JointSchema, SymbolArray
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.client import Endpoints

SCHEMAS = (
    CuratorSchema("alice", (Attribute("education", ("low", "mid", "high")), Attribute("married", ("no", "yes")))),
    CuratorSchema("bob", (Attribute("region", ("north", "south", "east", "west")),)),
)
RESEARCHER = "researcher"


@dataclass
class FakeRelease:
    """A perturbed release and the pads that decrypt it (what a real run would produce)."""

    spec: ReleaseSpec
    perturbed: list[SymbolArray]
    pads: list[ReleasePad]
    schemas: tuple[CuratorSchema, ...] = SCHEMAS

    def expected(self, granted: Sequence[int] | None = None) -> ReleaseEstimate:
        """``mechanism.protocol.in_memory``'s estimate from the granted curators' keys (default all)."""
        subset = list(range(len(self.pads))) if granted is None else list(granted)
        decrypted = researcher_decrypt([self.perturbed[j] for j in subset], [self.pads[j] for j in subset])
        return researcher_estimate(decrypted, self.spec.plan, subset)

    def labels(self, granted: Sequence[int] | None = None) -> list[tuple[str, ...]]:
        subset = list(range(len(self.pads))) if granted is None else list(granted)
        return JointSchema(tuple(self.schemas[j] for j in subset)).cell_labels()


def make_release(cipher: CipherMode, release_id: str = "r1", n: int = 3000, m: int = 900) -> FakeRelease:
    """Random aligned columns -> sample -> encrypt -> PRAM, with fixed keys."""
    rng = np.random.default_rng(7)
    sizes = tuple(s.alphabet_size for s in SCHEMAS)
    plan = plan_release(n, sizes, 1.0, m)
    spec = ReleaseSpec(release_id, ("alice", "bob"), cipher, plan, (RESEARCHER,)).validate()
    positions = sample_positions(Seed(bytes(range(32))), n, m, release_id)
    uploads = [
        curator_encrypt(
            rng.integers(0, k, n).astype(np.uint32),
            positions,
            k,
            cipher,
            PadKey(bytes([j + 1]) * 32) if cipher is CipherMode.CHACHA20 else None,
        )
        for j, k in enumerate(sizes)
    ]
    perturbed = server_perturb([c for c, _ in uploads], plan, PramKey(bytes(range(1, 33))))
    return FakeRelease(spec, perturbed, [pad for _, pad in uploads])


@dataclass
class FakeServer(pb_grpc.ReleaseServerServicer):
    """Serves one release's status and perturbed rows in chunks of ``chunk_rows``.

    ``tamper``: flip one served symbol after the digest was taken; ``status_digest``: publish
    this digest in the status instead of the true one; ``pending_polls``: answer UPLOADING
    this many times first."""

    release: FakeRelease
    chunk_rows: int = 400
    tamper: bool = False
    status_digest: bytes | None = None
    pending_polls: int = 0
    polls: int = field(default=0, init=False)

    def _chunks(self) -> list[list[bytes]]:
        sizes, m = self.release.spec.plan.alphabet_sizes, self.release.spec.m
        return [
            [
                pack_symbols(col[start : start + self.chunk_rows], k)
                for col, k in zip(self.release.perturbed, sizes, strict=True)
            ]
            for start in range(0, m, self.chunk_rows)
        ]

    def digest(self) -> bytes:
        """SHA-256 over every column, chunk by chunk (the server's definition)."""
        hasher = hashlib.sha256()
        for columns in self._chunks():
            for column in columns:
                hasher.update(column)
        return hasher.digest()

    def GetReleaseStatus(self, request: pb.ReleaseStatusRequest, context: Any) -> pb.ReleaseStatus:  # noqa: N802
        spec = self.release.spec
        if request.release_id != spec.release_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no release {request.release_id!r}")
        self.polls += 1
        perturbed = self.polls > self.pending_polls
        return pb.ReleaseStatus(
            release_id=spec.release_id,
            state=pb.RELEASE_STATE_PERTURBED if perturbed else pb.RELEASE_STATE_UPLOADING,
            params=spec_to_pb(spec),
            perturbed_digest=(self.status_digest or self.digest()) if perturbed else b"",
        )

    def FetchPerturbed(self, request: pb.FetchRequest, context: Any) -> Iterator[pb.PerturbedChunk]:  # noqa: N802
        chunks, digest = self._chunks(), self.digest()
        if self.tamper:
            first = bytearray(chunks[0][0])
            first[0] ^= 1
            chunks[0][0] = bytes(first)
        for seq, columns in enumerate(chunks):
            last = seq == len(chunks) - 1
            yield pb.PerturbedChunk(
                release_id=request.release_id,
                sequence=seq,
                first_row=seq * self.chunk_rows,
                columns=columns,
                last=last,
                digest=digest if last else b"",
            )


@dataclass
class FakeCurator(pb_grpc.CuratorServicer):
    """Serves curator ``index``'s key (an OTP pad in two chunks); ``refuse``: PERMISSION_DENIED;
    ``wrong_m``: announce a different m than the release's."""

    release: FakeRelease
    index: int
    refuse: bool = False
    wrong_m: bool = False

    def ReleaseKey(self, request: pb.KeyRequest, context: Any) -> Iterator[pb.KeyChunk]:  # noqa: N802
        spec, pad = self.release.spec, self.release.pads[self.index]
        name = spec.curators[self.index]
        if self.refuse:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"curator {name} has not granted this researcher")
        head = pb.KeyChunk(
            release_id=request.release_id,
            curator=name,
            cipher=cipher_to_pb(pad.mode),
            schema=schema_to_pb(self.release.schemas[self.index]),
            alphabet_size=pad.alphabet_size,
            m=spec.m + 1 if self.wrong_m else spec.m,
        )
        if pad.key is not None:
            head.chacha20_key, head.last = pad.key.reveal(), True
            yield head
            return
        symbols, half = pad.pad(), spec.m // 2
        head.otp_pad = pack_symbols(symbols[:half], pad.alphabet_size)
        yield head
        yield pb.KeyChunk(sequence=1, otp_pad=pack_symbols(symbols[half:], pad.alphabet_size), last=True)


def _serve(add: Any, servicer: Any, certs: Path | None, name: str) -> tuple[grpc.Server, str]:
    server = make_grpc_server(max_workers=4, insecure=certs is None)
    add(servicer, server)
    port = bind(server, "127.0.0.1", 0, None if certs is None else certs / name, name, insecure=certs is None)
    server.start()
    return server, f"127.0.0.1:{port}"


@contextlib.contextmanager
def running(
    server: FakeServer, curators: Sequence[FakeCurator], certs: Path | None = None, as_name: str = RESEARCHER
) -> Iterator[Endpoints]:
    """Start the fakes; yield the researcher's endpoints to them: mutual TLS with the PKI root
    ``certs`` (each party uses only its own ``certs/NAME``: ``server``, ``alice``, ``bob``,
    ``as_name``), else insecure."""
    names = [server.release.spec.curators[c.index] for c in curators]
    started = [_serve(pb_grpc.add_ReleaseServerServicer_to_server, server, certs, "server")]
    started += [
        _serve(pb_grpc.add_CuratorServicer_to_server, c, certs, n) for c, n in zip(curators, names, strict=True)
    ]
    try:
        addresses = {n: a for n, (_, a) in zip(names, started[1:], strict=True)}
        own = None if certs is None else certs / as_name
        yield Endpoints(own, as_name, certs is None, started[0][1], addresses)
    finally:
        for grpc_server, _ in started:
            grpc_server.stop(None)


def reports_equal(a: ReleaseReport, b: ReleaseReport) -> bool:
    """Every field equal, arrays element for element (dtype included)."""
    arrays = ("estimate", "projected", "mle", "standard_error", "ci_low", "ci_high", "observed")
    same_arrays = all(
        np.array_equal(getattr(a, n), getattr(b, n)) and getattr(a, n).dtype == getattr(b, n).dtype for n in arrays
    )
    scalars = ("release_id", "plan", "curators", "covered", "attributes", "labels", "mle_iterations", "interval_method")
    return same_arrays and all(getattr(a, n) == getattr(b, n) for n in scalars) and dict(a.refused) == dict(b.refused)


class EventRecorder(logging.Handler):
    """Collects the researcher's log records (event name and fields)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self) -> list[str]:
        return [r.getMessage() for r in self.records]
