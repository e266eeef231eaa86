"""The one table from error kinds to gRPC status codes, shared by every service.

Every project error names its :class:`~secure_release.mechanism.errors.ErrorKind`; a servicer
turns an error into a status with :func:`abort_with` (or :func:`status_code_for` to ask).
"""

from __future__ import annotations

from typing import NoReturn

import grpc

from secure_release.mechanism.errors import ErrorKind, SecureReleaseError

STATUS_OF_KIND: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """The status a project error travels as; anything else is INTERNAL."""
    if isinstance(exc, SecureReleaseError):
        return STATUS_OF_KIND[exc.kind]
    return grpc.StatusCode.INTERNAL


def abort_with(context: grpc.ServicerContext, exc: SecureReleaseError) -> NoReturn:
    """End the RPC with the error's status and ``ErrorName: message`` as details."""
    context.abort(status_code_for(exc), f"{type(exc).__name__}: {exc}")
    raise AssertionError("context.abort returned")  # pragma: no cover
