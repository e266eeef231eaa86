"""The ledger head's signature and the witness key, both from a private key kept outside the
keystore (the curator's certificate key, ``CERTS/NAME.key``).

Someone who can write the keystore directory but cannot read that key cannot produce a head that
verifies: an edited, forged, truncated or replaced history is refused
(:class:`~secure_release.mechanism.privacy.ledger.LedgerTamperedError`). A signature does not stop a
rollback to an older signed copy; the server's witness does (:mod:`secure_release.curator.records.witness`),
keyed by :meth:`HeadSigner.witness_fingerprint` so the server cannot test guesses of a data set.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from secure_release.infra.fileio import read_nofollow
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError
from secure_release.mechanism.privacy.ledger import LedgerHead


class SigningKeyError(SecureReleaseError):
    """The ledger's signing key is missing, unreadable or not an EC private key."""

    kind = ErrorKind.FAILED_PRECONDITION


class HeadSigner:
    """Signs and verifies ledger heads (ECDSA P-256, SHA-256) with one private key."""

    def __init__(self, key: ec.EllipticCurvePrivateKey) -> None:
        self._key = key
        public = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.key_id = hashlib.sha256(public).hexdigest()[:32]
        scalar = key.private_numbers().private_value.to_bytes(66, "big")
        self._witness_key = hashlib.sha256(b"secure-release witness key v1\n" + scalar).digest()

    @classmethod
    def from_file(cls, path: str | Path) -> HeadSigner:
        """The signer of a PEM private key file (e.g. ``certs/alice.key``)."""
        try:
            key = serialization.load_pem_private_key(read_nofollow(Path(path)), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise SigningKeyError(f"cannot read the ledger signing key {path} ({type(exc).__name__})") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise SigningKeyError(f"{path} is not an EC private key")
        return cls(key)

    @classmethod
    def from_certs(cls, certs: str | Path | None, name: str | None) -> HeadSigner | None:
        """The signer of ``certs/NAME.key``; None without certificates (insecure mode: no signature)."""
        if certs is None or not name:
            return None
        return cls.from_file(Path(certs) / f"{name}.key")

    def sign(self, head: LedgerHead) -> LedgerHead:
        """``head`` with this key's signature."""
        signature = self._key.sign(head.signed_bytes(), ec.ECDSA(hashes.SHA256()))
        return LedgerHead(head.count, head.digest, signature.hex(), self.key_id)

    def verifies(self, head: LedgerHead) -> bool:
        """True if ``head`` carries a valid signature by this key."""
        if head.key_id != self.key_id or not head.signature:
            return False
        try:
            self._key.public_key().verify(bytes.fromhex(head.signature), head.signed_bytes(), ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True

    def witness_fingerprint(self, dataset: str) -> bytes:
        """HMAC-SHA256 of the data set's ledger key under a key derived from the private key: the
        same for every run of this curator, meaningless to the server."""
        return hmac.new(self._witness_key, dataset.encode(), hashlib.sha256).digest()
