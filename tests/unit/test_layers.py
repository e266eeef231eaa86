"""The import layers of docs/design.md, checked on the source (an AST contract test).

    secure_release.commands, .cli   the CLI: may import anything below
    secure_release (other rooms)    api, cluster, reproduce, plotting, ...: anything below, never the CLI
    curator | server | researcher   mechanism, protos, infra, itself (never another role)
    infra                           mechanism, protos, itself
    protos                          itself
    mechanism                       itself (and no grpc: tests/system/test_mech_imports.py)

Every module is imported by its installed name (``secure_release.<layer>``), never by the
folder's bare name, anywhere in the repository (tests and benchmarks included).
"""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("mechanism", "protos", "infra", "curator", "server", "researcher")
#: The folder of each installed package (pyproject's package-dir must say the same).
FOLDERS = {"secure_release": "app", **{f"secure_release.{layer}": layer for layer in LAYERS}}
#: The composition root's CLI rooms: only they may import each other.
CLI_ROOMS = ("commands", "cli", "__main__")
ALLOWED: dict[str, set[str]] = {
    "mechanism": {"mechanism"},
    "protos": {"protos"},
    "infra": {"mechanism", "protos", "infra"},
    "curator": {"mechanism", "protos", "infra", "curator"},
    "server": {"mechanism", "protos", "infra", "server"},
    "researcher": {"mechanism", "protos", "infra", "researcher"},
    "root": {*LAYERS, "root"},
    "cli": {*LAYERS, "root", "cli"},
}
#: Folder names that must never be imported bare (``import curator.errors``).
BARE = {*LAYERS, "app", "commands", "reproduce"}


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
    """'mechanism', ..., 'root', 'cli' for a project module; None for anything else."""
    parts = module.split(".")
    if parts[0] in BARE:
        return "bare:" + parts[0]
    if parts[0] != "secure_release":
        return None
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "cli" if len(parts) > 1 and parts[1] in CLI_ROOMS else "root"


def layer_of_file(root: Path, path: Path) -> str:
    """The layer a source file belongs to, from its folder."""
    rel = path.relative_to(root).parts
    if rel[0] != "app":
        return rel[0]
    return "cli" if rel[1] in CLI_ROOMS or rel[1].removesuffix(".py") in CLI_ROOMS else "root"


def violations(root: Path, folder: str) -> list[str]:
    bad = []
    for path in sorted((root / folder).rglob("*.py")):
        layer = layer_of_file(root, path)
        for module in imported_modules(path):
            target = layer_of(module)
            if target is not None and target not in ALLOWED[layer]:
                bad.append(f"{path.relative_to(root)} ({layer}) imports {module} ({target})")
    return bad


@pytest.mark.parametrize("folder", [*LAYERS, "app"])
def test_layer_imports_only_what_it_may(folder: str) -> None:
    assert (ROOT / folder / "__init__.py").is_file(), f"{folder}/ is missing: not a checkout?"
    assert violations(ROOT, folder) == []


def test_the_checker_fails_on_a_planted_upward_import(tmp_path: Path) -> None:
    """The check itself can fail: an upward import planted in each layer is caught, and so are
    a role importing another role, the API importing the CLI, and a bare folder import."""
    plants = {
        "mechanism/bad.py": "from secure_release.infra import tls\n",
        "infra/bad.py": "def f():\n    from secure_release.curator.service import X\n",
        "curator/bad.py": "import secure_release.server.store\n",
        "researcher/bad.py": "from secure_release import api\n",
        "app/api.py": "from secure_release.commands import demo\n",
        "app/cluster.py": "from secure_release.cli import main\n",
        "server/bad.py": "import curator.errors\n",
    }
    for rel, text in plants.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for folder in ("mechanism", "infra", "curator", "researcher", "app", "server"):
        found = violations(tmp_path, folder)
        assert found, folder
    assert len(violations(tmp_path, "app")) == 2
    (tmp_path / "app/commands").mkdir()
    cli = "from secure_release import api, cluster\nfrom secure_release.commands import x\n"
    (tmp_path / "app/commands/ok.py").write_text(cli)
    assert len(violations(tmp_path, "app")) == 2  # the CLI may import the other rooms


def source_tree() -> list[Path]:
    """Every file of the checkout: not .git, build/, node_modules/ or a virtual environment
    (.venv, .venv-oldest: any folder holding a pyvenv.cfg)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in {".git", "build", "node_modules"}
                       and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))]  # fmt: skip
        files += [Path(dirpath, n) for n in dirnames + filenames]
    return sorted(files)


def test_no_bare_folder_import_anywhere() -> None:
    """``import curator...`` would load a second copy of a module beside
    ``secure_release.curator...`` (an ``except`` of one does not catch the other)."""
    bad = []
    for path in source_tree():
        if path.suffix != ".py" or "site-packages" in path.parts:
            continue
        rel = path.relative_to(ROOT)
        bad += [f"{rel} imports {m}" for m in imported_modules(path) if (layer_of(m) or "").startswith("bare:")]
    assert bad == []


def test_pyproject_declares_every_package_by_its_folder() -> None:
    """package-dir maps each installed name to its folder, and every folder with an
    __init__.py is listed as a package (a forgotten one would be missing from the wheel)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == FOLDERS
    declared = set(config["packages"])
    on_disk = set()
    for name, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            sub = init.parent.relative_to(ROOT / folder).parts
            if not (name == "secure_release" and sub and sub[0] in LAYERS):
                on_disk.add(".".join((name, *sub)))
    assert on_disk and declared == on_disk


def test_no_symlink_in_the_tree() -> None:
    """A checkout without symlinks (core.symlinks=false, a zip) must build the same wheel."""
    assert [str(path) for path in source_tree() if path.is_symlink()] == []


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (function-local imports included)."""
    modules: dict[str, Path] = {}
    for name, folder in FOLDERS.items():
        for path in (root / folder).rglob("*.py"):
            rel = path.relative_to(root / folder).with_suffix("").parts
            if name == "secure_release" and rel and rel[0] in LAYERS:
                continue
            modules[".".join((name, *rel)).removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            graph[module] |= {t for t in targets if t in modules and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (strongly connected parts of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_not_even_behind_a_function_local_import() -> None:
    assert cycles(import_graph(ROOT)) == []


def test_the_cycle_check_finds_a_planted_circle(tmp_path: Path) -> None:
    for folder in {*FOLDERS.values()}:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "infra/tls.py").write_text("def f():\n    from secure_release.infra.auth import x\n")
    (tmp_path / "infra/auth.py").write_text("from secure_release.infra.tls import y\n")
    (tmp_path / "mechanism/privacy").mkdir()
    (tmp_path / "mechanism/privacy/plan.py").write_text("from secure_release.mechanism.privacy import guarantee\n")
    (tmp_path / "mechanism/privacy/guarantee.py").write_text("import secure_release.mechanism.privacy.plan\n")
    assert sorted(cycles(import_graph(tmp_path))) == [
        ["secure_release.infra.auth", "secure_release.infra.tls"],
        ["secure_release.mechanism.privacy.guarantee", "secure_release.mechanism.privacy.plan"],
    ]


#: The curator's rooms (docs/design.md, "Rooms of the curator"), each with the rooms it may import.
#: ``base`` is every module directly in curator/ but the CLI (cli.py, commands.py, __main__.py).
CURATOR_ROOMS: dict[str, set[str]] = {
    "records": {"records", "errors", "waits"},
    "base": {"base", "records"},
    "cluster": {"cluster", "base", "records"},
    "release": {"release", "cluster", "base", "records"},
    "cli": {"cli", "release", "cluster", "base", "records"},
}
CURATOR_CLI = ("cli", "commands", "__main__")


def curator_room(parts: tuple[str, ...]) -> str:
    """The room of a curator module, from its path inside curator/ (``("cluster", "engine")``)."""
    if len(parts) > 1:
        return parts[0]
    return "cli" if parts[0] in CURATOR_CLI else "base"


def curator_room_violations(root: Path) -> list[str]:
    """Imports between the curator's rooms that the table above does not allow (``errors`` and
    ``waits`` are base modules that records/ may use)."""
    bad = []
    for path in sorted((root / "curator").rglob("*.py")):
        parts = path.relative_to(root / "curator").with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) == 1:
            continue
        room = curator_room(parts)
        for module in imported_modules(path):
            if not module.startswith("secure_release.curator."):
                continue
            target = tuple(module.split(".")[2:])
            target_room = curator_room(target)
            allowed = CURATOR_ROOMS[room]
            if target_room in allowed or (len(target) == 1 and target[0] in allowed):
                continue
            bad.append(f"curator/{'/'.join(parts)}.py ({room}) imports {module} ({target_room})")
    return bad


def test_curator_rooms_import_only_what_they_may() -> None:
    for room in ("cluster", "release", "records"):
        assert (ROOT / "curator" / room / "__init__.py").is_file()
    assert curator_room_violations(ROOT) == []


def test_the_curator_room_check_fails_on_planted_imports(tmp_path: Path) -> None:
    """Each forbidden direction is caught: a record importing the cluster, a base module
    importing a release step, the cluster importing a release step."""
    plants = {
        "curator/records/bad.py": "from secure_release.curator.cluster import engine\n",
        "curator/service2.py": "def f():\n    from secure_release.curator.release.runner import run\n",
        "curator/cluster/bad.py": "import secure_release.curator.release.upload\n",
        "curator/records/ok.py": "from secure_release.curator.errors import X\n"
        "from secure_release.curator.waits import Y\n",
        "curator/release/ok.py": "from secure_release.curator.cluster.engine import E\n",
    }
    for rel, text in plants.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = curator_room_violations(tmp_path)
    assert len(found) == 3, found
    assert all("bad.py" in f or "service2.py" in f for f in found)


#: The rooms of mechanism/ (mechanism/__init__.py), each with the rooms it may import. ``floor`` is
#: every module directly in mechanism/ (errors, schema, cells): everything stands on it.
MECHANISM_ROOMS: dict[str, set[str]] = {
    "floor": {"floor"},
    "primitives": {"primitives", "floor"},
    "alignment": {"alignment", "primitives", "floor"},
    "privacy": {"privacy", "primitives", "floor"},
    "estimation": {"estimation", "privacy", "primitives", "floor"},
    "analysis": {"analysis", "estimation", "privacy", "primitives", "floor"},
    "protocol": {"protocol", "estimation", "privacy", "alignment", "primitives", "floor"},
    "simulation": {"simulation", "estimation", "privacy", "primitives", "floor"},
}


def mechanism_room(parts: tuple[str, ...]) -> str:
    """The room of a mechanism module, from its path inside mechanism/ (``("privacy", "plan")``)."""
    return parts[0] if len(parts) > 1 else "floor"


def mechanism_room_violations(root: Path) -> list[str]:
    """Imports between mechanism's rooms that :data:`MECHANISM_ROOMS` does not allow, a room that
    is not in the table, and a bare ``from secure_release.mechanism import <room>`` (which would
    hide the module it reaches)."""
    bad = []
    for path in sorted((root / "mechanism").rglob("*.py")):
        parts = path.relative_to(root / "mechanism").with_suffix("").parts
        if parts == ("__init__",):
            continue
        room = mechanism_room(parts)
        if room not in MECHANISM_ROOMS:
            bad.append(f"mechanism/{'/'.join(parts)}.py is in a room the table does not know: {room}")
            continue
        for module in imported_modules(path):
            if not module.startswith("secure_release.mechanism."):
                continue
            target = tuple(module.split(".")[2:])
            target_room = target[0] if target[0] in MECHANISM_ROOMS else "floor"
            if target_room not in MECHANISM_ROOMS[room]:
                bad.append(f"mechanism/{'/'.join(parts)}.py ({room}) imports {module} ({target_room})")
    return bad


def test_mechanism_rooms_import_only_what_they_may() -> None:
    rooms = {p.parent.name for p in (ROOT / "mechanism").glob("*/__init__.py")}
    assert rooms == set(MECHANISM_ROOMS) - {"floor"}
    assert mechanism_room_violations(ROOT) == []


def test_every_mechanism_room_says_in_one_line_what_it_holds_and_may_import() -> None:
    for room in set(MECHANISM_ROOMS) - {"floor"}:
        doc = ast.get_docstring(ast.parse((ROOT / "mechanism" / room / "__init__.py").read_text()))
        assert doc is not None and "\n" not in doc.strip(), room
        assert "Imports:" in doc, room
        allowed = MECHANISM_ROOMS[room] - {room}
        said = doc.split("Imports:", 1)[1]
        assert all(other in said for other in allowed), (room, said)


def test_the_mechanism_room_check_fails_on_planted_imports(tmp_path: Path) -> None:
    """Each upward direction is caught: the floor importing a room, a primitive importing privacy,
    privacy importing analysis (a cycle in the making), estimation importing the protocol, and a
    room the table does not know; imports the table allows pass."""
    plants = {
        "mechanism/bad.py": "from secure_release.mechanism.primitives.keys import Seed\n",
        "mechanism/primitives/bad.py": "from secure_release.mechanism.privacy import accounting\n",
        "mechanism/privacy/bad.py": "def f():\n    from secure_release.mechanism.analysis.power import x\n",
        "mechanism/estimation/bad.py": "import secure_release.mechanism.protocol.in_memory\n",
        "mechanism/misc/bad.py": "from secure_release.mechanism.errors import E\n",
        "mechanism/analysis/ok.py": "from secure_release.mechanism.estimation import estimators\n"
        "from secure_release.mechanism.errors import E\n",
        "mechanism/protocol/ok.py": "from secure_release.mechanism.alignment.psi import run_psi\n",
    }
    for rel, text in plants.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = mechanism_room_violations(tmp_path)
    assert len(found) == 5, found
    assert all("bad.py" in f for f in found)
