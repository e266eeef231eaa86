"""Shared fixtures: one project PKI for the session, and in-process servers on port 0."""

from __future__ import annotations

import fnmatch
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
