"""The release state machine of the server: pure (no I/O, no clock, no randomness).

    REGISTERED --first chunk--> UPLOADING --every curator committed--> SEALED --PRAM--> PERTURBED

Every method validates completely before it changes anything, so a method that raises leaves
the release exactly as it was. The store (server/store.py) persists what the machine accepts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from secure_release.mechanism.accounting import gamma_from_epsilon
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.packing import CHUNK_ROWS, symbol_width
from secure_release.mechanism.pram import check_gamma
from secure_release.mechanism.schema import check_joint_alphabet

CIPHER_OTP = 1
CIPHER_CHACHA20 = 2
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class ReleaseState(IntEnum):
    """Same numbers as securerelease.v1.ReleaseState."""

    REGISTERED = 1
    UPLOADING = 2
    SEALED = 3
    PERTURBED = 4


class ServerStateError(SecureReleaseError):
    """Base of the server's release-state errors."""


class InvalidParamsError(ServerStateError):
    """Release parameters are malformed (n, m, epsilon, gamma, curators, alphabets, cipher)."""


class ParameterMismatchError(ServerStateError):
    """A curator declared parameters that differ from those already registered."""


class UnknownReleaseError(ServerStateError):
    """No release with that id is registered."""


class NotACuratorError(ServerStateError):
    """The caller is not a curator of this release, or acts for another curator."""


class NotRegisteredError(ServerStateError):
    """The curator uploads before registering its part."""


class ChunkShapeError(ServerStateError):
    """A chunk number is out of range or the chunk has the wrong number of rows."""


class ConflictingChunkError(ServerStateError):
    """A chunk number already holds different bytes."""


class ReleaseSealedError(ServerStateError):
    """The release (or this curator's part) is committed; no more uploads."""


class IncompleteUploadError(ServerStateError):
    """Commit before every chunk arrived, or with a wrong chunk count or digest."""


class NotReadyError(ServerStateError):
    """The release is not perturbed yet (or not sealed, for PRAM)."""


@dataclass(frozen=True)
class Params:
    """The public parameters of a release (mirror of ReleaseParams)."""

    release_id: str
    n: int
    m: int
    epsilon: float
    gamma: float
    curators: tuple[str, ...]
    alphabet_sizes: tuple[int, ...]
    cipher: int
    researcher: str = ""

    def validate(self) -> Params:
        if not _ID_RE.match(self.release_id):
            raise InvalidParamsError(
                f"release id {self.release_id!r} must be 1-128 letters, digits, '_', '.', ':', '-'"
            )
        if self.n < 1 or not 1 <= self.m <= self.n:
            raise InvalidParamsError(f"need 1 <= m <= n, got n = {self.n}, m = {self.m}")
        if not math.isfinite(self.epsilon) or self.epsilon <= 0:
            raise InvalidParamsError(f"epsilon must be a finite number > 0, got {self.epsilon}")
        try:
            check_gamma(self.gamma)
        except SecureReleaseError as exc:
            raise InvalidParamsError(str(exc)) from exc
        expected = gamma_from_epsilon(self.n, self.m, self.epsilon)
        if not math.isclose(self.gamma, expected, rel_tol=1e-9):
            raise InvalidParamsError(
                f"gamma {self.gamma!r} does not follow from epsilon {self.epsilon}, n {self.n}, "
                f"m {self.m} (Eq. 2 gives {expected!r})"
            )
        if len(self.curators) < 2 or len(set(self.curators)) != len(self.curators):
            raise InvalidParamsError(
                f"a release needs at least two distinct curators, got {list(self.curators)}"
            )
        if len(self.alphabet_sizes) != len(self.curators):
            raise InvalidParamsError(
                f"{len(self.alphabet_sizes)} alphabet sizes for {len(self.curators)} curators"
            )
        try:
            check_joint_alphabet(self.alphabet_sizes)
            for k in self.alphabet_sizes:
                symbol_width(k)
        except SecureReleaseError as exc:
            raise InvalidParamsError(str(exc)) from exc
        if self.cipher not in (CIPHER_OTP, CIPHER_CHACHA20):
            raise InvalidParamsError(f"cipher must be OTP (1) or CHACHA20 (2), got {self.cipher}")
        return self

    def agreement_key(self) -> tuple[Any, ...]:
        """What every curator must declare identically."""
        return (
            self.release_id,
            self.n,
            self.m,
            self.epsilon,
            self.gamma,
            self.curators,
            self.alphabet_sizes,
            self.cipher,
        )

    @property
    def num_chunks(self) -> int:
        return -(-self.m // CHUNK_ROWS)

    def rows_in_chunk(self, seq: int) -> int:
        return min(CHUNK_ROWS, self.m - seq * CHUNK_ROWS)

    def alphabet_of(self, curator: str) -> int:
        return self.alphabet_sizes[self.curators.index(curator)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "release_id": self.release_id,
            "n": self.n,
            "m": self.m,
            "epsilon": self.epsilon,
            "gamma": self.gamma,
            "curators": list(self.curators),
            "alphabet_sizes": list(self.alphabet_sizes),
            "cipher": self.cipher,
            "researcher": self.researcher,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Params:
        return cls(
            release_id=str(d["release_id"]),
            n=int(d["n"]),
            m=int(d["m"]),
            epsilon=float(d["epsilon"]),
            gamma=float(d["gamma"]),
            curators=tuple(str(c) for c in d["curators"]),
            alphabet_sizes=tuple(int(k) for k in d["alphabet_sizes"]),
            cipher=int(d["cipher"]),
            researcher=str(d.get("researcher", "")),
        )


@dataclass
class Part:
    """One curator's upload: chunk number -> SHA-256 of its bytes."""

    registered: bool = False
    chunks: dict[int, bytes] = field(default_factory=dict)
    committed: bool = False
    digest: bytes = b""


@dataclass
class Release:
    params: Params
    state: ReleaseState = ReleaseState.REGISTERED
    parts: dict[str, Part] = field(default_factory=dict)
    perturbed_digest: bytes = b""

    @classmethod
    def create(cls, params: Params) -> Release:
        params.validate()
        return cls(params, parts={c: Part() for c in params.curators})

    # ------------------------------------------------------------------ queries
    def symbols_stored(self, curator: str) -> int:
        return sum(self.params.rows_in_chunk(s) for s in self.parts[curator].chunks)

    # ------------------------------------------------------------------ events
    def register(self, params: Params, curator: str, caller: str) -> bool:
        """A curator declares its part. Returns True if this changed anything."""
        params.validate()
        if curator != caller:
            raise NotACuratorError(f"caller {caller!r} may not register for curator {curator!r}")
        if curator not in params.curators:
            raise NotACuratorError(
                f"curator {curator!r} is not in the release's curator list {list(params.curators)}"
            )
        if params.agreement_key() != self.params.agreement_key():
            mine, theirs = params.to_dict(), self.params.to_dict()
            diff = sorted(k for k in mine if k != "researcher" and mine[k] != theirs[k])
            raise ParameterMismatchError(
                f"release {self.params.release_id!r}: {curator!r} declared different "
                + ", ".join(f"{k} ({mine[k]!r} != registered {theirs[k]!r})" for k in diff)
            )
        if self.parts[curator].registered:
            return False
        self.parts[curator].registered = True
        return True

    def _check_uploader(self, curator: str, caller: str) -> Part:
        if curator != caller:
            raise NotACuratorError(f"caller {caller!r} may not upload for curator {curator!r}")
        if curator not in self.parts:
            raise NotACuratorError(
                f"{curator!r} is not a curator of release {self.params.release_id!r}"
            )
        part = self.parts[curator]
        if not part.registered:
            raise NotRegisteredError(f"curator {curator!r} must RegisterPart before uploading")
        if self.state >= ReleaseState.SEALED:
            raise ReleaseSealedError(
                f"release {self.params.release_id!r} is {self.state.name.lower()}; no more uploads"
            )
        return part

    def accept_chunk(self, curator: str, caller: str, seq: int, rows: int, sha: bytes) -> bool:
        """A validated chunk of ``rows`` symbols. True if new, False if an identical repeat."""
        part = self._check_uploader(curator, caller)
        if seq in part.chunks:
            if part.chunks[seq] == sha:
                return False
            raise ConflictingChunkError(
                f"chunk {seq} of {curator!r} is already stored with different bytes"
            )
        if part.committed:
            raise ReleaseSealedError(f"curator {curator!r} has committed; no more chunks")
        if not 0 <= seq < self.params.num_chunks:
            raise ChunkShapeError(
                f"chunk {seq} is out of range: m = {self.params.m} gives chunks "
                f"0..{self.params.num_chunks - 1}"
            )
        want = self.params.rows_in_chunk(seq)
        if rows != want:
            raise ChunkShapeError(f"chunk {seq} must hold exactly {want} symbols, got {rows}")
        part.chunks[seq] = sha
        if self.state == ReleaseState.REGISTERED:
            self.state = ReleaseState.UPLOADING
        return True

    def check_commit(self, curator: str, caller: str, num_chunks: int) -> bool:
        """Checks before the store computes the digest. False if already committed (no-op)."""
        if curator == caller and curator in self.parts and self.parts[curator].committed:
            return False
        part = self._check_uploader(curator, caller)
        if num_chunks != self.params.num_chunks:
            raise IncompleteUploadError(
                f"commit says {num_chunks} chunks; m = {self.params.m} needs "
                f"{self.params.num_chunks}"
            )
        missing = [s for s in range(self.params.num_chunks) if s not in part.chunks]
        if missing:
            raise IncompleteUploadError(
                f"curator {curator!r} commits with {len(missing)} chunk(s) missing, "
                f"first {missing[0]}"
            )
        return True

    def commit(
        self, curator: str, caller: str, num_chunks: int, digest: bytes, computed: bytes
    ) -> bool:
        """Commit a curator's part; ``computed`` is the digest over the stored chunks.
        Returns True if the release became SEALED."""
        if not self.check_commit(curator, caller, num_chunks):
            if digest != self.parts[curator].digest:
                raise IncompleteUploadError("a repeated commit carries a different digest")
            return False
        if digest != computed:
            raise IncompleteUploadError(
                f"digest mismatch for {curator!r}: the stored chunks hash to {computed.hex()}"
            )
        part = self.parts[curator]
        part.committed, part.digest = True, digest
        if all(p.committed for p in self.parts.values()):
            self.state = ReleaseState.SEALED
            return True
        return False

    def perturbed(self, digest: bytes) -> None:
        if self.state != ReleaseState.SEALED:
            raise NotReadyError(f"PRAM needs a sealed release; it is {self.state.name.lower()}")
        self.state = ReleaseState.PERTURBED
        self.perturbed_digest = digest

    def check_fetch(self) -> None:
        if self.state != ReleaseState.PERTURBED:
            raise NotReadyError(
                f"release {self.params.release_id!r} is {self.state.name.lower()}, not perturbed; "
                "wait until GetReleaseStatus says PERTURBED"
            )
