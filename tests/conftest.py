"""Shared fixtures: one project PKI for the session, and in-process servers on port 0."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import INPUT_TESTS, PARTIES

from secure_release.curator.cluster.engine import InlineEngine
from secure_release.infra import tls
from secure_release.infra.pki import init_pki
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server.service import ReleaseService
from secure_release.server.store import Store


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, from the folder it lives in (``make test-unit`` runs only
    ``tests/unit``; the integration and system tiers carry the ``integration`` marker too, so
    ``-m "not integration"`` still selects the unit tier), and the input tests with ``inputs``."""
    for item in items:
        tier = item.path.parent.name
        if tier in ("integration", "system"):
            item.add_marker(pytest.mark.integration)
            item.add_marker(getattr(pytest.mark, tier))
        if any(fnmatch.fnmatch(item.path.name, pattern) for pattern in INPUT_TESTS):
            item.add_marker(pytest.mark.inputs)


# What pytest itself may leave in the directory it runs in; anything else a test wrote there.
_RUNNER_FILES = (".pytest_cache", ".coverage*", "__pycache__", ".hypothesis")
_CWD_AT_START: set[str] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    _CWD_AT_START.update(os.listdir())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test writes under its ``tmp_path``, never into the directory the suite runs in (a
    relative default such as ``keystore-alice`` did): the session fails and names what appeared."""
    left = sorted(
        name for name in set(os.listdir()) - _CWD_AT_START
        if not any(fnmatch.fnmatch(name, pattern) for pattern in _RUNNER_FILES)
    )  # fmt: skip
    if left:
        print(f"\nthe tests left {left} in {os.getcwd()}: write under tmp_path")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session PKI root as ``pki init`` writes it: ``certs / NAME`` is the directory of party
    NAME (``ca.pem``, ``NAME.pem``, ``NAME.key``) for each of :data:`PARTIES`, ``certs / "ca"``
    the CA. Give each party only its own ``certs / NAME``."""
    directory = tmp_path_factory.mktemp("certs")
    init_pki(directory, PARTIES)
    return directory


@pytest.fixture(scope="module")
def server_port(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A release server over mutual TLS (as ``server``) on 127.0.0.1, for one test module."""
    store = Store(tmp_path_factory.mktemp("store"))
    server = tls.make_grpc_server(max_workers=4)
    pb_grpc.add_ReleaseServerServicer_to_server(ReleaseService(store), server)
    port = tls.bind(server, "127.0.0.1", 0, certs / "server", "server")
    server.start()
    yield port
    server.stop(0).wait()
    store.close()


@pytest.fixture(scope="module")
def engine() -> Iterator[InlineEngine]:
    """The in-process engine of a curator (two threads), for one test module."""

    engine = InlineEngine(2)
    yield engine
    engine.close()
