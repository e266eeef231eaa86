"""The import layers, checked on the source (an import-linter contract in a small AST test).

    secure_release (composition root: CLI, demo, simulator)   imports anything; nothing imports it
    curator | server | researcher                             mechanism, protos, infra, itself
    infra                                                     mechanism, protos, itself
    protos                                                    itself
    mechanism                                                 itself (and no grpc: test_mech_imports)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("mechanism", "protos", "infra", "curator", "server", "researcher")
ALLOWED: dict[str, set[str]] = {
    "mechanism": {"mechanism"},
    "protos": {"protos"},
    "infra": {"mechanism", "protos", "infra"},
    "curator": {"mechanism", "protos", "infra", "curator"},
    "server": {"mechanism", "protos", "infra", "server"},
    "researcher": {"mechanism", "protos", "infra", "researcher"},
}


def imported_modules(path: Path) -> list[str]:
    """Every absolute module name ``path`` imports (at any depth, lazy imports included)."""
    tree = ast.parse(path.read_text(), str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            if node.module == "secure_release":
                names += [f"secure_release.{a.name}" for a in node.names]
    return names


def layer_of(module: str) -> str | None:
    """'mechanism', ..., 'root' for a project module; None for anything else."""
    parts = module.split(".")
    if parts[0] in LAYERS:
        return "unqualified:" + parts[0]  # the top-level folders are never imported by that name
    if parts[0] != "secure_release":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "root"


def violations(layer: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for module in imported_modules(path):
            target = layer_of(module)
            if target is not None and target not in ALLOWED[layer]:
                bad.append(f"{path.relative_to(ROOT)} imports {module} ({target})")
    return bad


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_imports_only_what_it_may(layer: str) -> None:
    assert violations(layer) == []


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The check itself can fail: a role importing another role or the root is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from secure_release.curator.service import X\n"
        "def f():\n    from secure_release import cmd_demo\n"
        "import server.cli\n"
    )
    targets = [layer_of(m) for m in imported_modules(bad)]
    assert sorted(t or "" for t in targets) == ["curator", "root", "root", "unqualified:server"]
    assert not {"curator", "root"} <= ALLOWED["researcher"]


def test_installed_layout_maps_every_layer() -> None:
    """secure_release/<layer> links to the top-level folder the layout requires."""
    for layer in LAYERS:
        link = ROOT / "secure_release" / layer
        assert link.is_symlink() and link.resolve() == (ROOT / layer).resolve(), layer
