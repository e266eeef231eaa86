"""The one entry wrapper of the four command-line tools, and their one serve-until-signal loop.

:func:`run_main` turns whatever stops a command into one line on stderr (never a traceback,
never a key) and the exit code of the shared convention (:mod:`.exitcodes`): 0 ok, 1 runtime
failure, 2 usage, 3 refused, 130 interrupted; the line starts with the row's word (``refused:``,
``failed:`` or ``error:``). :func:`serve_until_signal` is the loop every
service runs after it starts listening: it returns on SIGTERM or SIGINT.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

import grpc

from secure_release.infra import exitcodes
from secure_release.mechanism.errors import SecureReleaseError

#: What every tool reports in one line rather than a traceback.
REPORTED: tuple[type[BaseException], ...] = (SecureReleaseError, OSError, grpc.RpcError)


def run_main(
    program: str, body: Callable[[], int], usage_errors: tuple[type[BaseException], ...] = ()
) -> int:
    """Run ``body`` with every file it creates 0600 (directories 0700) and return its exit code;
    an error in ``usage_errors`` (what the operator typed or gave) exits 2, any other project,
    file or RPC error exits with :func:`~.exitcodes.exit_code_for`, Ctrl-C with 130."""
    os.umask(0o077)
    try:
        return int(body())
    except KeyboardInterrupt:
        return exitcodes.INTERRUPTED
    except usage_errors as exc:
        return _say(program, exc, exitcodes.USAGE)
    except REPORTED as exc:
        return _say(program, exc, exitcodes.exit_code_for(exc))


def _say(program: str, exc: BaseException, code: int) -> int:
    """One last line naming the row of the exit-code table (``refused``, ``failed`` or
    ``error``) and what stopped the command; returns ``code``."""
    sys.stderr.write(f"{program}: {exitcodes.verdict(code)}: {exitcodes.describe(exc)}\n")
    sys.stderr.flush()
    return code


def stop_on_signals(signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)) -> threading.Event:
    """An event set by any of ``signals`` (handlers are installed only on the main thread, the
    only place Python allows it; elsewhere the event is set by its owner alone)."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in signals:
            signal.signal(signum, lambda *_: stop.set())
    return stop


def serve_until_signal(
    stop: threading.Event | None = None, tick: Callable[[], None] | None = None, every: float = 0.5
) -> None:
    """Block until ``stop`` is set (by default: until SIGTERM or SIGINT), calling ``tick`` (if
    given) every ``every`` seconds meanwhile."""
    stop = stop if stop is not None else stop_on_signals()
    while not stop.wait(every):
        if tick is not None:
            tick()
