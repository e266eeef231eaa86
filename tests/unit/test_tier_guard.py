"""The unit tier's guard fails a planted test that opens a socket or starts a process."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Callable

import grpc
import pytest
from guard import DOORS, TierViolationError


def _bind() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))


def _connect() -> None:
    with socket.socket() as sock:
        sock.connect(("127.0.0.1", 9))


def _asyncio_server() -> None:
    async def main() -> None:
        await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)

    asyncio.run(main())


PLANTED: dict[str, Callable[[], object]] = {
    "socket bind": _bind,
    "socket connect": _connect,
    "create_connection": lambda: socket.create_connection(("127.0.0.1", 9), timeout=0.1),
    "asyncio server": _asyncio_server,
    "grpc server": lambda: grpc.server(None),  # type: ignore[arg-type]
    "grpc channel": lambda: grpc.insecure_channel("127.0.0.1:9"),
    "subprocess": lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
    "fork": lambda: os.fork(),
    "system": lambda: os.system("true"),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_socket_or_process_fails_the_test(name: str) -> None:
    with pytest.raises(TierViolationError, match="a unit test may not"):
        PLANTED[name]()


def test_every_door_is_closed_while_a_unit_test_runs() -> None:
    for owner, attr, _ in DOORS:
        if hasattr(owner, attr):
            assert getattr(owner, attr).__name__ == "refuse", f"{owner!r}.{attr}"
