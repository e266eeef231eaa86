"""The notebook's and the CLI's multiply-imputed records (``Result.impute``, ``analyst impute`` and
``analyst fit``): the long format holds exactly the sampler's imputations, a pooled fit is the
statsmodels fit of each imputation (checked against fits on the records expanded one row each)
pooled by Rubin's rules, a designed release imputes each table and routes a formula to the one
holding it, and a degenerate imputation is named, never pooled silently."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
smf = pytest.importorskip("statsmodels.formula.api")
sm = pytest.importorskip("statsmodels.api")

from secure_release import api  # noqa: E402
from secure_release.cli import main  # noqa: E402
from secure_release.imputation import ImputationModelError, parse_model  # noqa: E402
from secure_release.imputed_fits import DegenerateImputationError, FormulaError, pool_fits  # noqa: E402
from secure_release.mechanism.analysis.pooling import pool  # noqa: E402
from secure_release.mechanism.errors import NoTableHoldsError  # noqa: E402

N = 2000
SCHEMAS = {"alice": {"x1": ["0", "1"], "x2": ["0", "1"]}, "bob": {"y": ["0", "1"]}}


def tables(n: int = N, seed: int = 1) -> dict[str, dict[str, np.ndarray]]:
    """X1, X2 ~ Bernoulli(0.5); logit P(Y = 1) = X1 (the benchmark of DP synthetic data)."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.integers(0, 2, n), rng.integers(0, 2, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-x1))).astype(int)
    ids = np.array([f"p{i}" for i in range(n)])
    return {"alice": {"id": ids, "x1": x1.astype(str), "x2": x2.astype(str)}, "bob": {"id": ids, "y": y.astype(str)}}


@pytest.fixture(scope="module")
def result() -> api.Result:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(tables(), SCHEMAS, 1.0, test_keys=5)  # type: ignore[arg-type]


def test_the_long_format_holds_the_sampler_s_imputations(result: api.Result) -> None:
    imp = result.impute(4, seed=2)
    counts = imp.tables[0].counts
    m, K = result.plan.m, len(result.report.labels)
    assert counts.shape == (4, K) and (counts.sum(axis=1) == m).all()
    long = imp.to_frame()
    assert list(long.columns) == [".imp", "x1", "x2", "y", "count"] and len(long) == 4 * K
    for i in range(4):
        block = long[long[".imp"] == i + 1]
        assert block["count"].tolist() == counts[i].tolist()
        assert list(zip(block["x1"], block["x2"], block["y"], strict=True)) == list(result.report.labels)
    rows = imp.to_frame(rows=True)
    assert list(rows.columns) == [".imp", ".id", "x1", "x2", "y"] and len(rows) == 4 * m
    assert rows[".id"].tolist() == list(range(1, m + 1)) * 4
    again = rows.groupby([".imp", "x1", "x2", "y"]).size().reindex(
        pd.MultiIndex.from_frame(long[[".imp", "x1", "x2", "y"]]), fill_value=0)  # fmt: skip
    assert again.tolist() == long["count"].tolist()
    # the same seed, the same imputations; another seed, others
    assert (result.impute(4, seed=2).tables[0].counts == counts).all()
    assert not (result.impute(4, seed=3).tables[0].counts == counts).all()


def test_a_pooled_fit_is_each_imputation_s_fit_pooled(result: api.Result) -> None:
    imp = result.impute(5, seed=7, model="y*x1 + y*x2 + x1*x2")
    fit = imp.fit("y ~ x1 + x2", "binomial")
    rows = imp.to_frame(rows=True)
    estimates, variances = [], []
    for i in range(1, 6):
        d = rows[rows[".imp"] == i].assign(y=lambda f: (f["y"] == "1").astype(int))
        ref = smf.glm("y ~ x1 + x2", d, family=sm.families.Binomial()).fit()  # one row a record, no weights
        estimates.append(ref.params.to_numpy())
        variances.append(ref.bse.to_numpy() ** 2)
    expected = pool(np.array(estimates), np.array(variances), result.plan.m - 3, names=["a", "b", "c"])
    np.testing.assert_allclose(fit.pooled.estimate, expected.estimate, rtol=1e-7)
    np.testing.assert_allclose(fit.pooled.standard_error, expected.standard_error, rtol=1e-6)
    np.testing.assert_allclose(fit.pooled.df, expected.df, rtol=1e-6)
    assert fit.pooled.dfcom == result.plan.m - 3
    assert fit.pooled.names == ("Intercept", "x1[T.1]", "x2[T.1]")
    text = str(fit)
    for word in ("Rubin", "y*x1 + y*x2 + x1*x2", "fmi", "riv", "y is coded 1 for '1'"):
        assert word in text
    assert "<table>" in fit._repr_html_()
    assert fit.to_frame()["term"].tolist() == list(fit.pooled.names)


def test_poisson_and_ordinal_models_of_the_imputations(result: api.Result) -> None:
    imp = result.impute(3, seed=1)
    poisson = imp.fit("count ~ x1*y + x2", "poisson")
    assert "x1[T.1]:y[T.1]" in poisson.pooled.names
    assert poisson.pooled.dfcom == result.plan.m - 5  # records, not cells, minus parameters
    ordinal = imp.fit("x1 ~ y + x2", "ordinal")
    assert ordinal.pooled.names[:2] == ("y[T.1]", "x2[T.1]") and len(ordinal.pooled.names) == 3


def _frames(degenerate: int) -> list[object]:
    """Four imputations' cells of y ~ x; imputation ``degenerate`` has no y = 0 at x = 1
    (complete separation)."""
    out = []
    for i in range(1, 5):
        counts = [40, 20, 25, 35] if i != degenerate else [40, 20, 0, 60]
        out.append(pd.DataFrame({"x": pd.Categorical(["0", "0", "1", "1"]), "y": [0, 1, 0, 1], "count": counts}))
    return out


def test_a_degenerate_imputation_is_named_not_pooled() -> None:
    with pytest.raises(DegenerateImputationError, match=r"imputation 3: .*(separation|standard error)"):
        pool_fits(_frames(3), "y ~ x", "binomial", table=1, model="the saturated joint")
    kept = pool_fits(_frames(3), "y ~ x", "binomial", table=1, model="m", on_degenerate="drop")
    assert [i for i, _ in kept.dropped] == [3] and kept.pooled.m == 3
    assert "DROPPED imputations 3" in str(kept)
    clean = pool_fits(_frames(0), "y ~ x", "binomial", table=1, model="m")
    assert clean.dropped == () and clean.pooled.m == 4


def test_bad_requests_are_named(result: api.Result) -> None:
    with pytest.raises(ImputationModelError, match="'w'"):
        result.impute(3, model="y*w")
    with pytest.raises(FormulaError, match="no formula"):
        result.impute(3).fit("y + x1")
    with pytest.raises(FormulaError, match="could not read"):
        result.impute(3).fit("y ~ nothing_here")
    assert parse_model("a*b + b:c", ["a", "b", "c"]) == [["a", "b"], ["b", "c"]]
    assert parse_model("saturated", ["a"]) is None


def test_a_designed_release_imputes_each_table_and_routes_a_formula() -> None:
    schemas = {"alice": {"a": ["a0", "a1"], "c": ["c0", "c1"]}, "bob": {"x": ["x0", "x1"], "z": ["z0", "z1"]}}
    rng = np.random.default_rng(4)
    n = 20000
    ids = np.array([f"p{i}" for i in range(n)])
    a = rng.choice(["a0", "a1"], n)
    data = {"alice": {"id": ids, "a": a, "c": rng.choice(["c0", "c1"], n)},
            "bob": {"id": ids, "x": np.where(a == "a0", "x0", "x1"), "z": rng.choice(["z0", "z1"], n)}}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = api.design(n, schemas, 1.0, ["a ~ x", "z ~ c"], at_v=0.1)
        res = api.release(data, schemas, 1.0, design=d, test_keys=3)  # type: ignore[arg-type]
    imp = res.impute(3, seed=1)
    assert len(imp.tables) == len([p for p in res.parts if p is not None]) >= 2
    holding = {t.table for t in imp.tables if {"z", "c"} <= set(t.attributes)}
    assert imp.fit("z ~ c").table in holding
    with pytest.raises(NoTableHoldsError):
        imp.to_frame()  # several tables: name one
    assert len(imp.to_frame(table=imp.tables[0].table)) == 3 * len(imp.tables[0].report.labels)


def test_the_cli_writes_the_export_and_prints_the_pooled_fit(
    result: api.Result, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = result.save(tmp_path / "r.json")
    out = tmp_path / "imp.csv"
    assert main(["analyst", "impute", str(saved), "--m", "3", "--seed", "2", "--out", str(out)]) == 0
    written = pd.read_csv(out, dtype={"x1": str, "x2": str, "y": str})
    expected = api.load_result(saved).impute(3, seed=2).to_frame()
    assert written.astype(str).values.tolist() == expected.astype(str).values.tolist()
    capsys.readouterr()
    assert main(["analyst", "fit", str(saved), "y ~ x1 + x2", "--m", "3", "--seed", "2", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    reference = api.load_result(saved).impute(3, seed=2).fit("y ~ x1 + x2")
    assert printed["terms"]["estimate"] == pytest.approx(reference.pooled.estimate.tolist(), rel=1e-12)
    assert main(["analyst", "impute", str(saved), "--out", str(tmp_path / "x.txt")]) == 2
