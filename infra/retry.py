"""Retrying transient gRPC failures with exponential backoff."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from secure_release.infra.logs import EventLog

T = TypeVar("T")
RETRYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
)


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
            if code not in RETRYABLE or attempt == attempts:
                raise
            if log:
                log("retry", what=what, attempt=attempt, code=str(code), delay_s=round(delay, 2))
            time.sleep(delay)
            delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")  # pragma: no cover
