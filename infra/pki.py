"""The project PKI: a CA, certificate signing requests, signing, revocation and the demo path.

Keys are made where they are used (``secure-release pki request`` on the party's own machine);
only a certificate signing request travels to the CA, and only a certificate (and the CRL)
travels back. The four operations are plain functions, used by the ``secure-release pki``
commands and by :func:`init_pki`, the one-command demo path that runs them all on one machine
and writes one directory per party.

Every party's identity is the URI SAN ``secure-release://<role>/<name>`` (read by servers,
``infra.auth``); the DNS SANs ``<role>.secure-release.invalid`` and
``<name>.<role>.secure-release.invalid`` are what clients pin (``infra.tls.secure_channel``);
host SANs let any party also serve TLS. The CA never trusts a CSR's subject: it certifies the
identity in the CSR's URI SAN only after checking the role, the name, the signature and that the
CSR asks for no other identity's DNS names, and builds the certificate's subject and SANs itself.

CA directory (``DIR/ca`` with ``pki init``): ``ca.pem``, ``ca.key`` (0600), ``issued/<serial>.pem``
(every certificate it signed: the register that ``sign`` checks names against and ``revoke``
looks names up in) and ``crl.pem`` (after the first revocation). Keys are written 0600,
certificates 0644, each file atomically.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import ipaddress
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from secure_release.infra.fileio import atomic_write
from secure_release.infra.identity import (
    CERT_VALIDITY_DAYS,
    PEER_DOMAIN,
    ROLES,
    URI_SCHEME,
    Identity,
    PkiError,
    check_party,
    identity_of_certificate,
    peer_dns_name,
)
from secure_release.mechanism.errors import ErrorKind

_CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "secure-release project CA")])
CA_VALIDITY_DAYS = 3650
CRL_VALIDITY_DAYS = 30
MAX_DAYS = 397  # the CA/Browser Forum's ceiling for a leaf certificate; ours default to 30
ISSUED = "issued"


class NameTakenError(PkiError):
    """A name is already certified under another key (or another role); ``--replace`` to reissue."""

    kind = ErrorKind.ALREADY_EXISTS


class NotIssuedError(PkiError):
    """A revocation names a party or serial this CA never certified."""

    kind = ErrorKind.NOT_FOUND


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


def key_fingerprint(key: ec.EllipticCurvePublicKey) -> str:
    """SHA-256 of a public key (SubjectPublicKeyInfo DER), the first 16 bytes in hex pairs: what
    ``pki request`` and ``pki sign`` both print, to compare over the phone."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashlib.sha256(der).hexdigest()[:32]
    return ":".join(digest[i : i + 4] for i in range(0, 32, 4))


def serial_hex(serial: int) -> str:
    """A serial number as the hex string the commands print and ``--serial`` accepts."""
    return format(serial, "x")


def parse_serial(text: str) -> int:
    """``--serial`` text (hex, optionally with ``0x`` or colons, as printed by ``pki sign``)."""
    cleaned = text.strip().lower().removeprefix("0x").replace(":", "")
    try:
        value = int(cleaned, 16)
    except ValueError:
        raise PkiError(f"serial {text!r} is not a hexadecimal number (as printed by 'pki sign')") from None
    if value <= 0:
        raise PkiError(f"serial {text!r} must be a positive number")
    return value


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


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def _validity(days: int = CERT_VALIDITY_DAYS) -> tuple[_dt.datetime, _dt.datetime]:
    start = _now() - _dt.timedelta(minutes=5)
    return start, start + _dt.timedelta(days=days)


def new_authority(days: int = CA_VALIDITY_DAYS) -> Authority:
    """A fresh project CA (path length 0: it signs party certificates only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, until = _validity(days)
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
            if not h or h.endswith(PEER_DOMAIN):
                raise PkiError(
                    f"host {h!r} is not allowed: hosts are DNS names or IP addresses outside {PEER_DOMAIN}"
                ) from None
            names.append(x509.DNSName(h))
    return names


def identity_names(role: str, name: str) -> list[x509.GeneralName]:
    """The SANs that make a certificate the identity ``role/name``."""
    return [
        x509.DNSName(peer_dns_name(role)),
        x509.DNSName(peer_dns_name(role, name)),
        x509.UniformResourceIdentifier(Identity(role, name).uri),
    ]


def _build(
    ca: Authority,
    public_key: ec.EllipticCurvePublicKey,
    name: str,
    sans: Sequence[x509.GeneralName],
    ou: str,
    validity: tuple[_dt.datetime, _dt.datetime],
) -> x509.Certificate:
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    if ou:
        subject.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    start, until = validity
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca.certificate.subject)
        .public_key(public_key)
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


def issue(
    ca: Authority,
    name: str,
    sans: Sequence[x509.GeneralName],
    ou: str = "",
    validity: tuple[_dt.datetime, _dt.datetime] | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A key and a certificate for ``name`` with exactly ``sans``, signed by ``ca`` (the raw
    primitive, for tests that need odd certificates; :func:`sign_request` is the safe recipe)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key, _build(ca, key.public_key(), name, sans, ou, validity or _validity())


def write_party(directory: Path, name: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    """``<name>.key`` (0600) and ``<name>.pem`` (0644), atomically."""
    atomic_write(directory / f"{name}.key", key_pem(key), 0o600)
    atomic_write(directory / f"{name}.pem", cert_pem(cert), 0o644)


# ------------------------------------------------------------------------------------ the CA


def create_ca(directory: Path, force: bool = False) -> Authority:
    """``secure-release pki ca DIR``: ``ca.pem`` (0644) and ``ca.key`` (0600) in DIR (0700).

    Refuses a DIR that already holds a CA unless ``force`` (every certificate it signed stops
    working)."""
    directory = Path(directory)
    if (directory / "ca.pem").exists() and not force:
        raise PkiError(
            f"{directory / 'ca.pem'} exists; pass --force to replace the CA (every certificate it signed stops working)"
        )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if force:
        shutil.rmtree(directory / ISSUED, ignore_errors=True)
        (directory / "crl.pem").unlink(missing_ok=True)
    ca = new_authority()
    atomic_write(directory / "ca.key", key_pem(ca.key), 0o600)
    atomic_write(directory / "ca.pem", cert_pem(ca.certificate), 0o644)
    return ca


def load_authority(directory: Path) -> Authority:
    """The CA in ``directory`` (``ca.pem`` + ``ca.key``, which must belong together)."""
    directory = Path(directory)
    try:
        cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    except FileNotFoundError as exc:
        raise PkiError(
            f"{exc.filename} not found: --ca names the CA directory made by 'secure-release pki ca DIR'"
        ) from None
    except ValueError as exc:
        raise PkiError(f"the CA in {directory} is unreadable: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise PkiError(f"{directory / 'ca.key'} is not the key of {directory / 'ca.pem'}")
    return Authority(key, cert)


# ------------------------------------------------------------------------------ the party


def make_request(
    role: str, name: str, hosts: Sequence[str] = ()
) -> tuple[ec.EllipticCurvePrivateKey, x509.CertificateSigningRequest]:
    """A fresh key and a CSR for the identity ``role/name`` (plus ``hosts`` as SANs)."""
    check_party(role, name)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, name), x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)]
    )
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .add_extension(x509.SubjectAlternativeName([*host_names(hosts), *identity_names(role, name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, csr


def write_request(directory: Path, role: str, name: str, hosts: Sequence[str] = (), force: bool = False) -> Path:
    """``secure-release pki request``: ``DIR/NAME.key`` (0600, never leaves DIR) and
    ``DIR/NAME.csr``; returns the CSR's path. Refuses to overwrite a key unless ``force``."""
    directory = Path(directory)
    key_path, csr_path = directory / f"{name}.key", directory / f"{name}.csr"
    check_party(role, name)
    if key_path.exists() and not force:
        raise PkiError(
            f"{key_path} exists; to renew, request into a new directory and move the new {name}.key "
            f"and {name}.pem in together (docs/deployment.md, 'Renew')"
        )
    key, csr = make_request(role, name, hosts)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(key_path, key_pem(key), 0o600)
    atomic_write(csr_path, csr.public_bytes(serialization.Encoding.PEM), 0o644)
    return csr_path


# ------------------------------------------------------------------------------- signing


@dataclass(frozen=True)
class Request:
    """What a CSR asks for, checked: the identity and the host SANs."""

    identity: Identity
    hosts: tuple[x509.GeneralName, ...]
    public_key: ec.EllipticCurvePublicKey


def read_request(pem: bytes, source: str = "the CSR") -> Request:
    """Parse and check a CSR: signature, key type, exactly one identity of a known role and a
    valid name, and no DNS names of another identity. Raises :class:`PkiError` naming what."""
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError:
        raise PkiError(
            f"{source} is not a PEM certificate signing request (made by 'secure-release pki request')"
        ) from None
    if not csr.is_signature_valid:
        raise PkiError(f"{source}: its signature does not verify (altered after it was made, or not made by its key)")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise PkiError(f"{source}: the key must be ECDSA P-256 (as 'pki request' makes it)")
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise PkiError(f"{source} names no identity: it needs a URI SAN {URI_SCHEME}ROLE/NAME") from None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    if len(uris) != 1 or not uris[0].startswith(URI_SCHEME):
        raise PkiError(f"{source} must name exactly one identity {URI_SCHEME}ROLE/NAME, got {uris}")
    role, _, name = uris[0][len(URI_SCHEME) :].partition("/")
    if role not in ROLES:
        raise PkiError(f"{source} asks for role {role!r}; roles are {', '.join(ROLES)}")
    identity = Identity.parse(uris[0])
    own = {peer_dns_name(role), peer_dns_name(role, name)}
    hosts: list[x509.GeneralName] = []
    for general in san:
        if isinstance(general, x509.DNSName) and general.value.endswith(PEER_DOMAIN):
            if general.value not in own:
                raise PkiError(f"{source} for {identity} also asks for {general.value}, another identity's name")
        elif isinstance(general, x509.DNSName | x509.IPAddress):
            hosts.append(general)
        elif not isinstance(general, x509.UniformResourceIdentifier):
            kind = type(general).__name__
            raise PkiError(f"{source} asks for a {kind} SAN; only DNS names and IP addresses are allowed")
    return Request(identity, tuple(hosts), key)


def issued_certificates(ca_dir: Path) -> list[x509.Certificate]:
    """Every certificate the CA in ``ca_dir`` signed (its ``issued/`` register)."""
    folder = Path(ca_dir) / ISSUED
    if not folder.is_dir():
        return []
    return [x509.load_pem_x509_certificate(p.read_bytes()) for p in sorted(folder.glob("*.pem"))]


def revoked_serials(ca_dir: Path) -> set[int]:
    crl = _load_crl(Path(ca_dir))
    return {r.serial_number for r in crl} if crl is not None else set()


def _identity(cert: x509.Certificate) -> Identity | None:

    return identity_of_certificate(cert_pem(cert))


def sign_request(
    ca_dir: Path,
    csr: bytes,
    days: int = CERT_VALIDITY_DAYS,
    replace: bool = False,
    validity: tuple[_dt.datetime, _dt.datetime] | None = None,
    source: str = "the CSR",
) -> x509.Certificate:
    """``secure-release pki sign``: certify the identity a CSR asks for with the CA in
    ``ca_dir``, record it in the register, and return the certificate.

    Refuses what :func:`read_request` refuses, and a name already certified (unexpired, not
    revoked) under another key or another role unless ``replace``. ``validity`` (start, end)
    overrides ``days`` (tests sign short-lived certificates with it).
    """
    ca_dir = Path(ca_dir)
    if not 1 <= days <= MAX_DAYS:
        raise PkiError(f"--days must be in 1..{MAX_DAYS}, got {days}")
    ca = load_authority(ca_dir)
    request = read_request(csr, source)
    ident = request.identity
    if not replace:
        revoked, now = revoked_serials(ca_dir), _now()
        for old in issued_certificates(ca_dir):
            old_ident = _identity(old)
            if old_ident is None or old_ident.name != ident.name:
                continue
            if old.serial_number in revoked or old.not_valid_after_utc < now:
                continue
            if old_ident.role != ident.role or old.public_key() != request.public_key:
                how = "another key" if old.public_key() != request.public_key else "the same key"
                raise NameTakenError(
                    f"{ident.name} is already certified as {old_ident} under {how} "
                    f"(serial {serial_hex(old.serial_number)}, until {old.not_valid_after_utc:%Y-%m-%d}) and this "
                    f"request asks for {ident}; pass --replace if it really comes from that party"
                )
    cert = _build(ca, request.public_key, ident.name, [*request.hosts, *identity_names(ident.role, ident.name)],
                  ident.role, validity or _validity(days))  # fmt: skip
    (ca_dir / ISSUED).mkdir(mode=0o700, exist_ok=True)
    atomic_write(ca_dir / ISSUED / f"{serial_hex(cert.serial_number)}.pem", cert_pem(cert), 0o644)
    return cert


# ------------------------------------------------------------------------------ revocation


def _load_crl(ca_dir: Path) -> x509.CertificateRevocationList | None:
    path = ca_dir / "crl.pem"
    if not path.exists():
        return None
    try:
        return x509.load_pem_x509_crl(path.read_bytes())
    except ValueError:
        raise PkiError(f"{path} is not a PEM CRL") from None


def revoke(
    ca_dir: Path, name: str | None = None, serial: int | None = None, now: _dt.datetime | None = None
) -> list[x509.Certificate]:
    """``secure-release pki revoke``: add every certificate of ``name`` (or the one with
    ``serial``) to the CA's signed CRL ``ca_dir/crl.pem`` and return the newly revoked ones.

    The CRL keeps every earlier entry; its CRL number increases by one on each write."""
    ca_dir = Path(ca_dir)
    if (name is None) == (serial is None):
        raise PkiError("name exactly one of --name NAME or --serial S")
    ca = load_authority(ca_dir)
    issued = issued_certificates(ca_dir)
    if name is not None:
        targets = [c for c in issued if (i := _identity(c)) is not None and i.name == name]
        what = f"name {name!r}"
    else:
        targets = [c for c in issued if c.serial_number == serial]
        what = f"serial {serial_hex(serial or 0)}"
    if not targets:
        raise NotIssuedError(
            f"{ca_dir / ISSUED} holds no certificate with {what}; 'pki revoke' names a party or serial this CA signed"
        )
    old = _checked_crl(ca_dir, ca)
    entries = list(old) if old is not None else []
    already = {e.serial_number for e in entries}
    now = now or _now()
    fresh = [c for c in targets if c.serial_number not in already]
    for cert in fresh:
        entries.append(
            x509.RevokedCertificateBuilder().serial_number(cert.serial_number).revocation_date(now).build()
        )
    _sign_crl(ca_dir, ca, entries, old, now)
    return fresh


def refresh_crl(ca_dir: Path, now: _dt.datetime | None = None) -> x509.CertificateRevocationList:
    """``secure-release pki crl``: sign ``crl.pem`` again with every entry and a next update
    :data:`CRL_VALIDITY_DAYS` from now (an empty CRL if there is none yet)."""
    ca_dir = Path(ca_dir)
    ca = load_authority(ca_dir)
    old = _checked_crl(ca_dir, ca)
    return _sign_crl(ca_dir, ca, list(old) if old is not None else [], old, now or _now())


def _checked_crl(ca_dir: Path, ca: Authority) -> x509.CertificateRevocationList | None:
    old = _load_crl(ca_dir)
    if old is not None and not old.is_signature_valid(ca.key.public_key()):
        raise PkiError(f"{ca_dir / 'crl.pem'} is not signed by {ca_dir / 'ca.pem'}; move it away and revoke again")
    return old


def _sign_crl(
    ca_dir: Path,
    ca: Authority,
    entries: list[x509.RevokedCertificate],
    old: x509.CertificateRevocationList | None,
    now: _dt.datetime,
) -> x509.CertificateRevocationList:
    number = 1
    if old is not None:
        try:
            number = old.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number + 1
        except x509.ExtensionNotFound:
            number = 1
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.certificate.subject)
        .last_update(now)
        .next_update(now + _dt.timedelta(days=CRL_VALIDITY_DAYS))
        .add_extension(x509.CRLNumber(number), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
    )
    for entry in entries:
        builder = builder.add_revoked_certificate(entry)
    crl = builder.sign(ca.key, hashes.SHA256())
    atomic_write(ca_dir / "crl.pem", crl.public_bytes(serialization.Encoding.PEM), 0o644)
    return crl


def verify_issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """True if ``ca`` signed ``cert``."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# ------------------------------------------------------------------------------ demo path


def _check_parties(parties: Sequence[tuple[str, str]], hosts: Sequence[str]) -> None:
    seen: set[str] = set()
    for role, name in parties:
        check_party(role, name)
        if name in seen:
            raise PkiError(f"party name {name!r} appears twice; names must be unique")
        seen.add(name)
    if not hosts:
        raise PkiError("at least one host name or IP address is needed for the certificates")
    host_names(hosts)


def init_pki(
    directory: Path,
    parties: Sequence[tuple[str, str]],
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    force: bool = False,
) -> None:
    """The one-command demo path: ``DIR/ca/`` (the CA, :func:`create_ca`) and, per ``(role,
    name)`` party, ``DIR/NAME/`` holding ``ca.pem``, ``NAME.pem`` and ``NAME.key`` (made there
    by :func:`write_request`, certified by :func:`sign_request`). Give each process only its own
    ``DIR/NAME``; keep ``DIR/ca`` offline. Refuses an existing CA unless ``force``.
    """
    directory = Path(directory)
    _check_parties(parties, hosts)
    if (directory / "ca" / "ca.pem").exists() and not force:
        raise PkiError(f"{directory / 'ca' / 'ca.pem'} exists; pass force=True (--force) to replace the CA")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_dir = directory / "ca"
    ca = create_ca(ca_dir, force=force)
    for role, name in parties:
        party = directory / name
        if force:
            (party / "crl.pem").unlink(missing_ok=True)  # a CRL of the replaced CA
        csr = write_request(party, role, name, hosts, force=force)
        cert = sign_request(ca_dir, csr.read_bytes(), replace=force, source=str(csr))
        csr.unlink()  # signed at once: the party's directory holds only what its service reads
        atomic_write(party / f"{name}.pem", cert_pem(cert), 0o644)
        atomic_write(party / "ca.pem", cert_pem(ca.certificate), 0o644)
