"""The release state machine of the server: pure (no I/O, no clock, no randomness).

    REGISTERED --first chunk--> UPLOADING --every curator committed--> SEALED --PRAM--> PERTURBED
         |                          |
         +------------+-------------+
                      | a curator aborts (before sealing)
                      v
                   ABORTED (reason recorded; nothing more accepted or served)

Replays of an identical chunk or commit succeed in every state (a restarted curator resumes).

Every method validates completely before it changes anything, so a method that raises leaves
the release exactly as it was. The store (server/store.py) persists what the machine accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from secure_release.mechanism.errors import ErrorKind, SecureReleaseError
from secure_release.mechanism.protocol.spec import DEFAULT_MAX_EPSILON, ReleaseSpec


@dataclass(frozen=True)
class ServerLimits:
    """What one server accepts, checked before anything is allocated (all configurable)."""

    max_n: int = 1 << 40
    max_m: int = 100_000_000
    max_curators: int = 16
    max_releases_in_flight: int = 64
    max_tables: int = 16  # stored tables held at once (server-side sampling)
    max_table_rows: int = 100_000_000  # n of one stored table
    max_epsilon: float = DEFAULT_MAX_EPSILON  # the operator's cap on one release's epsilon
    max_tables_per_curator: int = 4  # stored tables one certificate may have created and still hold

    def check(self, spec: ReleaseSpec) -> None:
        """Refuse a spec beyond these bounds (LimitExceededError says which and the limit)."""
        if not spec.plan.epsilon <= self.max_epsilon:
            raise LimitExceededError(
                f"epsilon = {spec.plan.epsilon:g} exceeds this server's cap of {self.max_epsilon:g} per release "
                "(--max-epsilon)"
            )
        if spec.plan.n > self.max_n:
            raise LimitExceededError(f"n = {spec.plan.n} exceeds this server's limit of {self.max_n} records")
        if spec.plan.m > self.max_m:
            raise LimitExceededError(f"m = {spec.plan.m} exceeds this server's limit of {self.max_m} rows")
        if len(spec.curators) > self.max_curators:
            raise LimitExceededError(f"{len(spec.curators)} curators exceed this server's limit of {self.max_curators}")


class ReleaseState(IntEnum):
    """Same numbers as securerelease.v1.ReleaseState."""

    REGISTERED = 1
    UPLOADING = 2
    SEALED = 3
    PERTURBED = 4
    ABORTED = 5


class ServerStateError(SecureReleaseError):
    """Base of the server's release-state errors."""


class LimitExceededError(ServerStateError):
    """A release beyond one of the server's configured bounds (n, m, curators, in flight)."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


class ParameterMismatchError(ServerStateError):
    """A curator declared parameters that differ from those already registered."""

    kind = ErrorKind.FAILED_PRECONDITION


class NoSuchReleaseError(ServerStateError):
    """No release with that id is registered."""

    kind = ErrorKind.NOT_FOUND


class NotACuratorError(ServerStateError):
    """The caller is not a curator of this release, or acts for another curator."""

    kind = ErrorKind.PERMISSION_DENIED


class NotRegisteredError(ServerStateError):
    """The curator uploads before registering its part."""

    kind = ErrorKind.FAILED_PRECONDITION


class ChunkShapeError(ServerStateError):
    """A chunk number is out of range or the chunk has the wrong number of rows."""

    kind = ErrorKind.INVALID_ARGUMENT


class TableAlphabetError(ChunkShapeError):
    """A chunk of a release of several tables holds, in some table's rows, a symbol at or above
    the curator's alphabet in that table (1 where the curator has no attribute in it: only 0)."""


class ConflictingChunkError(ServerStateError):
    """A chunk number already holds different bytes."""

    kind = ErrorKind.ALREADY_EXISTS


class AbortedAtServerError(ServerStateError):
    """The release was aborted; nothing more is accepted or served for it."""

    kind = ErrorKind.FAILED_PRECONDITION


class ReleaseSealedError(ServerStateError):
    """The release (or this curator's part) is committed; no more uploads."""

    kind = ErrorKind.FAILED_PRECONDITION


class IncompleteUploadError(ServerStateError):
    """Commit before every chunk arrived, or with a wrong chunk count or digest."""

    kind = ErrorKind.FAILED_PRECONDITION


class NotReadyError(ServerStateError):
    """The release is not perturbed yet (or not sealed, for PRAM)."""

    kind = ErrorKind.FAILED_PRECONDITION


@dataclass
class Part:
    """One curator's upload: chunk number -> SHA-256 of its bytes."""

    registered: bool = False
    chunks: dict[int, bytes] = field(default_factory=dict)
    committed: bool = False
    digest: bytes = b""


@dataclass
class Release:
    spec: ReleaseSpec
    state: ReleaseState = ReleaseState.REGISTERED
    parts: dict[str, Part] = field(default_factory=dict)
    perturbed_digest: bytes = b""
    abort_reason: str = ""

    @classmethod
    def create(cls, spec: ReleaseSpec) -> Release:
        spec.validate()
        return cls(spec, parts={c: Part() for c in spec.curators})

    # ------------------------------------------------------------------ queries
    @property
    def is_bound(self) -> bool:
        """Every curator of the spec registered it: the release id is this spec's for good."""
        return all(p.registered for p in self.parts.values())

    def symbols_stored(self, curator: str) -> int:
        return sum(self.spec.rows_in_chunk(s) for s in self.parts[curator].chunks)

    # ------------------------------------------------------------------ events
    def register(self, spec: ReleaseSpec, curator: str, caller: str) -> bool:
        """A curator declares its part. Returns True if this changed anything."""
        spec.validate()
        if curator != caller:
            raise NotACuratorError(f"caller {caller!r} may not register for curator {curator!r}")
        if curator not in spec.curators:
            raise NotACuratorError(f"curator {curator!r} is not in the release's curator list {list(spec.curators)}")
        if self.state == ReleaseState.ABORTED:
            raise AbortedAtServerError(f"release {self.spec.release_id!r} was aborted: {self.abort_reason}")
        diff = self.spec.differences(spec)
        if diff:
            raise ParameterMismatchError(
                f"release {self.spec.release_id!r}: {curator!r} declared different "
                + ", ".join(diff)
                + " (yours != registered)"
            )
        if self.parts[curator].registered:
            return False
        self.parts[curator].registered = True
        return True

    def check_member(self, curator: str, caller: str, registered: bool = True) -> Part:
        """The caller's part: it acts for itself, is a curator of the release (and registered)."""
        if curator != caller:
            raise NotACuratorError(f"caller {caller!r} may not act for curator {curator!r}")
        if curator not in self.parts:
            raise NotACuratorError(f"{curator!r} is not a curator of release {self.spec.release_id!r}")
        part = self.parts[curator]
        if registered and not part.registered:
            raise NotRegisteredError(f"curator {curator!r} must RegisterPart before uploading")
        return part

    def check_open(self) -> None:
        """Refuse anything new once the release is aborted, sealed or perturbed."""
        if self.state == ReleaseState.ABORTED:
            raise AbortedAtServerError(f"release {self.spec.release_id!r} was aborted: {self.abort_reason}")
        if self.state >= ReleaseState.SEALED:
            raise ReleaseSealedError(f"release {self.spec.release_id!r} is {self.state.name.lower()}; no more uploads")

    def is_replay(self, curator: str, seq: int, sha: bytes) -> bool:
        """True if this exact chunk is already stored: a replay succeeds in every state."""
        part = self.parts.get(curator)
        return part is not None and part.chunks.get(seq) == sha

    def accept_chunk(self, curator: str, caller: str, seq: int, rows: int, sha: bytes) -> bool:
        """A validated chunk of ``rows`` symbols. True if new, False if an identical repeat."""
        if not self.check_chunk(curator, caller, seq, rows, sha):
            return False
        self.add_chunk(curator, seq, sha)
        return True

    def check_chunk(self, curator: str, caller: str, seq: int, rows: int, sha: bytes) -> bool:
        """Every check of :meth:`accept_chunk`, changing nothing (so the store can validate the
        live release without copying it): True if the chunk is new and may be stored, False if
        it is an identical repeat; a chunk that may not be stored raises."""
        part = self.check_member(curator, caller)
        if self.is_replay(curator, seq, sha):
            return False
        self.check_open()
        if seq in part.chunks:
            raise ConflictingChunkError(f"chunk {seq} of {curator!r} is already stored with different bytes")
        if part.committed:
            raise ReleaseSealedError(f"curator {curator!r} has committed; no more chunks")
        if not 0 <= seq < self.spec.num_chunks:
            raise ChunkShapeError(
                f"chunk {seq} is out of range: m = {self.spec.m} gives chunks 0..{self.spec.num_chunks - 1}"
            )
        want = self.spec.rows_in_chunk(seq)
        if rows != want:
            raise ChunkShapeError(f"chunk {seq} must hold exactly {want} symbols, got {rows}")
        return True

    def state_with_chunk(self) -> ReleaseState:
        """The state a new chunk leaves the release in: the first one starts UPLOADING."""
        return ReleaseState.UPLOADING if self.state == ReleaseState.REGISTERED else self.state

    def add_chunk(self, curator: str, seq: int, sha: bytes) -> None:
        """Record a chunk :meth:`check_chunk` found new (cannot fail, so a store that wrote it
        first never leaves the release half-changed)."""
        self.parts[curator].chunks[seq] = sha
        self.state = self.state_with_chunk()

    def check_commit(self, curator: str, caller: str, num_chunks: int) -> bool:
        """Checks before the store computes the digest. False if already committed (no-op)."""
        part = self.check_member(curator, caller)
        if part.committed:
            return False
        self.check_open()
        if num_chunks != self.spec.num_chunks:
            raise IncompleteUploadError(
                f"commit says {num_chunks} chunks; m = {self.spec.m} needs {self.spec.num_chunks}"
            )
        missing = [s for s in range(self.spec.num_chunks) if s not in part.chunks]
        if missing:
            raise IncompleteUploadError(
                f"curator {curator!r} commits with {len(missing)} chunk(s) missing, first {missing[0]}"
            )
        return True

    def commit(self, curator: str, caller: str, num_chunks: int, digest: bytes, computed: bytes) -> bool:
        """Commit a curator's part; ``computed`` is the digest over the stored chunks.
        Returns True if the release became SEALED."""
        if not self.check_commit(curator, caller, num_chunks):
            if digest != self.parts[curator].digest:
                raise IncompleteUploadError("a repeated commit carries a different digest")
            return False
        if digest != computed:
            raise IncompleteUploadError(f"digest mismatch for {curator!r}: the stored chunks hash to {computed.hex()}")
        part = self.parts[curator]
        part.committed, part.digest = True, digest
        if all(p.committed for p in self.parts.values()):
            self.state = ReleaseState.SEALED
            return True
        return False

    def abort(self, curator: str, caller: str, reason: str) -> bool:
        """A curator of the release stops it before sealing. True if this changed anything
        (a repeated abort is a no-op); a sealed release can no longer be aborted."""
        self.check_member(curator, caller, registered=False)
        if self.state == ReleaseState.ABORTED:
            return False
        if self.state >= ReleaseState.SEALED:
            raise ReleaseSealedError(
                f"release {self.spec.release_id!r} is {self.state.name.lower()}: it will be released, "
                "it can no longer be aborted"
            )
        self.state = ReleaseState.ABORTED
        self.abort_reason = f"{curator}: {reason.strip()[:1000] or 'no reason given'}"
        return True

    def perturbed(self, digest: bytes) -> None:
        if self.state != ReleaseState.SEALED:
            raise NotReadyError(f"PRAM needs a sealed release; it is {self.state.name.lower()}")
        self.state = ReleaseState.PERTURBED
        self.perturbed_digest = digest

    def check_fetch(self) -> None:
        if self.state != ReleaseState.PERTURBED:
            raise NotReadyError(
                f"release {self.spec.release_id!r} is {self.state.name.lower()}, not perturbed; "
                "wait until GetReleaseStatus says PERTURBED"
            )
