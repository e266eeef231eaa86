"""``bench/disk_profile.py``'s poller counts what a directory holds on disk, keeps each name's
peak, and stops when asked (as a context manager too, from the bench's shared poller base)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_poller_records_the_peak_of_each_directory_and_stops(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH))
    from disk_profile import DiskPoller

    big, small = tmp_path / "big", tmp_path / "small"
    big.mkdir()
    small.mkdir()
    poller = DiskPoller({"big": big, "small": small}, interval=0.01)
    base = poller.sample()[1]
    (big / "data").write_bytes(b"\1" * (1 << 20))  # 1 MiB, written: its blocks are allocated
    with poller:
        time.sleep(0.1)
        (big / "data").unlink()
        time.sleep(0.1)
    assert not poller.is_alive()
    assert poller.peak["big"] - base["big"] >= 1 << 20
    assert poller.peak["small"] == base["small"]
    assert poller.series[-1][1]["big"] < poller.peak["big"]  # the file went before the end
    assert poller.min_free is not None and poller.min_free > 0
