"""Retrying transient gRPC failures with exponential backoff.

RESOURCE_EXHAUSTED means two things here: a permanent bound (``--max-rows``, a budget, a server
limit), which a retry cannot change, and the interceptor's per-peer call slots, which free up
when a call ends. Only the second carries gRPC's pushback trailer ``grpc-retry-pushback-ms``
(:data:`PUSHBACK_KEY`), so only it is retried (:func:`is_transient`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import grpc

from secure_release.infra.logs import EventLog

T = TypeVar("T")
RETRYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
)
#: The trailer a server sets when a RESOURCE_EXHAUSTED is worth retrying (gRPC's retry design, A6).
PUSHBACK_KEY = "grpc-retry-pushback-ms"


def pushed_back(exc: grpc.RpcError) -> bool:
    """Whether the server asked for a retry (the pushback trailer is present)."""
    trailers: Any = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return any(item[0] == PUSHBACK_KEY for item in (trailers or ()))


def is_transient(exc: grpc.RpcError, codes: Collection[grpc.StatusCode] = RETRYABLE) -> bool:
    """Whether ``exc`` is worth retrying: its code is in ``codes`` and, for RESOURCE_EXHAUSTED,
    the server pushed back (a busy call slot) rather than refused a bound."""
    code = exc.code() if hasattr(exc, "code") else None
    if code not in codes:
        return False
    return code is not grpc.StatusCode.RESOURCE_EXHAUSTED or pushed_back(exc)


def with_retries(
    fn: Callable[[], T],
    what: str,
    log: EventLog | None = None,
    attempts: int = 8,
    first_delay: float = 0.2,
    max_delay: float = 5.0,
) -> T:
    """Call ``fn`` retrying transient gRPC failures with exponential backoff."""
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if not is_transient(exc) or attempt == attempts:
                raise
            if log:
                log("retry", what=what, attempt=attempt, code=str(code), delay_s=round(delay, 2))
            time.sleep(delay)
            delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")  # pragma: no cover
