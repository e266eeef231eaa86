"""The wheel a user builds: from a checkout without symlinks and from a zip archive.

Both sources are made from this repository's committed tree (plus the working tree's tracked
changes, through ``git stash create``): a ``git clone -c core.symlinks=false`` and a
``git archive --format=zip`` extracted by Python's zipfile (which writes a link as a small text
file). Each is built with ``python -m build`` (sdist, then the wheel from the sdist, as pip and
PyPI do); both wheels must hold the same files, every module of the source tree. The wheel is
installed into a fresh virtual environment (its dependencies reached through the test's own
site-packages, never the repository), and from a temporary directory every module imports,
``secure-release --help`` runs and a small ``secure-release demo`` completes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The folder of every installed package (pyproject's package-dir).
FOLDERS = {
    "secure_release": "app",
    **{f"secure_release.{n}": n for n in ("mechanism", "infra", "curator", "server", "researcher", "protos")},
}


def _git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip()


def _revision() -> str:
    """A commit of the working tree's tracked files (HEAD when nothing is changed)."""
    return _git("stash", "create") or _git("rev-parse", "HEAD")


def _build(source: Path, out: Path) -> Path:
    """``python -m build`` (sdist, then wheel from that sdist); the wheel's path."""
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return wheel


def _contents(wheel: Path) -> dict[str, str]:
    """File name -> SHA-256 of every file in the wheel but its RECORD."""
    with zipfile.ZipFile(wheel) as zf:
        return {
            n: hashlib.sha256(zf.read(n)).hexdigest() for n in zf.namelist() if not n.endswith(".dist-info/RECORD")
        }


def _source_modules() -> set[str]:
    """Every module of the source tree, by installed name."""
    names = set()
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            if package == "secure_release" and rel[0] in {f.split(".")[-1] for f in FOLDERS if "." in f}:
                continue
            names.add(".".join((package, *rel)).removesuffix(".__init__"))
    return names


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    rev = _revision()
    base = tmp_path_factory.mktemp("packaging")
    clone = base / "clone"
    _git("clone", "--quiet", "--no-checkout", "-c", "core.symlinks=false", str(ROOT), str(clone))
    if _git("cat-file", "-t", rev) and rev != _git("rev-parse", "HEAD"):
        _git("fetch", "--quiet", str(ROOT), rev, cwd=clone)
    _git("checkout", "--quiet", rev, cwd=clone)
    archive = base / "source.zip"
    _git("archive", "--format=zip", "-o", str(archive), rev)
    unzipped = base / "unzipped"
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(unzipped)
    return {"clone": _build(clone, base / "dist-clone"), "zip": _build(unzipped, base / "dist-zip")}


def test_a_symlink_less_checkout_and_a_zip_build_the_same_wheel_with_every_module(wheels: dict[str, Path]) -> None:
    clone, archive = _contents(wheels["clone"]), _contents(wheels["zip"])
    assert clone == archive
    in_wheel = {
        n.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for n in clone if n.endswith(".py")
    }
    missing = _source_modules() - in_wheel
    assert not missing, f"modules missing from the wheel: {sorted(missing)}"
    for data in ("secure_release/py.typed", "secure_release/data/adult_counts.csv",
                 "secure_release/templates/report.html.j2",  # the release page (report_page.py)
                 "secure_release/protos/securerelease/v1/securerelease.proto"):  # fmt: skip
        assert data in clone, data


def test_the_installed_wheel_imports_every_module_and_runs_a_demo(wheels: dict[str, Path], tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(
        subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
    )  # fmt: skip
    # the dependencies from this interpreter's site-packages (a plain path line: the .pth files
    # there, such as this repository's editable install, are not processed)
    (purelib / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheels["zip"])], check=True, capture_output=True, timeout=300)  # fmt: skip
    env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    work = tmp_path / "elsewhere"
    work.mkdir()

    def run(*cmd: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(cmd), cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    modules = sorted(m for m in _source_modules() if not m.endswith("__main__"))
    check = (
        "import importlib, json, sys\n"
        "mods = json.loads(sys.argv[1])\n"
        "files = {m: importlib.import_module(m).__file__ for m in mods}\n"
        "print(json.dumps(files))\n"
    )
    done = run(str(python), "-c", check, json.dumps(modules))
    assert done.returncode == 0, done.stderr[-2000:]
    files = json.loads(done.stdout)
    outside = {m: f for m, f in files.items() if not str(f).startswith(str(env_dir))}
    assert not outside, f"imported from outside the fresh environment: {outside}"
    helped = run(str(env_dir / "bin" / "secure-release"), "--help")
    assert helped.returncode == 0 and "demo" in helped.stdout, helped.stderr
    demo = run(str(env_dir / "bin" / "secure-release"), "demo", "--rows", "2000", "--json", timeout=300)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert json.loads(demo.stdout)["m"] >= 1
    shutil.rmtree(env_dir)
