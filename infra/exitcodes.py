"""One exit-code convention for every command-line tool of the project (README: "Exit codes").

    0    success
    1    runtime failure: a peer unreachable, a timeout, an aborted release, a digest mismatch
    2    usage: bad flags, bad settings or bad input (a named error says what and what is allowed)
    3    refused: the request was understood and said no (budget exhausted, permission denied,
         a curator refused its key, a release that cannot be changed any more, a reused seed)
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

from secure_release.infra.fileio import DiskFullError
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError

OK = 0
FAILURE = 1
USAGE = 2
REFUSED = 3
INTERRUPTED = 130

_REFUSALS = (ErrorKind.PERMISSION_DENIED, ErrorKind.RESOURCE_EXHAUSTED, ErrorKind.ALREADY_EXISTS)
_FAILURES = (ErrorKind.UNAVAILABLE, ErrorKind.FAILED_PRECONDITION)
#: gRPC statuses (by name) that a peer uses to refuse, or to say the request was malformed.
_REFUSED_STATUSES = frozenset({"PERMISSION_DENIED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "ALREADY_EXISTS"})
_USAGE_STATUSES = frozenset({"INVALID_ARGUMENT", "NOT_FOUND"})
#: Input files that do not exist or are not files: the caller named the wrong thing.
_USAGE_OS_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


#: How an abort reason says the release was refused (not failed): every party that reads it from
#: the server's status exits :data:`REFUSED` too, so a refusal exits 3 at every party.
REFUSAL_MARK = "refused: "


def refusal_reason(exc: BaseException, who: str) -> str:
    """The abort reason ``who`` records for ``exc`` (it goes to the other parties): marked as a
    refusal when ``exc`` is one; a refusal passed on from another party keeps that party's
    reason; an error with a ``public_message`` (a table's bad rows) sends that, not its message."""
    if is_refusal(str(exc)):
        return str(exc)
    public = getattr(exc, "public_message", None)  # an error whose message holds private data (bad rows' values)
    text = f"{who}: {type(exc).__name__}: {public if isinstance(public, str) else exc}"
    return REFUSAL_MARK + text if exit_code_for(exc) == REFUSED else text


def is_refusal(reason: str) -> bool:
    """Whether an abort reason records a refusal: it starts with :data:`REFUSAL_MARK`, perhaps
    after the name of the error that carried it ("ReleaseRefusedError: refused: ...")."""
    head, _, tail = reason.partition(": ")
    return reason.startswith(REFUSAL_MARK) or (head.isidentifier() and tail.startswith(REFUSAL_MARK))


def grpc_status_name(exc: BaseException) -> str | None:
    """The status name of a gRPC error (None for anything else)."""
    code = getattr(exc, "code", None)
    from_grpc = type(exc).__module__.split(".")[0] == "grpc" or getattr(exc, "is_rpc_error", False)
    if not callable(code) or not from_grpc:
        return None
    try:
        return str(code().name)
    except (AttributeError, TypeError):
        return None


def exit_code_for(exc: BaseException) -> int:
    """The exit code a command ends with when ``exc`` stops it."""
    if isinstance(exc, KeyboardInterrupt) or getattr(exc, "interrupted", False) is True:
        return INTERRUPTED  # Ctrl-C, or an error that says a run was stopped by it
    status = grpc_status_name(exc)
    if status is not None:
        return REFUSED if status in _REFUSED_STATUSES else USAGE if status in _USAGE_STATUSES else FAILURE
    if isinstance(exc, _USAGE_OS_ERRORS):
        return USAGE
    if isinstance(exc, DiskFullError):  # nobody refused: the command can be repeated once space is freed
        return FAILURE
    if isinstance(exc, SecureReleaseError):
        if exc.kind in _REFUSALS:
            return REFUSED
        if exc.kind in _FAILURES:
            return FAILURE
        return USAGE
    return FAILURE


def verdict(code: int) -> str:
    """The first word of a command's last line for its exit code: "refused" (3), "failed" (1),
    "interrupted" (130), "error" (2, usage), so the end of the output says which row of the table it was."""
    return {REFUSED: "refused", FAILURE: "failed", INTERRUPTED: "interrupted"}.get(code, "error")


def describe(exc: BaseException) -> str:
    """One line naming the error (never a traceback, never a key)."""
    status = grpc_status_name(exc)
    if status is not None:
        details = getattr(exc, "details", None)
        return f"RPC failed: {status}: {details() if callable(details) else ''}"
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        # a file named by a flag or inside a directory a flag names (--certs DIR): the path, no errno
        return f"{exc.filename}: {exc.strerror.lower()}"
    return f"{type(exc).__name__}: {exc}"
