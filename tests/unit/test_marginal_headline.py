"""Each table's headline is the projection of its own raw estimate onto its own simplex, so the
printed promise ("never further (l2) from this table's true shares than its raw column") holds
for every table it is printed on: exactly (non-expansiveness, hypothesis) and in every simulated
release through the real code path, at a large K (2592) and a small K (36). The simulation checks
a deterministic inequality per trial (no false-failure rate: it is a theorem, the trials only
exercise the code path); it also shows the old headline (the marginal of the projected joint)
breaking the promise, so the check can fail."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from secure_release import api
from secure_release.mechanism.estimation import estimators as est
from secure_release.mechanism.estimation import marginals
from secure_release.mechanism.estimation.report import COLUMN_MEANINGS
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol import in_memory as protocol
from secure_release.mechanism.simulation.datasets import largest_remainder
from secure_release.mechanism.simulation.monte_carlo import fast_observed_counts

TOL = 1e-12


@settings(max_examples=200, deadline=None)
@given(
    arrays(np.float64, st.integers(1, 60), elements=st.floats(-3, 3, allow_nan=False)),
    st.integers(0, 2**32 - 1),
)
def test_projection_is_never_further_from_any_truth_in_the_simplex(raw: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for truth in (rng.dirichlet(np.full(raw.size, 0.3)), np.eye(raw.size)[rng.integers(raw.size)]):
        projected = est.project_to_simplex(raw)
        assert np.linalg.norm(projected - truth) <= np.linalg.norm(raw - truth) + TOL


def _labels(sizes: tuple[int, int]) -> list[tuple[str, str]]:
    return [(f"x{i}", f"y{j}") for i in range(sizes[0]) for j in range(sizes[1])]


@pytest.mark.parametrize(("sizes", "epsilon", "m"), [((4, 648), 2.0, 72), ((4, 648), 6.0, 4560), ((6, 6), 0.5, 606)])
def test_every_table_keeps_the_promise_in_every_release(sizes: tuple[int, int], epsilon: float, m: int) -> None:
    """n = 28,802 (the held-out Adult size), a peaky first attribute (90% in one category), Zipf in
    the second; 10 releases (sampling without replacement, then PRAM) per setting. For the joint,
    both one-way marginals and the two-way table: ||headline - truth|| <= ||raw - truth||."""
    n = 28_802
    plan = plan_release(n, sizes, epsilon)
    assert plan.m == m
    px = np.r_[0.9, np.full(sizes[0] - 1, 0.1 / (sizes[0] - 1))]
    py = 1.0 / np.arange(1, sizes[1] + 1)
    truth_counts = largest_remainder(np.outer(px, py / py.sum()).ravel(), n)
    truth = truth_counts / n
    labels = _labels(sizes)
    rng = np.random.default_rng(20261127)
    old_broke = 0
    for observed in fast_observed_counts(truth_counts, plan.m, plan.channel.keep, 10, rng):
        e = protocol.estimate_from_counts(observed, plan)
        assert np.linalg.norm(e.projected - truth) <= np.linalg.norm(e.raw - truth) + TOL
        for wanted in (["X"], ["Y"], ["Y", "X"]):
            t = marginals.marginal(("X", "Y"), labels, e.raw, wanted, n, plan.m, plan.channel.keep, observed)
            index = marginals.group_cells(np.array(labels), [("X", "Y").index(w) for w in wanted])[1]
            true_table = np.bincount(index, weights=truth)
            assert np.linalg.norm(t.headline - true_table) <= np.linalg.norm(t.estimate - true_table) + TOL
            assert t.headline.min() >= 0 and t.headline.sum() == pytest.approx(1.0)
            assert np.all((t.ci_low <= t.headline) & (t.headline <= t.ci_high))
            np.testing.assert_allclose(t.mle, est.mle_water_filling(t.observed, plan.channel.keep))
            old = np.bincount(index, weights=e.projected)  # the old headline
            old_broke += np.linalg.norm(old - true_table) > np.linalg.norm(t.estimate - true_table) + TOL
    if sizes == (4, 648):
        assert old_broke > 0  # measured: the old headline was further than raw in most releases here


def test_conditional_comes_from_the_projected_two_way_table() -> None:
    n, sizes = 28_802, (6, 6)
    plan = plan_release(n, sizes, 0.5)
    truth_counts = largest_remainder(np.linspace(1, 3, 36), n)
    observed = fast_observed_counts(truth_counts, plan.m, plan.channel.keep, 1, np.random.default_rng(3))[0]
    e = protocol.estimate_from_counts(observed, plan)
    labels = _labels(sizes)
    rows, prob, prob_mle, low, high = marginals.conditional_table(
        ("X", "Y"), labels, e.raw, observed, ["Y"], ["X"], n, plan.m, plan.channel.keep
    )
    two_way = marginals.marginal(("X", "Y"), labels, e.raw, ["X", "Y"], n, plan.m, plan.channel.keep, observed)
    np.testing.assert_array_equal(rows, two_way.labels)
    shares = two_way.projected.reshape(6, 6)
    with np.errstate(invalid="ignore"):
        expected = shares / shares.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(prob, expected.ravel(), rtol=1e-12)
    mle = two_way.mle.reshape(6, 6)
    np.testing.assert_allclose(prob_mle, (mle / mle.sum(axis=1, keepdims=True)).ravel(), rtol=1e-12)
    finite = ~np.isnan(prob)
    assert np.all((low[finite] <= prob[finite]) & (prob[finite] <= high[finite]))


def test_through_the_notebook_api_and_the_printed_promise() -> None:
    """api.release -> Result.marginal_table / conditional_columns use the tables' own headlines,
    and the printed promise names the table's own raw column and the cost."""
    rng = np.random.default_rng(11)
    n = 4000
    ids = np.char.add("p", np.arange(n).astype(str))
    alice = pd.DataFrame({"id": ids, "a": rng.choice(list("pqrstu"), n, p=[0.7, 0.1, 0.1, 0.05, 0.03, 0.02])})
    bob = pd.DataFrame({"id": ids, "b": rng.choice(list("uvwxyz"), n)})
    schemas = {"alice": {"a": list("pqrstu")}, "bob": {"b": list("uvwxyz")}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = api.release({"alice": alice, "bob": bob}, schemas, epsilon=0.5, test_keys=3)
    assert result.truth is not None
    for wanted in (["a"], ["b"], ["b", "a"]):
        t = result.marginal_table(*wanted)
        np.testing.assert_allclose(t.projected, est.project_to_simplex(t.estimate), atol=1e-15)
        index = marginals.group_cells(np.asarray(result.report.labels), [("a", "b").index(w) for w in wanted])[1]
        true_table = np.bincount(index, weights=result.truth)
        assert np.linalg.norm(t.projected - true_table) <= np.linalg.norm(t.estimate - true_table) + TOL
    cols = result.conditional_columns("b", "a")
    two_way = result.marginal_table("a", "b").projected.reshape(6, 6)
    np.testing.assert_allclose(cols["estimate"], (two_way / two_way.sum(axis=1, keepdims=True)).ravel())
    promise = COLUMN_MEANINGS["estimate"]
    assert "its own probability simplex" in promise and "need not sum exactly" in promise
