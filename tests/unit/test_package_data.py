"""The package data is declared, not scanned (issue 41, item 1).

With setuptools' default ``include-package-data = true`` a build also scans the sdist's file list
and, for each data folder without an ``__init__.py`` (app/data, app/templates), printed a 40-line
warning at every install ("Package 'secure_release.data' is absent from the `packages`
configuration"). pyproject turns the scan off and lists the data in
``[tool.setuptools.package-data]``; this test checks that the list holds every data file of
every package folder, so nothing is dropped from the wheel (tests/system/test_packaging.py checks
the built wheel itself).
"""

from __future__ import annotations

import glob
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folder(package: str, config: dict[str, Any] = CONFIG, root: Path = ROOT) -> Path:
    """The folder of an installed package: its nearest package-dir entry plus the rest of its name."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = config["package-dir"].get(".".join(parts[:cut]))
        if mapped is not None:
            return root / str(mapped) / Path(*parts[cut:])
    raise AssertionError(f"no package-dir entry holds {package}")


def data_files(config: dict[str, Any] = CONFIG, root: Path = ROOT) -> set[Path]:
    """Every file under the package folders that is not a module (nor a compiled one)."""
    found = set()
    for folder in set(config["package-dir"].values()):
        for path in (root / str(folder)).rglob("*"):
            if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts:
                found.add(path)
    return found


def undeclared(config: dict[str, Any] = CONFIG, root: Path = ROOT) -> list[str]:
    """The data files no package-data pattern matches (each pattern relative to its package's folder)."""
    matched = set()
    for package, patterns in config["package-data"].items():
        base = package_folder(package, config, root)
        for pattern in patterns:
            matched |= {base / name for name in glob.glob(pattern, root_dir=base, recursive=True)}
    return sorted(str(p.relative_to(root)) for p in data_files(config, root) - matched)


def test_the_build_does_not_scan_for_package_data() -> None:
    assert CONFIG.get("include-package-data") is False


def test_every_data_file_is_declared_as_package_data() -> None:
    files = data_files()
    for shipped in ("app/data/adult_counts.csv", "app/templates/report.html.j2", "app/py.typed",
                    "protos/securerelease/v1/securerelease.proto"):  # fmt: skip
        assert ROOT / shipped in files, shipped
    assert undeclared() == [], "data files no package-data pattern ships"


def test_a_data_folder_is_not_a_package() -> None:
    """app/data and app/templates hold no module: listed as packages they would be importable
    names of their own; they are data of ``secure_release``."""
    for package in CONFIG["packages"]:
        assert (package_folder(package) / "__init__.py").is_file(), package
    assert {"secure_release.data", "secure_release.templates"}.isdisjoint(CONFIG["packages"])


def test_the_check_finds_an_undeclared_file(tmp_path: Path) -> None:
    """The check can fail: in a planted tree, a data file outside every pattern is reported."""
    config: dict[str, Any] = {
        "package-dir": {"pkg": "src", "pkg.sub": "sub"},
        "package-data": {"pkg": ["data/*.csv"], "pkg.sub": ["**/*.proto"]},
    }
    for name in ("src/data/a.csv", "src/data/b.md", "src/templates/t.j2", "sub/x/y.proto", "sub/z.pyi"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("-")
    assert undeclared(config, tmp_path) == ["src/data/b.md", "src/templates/t.j2", "sub/z.pyi"]
    assert package_folder("pkg.sub.x", config, tmp_path) == tmp_path / "sub" / "x"
