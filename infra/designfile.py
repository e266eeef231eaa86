"""A design file (``mechanism.analysis.design.Design``) on disk: written by ``secure-release
plan --question ... --out FILE`` or ``api.save_design``, read by every curator (``--design FILE``)
and the notebook (``api.load_design``). The mechanism holds the text; the file lives here."""

from __future__ import annotations

from pathlib import Path

from secure_release.infra.fileio import atomic_write
from secure_release.mechanism.analysis.design import Design


def write_design(design: Design, path: str | Path) -> Path:
    """Write ``design`` to ``path`` (atomically, mode 0644: a design is public)."""
    target = Path(path)
    atomic_write(target, design.to_json().encode("utf-8"), 0o644)
    return target


def read_design(path: str | Path) -> Design:
    """The design in ``path`` (a public file); named errors for a file that is not one."""
    return Design.from_json(Path(path).read_text(encoding="utf-8"))
