"""The Curator gRPC service: tag collection and agreement (leader), and key release.

Roles are checked by ``infra.auth`` before any method here runs (``SubmitTags`` and
``GetAgreement``: curator; ``ReleaseKey``: researcher); this module checks what the access table
cannot know: the caller's certificate name against the ``curator`` field, membership of the
release, and this curator's grants. Every refusal is logged and sent as a named error.

- ``SubmitTags`` / ``GetAgreement``: the leading curator collects every other curator's 16-byte
  id tags and alphabet size (:class:`~secure_release.curator.leader.LeaderState`) and serves
  the spec, the seed and the common tags in chunks of at most 1 MiB.
- ``ReleaseKey``: the ChaCha20 key or the one-time pad (packed, CHUNK_ROWS symbols a chunk)
  plus this curator's schema, to a granted researcher.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from secure_release.curator.errors import (
    AgreementNotReadyError,
    CallerNotAllowedError,
    KeyNotReadyError,
    NotLeadingError,
    TagLimitError,
    TagsMissingError,
    TagStreamError,
    UnknownReleaseError,
)
from secure_release.curator.leader import LeaderState
from secure_release.infra.auth import caller
from secure_release.infra.errors import abort_with
from secure_release.infra.logs import EventLog
from secure_release.infra.wire import TAG_BYTES, cipher_to_pb, schema_to_pb, spec_to_pb, tag_pieces, tags_from_bytes
from secure_release.mechanism.alignment import TagArray
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.packing import CHUNK_ROWS, pack_symbols
from secure_release.mechanism.pads import CipherMode, ReleasePad
from secure_release.mechanism.protocol import Agreement
from secure_release.mechanism.schema import CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

SERVICE_NAME = "securerelease.v1.Curator"
MAX_AGREEMENT_WAIT_S = 600.0
DEFAULT_MAX_ROWS = 10_000_000  # --max-rows: tags a follower may send (16 bytes each)


@dataclass(frozen=True)
class TagSubmission:
    """One curator's tag stream, read and checked."""

    release_id: str
    tags: TagArray
    alphabet_size: int


def read_tag_stream(chunks: Iterable[pb.TagChunk], sender: str, admit: Callable[[str], int]) -> TagSubmission:
    """Join a TagChunk stream sent by certificate name ``sender``. ``admit(release_id)`` runs on
    the first chunk, before any tag byte is kept: it refuses a sender that is not a curator of
    a release led here, and returns how many tag bytes the sender may send (more: a
    :class:`TagLimitError`). Named errors too if a chunk claims another curator, another
    release or the wrong sequence number."""
    pieces: list[bytes] = []
    release_id, alphabet_size, limit, received = "", 0, 0, 0
    for expected_seq, chunk in enumerate(chunks):
        if chunk.curator != sender:
            raise CallerNotAllowedError(f"certificate name {sender!r} may not submit tags as {chunk.curator!r}")
        if expected_seq == 0:
            limit = admit(chunk.release_id)
        elif chunk.release_id != release_id:
            raise TagStreamError(f"one release per tag stream: {release_id!r}, then {chunk.release_id!r}")
        if chunk.sequence != expected_seq:
            raise TagStreamError(f"tag chunk {chunk.sequence} out of order (expected {expected_seq})")
        received += len(chunk.tags)
        if received > limit:
            raise TagLimitError(
                f"{sender!r} sent more than {limit // TAG_BYTES} tags for release {chunk.release_id!r}; "
                "the leader accepts at most --max-rows tags a curator"
            )
        release_id = chunk.release_id
        alphabet_size = alphabet_size or int(chunk.alphabet_size)
        pieces.append(chunk.tags)
        if chunk.last:
            break
    return TagSubmission(release_id, tags_from_bytes(b"".join(pieces)), alphabet_size)


def agreement_chunks(agreement: Agreement) -> Iterator[pb.AgreementChunk]:
    """The agreement as AgreementChunk messages: spec and seed on the first, common tags in
    pieces of at most 1 MiB."""
    pieces = tag_pieces(agreement.common)
    for seq, piece in enumerate(pieces):
        chunk = pb.AgreementChunk(sequence=seq, common_tags=piece, last=seq == len(pieces) - 1)
        if seq == 0:
            chunk.params.CopyFrom(spec_to_pb(agreement.spec))
            chunk.sampling_seed = agreement.seed.reveal()
        yield chunk


def key_chunks(release_id: str, schema: CuratorSchema, pad: ReleasePad) -> Iterator[pb.KeyChunk]:
    """A release's key as KeyChunk messages: the ChaCha20 key in one, or the one-time pad packed
    CHUNK_ROWS symbols a chunk; the first carries cipher, sizes and ``schema``."""
    head = pb.KeyChunk(
        release_id=release_id,
        curator=schema.name,
        cipher=cipher_to_pb(pad.mode),
        alphabet_size=pad.alphabet_size,
        m=pad.length,
        sequence=0,
    )
    head.schema.CopyFrom(schema_to_pb(schema))
    if pad.mode is CipherMode.CHACHA20:
        assert pad.key is not None
        head.chacha20_key = pad.key.reveal()
        head.last = True
        yield head
        return
    count = max(1, -(-pad.length // CHUNK_ROWS))
    for seq in range(count):
        chunk = head if seq == 0 else pb.KeyChunk(release_id=release_id, curator=schema.name, sequence=seq)
        start = seq * CHUNK_ROWS
        chunk.otp_pad = pack_symbols(pad.pad(start, min(CHUNK_ROWS, pad.length - start)), pad.alphabet_size)
        chunk.last = seq == count - 1
        yield chunk


@dataclass
class KeyRecord:
    """A release's pad and who may fetch it (and who did)."""

    pad: ReleasePad
    grants: frozenset[str]
    served: set[str] = field(default_factory=set)


class CuratorService(pb_grpc.CuratorServicer):
    """One curator's gRPC endpoint; the run thread adds leader states and keys."""

    def __init__(self, name: str, schema: CuratorSchema, log: EventLog, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        """Curator ``name`` whose keys carry ``schema``; every grant and refusal goes to ``log``;
        a follower may send at most ``max_rows`` tags."""
        self.name, self.schema, self.log = name, schema, log
        self.max_tag_bytes = max_rows * TAG_BYTES
        self.leading: dict[str, LeaderState] = {}
        self.keys: dict[str, KeyRecord] = {}
        self.pending: dict[str, str] = {}  # release id -> why its key is not served (yet)
        self.keys_served = threading.Condition()

    # ----------------------------------------------------------------- leader side
    def lead(self, state: LeaderState) -> None:
        """Lead ``state.release_id``: accept tags and serve its agreement."""
        self.leading[state.release_id] = state

    def _leading_for(self, release_id: str, member: str) -> LeaderState:
        state = self.leading.get(release_id)
        if state is None:
            raise NotLeadingError(f"curator {self.name} does not lead release {release_id!r}")
        if member not in state.curators:
            raise CallerNotAllowedError(f"{member!r} is not a curator of release {release_id!r}")
        return state

    def SubmitTags(  # noqa: N802
        self, request_iterator: Iterator[pb.TagChunk], context: grpc.ServicerContext
    ) -> pb.SubmitTagsResponse:
        """A follower's tags and alphabet size, for a release this curator leads."""
        ident = caller(context)

        def admit(release_id: str) -> int:
            self._leading_for(release_id, ident.name)
            if ident.name == self.name:
                raise CallerNotAllowedError(f"the leader {self.name!r} adds its own tags; it may not submit them")
            return self.max_tag_bytes

        state: LeaderState | None = None
        try:
            got = read_tag_stream(request_iterator, ident.name, admit)
            state = self._leading_for(got.release_id, ident.name)
            state.add_tags(ident.name, got.tags, got.alphabet_size)
        except SecureReleaseError as exc:
            self.log.warning("tags_refused", caller=str(ident), reason=f"{type(exc).__name__}: {exc}")
            if state is not None and state.error is not None:
                state.mark_told(ident.name)
            abort_with(context, exc)
        self.log(
            "tags_received",
            release_id=got.release_id,
            curator=ident.name,
            tags=int(got.tags.size),
            alphabet_size=state.sizes.get(ident.name, got.alphabet_size),
        )
        return pb.SubmitTagsResponse(release_id=got.release_id, tags_received=int(got.tags.size))

    def GetAgreement(  # noqa: N802
        self, request: pb.AgreementRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.AgreementChunk]:
        """The spec, seed and common tags, to a curator of the release (waits until fixed)."""
        ident = caller(context)
        remaining = context.time_remaining()
        timeout = MAX_AGREEMENT_WAIT_S if remaining is None else min(remaining - 0.5, MAX_AGREEMENT_WAIT_S)
        state: LeaderState | None = None
        try:
            if request.curator != ident.name:
                raise CallerNotAllowedError(f"certificate name {ident.name!r} may not ask as {request.curator!r}")
            state = self._leading_for(request.release_id, ident.name)
            if state.lacks_tags_of(ident.name):
                raise TagsMissingError(f"no tags from {ident.name!r} for {request.release_id!r} here; send them again")
            agreement = state.wait_agreement(max(timeout, 0.0))
            if agreement is None:
                raise AgreementNotReadyError(f"the agreement of {request.release_id!r} is not ready yet; retry")
        except SecureReleaseError as exc:
            self.log.warning("agreement_refused", caller=str(ident), reason=f"{type(exc).__name__}: {exc}")
            if state is not None and state.error is not None:
                state.mark_told(ident.name)
            abort_with(context, exc)
        self.log(
            "agreement_served",
            release_id=request.release_id,
            curator=ident.name,
            common=int(agreement.common.size),
        )
        yield from agreement_chunks(agreement)

    # ----------------------------------------------------------------- key release
    def add_release(self, release_id: str, pad: ReleasePad, grants: Sequence[str]) -> None:
        """Serve ``pad`` for ``release_id`` to the researchers in ``grants``."""
        self.keys[release_id] = KeyRecord(pad, frozenset(grants))

    def wait_keys_served(self, release_id: str, timeout: float | None = None) -> bool:
        """Block until every granted researcher fetched this release's key (False on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.keys_served:
            while True:
                rec = self.keys.get(release_id)
                if rec is not None and rec.grants <= rec.served:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.keys_served.wait(left if left is not None else 1.0)

    def hold_key(self, release_id: str, why: str) -> None:
        """Answer key requests for ``release_id`` with UNAVAILABLE (``why``) until it is added."""
        self.pending[release_id] = why

    def _granted_record(self, release_id: str, researcher: str) -> KeyRecord:
        rec = self.keys.get(release_id)
        if rec is None and release_id in self.pending:
            raise KeyNotReadyError(
                f"curator {self.name} does not serve the key of {release_id!r} yet ({self.pending[release_id]}); retry"
            )
        if rec is None:
            raise UnknownReleaseError(f"no key for release {release_id!r} at {self.name}")
        if researcher not in rec.grants:
            raise CallerNotAllowedError(
                f"curator {self.name} has not granted {researcher!r} access to release {release_id!r}"
            )
        return rec

    def ReleaseKey(  # noqa: N802
        self, request: pb.KeyRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.KeyChunk]:
        """This curator's key for a release, to a researcher it granted (every grant and
        refusal logged)."""
        ident = caller(context)
        try:
            rec = self._granted_record(request.release_id, ident.name)
        except SecureReleaseError as exc:
            self.log.warning("key_refused", release_id=request.release_id, caller=str(ident), reason=type(exc).__name__)
            abort_with(context, exc)
        self.log("key_granted", release_id=request.release_id, caller=str(ident), cipher=rec.pad.mode.value)
        yield from key_chunks(request.release_id, self.schema, rec.pad)
        with self.keys_served:
            rec.served.add(ident.name)
            self.keys_served.notify_all()
