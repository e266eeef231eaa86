"""The input tests keep their marker: every file-name pattern of ``INPUT_TESTS`` names a file of
the unit tier, and its tests carry ``inputs`` (a renamed file would otherwise drop out of
``pytest -m inputs`` without a word)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
from support import INPUT_TESTS

UNIT = Path(__file__).parent


@pytest.mark.parametrize("pattern", INPUT_TESTS)
def test_every_pattern_names_a_unit_test_file(pattern: str) -> None:
    assert sorted(UNIT.glob(pattern)), f"no file of tests/unit matches {pattern!r}"


def test_the_marker_follows_the_file_name(request: pytest.FixtureRequest) -> None:
    items = request.session.items
    marked = {item.path.name for item in items if item.get_closest_marker("inputs")}
    named = {item.path.name for item in items if any(fnmatch.fnmatch(item.path.name, p) for p in INPUT_TESTS)}
    assert marked == named
    assert request.node.get_closest_marker("inputs") is None  # this file is not an input test
