"""``secure-release pki init``: a project CA and one certificate per party (role in the URI SAN).

Every party gets an ECDSA P-256 key and a certificate signed by the project CA whose URI SAN
``secure-release://<role>/<name>`` is its identity (``infra.tls``). Keys are written 0600.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from secure_release.infra.fileio import atomic_write
from secure_release.infra.tls import CERT_VALIDITY_DAYS, Identity, PkiError, check_party, peer_dns_name


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san_hosts(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return names


def init_pki(
    directory: Path,
    parties: Sequence[tuple[str, str]],
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    force: bool = False,
) -> None:
    """Create a project CA (``ca.pem``, ``ca.key``) and a cert/key per ``(role, name)`` party.

    Writes ``<name>.pem`` and ``<name>.key`` (keys mode 0600, every file atomically). Refuses to
    overwrite an existing CA unless ``force``.
    """
    directory = Path(directory)
    seen: set[str] = set()
    for role, name in parties:
        check_party(role, name)
        if name in seen:
            raise PkiError(f"party name {name!r} appears twice; names must be unique")
        seen.add(name)
    if not hosts:
        raise PkiError("at least one host name or IP address is needed for the certificates")
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "ca.pem").exists() and not force:
        raise PkiError(f"{directory / 'ca.pem'} exists; pass force=True (--force) to replace the CA")

    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)
    until = now + _dt.timedelta(days=CERT_VALIDITY_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "secure-release project CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    for role, name in parties:
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [
            *_san_hosts(hosts),
            x509.DNSName(peer_dns_name(role)),
            x509.DNSName(peer_dns_name(role, name)),
            x509.UniformResourceIdentifier(Identity(role, name).uri),
        ]
        cert = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.COMMON_NAME, name),
                        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                    ]
                )
            )
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=True,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)
            .sign(ca_key, hashes.SHA256())
        )
        atomic_write(directory / f"{name}.key", _key_pem(key), 0o600)
        atomic_write(directory / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    # The CA goes last, so an interrupted run leaves no CA and can simply be rerun.
    atomic_write(directory / "ca.key", _key_pem(ca_key), 0o600)
    atomic_write(directory / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
