"""The Curator gRPC service: tag collection and agreement (leader), and key release.

Roles are checked by ``infra.auth`` before any method here runs (``SubmitTags`` and
``GetAgreement``: curator; ``ReleaseKey``: researcher); this module checks what the access table
cannot know: the caller's certificate name against the ``curator`` field, membership of the
release, and this curator's grants. Every refusal is logged and sent as a named error.

- ``SubmitTags`` / ``GetAgreement``: the leading curator collects every other curator's 16-byte
  id tags and alphabet size (:class:`~secure_release.curator.leader.LeaderState`; a follower on
  a cluster may send them as concurrent parts, each stream one part) and serves the spec, the
  seed and the common tags in chunks of at most 1 MiB.
- ``PsiSend`` / ``PsiReceive`` (``--alignment psi``): the leader is the mailbox of the ECDH ring;
  a curator sends the list it is due to hand on (sender, owner and hop checked against the ring,
  the point count against ``--max-rows`` and the owner's list, all before a point is buffered)
  and fetches the list routed to it, in chunks of at most 1 MiB.
- ``ReleaseKey``: the ChaCha20 key or the one-time pad (packed, CHUNK_ROWS symbols a chunk)
  plus this curator's schema, to a granted researcher.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import grpc

from secure_release.curator.errors import (
    AgreementNotReadyError,
    KeyNotReadyError,
    NotLeadingError,
    PsiNotReadyError,
    TagsMissingError,
    UnknownReleaseError,
)
from secure_release.curator.leader import LeaderState
from secure_release.curator.psi_mailbox import SliceShape, from_wire
from secure_release.infra.auth import caller
from secure_release.infra.errors import abort_with
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import (
    TAG_BYTES,
    CallerNotAllowedError,
    TagStream,
    agreement_chunks,
    key_chunks,
    point_chunks,
    read_point_stream,
)
from secure_release.mechanism.alignment.psi import POINT_BYTES
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.primitives.pads import ReleasePad
from secure_release.mechanism.schema import CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

SERVICE_NAME = "securerelease.v1.Curator"
#: Calls the Curator service takes from one peer at once: a follower's tag streams (at most
#: :data:`TAG_STREAMS_PER_PEER`, one per run of its shards), its GetAgreement and a failure report.
CALLS_PER_PEER = 10
TAG_STREAMS_PER_PEER = CALLS_PER_PEER - 2
MAX_AGREEMENT_WAIT_S = 600.0
DEFAULT_MAX_ROWS = 1 << 24  # --max-rows: tags a follower may send (16 bytes each: 256 MiB)


@dataclass
class KeyRecord:
    """A release's pad and who may fetch it (and who did)."""

    pad: ReleasePad
    grants: frozenset[str]
    served: set[str] = field(default_factory=set)
    acknowledged: set[str] = field(default_factory=set)  # stored their result: the key is no longer needed
    design: bytes = b""  # a release of a design's tables: the design file, sent with the key


def _slice_shape(index: int, slices: int, first: int, total: int, count: int) -> SliceShape | None:
    """The slice a PsiChunk's first chunk announces (None: a whole list)."""
    return from_wire((int(index), int(slices), int(first), int(total)), int(count)) if slices else None


def _wait_seconds(context: grpc.ServicerContext) -> float:
    """How long a waiting leader-side call may block: half the caller's deadline, at most
    MAX_AGREEMENT_WAIT_S; the other half is left for the answer's transfer (the common tags are
    16 bytes an id: 160 MB at 10^7 ids), so a call that waited never runs out mid-stream."""
    remaining = context.time_remaining()
    return MAX_AGREEMENT_WAIT_S if remaining is None else min(remaining / 2, MAX_AGREEMENT_WAIT_S)


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
        first = next(iter(request_iterator), None)
        if first is not None and first.failure:
            return self._follower_failed(first, ident.name, str(ident), admit, context)
        chunks = itertools.chain([first] if first is not None else [], request_iterator)
        try:
            stream = TagStream(chunks, ident.name, admit)
            stream.start()
            state = self._leading_for(stream.release_id, ident.name)
            count = state.add_tag_stream(
                ident.name, stream.pieces(), stream.alphabet_size, stream.alignment, stream.part
            )
        except SecureReleaseError as exc:
            self._refuse(context, "tags_refused", str(ident), ident.name, state, exc)
        self.log(
            "tags_received",
            release_id=stream.release_id,
            curator=ident.name,
            tags=count,
            alphabet_size=state.sizes.get(ident.name, stream.alphabet_size),
            **({} if stream.part.whole else {"part": stream.part.index, "parts": stream.part.count}),
        )
        return pb.SubmitTagsResponse(release_id=stream.release_id, tags_received=count)

    def _follower_failed(
        self, chunk: pb.TagChunk, name: str, who: str, admit: Callable[[str], int], context: grpc.ServicerContext
    ) -> pb.SubmitTagsResponse:
        """A follower cannot take part (it failed before the agreement): fail the agreement for
        every party at once with its reason."""
        state: LeaderState | None = None
        try:
            if chunk.curator != name:
                raise CallerNotAllowedError(f"certificate name {name!r} may not report for {chunk.curator!r}")
            admit(chunk.release_id)
            state = self._leading_for(chunk.release_id, name)
        except SecureReleaseError as exc:
            self._refuse(context, "tags_refused", who, name, state, exc)
        reason = chunk.failure[:2000]
        self.log.warning("curator_failed", release_id=chunk.release_id, curator=name, reason=reason)
        state.fail(reason)
        state.mark_told(name)
        return pb.SubmitTagsResponse(release_id=chunk.release_id, tags_received=0)

    def _asked_by(self, release_id: str, curator: str, certificate_name: str) -> LeaderState:
        """The leader state of ``release_id`` for a call made as ``curator``, which must be the
        caller's certificate name and a curator of the release."""
        if curator != certificate_name:
            raise CallerNotAllowedError(f"certificate name {certificate_name!r} may not ask as {curator!r}")
        return self._leading_for(release_id, certificate_name)

    def GetAgreement(  # noqa: N802
        self, request: pb.AgreementRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.AgreementChunk]:
        """The spec, seed and common tags, to a curator of the release (waits until fixed)."""
        ident = caller(context)
        timeout = _wait_seconds(context)
        state: LeaderState | None = None
        try:
            state = self._asked_by(request.release_id, request.curator, ident.name)
            if state.lacks_tags_of(ident.name):
                raise TagsMissingError(f"no tags from {ident.name!r} for {request.release_id!r} here; send them again")
            agreement = state.wait_agreement(max(timeout, 0.0))
            if agreement is None:
                raise AgreementNotReadyError(f"the agreement of {request.release_id!r} is not ready yet; retry")
        except SecureReleaseError as exc:
            self._refuse(context, "agreement_refused", str(ident), ident.name, state, exc)
        self.log(
            "agreement_served",
            release_id=request.release_id,
            curator=ident.name,
            common=agreement.num_common,
            sampling=agreement.sampling.value,
            sample_bytes=agreement.agreement_sample_bytes,
        )
        yield from agreement_chunks(agreement, state.rows_of(ident.name) if state is not None else None)

    def _refuse(
        self,
        context: grpc.ServicerContext,
        event: str,
        who: str,
        name: str,
        state: LeaderState | None,
        exc: SecureReleaseError,
    ) -> NoReturn:
        """Log a leader-side refusal, note that a failed agreement was told, end the RPC."""
        self.log.warning(event, caller=who, reason=f"{type(exc).__name__}: {exc}")
        if state is not None and state.error is not None:
            state.mark_told(name)
        abort_with(context, exc)

    # ----------------------------------------------------------------- PSI ring (leader side)
    def PsiSend(  # noqa: N802
        self, request_iterator: Iterator[pb.PsiChunk], context: grpc.ServicerContext
    ) -> pb.PsiSendResponse:
        """A curator's ring list, or one slice of it, for its next curator (membership, route,
        size and slice bounds checked on the first chunk, before any point is buffered)."""
        ident = caller(context)
        state: LeaderState | None = None

        def admit(chunk: pb.PsiChunk) -> None:
            nonlocal state
            state = self._leading_for(chunk.release_id, ident.name)
            shape = _slice_shape(chunk.slice, chunk.slices, chunk.first_point, chunk.list_count, chunk.count)
            state.psi_admit(ident.name, chunk.owner, int(chunk.hop), int(chunk.count), shape)

        try:
            got = read_point_stream(request_iterator, ident.name, admit)
            state = self._leading_for(got.release_id, ident.name)
            points = len(got.points) // POINT_BYTES
            if got.slice is None:
                state.psi_put(ident.name, got.owner, got.hop, got.points, got.proof, got.public_key)
            else:
                state.psi_put_slice(ident.name, got.owner, got.hop, from_wire(got.slice, points), got.points,
                                    got.proof, got.public_key)  # fmt: skip
        except SecureReleaseError as exc:
            self._refuse(context, "psi_refused", str(ident), ident.name, state, exc)
        if got.slice is None or got.slice[0] in (0, got.slice[1] - 1):  # a sliced list: its first and last slices
            which = None if got.slice is None else f"{got.slice[0] + 1}/{got.slice[1]}"
            self.log("psi_received", release_id=got.release_id, sender=ident.name, owner=got.owner, hop=got.hop,
                     points=points, slice=which)  # fmt: skip
        return pb.PsiSendResponse(release_id=got.release_id, points_received=points)

    def PsiReceive(  # noqa: N802
        self, request: pb.PsiRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.PsiChunk]:
        """The ring list routed to the caller, or one slice of it (waits until it arrived,
        bounded by the deadline)."""
        ident = caller(context)
        timeout = _wait_seconds(context)
        state: LeaderState | None = None
        wire: tuple[int, int, int, int] | None = None
        try:
            state = self._asked_by(request.release_id, request.curator, ident.name)
            if request.sliced:
                got = state.psi_get_slice(ident.name, request.owner, int(request.hop), int(request.slice),
                                          max(timeout, 0.0))  # fmt: skip
                points, wire = (None, None) if got is None else (got[1], got[0].wire)
            else:
                points = state.psi_get(ident.name, request.owner, int(request.hop), max(timeout, 0.0))
            if points is None:
                which = f"slice {request.slice} of the PSI list" if request.sliced else "the PSI list"
                raise PsiNotReadyError(
                    f"{which} of {request.owner!r} at hop {request.hop} has not reached the leader yet; retry"
                )
        except SecureReleaseError as exc:
            self._refuse(context, "psi_refused", str(ident), ident.name, state, exc)
        if wire is None or wire[0] in (0, wire[1] - 1):
            self.log("psi_served", release_id=request.release_id, recipient=ident.name, owner=request.owner,
                     hop=request.hop, points=len(points) // POINT_BYTES,
                     slice=None if wire is None else f"{wire[0] + 1}/{wire[1]}")  # fmt: skip
        yield from point_chunks(request.release_id, self.name, request.owner, int(request.hop), points, slice_of=wire)

    # ----------------------------------------------------------------- key release
    def add_release(self, release_id: str, pad: ReleasePad, grants: Sequence[str], design: bytes = b"") -> None:
        """Serve ``pad`` for ``release_id`` to the researchers in ``grants`` (with ``design``, the
        design file of a release of several tables)."""
        self.keys[release_id] = KeyRecord(pad, frozenset(grants), design=design)

    def wait_keys_served(self, release_id: str, timeout: float | None = None) -> bool:
        """Block until every granted researcher fetched this release's key (False on timeout)."""
        return self._wait_for_all(release_id, lambda rec: rec.served, timeout)

    def wait_keys_acknowledged(self, release_id: str, timeout: float | None = None) -> bool:
        """Block until every granted researcher acknowledged this release's key, i.e. stored
        its result durably (False on timeout)."""
        return self._wait_for_all(release_id, lambda rec: rec.acknowledged, timeout)

    def _wait_for_all(
        self, release_id: str, done: Callable[[KeyRecord], set[str]], timeout: float | None
    ) -> bool:
        """Block until every grant of the release's key is in ``done(record)`` (False on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.keys_served:
            while True:
                rec = self.keys.get(release_id)
                if rec is not None and rec.grants <= done(rec):
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.keys_served.wait(left if left is not None else 1.0)

    def unacknowledged(self, release_id: str) -> list[str]:
        """The granted researchers that have not acknowledged the key yet."""
        rec = self.keys.get(release_id)
        return [] if rec is None else sorted(rec.grants - rec.acknowledged)

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
        yield from key_chunks(request.release_id, self.schema, rec.pad, rec.design)
        with self.keys_served:
            rec.served.add(ident.name)
            self.keys_served.notify_all()

    def AcknowledgeKey(self, request: pb.KeyAck, context: grpc.ServicerContext) -> pb.KeyAckResponse:  # noqa: N802
        """A granted researcher stored its result durably: it needs this key no more
        (idempotent; logged)."""
        ident = caller(context)
        try:
            rec = self._granted_record(request.release_id, ident.name)
        except SecureReleaseError as exc:
            self.log.warning("ack_refused", release_id=request.release_id, caller=str(ident), reason=type(exc).__name__)
            abort_with(context, exc)
        with self.keys_served:
            rec.acknowledged.add(ident.name)
            done = rec.grants <= rec.acknowledged
            self.keys_served.notify_all()
        self.log("key_acknowledged", release_id=request.release_id, caller=str(ident), all_acknowledged=done)
        return pb.KeyAckResponse(all_acknowledged=done)
