# tier: unit
"""Issue 24, item 5: no state path is followed through a planted symbolic link. Before, the
server created ``releases.sqlite3`` at a dangling link's target outside ``--store`` and chmod-ed
an existing link target to 0600; a ``ledger.lock`` link created its target outside the keystore;
a keystore path planted as a link made the curator chmod and write into the link's target."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.infra.fileio import UnsafePathError
from secure_release.server.store import Store, StoreError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_store_never_creates_or_chmods_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store = tmp_path / "store"
    store.mkdir()
    (store / "releases.sqlite3").symlink_to(outside / "planted.sqlite3")  # dangling
    with pytest.raises(StoreError, match="symbolic link"):
        Store(store)
    assert not (outside / "planted.sqlite3").exists()
    (outside / "victim").write_text("x")
    os.chmod(outside / "victim", 0o644)
    (store / "releases.sqlite3").unlink()
    (store / "releases.sqlite3").symlink_to(outside / "victim")
    with pytest.raises(StoreError, match="symbolic link"):
        Store(store)
    assert _mode(outside / "victim") == 0o644 and (outside / "victim").read_text() == "x"


def test_a_store_directory_or_wal_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.chmod(tmp_path / "real", 0o755)
    (tmp_path / "store").symlink_to(tmp_path / "real")
    with pytest.raises(StoreError, match="symbolic link"):
        Store(tmp_path / "store")
    assert _mode(tmp_path / "real") == 0o755 and not any((tmp_path / "real").iterdir())
    (tmp_path / "s2").mkdir()
    (tmp_path / "s2" / "releases.sqlite3-wal").symlink_to(tmp_path / "elsewhere-wal")
    with pytest.raises(StoreError, match="symbolic link"):
        Store(tmp_path / "s2")
    assert not (tmp_path / "elsewhere-wal").exists()


def test_a_ledger_lock_link_is_refused_and_its_target_never_created(tmp_path: Path) -> None:
    ks = tmp_path / "ks"
    ks.mkdir()
    (ks / "ledger.lock").symlink_to(tmp_path / "outside.lock")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        LedgerFile(ks).set_budget("adult", "adult", 1.0)
    assert not (tmp_path / "outside.lock").exists()


def test_a_ledger_file_link_is_refused(tmp_path: Path) -> None:
    ledger = LedgerFile(tmp_path / "ks")
    ledger.set_budget("adult", "adult", 1.0)
    (tmp_path / "copy.jsonl").write_bytes(ledger.path.read_bytes())
    ledger.path.unlink()
    ledger.path.symlink_to(tmp_path / "copy.jsonl")  # e.g. re-pointed later to roll back
    with pytest.raises(UnsafePathError, match="symbolic link"):
        ledger.read()


def test_a_keystore_planted_as_a_link_is_refused_without_touching_its_target(tmp_path: Path) -> None:
    target = tmp_path / "planter"
    target.mkdir()
    os.chmod(target, 0o755)
    (tmp_path / "keystore-alice").symlink_to(target)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        Keystore(tmp_path / "keystore-alice")
    assert _mode(target) == 0o755 and not any(target.iterdir())


def test_a_release_record_link_is_refused(tmp_path: Path) -> None:
    ks = Keystore(tmp_path / "ks")
    (tmp_path / "elsewhere.json").write_text("{}")
    (ks.directory / "release-r1.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        ks.load_record("r1")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a directory owned by another user")
def test_a_keystore_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 4242, 4242)
    with pytest.raises(UnsafePathError, match="belongs to user id 4242"):
        Keystore(foreign)


def test_a_results_directory_or_file_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    from secure_release.researcher.storage import read_report, write_report

    (tmp_path / "target").mkdir()
    (tmp_path / "results").symlink_to(tmp_path / "target")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        write_report(tmp_path / "results", None)  # type: ignore[arg-type]  # refused before the report is read
    assert not any((tmp_path / "target").iterdir())
    (tmp_path / "r1.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        read_report(tmp_path / "r1.json")
