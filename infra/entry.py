"""The one entry wrapper of the four command-line tools, and their one serve-until-signal loop.

:func:`run_main` turns whatever stops a command into one line on stderr (never a traceback,
never a key) and the exit code of the shared convention (:mod:`.exitcodes`): 0 ok, 1 runtime
failure, 2 usage, 3 refused, 130 interrupted; the line starts with the row's word (``refused:``,
``failed:``, ``error:`` or, for a run that a stop event ended after Ctrl-C, ``interrupted:``;
a bare KeyboardInterrupt prints nothing). :func:`serve_until_signal` is the loop every
service runs after it starts listening: it returns on SIGTERM or SIGINT.

Ctrl-C raises wherever the main thread is, also inside the standard library: between a
``ThreadPoolExecutor`` starting a worker and registering it, it leaves an idle non-daemon
thread that the interpreter's exit then waits for forever. An interrupted command therefore
exits within :data:`INTERRUPT_EXIT_S` of returning, whatever thread is left (:func:`exit_within`).
pyarrow may not swallow the signal (:func:`python_owns_ctrl_c`); and where a run has a stop
event, SIGINT sets it besides raising (``stop_on_signals(sigint_raises=True)``), so an
interrupt that some library still swallows ends the run at its next wait, with exit 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import grpc

from secure_release.infra import exitcodes
from secure_release.mechanism.errors import SecureReleaseError

#: How long an interrupted command's interpreter may take to exit (joining threads, atexit
#: handlers) before it is ended with exit code 130 all the same.
INTERRUPT_EXIT_S = 5.0

#: What every tool reports in one line rather than a traceback.
REPORTED: tuple[type[BaseException], ...] = (SecureReleaseError, OSError, grpc.RpcError)


def run_main(
    program: str,
    body: Callable[[], int],
    usage_errors: tuple[type[BaseException], ...] = (),
    interrupted_exit_s: float | None = INTERRUPT_EXIT_S,
) -> int:
    """Run ``body`` with every file it creates 0600 (directories 0700) and return its exit code;
    an error in ``usage_errors`` (what the operator typed or gave) exits 2, any other project,
    file or RPC error exits with :func:`~.exitcodes.exit_code_for`, Ctrl-C with 130 (and the
    interpreter's exit is then bounded by ``interrupted_exit_s``, see :func:`exit_within`; None:
    unbounded, for a caller that goes on in the same process)."""
    os.umask(0o077)
    python_owns_ctrl_c()
    try:
        return int(body())
    except KeyboardInterrupt:
        if interrupted_exit_s is not None:
            exit_within(interrupted_exit_s, exitcodes.INTERRUPTED)
        return exitcodes.INTERRUPTED
    except usage_errors as exc:
        return _say(program, exc, exitcodes.USAGE)
    except REPORTED as exc:
        code = exitcodes.exit_code_for(exc)
        if code == exitcodes.INTERRUPTED and interrupted_exit_s is not None:
            exit_within(interrupted_exit_s, code)
        return _say(program, exc, code)


def python_owns_ctrl_c() -> None:
    """Leave SIGINT to Python's own handler. pyarrow's ``read_csv`` installs a handler of its
    own for the length of a read and loses a signal that lands near the read's end (measured
    here with pyarrow 26: 28 and 44 of 300 signals sent during reads of a 1,500-row table): the
    command then runs on as if Ctrl-C had not been pressed. A read now finishes, then the
    interrupt is raised."""
    import pyarrow

    pyarrow.enable_signal_handlers(False)


def exit_within(seconds: float, code: int) -> None:
    """End this process with ``code`` if it is still alive ``seconds`` after its main thread
    stopped (the interpreter's exit began): a daemon thread, which that exit does not wait for,
    so the exit cannot hang on a thread orphaned by an interrupt (see the module's docstring).
    Output is flushed first."""

    def end() -> None:
        threading.main_thread().join()
        time.sleep(seconds)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed already: nothing left to flush
                stream.flush()
        os._exit(code)

    threading.Thread(target=end, name="exit-within", daemon=True).start()


def _say(program: str, exc: BaseException, code: int) -> int:
    """One last line naming the row of the exit-code table (``refused``, ``failed`` or
    ``error``) and what stopped the command; returns ``code``."""
    sys.stderr.write(f"{program}: {exitcodes.verdict(code)}: {exitcodes.describe(exc)}\n")
    sys.stderr.flush()
    return code


class StopEvent(threading.Event):
    """A stop event that remembers which signal set it (:attr:`signal_name`, "SIGTERM" until
    one did), so that what it stops can say so and exit with the signal's code."""

    signal_name: str = "SIGTERM"

    @property
    def interrupted(self) -> bool:
        """Whether Ctrl-C (SIGINT) set it."""
        return self.is_set() and self.signal_name == "SIGINT"


def stop_on_signals(
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT), sigint_raises: bool = False
) -> StopEvent:
    """An event set by any of ``signals`` (handlers are installed only on the main thread, the
    only place Python allows it; elsewhere the event is set by its owner alone). With
    ``sigint_raises``, SIGINT also raises :class:`KeyboardInterrupt` as Python's own handler
    does: should a library swallow that exception, the set event still ends the run at its
    next wait (and the run exits 130: :func:`~.exitcodes.exit_code_for`)."""
    stop = StopEvent()

    def handle(signum: int, _frame: object) -> None:
        stop.signal_name = signal.Signals(signum).name
        stop.set()
        if sigint_raises and signum == signal.SIGINT:
            raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        for signum in signals:
            signal.signal(signum, handle)
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
