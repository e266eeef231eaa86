"""Who may call what: one table for every RPC of every service, enforced in one place.

:data:`ACCESS` maps each full method name to the roles allowed to call it. :class:`AuthInterceptor`
(grpc's auth-interceptor pattern) wraps every handler of a server: it reads the caller's
identity from its client certificate (or, only on a server built with ``insecure=True``, from
the ``x-secure-release-identity`` metadata), refuses a call with no identity (UNAUTHENTICATED),
a method missing from the table or a role it does not allow (PERMISSION_DENIED) before the
servicer runs, and hands the servicer an :class:`AuthedContext` whose ``identity`` it can trust.
Per-release checks (membership, grants) stay in the servicers, which know the release.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import grpc

from secure_release.infra.certdir import CertWatcher
from secure_release.infra.identity import IDENTITY_METADATA_KEY, ROLES, Identity, PkiError, identity_of_certificate
from secure_release.infra.logs import EventLog
from secure_release.infra.retry import PUSHBACK_KEY

_RS = "/securerelease.v1.ReleaseServer/"
_CU = "/securerelease.v1.Curator/"
_RE = "/securerelease.v1.Researcher/"
_ANY = frozenset(ROLES)
PUSHBACK_MS = 100  # a busy peer retries after this long (its call slots free up as calls end)

#: Every RPC the project serves and the roles that may call it.
ACCESS: Mapping[str, frozenset[str]] = {
    _RS + "RegisterPart": frozenset({"curator"}),
    _RS + "UploadCiphertext": frozenset({"curator"}),
    _RS + "GetReleaseStatus": _ANY,
    _RS + "FetchPerturbed": frozenset({"researcher"}),
    _RS + "AbortRelease": frozenset({"curator"}),
    _RS + "StoreTable": frozenset({"curator"}),  # per table: only its declared curators
    _RS + "GetTableStatus": frozenset({"curator"}),  # per table: only its curators
    _RS + "DeleteTable": frozenset({"curator"}),  # per table: only its curators
    _RS + "FetchSample": frozenset({"curator"}),  # per release: only its registered curators
    _RS + "WitnessLedger": frozenset({"curator"}),  # per curator: only its own witness
    _RS + "DeclareRelease": frozenset({"curator"}),  # per curator: only its own record
    _RS + "GetRefusals": frozenset({"curator", "researcher"}),  # only refusals a second party confirms
    _CU + "SubmitTags": frozenset({"curator"}),
    _CU + "GetAgreement": frozenset({"curator"}),
    _CU + "ReleaseKey": frozenset({"researcher"}),
    _CU + "AcknowledgeKey": frozenset({"researcher"}),
    _CU + "PsiSend": frozenset({"curator"}),
    _CU + "PsiReceive": frozenset({"curator"}),
    _RE + "NotifyReady": frozenset({"server"}),
    _RE + "GetEstimate": frozenset({"analyst", "researcher"}),
    _RE + "ListReleases": frozenset({"analyst", "researcher"}),
    "/grpc.health.v1.Health/Check": _ANY,
    "/grpc.health.v1.Health/Watch": _ANY,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": _ANY,
}


class AuthedContext:
    """A servicer context that also carries the caller's checked identity."""

    def __init__(self, context: grpc.ServicerContext, identity: Identity) -> None:
        self._context = context
        self.identity = identity

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def caller(context: Any) -> Identity:
    """The identity the interceptor checked. Fails closed on a context it did not wrap."""
    if not isinstance(context, AuthedContext):
        raise PermissionError("this servicer runs only behind AuthInterceptor")
    return context.identity


def identity_from_context(context: grpc.ServicerContext, insecure: bool) -> Identity | None:
    """The caller's certificate identity; on an insecure server its metadata claim."""
    # grpc-stubs declare Mapping[str, bytes]; at runtime each value is a list of bytes.
    auth = cast("Mapping[str, Sequence[bytes]]", context.auth_context() or {})
    pems = auth.get("x509_pem_cert")
    if pems:
        return identity_of_certificate(bytes(pems[0]))
    if auth.get("transport_security_type") == [b"ssl"] or not insecure:
        return None  # TLS without a client certificate never falls back to metadata
    for key, value in context.invocation_metadata() or ():
        if key == IDENTITY_METADATA_KEY:
            try:
                return Identity.parse(value if isinstance(value, str) else value.decode())
            except (PkiError, UnicodeDecodeError):
                return None
    return None


def peer_certificate(context: grpc.ServicerContext) -> bytes | None:
    """The PEM client certificate of a TLS caller (None on a plaintext connection)."""
    auth = cast("Mapping[str, Sequence[bytes]]", context.auth_context() or {})
    pems = auth.get("x509_pem_cert")
    return bytes(pems[0]) if pems else None


def check_call(
    method: str, identity: Identity | None, access: Mapping[str, frozenset[str]]
) -> tuple[grpc.StatusCode, str] | None:
    """None if ``identity`` may call ``method``; else the status and message to refuse with."""
    name = method.rsplit("/", 1)[-1]
    if identity is None:
        return (
            grpc.StatusCode.UNAUTHENTICATED,
            f"{name} needs an authenticated caller (a client certificate from the project CA)",
        )
    allowed = access.get(method)
    if allowed is None:
        return grpc.StatusCode.PERMISSION_DENIED, f"{method} is not in the access table"
    if identity.role not in allowed:
        return (
            grpc.StatusCode.PERMISSION_DENIED,
            f"role {identity.role} may not call {name}; allowed: {', '.join(sorted(allowed))}",
        )
    return None


# The interceptor base is generic only in grpc-stubs, not at runtime.
if TYPE_CHECKING:

    _ServerInterceptor = grpc.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.ServerInterceptor


@dataclass(frozen=True)
class CallLimits:
    """Per-peer bounds: calls in flight at once, and how long a request stream may sit idle."""

    calls_per_peer: int = 4
    stream_idle_seconds: float = 30.0


class _Slots:
    """Counts each peer's calls in flight."""

    def __init__(self, limit: int) -> None:
        self.limit, self.lock, self.held = limit, threading.Lock(), dict[str, int]()

    def acquire(self, peer: str) -> bool:
        with self.lock:
            if self.held.get(peer, 0) >= self.limit:
                return False
            self.held[peer] = self.held.get(peer, 0) + 1
            return True

    def release(self, peer: str) -> None:
        with self.lock:
            self.held[peer] -= 1
            if not self.held[peer]:
                del self.held[peer]


class _IdleWatch:
    """One thread per server that cancels request streams idle for too long."""

    def __init__(self, idle_seconds: float) -> None:
        self.idle_seconds = idle_seconds
        self.lock = threading.Lock()
        self.waiting: dict[int, tuple[float, grpc.ServicerContext]] = {}
        self.thread: threading.Thread | None = None

    def guard(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        """``requests``, with the wait for each next message watched."""
        key = id(context)
        self._start()
        try:
            while True:
                with self.lock:
                    self.waiting[key] = (time.monotonic(), context)
                try:
                    item = next(requests)
                except StopIteration:
                    return
                finally:
                    with self.lock:
                        self.waiting.pop(key, None)
                yield item
        finally:
            with self.lock:
                self.waiting.pop(key, None)

    def _start(self) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="idle-streams", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.idle_seconds / 4))
            now = time.monotonic()
            with self.lock:
                idle = [ctx for since, ctx in self.waiting.values() if now - since > self.idle_seconds]
            for ctx in idle:
                ctx.cancel()  # type: ignore[no-untyped-call]


class AuthInterceptor(_ServerInterceptor):
    """Checks :data:`ACCESS` (or ``access``) before any servicer code runs, and with ``limits``
    bounds each peer's calls in flight (RESOURCE_EXHAUSTED beyond) and cancels idle streams."""

    def __init__(
        self,
        insecure: bool = False,
        access: Mapping[str, frozenset[str]] = ACCESS,
        limits: CallLimits | None = None,
    ) -> None:
        self.insecure, self.access, self.limits = insecure, access, limits
        #: The server's certificate directory (set by ``infra.tls.bind``): its CRL is checked here.
        self.certificates: CertWatcher | None = None
        self.log = EventLog("auth", "-")
        self.slots = _Slots(limits.calls_per_peer) if limits else None
        self.idle = _IdleWatch(limits.stream_idle_seconds) if limits else None

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method: str = details.method

        def guard(
            behavior: Callable[[Any, Any], Any], streams_in: bool, streams_out: bool
        ) -> Callable[[Any, Any], Any]:
            def checked(request: Any, context: grpc.ServicerContext) -> Any:
                identity = identity_from_context(context, self.insecure)
                refusal = check_call(method, identity, self.access) or self._revocation(context, method, identity)
                if refusal is not None:
                    context.abort(*refusal)
                assert identity is not None
                authed = AuthedContext(context, identity)
                if self.slots is None or self.idle is None:
                    return behavior(request, authed)
                peer = str(identity)
                if not self.slots.acquire(peer):
                    context.set_trailing_metadata(((PUSHBACK_KEY, str(PUSHBACK_MS)),))
                    context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"{peer} already has {self.slots.limit} calls in flight here; wait for one to finish",
                    )
                if streams_in:
                    request = self.idle.guard(request, context)
                try:
                    result = behavior(request, authed)
                except BaseException:
                    self.slots.release(peer)
                    raise
                if not streams_out:
                    self.slots.release(peer)
                    return result
                return self._released_after(result, peer)

            return checked

        kinds = (
            ("unary_unary", False, False, grpc.unary_unary_rpc_method_handler),
            ("unary_stream", False, True, grpc.unary_stream_rpc_method_handler),
            ("stream_unary", True, False, grpc.stream_unary_rpc_method_handler),
            ("stream_stream", True, True, grpc.stream_stream_rpc_method_handler),
        )
        for attr, streams_in, streams_out, make in kinds:
            behavior = getattr(handler, attr)
            if behavior:
                return make(
                    guard(behavior, streams_in, streams_out),
                    handler.request_deserializer,
                    handler.response_serializer,
                )
        return handler  # pragma: no cover - every handler has one behavior

    def _revocation(
        self, context: grpc.ServicerContext, method: str, identity: Identity | None
    ) -> tuple[grpc.StatusCode, str] | None:
        """UNAUTHENTICATED if the caller's certificate is in the server's current CRL."""
        watcher = self.certificates
        pem = peer_certificate(context) if watcher is not None else None
        if watcher is None or pem is None:
            return None
        serial = watcher.revoked_serial(pem)
        if serial is None:
            return None
        name = method.rsplit("/", 1)[-1]
        self.log.warning("revoked_certificate_refused", method=name, peer=str(identity), serial=f"{serial:x}")
        return (
            grpc.StatusCode.UNAUTHENTICATED,
            f"the client certificate of {identity} (serial {serial:x}) is revoked by the project CA; {name} refused",
        )

    def _released_after(self, responses: Iterator[Any], peer: str) -> Iterator[Any]:
        """Yield a streaming response; the peer's slot is freed when it ends or is abandoned."""
        assert self.slots is not None
        try:
            yield from responses
        finally:
            self.slots.release(peer)
