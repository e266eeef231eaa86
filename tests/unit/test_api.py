"""The notebook API (secure_release.api) against mechanism.protocol.in_memory.run_release, exactly."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from secure_release import api
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.privacy.guarantee import privacy_guarantee, utility_check
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.in_memory import run_release
from secure_release.researcher.storage import write_report

SCHEMAS = {
    "alice": {"edu": ["a", "b", "c"], "mar": ["m", "s"]},
    "bob": {"sex": ["f", "m"], "sal": ["lo", "hi"]},
}


def _frames() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(3)
    n = 4000
    ids = np.char.add("id", np.arange(n).astype(str))
    alice = pd.DataFrame({"id": ids[:3900], "edu": rng.choice(["a", "b", "c"], 3900, p=[0.6, 0.3, 0.1]),
                          "mar": rng.choice(["m", "s"], 3900)})  # fmt: skip
    bob_rows = rng.permutation(np.arange(50, n))
    bob = pd.DataFrame({"id": ids[bob_rows], "sex": rng.choice(["f", "m"], bob_rows.size),
                        "sal": rng.choice(["lo", "hi"], bob_rows.size, p=[0.8, 0.2])})  # fmt: skip
    return {"alice": alice, "bob": bob}


@pytest.fixture(scope="module")
def result() -> api.Result:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(_frames(), SCHEMAS, epsilon=1.0, test_keys=11)


def _reference(granted: list[int] | None = None):  # type: ignore[no-untyped-def]
    tables = api.curator_tables(_frames(), SCHEMAS)
    keys = api.TestKeys.from_int(11, 2)
    return run_release(tables, 1.0, None, "chacha20", "release-1", seed=keys.seed, alignment_key=keys.alignment_key,
                       pram_key=keys.pram_key, granted=granted, pad_keys=keys.pad_keys)  # fmt: skip


def test_release_equals_run_release_exactly(result: api.Result) -> None:
    ref = _reference()
    assert result.plan == ref.plan and result.plan.n == 3850
    np.testing.assert_array_equal(result.report.estimate, ref.estimate.raw)
    np.testing.assert_array_equal(result.report.standard_error, ref.estimate.standard_errors)
    np.testing.assert_array_equal(result.truth, ref.true_type)
    assert result.l2_error == pytest.approx(ref.l2_error, abs=1e-12)


@pytest.mark.parametrize("kind", ["polars", "arrow", "mapping"])
def test_other_table_kinds_give_the_same_release(result: api.Result, kind: str) -> None:
    convert = {"polars": pl.from_pandas, "arrow": pa.Table.from_pandas,
               "mapping": lambda f: {c: f[c].tolist() for c in f.columns}}[kind]  # fmt: skip
    tables = {k: convert(v) for k, v in _frames().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = api.release(tables, SCHEMAS, epsilon=1.0, test_keys=11)
    np.testing.assert_array_equal(other.report.estimate, result.report.estimate)


def test_cells_frame_has_every_column(result: api.Result) -> None:
    df = result.cells(include_truth=True)
    assert list(df.columns) == ["edu", "mar", "sex", "sal", "estimate", "raw", "mle", "se",
                                "ci_low", "ci_high", "observed", "ci_spans_zero", "truth"]  # fmt: skip
    np.testing.assert_array_equal(df["estimate"].to_numpy(), result.report.projected)  # the headline
    np.testing.assert_array_equal(df["raw"].to_numpy(), result.report.estimate)
    assert len(df) == 24 and df["observed"].sum() == result.plan.m
    spans = (df["ci_low"] <= 0) & (df["ci_high"] >= 0)
    assert (df["ci_spans_zero"] == spans).all()
    assert result.to_polars(include_truth=True).shape == (24, 13)


def test_marginal_over_all_attributes_is_the_cells(result: api.Result) -> None:
    t = result.marginal_table("edu", "mar", "sex", "sal")
    np.testing.assert_allclose(t.estimate, result.report.estimate, atol=1e-15)
    np.testing.assert_allclose(t.standard_error, result.report.standard_error, rtol=1e-12)


def test_curator_marginal_equals_the_granted_subset_release(result: api.Result) -> None:
    """Summing the joint A^-1 over bob's attributes is exactly alice's marginal estimator, and its
    SE is the marginal SE the researcher reports when only alice grants her key."""
    ref = _reference(granted=[0])
    t = result.marginal_table("edu", "mar")
    np.testing.assert_allclose(t.estimate, ref.estimate.raw, atol=1e-12)
    np.testing.assert_allclose(t.standard_error, ref.estimate.standard_errors, rtol=1e-9)
    df = result.marginal("edu")
    assert list(df["edu"]) == ["a", "b", "c"]
    assert df["estimate"].sum() == pytest.approx(1.0)


def test_conditional_rows_sum_to_one(result: api.Result) -> None:
    df = result.conditional("sal", "edu")
    sums = df.groupby("edu")["estimate"].sum()
    np.testing.assert_allclose(sums.to_numpy(), 1.0)
    assert len(df) == 6


def test_guarantee_in_standard_form_matches_the_accounting() -> None:
    plan = plan_release(45222, [6, 4], 0.5)
    g = privacy_guarantee(plan)
    assert g["delta"] == 0.0 and g["epsilon"] == pytest.approx(0.5, abs=1e-12)
    assert "replace-one" in g["neighbouring_relation"] and "n is public" in g["neighbouring_relation"]
    q = plan.gamma + 23
    assert g["opendp"]["prob"] == pytest.approx(plan.gamma / q)
    p = g["dp_accounting"]["noise_parameter"]
    assert 1 - p + p / 24 == pytest.approx(plan.gamma / q)  # P(truth) agrees in both libraries' terms
    local = math.log(plan.gamma)
    assert accounting.amplified_epsilon(local, plan.m / plan.n) == pytest.approx(g["epsilon"])
    assert api.plan(45222, [6, 4], 0.5).to_dict()["guarantee"] == g  # Adult at 0.5: no warning


def test_utility_check_suggests_what_fixes_it() -> None:
    plan = plan_release(2000, [12, 6], 0.5)
    u = utility_check(plan)
    assert not u["ok"] and u["message"] and u["suggested_epsilon"] is not None
    fixed = accounting.rmse_at_epsilon(2000, u["suggested_m"], 72, u["suggested_epsilon"])
    assert fixed / math.sqrt(72) <= 1 / 72  # the per-cell RMSE the suggestion promises
    assert utility_check(plan_release(45222, [6, 4], 3.0))["ok"]
    with pytest.warns(UserWarning, match="exceeds the typical cell share"):
        api.plan(2000, [12, 6], 0.5)


def test_missing_values_and_unknown_categories_are_refused() -> None:
    frames = _frames()
    frames["alice"].loc[3, "edu"] = None
    with pytest.raises(api.BadRowsError, match=r"edu: 1 row\(s\) missing \(empty\), line\(s\) 5\n"):  # row 3: line 5
        api.release(frames, SCHEMAS, epsilon=1.0)  # a null is a missing value
    frames = _frames()
    frames["bob"].loc[0, "sal"] = "mid"
    with pytest.raises(api.BadRowsError, match=r"sal: 1 row\(s\) not a category, line\(s\) 2; values: 'mid' \(1\)"):
        api.release(frames, SCHEMAS, epsilon=1.0)


def test_draft_schema_warns_about_the_codebook() -> None:
    with pytest.warns(UserWarning, match="public codebook"):
        draft = api.draft_schema(_frames()["alice"], "alice")
    assert draft["attributes"] == [{"name": "edu", "categories": ["a", "b", "c"]},
                                   {"name": "mar", "categories": ["m", "s"]}]  # fmt: skip


def test_load_result_reads_the_researchers_file(result: api.Result, tmp_path: Path) -> None:
    write_report(tmp_path, result.report)
    loaded = api.load_result(tmp_path / "release-1.json")
    np.testing.assert_array_equal(loaded.report.estimate, result.report.estimate)
    assert json.loads(json.dumps(loaded.to_dict()))["guarantee"]["delta"] == 0.0


def test_simulate_frame() -> None:
    counts = np.array([500, 300, 150, 50])
    sim = api.simulate(counts, [0.5, 1.0], trials=50, seed=1)
    df = sim.to_frame()
    assert list(df["m"]) == [accounting.optimal_sample_size_int(1000, 4, e) for e in (0.5, 1.0)]
    assert (df["mean_l2_error"].astype(float) > 0).all()

