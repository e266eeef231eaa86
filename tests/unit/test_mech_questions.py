"""mechanism/analysis/questions.py: the researcher's questions. Every form parses to the fields it
states, the canonical text parses back to the same question, and every malformed question names
what is wrong (the error class and the message)."""

from __future__ import annotations

import numpy as np
import pytest

from secure_release.mechanism.analysis.questions import (
    Question,
    attribute_index,
    check_questions,
    check_shares,
    geometric_shares,
    merged_shares,
    name_text,
    parse_question,
)
from secure_release.mechanism.analysis.suggest import bin_merge, group_merge
from secure_release.mechanism.errors import (
    InvalidQuestionError,
    NonFiniteInputError,
    RepeatedAttributeError,
    ShapeMismatchError,
    TooFewLevelsError,
    UnknownAttributeError,
)
from secure_release.mechanism.schema import Attribute, CuratorSchema

ALICE = CuratorSchema("alice", (Attribute("released", ("no", "yes")), Attribute("colour", ("b", "w", "o"))))
BOB = CuratorSchema("bob", (Attribute("employed", ("no", "yes")), Attribute("citizen", ("no", "yes")),
                            Attribute("hours per week", ("lo", "hi")), Attribute("one", ("x",))))  # fmt: skip


@pytest.mark.parametrize(
    ("text", "target", "others", "given", "kind", "canonical"),
    [
        ("released ~ colour", "released", ("colour",), (), "independence", "released ~ colour"),
        ("released~colour|employed+citizen", "released", ("colour",), ("employed", "citizen"), "independence",
         "released ~ colour | employed + citizen"),
        ("  salary ~ education + sex ", "salary", ("education", "sex"), (), "model", "salary ~ education + sex"),
        ("y ~ `hours per week` | x_1.b-c", "y", ("hours per week",), ("x_1.b-c",), "independence",
         "y ~ `hours per week` | x_1.b-c"),
        ("`a` ~ b + c + d", "a", ("b", "c", "d"), (), "model", "a ~ b + c + d"),
    ],
)
def test_every_form_parses_and_its_canonical_text_round_trips(
    text: str, target: str, others: tuple[str, ...], given: tuple[str, ...], kind: str, canonical: str
) -> None:
    q = parse_question(text)
    assert (q.target, q.others, q.given, q.kind) == (target, others, given, kind)
    assert q.attributes == (target, *others, *given)
    assert str(q) == q.text == canonical
    assert parse_question(str(q)) == q
    tested = q.tested
    if kind == "model":  # the first predictor against the outcome, given the others
        assert tested == (target, others[0], others[1:])
    else:
        assert tested == (target, others[0], given)


def test_names_are_quoted_only_when_they_need_it() -> None:
    assert name_text("colour") == "colour" and name_text("x_1.b-c") == "x_1.b-c"
    assert name_text("hours per week") == "`hours per week`" and name_text("1st") == "`1st`"


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("", InvalidQuestionError, "a non-empty text"),
        ("   ", InvalidQuestionError, "a non-empty text"),
        ("released ~", InvalidQuestionError, r"the right side of '~' is empty"),
        ("~ colour", InvalidQuestionError, r"the left side of '~' is empty"),
        ("released ~ colour |", InvalidQuestionError, r"the set after '\|' is empty"),
        ("released ~ colour + ", InvalidQuestionError, r"the right side of '~' must be names joined by '\+'"),
        ("released ~ colour employed", InvalidQuestionError, "must be names joined by"),
        ("released ~ + colour", InvalidQuestionError, "must be names joined by"),
        ("released colour", InvalidQuestionError, r"one '~', then at most one '\|'"),
        ("a ~ b ~ c", InvalidQuestionError, r"one '~'"),
        ("a | c ~ b", InvalidQuestionError, r"one '~', then at most one '\|'"),
        ("a ~ b | c | d", InvalidQuestionError, r"at most one '\|'"),
        ("a + b ~ c", InvalidQuestionError, r"one attribute left of '~' \(the outcome or A\), got \['a', 'b'\]"),
        ("a ~ b + c | d", InvalidQuestionError, r"a model \(two or more predictors\) takes no '\|'"),
        ("released ~ colour * employed", InvalidQuestionError, r"unexpected '\*' at position 18"),
        ("released ~ 3colour", InvalidQuestionError, r"unexpected '3colour' at position 11"),
        ("released ~ `unclosed", InvalidQuestionError, "unexpected '`unclosed'"),
        ("released ~ colour | released", RepeatedAttributeError, r"names attribute 'released' twice"),
        ("y ~ x + x", RepeatedAttributeError, "names attribute 'x' twice"),
    ],
)
def test_every_malformed_question_names_what_is_wrong(text: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        parse_question(text)


def test_a_question_built_by_hand_is_checked_too() -> None:
    with pytest.raises(InvalidQuestionError, match="names one attribute right of '~'"):
        Question("a", ("b", "c"))
    with pytest.raises(InvalidQuestionError, match="a model names two or more predictors"):
        Question("a", ("b",), kind="model")
    with pytest.raises(InvalidQuestionError, match="kind is one of"):
        Question("a", ("b",), kind="regression")
    with pytest.raises(InvalidQuestionError, match="without backticks"):
        Question("a", ("b`",))


def test_against_the_schemas_an_unknown_attribute_lists_those_there_are() -> None:
    have = r"\['released', 'colour', 'employed', 'citizen', 'hours per week', 'one'\]"
    with pytest.raises(UnknownAttributeError, match=rf"no attribute 'salary' in the schemas: they have {have}"):
        parse_question("salary ~ colour", [ALICE, BOB])
    with pytest.raises(UnknownAttributeError, match="no attribute 'age'"):
        check_questions(["released ~ colour | age"], [ALICE, BOB])
    with pytest.raises(TooFewLevelsError, match="attribute 'one' has 1 level"):
        check_questions(["released ~ one"], [ALICE, BOB])
    assert parse_question("released ~ citizen | one", [ALICE, BOB]).given == ("one",)  # a 1-level stratum is fine


def test_check_questions_notes_a_question_one_curator_could_answer_alone() -> None:
    notes = check_questions(["released ~ colour", "released ~ citizen | employed", "employed ~ citizen"],
                            [ALICE, BOB])  # fmt: skip
    assert notes == (
        "released ~ colour: all its attributes are at curator 'alice': that curator could answer it alone, "
        "without a release",
        "employed ~ citizen: all its attributes are at curator 'bob': that curator could answer it alone, "
        "without a release",
    )
    with pytest.raises(InvalidQuestionError, match="asked twice"):
        check_questions(["released ~ colour", "released~colour"], [ALICE, BOB])
    with pytest.raises(InvalidQuestionError, match="at least one question"):
        check_questions([], [ALICE, BOB])
    twice = CuratorSchema("carol", (Attribute("colour", ("x", "y")),))
    with pytest.raises(RepeatedAttributeError, match="'colour' is in more than one schema"):
        attribute_index([ALICE, twice])


def test_public_shares_are_checked_and_merged_with_the_levels() -> None:
    assert check_shares("a", [0.25, 0.75], 2).tolist() == [0.25, 0.75]
    with pytest.raises(ShapeMismatchError, match="3 shares for 2 levels"):
        check_shares("a", [0.2, 0.3, 0.5], 2)
    with pytest.raises(NonFiniteInputError, match="positive, finite and sum to 1"):
        check_shares("a", [0.0, 1.0], 2)
    with pytest.raises(NonFiniteInputError, match="positive, finite and sum to 1"):
        check_shares("a", [0.5, 0.6], 2)
    g = geometric_shares(3, 9.0)
    assert g.sum() == pytest.approx(1.0) and g[0] / g[-1] == pytest.approx(9.0) and g[0] / g[1] == pytest.approx(3.0)
    age = Attribute.binned("age", [0, 10, 20, 30, 40], missing="?")
    shares = np.array([0.1, 0.2, 0.3, 0.35, 0.05])
    merged = merged_shares(age, bin_merge(age, 2), shares)  # runs [0, 20), [20, 40], then "?"
    assert merged.tolist() == pytest.approx([0.3, 0.65, 0.05])
    city = Attribute("city", ("a", "b", "c"), groups=(("north", ("a", "c")), ("south", ("b",))))
    assert merged_shares(city, group_merge(city), np.array([0.2, 0.5, 0.3])).tolist() == pytest.approx([0.5, 0.5])
