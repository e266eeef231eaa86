"""README.md's notebook example runs as a doctest: its output is the code's.

The example is a release designed for a question, run in memory (no socket, no process: a unit
test), on 6,000 demo records; ``test_keys=42`` fixes every secret and the bootstrap's seed is the
API's default, so its printed answer is exact and the test has no false-failure rate.
"""

from __future__ import annotations

import doctest
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the example's folder lands in tmp_path
    result = doctest.testfile(
        str(ROOT / "README.md"),
        module_relative=False,
        optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS,
        verbose=False,
    )
    assert result.attempted >= 8
    assert result.failed == 0
    assert any(path.name == "alice.csv" for path in tmp_path.rglob("*.csv"))
