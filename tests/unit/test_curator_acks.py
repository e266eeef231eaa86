"""A curator's saved key acknowledgements: read back, never through a link, a corrupt file
counted as none (logged), written 0600 only when they change."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from secure_release.curator.release.serving import _load_acks, _save_acks
from secure_release.infra.fileio import UnsafePathError
from secure_release.infra.logs import EventLog

LOG = EventLog("curator", "test")


def test_acknowledgements_round_trip_and_a_corrupt_file_counts_as_none(tmp_path: Path) -> None:
    acks = tmp_path / "acknowledged-r1.json"
    assert _load_acks(acks, LOG) == set()
    assert _save_acks(acks, {"researcher"}, set()) == {"researcher"}
    assert stat.S_IMODE(acks.stat().st_mode) == 0o600
    assert _load_acks(acks, LOG) == {"researcher"}
    before = acks.stat().st_mtime_ns
    _save_acks(acks, {"researcher"}, {"researcher"})  # unchanged: not rewritten
    assert acks.stat().st_mtime_ns == before
    for bad in (b"{not json", b'{"researcher": 1}', b"[1, 2]", b"\xff\xfe"):
        acks.write_bytes(bad)
        assert _load_acks(acks, LOG) == set()


def test_a_link_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text('["researcher"]')
    acks = tmp_path / "acknowledged-r1.json"
    os.symlink(target, acks)
    with pytest.raises(UnsafePathError):
        _load_acks(acks, LOG)
