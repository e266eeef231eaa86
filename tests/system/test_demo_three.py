"""``secure-release demo --curators 3``: three curator processes produce a joint estimate, and the
demo's output explains itself; docs/own-data.md shows exactly the root CLI's example commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import child_env

from secure_release.demo_data import write_demo_data
from secure_release.examples import own_data_text

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return child_env(testing=False)


@pytest.mark.slow
def test_three_curator_demo_gives_a_joint_estimate() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "secure_release", "demo", "--curators", "3", "--rows", "3000", "--json"],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["curators"] == ["alice", "bob", "carol"] and r["alphabet_sizes"] == [6, 2, 2]
    assert not r["marginal"] and len(r["cells"]) == 24 and r["n"] == 3000
    est = np.array([c["estimate"] for c in r["cells"]])
    assert est.sum() == pytest.approx(1.0) and est.min() >= 0.0  # the headline: the projection
    for c in r["cells"]:
        assert c["ci_low"] <= min(max(c["raw"], 0.0), 1.0) <= c["ci_high"]
        assert c["ci_spans_zero"] == (c["ci_low"] <= 0 <= c["ci_high"])
    assert r["guarantee"]["delta"] == 0.0 and r["guarantee"]["epsilon"] == pytest.approx(0.5)
    assert r["utility"]["ok"] is False and "typical cell share" in r["utility"]["message"]


def test_demo_data_splits_over_n_curators(tmp_path: Path) -> None:
    for n in (2, 3, 4, 5):
        info = write_demo_data(tmp_path / str(n), rows=500, curators=n)
        assert len(info["curators"]) == n
        assert [a for c in info["curators"] for a in info["split"][c]] == info["attributes"]
        assert sum(info["truth"].values()) == pytest.approx(1.0)
    two = write_demo_data(tmp_path / "again", rows=500)
    assert (tmp_path / "again" / "alice.csv").read_text() == (tmp_path / "2" / "alice.csv").read_text()
    assert two["split"] == {"alice": ["education", "marital"], "bob": ["sex", "salary"]}


def test_own_data_doc_shows_the_cli_example() -> None:
    assert own_data_text("") in (ROOT / "docs" / "own-data.md").read_text()
