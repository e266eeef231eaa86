"""Deadlines for every wait of a curator run (``--timeout`` applies end to end) and retrying
transient RPC failures until the deadline, each wait naming what it waited for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from secure_release.curator.errors import WaitTimeoutError, stopped_error
from secure_release.infra.logs import EventLog
from secure_release.infra.retry import is_transient

T = TypeVar("T")
TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 1.0


@dataclass
class Deadline:
    """One end-to-end deadline (monotonic) and the SIGTERM event every wait honours."""

    seconds: float
    stop: threading.Event = field(default_factory=threading.Event)
    end: float = 0.0

    def __post_init__(self) -> None:
        self.end = time.monotonic() + self.seconds

    def left(self) -> float:
        """Seconds until the deadline (never negative)."""
        return max(0.0, self.end - time.monotonic())

    def check(self, what: str) -> float:
        """Seconds left; :class:`WaitTimeoutError` naming ``what`` once none are, or
        :class:`StoppedError` after SIGTERM."""
        if self.stop.is_set():
            raise stopped_error(self.stop, f"while waiting for {what}")
        left = self.left()
        if left <= 0:
            raise WaitTimeoutError(f"gave up after {self.seconds:g} s (--timeout) waiting for {what}")
        return left

    def sleep(self, seconds: float, what: str) -> None:
        """Sleep up to ``seconds`` (woken by SIGTERM), then :meth:`check`."""
        self.stop.wait(min(seconds, self.left()))
        self.check(what)


def retry_until(
    fn: Callable[[float], T],
    what: str,
    deadline: Deadline,
    log: EventLog | None = None,
    per_call_s: float = 30.0,
    retry: frozenset[grpc.StatusCode] = TRANSIENT,
) -> T:
    """Call ``fn(timeout)`` until it succeeds, retrying ``retry`` codes with backoff until the
    deadline (then :class:`WaitTimeoutError` naming ``what`` and the last error)."""
    delay = FIRST_DELAY_S
    attempt = 0
    unreachable_said = False
    while True:
        left = deadline.check(what)
        attempt += 1
        try:
            return fn(max(0.05, min(per_call_s, left)))
        except grpc.RpcError as exc:
            code = exc.code()
            if not is_transient(exc, retry):
                raise
            if deadline.left() <= delay:
                raise WaitTimeoutError(
                    f"gave up after {deadline.seconds:g} s (--timeout) waiting for {what}; "
                    f"last answer {code.name}: {exc.details()}"
                ) from None
            if log is not None and code == grpc.StatusCode.UNAVAILABLE and not unreachable_said:
                unreachable_said = True  # said at once, not after the whole --timeout
                said = (exc.details() or "")[:200]
                log.warning("unreachable", what=what, code=code.name,
                            note=f"cannot reach {what} yet ({said}); retrying until --timeout")  # fmt: skip
            if log is not None and (attempt in (1, 2, 4, 8) or attempt % 16 == 0):
                log("retry", what=what, attempt=attempt, code=code.name, delay_s=round(delay, 2))
            deadline.sleep(delay, what)
            delay = min(delay * 2, MAX_DELAY_S)
