"""The researcher's analyses reach the right table (issue 42): a release's observed counts summed
onto named attributes exactly, each attribute's curator found, bad names refused by name, Holm's
adjustment as statsmodels computes it, an old result refused with how to refetch it, and the Result's
methods giving what the mechanism gives on the same table."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from secure_release import analysis, api
from secure_release.mechanism.analysis import association, subtables
from secure_release.mechanism.errors import (
    NotNestedModelsError,
    OldResultError,
    RepeatedAttributeError,
    UnknownAttributeError,
)

SCHEMAS = {
    "alice": {"education": ["lo", "mid", "hi"], "marital": ["no", "yes"]},
    "bob": {"sex": ["f", "m"]},
    "carol": {"salary": ["low", "high"], "age": ["[0, 30)", "[30, 60)", "[60, 90]"]},
}


def released() -> api.Result:
    """A release of three curators' tables (n = 4,000, m = 2,000, epsilon 3) with fixed test keys."""
    rng = np.random.default_rng(42)
    n = 4000
    ids = np.char.add("p", np.arange(n).astype(str))
    education = rng.choice(["lo", "mid", "hi"], n)
    salary = np.where(rng.random(n) < np.where(education == "hi", 0.6, 0.2), "high", "low")
    tables = {
        "alice": pd.DataFrame({"id": ids, "education": education, "marital": rng.choice(["no", "yes"], n)}),
        "bob": pd.DataFrame({"id": ids, "sex": rng.choice(["f", "m"], n)}),
        "carol": pd.DataFrame({"id": ids, "salary": salary, "age": rng.choice(["[0, 30)", "[30, 60)", "[60, 90]"], n)}),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(tables, SCHEMAS, epsilon=3.0, m=2000, test_keys=42)


@pytest.fixture(scope="module")
def result() -> api.Result:
    return released()


def test_the_layout_names_each_attribute_and_its_curator(result: api.Result) -> None:
    lay = analysis.release_layout(result.report)
    assert lay.attributes == ("education", "marital", "sex", "salary", "age")
    assert lay.holders == ("alice", "alice", "bob", "carol", "carol")
    assert lay.levels == (3, 2, 2, 2, 3)
    assert lay.is_binned("age") and not lay.is_binned("education")


def test_a_subtable_is_the_exact_sum_of_the_cells(result: api.Result) -> None:
    """Summed by brute force over the cells' labels, in the order the groups name them."""
    r = result.report
    lay = analysis.release_layout(r)
    table = subtables.attribute_table(r.observed, lay, [["salary"], ["education", "sex"], ["marital"]])
    assert table.shape == (2, 6, 2)
    expected = np.zeros((2, 6, 2), dtype=np.int64)
    col = {a: j for j, a in enumerate(r.attributes)}
    for labels, count in zip(r.labels, r.observed, strict=True):
        i = lay.categories[col["salary"]].index(labels[col["salary"]])
        j = 2 * lay.categories[col["education"]].index(labels[col["education"]]) + lay.categories[col["sex"]].index(
            labels[col["sex"]]
        )
        k = lay.categories[col["marital"]].index(labels[col["marital"]])
        expected[i, j, k] += count
    assert np.array_equal(table, expected)
    assert subtables.group_labels(lay, ["education", "sex"])[1] == "education=lo, sex=m"


def test_every_cross_curator_pair_and_no_other(result: api.Result) -> None:
    pairs = subtables.cross_curator_pairs(analysis.release_layout(result.report))
    assert ("education", "marital") not in pairs and ("salary", "age") not in pairs
    assert len(pairs) == 10 - 2  # C(5, 2) less the two pairs within a curator


@pytest.mark.parametrize(
    ("a", "b", "given", "error", "says"),
    [
        ("educ", "salary", None, UnknownAttributeError, "the release has ['education', 'marital', 'sex'"),
        ("education", "education", None, RepeatedAttributeError, "named twice"),
        ("education", "salary", "education", RepeatedAttributeError, "both a and given"),
        (["sex", "sex"], "salary", None, RepeatedAttributeError, "named twice (a)"),
    ],
)
def test_bad_names_are_refused_by_name(
    result: api.Result, a: object, b: object, given: object, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=None) as caught:
        result.test_independence(a, b, given)  # type: ignore[arg-type]
    assert says in str(caught.value)


def test_holm_is_statsmodels_holm() -> None:
    rng = np.random.default_rng(3)
    for size in (1, 2, 7, 40):
        p = rng.random(size) ** 3
        p[:2] = p[0]  # ties
        assert np.allclose(subtables.holm_adjust(p), multipletests(p, method="holm")[1], atol=1e-15)


def test_an_old_result_without_observed_counts_says_how_to_refetch(result: api.Result, tmp_path: Path) -> None:
    saved = result.to_dict()
    for cell in saved["cells"]:
        del cell["observed"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(saved))
    old = api.load_result(path)
    with pytest.raises(OldResultError, match="analyst show RELEASE --json"):
        old.test_independence("education", "salary")
    with pytest.raises(OldResultError):
        old.association_rows()


def test_the_result_tests_the_table_the_mechanism_gets(result: api.Result) -> None:
    r = result.report
    lay = analysis.release_layout(r)
    table = subtables.attribute_table(r.observed, lay, [["education"], ["salary"], ["sex"]])
    direct = association.independence_test(table, r.plan.channel.keep, draws=199, seed=5)
    via = result.test_independence("education", "salary", given="sex", draws=199, seed=5)
    assert (via.statistic, via.df, via.p_value) == (direct.statistic, direct.df, direct.p_value)
    assert via.method == direct.method
    assert via.df == 2 * 2 and via.strata == 2
    # deterministic (test_keys and the bootstrap seed fix every draw): salary depends strongly on
    # education here (0.6 against 0.2), so a test that cannot see it fails
    assert via.p_value < 0.01


def test_associations_are_sorted_by_the_adjusted_p(result: api.Result) -> None:
    rows = result.association_rows(draws=99)
    assert len(rows) == 8
    adjusted = [r.p_adjusted for r in rows]
    assert adjusted == sorted(adjusted)
    assert (rows[0].test.a[0], rows[0].test.b[0]) == ("education", "salary")
    frame = result.associations(draws=99)
    assert list(frame["p_holm"]) == adjusted
    assert {"cramers_v", "v_ci_low", "v_ci_high", "p_value", "curator_a"} <= set(frame.columns)


def test_ordered_effects_for_binned_numbers_only(result: api.Result) -> None:
    assert result.association("age", "salary").kendall_tau_b is None  # salary is not ordered
    assert result.association("age", "salary", ordered=["salary"]).kendall_tau_b is not None
    two_by_two = result.association("sex", "salary")
    assert two_by_two.odds_ratio is not None and two_by_two.risk_difference is not None


def test_models_compare_only_when_nested(result: api.Result) -> None:
    full = result.logistic("salary", ["education", "sex"])
    reduced = result.logistic("salary", ["sex"])
    comparison = result.compare_models(reduced, full)
    assert comparison.df == 2 and comparison.statistic >= 0.0
    assert comparison.reduced.over == full.over  # refitted on the full model's table
    assert comparison.p_value < 0.01  # education matters
    with pytest.raises(NotNestedModelsError):
        result.compare_models(full, reduced)
    with pytest.raises(UnknownAttributeError, match="two different covariates"):
        result.logistic("salary", ["sex"], interactions=[("sex", "education")])


def test_api_power_plans_from_schemas_only() -> None:
    """api.power is plan --power: public schemas in, the detectable V at m, best m and m* out."""
    from secure_release.mechanism.analysis.power import power_plan

    bob = {"curator": "bob", "attributes": [{"name": "sex", "categories": ["f", "m"]},
                                            {"name": "salary", "categories": ["low", "high"]}]}  # fmt: skip
    plan = api.power(45222, [SCHEMAS["alice"], bob], 0.5, "education", "salary")
    assert plan.levels == (3, 2) and plan.df == 2 and plan.assumption == "uniform marginals"
    assert abs(plan.best_m - 45222 * np.expm1(0.5) / 24) <= 1  # best m = n (e^eps - 1)/K, rounded
    assert plan.min_detectable_cramers_v_at_best_m <= plan.min_detectable_cramers_v_at_m_star
    direct = power_plan(45222, [api.schema("alice", SCHEMAS["alice"]), api.schema("bob", {"sex": ["f", "m"],
                        "salary": ["low", "high"]})], 0.5, "education", "salary")  # fmt: skip
    assert plan.to_dict() == direct.to_dict()
    with pytest.raises(UnknownAttributeError, match="education"):  # names the attributes there are
        api.power(45222, [api.schema("alice", SCHEMAS["alice"])], 0.5, "education", "nope")
