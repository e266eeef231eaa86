"""infra.entry: one line and one exit code for whatever stops a tool; the serve loop's stop."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from secure_release.infra import exitcodes
from secure_release.infra.entry import run_main, serve_until_signal, stop_on_signals
from secure_release.mechanism.errors import (
    BudgetExceededError,
    InvalidEpsilonError,
    PadReuseError,
    SecureReleaseError,
)


class _TypedError(ValueError):
    pass


def _raising(exc: BaseException) -> int:
    raise exc


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (KeyboardInterrupt(), exitcodes.INTERRUPTED),
        (InvalidEpsilonError("epsilon must be > 0"), exitcodes.USAGE),
        (BudgetExceededError("0.4 left"), exitcodes.REFUSED),
        (PadReuseError("a pad was reused"), exitcodes.FAILURE),
        (FileNotFoundError(2, "No such file", "x.csv"), exitcodes.USAGE),
        (PermissionError(13, "denied", "x.csv"), exitcodes.FAILURE),
        (_TypedError("the operator's typo"), exitcodes.USAGE),
    ],
)
def test_every_stop_is_one_line_and_the_conventions_code(
    exc: BaseException, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main("tool", lambda: _raising(exc), usage_errors=(_TypedError,), interrupted_exit_s=None) == code
    err = capsys.readouterr().err
    if code == exitcodes.INTERRUPTED:
        assert err == ""
    else:
        word = {exitcodes.REFUSED: "refused", exitcodes.FAILURE: "failed"}.get(code, "error")
        assert err.startswith(f"tool: {word}: ") and err.count("\n") == 1 and "Traceback" not in err


def test_a_body_that_returns_gives_its_code_and_unknown_errors_propagate() -> None:
    assert run_main("tool", lambda: 0) == 0
    assert run_main("tool", lambda: 3) == 3
    with pytest.raises(RuntimeError):
        run_main("tool", lambda: _raising(RuntimeError("a bug shows its traceback")))


def test_files_made_under_run_main_are_private(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "f")
    old = os.umask(0o022)
    try:
        run_main("tool", lambda: (open(path, "w").close(), 0)[1])
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o077 == 0


def test_serve_until_signal_ticks_until_sigterm() -> None:
    stop = stop_on_signals()
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(1)
        if len(ticks) == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        serve_until_signal(stop, tick, every=0.01)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert stop.is_set() and len(ticks) == 3


def test_off_the_main_thread_no_handler_is_installed() -> None:
    before = signal.getsignal(signal.SIGTERM)
    got: list[threading.Event] = []
    thread = threading.Thread(target=lambda: got.append(stop_on_signals()))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is before and not got[0].is_set()


def test_a_swallowed_ctrl_c_still_stops_the_run_with_130() -> None:
    """SIGINT raises KeyboardInterrupt and sets the run's stop event: when a library swallows
    the exception (the except below), the run's next wait ends it all the same, exit 130."""
    from secure_release.curator.errors import stopped_error
    from secure_release.curator.waits import Deadline

    stop = stop_on_signals((signal.SIGTERM, signal.SIGINT), sigint_raises=True)
    raised = False
    try:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs at the next bytecode boundary
                time.sleep(0.001)
        except KeyboardInterrupt:
            raised = True  # ... and is swallowed here
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert raised and stop.is_set() and stop.signal_name == "SIGINT" and stop.interrupted
    with pytest.raises(SecureReleaseError, match=r"stopped \(SIGINT\) while waiting for the leader") as caught:
        Deadline(60.0, stop).sleep(30.0, "the leader")
    assert exitcodes.exit_code_for(caught.value) == exitcodes.INTERRUPTED
    assert exitcodes.verdict(exitcodes.INTERRUPTED) == "interrupted"
    sigterm = stopped_error(threading.Event(), "while waiting")  # a plain event: SIGTERM, exit 1
    assert "SIGTERM" in str(sigterm) and exitcodes.exit_code_for(sigterm) == exitcodes.FAILURE


def test_sigterm_sets_the_event_without_raising() -> None:
    stop = stop_on_signals((signal.SIGTERM, signal.SIGINT), sigint_raises=True)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            if stop.is_set():
                break
            time.sleep(0.001)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert stop.is_set() and stop.signal_name == "SIGTERM" and not stop.interrupted
