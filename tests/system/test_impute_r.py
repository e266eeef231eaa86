"""R's ``mice`` pools the exported imputations exactly as ``analyst fit`` does (docs/analysis.md,
"Multiply-imputed records").

A release of n = 2,000 records (X1, X2 ~ Bernoulli(1/2) at alice; Y with logit P(Y = 1) = X1 at
bob) is saved to a result file; the real CLI, run as a child process, writes the long export
(``analyst impute``, cells with counts and ``--rows``) and prints the pooled fits (``analyst fit
--json``); Rscript reads the export, fits ``glm`` on every imputation and pools with
``mice::pool(as.mira(fits), dfcom = m - p)``. The R lines are the ones docs/analysis.md gives
(``R_*`` below, verbatim). Everything is deterministic (fixed keys and seed): no statistical
error, so a failure is a real disagreement.

Tolerance: every pooled column (estimate, std.error, statistic, df, p.value, both interval ends,
lambda, fmi, b, t, ubar, riv) agrees to a relative 1e-6, with an absolute floor of 1e-12 (only a
p-value near 0 needs it). R's
``glm`` runs with ``glm.control(epsilon = 1e-12)``: its default stops IRLS at a relative deviance
change of 1e-8 and takes the variances at the last iterate but one, which leaves each fit's
standard errors up to about 1e-4 (relative) from the converged fit's and the pooled table within
1e-4 of the project's (checked here too). The project's fits stop at the same 1e-12
(``imputed_fits``: statsmodels' GLM with tol = 1e-12). Needs Rscript and mice
(``apt-get install r-base-core r-cran-mice``; .ci/run installs them): without them the test
fails, it never skips.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from secure_release import api

ROOT = Path(__file__).resolve().parents[2]
N = 2000
M = 20
SEED = 3
LEVELS = ["0", "1"]
SCHEMAS = {"alice": {"x1": LEVELS, "x2": LEVELS}, "bob": {"y": LEVELS}}
REL_TOL = 1e-6
ABS_FLOOR = 1e-12
#: ubar and riv: the mean of the per-imputation variances (no term of Rubin's rules dilutes them).
VARIANCE_REL_TOL = 1e-6
VARIANCE_COLUMNS = ("ubar", "riv")
#: R's default IRLS stopping leaves its standard errors ~1e-4 (relative) off the converged fit's.
DEFAULT_CONTROL_REL_TOL = 1e-4
INSTALL_HINT = "run `apt-get install r-base-core r-cran-mice` (CI's .ci/run installs them)"

#: The logistic model on the cells' export: counts as frequency weights, dfcom = m - 3.
R_CELLS = """\
library(mice)
imp <- read.csv("imp.csv", colClasses = c(x1 = "character", x2 = "character", y = "character"))
for (v in c("x1", "x2", "y")) imp[[v]] <- factor(imp[[v]], levels = c("0", "1"))
fits <- lapply(split(imp, imp$.imp), function(d)
  glm(y ~ x1 + x2, family = binomial, data = d, weights = count,
      control = glm.control(epsilon = 1e-12, maxit = 100)))
m <- sum(imp$count[imp$.imp == 1])
pooled <- pool(as.mira(fits), dfcom = m - 3)
summary(pooled, conf.int = TRUE)
"""

#: The same model on the records' export (``--rows``): no weights, one row a record.
R_ROWS = """\
library(mice)
imp <- read.csv("rows.csv", colClasses = c(x1 = "character", x2 = "character", y = "character"))
for (v in c("x1", "x2", "y")) imp[[v]] <- factor(imp[[v]], levels = c("0", "1"))
fits <- lapply(split(imp, imp$.imp), function(d)
  glm(y ~ x1 + x2, family = binomial, data = d,
      control = glm.control(epsilon = 1e-12, maxit = 100)))
m <- sum(imp$.imp == 1)
pooled <- pool(as.mira(fits), dfcom = m - 3)
summary(pooled, conf.int = TRUE)
"""

#: A log-linear (Poisson) model of the cells' counts, zeros included: dfcom = m - 5.
R_POISSON = """\
library(mice)
imp <- read.csv("imp.csv", colClasses = c(x1 = "character", x2 = "character", y = "character"))
for (v in c("x1", "x2", "y")) imp[[v]] <- factor(imp[[v]], levels = c("0", "1"))
fits <- lapply(split(imp, imp$.imp), function(d)
  glm(count ~ x1 * y + x2, family = poisson, data = d,
      control = glm.control(epsilon = 1e-12, maxit = 100)))
m <- sum(imp$count[imp$.imp == 1])
pooled <- pool(as.mira(fits), dfcom = m - 5)
summary(pooled, conf.int = TRUE)
"""

#: Appended to each script: every pooled column, written at 15 significant digits.
R_WRITE = 'write.csv(summary(pooled, type = "all", conf.int = TRUE), "pooled-r.csv", row.names = FALSE)\n'
#: The project's JSON columns and R's summary(type = "all", conf.int = TRUE) names for them.
COLUMNS = {
    "estimate": "estimate", "std.error": "std.error", "statistic": "statistic", "df": "df", "p.value": "p.value",
    "ci_low": "2.5 %", "ci_high": "97.5 %", "riv": "riv", "lambda": "lambda", "fmi": "fmi", "ubar": "ubar",
    "b": "b", "t": "t",
}  # fmt: skip


def _frames() -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(5)
    ids = np.array([f"p{i}" for i in range(N)])
    x1 = rng.integers(0, 2, N)
    x2 = rng.integers(0, 2, N)
    y = (rng.random(N) < 1.0 / (1.0 + np.exp(-x1))).astype(np.int64)
    return {"alice": {"id": ids, "x1": x1.astype(str), "x2": x2.astype(str)},
            "bob": {"id": ids[::-1], "y": y[::-1].astype(str)}}  # fmt: skip


def _require_r() -> None:
    """Fail (never skip) when Rscript or mice is missing."""
    if shutil.which("Rscript") is None:
        pytest.fail(f"Rscript is not on PATH: this test compares the project's pooling with R's mice; {INSTALL_HINT}")
    probe = subprocess.run(["Rscript", "-e", "library(mice)"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.fail(f"R cannot load mice ({probe.stderr.strip()[-300:]}); {INSTALL_HINT}")


def _cli(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "secure_release", *args], capture_output=True, text=True, cwd=cwd,
                         env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0, f"secure-release {' '.join(args)} failed:\n{out.stderr}"
    return out.stdout


def _rscript(cwd: Path, script: str) -> dict[str, dict[str, float]]:
    """Runs ``script`` + :data:`R_WRITE` in ``cwd``; R's pooled table, by term then column."""
    (cwd / "pool.R").write_text(script + R_WRITE)
    out = subprocess.run(["Rscript", "pool.R"], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert out.returncode == 0, f"Rscript failed:\n{out.stderr}"
    with (cwd / "pooled-r.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {r["term"]: {k: float(v) for k, v in r.items() if k != "term"} for r in rows}


def _r_term(name: str) -> str:
    """statsmodels' coefficient name as R writes it: ``x1[T.1]:y[T.1]`` is ``x11:y1``."""
    return "(Intercept)" if name == "Intercept" else re.sub(r"\[T\.([^\]]*)\]", r"\1", name)


def _differences(ours: dict[str, Any], theirs: dict[str, dict[str, float]]) -> dict[str, float]:
    """The largest absolute difference per column, after checking every column of every term
    agrees to :data:`REL_TOL` (relative; absolute floor :data:`ABS_FLOOR`), ubar and riv to
    :data:`VARIANCE_REL_TOL`."""
    terms = ours["terms"]
    names = [_r_term(t) for t in terms["term"]]
    assert names == list(theirs), f"terms differ: ours {names}, R's {list(theirs)}"
    worst: dict[str, float] = {}
    for column, r_column in COLUMNS.items():
        rel_tol = VARIANCE_REL_TOL if column in VARIANCE_COLUMNS else REL_TOL
        for j, name in enumerate(names):
            a, b = float(terms[column][j]), theirs[name][r_column]
            assert math.isclose(a, b, rel_tol=rel_tol, abs_tol=ABS_FLOOR), f"{name} {column}: ours {a!r}, R's {b!r}"
            worst[column] = max(worst.get(column, 0.0), abs(a - b))
    return worst


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The result file, both exports and both pooled fits, each written by the real CLI."""
    _require_r()
    cwd = tmp_path_factory.mktemp("impute_r")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = api.release(_frames(), SCHEMAS, epsilon=1.0, test_keys=7)
    result.save(cwd / "result.json")
    common = ("--m", str(M), "--seed", str(SEED))
    _cli(cwd, "analyst", "impute", "result.json", *common, "--out", "imp.csv")
    _cli(cwd, "analyst", "impute", "result.json", *common, "--rows", "--out", "rows.csv")
    binomial = json.loads(_cli(cwd, "analyst", "fit", "result.json", "y ~ x1 + x2", "--family", "binomial", *common,
                               "--json"))  # fmt: skip
    poisson = json.loads(_cli(cwd, "analyst", "fit", "result.json", "count ~ x1*y + x2", "--family", "poisson",
                              *common, "--json"))  # fmt: skip
    return {"cwd": cwd, "m": result.plan.m, "binomial": binomial, "poisson": poisson}


def test_the_exports_hold_m_records_in_each_imputation(work: dict[str, Any]) -> None:
    cwd, m = work["cwd"], work["m"]
    with (cwd / "imp.csv").open(newline="") as f:
        cells = list(csv.DictReader(f))
    with (cwd / "rows.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(cells[0]) == [".imp", "x1", "x2", "y", "count"] and list(rows[0]) == [".imp", ".id", "x1", "x2", "y"]
    for i in range(1, M + 1):
        assert sum(int(r["count"]) for r in cells if r[".imp"] == str(i)) == m
        assert [r[".id"] for r in rows if r[".imp"] == str(i)] == [str(k) for k in range(1, m + 1)]
    assert {r[v] for r in cells for v in ("x1", "x2", "y")} == set(LEVELS)
    assert m < N  # dfcom counts the m sampled records, not the n aligned ones
    assert work["binomial"]["dfcom"] == m - 3 and work["poisson"]["dfcom"] == m - 5


def test_mice_pools_the_logistic_fit_on_the_cells_as_the_project(work: dict[str, Any]) -> None:
    worst = _differences(work["binomial"], _rscript(work["cwd"], R_CELLS))
    print("binomial, cells: largest |ours - R's| per column", worst)


def test_mice_pools_the_logistic_fit_on_the_records_as_the_project(work: dict[str, Any]) -> None:
    worst = _differences(work["binomial"], _rscript(work["cwd"], R_ROWS))
    print("binomial, rows: largest |ours - R's| per column", worst)


def test_mice_pools_the_poisson_fit_of_the_counts_as_the_project(work: dict[str, Any]) -> None:
    worst = _differences(work["poisson"], _rscript(work["cwd"], R_POISSON))
    print("poisson, cells: largest |ours - R's| per column", worst)


def test_r_with_glm_default_control_agrees_to_its_irls_tolerance(work: dict[str, Any]) -> None:
    """Without glm.control R's fits stop early (see the module docstring): the pooled table still
    agrees to a relative 1e-4, and no better than 1e-9, so the control in the lines matters."""
    script = R_CELLS.replace(",\n      control = glm.control(epsilon = 1e-12, maxit = 100)", "")
    assert "control" not in script
    theirs = _rscript(work["cwd"], script)
    terms = work["binomial"]["terms"]
    gaps = []
    for j, name in enumerate(_r_term(t) for t in terms["term"]):
        for column in ("estimate", "std.error", "df"):
            a, b = float(terms[column][j]), theirs[name][COLUMNS[column]]
            assert math.isclose(a, b, rel_tol=DEFAULT_CONTROL_REL_TOL), f"{name} {column}: ours {a!r}, R's {b!r}"
            gaps.append(abs(a - b) / abs(b))
    assert max(gaps) > 1e-9
    print("binomial, cells, R's default glm.control: largest relative gap", max(gaps))
