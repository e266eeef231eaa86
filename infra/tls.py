"""Identity and authorization: a project CA, mutual TLS, and role checks on every RPC.

Every party (curator, server, researcher, analyst) gets a certificate signed by the project CA
(ECDSA P-256, SHA-256). Its identity is the URI SAN ``secure-release://<role>/<name>``; the
DNS/IP SANs (``hosts``) let any party also act as a TLS server. mTLS alone admits any
certificate the CA signed, so every RPC calls :func:`require_role` with the roles it allows.

Insecure mode exists only behind explicit flags: :func:`bind` with ``insecure=True`` opens a
plaintext port and prints a loud warning; on such a server the caller's identity is taken from
the metadata key ``x-secure-release-identity: role/name`` (anyone can claim anything — tests and
local demos only). A TLS connection always takes its identity from the certificate.
"""

from __future__ import annotations

import datetime as _dt
import functools
import ipaddress
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from secure_release.infra.fileio import atomic_write
from secure_release.mechanism.errors import SecureReleaseError

ROLES = ("curator", "server", "researcher", "analyst")
URI_SCHEME = "secure-release://"
IDENTITY_METADATA_KEY = "x-secure-release-identity"
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
CERT_VALIDITY_DAYS = 30
GRPC_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


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
    if not _NAME_RE.match(name) or name in ("ca",):
        raise PkiError(
            f"party name {name!r} must be 1-64 characters of letters, digits, '_', '.', '-' "
            "(starting with a letter or digit) and not 'ca'"
        )


# ---------------------------------------------------------------------------------------- PKI


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
        raise PkiError(
            f"{directory / 'ca.pem'} exists; pass force=True (--force) to replace the CA"
        )

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
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
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
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        atomic_write(directory / f"{name}.key", _key_pem(key), 0o600)
        atomic_write(
            directory / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644
        )
    # The CA goes last, so an interrupted run leaves no CA and can simply be rerun.
    atomic_write(directory / "ca.key", _key_pem(ca_key), 0o600)
    atomic_write(directory / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PkiError(
            f"{what} {path} not found; create the PKI with 'secure-release pki init DIR'"
        ) from None


def _material(cert_dir: Path, name: str) -> tuple[bytes, bytes, bytes]:
    cert_dir = Path(cert_dir)
    return (
        _read(cert_dir / "ca.pem", "CA certificate"),
        _read(cert_dir / f"{name}.key", "private key"),
        _read(cert_dir / f"{name}.pem", "certificate"),
    )


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
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(URI_SCHEME):
            try:
                return Identity.parse(uri)
            except PkiError:
                return None
    return None


def identity_of_file(cert_dir: Path, name: str) -> Identity:
    """The identity in ``<cert_dir>/<name>.pem``."""
    ident = identity_of_certificate(_read(Path(cert_dir) / f"{name}.pem", "certificate"))
    if ident is None:
        raise PkiError(f"{Path(cert_dir) / f'{name}.pem'} carries no secure-release:// URI SAN")
    return ident


def server_credentials(cert_dir: Path, name: str) -> grpc.ServerCredentials:
    """TLS server credentials that require a client certificate signed by ``ca.pem``."""
    ca, key, cert = _material(cert_dir, name)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(cert_dir: Path, name: str) -> grpc.ChannelCredentials:
    """TLS client credentials presenting ``<name>.pem`` and trusting only ``ca.pem``."""
    ca, key, cert = _material(cert_dir, name)
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


# The interceptor bases are generic only in grpc-stubs, not at runtime.
if TYPE_CHECKING:
    _UnaryUnary = grpc.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.UnaryStreamClientInterceptor[Any, Any]
    _StreamUnary = grpc.StreamUnaryClientInterceptor[Any, Any]
    _StreamStream = grpc.StreamStreamClientInterceptor[Any, Any]
else:
    _UnaryUnary = grpc.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.UnaryStreamClientInterceptor
    _StreamUnary = grpc.StreamUnaryClientInterceptor
    _StreamStream = grpc.StreamStreamClientInterceptor


class _IdentityMetadata(_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream):
    def __init__(self, identity: Identity) -> None:
        self._value = str(identity)

    def _details(self, d: Any) -> Any:
        md: list[tuple[str, str | bytes]] = [
            *(d.metadata or []),
            (IDENTITY_METADATA_KEY, self._value),
        ]
        return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

    def intercept_unary_unary(self, continuation: Any, d: Any, request: Any) -> Any:
        return continuation(self._details(d), request)

    def intercept_unary_stream(self, continuation: Any, d: Any, request: Any) -> Any:
        return continuation(self._details(d), request)

    def intercept_stream_unary(self, continuation: Any, d: Any, it: Any) -> Any:
        return continuation(self._details(d), it)

    def intercept_stream_stream(self, continuation: Any, d: Any, it: Any) -> Any:
        return continuation(self._details(d), it)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d: Any, metadata: list[tuple[str, str | bytes]]) -> None:
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = tuple(metadata)
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


def secure_channel(
    address: str,
    cert_dir: Path | None,
    name: str,
    insecure: bool = False,
    role: str | None = None,
) -> grpc.Channel:
    """A channel to ``address`` as party ``name`` (mutual TLS with ``cert_dir``).

    ``insecure=True``: a plaintext channel that claims the identity ``role/name`` in metadata
    (role from ``role``, else from ``name`` if it is ``role/name``, else from
    ``<cert_dir>/<name>.pem``). Only an insecure server accepts such a claim.
    """
    if insecure:
        if role is not None:
            ident = Identity(role, name)
            check_party(role, name)
        elif "/" in name:
            ident = Identity.parse(name)
        elif cert_dir is not None:
            ident = identity_of_file(cert_dir, name)
        else:
            raise PkiError(
                "an insecure channel needs the caller's role: pass role=..., name='role/name' "
                "or a cert_dir holding <name>.pem"
            )
        channel = grpc.insecure_channel(address, options=list(GRPC_OPTIONS))
        return grpc.intercept_channel(channel, _IdentityMetadata(ident))
    if cert_dir is None:
        raise PkiError("a secure channel needs cert_dir (the directory of ca.pem and <name>.pem)")
    return grpc.secure_channel(
        address, channel_credentials(cert_dir, name), options=list(GRPC_OPTIONS)
    )


# ------------------------------------------------------------------------------ server side

_insecure_lock = threading.Lock()
_insecure_servers = 0  # servers in this process with a plaintext port (bind(insecure=True))


def insecure_mode_enabled() -> bool:
    return _insecure_servers > 0


def caller_identity(context: grpc.ServicerContext) -> Identity | None:
    """The caller's identity: its certificate's URI SAN (TLS), or on an insecure server the
    ``x-secure-release-identity`` metadata; None if there is none."""
    # grpc-stubs declare Mapping[str, bytes]; at runtime each value is a list of bytes.
    auth = cast("Mapping[str, Sequence[bytes]]", context.auth_context() or {})
    pems = auth.get("x509_pem_cert")
    if pems:
        return _identity_of_pem(bytes(pems[0]))
    if auth.get("transport_security_type") == [b"ssl"]:
        return None  # TLS without a client certificate: never fall back to metadata
    if not insecure_mode_enabled():
        return None
    for key, value in context.invocation_metadata() or ():
        if key == IDENTITY_METADATA_KEY:
            try:
                return Identity.parse(value if isinstance(value, str) else value.decode())
            except (PkiError, UnicodeDecodeError):
                return None
    return None


def require_role(context: grpc.ServicerContext, *allowed_roles: str) -> Identity:
    """The caller's identity if its role is allowed; otherwise abort the RPC
    (UNAUTHENTICATED without an identity, PERMISSION_DENIED for a wrong role)."""
    rpc = sys._getframe(1).f_code.co_name
    ident = caller_identity(context)
    if ident is None:
        _abort(
            context,
            grpc.StatusCode.UNAUTHENTICATED,
            f"{rpc} needs an authenticated caller (a client certificate from the project CA)",
        )
    if ident.role not in allowed_roles:
        _abort(
            context,
            grpc.StatusCode.PERMISSION_DENIED,
            f"role {ident.role} may not call {rpc}; allowed: {', '.join(allowed_roles)}",
        )
    return ident


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # pragma: no cover


def make_grpc_server(max_workers: int = 8, interceptors: Sequence[Any] = ()) -> grpc.Server:
    """A gRPC server with the project's message size limits (8 MiB)."""
    from concurrent import futures

    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        options=list(GRPC_OPTIONS),
        interceptors=list(interceptors),
    )


INSECURE_WARNING = (
    "\n" + "!" * 78 + "\n"
    "!! WARNING: secure-release is serving WITHOUT TLS on {address}.\n"
    "!! Anyone can connect and claim any identity (x-secure-release-identity metadata).\n"
    "!! Use this only for tests and local demos; never with real data.\n" + "!" * 78 + "\n"
)


def bind(
    server: grpc.Server,
    host: str,
    port: int,
    cert_dir: Path | None,
    name: str,
    insecure: bool = False,
) -> int:
    """Open ``host:port`` (port 0 picks one) with mutual TLS as ``name``; return the bound port.

    ``insecure=True`` opens a plaintext port instead, prints a loud warning to stderr and lets
    this process's servicers accept metadata identities on plaintext connections.
    """
    global _insecure_servers
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if insecure:
        bound = server.add_insecure_port(address)
        if bound == 0:
            raise PkiError(f"could not bind {address}")
        with _insecure_lock:
            _insecure_servers += 1
        sys.stderr.write(INSECURE_WARNING.format(address=f"{host}:{bound}"))
        sys.stderr.flush()
        return bound
    if cert_dir is None:
        raise PkiError("a TLS server needs --certs DIR (or pass --insecure for tests only)")
    bound = server.add_secure_port(address, server_credentials(cert_dir, name))
    if bound == 0:
        raise PkiError(f"could not bind {address}")
    return bound
