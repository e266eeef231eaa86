"""Shared fixtures: one project PKI for the session, and in-process servers on port 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from secure_release.infra.pki import init_pki

#: Every party the tests use: three curators, the server, a granted and an ungranted
#: researcher, and an analyst.
PARTIES = [
    ("curator", "alice"),
    ("curator", "bob"),
    ("curator", "carol"),
    ("server", "server"),
    ("researcher", "researcher"),
    ("researcher", "mallory"),
    ("analyst", "analyst"),
]


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project CA and a certificate + key for each of :data:`PARTIES`."""
    directory = tmp_path_factory.mktemp("certs")
    init_pki(directory, PARTIES)
    return directory
