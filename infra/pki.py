"""``secure-release pki init``: a project CA and one certificate per party.

Every party gets an ECDSA P-256 key and a certificate signed by the project CA. Its identity is
the URI SAN ``secure-release://<role>/<name>`` (read by servers, ``infra.auth``); the DNS SANs
``<role>.secure-release.invalid`` and ``<name>.<role>.secure-release.invalid`` are what clients
pin (``infra.tls.secure_channel``); the host SANs let any party also serve TLS. Keys are written
0600, certificates 0644, each file atomically; the CA goes last, so an interrupted run leaves no
CA and can simply be rerun.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from secure_release.infra.fileio import atomic_write
from secure_release.infra.tls import CERT_VALIDITY_DAYS, Identity, PkiError, check_party, peer_dns_name

_CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "secure-release project CA")])


@dataclass(frozen=True)
class Authority:
    """A CA key and its self-signed certificate."""

    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as unencrypted PKCS#8 PEM (written 0600 only)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not ca,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _validity(days: int = CERT_VALIDITY_DAYS) -> tuple[_dt.datetime, _dt.datetime]:
    start = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)
    return start, start + _dt.timedelta(days=days)


def new_authority() -> Authority:
    """A fresh project CA (path length 0: it signs party certificates only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, until = _validity()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_CA_NAME)
        .issuer_name(_CA_NAME)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return Authority(key, cert)


def host_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """IP addresses as IP SANs, anything else as DNS SANs."""
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return names


def identity_names(role: str, name: str) -> list[x509.GeneralName]:
    """The SANs that make a certificate the identity ``role/name``."""
    return [
        x509.DNSName(peer_dns_name(role)),
        x509.DNSName(peer_dns_name(role, name)),
        x509.UniformResourceIdentifier(Identity(role, name).uri),
    ]


def issue(
    ca: Authority,
    name: str,
    sans: Sequence[x509.GeneralName],
    ou: str = "",
    validity: tuple[_dt.datetime, _dt.datetime] | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A key and a certificate for ``name`` with exactly ``sans``, signed by ``ca`` (the raw
    primitive; :func:`init_pki` is the safe recipe)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, until = validity or _validity()
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    if ou:
        subject.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False)
        .sign(ca.key, hashes.SHA256())
    )
    return key, cert


def write_party(directory: Path, name: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    """``<name>.key`` (0600) and ``<name>.pem`` (0644), atomically."""
    atomic_write(directory / f"{name}.key", key_pem(key), 0o600)
    atomic_write(directory / f"{name}.pem", cert_pem(cert), 0o644)


def _check_parties(parties: Sequence[tuple[str, str]], hosts: Sequence[str]) -> None:
    seen: set[str] = set()
    for role, name in parties:
        check_party(role, name)
        if name in seen:
            raise PkiError(f"party name {name!r} appears twice; names must be unique")
        seen.add(name)
    if not hosts:
        raise PkiError("at least one host name or IP address is needed for the certificates")


def init_pki(
    directory: Path,
    parties: Sequence[tuple[str, str]],
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    force: bool = False,
) -> None:
    """Create a project CA (``ca.pem``, ``ca.key``) and a cert/key per ``(role, name)`` party.

    Refuses to overwrite an existing CA unless ``force``.
    """
    directory = Path(directory)
    _check_parties(parties, hosts)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if (directory / "ca.pem").exists() and not force:
        raise PkiError(f"{directory / 'ca.pem'} exists; pass force=True (--force) to replace the CA")
    ca = new_authority()
    for role, name in parties:
        key, cert = issue(ca, name, [*host_names(hosts), *identity_names(role, name)], ou=role)
        write_party(directory, name, key, cert)
    atomic_write(directory / "ca.key", key_pem(ca.key), 0o600)
    atomic_write(directory / "ca.pem", cert_pem(ca.certificate), 0o644)
