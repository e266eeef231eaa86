"""The notebook API of a release designed for questions: ``api.design`` is the mechanism's design
of the same schemas, and ``api.release(design=...)`` is ``run_tables_release`` exactly (same test
keys, same counts, estimates, plans and truth), labelled by ``tables_report``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from secure_release import api
from secure_release.mechanism.analysis.design import Design
from secure_release.mechanism.analysis.design import design as mech_design
from secure_release.mechanism.errors import DesignMismatchError
from secure_release.mechanism.estimation.report import TABLES_FORMAT
from secure_release.mechanism.privacy import disjoint_tables
from secure_release.mechanism.protocol.in_memory import run_tables_release

N = 20000
SCHEMAS = {
    "alice": {"a": ["a0", "a1"], "b": ["b0", "b1", "b2"], "c": ["c0", "c1"]},
    "bob": {"x": ["x0", "x1"], "y": ["y0", "y1", "y2"], "z": ["z0", "z1"]},
}
QUESTIONS = ["a ~ x", "b ~ y | c", "z ~ a + c"]


def frames(n: int = N, seed: int = 1) -> dict[str, dict[str, np.ndarray]]:
    """a and x strongly associated (x copies a w.p. 0.9); everything else independent."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"p{i}" for i in range(n)])
    a = rng.choice(["a0", "a1"], n)
    x = np.where(rng.random(n) < 0.9, np.where(a == "a0", "x0", "x1"), rng.choice(["x0", "x1"], n))
    return {
        "alice": {"id": ids, "a": a, "b": rng.choice(["b0", "b1", "b2"], n), "c": rng.choice(["c0", "c1"], n)},
        "bob": {"id": ids[::-1], "x": x[::-1], "y": rng.choice(["y0", "y1", "y2"], n),
                "z": rng.choice(["z0", "z1"], n)},
    }


@pytest.fixture(scope="module")
def the_design() -> Design:
    return api.design(N, SCHEMAS, 1.0, QUESTIONS, at_v=0.1)


def _release(d: Design, **kw: object) -> api.Result:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(frames(), SCHEMAS, 1.0, design=d, test_keys=3, **kw)  # type: ignore[arg-type]


def test_design_reads_schemas_as_release_does(the_design: Design, tmp_path: Path) -> None:
    schemas = [api.schema(name, attrs) for name, attrs in SCHEMAS.items()]
    reference = mech_design(N, schemas, 1.0, QUESTIONS, at_v=0.1)
    assert the_design.digest() == reference.digest()
    assert api.design(N, schemas, 1.0, QUESTIONS, at_v=0.1).digest() == reference.digest()  # a list of schemas
    files = []
    for s in schemas:
        path = tmp_path / f"{s.name}.json"
        path.write_text(json.dumps(api.schema_to_dict(s)))
        files.append(path)
    assert api.design(N, files, 1.0, QUESTIONS, at_v=0.1).digest() == reference.digest()  # files, named by them
    by_name = {s.name: api.schema_to_dict(s) for s in schemas}
    assert api.design(N, by_name, 1.0, QUESTIONS, at_v=0.1).digest() == reference.digest()  # dicts keyed by curator
    assert len(the_design.release.tables) == 3  # the questions share no table here: the routing tests need that


def test_a_designed_release_is_run_tables_release_exactly(the_design: Design) -> None:
    d = the_design
    result = _release(d)
    keys = api.TestKeys.from_int(3, 2)
    planned = d.planned_tables()
    ref = run_tables_release(
        api.curator_tables(frames(), SCHEMAS), [a for a, _, _ in planned], [m for _, m, _ in planned],
        [g for _, _, g in planned], 1.0, d.digest(), d.n, "chacha20", "release-1", seed=keys.seed,
        alignment_key=keys.alignment_key, pram_key=keys.pram_key, pad_keys=keys.pad_keys,
    )  # fmt: skip
    t = result.tables_report
    assert t is not None and t.design_digest == d.digest() and t.design == d.to_dict()
    assert len(result.parts) == len(ref.estimates) == 3
    for part, estimate, plan, truth, attributes in zip(result.parts, ref.estimates, ref.plans, ref.true_types,
                                                       [a for a, _, _ in planned], strict=True):  # fmt: skip
        assert part is not None and estimate is not None
        assert part.report.attributes == attributes
        assert part.report.plan == plan
        np.testing.assert_array_equal(part.report.observed, estimate.counts)
        np.testing.assert_array_equal(part.report.estimate, estimate.raw)
        np.testing.assert_array_equal(part.report.projected, estimate.projected)
        np.testing.assert_array_equal(part.report.standard_error, estimate.standard_errors)
        np.testing.assert_array_equal(part.report.ci_low, estimate.ci_low)
        np.testing.assert_array_equal(part.truth, truth)
    ms, gammas = [p.m for p in ref.plans], [p.gamma for p in ref.plans]
    assert t.epsilon == disjoint_tables.release_epsilon(N, ms, gammas) <= 1.0
    assert t.sequential_epsilon == disjoint_tables.sequential_epsilon(N, ms, gammas) > t.epsilon
    assert result.report is result.parts[0].report  # type: ignore[union-attr]  # report: the first table's
    assert result.guarantee["epsilon"] == t.epsilon and result.to_dict()["format"] == TABLES_FORMAT
    again = _release(d)  # the same test keys give the same release
    np.testing.assert_array_equal(again.parts[1].report.observed, result.parts[1].report.observed)  # type: ignore[union-attr]


def test_a_design_fixes_epsilon_m_and_the_schemas(the_design: Design) -> None:
    with pytest.raises(api.DesignEpsilonError, match=r"differs from the design's 1\.0"):
        api.release(frames(), SCHEMAS, 0.5, design=the_design, test_keys=3)
    assert issubclass(api.DesignEpsilonError, DesignMismatchError)
    with pytest.raises(DesignMismatchError, match="fixes each table's m_t"):
        api.release(frames(), SCHEMAS, 1.0, 500, design=the_design, test_keys=3)
    other = {**SCHEMAS, "bob": {"x": ["x0", "x1"], "y": ["y0", "y1", "y2"], "z": ["z1", "z0"]}}
    with pytest.raises(DesignMismatchError, match="curator 'bob'"):
        api.release(frames(), other, 1.0, design=the_design, test_keys=3)
    with pytest.raises(DesignMismatchError, match="takes a Design"):
        api.release(frames(), SCHEMAS, 1.0, design=the_design.to_dict(), test_keys=3)  # type: ignore[arg-type]


def test_a_table_without_its_keys_is_missing_and_its_question_unanswered() -> None:
    d = api.design(N, SCHEMAS, 1.0, ["a ~ x", "b ~ c"])
    alone = [i for i, t in enumerate(d.release.tables) if set(t.attributes) == {"b", "c"}]
    assert len(d.release.tables) == 2 and len(alone) == 1  # b and c, both alice's, form a table of their own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = api.release(frames(), SCHEMAS, 1.0, design=d, test_keys=3, granted=["alice"])
    assert result.tables_report is not None
    assert [p is None for p in result.parts] == [i != alone[0] for i in range(2)]
    assert result.tables_report.missing == {1 - alone[0]: "no key of bob"}
    answers = {a.question: a for a in result.questions().answers}
    assert not answers["a ~ x"].answered and "no key of bob" in answers["a ~ x"].note
    assert answers["b ~ c"].answered and answers["b ~ c"].table == alone[0] + 1
    with pytest.raises(api.NoKeysEstimatedError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api.release(frames(), SCHEMAS, 1.0, design=api.design(N, SCHEMAS, 1.0, ["a ~ x"]), test_keys=3,
                    granted=["alice"])  # fmt: skip
