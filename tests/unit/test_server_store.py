"""The durable store on its own: competing specs for one id survive a restart, and binding one
discards the others on disk too."""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
import stat
import time
from pathlib import Path

import pytest

from secure_release.mechanism.primitives.keys import PramKey
from secure_release.server.state import NoSuchReleaseError, NotACuratorError, ReleaseState
from secure_release.server.store import Store, StoreError
from tests import support


def test_candidates_survive_restart_and_binding_discards_the_rest(tmp_path: Path) -> None:
    agreed = support.make_spec(rid="r1")
    squat = dataclasses.replace(agreed, curators=("carol", "bob"))
    store = Store(tmp_path)
    store.register(squat, "carol", "carol")
    store.register(agreed, "alice", "alice")
    store.close()

    store = Store(tmp_path)  # restart: both candidates are back, neither bound
    with pytest.raises(NoSuchReleaseError, match="all its curators"):
        store.release("r1")
    assert store.release("r1", "carol").spec.curators == ("carol", "bob")
    store.register(agreed, "bob", "bob")
    assert store.release("r1").spec.curators == ("alice", "bob")
    store.close()

    store = Store(tmp_path)
    rows = sqlite3.connect(tmp_path / "releases.sqlite3").execute("SELECT COUNT(*) FROM releases").fetchone()
    assert rows == (1,)
    with pytest.raises(NotACuratorError):
        store.put_chunk("r1", "carol", "carol", 0, b"\0")
    assert store.release("r1", "carol").state == ReleaseState.REGISTERED
    store.close()


def test_store_files_are_private_and_a_bad_store_is_a_named_error(tmp_path: Path) -> None:
    Store(tmp_path / "s").close()
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o700
    for f in (tmp_path / "s").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="directory"):
        Store(tmp_path / "file")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "releases.sqlite3").write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="cannot use"):
        Store(tmp_path / "corrupt")


def test_retention_deletes_finished_releases_only(tmp_path: Path) -> None:
    store = Store(tmp_path)
    spec = support.make_spec(rid="old", m=10, n=100)
    for c, col, k in zip(support.CURATORS, support.columns(10), support.SIZES, strict=True):
        store.register(spec, c, c)
        data = support.chunks_of(col, k)[0]
        store.put_chunk("old", c, c, 0, data)
        store.commit("old", c, c, 1, hashlib.sha256(data).digest())
    store.perturb("old", PramKey.generate)
    open_spec = support.make_spec(rid="open", m=10, n=100)
    store.register(open_spec, "alice", "alice")
    assert store.expire(time.time() - 3600) == []  # finished just now: kept
    assert store.expire(time.time() + 1) == ["old"]  # a retention of zero: gone
    with pytest.raises(NoSuchReleaseError):
        store.release("old")
    assert store.release("open", "alice").state == ReleaseState.REGISTERED  # never finished: kept
    store.close()
    assert [
        r[0] for r in sqlite3.connect(tmp_path / "releases.sqlite3").execute("SELECT release_id FROM perturbed")
    ] == []
