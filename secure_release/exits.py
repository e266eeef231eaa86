"""The exit-code convention (``infra.exitcodes``) applied to whatever stops a ``secure-release``
subcommand, gRPC errors and file errors included.

    0 ok   1 runtime failure   2 usage (bad flags, settings or input)   3 refused   130 interrupted
"""

from __future__ import annotations

from secure_release.infra.exitcodes import FAILURE, REFUSED, USAGE, exit_code_for

INTERRUPTED = 130
#: gRPC statuses by exit code; any other status is a runtime failure (1).
_REFUSED_STATUSES = frozenset({"PERMISSION_DENIED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "ALREADY_EXISTS"})
_USAGE_STATUSES = frozenset({"INVALID_ARGUMENT", "NOT_FOUND"})
#: Input files that do not exist or are not files: the caller named the wrong thing.
_USAGE_OS_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


def exit_code(exc: BaseException) -> int:
    """The exit code a subcommand ends with when ``exc`` stops it."""
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    status = _grpc_status(exc)
    if status is not None:
        return REFUSED if status in _REFUSED_STATUSES else USAGE if status in _USAGE_STATUSES else FAILURE
    if isinstance(exc, _USAGE_OS_ERRORS):
        return USAGE
    from secure_release.infra.config import ConfigError

    if isinstance(exc, ConfigError):
        return USAGE
    return exit_code_for(exc)


def _grpc_status(exc: BaseException) -> str | None:
    """The status name of a gRPC error (None for anything else)."""
    code = getattr(exc, "code", None)
    if not callable(code) or type(exc).__module__.split(".")[0] != "grpc":
        return None
    try:
        return str(code().name)
    except (AttributeError, TypeError):
        return None


def describe(exc: BaseException) -> str:
    """One line naming the error (never a traceback, never a key)."""
    status = _grpc_status(exc)
    if status is not None:
        details = getattr(exc, "details", None)
        return f"RPC failed: {status}: {details() if callable(details) else ''}"
    return f"{type(exc).__name__}: {exc}"


__all__ = ["FAILURE", "INTERRUPTED", "REFUSED", "USAGE", "describe", "exit_code"]
