"""Seeds and keys that never print their bytes, and labelled HKDF derivation.

A :class:`Secret` holds 32 bytes. ``repr``/``str`` show only a short public fingerprint
(SHA-256 of a domain label and the bytes, first 8 hex digits), so secrets can be logged by
accident without leaking. The bytes come out only through :meth:`Secret.reveal`.

Derivation: ``HKDF-SHA256(ikm=secret, salt=None, info="secure-release/v1|" purpose "|" release)``
gives independent keys for independent purposes (domain separation by purpose and release id).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import ClassVar, Self

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from secure_release.mechanism.errors import InvalidSeedError

SECRET_BYTES = 32
_INFO_PREFIX = b"secure-release/v1|"


class Secret:
    """32 secret bytes with a redacted ``repr``."""

    __slots__ = ("_bytes",)
    kind: ClassVar[str] = "secret"

    def __init__(self, raw: bytes) -> None:
        if not isinstance(raw, bytes | bytearray) or len(raw) != SECRET_BYTES:
            got = len(raw) if isinstance(raw, bytes | bytearray) else type(raw).__name__
            raise InvalidSeedError(f"a {self.kind} must be exactly {SECRET_BYTES} bytes, got {got}")
        self._bytes = bytes(raw)

    @classmethod
    def generate(cls) -> Self:
        """A fresh secret from the operating system's CSPRNG."""
        return cls(os.urandom(SECRET_BYTES))

    @classmethod
    def from_hex(cls, text: str) -> Self:
        try:
            raw = bytes.fromhex(text)
        except ValueError as exc:
            raise InvalidSeedError(f"a {cls.kind} in hex must be 64 hex digits") from exc
        return cls(raw)

    def reveal(self) -> bytes:
        """The raw bytes. Call only where the secret must cross a trusted boundary."""
        return self._bytes

    def derive(self, purpose: str, release_id: str = "", length: int = SECRET_BYTES) -> bytes:
        """HKDF-SHA256 of this secret, labelled by ``purpose`` and ``release_id``."""
        return derive_bytes(self._bytes, purpose, release_id, length)

    @property
    def fingerprint(self) -> str:
        """A public 8-hex-digit identifier (reveals nothing useful about the bytes)."""
        return hashlib.sha256(b"fingerprint|" + self.kind.encode() + self._bytes).hexdigest()[:8]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<redacted>, fingerprint={self.fingerprint})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and hmac.compare_digest(
            self._bytes,
            other._bytes,
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.fingerprint))

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(f"{type(self).__name__} is not picklable; use reveal() explicitly")


class Seed(Secret):
    """The curators' shared sampling seed (one per release)."""

    kind = "seed"


class PadKey(Secret):
    """A ChaCha20 pad key (one per curator per release)."""

    kind = "pad key"


class AlignmentKey(Secret):
    """The key of the curators' keyed id hash (shared by the curators only)."""

    kind = "alignment key"


def derive_bytes(
    ikm: bytes, purpose: str, release_id: str = "", length: int = SECRET_BYTES
) -> bytes:
    """Labelled HKDF-SHA256: independent output per (ikm, purpose, release_id)."""
    if "|" in purpose:
        raise InvalidSeedError(f"purpose {purpose!r} must not contain '|'")
    info = _INFO_PREFIX + purpose.encode() + b"|" + release_id.encode()
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(ikm)


class PramKey(Secret):
    """The server's PRAM randomness key (fresh from the OS per release; tests may inject one)."""

    kind = "pram key"
