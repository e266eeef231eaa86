"""docs/tutorial.md runs as a doctest: its numbers are the code's, and its in-memory release
and its four-service release agree exactly (the page checks it)."""

from __future__ import annotations

import doctest
import warnings
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_tutorial_runs() -> None:
    with warnings.catch_warnings():
        result = doctest.testfile(
            str(ROOT / "docs" / "tutorial.md"),
            module_relative=False,
            optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS,
            verbose=False,
        )
    assert result.attempted > 30
    assert result.failed == 0
