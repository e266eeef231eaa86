"""Every V interval agrees with the test printed beside it, and one pair has one interval.

The rule (docs/analysis.md, "How strongly?"): Cramer's V's interval at level 1 - alpha excludes 0
exactly when the test of independence printed beside it rejects at alpha; a conditional question's
pooled within-stratum V likewise with its conditional test. It holds by construction (the lower
end inverts that very test: ``mechanism/analysis/v_interval.py``), so the checks here are exact:
no false-failure rate to state. The 200-release check fails on the earlier construction (V's
lower end from a test on V's MLE at alpha/2 a side, then widened; a conditional question beside
its pair's marginal V): 25 of the 200 releases disagree there, each a test rejecting at 0.05
beside an interval from 0.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from secure_release import analysis, api
from secure_release.mechanism.analysis import association as assoc
from secure_release.mechanism.analysis import v_interval
from secure_release.mechanism.analysis.design import Design
from secure_release.mechanism.analysis.questions import parse_question
from secure_release.report_page import _questions

sys.path.insert(0, str(Path(__file__).parent))
from test_api_design import QUESTIONS, SCHEMAS, frames

SMALL = {"alice": {"a": ["a0", "a1"], "b": ["b0", "b1"]}, "bob": {"x": ["x0", "x1", "x2"]}}
SMALL_N = 400
RELEASES = 200
LEVEL = 0.95


def _small_frames(seed: int, strength: float) -> dict[str, dict[str, np.ndarray]]:
    """x copies a (within b's levels: a0 -> x0 or x1 by b) w.p. ``strength``, else uniform."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"p{i}" for i in range(SMALL_N)])
    a = rng.choice(["a0", "a1"], SMALL_N)
    b = rng.choice(["b0", "b1"], SMALL_N)
    copied = np.where(a == "a0", np.where(b == "b0", "x0", "x2"), "x1")
    x = np.where(rng.random(SMALL_N) < strength, copied, rng.choice(["x0", "x1", "x2"], SMALL_N))
    return {"alice": {"id": ids, "a": a, "b": b}, "bob": {"id": ids[::-1], "x": x[::-1]}}


@pytest.fixture(scope="module")
def small_designs() -> dict[str, Design]:
    return {q: api.design(SMALL_N, SMALL, 1.0, [q]) for q in ("a ~ x", "a ~ x | b")}


def test_200_releases_the_interval_excludes_0_exactly_when_the_test_rejects(small_designs: dict[str, Design]) -> None:
    """200 designed releases at m of about 100 (truth from independence to strong association;
    every fifth a conditional question): the question's test rejects at 0.05 exactly where its
    V interval excludes 0. Both outcomes occur (a check that cannot fail vacuously)."""
    agree, rejected, kept = 0, 0, 0
    disagreeing = []
    for k in range(RELEASES):
        text = "a ~ x | b" if k % 5 == 4 else "a ~ x"
        d = small_designs[text]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = api.release(_small_frames(k, 0.6 * (k % 7) / 6), SMALL, 1.0, design=d, test_keys=k + 1)
        answer = analysis.answer_question(result.parts[0].report, parse_question(text), 1, 1, 0.0, None,
                                          seed=k, draws=199, level=LEVEL)  # fmt: skip
        rejects = answer.p_value <= 0.05
        excludes = answer.ci_low > 0
        rejected, kept = rejected + rejects, kept + (not rejects)
        if rejects == excludes:
            agree += 1
        else:
            disagreeing.append((k, text, answer.p_value, answer.ci_low))
    assert agree == RELEASES, disagreeing
    assert rejected >= 20 and kept >= 20, (rejected, kept)


def test_the_lower_end_is_0_or_not_by_the_p_value_alone() -> None:
    """lower_end is 0 exactly when p > alpha (p <= alpha rejects, as the printed verdict says),
    whatever the path's simulations say: the same table, statistic and draws, p either side of alpha."""
    table = np.array([[30, 10], [12, 28]])[:, :, None].astype(np.float64)
    p_hat = table / table.sum()
    path = v_interval.linear_path(p_hat)

    def effect(tables: np.ndarray) -> np.ndarray:
        return np.asarray(v_interval.conditional_cramers_v(tables)).reshape(-1)

    g = float(assoc.likelihood_ratio_statistics(table[None], 0.8)[0][0])
    for p, outside in ((0.0499, True), (0.05, True), (0.0501, False), (0.2, False), (1e-6, True)):
        low = v_interval.lower_end(path, effect, 0.8, 80, g, p, 0.95, 99, np.random.default_rng(1))
        assert (low > 0) == outside, (p, low)


def test_conditional_v_is_zero_exactly_under_conditional_independence() -> None:
    rng = np.random.default_rng(2)
    strata = rng.dirichlet(np.ones(3))
    rows, cols = rng.dirichlet(np.ones(2), 3), rng.dirichlet(np.ones(4), 3)
    independent = np.einsum("l,li,lj->ijl", strata, rows, cols)
    assert v_interval.conditional_cramers_v(independent) == pytest.approx(0.0, abs=1e-12)
    dependent = independent.copy()
    dependent[0, 0, 1] += 0.05
    assert v_interval.conditional_cramers_v(dependent) > 0.01
    flat = independent.sum(axis=2, keepdims=True)  # one stratum: the ordinary V
    from secure_release.mechanism.analysis.effects import cramers_v

    assert v_interval.conditional_cramers_v(flat) == pytest.approx(cramers_v(flat[:, :, 0]), abs=1e-12)


@pytest.fixture(scope="module")
def designed() -> api.Result:
    d = api.design(20000, SCHEMAS, 1.0, QUESTIONS, at_v=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(frames(), SCHEMAS, 1.0, design=d, test_keys=3)


def test_one_pair_has_one_interval_wherever_it_prints(designed: api.Result) -> None:
    """questions(), association(), the associations rows and the page's questions table give
    Q1's pair (a ~ x) the same V interval, from the same computation (same seed and draws)."""
    answers = designed.questions()
    q1 = answers.answers[0]
    pair = designed.association("a", "x")
    assert (q1.estimate, q1.ci_low, q1.ci_high) == (pair.cramers_v, pair.ci_low, pair.ci_high)
    test = designed.test_independence("a", "x")
    assert (q1.statistic, q1.p_value) == (test.statistic, test.p_value)
    row = next(r for r in designed.association_rows() if {r.test.a[0], r.test.b[0]} == {"a", "x"})
    v = row.effect.effects.cramers_v
    assert (v.estimate, v.low, v.high) == (pair.cramers_v, pair.ci_low, pair.ci_high)
    page = _questions(designed)["questions"][0]
    shown = dict(zip(("statistic", "df", "p", "estimate", "low", "high"), page["numbers"], strict=False))
    assert shown["low"] == (repr(pair.ci_low), f"{pair.ci_low:.4f}")
    assert shown["high"] == (repr(pair.ci_high), f"{pair.ci_high:.4f}")
    lines = "\n".join(analysis.association_lines(pair))
    assert f"[{pair.ci_low:.4f}, {pair.ci_high:.4f}]" in lines
    cli_lines, cli_json = analysis.test_effect(designed._route("a", "x").report, "a", "x", None)  # analyst test
    assert cli_json["effects"]["cramers_v"] == {"estimate": pair.cramers_v, "ci_low": pair.ci_low,
                                                "ci_high": pair.ci_high}  # fmt: skip
    assert f"[{pair.ci_low:.4f}, {pair.ci_high:.4f}]" in "\n".join(cli_lines)
    assert f"{v.estimate:.3f} [{v.low:.3f}, {v.high:.3f}]" in "\n".join(analysis.associations_lines([row]))


def test_a_model_question_shows_the_models_effect(designed: api.Result) -> None:
    """Q3 (z ~ a + c, a binary z): the odds ratio of a's coefficient in the full logistic model,
    with its Wald interval, labelled so; not the pair's Cramer's V."""
    q3 = designed.questions().answers[2]
    model = designed.logistic("z", ["a", "c"])
    i = model.fit.names.index("a[a1]")
    assert q3.effect.startswith("odds ratio of a[a1]")
    assert q3.estimate == pytest.approx(np.exp(model.fit.coef[i]), rel=1e-12)
    assert (q3.ci_low, q3.ci_high) == pytest.approx((np.exp(model.fit.ci_low[i]), np.exp(model.fit.ci_high[i])),
                                                    rel=1e-12)  # fmt: skip
    assert "odds ratio of a[a1]" in str(designed.questions())


def test_a_conditional_question_uses_its_conditional_test(designed: api.Result) -> None:
    q2 = designed.questions().answers[1]
    test = designed.test_independence("b", "y", "c")
    assert (q2.statistic, q2.p_value) == (test.statistic, test.p_value)
    assert q2.effect.startswith("conditional Cramer's V")
    assert (q2.ci_low > 0) == (q2.p_value <= 0.05)
    _, cli_json = analysis.test_effect(designed._route("b", "y", "c").report, "b", "y", "c")  # analyst test --given
    assert cli_json["effects"]["conditional_cramers_v"] == {"estimate": q2.estimate, "ci_low": q2.ci_low,
                                                            "ci_high": q2.ci_high}  # fmt: skip
