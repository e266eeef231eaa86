# tier: unit
"""Issue 24, item 4: a reserve that fails for lack of space leaves no charge (before: five failed
reserves used 0.5 of the budget), and the curator's command line says so and exits 1. ENOSPC is
injected into the ledger's own writes (the entry's write or fsync, or the head's rename)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from secure_release.curator import cli as curator_cli
from secure_release.curator.records import ledgerfile
from secure_release.infra import fileio
from secure_release.infra.exitcodes import FAILURE, exit_code_for
from secure_release.infra.fileio import DiskFullError

D = "adult"


def _enospc(*_: Any, **__: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _failing(target: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make ``target.name`` raise ENOSPC until the returned function is called."""
    monkeypatch.setattr(target, name, _enospc)
    return lambda: monkeypatch.undo()


@pytest.mark.parametrize(
    ("target", "name"),
    [(ledgerfile.os, "write"), (ledgerfile.os, "fsync"), (fileio.os, "replace")],
    ids=["entry write", "entry fsync", "head rename"],
)
def test_five_failed_reserves_leave_no_charge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: Any,
                                              name: str) -> None:  # fmt: skip
    ledger = ledgerfile.LedgerFile(tmp_path)
    ledger.set_budget(D, D, 1.0)
    before = ledger.path.read_bytes()
    restore = _failing(target, name, monkeypatch)
    for i in range(5):
        with pytest.raises(DiskFullError, match="no space left"):
            ledger.update(lambda led, i=i: led.reserve(D, D, f"r{i}", 0.1, f"s{i}", 1.0))
    restore()
    led = ledger.read()
    assert led.spent(D) == 0.0 and led.releases() == {}  # disk-full charges left: 0
    assert ledger.path.read_bytes() == before  # nothing half-written: the failed entries were cut
    ledger.update(lambda led: led.reserve(D, D, "ok", 0.1, "s-ok", 1.0))
    assert ledger.read().spent(D) == pytest.approx(0.1) and len(ledger.read().entries) == 2


def test_the_disk_full_error_ends_a_command_with_exit_1_and_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "alice.csv"
    data.write_text("id,x\n1,a\n")
    monkeypatch.setattr(ledgerfile.os, "write", _enospc)
    keystore = str(tmp_path / "ks")
    code = curator_cli.main(["budget", "set", "--keystore", keystore, "--data", str(data), "--epsilon", "1"])
    monkeypatch.undo()
    assert code == FAILURE == exit_code_for(DiskFullError("x"))
    assert "DiskFullError" in capsys.readouterr().err
    assert ledgerfile.LedgerFile(tmp_path / "ks").read().entries == []  # nothing half-written
