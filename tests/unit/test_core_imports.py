"""Every module of the package imports on a core install: no optional extra at import time.

A walk of the package (``pkgutil.walk_packages``: what Sphinx, pydoc or an import check do)
imports every module afresh with the extras made unimportable by a meta path finder that raises
``ModuleNotFoundError`` for them, as on ``pip install secure-release`` without ``[cluster]``
(issue 41: ``curator.cluster.trim`` imported ``distributed`` at the top). The process's own
modules are put back afterwards, so the walk leaves no trace for the tests that follow.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import pkgutil
import sys
import traceback
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import pytest

#: The cluster extra (``pip install 'secure-release[cluster]'``).
CLUSTER = ("dask", "distributed")
#: Every optional extra a user may lack: cluster, plot, notebook, duckdb, accounting, bench, and the
#: libraries only the tests and printed recipes use.
EXTRAS = (*CLUSTER, "matplotlib", "pandas", "polars", "duckdb", "dp_accounting", "opendp", "statsmodels",
          "multi_freq_ldpy", "selenium", "yaml", "hypothesis")  # fmt: skip


class Blocker(importlib.abc.MetaPathFinder):
    """Finds nothing for the packages it blocks (nor their submodules): their import fails."""

    def __init__(self, blocked: Sequence[str]) -> None:
        self.blocked = frozenset(blocked)
        self.asked: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.blocked:
            self.asked.append(fullname)
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by the test)", name=fullname)
        return None


def _ours(name: str, blocked: frozenset[str]) -> bool:
    root = name.partition(".")[0]
    return root == "secure_release" or root in blocked


@contextlib.contextmanager
def _fresh_imports(blocked: Sequence[str]) -> Iterator[tuple[list[str], dict[str, str], Blocker]]:
    """With ``blocked`` unimportable and no module of the package or of ``blocked`` loaded, yield
    (every module walked, {module: error} of those that failed, the blocker); then restore."""
    saved = dict(sys.modules)
    blocker = Blocker(blocked)
    for name in [n for n in sys.modules if _ours(n, blocker.blocked)]:
        del sys.modules[name]
    sys.meta_path.insert(0, blocker)
    try:
        failed: dict[str, str] = {}
        walked: list[str] = []
        root = importlib.import_module("secure_release")

        def onerror(name: str) -> None:  # a package that failed to import while walking
            failed[name] = traceback.format_exc(limit=-3)

        for info in pkgutil.walk_packages(root.__path__, "secure_release.", onerror=onerror):
            if info.name.rpartition(".")[2] == "__main__":  # runs its CLI when imported
                continue
            walked.append(info.name)
            try:
                importlib.import_module(info.name)
            except Exception:
                failed[info.name] = traceback.format_exc(limit=-3)
        yield walked, failed, blocker
    finally:
        sys.meta_path.remove(blocker)
        for name in [n for n in sys.modules if _ours(n, blocker.blocked)]:
            del sys.modules[name]
        sys.modules.update({n: m for n, m in saved.items() if _ours(n, blocker.blocked)})


@pytest.mark.parametrize("blocked", [CLUSTER, EXTRAS], ids=["without-cluster-extra", "without-any-extra"])
def test_every_module_imports_without_the_optional_extras(blocked: tuple[str, ...]) -> None:
    with _fresh_imports(blocked) as (walked, failed, _):
        # the walk reached every layer and the modules that use the extras lazily
        for module in ("secure_release.cli", "secure_release.mechanism.privacy.accounting", "secure_release.infra.wire",
                       "secure_release.curator.cluster.engine", "secure_release.curator.cluster.trim",
                       "secure_release.server.service", "secure_release.researcher.cli",
                       "secure_release.protos.securerelease.v1.securerelease_pb2"):  # fmt: skip
            assert module in walked, module
        assert len(walked) > 100, len(walked)
        assert not failed, "\n".join(f"{name}:\n{error}" for name, error in failed.items())


def test_the_blocker_makes_an_extra_unimportable_and_the_walk_reports_it() -> None:
    """The check can fail: a module of the package that imports a blocked library at the top is
    reported, and the process's modules are back afterwards."""
    before = sys.modules.get("secure_release.curator.cluster.engine")
    with _fresh_imports(("pyarrow",)) as (_, failed, blocker):  # a core library every curator module reads with
        assert "secure_release.curator.columnar" in failed
        assert "ModuleNotFoundError" in failed["secure_release.curator.columnar"]
        assert "pyarrow" in blocker.asked
    assert sys.modules.get("secure_release.curator.cluster.engine") is before
    assert sys.modules.get("pyarrow") is not None
    importlib.import_module("pyarrow.compute")  # importable again


def test_the_trim_plugin_is_made_lazily_and_pickles_by_name() -> None:
    """The plugin's class is a Dask WorkerPlugin made on first use, and pickles by reference (a
    worker finds it as ``trim.TrimPlugin``)."""
    pytest.importorskip("distributed")
    import pickle

    from distributed.diagnostics.plugin import WorkerPlugin

    from secure_release.curator.cluster import trim

    plugin: Any = trim.trim_plugin()
    assert issubclass(trim.plugin_class(), WorkerPlugin) and plugin.name == trim.PLUGIN_NAME == "secure-release-trim"
    assert type(plugin) is trim.TrimPlugin is trim.plugin_class()
    data = pickle.dumps(plugin)
    assert b"secure_release.curator.cluster.trim" in data and b"TrimPlugin" in data
    again: Any = pickle.loads(data)
    assert again.watch is None and type(again) is trim.TrimPlugin
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = trim.Nothing
