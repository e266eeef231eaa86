"""docker-compose.yml's "three" profile (three curators) run as local processes, as
test_compose_local.py runs the default profile: a joint estimate over alice, bob and carol."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("yaml")
from test_compose_local import run_profile

pytestmark = pytest.mark.slow


def test_three_curator_profile_runs_locally(tmp_path: Path) -> None:
    result, _, _, _ = run_profile(tmp_path, "three", "result-three", expect_release="r3", cells=24)
    assert result["curators"] == ["alice", "bob", "carol"]
    assert result["attributes"] == ["education", "marital", "sex", "salary"]
