"""Import purity of mechanism/: no network, no gRPC, no file I/O (DESIGN 5)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

MECHANISM = Path(__file__).resolve().parents[2] / "mechanism"
FORBIDDEN_MODULES = {
    "grpc",
    "socket",
    "pathlib",
    "io",
    "sqlite3",
    "subprocess",
    "os.path",
    "shutil",
    "tempfile",
    "urllib",
    "http",
    "requests",
    "ssl",
    "asyncio",
    "pickle",
}
FORBIDDEN_CALLS = {"open"}
FORBIDDEN_OS_ATTRS = {
    "path",
    "open",
    "fdopen",
    "remove",
    "unlink",
    "listdir",
    "walk",
    "makedirs",
    "mkdir",
    "system",
    "popen",
    "scandir",
    "rename",
    "replace",
}


def violations(source: str) -> list[str]:
    tree = ast.parse(source)
    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if alias.name in FORBIDDEN_MODULES or top in FORBIDDEN_MODULES:
                    bad.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if mod in FORBIDDEN_MODULES or mod.split(".")[0] in FORBIDDEN_MODULES:
                bad.append(f"from {mod} import ...")
            if mod == "os":
                bad.extend(f"from os import {a.name}" for a in node.names if a.name != "urandom")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in FORBIDDEN_CALLS:
                bad.append(f"call {node.func.id}()")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr in FORBIDDEN_OS_ATTRS:
                bad.append(f"os.{node.attr}")
            if node.attr in {"read_text", "write_text", "read_bytes_file", "write_bytes"}:
                bad.append(f".{node.attr}")
    return bad


def test_mechanism_files_exist() -> None:
    assert len(list(MECHANISM.rglob("*.py"))) >= 10


@pytest.mark.parametrize("path", sorted(MECHANISM.rglob("*.py")), ids=lambda p: str(p.relative_to(MECHANISM)))
def test_module_is_pure(path: Path) -> None:
    assert violations(path.read_text()) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "import grpc",
        "import grpc.aio",
        "from grpc import aio",
        "import socket",
        "import pathlib",
        "from pathlib import Path",
        "import io",
        "import sqlite3",
        "import subprocess",
        "import os.path",
        "from os import path",
        "import os\nos.path.join('a')",
        "open('x')",
        "with open('x') as f: pass",
    ],
)
def test_checker_catches(snippet: str) -> None:
    # The checker itself must be able to fail.
    assert violations(snippet) != []


def test_checker_allows_urandom() -> None:
    assert violations("import os\nx = os.urandom(32)\nfrom os import urandom") == []
