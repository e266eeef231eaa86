"""The researcher's calls to the other parties: wait for a release (an ABORTED release stops the
wait with its reason), fetch its perturbed rows (digest checked), and ask each curator for its
key. A curator that says no (PERMISSION_DENIED, NOT_FOUND, UNAUTHENTICATED) has *refused*; one
that cannot be reached is *unavailable* and is asked again with backoff until the deadline.

Every message is decoded through ``infra.wire``; every value that reaches the estimate is
checked against the release's validated :class:`~secure_release.mechanism.protocol.spec.ReleaseSpec`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress

from secure_release.infra.config import ConfigError
from secure_release.infra.exitcodes import is_refusal
from secure_release.infra.logs import EventLog
from secure_release.infra.retry import with_retries
from secure_release.infra.streams import FetchError, PerturbedStream, key_from_chunks, perturbed_from_chunks
from secure_release.infra.tls import secure_channel
from secure_release.infra.wire import (
    DeclarationError,
    Refusal,
    cipher_from_pb,
    refusals_from_pb,
    schema_from_pb,
    spec_from_pb,
)
from secure_release.mechanism.errors import ErrorKind
from secure_release.mechanism.primitives.keys import PadKey
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, unpack_symbols
from secure_release.mechanism.primitives.pads import CipherMode, ReleasePad
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.protocol.tables import count_rows
from secure_release.mechanism.schema import CuratorSchema, SymbolArray, mixed_radix_encode
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.errors import (
    DigestMismatchError,
    KeyMismatchError,
    ReleaseDesignMismatchError,
    ReleaseNotReadyError,
)

ROLE = "researcher"
POLL_SECONDS = 0.3
STATUS_RPC_SECONDS = 10.0
FETCH_RPC_SECONDS = 300.0
KEY_RPC_SECONDS = 60.0
KEY_FIRST_DELAY_S = 0.2
KEY_MAX_DELAY_S = 2.0
#: A curator answering with one of these has said no: it did not grant its key.
REFUSAL_CODES = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.NOT_FOUND,
    }
)
#: A curator answering with one of these is not reachable or not ready: ask again later.
UNAVAILABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)


class AbortedBeforeSealError(FetchError):
    """The release was aborted before sealing; the server recorded the reason. Nothing will be
    released under this id."""


class ReleaseRefusedByCuratorError(AbortedBeforeSealError):
    """A curator refused the release (its budget, a permission); exit 3 as at every party."""

    kind = ErrorKind.PERMISSION_DENIED


class RefusedBeforeAgreementError(ReleaseRefusedByCuratorError):
    """A curator of the release refused it before the agreement (no budget, a data check, a key,
    a reused seed), so the server never heard a spec: its recorded refusal names the curator and
    the reason class (never the data). Exit 3, as at every party."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message())
        self.refusal = refusal


class FetchDeadline:
    """The end of one researcher operation (``--timeout`` applies end to end)."""

    def __init__(self, seconds: float) -> None:
        """A deadline ``seconds`` (finite, > 0) from now."""
        self.seconds = check_seconds(seconds, "the wait for a release")
        self.end = time.monotonic() + self.seconds

    def left(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.end - time.monotonic())


def check_seconds(value: float, what: str) -> float:
    """``value`` if it is a finite number of seconds > 0; else :class:`ConfigError`."""
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Endpoints:
    """Where the researcher connects and as whom (``curators``: name -> HOST:PORT)."""

    certs: Path | None
    name: str
    insecure: bool
    server: str
    curators: Mapping[str, str] = field(default_factory=dict)

    def server_channel(self) -> grpc.Channel:
        """A mutual-TLS channel to the release server, which must present role ``server``."""
        return secure_channel(self.server, self.certs, self.name, self.insecure, role=ROLE, peer_role="server")

    def curator_channel(self, curator: str, address: str) -> grpc.Channel:
        """A mutual-TLS channel to ``curator``'s key service: the peer must be that curator."""
        return secure_channel(
            address, self.certs, self.name, self.insecure, role=ROLE, peer_role="curator", peer_name=curator
        )


@dataclass(frozen=True)
class PerturbedRelease:
    """A release the server reports PERTURBED: its validated spec and the published digest."""

    spec: ReleaseSpec
    digest: bytes


@dataclass(frozen=True)
class CuratorKey:
    """A granted key: the curator's pad for the release and the schema that labels its symbols."""

    curator: str
    pad: ReleasePad
    schema: CuratorSchema
    design: bytes = b""  # a release of a design's tables: the design file the curator ran


@dataclass(frozen=True)
class KeyResults:
    """Every curator's answer: ``granted`` keys, ``refused`` reasons (it said no) and
    ``unavailable`` reasons (unreachable until the deadline), by curator."""

    granted: Mapping[str, CuratorKey]
    refused: Mapping[str, str]
    unavailable: Mapping[str, str] = field(default_factory=dict)

    def missing(self) -> dict[str, str]:
        """Every curator whose key is missing, with why (a refusal's code, or "unavailable: ...")."""
        return {
            **self.refused,
            **{c: f"unavailable: {r}" for c, r in self.unavailable.items()},
        }


# ---------------------------------------------------------------------------------- release
def _status_or_none(stub: pb_grpc.ReleaseServerStub, release_id: str, seconds: float) -> pb.ReleaseStatus | None:
    """The release's status; None while the server does not know it, is unreachable or slow."""
    try:
        status: pb.ReleaseStatus = stub.GetReleaseStatus(
            pb.ReleaseStatusRequest(release_id=release_id), timeout=max(POLL_SECONDS, seconds)
        )
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return None
        raise
    return status


def _refusal_or_none(
    stub: pb_grpc.ReleaseServerStub, release_id: str, curators: Iterable[str], seconds: float
) -> Refusal | None:
    """The first refusal of ``release_id`` the server shows (from one of ``curators`` when the
    researcher names them with --curator); None if there is none, or the server cannot say (an
    older server without GetRefusals, unreachable or slow)."""
    try:
        answer = stub.GetRefusals(pb.RefusalQuery(release_id=release_id), timeout=max(POLL_SECONDS, seconds))
        shown = refusals_from_pb(answer)
    except (grpc.RpcError, DeclarationError):
        return None
    known = set(curators)
    refusals = [r for r in shown if r.release_id == release_id and (not known or r.curator in known)]
    return refusals[0] if refusals else None


def wait_perturbed(endpoints: Endpoints, release_id: str, timeout: float | FetchDeadline) -> PerturbedRelease:
    """Poll the server until ``release_id`` is PERTURBED (until ``timeout``: seconds or a
    :class:`FetchDeadline`); an ABORTED release raises :class:`AbortedBeforeSealError` with its reason,
    a curator's refusal before the agreement (no spec at the server yet)
    :class:`RefusedBeforeAgreementError` naming the curator and the reason class."""
    deadline = timeout if isinstance(timeout, FetchDeadline) else FetchDeadline(timeout)
    with endpoints.server_channel() as channel:
        stub = pb_grpc.ReleaseServerStub(channel)
        while True:
            status = _status_or_none(stub, release_id, min(STATUS_RPC_SECONDS, deadline.left()))
            if status is None or status.state not in (pb.RELEASE_STATE_PERTURBED, pb.RELEASE_STATE_ABORTED):
                seconds = min(STATUS_RPC_SECONDS, deadline.left())
                refusal = _refusal_or_none(stub, release_id, endpoints.curators, seconds)
                if refusal is not None:
                    raise RefusedBeforeAgreementError(refusal)
            if status is not None and status.state == pb.RELEASE_STATE_PERTURBED:
                return _perturbed_release(status, release_id)
            if status is not None and status.state == pb.RELEASE_STATE_ABORTED:
                if is_refusal(status.abort_reason):
                    raise ReleaseRefusedByCuratorError(f"{status.abort_reason} (release {release_id!r} aborted)")
                raise AbortedBeforeSealError(f"release {release_id!r} was aborted: {status.abort_reason}")
            if deadline.left() <= 0:
                raise ReleaseNotReadyError(
                    f"release {release_id!r} is not PERTURBED on {endpoints.server} after {deadline.seconds:g}s; "
                    "wait longer (--timeout) or check that every curator uploaded"
                )
            time.sleep(POLL_SECONDS)


def _perturbed_release(status: pb.ReleaseStatus, release_id: str) -> PerturbedRelease:
    """The validated spec of a PERTURBED status (it must describe the asked release)."""
    spec = spec_from_pb(status.params)
    if spec.release_id != release_id:
        raise FetchError(f"asked the status of {release_id!r}, the server answered for {spec.release_id!r}")
    if not status.perturbed_digest:
        raise DigestMismatchError(f"the server published no digest of release {release_id!r}'s perturbed rows")
    return PerturbedRelease(spec, bytes(status.perturbed_digest))


# ---------------------------------------------------------------------------------- rows
def _with_progress(chunks: Iterable[pb.PerturbedChunk], spec: ReleaseSpec) -> Iterator[pb.PerturbedChunk]:
    """``chunks`` as they arrive, advancing a download bar on a terminal (large releases only)."""
    total = max(1, math.ceil(spec.m / CHUNK_ROWS))
    with Progress(f"{spec.release_id} download", BarColumn(), MofNCompleteColumn(), console=Console(stderr=True),
                  disable=not sys.stderr.isatty() or total < 4) as progress:  # fmt: skip
        task = progress.add_task("download", total=total)
        for seq, chunk in enumerate(chunks):
            progress.update(task, completed=min(seq + 1, total))
            yield chunk


def _check_digest(computed: bytes, published: Iterable[bytes], release_id: str) -> None:
    """Every non-empty published digest must equal the digest of the rows received."""
    for digest in published:
        if digest and digest != computed:
            raise DigestMismatchError(
                f"the perturbed rows of {release_id!r} hash to {computed.hex()[:16]}..., the server "
                f"published {digest.hex()[:16]}...; refusing to estimate from altered rows"
            )


def fetch_perturbed(
    endpoints: Endpoints, release: PerturbedRelease, log: EventLog, notified_digest: bytes = b""
) -> list[SymbolArray]:
    """The perturbed column of every curator (m symbols each), digest-checked against the
    status, the stream's last chunk and (if given) the ready notice."""
    spec = release.spec

    def once() -> tuple[list[bytes], bytes, bytes]:
        with endpoints.server_channel() as channel:
            stream = pb_grpc.ReleaseServerStub(channel).FetchPerturbed(
                pb.FetchRequest(release_id=spec.release_id), timeout=FETCH_RPC_SECONDS
            )
            return perturbed_from_chunks(_with_progress(stream, spec), spec)

    packed, computed, streamed = with_retries(once, "fetch_perturbed", log)
    _check_digest(computed, (release.digest, streamed, notified_digest), spec.release_id)
    columns = [unpack_symbols(raw, k) for raw, k in zip(packed, spec.plan.alphabet_sizes, strict=True)]
    if any(c.size != spec.m for c in columns):
        raise FetchError(f"expected m = {spec.m} perturbed rows per curator, got {[c.size for c in columns]}")
    log("fetched", release_id=spec.release_id, rows=spec.m, digest=computed.hex())
    return columns


def _decrypted_chunks(
    endpoints: Endpoints,
    release: PerturbedRelease,
    pads: Mapping[int, ReleasePad],
    consume: Callable[[list[SymbolArray | None], int], None],
    restart: Callable[[], None],
    log: EventLog,
    notified_digest: bytes = b"",
) -> None:
    """Stream the perturbed rows, decrypt each chunk at its offset with the curators' ``pads``
    (column index -> pad; None for a curator without one) and hand it to ``consume(columns,
    first_row)``; ``restart`` is called before every attempt (a retry starts over). Returns only
    if every row arrived and the digest matches the status, the stream's last chunk and (if
    given) the ready notice."""
    spec = release.spec
    sizes = spec.plan.alphabet_sizes

    def once() -> tuple[int, bytes, bytes]:
        restart()
        start = 0
        with endpoints.server_channel() as channel:
            chunks = pb_grpc.ReleaseServerStub(channel).FetchPerturbed(
                pb.FetchRequest(release_id=spec.release_id), timeout=FETCH_RPC_SECONDS
            )
            stream = PerturbedStream(_with_progress(chunks, spec), spec)
            for columns in stream.columns():
                cols = {j: unpack_symbols(columns[j], sizes[j]) for j in pads}
                rows = {c.size for c in cols.values()}
                if len(rows) > 1 or start + next(iter(rows)) > spec.m:
                    raise FetchError(f"perturbed chunk at row {start} has columns of {sorted(rows)} rows")
                consume([pads[j].decrypt(cols[j], start) if j in pads else None for j in range(len(sizes))], start)
                start += next(iter(rows))
            return start, stream.computed, stream.streamed

    rows, computed, streamed = with_retries(once, "fetch_perturbed", log)
    _check_digest(computed, (release.digest, streamed, notified_digest), spec.release_id)
    if rows != spec.m:
        raise FetchError(f"expected m = {spec.m} perturbed rows per curator, got {rows}")
    tables = {"tables": len(spec.tables)} if spec.tables else {}  # the whole joint: the event as before
    log("fetched", release_id=spec.release_id, rows=spec.m, digest=computed.hex(), **tables)


def count_perturbed(
    endpoints: Endpoints,
    release: PerturbedRelease,
    pads: Mapping[int, ReleasePad],
    log: EventLog,
    notified_digest: bytes = b"",
) -> npt.NDArray[np.int64]:
    """The observed counts of the decrypted joint symbols of the curators in ``pads`` (column
    index -> that curator's pad), counted chunk by chunk as the perturbed rows stream in: memory
    does not grow with m (each chunk is decrypted at its offset; a ChaCha20 pad computes just
    that range)."""
    subset = sorted(pads)
    sizes = [release.spec.plan.alphabet_sizes[j] for j in subset]
    cells = int(np.prod(sizes))
    counts = np.zeros(cells, dtype=np.int64)

    def consume(plain: list[SymbolArray | None], _: int) -> None:
        digits = [d for j in subset if (d := plain[j]) is not None]
        counts[:] += np.bincount(mixed_radix_encode(digits, sizes), minlength=cells)[:cells]

    def restart() -> None:
        counts[:] = 0

    _decrypted_chunks(endpoints, release, pads, consume, restart, log, notified_digest)
    return counts


def count_tables(
    endpoints: Endpoints,
    release: PerturbedRelease,
    pads: Mapping[int, ReleasePad],
    log: EventLog,
    notified_digest: bytes = b"",
) -> list[npt.NDArray[np.int64]]:
    """A release of several tables (``mechanism/protocol/tables.py``): each table's observed
    counts over its curators, decrypted and counted chunk by chunk as :func:`count_perturbed`
    does (a table with a curator outside ``pads`` keeps zero counts: the caller reports it)."""
    spec = release.spec
    counts = [np.zeros(int(np.prod([x.alphabet_sizes[j] for j in x.live])), dtype=np.int64) for x in spec.tables]

    def consume(plain: list[SymbolArray | None], start: int) -> None:
        count_rows(plain, spec.tables, start, counts)

    def restart() -> None:
        for c in counts:
            c[:] = 0

    _decrypted_chunks(endpoints, release, pads, consume, restart, log, notified_digest)
    return counts


# ---------------------------------------------------------------------------------- keys
def _key_chunks(
    endpoints: Endpoints, curator: str, address: str, release_id: str, seconds: float = KEY_RPC_SECONDS
) -> tuple[pb.KeyChunk, bytes]:
    """The first KeyChunk (key, schema, sizes) and the joined OTP pad bytes of all chunks."""
    with endpoints.curator_channel(curator, address) as channel:
        stream = pb_grpc.CuratorStub(channel).ReleaseKey(pb.KeyRequest(release_id=release_id), timeout=seconds)
        key = key_from_chunks(stream)
    if key is None:
        raise KeyMismatchError(f"the curator at {address} sent an empty key stream for {release_id!r}")
    return key


def _check_key_head(head: pb.KeyChunk, spec: ReleaseSpec, curator: str) -> None:
    """The key's curator, release, cipher, alphabet size and m must be the release's."""
    expected = (curator, spec.release_id, spec.cipher, spec.alphabet_of(curator), spec.m)
    got = (head.curator, head.release_id, cipher_from_pb(head.cipher), int(head.alphabet_size), int(head.m))
    if got != expected:
        raise KeyMismatchError(
            f"{curator}'s key is for (curator, release, cipher, k, m) = {got}; the release needs {expected}"
        )


def _curator_key(head: pb.KeyChunk, otp: bytes, spec: ReleaseSpec, curator: str) -> CuratorKey:
    """The checked pad and schema of one curator."""
    _check_key_head(head, spec, curator)
    k = spec.alphabet_of(curator)
    segments = spec.segments_of(curator)
    design = bytes(head.design)
    if spec.tables and hashlib.sha256(design).hexdigest() != spec.design_digest:
        raise ReleaseDesignMismatchError(
            f"{curator} sent a design with SHA-256 {hashlib.sha256(design).hexdigest()}; the release runs "
            f"design {spec.design_digest}"
        )
    if spec.cipher is CipherMode.CHACHA20:
        pad = ReleasePad(spec.cipher, k, spec.m, key=PadKey(bytes(head.chacha20_key)), segments=segments)
    else:
        pad = ReleasePad(spec.cipher, k, spec.m, pad_symbols=unpack_symbols(otp, k), segments=segments)
    # The cells are labelled under the release's curator name, whatever the schema file calls it.
    schema = dataclasses.replace(schema_from_pb(head.schema, curator), name=curator)
    if schema.alphabet_size != k:
        raise KeyMismatchError(
            f"{curator}'s schema has {schema.alphabet_size} symbols; the release gives {curator} k = {k}"
        )
    return CuratorKey(curator, pad, schema, design if spec.tables else b"")


def _key_with_backoff(
    endpoints: Endpoints, curator: str, address: str, release_id: str, deadline: FetchDeadline, log: EventLog
) -> tuple[pb.KeyChunk, bytes]:
    """Ask ``curator`` until it answers or says no; UNAVAILABLE-like codes are retried with
    backoff until ``deadline`` (then the last error is raised)."""
    delay = KEY_FIRST_DELAY_S
    while True:
        try:
            return _key_chunks(endpoints, curator, address, release_id, max(0.2, min(KEY_RPC_SECONDS, deadline.left())))
        except grpc.RpcError as exc:
            if exc.code() not in UNAVAILABLE_CODES or deadline.left() <= delay:
                raise
            log("retry", what=f"key_{curator}", code=exc.code().name, delay_s=round(delay, 2))
            time.sleep(delay)
            delay = min(2 * delay, KEY_MAX_DELAY_S)


def fetch_key(
    endpoints: Endpoints, spec: ReleaseSpec, curator: str, log: EventLog, deadline: FetchDeadline | None = None
) -> CuratorKey | tuple[str, str]:
    """``curator``'s checked key, or (``"refused"`` or ``"unavailable"``, why)."""
    address = endpoints.curators.get(curator)
    if address is None:
        log.warning("key_refused", release_id=spec.release_id, curator=curator, code="NO_ADDRESS")
        return "refused", f"no address for curator {curator!r}; pass --curator {curator}=HOST:PORT"
    deadline = deadline or FetchDeadline(KEY_RPC_SECONDS)
    try:
        head, otp = _key_with_backoff(endpoints, curator, address, spec.release_id, deadline, log)
    except grpc.RpcError as exc:
        why = f"{exc.code().name}: {exc.details()}"
        if exc.code() in REFUSAL_CODES:
            log.warning("key_refused", release_id=spec.release_id, curator=curator, code=exc.code().name)
            return "refused", why
        if exc.code() in UNAVAILABLE_CODES:
            log.warning("key_unavailable", release_id=spec.release_id, curator=curator, code=exc.code().name)
            return "unavailable", f"{why} (still unreachable after {deadline.seconds:g} s)"
        raise
    key = _curator_key(head, otp, spec, curator)
    log("key_received", release_id=spec.release_id, curator=curator, cipher=spec.cipher.value)
    return key


def acknowledge_keys(endpoints: Endpoints, release_id: str, curators: Iterable[str], log: EventLog) -> None:
    """Tell each curator whose key was used that the result is durably stored, so it may stop
    serving the key (best effort: a curator that does not hear it serves until its key
    retention ends; never fatal to the release, whose result is already written)."""
    for curator in curators:
        address = endpoints.curators.get(curator)
        if address is None:
            continue
        try:
            with endpoints.curator_channel(curator, address) as channel:
                pb_grpc.CuratorStub(channel).AcknowledgeKey(pb.KeyAck(release_id=release_id), timeout=10.0)
            log("key_acknowledged", release_id=release_id, curator=curator)
        except grpc.RpcError as exc:
            log.warning("key_ack_failed", release_id=release_id, curator=curator, code=exc.code().name,
                        address=address)  # fmt: skip


def fetch_keys(
    endpoints: Endpoints, spec: ReleaseSpec, log: EventLog, deadline: FetchDeadline | None = None
) -> KeyResults:
    """Ask every curator of the release for its key (each until the shared ``deadline``)."""
    answers = {curator: fetch_key(endpoints, spec, curator, log, deadline) for curator in spec.curators}
    return KeyResults(
        granted={c: a for c, a in answers.items() if isinstance(a, CuratorKey)},
        refused={c: a[1] for c, a in answers.items() if isinstance(a, tuple) and a[0] == "refused"},
        unavailable={c: a[1] for c, a in answers.items() if isinstance(a, tuple) and a[0] == "unavailable"},
    )
