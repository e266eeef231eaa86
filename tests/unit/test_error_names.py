"""Every error class has a name no other class shares, and every declared error is raised
somewhere: an ``except`` of one name catches one kind of failure, and no name is dead."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("app", "mechanism", "infra", "curator", "server", "researcher")


def _sources() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if "_pb2" not in p.name]


def _classes(paths: list[Path]) -> list[tuple[str, Path]]:
    return [
        (node.name, path)
        for path in paths
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]


def _called_or_raised(paths: list[Path]) -> set[str]:
    """Names that are raised, called, or used as a base class anywhere."""
    used: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                used.add(node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
            elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Name):
                used.add(node.exc.id)
            elif isinstance(node, ast.ClassDef):
                used |= {b.id for b in node.bases if isinstance(b, ast.Name)}
    return used


def test_class_names_are_unique() -> None:
    names = Counter(name for name, _ in _classes(_sources()))
    assert sorted(n for n, c in names.items() if c > 1) == []


def test_every_declared_error_is_raised_or_subclassed() -> None:
    sources = _sources()
    errors = sorted({name for name, _ in _classes(sources) if name.endswith("Error")})
    used = _called_or_raised(sources)
    assert errors and [e for e in errors if e not in used] == []


def test_the_checks_can_fail(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("class DeadError(ValueError):\n    pass\n\n\nclass LiveError(ValueError):\n    pass\n")
    a.write_text(a.read_text() + "raise LiveError('x')\n")
    b.write_text("class LiveError(Exception):\n    pass\n")
    assert [n for n, c in Counter(n for n, _ in _classes([a, b])).items() if c > 1] == ["LiveError"]
    assert "DeadError" not in _called_or_raised([a, b]) and "LiveError" in _called_or_raised([a, b])
