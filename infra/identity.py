"""Who a party is: the four roles, the ``role/name`` identity a certificate carries, and the
names a client pins. The bottom of the identity layers: ``infra.certdir`` and ``infra.pki``
(files and the CA), ``infra.auth`` (the access table) and ``infra.tls`` (channels and ports)
all build on it, and it imports none of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from secure_release.mechanism.errors import InvalidNameError, SecureReleaseError
from secure_release.mechanism.protocol.spec import PARTY_GRAMMAR, check_party_name

ROLES = ("curator", "server", "researcher", "analyst")
URI_SCHEME = "secure-release://"
#: Certificates also carry ``<role>.<PEER_DOMAIN>`` and ``<name>.<role>.<PEER_DOMAIN>`` as DNS
#: names; a client pins the one it expects, so the TLS handshake itself fails against a peer of
#: another role or identity (``.invalid`` is reserved: these names never resolve).
PEER_DOMAIN = "secure-release.invalid"
IDENTITY_METADATA_KEY = "x-secure-release-identity"
CERT_VALIDITY_DAYS = 30
class PkiError(SecureReleaseError):
    """A certificate, key or identity is missing, malformed or not allowed."""


@dataclass(frozen=True)
class Identity:
    role: str
    name: str

    def __str__(self) -> str:
        return f"{self.role}/{self.name}"

    @property
    def uri(self) -> str:
        return f"{URI_SCHEME}{self.role}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> Identity:
        """``role/name`` (or ``secure-release://role/name``) -> Identity; raises PkiError."""
        if text.startswith(URI_SCHEME):
            text = text[len(URI_SCHEME) :]
        role, sep, name = text.partition("/")
        if not sep:
            raise PkiError(f"an identity is 'role/name', got {text!r}")
        check_party(role, name)
        return cls(role, name)


def check_party(role: str, name: str) -> None:
    if role not in ROLES:
        raise PkiError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    try:
        check_party_name(name)
    except InvalidNameError:
        raise PkiError(f"party name {name!r} must match {PARTY_GRAMMAR} (a lowercase DNS label)") from None
    if name == "ca":
        raise PkiError("party name 'ca' is reserved for the project CA")


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PkiError(f"{what} {path} not found; make it with 'secure-release pki request' and 'pki sign'") from None


def identity_of_certificate(pem: bytes) -> Identity | None:
    """The ``secure-release://role/name`` URI SAN of a PEM certificate, or None."""
    return _identity_of_pem(bytes(pem))


@functools.lru_cache(maxsize=256)
def _identity_of_pem(pem: bytes) -> Identity | None:
    try:
        cert = x509.load_pem_x509_certificate(pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(URI_SCHEME)]
    if len(uris) != 1:
        return None  # no identity, or an ambiguous one (two roles): refused as unauthenticated
    try:
        return Identity.parse(uris[0])
    except PkiError:
        return None


def identity_of_file(cert_dir: Path, name: str) -> Identity:
    """The identity in ``<cert_dir>/<name>.pem``."""
    ident = identity_of_certificate(_read(Path(cert_dir) / f"{name}.pem", "certificate"))
    if ident is None:
        raise PkiError(f"{Path(cert_dir) / f'{name}.pem'} carries no secure-release:// URI SAN")
    return ident


def peer_dns_name(role: str, name: str | None = None) -> str:
    """The DNS name a client pins for a peer of ``role`` (and, if given, of that ``name``)."""
    if name is None:
        return f"{role}.{PEER_DOMAIN}"
    return f"{name}.{role}.{PEER_DOMAIN}"
