"""One exit-code convention for every command-line tool of the project (README: "Exit codes").

    0  success
    1  runtime failure: a peer unreachable, a timeout, an aborted release, a digest mismatch
    2  usage: bad flags, bad settings or bad input (a named error says what and what is allowed)
    3  refused: the request was understood and said no (budget exhausted, permission denied,
       a curator refused its key, a release that cannot be changed any more)
"""

from __future__ import annotations

from secure_release.mechanism.errors import ErrorKind, SecureReleaseError

OK = 0
FAILURE = 1
USAGE = 2
REFUSED = 3

_REFUSALS = (ErrorKind.PERMISSION_DENIED, ErrorKind.RESOURCE_EXHAUSTED, ErrorKind.ALREADY_EXISTS)
_FAILURES = (ErrorKind.UNAVAILABLE, ErrorKind.FAILED_PRECONDITION)


def exit_code_for(exc: BaseException) -> int:
    """The exit code a command ends with when ``exc`` stops it."""
    if isinstance(exc, SecureReleaseError):
        if exc.kind in _REFUSALS:
            return REFUSED
        if exc.kind in _FAILURES:
            return FAILURE
        return USAGE
    return FAILURE
