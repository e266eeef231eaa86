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

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import grpc

from secure_release.infra.tls import IDENTITY_METADATA_KEY, ROLES, Identity, PkiError, identity_of_certificate

_RS = "/securerelease.v1.ReleaseServer/"
_CU = "/securerelease.v1.Curator/"
_RE = "/securerelease.v1.Researcher/"
_ANY = frozenset(ROLES)

#: Every RPC the project serves and the roles that may call it.
ACCESS: Mapping[str, frozenset[str]] = {
    _RS + "RegisterPart": frozenset({"curator"}),
    _RS + "UploadCiphertext": frozenset({"curator"}),
    _RS + "GetReleaseStatus": _ANY,
    _RS + "FetchPerturbed": frozenset({"researcher"}),
    _CU + "SubmitTags": frozenset({"curator"}),
    _CU + "GetAgreement": frozenset({"curator"}),
    _CU + "ReleaseKey": frozenset({"researcher"}),
    _RE + "NotifyReady": frozenset({"server"}),
    _RE + "GetEstimate": frozenset({"analyst", "researcher"}),
    _RE + "ListReleases": frozenset({"analyst", "researcher"}),
    "/grpc.health.v1.Health/Check": _ANY,
    "/grpc.health.v1.Health/Watch": _ANY,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": _ANY,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": _ANY,
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


class AuthInterceptor(_ServerInterceptor):
    """Checks :data:`ACCESS` (or ``access``) before any servicer code runs."""

    def __init__(self, insecure: bool = False, access: Mapping[str, frozenset[str]] = ACCESS) -> None:
        self.insecure, self.access = insecure, access

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method: str = details.method

        def guard(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
            def checked(request: Any, context: grpc.ServicerContext) -> Any:
                identity = identity_from_context(context, self.insecure)
                refusal = check_call(method, identity, self.access)
                if refusal is not None:
                    context.abort(*refusal)
                assert identity is not None
                return behavior(request, AuthedContext(context, identity))

            return checked

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                guard(handler.unary_unary), handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                guard(handler.unary_stream), handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                guard(handler.stream_unary), handler.request_deserializer, handler.response_serializer
            )
        return grpc.stream_stream_rpc_method_handler(
            guard(handler.stream_stream), handler.request_deserializer, handler.response_serializer
        )
