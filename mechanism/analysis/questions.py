"""A researcher's questions, stated before a release is designed (``mechanism.analysis.design``).

Three forms, one grammar (``parse_question``)::

    released ~ colour                      independence of two attributes
    released ~ colour | employed + citizen independence given a set of attributes (the strata)
    salary ~ education + sex               a model: an outcome and two or more predictors

A name is a letter or ``_`` followed by letters, digits, ``_``, ``.`` or ``-``; any other name is
written in backticks (```hours per week```). The canonical text (``str(question)``) puts single
spaces around ``~``, ``+`` and ``|`` and backticks only where a name needs them; parsing it gives
the same question back. Order is kept: a model's first predictor is the one whose association
with the outcome the design plans for (given the other predictors), and ``given`` is listed as
written.

What a question needs from a release: a table holding all its attributes (:attr:`Question.attributes`).
What the design plans for it: the test of ``tested`` = (A, B, strata), A independent of B within
every stratum of the strata's joint levels (the researcher's likelihood-ratio test,
``mechanism.analysis.association.independence_test``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import (
    InvalidQuestionError,
    NonFiniteInputError,
    RepeatedAttributeError,
    ShapeMismatchError,
    TooFewLevelsError,
    UnknownAttributeError,
)
from secure_release.mechanism.schema import Attribute, CuratorSchema

FloatArray = npt.NDArray[np.float64]
KINDS = ("independence", "model")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_TOKEN = re.compile(r"\s*(?:(?P<op>[~+|])|`(?P<quoted>[^`]+)`|(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*))")
FORMS = "'A ~ B', 'A ~ B | C + D' or 'Y ~ X1 + X2' (names, or `any name` in backticks)"


def name_text(name: str) -> str:
    """A name as the canonical text writes it: bare when it is a plain name, else in backticks."""
    return name if _NAME.fullmatch(name) else f"`{name}`"


@dataclass(frozen=True)
class Question:
    """One question: ``target`` ~ ``others`` [| ``given``]. ``kind`` "independence" (one other,
    any ``given``) or "model" (two or more others, the predictors; no ``given``)."""

    target: str
    others: tuple[str, ...]
    given: tuple[str, ...] = ()
    kind: str = "independence"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidQuestionError(f"a question's kind is one of {list(KINDS)}, got {self.kind!r}")
        for name in self.attributes:
            if not isinstance(name, str) or not name or "`" in name or name != name.strip():
                raise InvalidQuestionError(f"an attribute name is a non-empty string without backticks or "
                                           f"surrounding spaces, got {name!r}")  # fmt: skip
        if self.kind == "independence" and len(self.others) != 1:
            raise InvalidQuestionError(f"a test of independence names one attribute right of '~', got "
                                       f"{list(self.others)}; two or more make a model")  # fmt: skip
        if self.kind == "model" and (len(self.others) < 2 or self.given):
            raise InvalidQuestionError(f"a model names two or more predictors right of '~' and no '|' (the "
                                       f"predictors are what it is given), got {self.text!r}")  # fmt: skip
        seen: set[str] = set()
        for name in self.attributes:
            if name in seen:
                raise RepeatedAttributeError(f"question {self.text!r} names attribute {name!r} twice; each "
                                             "attribute may appear once")  # fmt: skip
            seen.add(name)

    @property
    def attributes(self) -> tuple[str, ...]:
        """Every attribute named, in order: the table answering the question holds them all."""
        return (self.target, *self.others, *self.given)

    @property
    def tested(self) -> tuple[str, str, tuple[str, ...]]:
        """(A, B, strata): the pair whose independence within the strata the design plans for; a
        model's first predictor against the outcome, given the other predictors."""
        return self.target, self.others[0], (*self.others[1:], *self.given)

    @property
    def text(self) -> str:
        """The canonical form (module text)."""
        right = " + ".join(name_text(n) for n in self.others)
        given = f" | {' + '.join(name_text(n) for n in self.given)}" if self.given else ""
        return f"{name_text(self.target)} ~ {right}{given}"

    def __str__(self) -> str:
        return self.text


def _tokens(text: str) -> list[tuple[str, str]]:
    """(kind, value) pairs: ("op", "~"), ("name", "colour"); a named error at the first bad token."""
    out: list[tuple[str, str]] = []
    at = 0
    while at < len(text.rstrip()):
        found = _TOKEN.match(text, at)
        if found is None or found.end() == at:
            bad = text[at:].strip().split()[0] if text[at:].strip() else text[at:]
            raise InvalidQuestionError(f"question {text!r}: unexpected {bad[:20]!r} at position "
                                       f"{len(text) - len(text[at:].lstrip())}; a question is {FORMS}")  # fmt: skip
        if found.group("op"):
            out.append(("op", found.group("op")))
        else:
            out.append(("name", found.group("quoted") or found.group("name")))
        at = found.end()
    return out


def _names(text: str, side: str, tokens: list[tuple[str, str]]) -> tuple[str, ...]:
    """The names of one side, joined by '+'; a named error if the side is empty or malformed."""
    if not tokens:
        raise InvalidQuestionError(f"question {text!r}: {side} is empty; a question is {FORMS}")
    names = tuple(value for kind, value in tokens[::2] if kind == "name")
    joins = [value for _, value in tokens[1::2]]
    if len(names) != len(tokens[::2]) or any(j != "+" for j in joins) or len(tokens) % 2 == 0:
        raise InvalidQuestionError(f"question {text!r}: {side} must be names joined by '+'; a question is {FORMS}")
    return names


def parse_question(text: str, schemas: Sequence[CuratorSchema] | None = None) -> Question:
    """The :class:`Question` ``text`` states (module text); with ``schemas``, also checked
    against them (:func:`check_question`)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidQuestionError(f"a question is a non-empty text: {FORMS}; got {text!r}")
    tokens = _tokens(text)
    ops = [i for i, (kind, value) in enumerate(tokens) if kind == "op" and value in "~|"]
    tildes = [i for i in ops if tokens[i][1] == "~"]
    bars = [i for i in ops if tokens[i][1] == "|"]
    if len(tildes) != 1 or len(bars) > 1 or (bars and bars[0] < tildes[0]):
        raise InvalidQuestionError(f"question {text!r}: one '~', then at most one '|'; a question is {FORMS}")
    tilde, bar = tildes[0], (bars[0] if bars else len(tokens))
    left = _names(text, "the left side of '~'", tokens[:tilde])
    right = _names(text, "the right side of '~'", tokens[tilde + 1:bar])
    given = _names(text, "the set after '|'", tokens[bar + 1:]) if bars else ()
    if len(left) != 1:
        raise InvalidQuestionError(f"question {text!r}: one attribute left of '~' (the outcome or A), got "
                                   f"{list(left)}")  # fmt: skip
    if len(right) >= 2 and given:
        raise InvalidQuestionError(f"question {text!r}: a model (two or more predictors) takes no '|': write "
                                   "every predictor right of '~'")  # fmt: skip
    question = Question(left[0], right, given, "model" if len(right) >= 2 else "independence")
    if schemas is not None:
        check_question(question, schemas)
    return question


def attribute_index(schemas: Sequence[CuratorSchema]) -> dict[str, tuple[int, Attribute]]:
    """{attribute name: (curator index, attribute)}; a named error if a name is in two schemas."""
    where: dict[str, tuple[int, Attribute]] = {}
    for j, schema in enumerate(schemas):
        for attribute in schema.attributes:
            if attribute.name in where:
                raise RepeatedAttributeError(f"attribute {attribute.name!r} is in more than one schema; names must "
                                             "be unique")  # fmt: skip
            where[attribute.name] = (j, attribute)
    return where


def check_question(question: Question, schemas: Sequence[CuratorSchema]) -> Question:
    """Raise unless every attribute of ``question`` is in ``schemas`` (the message lists those
    there are) and the tested pair has at least two levels each."""
    where = attribute_index(schemas)
    for name in question.attributes:
        if name not in where:
            raise UnknownAttributeError(f"question {question.text!r}: no attribute {name!r} in the schemas: they "
                                        f"have {list(where)}")  # fmt: skip
    a, b, _ = question.tested
    for name in (a, b):
        if where[name][1].size < 2:
            raise TooFewLevelsError(f"question {question.text!r}: attribute {name!r} has {where[name][1].size} "
                                    f"level; a test needs >= 2 on each of {a!r} and {b!r}")  # fmt: skip
    return question


def as_question(question: Question | str) -> Question:
    """A :class:`Question` as it is, a text parsed."""
    return question if isinstance(question, Question) else parse_question(question)


def check_questions(questions: Iterable[Question | str], schemas: Sequence[CuratorSchema]) -> tuple[str, ...]:
    """Check every question against ``schemas`` (:func:`check_question`; at least one question,
    none asked twice) and return the notes: one for each question whose attributes are all at one
    curator (that curator could answer it alone, without a release)."""
    parsed = [as_question(q) for q in questions]
    if not parsed:
        raise InvalidQuestionError(f"a design needs at least one question: {FORMS}")
    seen: set[str] = set()
    notes = []
    where = attribute_index(schemas)
    for question in parsed:
        if question.text in seen:
            raise InvalidQuestionError(f"question {question.text!r} is asked twice; ask each question once")
        seen.add(question.text)
        check_question(question, schemas)
        holders = {where[name][0] for name in question.attributes}
        if len(holders) == 1:
            curator = schemas[holders.pop()].name
            notes.append(f"{question.text}: all its attributes are at curator {curator!r}: that curator could "
                         "answer it alone, without a release")  # fmt: skip
    return tuple(notes)


# -------------------------------------------------------------- public shares of attributes
def check_shares(name: str, values: Sequence[float], levels: int) -> FloatArray:
    """Public expected shares of one attribute: ``levels`` positive finite numbers summing to 1."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size != levels:
        raise ShapeMismatchError(f"marginal shares of {name!r}: {v.size} shares for {levels} levels")
    if not np.all(np.isfinite(v)) or np.any(v <= 0) or abs(float(v.sum()) - 1.0) > 1e-6:
        raise NonFiniteInputError(f"marginal shares of {name!r} must be positive, finite and sum to 1, "
                                  f"got {v.tolist()!r}")  # fmt: skip
    return np.asarray(v / v.sum(), dtype=np.float64)


def geometric_shares(levels: int, skew: float) -> FloatArray:
    """Shares falling geometrically from the largest to 1/``skew`` of it over ``levels`` levels."""
    s = skew ** (-np.arange(levels) / max(levels - 1, 1))
    return np.asarray(s / s.sum(), dtype=np.float64)


def merged_shares(original: Attribute, changed: Attribute, shares: FloatArray) -> FloatArray:
    """The shares of ``changed``, ``original`` with its bins or its categories merged
    (suggest.bin_merge, suggest.group_merge): each new level's share is the sum of its old ones'."""
    if changed.bins is not None and original.bins is not None:
        to = np.searchsorted(np.asarray(changed.bins[1:-1]), np.asarray(original.bins[:-1]), side="right").tolist()
    else:
        group = {c: g for g, (_, members) in enumerate(original.groups or ()) for c in members}
        to = [group[c] for c in original.categories if c != original.missing]
    if original.missing is not None:
        to.append(changed.size - 1)
    return np.asarray(np.bincount(to, weights=shares, minlength=changed.size), dtype=np.float64)
