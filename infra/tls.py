"""Identity and authorization: a project CA, mutual TLS, and the channels and ports that use them.

Every party (curator, server, researcher, analyst) gets a certificate signed by the project CA
(ECDSA P-256, SHA-256). Its identity is the URI SAN ``secure-release://<role>/<name>``; the
DNS/IP SANs (``hosts``) let any party also act as a TLS server. mTLS alone admits any
certificate the CA signed, so every server checks each caller's role against the access table
(``infra.auth``), which also refuses a certificate revoked in the server's ``crl.pem``.

Each party uses only its own directory (``ca.pem``, ``NAME.pem``, ``NAME.key``, ``crl.pem``;
``infra.certdir``). :func:`bind` serves with dynamic credentials that take a renewed certificate
at the next handshake; :func:`secure_channel` checks the client's own certificate before it
connects and explains a refused handshake with the peer's address.

Insecure mode exists only behind explicit flags: :func:`bind` with ``insecure=True`` opens a
plaintext port and prints a loud warning; on a server built with ``insecure=True`` the caller's
identity is taken from the metadata key ``x-secure-release-identity: role/name`` (anyone can claim anything — tests and
local demos only). A TLS connection always takes its identity from the certificate.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc

from secure_release.infra.auth import AuthInterceptor, CallLimits
from secure_release.infra.certdir import WARN_DAYS, CertWatcher, load_party
from secure_release.infra.identity import (
    IDENTITY_METADATA_KEY,
    ROLES,
    Identity,
    PkiError,
    check_party,
    identity_of_file,
    peer_dns_name,
)
from secure_release.infra.logs import EventLog
from secure_release.mechanism.errors import SecureReleaseError

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
GRPC_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)
#: Servers also refuse to share a port: a second process binding a port in use fails.
SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (*GRPC_OPTIONS, ("grpc.so_reuseport", 0))


_WARNED: set[tuple[Path, int]] = set()


def channel_credentials(cert_dir: Path, name: str) -> grpc.ChannelCredentials:
    """TLS client credentials presenting ``<name>.pem`` and trusting only ``ca.pem``, after
    checking the directory and that the certificate is valid now, signed by ``ca.pem`` and not
    revoked in ``crl.pem`` (:func:`~secure_release.infra.certdir.load_party`): a client whose
    own certificate would be refused learns why, with the file and the date, before it connects.
    Each new channel reads the files again, so a renewed certificate is used from then on."""

    files = load_party(Path(cert_dir), name, strict=True)
    days = files.days_left()
    if days < WARN_DAYS and (files.cert_path, days) not in _WARNED:
        _WARNED.add((files.cert_path, days))  # once a day per file, not once per channel
        sys.stderr.write(
            f"WARNING: {files.cert_path} expires in {days} days ({files.not_after:%Y-%m-%d}); "
            "renew it (docs/deployment.md, Renew)\n"
        )
    return grpc.ssl_channel_credentials(
        root_certificates=files.ca_pem, private_key=files.key_pem, certificate_chain=files.cert_pem
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


class PeerHandshakeError(grpc.RpcError):
    """A connection whose TLS handshake failed, said in words with the peer's address (the
    status code stays UNAVAILABLE; ``details()`` carries the explanation and grpc's own text)."""

    is_rpc_error = True  # infra.exitcodes treats it as the gRPC error it wraps

    def __init__(self, original: grpc.RpcError, message: str) -> None:
        super().__init__(message)
        self._original, self._message = original, message

    def code(self) -> grpc.StatusCode:
        return self._original.code()

    def details(self) -> str:
        return self._message

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> BaseException:
        return self

    def traceback(self, timeout: float | None = None) -> None:
        return None

    def __str__(self) -> str:
        return self._message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


def explain_handshake(exc: BaseException, address: str, name: str, peer: str) -> str | None:
    """A sentence for an UNAVAILABLE error whose cause is the TLS handshake (None otherwise)."""
    details = str(exc.details() if callable(getattr(exc, "details", None)) else "")  # type: ignore[attr-defined]
    if "failed to connect" not in details:
        return None
    if "Hostname Verification" in details or "No match found for server name" in details:
        why = f"its certificate is not that of the {peer} this client expects; nothing was sent"
    elif "CERTIFICATE_VERIFY_FAILED" in details or "certificate verify failed" in details.lower():
        why = "its certificate is not signed by our ca.pem (another project's CA, or an expired certificate)"
    elif "Socket closed" in details or "handshake" in details.lower():
        why = (
            f"the peer closed the connection during the TLS handshake: it refused {name}'s certificate "
            "(not from the CA it trusts, or expired there) or does not speak TLS"
        )
    else:
        return None
    return f"TLS handshake with {address} refused: {why} [grpc: {details}]"


class _PeerErrors(_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream):
    """Turns a failed TLS handshake into :class:`PeerHandshakeError` naming the peer's address."""

    def __init__(self, address: str, name: str, peer: str) -> None:
        self.address, self.name, self.peer = address, name, peer

    def _explained(self, exc: grpc.RpcError) -> grpc.RpcError:
        message = explain_handshake(exc, self.address, self.name, self.peer)
        return exc if message is None else PeerHandshakeError(exc, message)

    def _single(self, outcome: Any) -> Any:
        # A call still running (``.future()``) is an RpcError too, and reading its details would
        # wait for it to end: only a finished outcome is explained.
        if isinstance(outcome, grpc.RpcError) and (not isinstance(outcome, grpc.Future) or outcome.done()):
            return self._explained(outcome)
        return outcome

    def intercept_unary_unary(self, continuation: Any, d: Any, request: Any) -> Any:
        return self._single(continuation(d, request))

    def intercept_stream_unary(self, continuation: Any, d: Any, it: Any) -> Any:
        return self._single(continuation(d, it))

    def intercept_unary_stream(self, continuation: Any, d: Any, request: Any) -> Any:
        return _ExplainedStream(continuation(d, request), self)

    def intercept_stream_stream(self, continuation: Any, d: Any, it: Any) -> Any:
        return _ExplainedStream(continuation(d, it), self)


class _ExplainedStream:
    """A response stream whose handshake failure is raised as :class:`PeerHandshakeError`."""

    def __init__(self, call: Any, errors: _PeerErrors) -> None:
        self._call, self._errors = call, errors

    def __iter__(self) -> _ExplainedStream:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as exc:
            raise self._errors._explained(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


def secure_channel(
    address: str,
    cert_dir: Path | None,
    name: str,
    insecure: bool = False,
    role: str | None = None,
    *,
    peer_role: str | None = None,
    peer_name: str | None = None,
) -> grpc.Channel:
    """A channel to ``address`` as party ``name`` (mutual TLS with ``cert_dir``) that only talks
    to a peer whose certificate carries ``peer_role`` (and ``peer_name`` where the deployment
    names it): the handshake fails, before a byte of data is sent, against any other peer.

    ``insecure=True``: a plaintext channel that claims the identity ``role/name`` in metadata
    (role from ``role``, else from ``name`` if it is ``role/name``, else from
    ``<cert_dir>/<name>.pem``). Only an insecure server accepts such a claim, and nothing checks
    the peer: a warning says so.
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
        sys.stderr.write(INSECURE_CLIENT_WARNING.format(address=address))
        channel = grpc.insecure_channel(address, options=list(GRPC_OPTIONS))
        return grpc.intercept_channel(channel, _IdentityMetadata(ident))
    if cert_dir is None:
        raise PkiError("a secure channel needs cert_dir (the directory of ca.pem and <name>.pem)")
    if peer_role not in ROLES:
        raise PkiError(f"a client must name the role it expects of {address}: one of {', '.join(ROLES)}")
    options = [*GRPC_OPTIONS, ("grpc.ssl_target_name_override", peer_dns_name(peer_role, peer_name))]
    channel = grpc.secure_channel(address, channel_credentials(cert_dir, name), options=options)
    peer = f"{peer_role} {peer_name}" if peer_name else peer_role
    return grpc.intercept_channel(channel, _PeerErrors(address, name, peer))


# ------------------------------------------------------------------------------ server side


class BindError(SecureReleaseError):
    """A listening address could not be opened (in use, out of range, not local)."""


def make_grpc_server(
    max_workers: int = 32,
    interceptors: Sequence[Any] = (),
    insecure: bool = False,
    calls_per_peer: int = 4,
    stream_idle_seconds: float = 30.0,
) -> grpc.Server:
    """A gRPC server with the project's message size limits (8 MiB) whose every RPC passes the
    access table (:class:`~secure_release.infra.auth.AuthInterceptor`) before its servicer runs.
    One peer holds at most ``calls_per_peer`` calls at once and a request stream idle for
    ``stream_idle_seconds`` is cancelled, so a flood from one peer cannot starve the others.
    ``insecure`` lets that interceptor accept metadata identities (plaintext tests only)."""
    from concurrent import futures


    limits = CallLimits(calls_per_peer, stream_idle_seconds)
    auth = AuthInterceptor(insecure=insecure, limits=limits)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        options=list(SERVER_OPTIONS),
        interceptors=[auth, *interceptors],
    )
    _AUTH[server] = auth
    return server


#: Each server's access check, so :func:`bind` can hand it the certificate watcher (its CRL).
_AUTH: weakref.WeakKeyDictionary[grpc.Server, Any] = weakref.WeakKeyDictionary()


def certificates_of(server: grpc.Server) -> CertWatcher | None:
    """The certificate watcher :func:`bind` gave ``server`` (None for a plaintext server)."""
    auth = _AUTH.get(server)
    return None if auth is None else cast("CertWatcher | None", auth.certificates)


INSECURE_CLIENT_WARNING = (
    "WARNING: secure-release is connecting WITHOUT TLS to {address}: the peer's role and "
    "identity are not checked. Tests and local demos only.\n"
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

    ``insecure=True`` opens a plaintext port instead and prints a loud warning to stderr; the
    server must then be built with ``make_grpc_server(insecure=True)`` for its interceptor to
    accept metadata identities (a per-server setting, never process-wide).
    """
    if not 0 <= int(port) <= 65535:
        raise BindError(f"port {port} is outside 0..65535 (0 lets the OS pick a free port)")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not insecure and cert_dir is None:
        raise PkiError("a TLS server needs --certs DIR (or pass --insecure for tests only)")
    credentials = None
    if not insecure:

        assert cert_dir is not None
        auth = _AUTH.get(server)
        if auth is None:
            raise PkiError("a TLS server must come from make_grpc_server: its access check also enforces the CRL")
        watcher = auth.certificates
        if watcher is None or (watcher.directory, watcher.name) != (Path(cert_dir), name):
            watcher = CertWatcher(cert_dir, name)
            auth.certificates = watcher
            auth.log = EventLog("auth", name)
            watcher.start()
        credentials = watcher.credentials()
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise BindError(
            f"could not listen on {address}: the port is in use or the host is not local; "
            "choose another --listen (port 0 picks a free one)"
        )
    if insecure:
        sys.stderr.write(INSECURE_WARNING.format(address=f"{host}:{bound}"))
        sys.stderr.flush()
    return bound
