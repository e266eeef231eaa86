"""The unit tier's promise, enforced: a unit test opens no socket and starts no process.

Loaded as a pytest plugin by ``tests/unit/conftest.py``: every test under ``tests/unit`` runs
with socket binds and connects, gRPC servers and channels, and every way of starting a process
(fork, exec, spawn, subprocess) replaced by a function that raises :class:`TierViolationError`.
A test that needs one belongs in ``tests/integration`` (in-process gRPC on 127.0.0.1 port 0) or
``tests/system`` (child processes). ``tests/unit/test_tier_guard.py`` plants violations and
checks that each one fails.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import grpc

# numpy < 2 runs `lscpu` in a child process the first time numpy.testing is imported (scipy.optimize
# and so dp_accounting import it): a library's import, not the test's doing, so it happens here,
# before any test runs behind the guard.
import numpy.testing  # noqa: F401
import pytest

# matplotlib (the optional plot extra) lists the system fonts with `fc-list` the first time it loads
# its font manager in a fresh HOME, as in CI, whichever test draws first: that happens here too.
with contextlib.suppress(ImportError):
    import matplotlib.font_manager  # noqa: F401


class TierViolationError(AssertionError):
    """A unit test opened a socket or started a process."""


def _refuse(what: str) -> Any:
    def refuse(*_: object, **__: object) -> Any:
        raise TierViolationError(
            f"a unit test may not {what}: move it to tests/integration (in-process gRPC) or "
            "tests/system (child processes)"
        )

    return refuse


#: (object, attribute, what it does) for every door the guard closes.
DOORS: tuple[tuple[Any, str, str], ...] = (
    (socket.socket, "bind", "bind a socket"),
    (socket.socket, "connect", "connect a socket"),
    (socket.socket, "connect_ex", "connect a socket"),
    (grpc, "server", "start a gRPC server"),
    (grpc, "secure_channel", "open a gRPC channel"),
    (grpc, "insecure_channel", "open a gRPC channel"),
    (_posixsubprocess, "fork_exec", "start a process"),
    (subprocess, "_fork_exec", "start a process"),
    (os, "fork", "fork a process"),
    (os, "posix_spawn", "spawn a process"),
    (os, "posix_spawnp", "spawn a process"),
    (os, "system", "run a shell command"),
    (os, "execv", "exec a program"),
    (os, "execve", "exec a program"),
)


@pytest.fixture(autouse=True)
def unit_tier_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for owner, name, what in DOORS:
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, _refuse(what))
    yield
