"""The Curator gRPC service: tag collection and agreement (leader), and key release.

- ``SubmitTags`` / ``GetAgreement`` (curator role only, and the caller's certificate name must
  be the ``curator`` field): the leading curator collects every other curator's 16-byte id tags
  and alphabet size (``TagChunk.alphabet_size``), computes the common tags (canonical order), n,
  the plan and a fresh sampling seed, and serves params + seed + common tags in chunks of at
  most 1 MiB.
- ``ReleaseKey`` (researcher role only): checks the caller's certificate name against this
  curator's grants for that release, logs every grant and refusal, and streams the ChaCha20 key
  or the one-time pad (packed, CHUNK_ROWS symbols a chunk) plus this curator's schema.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from secure_release.infra.config import JsonLog
from secure_release.infra.tls import require_role
from secure_release.mechanism.alignment import TAG_DTYPE, TagArray, common_tags
from secure_release.mechanism.keys import Seed
from secure_release.mechanism.packing import CHUNK_ROWS, pack_symbols
from secure_release.mechanism.pads import CipherMode, ReleasePad
from secure_release.mechanism.plan import ReleasePlan, plan_release
from secure_release.mechanism.schema import CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

TAG_BYTES = TAG_DTYPE.itemsize
TAGS_PER_CHUNK = (1 << 20) // TAG_BYTES  # 1 MiB of tags a message

PB_CIPHER = {CipherMode.OTP: pb.CIPHER_MODE_OTP, CipherMode.CHACHA20: pb.CIPHER_MODE_CHACHA20}
CIPHER_OF_PB = {v: k for k, v in PB_CIPHER.items()}


def schema_pb(schema: CuratorSchema) -> pb.CuratorSchema:
    return pb.CuratorSchema(
        curator=schema.name,
        attributes=[pb.Attribute(name=a.name, categories=list(a.categories)) for a in schema.attributes],
    )


def params_pb(
    release_id: str, plan: ReleasePlan, curators: Sequence[str], cipher: CipherMode, researcher: str
) -> pb.ReleaseParams:
    return pb.ReleaseParams(
        release_id=release_id,
        n=plan.n,
        m=plan.m,
        epsilon=plan.epsilon,
        gamma=plan.gamma,
        curators=list(curators),
        alphabet_sizes=list(plan.alphabet_sizes),
        cipher=PB_CIPHER[cipher],
        researcher=researcher,
    )


def tag_chunks(
    release_id: str, curator: str, tags: TagArray, alphabet_size: int
) -> Iterator[pb.TagChunk]:
    raw = np.ascontiguousarray(tags, dtype=TAG_DTYPE).tobytes()
    step = TAGS_PER_CHUNK * TAG_BYTES
    pieces = [raw[i : i + step] for i in range(0, len(raw), step)] or [b""]
    for seq, piece in enumerate(pieces):
        yield pb.TagChunk(
            release_id=release_id,
            curator=curator,
            sequence=seq,
            tags=piece,
            last=seq == len(pieces) - 1,
            alphabet_size=alphabet_size,
        )


def tags_from_bytes(raw: bytes) -> TagArray:
    if len(raw) % TAG_BYTES:
        raise ValueError(f"{len(raw)} tag bytes is not a multiple of {TAG_BYTES}")
    return np.frombuffer(raw, dtype=TAG_DTYPE).copy()


class AlphabetSizeMismatchError(ValueError):
    """A curator's alphabet size contradicts the leader's --alphabet-sizes (or is missing)."""


@dataclass
class LeaderState:
    """What the leading curator collects for one release.

    Every curator's alphabet size comes with its tags (``TagChunk.alphabet_size``; the leader
    adds its own). ``expected_sizes`` (the optional ``--alphabet-sizes``) only cross-checks them:
    a curator whose size differs fails the agreement with an :class:`AlphabetSizeMismatchError`.
    """

    release_id: str
    curators: tuple[str, ...]  # joint-code order, leader included
    expected_sizes: tuple[int, ...] | None
    epsilon: float
    m: int | None
    cipher: CipherMode
    researcher: str
    seed: Seed | None = None  # injected for tests; else fresh per release
    tags: dict[str, TagArray] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    params: pb.ReleaseParams | None = None
    common: TagArray | None = None
    error: str | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        if self.expected_sizes is not None and len(self.expected_sizes) != len(self.curators):
            raise ValueError(
                f"--alphabet-sizes has {len(self.expected_sizes)} entries for "
                f"{len(self.curators)} curators"
            )

    def _checked_size(self, curator: str, alphabet_size: int) -> int:
        expected = (
            None
            if self.expected_sizes is None
            else self.expected_sizes[self.curators.index(curator)]
        )
        if alphabet_size == 0:  # a curator that does not send its size
            if expected is None:
                raise AlphabetSizeMismatchError(
                    f"curator {curator!r} sent no alphabet size with its tags; upgrade it or "
                    "give the leader --alphabet-sizes"
                )
            return expected
        if expected is not None and alphabet_size != expected:
            raise AlphabetSizeMismatchError(
                f"release {self.release_id!r}: curator {curator!r} has alphabet size "
                f"{alphabet_size}, but --alphabet-sizes at the leader says {expected}"
            )
        return alphabet_size

    def add_tags(self, curator: str, tags: TagArray, alphabet_size: int) -> None:
        """Record a curator's tags and alphabet size. A size that contradicts
        ``expected_sizes`` fails the whole agreement (and raises AlphabetSizeMismatchError)."""
        with self.cond:
            try:
                size = self._checked_size(curator, alphabet_size)
            except AlphabetSizeMismatchError as exc:
                if self.params is None:
                    self.error = str(exc)
                    self.cond.notify_all()
                raise
            if self.params is not None:
                if (
                    curator in self.tags
                    and np.array_equal(self.tags[curator], tags)
                    and self.sizes.get(curator) == size
                ):
                    return  # idempotent resubmission
                raise ValueError("the agreement is already fixed; tags can no longer change")
            self.tags[curator] = tags
            self.sizes[curator] = size
            self.cond.notify_all()

    def wait_all_tags(self, timeout: float) -> bool:
        """Until every curator's tags arrived (True), the agreement failed, or the timeout."""
        with self.cond:
            return self.cond.wait_for(
                lambda: self.error is not None or set(self.curators) <= set(self.tags), timeout
            ) and self.error is None

    def agree(self) -> tuple[pb.ReleaseParams, Seed, TagArray]:
        """Common tags, n, the plan and the seed (call once every curator's tags arrived)."""
        with self.cond:
            common = np.ascontiguousarray(common_tags([self.tags[c] for c in self.curators]).astype(TAG_DTYPE))
            sizes = tuple(self.sizes[c] for c in self.curators)
            plan = plan_release(int(common.size), sizes, self.epsilon, self.m)
            if self.seed is None:
                self.seed = Seed.generate()
            self.common = common
            self.params = params_pb(self.release_id, plan, self.curators, self.cipher, self.researcher)
            self.cond.notify_all()
            return self.params, self.seed, common

    def fail(self, message: str) -> None:
        with self.cond:
            self.error = message
            self.cond.notify_all()


@dataclass
class KeyRecord:
    pad: ReleasePad
    grants: frozenset[str]
    served: set[str] = field(default_factory=set)


class CuratorService(pb_grpc.CuratorServicer):
    def __init__(self, name: str, schema: CuratorSchema, log: JsonLog) -> None:
        self.name, self.schema, self.log = name, schema, log
        self.leading: dict[str, LeaderState] = {}
        self.keys: dict[str, KeyRecord] = {}
        self.keys_served = threading.Condition()

    # ----------------------------------------------------------------- leader side
    def lead(self, state: LeaderState) -> None:
        self.leading[state.release_id] = state

    def SubmitTags(  # noqa: N802
        self, request_iterator: Iterator[pb.TagChunk], context: grpc.ServicerContext
    ) -> pb.SubmitTagsResponse:
        ident = require_role(context, "curator")
        buf: list[bytes] = []
        release_id = ""
        alphabet_size = 0
        for expected_seq, chunk in enumerate(request_iterator):
            if chunk.curator != ident.name:
                self.log(
                    "tags_refused",
                    release_id=chunk.release_id,
                    caller=str(ident),
                    reason="name mismatch",
                )
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"certificate name {ident.name!r} may not submit tags as {chunk.curator!r}",
                )
            if release_id and chunk.release_id != release_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "one release per tag stream")
            if chunk.sequence != expected_seq:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"tag chunk {chunk.sequence} out of order (expected {expected_seq})",
                )
            release_id = chunk.release_id
            alphabet_size = alphabet_size or int(chunk.alphabet_size)
            buf.append(chunk.tags)
            if chunk.last:
                break
        state = self.leading.get(release_id)
        if state is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"this curator does not lead release {release_id!r}")
        if ident.name not in state.curators or ident.name == self.name:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{ident.name!r} is not a curator of release {release_id!r}",
            )
        try:
            tags = tags_from_bytes(b"".join(buf))
            state.add_tags(ident.name, tags, alphabet_size)
        except AlphabetSizeMismatchError as exc:
            self.log("tags_refused", release_id=release_id, caller=str(ident), reason=str(exc))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        self.log(
            "tags_received",
            release_id=release_id,
            curator=ident.name,
            tags=int(tags.size),
            alphabet_size=state.sizes.get(ident.name, alphabet_size),
        )
        return pb.SubmitTagsResponse(release_id=release_id, tags_received=int(tags.size))

    def GetAgreement(  # noqa: N802
        self, request: pb.AgreementRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.AgreementChunk]:
        ident = require_role(context, "curator")
        if request.curator != ident.name:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"certificate name {ident.name!r} may not ask as {request.curator!r}",
            )
        state = self.leading.get(request.release_id)
        if state is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"this curator does not lead release {request.release_id!r}",
            )
        if ident.name not in state.curators:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{ident.name!r} is not a curator of release {request.release_id!r}",
            )
        remaining = context.time_remaining()
        timeout = min(remaining, 600.0) if remaining is not None else 600.0
        with state.cond:
            ready = state.cond.wait_for(lambda: state.params is not None or state.error is not None, timeout)
        if state.error is not None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, state.error)
        if not ready:
            context.abort(grpc.StatusCode.UNAVAILABLE, "agreement not ready yet; retry")
        assert state.params is not None and state.seed is not None and state.common is not None
        raw = state.common.tobytes()
        step = TAGS_PER_CHUNK * TAG_BYTES
        pieces = [raw[i : i + step] for i in range(0, len(raw), step)] or [b""]
        self.log(
            "agreement_served",
            release_id=request.release_id,
            curator=ident.name,
            common=int(state.common.size),
        )
        for seq, piece in enumerate(pieces):
            chunk = pb.AgreementChunk(sequence=seq, common_tags=piece, last=seq == len(pieces) - 1)
            if seq == 0:
                chunk.params.CopyFrom(state.params)
                chunk.sampling_seed = state.seed.reveal()
            yield chunk

    # ----------------------------------------------------------------- key release
    def add_release(self, release_id: str, pad: ReleasePad, grants: Sequence[str]) -> None:
        self.keys[release_id] = KeyRecord(pad, frozenset(grants))

    def wait_keys_served(self, release_id: str, timeout: float | None = None) -> bool:
        """Block until every granted researcher fetched this release's key."""
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

    def ReleaseKey(  # noqa: N802
        self, request: pb.KeyRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.KeyChunk]:
        ident = require_role(context, "researcher")
        rec = self.keys.get(request.release_id)
        if rec is None:
            self.log(
                "key_refused",
                release_id=request.release_id,
                caller=str(ident),
                reason="unknown release",
            )
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no key for release {request.release_id!r} at {self.name}",
            )
        if ident.name not in rec.grants:
            self.log("key_refused", release_id=request.release_id, caller=str(ident), reason="no grant")
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"curator {self.name} has not granted {ident.name!r} access to release {request.release_id!r}",
            )
        self.log(
            "key_granted",
            release_id=request.release_id,
            caller=str(ident),
            cipher=rec.pad.mode.value,
        )
        pad = rec.pad
        head = pb.KeyChunk(
            release_id=request.release_id,
            curator=self.name,
            cipher=PB_CIPHER[pad.mode],
            alphabet_size=pad.alphabet_size,
            m=pad.length,
            sequence=0,
        )
        head.schema.CopyFrom(schema_pb(self.schema))
        if pad.mode is CipherMode.CHACHA20:
            assert pad.key is not None
            head.chacha20_key = pad.key.reveal()
            head.last = True
            yield head
        else:
            count = max(1, -(-pad.length // CHUNK_ROWS))
            for seq in range(count):
                chunk = (
                    head if seq == 0 else pb.KeyChunk(release_id=request.release_id, curator=self.name, sequence=seq)
                )
                chunk.otp_pad = pack_symbols(
                    pad.pad(seq * CHUNK_ROWS, min(CHUNK_ROWS, pad.length - seq * CHUNK_ROWS)),
                    pad.alphabet_size,
                )
                chunk.last = seq == count - 1
                yield chunk
        with self.keys_served:
            rec.served.add(ident.name)
            self.keys_served.notify_all()
