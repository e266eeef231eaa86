# tier: unit
"""Issue 23, item 5: a default estimate chosen by a documented rule, shown as the headline.

- the rule's theorem: the Euclidean projection onto the simplex never moves an estimate further
  from a truth in the simplex (every vector, not on average; checked on random raw vectors and
  truths, and its exact boundary: a raw vector already in the simplex is unchanged);
- the report's headline is ``DEFAULT_ESTIMATOR`` (the projection): first column of the printed
  table, ``headline`` in the JSON, with the raw A^-1 estimate still there;
- the utility warning names the estimate to trust;
- docs/estimators.md states the rule and holds the table of bench/bench_estimators.py (the
  simulation itself is a script, not a test: it takes 10 s).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from secure_release import api, display
from secure_release.mechanism.estimation.estimators import DEFAULT_ESTIMATOR, project_to_simplex
from secure_release.mechanism.estimation.report import ReleaseReport
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.simulation.monte_carlo import project_to_simplex_batch

DOCS = Path(__file__).resolve().parents[2] / "docs" / "estimators.md"


def test_the_projection_never_increases_the_error() -> None:
    rng = np.random.default_rng(23)
    for K in (2, 3, 24, 384):
        truth = rng.dirichlet(np.full(K, 0.3), size=500)
        raw = truth + rng.normal(0.0, rng.uniform(0.001, 0.5, size=(500, 1)), size=(500, K))
        raw += (1.0 - raw.sum(axis=1, keepdims=True)) / K  # A^-1 estimates sum to 1
        proj = project_to_simplex_batch(raw)
        before = np.linalg.norm(raw - truth, axis=1)
        after = np.linalg.norm(proj - truth, axis=1)
        assert np.all(after <= before + 1e-12)
        assert np.all(proj >= 0) and np.allclose(proj.sum(axis=1), 1.0)
    inside = rng.dirichlet(np.ones(24))
    np.testing.assert_allclose(project_to_simplex(inside), inside, atol=1e-15)


def _result() -> api.Result:
    rng = np.random.default_rng(5)
    n = 3000
    ids = np.char.add("id", np.arange(n).astype(str))
    frames = {
        "alice": pd.DataFrame({"id": ids, "a": rng.choice(["x", "y", "z"], n, p=[0.8, 0.15, 0.05])}),
        "bob": pd.DataFrame({"id": ids[::-1], "b": rng.choice(["u", "v"], n)}),
    }
    schemas = {"alice": {"a": ["x", "y", "z"]}, "bob": {"b": ["u", "v"]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(frames, schemas, epsilon=0.3, test_keys=4)


def test_the_report_headlines_the_default_and_keeps_the_raw_estimate() -> None:
    assert DEFAULT_ESTIMATOR == "projected"
    result = _result()
    report = result.report
    np.testing.assert_array_equal(report.headline, report.projected)
    np.testing.assert_array_equal(result.headline, report.projected)
    d = report.to_dict()
    assert d["headline"] == "projected" and [c["estimate"] for c in d["cells"]] == report.projected.tolist()
    assert [c["raw"] for c in d["cells"]] == report.estimate.tolist()
    assert ReleaseReport.from_dict(d).estimate.tolist() == report.estimate.tolist()
    table = display.cell_table(report)
    assert table[0].split()[3:5] == ["estimate", "raw"]  # after the attribute names "a / b"
    first = table[1].split()  # "x / u <estimate: projected> <raw> ..."
    assert float(first[3]) == round(float(report.projected[0]), 4)
    assert float(first[4]) == round(float(report.estimate[0]), 4)
    assert "Read the estimate column (the headline)" in display.explain(report)


def test_the_utility_warning_says_which_estimate_to_trust() -> None:
    noisy = plan_release(45222, (20, 20), 0.05)
    warning = noisy.utility_warning()
    assert warning is not None
    assert "Read the estimate column (the headline, each table's projection of its own raw" in warning
    assert plan_release(45222, (6, 4), 1.0).utility_warning() is None


def test_docs_state_the_rule_and_hold_the_table() -> None:
    text = DOCS.read_text()
    assert "## The rule: the projection" in text and "`mechanism.estimation.estimators.DEFAULT_ESTIMATOR`" in text
    rows = [line for line in text.splitlines() if line.startswith("| adult | 24 |")]
    assert [row.split("|")[3].strip() for row in rows] == ["0.1", "0.5", "1", "2"]
    assert "Default: projected." in text
