"""The "released" line tells the budget left on the release's data set (the ledger's key), which
the metrics gauge secure_release_budget_left_epsilon also reads."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from secure_release.curator.records.keystore import Keystore
from secure_release.curator.release.serving import announce_release


def test_the_released_line_tells_the_budget_left_on_the_data_set(tmp_path: Path) -> None:
    keystore = Keystore(tmp_path / "ks")
    keystore.ledger.set_budget("people", "people", 2.0, table="sha256-of-the-files")
    config = SimpleNamespace(release_id="r1", dataset="people", grants=("researcher",))
    record = SimpleNamespace(spec=SimpleNamespace(n=100, m=10, plan=SimpleNamespace(epsilon=0.5)))
    said: list[tuple[str, dict[str, Any]]] = []
    announce_release(config, keystore, "sha256-of-the-files", record, lambda event, **f: said.append((event, f)))  # type: ignore[arg-type]
    (event, fields), = said
    assert event == "released" and fields["budget_left"] == 2.0
    assert "2 left on data set people" in fields["note"]
