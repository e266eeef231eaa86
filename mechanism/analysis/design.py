"""A release designed for the researcher's questions: the tables, each table's disjoint sample
m_t and gamma_t under one total epsilon (docs/privacy.md, Eq. T1) that minimise the worst
question's planned minimum detectable Cramer's V, beside the whole joint. Public inputs only.

``design_search.py`` holds the formulas, the search and its bounds; here its continuous optimum is
made exact: integer m_t (floored, so sum_t m_t <= n; at T = 1 the best integer near the optimum,
as power_plan's best m), gamma_t by ``disjoint_tables.gammas_for_epsilon`` (so ``release_epsilon``
<= epsilon exactly), each question's figures by ``design_search.planned_figures``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from secure_release.mechanism import printing
from secure_release.mechanism.analysis import design_search as ds
from secure_release.mechanism.analysis import power as pw
from secure_release.mechanism.analysis.questions import (
    Question,
    as_question,
    attribute_index,
    check_questions,
    check_shares,
    merged_shares,
)
from secure_release.mechanism.analysis.suggest import MAX_SUGGESTED_EPSILON, attribute_options
from secure_release.mechanism.errors import InvalidLevelError, InvalidQuestionError, UnknownAttributeError
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.primitives.sampling import check_sample_size
from secure_release.mechanism.privacy import accounting, disjoint_tables
from secure_release.mechanism.schema import Attribute, CuratorSchema, attribute_from_dict, attribute_to_dict

FORMAT = "secure-release/design/1"
#: A question whose detectable V exceeds this (or the largest V of its table) gets no useful power.
DEFAULT_MAX_USEFUL_V = 0.5
#: The reference skew of the uniform assumption's warning: every attribute's shares falling
#: geometrically from the largest to 1/SKEW of it (0.1 and 0.9 for two levels).
SKEW = 9.0


@dataclass(frozen=True)
class DesignedTable:
    """One released table: its attributes (schema order), K_t, m_t, gamma_t, keep a_t and the
    indices of the questions it answers."""

    attributes: tuple[str, ...]
    joint_size: int
    m: int
    gamma: float
    keep: float
    questions: tuple[int, ...]


@dataclass(frozen=True)
class QuestionFigures:
    """One question's figures in a release: its table, df, the minimum detectable Cramer's V
    (inf: none is detectable) and how it was found, the power at the design's ``at_v`` (None
    without one), and what to give up if it gets no useful power."""

    question: str
    table: int
    df: int
    detectable_v: float
    method: str
    power_at_v: float | None = None
    advice: tuple[str, ...] = ()


@dataclass(frozen=True)
class DesignedRelease:
    """Tables and per-question figures; ``epsilon`` is Eq. (T1) as charged
    (:func:`~mechanism.privacy.disjoint_tables.release_epsilon`), ``sequential_epsilon`` Eq. (T3)."""

    tables: tuple[DesignedTable, ...]
    figures: tuple[QuestionFigures, ...]
    epsilon: float
    sequential_epsilon: float

    @property
    def worst_v(self) -> float:
        return max(f.detectable_v for f in self.figures)


def _release_dict(r: DesignedRelease) -> dict[str, Any]:
    return {"epsilon": r.epsilon, "sequential_epsilon": r.sequential_epsilon,
            "tables": [{"attributes": list(t.attributes), "joint_size": t.joint_size, "m": t.m, "gamma": t.gamma,
                        "keep": t.keep, "questions": list(t.questions)} for t in r.tables],
            "questions": [{"question": f.question, "table": f.table, "df": f.df,
                           "detectable_v": f.detectable_v if math.isfinite(f.detectable_v) else None,
                           "method": f.method, "power_at_v": f.power_at_v, "advice": list(f.advice)}
                          for f in r.figures]}  # fmt: skip


def _release_from(d: Mapping[str, Any]) -> DesignedRelease:
    tables = tuple(DesignedTable(tuple(t["attributes"]), int(t["joint_size"]), int(t["m"]), float(t["gamma"]),
                                 float(t["keep"]), tuple(t["questions"])) for t in d["tables"])
    v = [math.inf if f["detectable_v"] is None else float(f["detectable_v"]) for f in d["questions"]]
    figures = tuple(QuestionFigures(f["question"], int(f["table"]), int(f["df"]), x, f["method"], f["power_at_v"],
                                    tuple(f["advice"])) for f, x in zip(d["questions"], v, strict=True))
    return DesignedRelease(tables, figures, float(d["epsilon"]), float(d["sequential_epsilon"]))  # fmt: skip


@dataclass(frozen=True)
class Design:
    """The designed ``release`` beside the ``whole_joint`` at the same epsilon, for ``questions``
    (canonical texts) on ``schemas``, with every input, the assumption, the search and notes."""

    n: int
    epsilon: float
    alpha: float
    power: float
    at_v: float | None
    max_useful_v: float
    schemas: tuple[CuratorSchema, ...]
    marginals: tuple[tuple[str, tuple[float, ...]], ...] | None
    questions: tuple[str, ...]
    release: DesignedRelease
    whole_joint: DesignedRelease
    assumption: str
    search: str
    notes: tuple[str, ...] = ()
    format: str = FORMAT

    # ------------------------------------------------------------------------ the record
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (inf as None), versioned by ``format``; :meth:`from_dict` reads it back."""
        return {
            "format": self.format, "n": self.n, "epsilon": self.epsilon, "alpha": self.alpha, "power": self.power,
            "at_v": self.at_v, "max_useful_v": self.max_useful_v,
            "schemas": [{"curator": s.name, "attributes": [attribute_to_dict(a) for a in s.attributes]}
                        for s in self.schemas],
            "marginals": None if self.marginals is None else {k: list(v) for k, v in self.marginals},
            "questions": list(self.questions), "release": _release_dict(self.release),
            "whole_joint": _release_dict(self.whole_joint), "assumption": self.assumption, "search": self.search,
            "notes": list(self.notes),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Design:
        """The :class:`Design` :meth:`to_dict` wrote; a named error for another format."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise InvalidQuestionError(f"not a design of format {FORMAT!r}: got {got!r}")
        marg = data["marginals"]
        return cls(
            int(data["n"]), float(data["epsilon"]), float(data["alpha"]), float(data["power"]), data["at_v"],
            float(data["max_useful_v"]),
            tuple(CuratorSchema(s["curator"], tuple(attribute_from_dict(a) for a in s["attributes"]))
                  for s in data["schemas"]),
            None if marg is None else tuple((k, tuple(float(x) for x in v)) for k, v in marg.items()),
            tuple(data["questions"]), _release_from(data["release"]), _release_from(data["whole_joint"]),
            data["assumption"], data["search"], tuple(data["notes"]),
        )  # fmt: skip

    def canonical_json(self) -> bytes:
        """:meth:`to_dict` as canonical JSON (sorted keys, no spaces): the bytes a curator sends
        the researcher with its key, and what :meth:`digest` hashes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    def digest(self) -> str:
        """SHA-256 of :meth:`canonical_json`: every party checks it runs the same design."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

    def planned_tables(self) -> list[tuple[tuple[str, ...], int, float]]:
        """(attributes, m_t, gamma_t) of each designed table, as planned for :attr:`n` records
        (``protocol.tables.layouts_for`` rescales them to the aligned n)."""
        return [(t.attributes, t.m, t.gamma) for t in self.release.tables]

    def to_json(self) -> str:
        """The design file's text (indented JSON of :meth:`to_dict`); ``infra.designfile`` writes
        it for every curator to run with (``--design FILE``)."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Design:
        """The design in a design file's text; a named error for anything else."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidQuestionError(f"not a design: the text is not JSON ({exc})") from None
        return cls.from_dict(data)

    # ----------------------------------------------------------------------- reading it
    def blocks(self) -> tuple[printing.Block, printing.Block]:
        """The tables, then the questions (design beside whole joint), as two printed blocks."""
        r, j = self.release, self.whole_joint
        rows = [(str(i + 1), ", ".join(t.attributes), str(t.joint_size), str(t.m), printing.sig(t.gamma),
                 printing.sig(t.keep), ", ".join(f"Q{q + 1}" for q in t.questions)) for i, t in enumerate(r.tables)]
        w = j.tables[0]
        rows.append(("joint", "(every attribute)", str(w.joint_size), str(w.m), printing.sig(w.gamma),
                     printing.sig(w.keep), "baseline"))  # fmt: skip
        tables = printing.Block(
            f"Release design: {len(self.questions)} question(s) in {len(r.tables)} table(s)",
            lines=(f"data:  n = {self.n}, epsilon = {self.epsilon:g}; charged (Eq. T1) {printing.sig(r.epsilon, 6)}, "
                   f"sequential (Eq. T3) {printing.sig(r.sequential_epsilon, 6)}; whole joint "
                   f"{printing.sig(j.epsilon, 6)}", f"assumes: {self.assumption}"),
            header=("table", "attributes", "K", "m", "gamma", "keep a", "answers"), rows=tuple(rows), align="llrrrrl",
            notes=(f"search: {self.search}",),
        )  # fmt: skip
        head = ["Q", "question", "table", "df", "V design", "V joint", "gain"]
        if self.at_v is not None:
            head += [f"power@{self.at_v:g}", "joint"]
        qrows = []
        for i, (f, g) in enumerate(zip(r.figures, j.figures, strict=True)):
            row = [f"Q{i + 1}", f.question, str(f.table + 1), str(f.df), _v(f.detectable_v) + "*" * bool(f.advice),
                   _v(g.detectable_v), _gain(g.detectable_v, f.detectable_v)]
            if self.at_v is not None:
                row += ["" if p is None else printing.fixed(p, 3) for p in (f.power_at_v, g.power_at_v)]
            qrows.append(tuple(row))
        notes = [f"Q{i + 1}: V {f.method}" for i, f in enumerate(r.figures) if f.method != "asymptotic"]
        notes += [f"Q{i + 1}: no useful power (*); " + "; ".join(f.advice) for i, f in enumerate(r.figures) if f.advice]
        questions = printing.Block(
            "Smallest Cramer's V each question's test detects",
            lines=(f"with probability {self.power:g} at level {self.alpha:g}; 'none': no useful power (V above "
                   f"{self.max_useful_v:g} or the table's largest)",),
            header=tuple(head), rows=tuple(qrows), align="ll" + "r" * (len(head) - 2), notes=(*notes, *self.notes),
        )  # fmt: skip
        return tables, questions

    def __str__(self) -> str:
        return "\n\n".join(b.text() for b in self.blocks())

    def _repr_html_(self) -> str:
        return "\n".join(b.html() for b in self.blocks())

    def __repr__(self) -> str:
        r = self.release
        text = (f"{len(self.questions)} question(s) in {len(r.tables)} table(s): worst detectable V {_v(r.worst_v)} "
                f"(whole joint {_v(self.whole_joint.worst_v)}), n = {self.n}, epsilon = {self.epsilon:g}")
        return printing.short_repr("Design", text)


def _v(v: float) -> str:
    return printing.fixed(v, 3) if math.isfinite(v) else "none"


def _gain(joint: float, designed: float) -> str:
    if not math.isfinite(designed):
        return ""
    return f"{joint / designed:.1f}x" if math.isfinite(joint) else "only here"


# ------------------------------------------------------------------------------ the design
def _check_v(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value <= 1.0:
        raise InvalidLevelError(f"{name} is a Cramer's V in (0, 1], got {value!r}")
    return float(value)


def _inputs(
    schemas: Sequence[CuratorSchema], questions: Sequence[Question | str],
    marginals: Mapping[str, Sequence[float]] | None, alpha: float, power: float,
) -> tuple[list[Question], tuple[str, ...], dict[str, Attribute], dict[str, ds.FloatArray], list[ds.QuestionNeed]]:
    parsed = [as_question(q) for q in questions]
    notes = check_questions(parsed, schemas)
    index = {name: attr for name, (_, attr) in attribute_index(schemas).items()}
    shares: dict[str, ds.FloatArray] = {}
    for name, values in (marginals or {}).items():
        if name not in index:
            raise UnknownAttributeError(f"marginal shares for {name!r}: no such attribute; the schemas have "
                                        f"{list(index)}")  # fmt: skip
        shares[name] = check_shares(name, values, index[name].size)
    levels = {name: a.size for name, a in index.items()}
    return parsed, notes, index, shares, [ds.question_need(q, levels, shares, alpha, power) for q in parsed]


def _integers(
    n: int, epsilon: float, split: ds.Split, needs: Sequence[ds.QuestionNeed]
) -> tuple[list[int], tuple[float, ...]]:
    """Integer m_t and exact gamma_t (module text)."""
    if len(split.tables) == 1:
        K, members = split.sizes[0], split.tables[0][1]

        def score(m: int) -> float:
            keep = np.asarray(pw.keep_probability(n, m, K, epsilon))
            return m * min(float(needs[i].rate(keep, exact=True)) for i in members)

        lo, hi = max(1, math.floor(split.fractions[0] * n / 1.25)), min(n, math.ceil(split.fractions[0] * n * 1.25))
        while hi - lo > 2:  # ternary search on the exact score (unimodal in m)
            left, right = lo + (hi - lo) // 3, hi - (hi - lo) // 3
            lo, hi = (lo, right) if score(left) >= score(right) else (left, hi)
        cands = set(range(lo, hi + 1)) | {pw.power_maximizing_sample_size(n, K, epsilon)}
        m = [max(sorted(cands), key=score)]
        return m, disjoint_tables.gammas_for_epsilon(n, m, epsilon)
    m = [max(1, math.floor(q * n)) for q in split.fractions]
    while sum(m) > n:
        m[int(np.argmax(m))] -= 1
    weights = [float(x / split.excess.max()) for x in split.excess]
    return m, disjoint_tables.gammas_for_epsilon(n, m, epsilon, weights)


def _release(n: int, epsilon: float, split: ds.Split, needs: Sequence[ds.QuestionNeed], parsed: Sequence[Question],
             order: Sequence[str], alpha: float, power: float, at_v: float | None, replicates: int,
             seed: int) -> DesignedRelease:  # fmt: skip
    m, gammas = _integers(n, epsilon, split, needs)
    tables, figures = [], [QuestionFigures("", 0, 0, math.inf, "")] * len(needs)
    for t, ((attrs, members), K, mt, g) in enumerate(zip(split.tables, split.sizes, m, gammas, strict=True)):
        keep = PramChannel(g, K).keep
        tables.append(DesignedTable(tuple(a for a in order if a in attrs), K, mt, g, keep, members))
        for i in members:
            v, how, p = ds.planned_figures(needs[i], mt, keep, alpha, power, at_v, replicates, seed)
            figures[i] = QuestionFigures(parsed[i].text, t, needs[i].df, v, how, p)
    return DesignedRelease(tuple(tables), tuple(figures), disjoint_tables.release_epsilon(n, m, gammas),
                           disjoint_tables.sequential_epsilon(n, m, gammas))  # fmt: skip


def design(
    n: int, schemas: Sequence[CuratorSchema], epsilon: float, questions: Sequence[Question | str],
    marginals: Mapping[str, Sequence[float]] | None = None, alpha: float = pw.DEFAULT_ALPHA,
    power: float = pw.DEFAULT_POWER, at_v: float | None = None, max_useful_v: float = DEFAULT_MAX_USEFUL_V,
    replicates: int = pw.DEFAULT_REPLICATES, seed: int = pw.DEFAULT_SEED,
) -> Design:  # fmt: skip
    """The :class:`Design` of a release of n aligned records on the curators' ``schemas`` at
    total ``epsilon`` for ``questions`` (texts or :class:`Question`): the tables, m_t and gamma_t
    that minimise the worst question's detectable V (module text; the search and its bounds in
    ``design_search.py``), beside the whole joint. ``marginals``: public expected shares per
    attribute (else uniform, and the design says how optimistic that can be); ``at_v``: a
    Cramer's V at which to report each question's power."""
    check_sample_size(n, 1)
    eps = accounting.check_epsilon(epsilon)
    alpha, power = pw.check_probability("alpha", alpha), pw.check_probability("power", power)
    at, top = None if at_v is None else _check_v("at_v", at_v), _check_v("max_useful_v", max_useful_v)
    pw.required_noncentrality(1, alpha, power)  # power > alpha
    parsed, notes, index, shares, needs = _inputs(schemas, questions, marginals, alpha, power)
    levels = {name: a.size for name, a in index.items()}
    sets, exhaustive = ds.table_sets(needs)

    def evaluate(tables: tuple[ds.Table, ...]) -> float:
        return ds.solve(n, eps, needs, levels, tables).z

    scores = {tables: evaluate(tables) for tables in sets}
    if not exhaustive:
        ds.greedy(scores, evaluate, needs)
    whole = ((frozenset(levels), tuple(range(len(needs)))),)
    scores.setdefault(whole, evaluate(whole))
    best = max(scores, key=lambda k: scores[k])
    split = ds.solve(n, eps, needs, levels, best, refine=True)
    order = list(index)
    release = _release(n, eps, split, needs, parsed, order, alpha, power, at, replicates, seed)
    joint_split = ds.solve(n, eps, needs, levels, whole, refine=True)
    joint = _release(n, eps, joint_split, needs, parsed, order, alpha, power, at, replicates, seed)
    figures = []
    for i, f in enumerate(release.figures):
        limit = min(top, pw.max_uniform_cramers_v(needs[i].rows, needs[i].cols))
        if f.detectable_v > limit:
            f = replace(f, advice=_advice(n, eps, parsed, index, shares, needs, levels, best, i, limit, alpha, power))
        figures.append(f)
    release = replace(release, figures=tuple(figures))
    how = "every partition of the questions into blocks sharing attributes" if exhaustive else "greedy merging"
    search = (f"{len(scores)} table sets ({how}; at most {ds.MAX_TABLE_SETS}) and the whole joint; per set a "
              f"closed-form split of n and epsilon on grids of {ds.MU_POINTS} multipliers and {ds.RHO_POINTS} gammas "
              "per table, refined for the best")
    return Design(n, eps, alpha, power, at, top, tuple(schemas),
                  None if not shares else tuple((k, tuple(float(x) for x in v)) for k, v in shares.items()),
                  tuple(q.text for q in parsed), release, joint, _assumption(shares, needs, release), search,
                  notes)  # fmt: skip


def _assumption(shares: Mapping[str, ds.FloatArray], needs: Sequence[ds.QuestionNeed], release: DesignedRelease) -> str:
    """What the figures assume about the marginal shares, and how optimistic uniform ones can be."""
    given = f"public shares for {', '.join(shares)} (the worst direction of dependence)" if shares else ""
    factor = max(ds.skew_factor(needs[i], t.keep, SKEW) for t in release.tables for i in t.questions)
    if shares and factor <= 1.0 + 1e-9:
        return given
    uniform = ("uniform shares for the other attributes" if shares
               else "uniform marginals (every level of an attribute equally common)")
    return (f"{given + '; ' if given else ''}{uniform}; if every attribute's shares fell geometrically to 1/{SKEW:g} "
            f"of its largest (0.1 and 0.9 for two levels), detectable V would be up to {factor:.2f}x larger")


def _advice(
    n: int, eps: float, parsed: Sequence[Question], index: Mapping[str, Attribute], shares: Mapping[str, ds.FloatArray],
    needs: Sequence[ds.QuestionNeed], levels: dict[str, int], tables: tuple[ds.Table, ...], i: int, limit: float,
    alpha: float, power: float,
) -> tuple[str, ...]:  # fmt: skip
    """What question i could give up to reach V <= ``limit`` (asymptotic, the same table set):
    more epsilon, a coarser attribute (suggest.attribute_options: groups, merged bins), or itself."""

    def v_at(nds: Sequence[ds.QuestionNeed], lv: dict[str, int], e: float) -> float:
        return ds.solve(n, e, nds, lv, tables).question_v(nds, n)[i]

    out = []
    if v_at(needs, levels, MAX_SUGGESTED_EPSILON) <= limit:
        lo, hi = eps, MAX_SUGGESTED_EPSILON
        while hi / lo > 1.001:
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if v_at(needs, levels, mid) <= limit else (mid, hi)
        digits = 2 - math.floor(math.log10(hi))
        out.append(f"more epsilon: {math.ceil(hi * 10**digits) / 10**digits:g} gives it V <= {limit:.3g} (asymptotic)")
    else:
        out.append(f"no epsilon <= {MAX_SUGGESTED_EPSILON:g} gives it V <= {limit:.3g}")
    for name in parsed[i].attributes:  # the finest coarsening that does: V falls as levels merge, so bisect
        options = sorted((o for o in attribute_options(index[name]) if o.kind in ("groups", "bins") and o.size > 1),
                         key=lambda o: -o.size)  # fmt: skip
        lo, hi, found = 0, len(options) - 1, ""
        while lo <= hi:
            mid = (lo + hi) // 2
            option, lv, sh = options[mid], {**levels, name: options[mid].size}, dict(shares)
            if name in sh and option.attribute is not None:
                sh[name] = merged_shares(index[name], option.attribute, sh[name])
            v = v_at([ds.question_need(q, lv, sh, alpha, power) if name in q.attributes else needs[j]
                      for j, q in enumerate(parsed)], lv, eps)  # fmt: skip
            lo, hi, found = (lo, mid - 1, f"merge levels: {option.gives_up} (V {v:.3g})") if v <= limit \
                else (mid + 1, hi, found)  # fmt: skip
        out += [found] if found else []
    if len(parsed) > 1:
        rest = [j for j in range(len(parsed)) if j != i]
        kept = [[rest.index(j) for j in members if j != i] for _, members in tables]
        blocks = [b for b in kept if b]
        smaller = tuple((frozenset().union(*(needs[rest[j]].attributes for j in b)), tuple(b)) for b in blocks)
        worst = ds.solve(n, eps, [needs[j] for j in rest], levels, smaller).worst_v
        out.append(f"drop it: the other questions' worst V becomes {_v(worst)} (asymptotic)")
    return tuple(out)
