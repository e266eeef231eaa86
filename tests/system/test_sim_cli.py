"""CLI: simulate --json and bad inputs; reproduce --quick."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "secure_release", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


def test_simulate_json() -> None:
    out = _run("simulate", "--epsilon", "0.1,1.0", "--trials", "200", "--seed", "3", "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["n"] == 45222 and rep["K"] == 24 and len(rep["results"]) == 2
    for r, m in zip(rep["results"], (239, 3899), strict=False):
        assert r["m"] == m and r["trials"] == 200
        for key in ("gamma", "mean_l2_error", "mean_l2_error_projected", "mean_l2_error_mle",
                    "predicted_rmse", "bound", "bound_tight", "se_mean_l2_error",
                    "se_mean_l2_error_projected", "se_mean_l2_error_mle", "mean_l2_error_marginals"):
            assert key in r
        assert 0 < r["mean_l2_error"] < r["bound"]
        assert abs(r["mean_l2_error"] / r["predicted_rmse"] - 1) < 0.15


def test_simulate_synthetic_table_text(tmp_path: Path) -> None:
    out = _run("simulate", "--dataset", "peaky", "--K", "48", "--n", "5000", "--epsilon", "1",
               "--m", "100,500", "--trials", "50", "--estimators", "raw,projected",
               "--plot", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr
    assert "K = 48" in out.stdout and (tmp_path / "p.png").exists()


@pytest.mark.parametrize("text,args", [
    ("a,b\nx,1\n", []),
    ("a,count\nx,-3\ny,5\n", []),
    ("a,count\nx,3\ny,5\n", ["--epsilon", "0"]),
    ("a,count\nx,3\ny,5\n", ["--epsilon", "-1"]),
    ("a,count\nx,3\ny,5\n", ["--m", "9"]),
    ("a,count\nx,3\ny,5\n", ["--estimators", "foo"]),
])
def test_simulate_bad_inputs_exit_2(tmp_path: Path, text: str, args: list[str]) -> None:
    p = tmp_path / "c.csv"
    p.write_text(text)
    argv = ["simulate", "--counts", str(p), "--trials", "5"]
    if "--epsilon" not in args:
        argv += ["--epsilon", "0.5"]
    out = _run(*argv, *args)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "error" in out.stderr


def test_reproduce_quick(tmp_path: Path) -> None:
    out = _run("reproduce", "--out", str(tmp_path), "--quick", "--trials", "20")
    assert out.returncode == 0, out.stderr
    for name in ("fig5_adult.csv", "fig6_uniform.csv", "fig7_linear.csv", "fig8_peaky.csv",
                 "fig9_cardinality.csv", "report.md"):
        assert (tmp_path / name).stat().st_size > 100
    report = (tmp_path / "report.md").read_text()
    assert "epsilon = 0.1" in report and "| adult | 239 |" in report


def test_simulate_coverage_json() -> None:
    out = _run("simulate", "--coverage", "--exact", "--epsilon", "0.1", "--trials", "300",
               "--seed", "5", "--interval-methods", "clopper-pearson,normal", "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    rows = rep["coverage"]
    assert {(r["target"], r["method"]) for r in rows} == {
        (t, meth) for t in ("joint", "marginal_0", "marginal_1")
        for meth in ("clopper-pearson", "normal")
    }
    for r in rows:
        assert r["m"] == 239 and r["trials"] == 300
        for key in ("min_coverage", "mass_weighted_coverage", "mean_width", "cells_below_90",
                    "all_cells_coverage", "exact_min_coverage", "exact_mass_weighted_coverage"):
            assert key in r
        assert 0.0 <= r["min_coverage"] <= r["mass_weighted_coverage"] + 1e-12 <= 1.0 + 1e-12
    bad = _run("simulate", "--coverage", "--epsilon", "0.1", "--interval-methods", "wald")
    assert bad.returncode == 2 and "interval methods must be among" in bad.stderr
