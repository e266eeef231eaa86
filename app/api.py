"""The notebook API: plan a release, run one in memory from DataFrames, simulate, load results.

    >>> from secure_release import api
    >>> p = api.plan(n=45222, alphabet=[6, 4], epsilon=0.5)
    >>> p.m, round(p.guarantee["epsilon"], 6), p.guarantee["delta"]
    (1472, 0.5, 0.0)

A release designed for the researcher's questions: ``d = api.design(n, schemas, epsilon,
["salary ~ education | sex"])`` picks tables and each one's disjoint sample; ``api.release(tables,
schemas, epsilon, design=d)`` releases them, and its Result answers ``questions()``, lists
``tables()`` and reads every analysis on the table that holds its attributes.

Every result converts to DataFrames (pandas by default, polars with ``backend="polars"``;
``pip install 'secure-release[notebook]'``). The release itself needs neither: it runs on numpy
(:func:`secure_release.mechanism.protocol.in_memory.run_release`). ``docs/tutorial.md`` walks through it.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release import analysis
from secure_release.curator.columnar import BadRowsError as BadRowsError  # the refusal of a bad table
from secure_release.frames import (
    Backend,
    TableInputError,
    column_names,
    require,
    text_columns,
    to_arrow,
    to_frame,
)
from secure_release.mechanism.analysis.design import Design
from secure_release.mechanism.analysis.design import design as _design
from secure_release.mechanism.analysis.power import PowerPlan, power_plan
from secure_release.mechanism.analysis.suggest import DEFAULT_LIMIT, SuggestionReport, suggest_changes
from secure_release.mechanism.cells import number_key
from secure_release.mechanism.errors import (
    DesignMismatchError,
    MultiTableResultError,
    NoTableHoldsError,
    SecureReleaseError,
)
from secure_release.mechanism.estimation import marginals
from secure_release.mechanism.estimation.report import TABLES_FORMAT, ReleaseReport, TablesReport, build_report
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.guarantee import (
    guarantee_statement,
    plan_report,
    privacy_guarantee,
    tables_guarantee,
    utility_check,
)
from secure_release.mechanism.privacy.plan import ReleasePlan, plan_release
from secure_release.mechanism.protocol.in_memory import CuratorTable, run_release, run_tables_release
from secure_release.mechanism.protocol.tables import tables_report
from secure_release.mechanism.schema import (
    Attribute,
    CuratorSchema,
    JointSchema,
    attribute_from_dict,
    attribute_to_dict,
)
from secure_release.mechanism.simulation.monte_carlo import ESTIMATORS, sweep

FloatArray = npt.NDArray[np.float64]
CODEBOOK_WARNING = (
    "DRAFT SCHEMA: the category lists were read from the private data. Replace them with the "
    "categories of a public codebook before any release: a category that appears only in the "
    "private data (a rare value, a typo, a new code) is itself disclosive, and the schema is shared "
    "with every party."
)


# ---------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Plan:
    """A release plan with its privacy guarantee and a utility check (:func:`plan`)."""

    plan: ReleasePlan

    @property
    def n(self) -> int:
        return self.plan.n

    @property
    def m(self) -> int:
        return self.plan.m

    @property
    def epsilon(self) -> float:
        return self.plan.epsilon

    @property
    def gamma(self) -> float:
        return self.plan.gamma

    @property
    def K(self) -> int:  # noqa: N802 - the paper's name
        return self.plan.joint_size

    @property
    def guarantee(self) -> dict[str, Any]:
        """The guarantee in standard form (:func:`~secure_release.mechanism.privacy.guarantee.privacy_guarantee`)."""
        return privacy_guarantee(self.plan)

    @property
    def utility(self) -> dict[str, Any]:
        """Predicted RMSE against the typical cell share 1/K, with a suggestion when too noisy."""
        return utility_check(self.plan)

    def to_dict(self) -> dict[str, Any]:
        """``secure-release plan --json``: the plan's figures, ``guarantee`` and ``utility``."""
        return {**plan_report(self.plan), "utility": self.utility}


def plan(n: int, alphabet: Sequence[int], epsilon: float, m: int | None = None) -> Plan:
    """Plan a release of ``n`` aligned records, one alphabet size per curator; m defaults to m*.
    Warns (``UserWarning``) when the predicted RMSE exceeds the typical cell share 1/K."""
    p = Plan(plan_release(n, alphabet, epsilon, m))
    message = p.utility["message"]
    if message:
        warnings.warn(message, UserWarning, stacklevel=2)
    return p


def suggest(
    n: int, schemas: Sequence[CuratorSchema | Mapping[str, Any] | str | Path], epsilon: float,
    target: float | None = None, limit: int = DEFAULT_LIMIT,
) -> SuggestionReport:
    """What to give up when the plan says noise (``secure-release plan --suggest``): the smallest
    changes of the curators' schemas (files, schema dicts or :class:`CuratorSchema`, in release
    order) that bring the predicted per-cell RMSE at m* under ``target`` (default: half the typical
    share, 1/(2K) of each changed K): drop attributes, merge adjacent bins, merge categories into a
    schema's public ``"groups"``; and the epsilon that would suffice with the schemas unchanged.
    Public inputs only, never the data. Sorted by what each keeps; ``.to_dict()`` is the JSON of
    ``plan --suggest --json``; each suggestion's ``schemas`` are the changed schemas."""
    parsed = [_as_spec(f"curator{j + 1}", spec, None)[0] for j, spec in enumerate(schemas)]
    return suggest_changes(parsed, n, epsilon, target, limit)


def power(
    n: int,
    schemas: Sequence[CuratorSchema | Mapping[str, Any] | str | Path],
    epsilon: float,
    a: str,
    b: str,
    m: int | None = None,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
) -> PowerPlan:
    """The power of the test of association of attributes ``a`` and ``b`` before the budget is
    spent (``secure-release plan --power A,B``), from public inputs only: the curators' schemas
    (files, schema dicts or :class:`CuratorSchema`, in release order), n and epsilon. Gives
    ``min_detectable_cramers_v`` (the smallest Cramer's V the test finds with probability ``power``
    at level ``alpha``) at m (default m*), ``best_m`` (the m that minimises it) with the V there,
    and the V at m*, which minimises the error of the whole joint: the ``note`` says when the
    two differ and by how much. Uniform marginals are assumed (``assumption`` says so)."""
    parsed = [_as_spec(f"curator{j + 1}", spec, None)[0] for j, spec in enumerate(schemas)]
    return power_plan(n, parsed, epsilon, a, b, m, alpha=alpha, power=power)


# -------------------------------------------------------------------------------------- schema
def schema(curator: str, attributes: Mapping[str, Sequence[str]]) -> CuratorSchema:
    """A curator's schema from ``{attribute: [categories, in code order]}`` (from a public codebook)."""
    return CuratorSchema(curator, tuple(Attribute(a, tuple(str(c) for c in cats)) for a, cats in attributes.items()))


def schema_to_dict(s: CuratorSchema, id_column: str = "id") -> dict[str, Any]:
    """The schema file format the curator CLI reads (docs/own-data.md)."""
    return {
        "curator": s.name,
        "id_column": id_column,
        "attributes": [attribute_to_dict(a) for a in s.attributes],
    }


def load_schema(path: str | Path) -> CuratorSchema:
    """A curator's schema JSON file (docs/own-data.md)."""
    from secure_release.curator.table import load_schema as _load

    return _load(path).schema


#: A numeric column with more distinct values than this needs public bins (``ranges``).
DRAFT_MAX_NUMERIC_CATEGORIES = 12
#: The missing label a draft gives a column with empty cells.
DRAFT_MISSING_LABEL = "missing"


class DraftNeedsRangeError(TableInputError):
    """A numeric column has too many distinct values to list as categories, and no public range
    was given to bin it (``--range COLUMN=LOW:HIGH``)."""


def _is_number(values: npt.NDArray[np.str_]) -> bool:
    try:
        numbers = values.astype(np.float64)
    except ValueError:
        return False
    return bool(values.size) and bool(np.all(np.isfinite(numbers)))


def _natural_order(values: Sequence[str]) -> list[str]:
    """Numbers numerically (when every value is one), else text order."""
    arr = np.asarray(list(values), dtype=str)
    if _is_number(arr):
        return [str(v) for v in arr[np.argsort(arr.astype(np.float64), kind="stable")]]
    return sorted(values)


#: Bins a ``ranges`` entry without its own count gets (``draft_schema(bins=...)``, ``--bins``).
DRAFT_DEFAULT_BINS = 4
#: Readable edges: every inner edge within this fraction of a bin's width of its exact value.
EDGE_ROUNDING_TOLERANCE = Fraction(1, 100)


def equal_width_edges(low: float, high: float, bins: int) -> list[float]:
    """``bins`` equal-width bins over the public range [low, high], written readably.

    The exact edges are e_i = low + i (high - low) / bins (in exact rational arithmetic from the
    shortest decimal text of ``low`` and ``high``). ``low`` and ``high`` are kept as given; the
    inner edges are rounded to d decimals, with d the fewest (0, 1, 2, ...) that keeps every inner
    edge within 1% of a bin's width of its exact value (so every bin's width is within 2% of
    equal and the edges stay strictly increasing), or d + 1 when that writes every edge exactly.
    17:42 at 5 bins gives 17, 22, 27, 32, 37, 42; at 4, 23.25, 29.5, 35.75 (exact at two
    decimals, one more than the 23.2 that is within 1%); 0:1 at 3 gives 0, 0.33, 0.67, 1 (0.3
    would be 10% of a width off). If no d up to 17 does, the nearest floats of the exact edges."""
    if not (np.isfinite(low) and np.isfinite(high) and high > low):
        raise TableInputError(f"a range needs finite LOW < HIGH, got {low}:{high}")
    if isinstance(bins, bool) or not isinstance(bins, int | np.integer) or bins < 1:
        raise TableInputError(f"a range needs a whole number of bins >= 1, got {bins!r}")
    bins = int(bins)
    lo, hi = Fraction(repr(float(low))), Fraction(repr(float(high)))
    width = (hi - lo) / bins
    exact = [lo + width * i for i in range(1, bins)]

    def rounded(decimals: int) -> list[Fraction]:
        return [Fraction(round(e * 10**decimals), 10**decimals) for e in exact]

    for decimals in range(18):
        if all(abs(r - e) <= EDGE_ROUNDING_TOLERANCE * width for r, e in zip(rounded(decimals), exact, strict=True)):
            if rounded(decimals + 1) == exact:
                decimals += 1
            edges = [float(low), *(float(r) for r in rounded(decimals)), float(high)]
            if bool(np.all(np.diff(edges) > 0)):
                return edges
    return [float(low), *(float(e) for e in exact), float(high)]


def _range_edges(name: str, spec: Sequence[Any], bins: int) -> list[float]:
    """The edges of column ``name``'s range: ``(low, high)`` at the default ``bins``, or ``(low,
    high, count)`` at its own count (:func:`equal_width_edges`, whose refusal names the column)."""
    if len(spec) not in (2, 3):
        raise TableInputError(f"the range of {name!r} is (LOW, HIGH) or (LOW, HIGH, BINS), got {tuple(spec)!r}")
    try:
        return equal_width_edges(float(spec[0]), float(spec[1]), spec[2] if len(spec) == 3 else bins)
    except (TableInputError, TypeError, ValueError) as exc:
        raise TableInputError(f"the range of {name!r}: {exc}") from None


def draft_schema(
    table: Any, curator: str, id_column: str = "id", attributes: Sequence[str] | None = None, warn: bool = True,
    ranges: Mapping[str, tuple[float, float] | tuple[float, float, int]] | None = None,
    bins: int = DRAFT_DEFAULT_BINS, codebook: Mapping[str, Sequence[str]] | None = None,
    missing_tokens: Sequence[str] = (),
) -> dict[str, Any]:
    """A DRAFT schema dict from a table. A column in ``ranges`` is binned at equal-width bins of
    that public range (never the data's own minimum or maximum), edges from
    :func:`equal_width_edges`: ``(low, high, count)`` gives its own count of bins, ``(low, high)``
    takes ``bins``; a numeric column with
    more than :data:`DRAFT_MAX_NUMERIC_CATEGORIES` distinct values and no range raises
    :class:`DraftNeedsRangeError` naming it. Categories follow ``codebook`` (public, in its order)
    when it lists the column, else a natural order (numbers numerically); empty cells give a
    ``missing`` entry (with a warning), never a category, and so do ``missing_tokens`` (listed as
    the entry's ``missing_tokens`` where they occur). Warns that categories read from the data must
    be replaced by a public codebook's (:data:`CODEBOOK_WARNING`)."""
    names = list(attributes) if attributes is not None else [c for c in column_names(table) if c != id_column]
    if not names:
        raise TableInputError(f"no attribute columns besides the id column {id_column!r}")
    ranges, codebook = dict(ranges or {}), dict(codebook or {})
    unknown = sorted((set(ranges) | set(codebook)) - set(names))
    if unknown:
        raise TableInputError(f"--range/--codebook name column(s) {unknown} that are not attributes: {names}")
    cols = _draft_columns(table, names, f"curator {curator}")
    entries: list[dict[str, Any]] = []
    for name in names:
        values = cols[name]
        tokens = sorted(set(np.unique(values).tolist()) & set(missing_tokens))
        empty = (values == "") | np.isin(values, tokens)
        present = values[~empty]
        entry: dict[str, Any] = {"name": name}
        if name in ranges:
            edges = _range_edges(name, ranges[name], bins)
            entry["bins"] = [int(e) if e.is_integer() else e for e in edges]
        elif name in codebook:
            entry["categories"] = [str(c) for c in codebook[name]]
        else:
            distinct = np.unique(present).tolist()
            if _is_number(present):  # "3.0" (a CSV pandas wrote) drafts as 3, as its DataFrame does (cell rule 7)
                distinct = sorted({number_key(v) or v for v in distinct})
            if _is_number(present) and len(distinct) > DRAFT_MAX_NUMERIC_CATEGORIES:
                raise DraftNeedsRangeError(
                    f"column {name!r} is numeric with {len(distinct)} distinct values: give its public range "
                    f"(--range {name}=LOW:HIGH [--bins N]); bins are never drawn from the data's own minimum "
                    "or maximum, which would disclose them"
                )
            entry["categories"] = _natural_order(distinct)
        if bool(empty.any()):
            label = DRAFT_MISSING_LABEL
            while label in entry.get("categories", []):
                label = f"({label})"
            entry["missing"] = label
            if tokens:
                entry["missing_tokens"] = tokens
            warnings.warn(f"column {name!r} has {int(empty.sum())} empty cell(s): drafted as \"missing\": "
                          f"{label!r} (a public category of its own), never as an empty category", UserWarning,
                          stacklevel=2)  # fmt: skip
        entries.append(entry)
    if warn:
        warnings.warn(CODEBOOK_WARNING, UserWarning, stacklevel=2)
    return {"curator": curator, "id_column": id_column, "attributes": entries}


def _draft_columns(table: Any, names: Sequence[str], what: str) -> dict[str, npt.NDArray[np.str_]]:
    """The columns as the one cell rule reads them (trimmed text, a missing cell ""), as numpy
    text whose width numpy takes from the values themselves."""
    return {name: np.asarray(text.to_numpy(zero_copy_only=False), dtype=object).astype(str)
            for name, text in text_columns(table, names, what).items()}


def _as_spec(
    curator: str, spec: CuratorSchema | Mapping[str, Any] | str | Path, id_column: str | None
) -> tuple[CuratorSchema, str]:
    """A curator's schema and its id column: the schema's ``id_column`` (a file or dict that
    names one); ``id_column`` only fills in a schema without one (default "id"), and a schema
    that names another raises :class:`IdColumnConflictError` naming both."""
    declared: str | None = None
    if isinstance(spec, CuratorSchema):
        parsed = spec
    elif isinstance(spec, str | Path):
        try:
            data = json.loads(Path(spec).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        declared = data.get("id_column") if isinstance(data, dict) else None
        parsed = load_schema(spec)
    elif "attributes" in spec and isinstance(spec["attributes"], list):
        attrs = tuple(attribute_from_dict(a) for a in spec["attributes"])
        parsed = CuratorSchema(str(spec.get("curator", curator)), attrs)
        declared = spec.get("id_column")
    else:
        parsed = schema(curator, spec)
    if declared is not None and id_column is not None and str(declared) != id_column:
        raise IdColumnConflictError(
            f"curator {curator}: the schema says the ids are in column {str(declared)!r} (its \"id_column\"), "
            f"but id_column={id_column!r} was given; drop the keyword or make them agree"
        )
    return parsed, str(declared) if declared is not None else (id_column or "id")


class IdColumnConflictError(TableInputError):
    """The ``id_column=`` keyword names another column than the curator's schema does."""


# ------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Result:
    """A released estimate (:class:`ReleaseReport`) with DataFrame views, marginals and plots.

    ``truth`` (the true shares of the aligned table) is known only for in-memory releases. It is
    the private data the release protects, so it never leaves the object by default:
    :meth:`cells`, :meth:`to_pandas`, :meth:`to_polars`, :meth:`to_dict` and :meth:`save` omit it
    unless the caller passes ``include_truth=True`` (simulations and demos only).

    A release of several tables (``release(design=...)``, a designed release fetched or loaded)
    holds one single-table Result a table in ``parts`` and the :class:`TablesReport`. Its
    analyses (:meth:`test_independence`, :meth:`association`, :meth:`logistic`,
    :meth:`compare_models`, :meth:`marginal`, :meth:`conditional`, :meth:`plot_marginal`) read the
    table that holds every attribute they name (of several, the one with the largest m_t a_t^2),
    or raise ``NoTableHoldsError`` listing the tables; :meth:`tables` lists them, :meth:`part`
    gives one, :meth:`questions` answers the design's questions. ``report``, ``truth``,
    :meth:`cells` and the other views of one table of cells are then the first estimated table's.
    """

    report: ReleaseReport
    truth: FloatArray | None = None
    warnings: tuple[str, ...] = field(default=())
    #: A release of several tables (a designed release): one single-table Result a table, in the
    #: design's order (None: not estimated, ``tables_report.missing`` says why), and the release's
    #: :class:`TablesReport`. ``report`` (and ``truth``) is then the first estimated table's.
    parts: tuple[Result | None, ...] = field(default=())
    tables_report: TablesReport | None = None
    #: A table of a release of several tables: the whole release (its guarantee is the table's).
    whole: Result | None = field(default=None, repr=False, compare=False)

    # ---------------------------------------------------------- a release of several tables
    @property
    def designed(self) -> bool:
        """Whether this is a release of several tables (a design's), not the whole joint."""
        return self.tables_report is not None

    @property
    def design(self) -> Design | None:
        """The design the curators ran (a release of several tables), else None."""
        return None if self.tables_report is None else Design.from_dict(self.tables_report.design)

    def part(self, table: int) -> Result:
        """Table ``table`` (1-based, as :meth:`tables` numbers them) as a single-table Result: its
        cells, marginals, page. A release of the whole joint has one table, itself."""
        parts = self.parts or (self,)
        if not 1 <= table <= len(parts):
            raise NoTableHoldsError(f"release {self.report.release_id!r} has tables 1 to {len(parts)}, not {table}; "
                                    f"its tables: {self._table_list()}")  # fmt: skip
        found = parts[table - 1]
        if found is None:
            assert self.tables_report is not None
            why = self.tables_report.missing.get(table - 1, "not estimated")
            raise NoTableHoldsError(f"table {table} of release {self.report.release_id!r} was not estimated: {why}")
        return found

    def _table_list(self) -> str:
        """The release's tables for a message: 'table 1 (a, x); table 2 (b, y): not estimated (why)'."""
        out = []
        for info in self.tables().rows:
            text = f"table {info.table} ({', '.join(info.attributes)})"
            out.append(text + (f": not estimated ({info.missing})" if info.missing else ""))
        return "; ".join(out)

    def _route(self, *names: Sequence[str] | str | None) -> Result:
        """The table that answers an analysis of these attributes: itself for a release of the
        whole joint; else the table holding every one of them, of several the one whose counts
        tell most (the largest m_t a_t^2, a_t its channel's keep probability; the first of equals);
        :class:`NoTableHoldsError` listing the release's tables if none does."""
        if not self.parts:
            return self
        wanted = {x for g in names if g is not None for x in ([g] if isinstance(g, str) else g)}
        holding = [p for p in self.parts if p is not None and wanted <= set(p.report.attributes)]
        if not holding:
            raise NoTableHoldsError(
                f"no table of release {self.report.release_id!r} holds {sorted(wanted)} together: a release of "
                f"several tables answers only what one of its tables holds; its tables: {self._table_list()}"
            )
        return max(holding, key=lambda p: p.report.plan.m * p.report.plan.channel.keep**2)

    def tables(self) -> analysis.ReleaseTables:
        """The release's tables, printable (``str``, a notebook's HTML, ``to_frame()``,
        ``to_dict()``): per table (1-based) its attributes, curators, K_t, m_t, gamma_t, keep a_t
        and the design's questions it answers. A release of the whole joint: one table."""
        if self.tables_report is None:
            p = self.report.plan
            row = analysis.TableInfo(1, self.report.attributes, self.report.covered, p.joint_size, p.m, p.gamma,
                                     p.channel.keep)  # fmt: skip
            return analysis.ReleaseTables(self.report.release_id, (row,), p.epsilon, p.epsilon, p.n)
        t, d = self.tables_report, self.design
        planned = d.release.tables if d is not None else ()
        rows = []
        for i, part in enumerate(self.parts):
            answers = tuple(q + 1 for q in planned[i].questions) if i < len(planned) else ()
            if part is None:
                attrs = planned[i].attributes if i < len(planned) else ()
                size = planned[i].joint_size if i < len(planned) else 0
                rows.append(analysis.TableInfo(i + 1, attrs, (), size, None, None, None, answers,
                                               t.missing.get(i, "not estimated")))  # fmt: skip
                continue
            p = part.report.plan
            rows.append(analysis.TableInfo(i + 1, part.report.attributes, part.report.covered, p.joint_size, p.m,
                                           p.gamma, p.channel.keep, answers))  # fmt: skip
        return analysis.ReleaseTables(t.release_id, tuple(rows), t.epsilon, t.sequential_epsilon, self.report.plan.n)

    def questions(self, *, seed: int = 0, draws: int = 999, level: float = 0.95) -> analysis.QuestionAnswers:
        """Every question of the design answered from the table that holds it (the design's table
        for it; if that one was not estimated, another holding its attributes): for ``A ~ B`` and
        ``A ~ B | C + D`` the likelihood-ratio test's p-value and Cramer's V with its interval, for
        ``Y ~ X1 + X2`` of a binary Y the logistic deviance test of X1 (else the planned test of
        independence, and the answer says so), each beside the design's planned detectable V and
        its power at the design's ``at_v`` (:func:`analysis.answer_question`). Prints as a table
        (``str``, a notebook's HTML); ``to_frame()``, ``columns()``, ``to_dict()``. A release of
        the whole joint has no design: :class:`NoDesignError`. Spends no privacy budget."""
        from secure_release.mechanism.analysis.questions import parse_question

        d, t = self.design, self.tables_report
        if d is None or t is None:
            raise NoDesignError(
                f"release {self.report.release_id!r} is one table of the whole joint, not a release designed for "
                "questions: it has no questions to answer. Ask yours with test_independence, association or "
                "logistic (`secure-release analyst test`), or design a release for them (`secure-release plan "
                "--question`)"
            )
        out = []
        for i, (text, figure) in enumerate(zip(d.questions, d.release.figures, strict=True)):
            question = parse_question(text)
            part = self.parts[figure.table] if figure.table < len(self.parts) else None
            table = figure.table + 1
            if part is None:
                try:
                    part = self._route(question.attributes)
                    table = next(k for k, p in enumerate(self.parts, start=1) if p is part)
                except NoTableHoldsError:
                    why = t.missing.get(figure.table, "its table was not estimated")
                    out.append(analysis.unanswered(
                        i + 1, text, question.kind, figure.detectable_v, figure.power_at_v,
                        f"its table {figure.table + 1} was not estimated: {why}",
                    ))  # fmt: skip
                    continue
            out.append(analysis.answer_question(part.report, question, i + 1, table, figure.detectable_v,
                                                figure.power_at_v, seed=seed, draws=draws, level=level))  # fmt: skip
        return analysis.QuestionAnswers(t.release_id, t.design_digest, tuple(out), d.alpha, d.power, d.at_v, d.n,
                                        self.report.plan.n, t.epsilon, t.sequential_epsilon)  # fmt: skip

    # -------------------------------------------------------------------------- the release
    @property
    def plan(self) -> ReleasePlan:
        """The release plan (a release of several tables: the first estimated table's; each
        table's is ``part(t).plan``, and :meth:`tables` lists them)."""
        return self.report.plan

    @property
    def attributes(self) -> tuple[str, ...]:
        """The released attributes (a release of several tables: of every estimated table, in
        the order they first appear)."""
        if not self.parts:
            return self.report.attributes
        return tuple(dict.fromkeys(a for p in self.parts if p is not None for a in p.report.attributes))

    @property
    def guarantee(self) -> dict[str, Any]:
        """The privacy guarantee in standard form (a release of several tables, and each of its
        tables: the whole release's, Eq. T1 with sequential composition beside it)."""
        if self.whole is not None:
            return self.whole.guarantee
        if self.tables_report is not None:
            t = self.tables_report
            full = [x.plan for x in t.tables if x is not None]
            ms, gs, ks = [p.m for p in full], [p.gamma for p in full], [p.joint_size for p in full]
            out = tables_guarantee(full[0].n, ms, gs, ks)
            # the charged figures of the whole release, whatever tables the researcher could estimate
            return out | {"epsilon": t.epsilon, "sequential_epsilon": t.sequential_epsilon,
                          "statement": guarantee_statement(t.epsilon)}  # fmt: skip
        return privacy_guarantee(self.report.plan)

    def __repr__(self) -> str:
        """A few lines: release id, n, m, K, epsilon, estimator and the guarantee (never the truth);
        a release of several tables: n, each table's attributes with m_t and gamma_t, and epsilon
        as charged (Eq. T1) and by sequential composition (Eq. T3)."""
        if self.tables_report is not None:
            t = self.tables_report
            truth = any(p is not None and p.truth is not None for p in self.parts)
            lines = [f"<Result {t.release_id}: {len(t.tables)} tables from disjoint samples of n={self.report.plan.n}, "
                     f"design {t.design_digest[:12]}"]  # fmt: skip
            for row in self.tables().rows:
                what = f"m={row.m}, gamma={row.gamma:.4g}, K={row.K}" if row.m is not None else "not estimated"
                lines.append(f"  table {row.table} ({', '.join(row.attributes)}): {what}")
            lines.append(f"  epsilon charged (Eq. T1) {t.epsilon:.6g}; sequential composition (Eq. T3) "
                         f"{t.sequential_epsilon:.6g}{'; truth held, not exported' if truth else ''}>")  # fmt: skip
            return "\n".join(lines)
        r, plan = self.report, self.report.plan
        g = self.guarantee
        held = "; truth held, not exported" if self.truth is not None else ""
        scope = f", marginal over {', '.join(r.curators)}" if r.marginal else ""
        return (
            f"<Result {r.release_id}: n={plan.n}, m={plan.m}, K={plan.joint_size}, epsilon={plan.epsilon:g}{scope}\n"
            f"  estimator: estimate = the projection onto the simplex (raw A^-1, MLE alongside); exact 95% intervals\n"
            f"  guarantee: ({g['epsilon']:.4g}, 0)-DP, replace-one, one record of the aligned table{held}>"
        )

    def _repr_html_(self) -> str:
        """Jupyter: the page of ``analyst report`` (one template, ``report_page.report_fragment``):
        the headline and warnings, charts, guarantee, plan and cells (a release of several
        tables: the design's questions answered, then each table)."""
        from secure_release.report_page import report_fragment

        return report_fragment(self)

    # The cells (a release of several tables: of its first estimated table, ``report``; every
    # table's are ``part(t)``'s, and the analyses below route to the table that holds their
    # attributes).

    @property
    def headline(self) -> npt.NDArray[np.float64]:
        """The estimate a report leads with (the projection, ``estimators.DEFAULT_ESTIMATOR``;
        docs/estimators.md); the raw A^-1 estimate is ``report.estimate``."""
        return self.report.headline

    @property
    def l2_error(self) -> float | None:
        """||raw - truth||_2 (the raw A^-1 estimate's l2 error, as the protocol's), when the truth is known."""
        return None if self.truth is None else float(np.linalg.norm(self.report.estimate - self.truth))

    def cell_columns(self, include_truth: bool = False) -> dict[str, npt.NDArray[Any]]:
        """The columns of :meth:`cells` as numpy arrays, in order (no DataFrame library needed)."""
        from secure_release.mechanism.estimation.report import spans_zero

        r = self.report
        labels = np.asarray(r.labels, dtype=str).reshape(len(r.labels), len(r.attributes))
        cols: dict[str, npt.NDArray[Any]] = {a: labels[:, j] for j, a in enumerate(r.attributes)}
        cols.update(r.columns())
        cols["ci_spans_zero"] = spans_zero(r.ci_low, r.ci_high)
        if include_truth and self.truth is not None:
            cols["truth"] = self.truth
        return cols

    def cells(self, backend: Backend = "pandas", include_truth: bool = False) -> Any:
        """One row per cell: the attribute labels, then the output vocabulary
        (``mechanism.estimation.report.OUTPUT_COLUMNS``: estimate = the headline, raw = A^-1, mle, se of raw,
        ci_low and ci_high = the share's 95% interval, observed), ci_spans_zero (and, with
        ``include_truth`` for a simulation or demo, the truth if known)."""
        return to_frame(self.cell_columns(include_truth), backend)

    def to_pandas(self, include_truth: bool = False) -> Any:
        """:meth:`cells` as a pandas DataFrame (no truth unless ``include_truth``)."""
        return self.cells("pandas", include_truth)

    def to_polars(self, include_truth: bool = False) -> Any:
        """:meth:`cells` as a polars DataFrame (no truth unless ``include_truth``)."""
        return self.cells("polars", include_truth)

    def marginal_table(self, *attributes: str) -> marginals.Marginal:
        """The marginal over ``attributes`` as arrays (``Marginal.columns()`` names them): its
        headline is its own raw estimate projected onto its own simplex, its MLE that of its own
        counts (:func:`mechanism.estimation.marginals.marginal`)."""
        if self.parts:
            return self._route(attributes).marginal_table(*attributes)
        r = self.report
        return marginals.marginal(
            r.attributes, r.labels, r.estimate, attributes, r.plan.n, r.plan.m, r.plan.channel.keep, r.observed
        )

    def marginal_columns(self, *attributes: str) -> dict[str, npt.NDArray[Any]]:
        """The columns of :meth:`marginal` as numpy arrays, in order."""
        t = self.marginal_table(*attributes)
        cols: dict[str, npt.NDArray[Any]] = {a: t.labels[:, j] for j, a in enumerate(t.attributes)}
        cols.update(t.columns())
        return cols

    def marginal(self, *attributes: str, backend: Backend = "pandas") -> Any:
        """The marginal over ``attributes`` as a DataFrame: the labels, then the columns of
        :meth:`cells` (estimate = the headline, raw, mle, se, ci_low, ci_high, observed)."""
        return to_frame(self.marginal_columns(*attributes), backend)

    def conditional_columns(
        self, target: Sequence[str] | str, given: Sequence[str] | str
    ) -> dict[str, npt.NDArray[Any]]:
        """P(target | given), one row per (given, target) combination: ``estimate`` from the
        (given, target) table's own headline (its raw estimate projected onto its own simplex),
        ``mle`` from that table's own MLE, and a conservative 95% interval of the true probability
        (ci_low, ci_high: the ratio of the exact intervals of the joint and the given shares, each
        at 97.5%, widened where needed to hold the estimate;
        :func:`mechanism.estimation.marginals.conditional_table`). No raw and no se: a ratio of shares that
        may be negative is no probability."""
        if self.parts:
            return self._route(target, given).conditional_columns(target, given)
        tgt = [target] if isinstance(target, str) else list(target)
        giv = [given] if isinstance(given, str) else list(given)
        r = self.report
        labels, prob, prob_mle, low, high = marginals.conditional_table(
            r.attributes, r.labels, r.estimate, r.observed, tgt, giv, r.plan.n, r.plan.m, r.plan.channel.keep
        )
        cols: dict[str, npt.NDArray[Any]] = {a: labels[:, j] for j, a in enumerate([*giv, *tgt])}
        cols.update(estimate=prob, mle=prob_mle, ci_low=low, ci_high=high)
        return cols

    def conditional(
        self, target: Sequence[str] | str, given: Sequence[str] | str, backend: Backend = "pandas"
    ) -> Any:
        """:meth:`conditional_columns` as a DataFrame: P(target | given) with ``estimate`` (from the
        headline), ``mle``, ``ci_low`` and ``ci_high``."""
        return to_frame(self.conditional_columns(target, given), backend)

    # --------------------------------------------------------------- analyses (docs/analysis.md)
    # Post-processing of the released counts: none of these spends privacy budget.

    def test_independence(
        self,
        a: Sequence[str] | str,
        b: Sequence[str] | str,
        given: Sequence[str] | str | None = None,
        *,
        method: str = "auto",
        draws: int = 999,
        seed: int = 0,
    ) -> analysis.AssociationTest:
        """Test H0: ``a`` and ``b`` are independent (within every level of ``given``). Each is an
        attribute name or a list of names, from any curators. A likelihood-ratio test of the
        perturbed multinomial, its null fitted by EM; the p-value from a seeded parametric
        bootstrap wherever the chi-square approximation is not trustworthy (``method`` says
        which). Returns ``statistic``, ``df``, ``p_value`` and ``method``."""
        if self.parts:
            return self._route(a, b, given).test_independence(a, b, given, method=method, draws=draws, seed=seed)
        return analysis.test_independence(self.report, a, b, given, method=method, draws=draws, seed=seed)

    def association(
        self,
        a: Sequence[str] | str,
        b: Sequence[str] | str,
        *,
        ordered: Sequence[str] = (),
        level: float = 0.95,
        seed: int = 0,
    ) -> analysis.Association:
        """How strongly ``a`` and ``b`` are associated: ``cramers_v`` with ``ci_low`` and
        ``ci_high``, the mutual information, the odds ratio and risk difference of two binary
        attributes, Kendall's tau-b of two ordered ones (binned numbers, or named in ``ordered``),
        each with its interval at ``level``."""
        if self.parts:
            return self._route(a, b).association(a, b, ordered=ordered, level=level, seed=seed)
        return analysis.association(self.report, a, b, ordered=ordered, level=level, seed=seed)

    def association_rows(self, *, seed: int = 0, draws: int = 999) -> list[analysis.AssociationRow]:
        """Every pair of attributes held by different curators, tested and measured, sorted by the
        Holm-adjusted p-value (a release of several tables: every such pair of any table, each
        tested on the table that answers it, as :meth:`test_independence` routes, adjusted over
        all of them)."""
        if not self.parts:
            return analysis.associations(self.report, seed=seed, draws=draws)
        pairs = dict.fromkeys(x for p in self.parts if p is not None for x in analysis.cross_curator_pairs(p.report))
        chosen = [(self._route(a, b).report, a, b) for a, b in pairs]
        return analysis.adjusted_associations(chosen, seed=seed, draws=draws)

    def associations(self, backend: Backend = "pandas", *, seed: int = 0, draws: int = 999) -> Any:
        """:meth:`association_rows` as a DataFrame: a, b, the curators holding them, statistic,
        df, p_value, p_holm (Holm-adjusted over the pairs), cramers_v with v_ci_low and
        v_ci_high, mutual_information with its interval; sorted by p_holm."""
        return to_frame(analysis.association_columns(self.association_rows(seed=seed, draws=draws)), backend)

    def logistic(
        self,
        outcome: str,
        covariates: Sequence[str] | str,
        *,
        interactions: Sequence[tuple[str, str]] = (),
        level: float = 0.95,
    ) -> analysis.Model:
        """A logistic regression of ``outcome`` (two levels; more: a multinomial logit) on
        ``covariates`` (main effects, dummy-coded against their first category, and the named
        pairwise ``interactions``), fitted on the likelihood of the perturbed counts by EM over
        the true cells: coefficients with standard errors and intervals."""
        if self.parts:
            part = self._route(outcome, covariates)
            return part.logistic(outcome, covariates, interactions=interactions, level=level)
        return analysis.logistic(self.report, outcome, covariates, interactions=interactions, level=level)

    def compare_models(self, reduced: analysis.Model, full: analysis.Model) -> analysis.ModelComparison:
        """The deviance test of a reduced model against a fuller one (both from :meth:`logistic`)."""
        if self.parts:
            return self._route(full.outcome, full.over).compare_models(reduced, full)
        return analysis.compare_models(self.report, reduced, full)

    def plot_marginal(self, attribute: str, ax: Any = None) -> Any:
        """A bar chart of one attribute's marginal (needs matplotlib): the headline estimate on
        each bar, its value above it and the share's 95% interval (``plotting.marginal_bars``,
        the chart of the report page)."""
        from secure_release.plotting import marginal_bars

        if self.parts:
            return self._route(attribute).plot_marginal(attribute, ax)
        plt = require("matplotlib.pyplot")
        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3))
        title = f"{self.report.release_id}: {attribute} (epsilon {self.plan.epsilon:g}, m {self.plan.m})"
        marginal_bars(ax, self.marginal_table(attribute), title)
        return ax

    def to_dict(self, include_truth: bool = False) -> dict[str, Any]:
        """The report's JSON with ``guarantee`` and ``warnings`` (and, with ``include_truth`` for
        a simulation or demo, ``truth`` if known: it is the private data the release protects). A
        release of several tables: its :class:`TablesReport`'s (format ``secure-release/result/2``,
        every table's report and the design) with the whole release's guarantee, the warnings and
        (``include_truth``) one truth a table (None where unknown)."""
        if self.tables_report is not None:
            out = {**self.tables_report.to_dict(), "guarantee": self.guarantee, "warnings": list(self.warnings)}
            if include_truth and any(p is not None and p.truth is not None for p in self.parts):
                out["truth"] = [None if p is None or p.truth is None else p.truth.tolist() for p in self.parts]
            return out
        d = {**self.report.to_dict(), "guarantee": self.guarantee, "warnings": list(self.warnings)}
        if include_truth and self.truth is not None:
            d["truth"] = self.truth.tolist()
        return d

    def save(self, path: str | Path, include_truth: bool = False) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` (mode 0600; no truth unless ``include_truth``);
        :func:`load_result` reads it back."""
        from secure_release.infra.fileio import atomic_write

        target = Path(path)
        atomic_write(target, json.dumps(self.to_dict(include_truth), indent=1).encode("utf-8"))
        return target

    def to_parquet(self, path: str | Path) -> Path:
        """Write :meth:`cell_columns` (never the truth) as Parquet to ``path``; the guarantee and
        what each column holds (``mechanism.estimation.report.COLUMN_MEANINGS``) go in the file's metadata
        under ``secure_release`` (``analyst export R r.parquet``). A release of several tables
        has no one table of cells: write each table's (``part(t).to_parquet``) or :meth:`save`."""
        if self.parts:
            raise MultiTableResultError(
                f"release {self.report.release_id!r} has {len(self.parts)} tables: write one table's cells with "
                "part(t).to_parquet(path) (tables() lists them), or the whole release as JSON with save(path)"
            )
        import pyarrow as pa
        import pyarrow.parquet as pq

        from secure_release.infra.fileio import atomic_write
        from secure_release.mechanism.estimation.estimators import DEFAULT_ESTIMATOR
        from secure_release.mechanism.estimation.report import COLUMN_MEANINGS

        table = pa.table(self.cell_columns())
        about = {"guarantee": self.guarantee, "headline": DEFAULT_ESTIMATOR, "columns": COLUMN_MEANINGS}
        buf = pa.BufferOutputStream()
        pq.write_table(table.replace_schema_metadata({b"secure_release": json.dumps(about).encode()}), buf)
        target = Path(path)
        atomic_write(target, buf.getvalue().to_pybytes(), 0o644)
        return target


def _result(report: ReleaseReport, truth: FloatArray | None = None) -> Result:
    message = utility_check(report.plan)["message"]
    return Result(report, truth, (message,) if message else ())


def load_result(path: str | Path) -> Result:
    """A result file the researcher wrote (``<release>.json``, or the API's ``to_dict``): one
    table, or a release of several (format ``secure-release/result/2``)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, dict) and data.get("format") == TABLES_FORMAT:
        return result_from_tables(TablesReport.from_dict(data))
    return _result(ReleaseReport.from_dict(data))


def result_from_tables(report: TablesReport, truths: Sequence[FloatArray | None] | None = None) -> Result:
    """The :class:`Result` of a release of several tables: a single-table Result a table
    (``parts``; ``truths``: each table's true shares, in-memory runs only), its analyses routed to
    the table holding the attributes named; ``report`` is the first estimated table's. The
    warnings are each table's, named by its number."""
    parts = tuple(None if r is None else _result(r, None if truths is None else truths[t])
                  for t, r in enumerate(report.tables))  # fmt: skip
    first = next((p for p in parts if p is not None), None)
    if first is None:
        raise NoKeysEstimatedError(f"release {report.release_id!r}: no table was estimated ({dict(report.missing)})")
    warnings_ = tuple(f"table {t}: {w}" for t, p in enumerate(parts, start=1) if p is not None for w in p.warnings)
    whole = Result(first.report, first.truth, warnings_, parts, report)
    for p in parts:  # each table states the whole release's guarantee, not its own Theorem 3.2
        if p is not None:
            object.__setattr__(p, "whole", whole)
    return whole


class NoKeysEstimatedError(SecureReleaseError):
    """A release of several tables of which no table could be estimated (keys missing)."""


class NoDesignError(SecureReleaseError):
    """``questions()`` (``secure-release analyst questions``) of a release of the whole joint: only
    a release designed for questions (``plan --question``, ``api.design``) has questions to answer."""


class DesignEpsilonError(DesignMismatchError):
    """``release(design=d)`` with an epsilon other than the design's: a design fixes the release's
    total epsilon (its m_t and gamma_t are chosen for it)."""


# ------------------------------------------------------------------------------------- release
@dataclass(frozen=True)
class TestKeys:
    """Every secret of a release derived from one integer: reproducible runs for tutorials and
    tests ONLY (anyone who knows the integer can undo the sampling's secrecy and the pads)."""

    __test__ = False  # not a pytest class
    seed: Seed
    alignment_key: AlignmentKey
    pram_key: PramKey
    pad_keys: tuple[PadKey, ...]

    @classmethod
    def from_int(cls, value: int, curators: int) -> TestKeys:
        def derive(label: str) -> bytes:
            return hashlib.sha256(f"secure-release test keys {value} {label}".encode()).digest()

        pads = tuple(PadKey(derive(f"pad {j}")) for j in range(curators))
        return cls(Seed(derive("seed")), AlignmentKey(derive("align")), PramKey(derive("pram")), pads)


def curator_tables(
    tables: Mapping[str, Any],
    schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path],
    id_column: str | None = None,
) -> list[CuratorTable]:
    """In-memory curator tables (joint-code order = the order of ``tables``) from DataFrames,
    Arrow tables, DuckDB relations or mappings: each read by the curator's own reader
    (:func:`secure_release.curator.columnar.check_rows`, the one cell rule), so a table gives
    the codes, and the refusals (:class:`BadRowsError`, a line being the row's position + 2 as
    in the table's CSV with a header), that ``secure-release-curator`` gives for the same table
    in a file. The ids come from each schema's ``id_column`` (``id_column`` fills in a schema
    without one)."""
    from secure_release.curator.columnar import RowSource, TableSpec, check_rows, encode_checked

    if set(tables) != set(schemas):
        raise TableInputError(f"tables for {sorted(tables)} but schemas for {sorted(schemas)}; give one of each")
    out: list[CuratorTable] = []
    for name, table in tables.items():
        parsed, ids = _as_spec(name, schemas[name], id_column)
        spec = TableSpec(CuratorSchema(name, parsed.attributes), ids)
        arrow = to_arrow(table, f"curator {name}")
        source = RowSource(Path(f"curator {name}"), is_csv=False)
        out.append(encode_checked(check_rows(list(arrow.column_names), arrow, spec, source), spec))
    return out


def curator_id_columns(
    tables: Mapping[str, Any], schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path],
    id_column: str | None = None,
) -> dict[str, str]:
    """Each curator's id column, as :func:`curator_tables` takes it."""
    return {name: _as_spec(name, schemas[name], id_column)[1] for name in tables}


def release(
    tables: Mapping[str, Any],
    schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path],
    epsilon: float,
    m: int | None = None,
    *,
    id_column: str | None = None,
    cipher: str = "chacha20",
    release_id: str = "release-1",
    granted: Sequence[str] | None = None,
    test_keys: int | None = None,
    design: Design | None = None,
) -> Result:
    """Run a whole release in memory (align, sample, encrypt, PRAM, decrypt, estimate) on one
    table per curator (pandas/polars DataFrames, Arrow tables or mappings of columns), keyed by
    curator name in joint-code order. ``schemas`` per curator: a CuratorSchema, a schema dict or
    file, or ``{attribute: [categories]}``; each table is read as the curator CLI reads a file
    (the one cell rule: docs/own-data.md), its ids from the schema's ``id_column`` (the
    ``id_column`` keyword fills in a schema without one; a conflict raises
    :class:`IdColumnConflictError`). ``granted``: curators whose keys the researcher gets
    (default all; fewer gives a marginal). ``test_keys``: reproducible keys, tutorials/tests only.
    Warns (``UserWarning``) when the plan's predicted RMSE exceeds the typical cell share 1/K.

    ``design`` (a :class:`Design` from :func:`design` or :func:`load_design`): release the
    design's tables from disjoint samples of one alignment instead of the whole joint
    (``mechanism.protocol.in_memory.run_tables_release``: each table's m_t and gamma_t as planned
    for ``design.n`` records, rescaled to the aligned n), for the design's digest. ``epsilon``
    must be the design's (else :class:`DesignEpsilonError`), ``m`` None, the schemas the design's
    (else ``DesignMismatchError``); ``granted`` and ``test_keys`` work as without a design. The
    :class:`Result` then holds one table a part (``tables()`` lists them, ``part(t)`` is one), its
    analyses go to the table that holds the attributes they name (``NoTableHoldsError`` if none
    does), ``questions()`` answers the design's questions, and ``report`` is the first table's.
    """
    ts = curator_tables(tables, schemas, id_column)
    names = [t.name for t in ts]
    keys = TestKeys.from_int(test_keys, len(ts)) if test_keys is not None else None
    subset = None if granted is None else [names.index(g) for g in granted]
    if design is not None:
        return _designed_release(ts, design, epsilon, m, cipher, release_id, subset, keys)
    result = run_release(
        ts, epsilon, m, CipherMode.parse(cipher), release_id,
        seed=keys.seed if keys else None, alignment_key=keys.alignment_key if keys else None,
        pram_key=keys.pram_key if keys else None, granted=subset, pad_keys=keys.pad_keys if keys else None,
    )  # fmt: skip
    covered = result.estimate.curators
    joint = JointSchema(tuple(ts[j].schema for j in covered))
    report = build_report(release_id, result.plan, names, result.estimate, joint)
    out = _result(report, result.true_type)
    for message in out.warnings:
        warnings.warn(message, UserWarning, stacklevel=2)
    return out


def design(
    n: int,
    schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path]
    | Sequence[CuratorSchema | Mapping[str, Any] | str | Path],
    epsilon: float,
    questions: Sequence[str],
    marginals: Mapping[str, Sequence[float]] | None = None,
    **options: Any,
) -> Design:
    """The release designed for ``questions`` (``"A ~ B"``, ``"A ~ B | C + D"``, ``"Y ~ X1 + X2"``)
    on n aligned records of the curators' ``schemas`` at total ``epsilon``
    (:func:`mechanism.analysis.design.design`): its tables, disjoint m_t and gamma_t (Eq. T1), each
    question's detectable Cramer's V beside the whole joint's. ``schemas`` as :func:`release` takes
    them, keyed by curator in joint-code order (a CuratorSchema, a schema dict or file, or
    ``{attribute: [categories]}``), or a list of CuratorSchemas, schema dicts or files (named as
    they say). ``marginals``: public expected shares per attribute (else uniform). ``options``:
    alpha, power, at_v (a Cramer's V at which to report each question's power), max_useful_v,
    replicates, seed. The :class:`Design` prints as its tables and questions, shows as HTML in a
    notebook, and :func:`save_design` writes the file every curator runs (``--design``); pass it to
    :func:`release` as ``design=``."""
    return _design(n, _schema_list(schemas), epsilon, list(questions), marginals, **options)


def _schema_list(
    schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path]
    | Sequence[CuratorSchema | Mapping[str, Any] | str | Path],
) -> list[CuratorSchema]:
    """The curators' schemas, in order: a mapping's keys name them (as :func:`release` reads its
    tables); a list's entries name themselves (``curator<j>`` for a bare ``{attribute: [...]}``)."""
    if isinstance(schemas, Mapping):
        return [CuratorSchema(name, _as_spec(name, s, None)[0].attributes) for name, s in schemas.items()]
    return [_as_spec(f"curator{j + 1}", s, None)[0] for j, s in enumerate(schemas)]


def _designed_release(
    ts: Sequence[CuratorTable], d: Design, epsilon: float, m: int | None, cipher: str, release_id: str,
    subset: Sequence[int] | None, keys: TestKeys | None,
) -> Result:  # fmt: skip
    """:func:`release` of a design's tables: ``mechanism.protocol.in_memory.run_tables_release``
    with each table's attributes, m_t and gamma_t as the design planned them for ``d.n`` records
    (rescaled to the aligned n), its digest and epsilon; labelled by ``protocol.tables.tables_report``."""
    if not isinstance(d, Design):
        raise DesignMismatchError(f"design= takes a Design (api.design, api.load_design), got {type(d).__name__}")
    if float(epsilon) != d.epsilon:
        raise DesignEpsilonError(f"epsilon {epsilon!r} differs from the design's {d.epsilon!r}: a design fixes the "
                                 "release's total epsilon (its m_t and gamma_t are chosen for it); pass the design's "
                                 "epsilon, or design again for this one")  # fmt: skip
    if m is not None:
        raise DesignMismatchError(f"m={m} with design=: a design fixes each table's m_t; pass no m")
    own = {t.name: t.schema for t in ts}
    theirs = {s.name: s for s in d.schemas}
    if set(own) != set(theirs):
        raise DesignMismatchError(f"the design is for curators {sorted(theirs)}, the tables are of {sorted(own)}; "
                                  "give one table for each curator of the design")  # fmt: skip
    for name, s in theirs.items():
        if own[name].attributes != s.attributes:
            raise DesignMismatchError(
                f"curator {name!r}: the design's schema has {[attribute_to_dict(a) for a in s.attributes]}, its table "
                f"is read with {[attribute_to_dict(a) for a in own[name].attributes]}; design with the schema the "
                "table is read with"
            )
    planned = d.planned_tables()
    attributes = [a for a, _, _ in planned]
    res = run_tables_release(
        ts, attributes, [x for _, x, _ in planned], [g for _, _, g in planned], d.epsilon, d.digest(),
        d.n, CipherMode.parse(cipher), release_id, seed=keys.seed if keys else None,
        alignment_key=keys.alignment_key if keys else None, pram_key=keys.pram_key if keys else None,
        granted=subset, pad_keys=keys.pad_keys if keys else None,
    )  # fmt: skip
    granted = set(range(len(ts))) if subset is None else set(subset)
    missing = {
        t: "no key of " + ", ".join(res.spec.curators[j] for j in layout.live if j not in granted)
        for t, (layout, e) in enumerate(zip(res.spec.tables, res.estimates, strict=True)) if e is None
    }
    report = tables_report(release_id, res.spec.curators, res.spec.n, d.epsilon, res.spec.tables, attributes, own,
                           res.estimates, d.to_dict(), d.digest(), missing)  # fmt: skip
    out = result_from_tables(report, res.true_types)
    for message in out.warnings:
        warnings.warn(message, UserWarning, stacklevel=3)
    return out


def save_design(design: Design, path: str | Path) -> Path:
    """Write ``design`` as the file every curator runs with (``secure-release-curator run
    --design FILE``); :func:`load_design` reads it back."""
    from secure_release.infra.designfile import write_design

    return write_design(design, path)


def load_design(path: str | Path) -> Design:
    """The design in a file :func:`save_design` or ``secure-release plan --question ... --out``
    wrote (named errors for anything else)."""
    from secure_release.infra.designfile import read_design

    return read_design(path)


# ---------------------------------------------------------------------------------- simulation
@dataclass(frozen=True)
class Simulation:
    """Simulated releases on a count table: one summary row per (epsilon, m) point."""

    rows: tuple[dict[str, Any], ...]

    def to_frame(self, backend: Backend = "pandas") -> Any:
        """The summary rows as a DataFrame (mean l2 errors, their SEs, predicted RMSE, bounds)."""
        keys = [k for k, v in self.rows[0].items() if not isinstance(v, list)]
        return to_frame({k: np.asarray([r[k] for r in self.rows], dtype=object) for k in keys}, backend)


def simulate(
    counts: npt.ArrayLike,
    epsilon: float | Sequence[float],
    m: int | Sequence[int] | None = None,
    trials: int = 200,
    alphabet_sizes: Sequence[int] | None = None,
    seed: int = 0,
    estimators: Sequence[str] = ESTIMATORS,
) -> Simulation:
    """Simulate ``trials`` releases per (epsilon, m) on a joint count table (curator-major codes);
    m defaults to m* for each epsilon. Fast path: the exact distribution of the observed counts."""
    from secure_release.mechanism.privacy.accounting import optimal_sample_size_int

    c = np.asarray(counts, dtype=np.int64)
    n, K = int(c.sum()), int(c.size)
    epsilons = [float(epsilon)] if isinstance(epsilon, int | float) else [float(e) for e in epsilon]
    points = [
        (e, mm)
        for e in epsilons
        for mm in ([optimal_sample_size_int(n, K, e)] if m is None else [m] if isinstance(m, int) else list(m))
    ]
    out = sweep(c, points, trials, np.random.default_rng(seed), alphabet_sizes, estimators)
    return Simulation(tuple(p.summary() for p in out))


def fetch_result(address: str, certs: str | Path, name: str, release_id: str, timeout: float = 300.0) -> Result:
    """An estimate from a running researcher service, as analyst ``name`` (mutual TLS with the
    analyst's own directory ``certs``: ``ca.pem``, ``NAME.pem``, ``NAME.key``)."""
    from secure_release.analyst import fetch_report

    report = fetch_report(address, Path(certs), name, release_id, wait=True, timeout=timeout)
    return result_from_tables(report) if isinstance(report, TablesReport) else _result(report)


# ------------------------------------------------------------------------------- four services
def release_over_services(
    tables: Mapping[str, Any],
    schemas: Mapping[str, CuratorSchema | Mapping[str, Any] | str | Path],
    epsilon: float,
    workdir: str | Path,
    m: int | None = None,
    *,
    id_column: str | None = None,
    release_id: str = "release-1",
    test_keys: int | None = None,
) -> Result:
    """The same release as :func:`release`, across real processes on this machine: a project CA,
    the server, one curator per table (the first leads) and the researcher over mutual TLS; the
    estimate is read as analyst. With the same ``test_keys`` the numbers equal :func:`release`'s
    (that needs SECURE_RELEASE_TESTING=1 in the children's environment: set here)."""
    import os

    import pyarrow as pa
    import pyarrow.csv as pacsv

    from secure_release.cluster import Cluster, get_estimate, launch_release, parties
    from secure_release.infra.pki import init_pki

    root = Path(workdir)
    (root / "data").mkdir(parents=True, exist_ok=True)
    ts = curator_tables(tables, schemas, id_column)  # refuses a bad table here, before any process starts
    id_columns = curator_id_columns(tables, schemas, id_column)
    for t in ts:
        names = [id_columns[t.name], *(a.name for a in t.schema.attributes)]
        texts = text_columns(tables[t.name], names, f"curator {t.name}")  # the cell rule's text: read back the same
        pacsv.write_csv(pa.table(texts), root / "data" / f"{t.name}.csv")
        (root / "data" / f"{t.name}.json").write_text(json.dumps(schema_to_dict(t.schema, id_columns[t.name])))
    curators = [t.name for t in ts]
    init_pki(root / "certs", parties(curators), force=True)
    keys = TestKeys.from_int(test_keys, len(ts)) if test_keys is not None else None
    align = keys.alignment_key if keys else AlignmentKey.generate()
    (root / "align.key").write_text(align.reveal().hex())
    (root / "align.key").chmod(0o600)
    extra: dict[str, list[str]] = {}
    server_extra: list[str] = []
    env = dict(os.environ)
    if keys is not None:
        env["SECURE_RELEASE_TESTING"] = "1"
        extra = {c: ["--insecure-test-pad-key", keys.pad_keys[j].reveal().hex()] for j, c in enumerate(curators)}
        extra[curators[0]] += ["--insecure-test-seed", keys.seed.reveal().hex()]
        server_extra = ["--insecure-test-pram-key", keys.pram_key.reveal().hex()]
    cluster = Cluster(root, env=env)
    try:
        addrs = launch_release(
            cluster, root / "data", root / "certs", release_id, epsilon, m, "chacha20", root / "align.key",
            server_extra=server_extra, curators=curators, curator_extra=extra,
        )  # fmt: skip
        resp = get_estimate(addrs["researcher"], root / "certs", release_id)
    finally:
        cluster.close()
    from dataclasses import replace

    from secure_release.infra.wire import report_from_pb

    report = report_from_pb(resp)
    sizes = tuple(t.schema.alphabet_size for t in ts)
    return _result(replace(report, plan=replace(report.plan, alphabet_sizes=sizes), curators=tuple(curators)))
