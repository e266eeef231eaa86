"""What to give up when the plan says noise: the smallest public schema changes that bring the
predicted per-cell RMSE under a target (issue 34, item 4; ``secure-release plan --suggest``).

Everything here is a function of public inputs: the curators' schemas (attributes, bins, groups),
n and epsilon; never of the data. The figures of every suggestion are those of
:func:`~mechanism.privacy.plan.plan_release` on the changed schemas at its default m (m*, Cor. 3.6,
rounded into [1, n]), read through :func:`per_cell_rmse` (DESIGN 3's exact MSE, worst case over
the data, spread over the K cells), so ``secure-release plan`` on the changed schemas prints the
same numbers.

The search, and its bound:

* each attribute has a short list of options, finest first (:func:`attribute_options`): keep it;
  merge its categories into its declared public groups (:func:`group_merge`); for a binned
  attribute with B bins, merge adjacent bins into b = B-1, ..., 2 equal-ish runs of whole bins
  (:func:`bin_merge`); drop it. Every curator keeps at least one attribute.
* the options of all attributes form a grid; K of every cell is the product of the chosen sizes,
  and the target is checked once per distinct K (the figures depend on K, n and epsilon only).
* a suggestion is a cell that meets the target while no cell keeping at least as much (each
  attribute's option as fine or finer, one strictly) does: the Pareto front of the feasible cells
  (found as the feasible cells whose one-step-finer neighbours all fail, then filtered).
* the grid has at most :data:`MAX_GRID` cells: while larger, the bin merges of the attribute with
  the most options are thinned to a ladder (2, 3, 4, 6, 8, 12, 16, 24, ... and B-1); if it is still
  larger, :class:`SearchTooLargeError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism import printing
from secure_release.mechanism.analysis.power import DEFAULT_ALPHA, DEFAULT_POWER, PowerPlan, power_plan
from secure_release.mechanism.errors import (
    InvalidBinsError,
    InvalidSuggestionLimitError,
    NonFiniteInputError,
    SearchTooLargeError,
)
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.privacy.plan import ReleasePlan, plan_release
from secure_release.mechanism.schema import Attribute, CuratorSchema, attribute_to_dict, bin_labels

#: The most option combinations the search enumerates (after thinning the bin merges).
MAX_GRID = 2**18
#: How many suggestions :func:`suggest_changes` lists by default (``--max-suggestions``).
DEFAULT_LIMIT = 10
#: The largest epsilon :func:`sufficient_epsilon` tries.
MAX_SUGGESTED_EPSILON = 50.0


# ------------------------------------------------------------------------------- the figures
def typical_cell_share(joint_size: int) -> float:
    """The typical cell share 1/K (DESIGN 3; the rule of ``ReleasePlan.utility_warning``)."""
    return 1.0 / joint_size


def default_target(joint_size: int) -> float:
    """The default target of a suggestion: a per-cell RMSE of at most half the typical share,
    1/(2K) (issue 34, item 4), K the changed schemas' joint alphabet."""
    return 0.5 * typical_cell_share(joint_size)


def check_target(target: float | None) -> None:
    """A target per-cell RMSE is None (the default, :func:`default_target` of each K) or a finite
    number > 0."""
    if target is not None and not (math.isfinite(target) and target > 0):
        raise NonFiniteInputError(f"the target per-cell RMSE must be a finite number > 0, got {target!r}")


def per_cell_rmse(plan: ReleasePlan) -> float:
    """The predicted per-cell RMSE of ``plan``: DESIGN 3's exact l2 RMSE, worst case over the data
    (sum of squared shares 1/K), over sqrt K; ``predicted_rmse_per_cell`` of
    :meth:`ReleasePlan.report`, without the rest of the report."""
    return accounting.predicted_rmse_per_cell(plan.n, plan.m, plan.joint_size, plan.gamma)


# ----------------------------------------------------------------------- options per attribute
@dataclass(frozen=True)
class Option:
    """One way to keep an attribute: ``kind`` is "keep", "groups", "bins" or "drop";
    ``attribute`` the changed attribute (None when dropped); ``size`` its category count (1 when
    dropped: a factor 1 of K)."""

    kind: str
    attribute: Attribute | None
    size: int
    gives_up: str


def merged_bin_edges(edges: Sequence[float], bins: int) -> tuple[float, ...]:
    """The edges of ``bins`` runs of adjacent bins of ``edges`` (B = len(edges) - 1 bins): run i
    ends at edge round(i B / bins) (halves up), so the runs hold whole bins and differ by at most
    one bin; the outer edges stay."""
    B = len(edges) - 1
    if not 1 <= bins <= B:
        raise InvalidBinsError(f"cannot merge {B} bins into {bins}; need 1 <= bins <= {B}")
    return tuple(edges[(2 * i * B + bins) // (2 * bins)] for i in range(bins + 1))


def bin_merge(attribute: Attribute, bins: int) -> Attribute:
    """``attribute`` (binned) with its bins merged into ``bins`` adjacent runs
    (:func:`merged_bin_edges`); clamp, dates and the missing label stay."""
    assert attribute.bins is not None
    edges = merged_bin_edges(attribute.bins, bins)
    labels = bin_labels(edges, attribute.dates) + ((attribute.missing,) if attribute.missing is not None else ())
    return Attribute(attribute.name, labels, edges, attribute.clamp, attribute.missing, attribute.missing_tokens,
                     attribute.dates)  # fmt: skip


def group_merge(attribute: Attribute) -> Attribute:
    """``attribute`` with its categories merged into its public groups: the group names, in the
    schema's order, are the new categories (then the missing label). The curator's table must
    then hold the group names (recode the column before the release)."""
    assert attribute.groups is not None
    labels = tuple(g for g, _ in attribute.groups) + ((attribute.missing,) if attribute.missing is not None else ())
    return Attribute(attribute.name, labels, None, False, attribute.missing, attribute.missing_tokens)


def _edges_text(attribute: Attribute) -> str:
    assert attribute.bins is not None
    return "[" + ", ".join(attribute.edge_label(e) for e in attribute.bins) + "]"


def attribute_options(attribute: Attribute) -> list[Option]:
    """The options of one attribute, finest first: keep; merge into its groups; merge its B bins
    into B-1, ..., 2; drop. An option that would not shrink the attribute is left out."""
    size = attribute.size
    options = [Option("keep", attribute, size, "")]
    extra = 1 if attribute.missing is not None else 0
    if attribute.groups is not None and len(attribute.groups) + extra < size:
        merged = group_merge(attribute)
        names = ", ".join(g for g, _ in attribute.groups)
        options.append(Option("groups", merged, merged.size,
                              f"{attribute.name}: {size - extra} categories merged into {len(attribute.groups)} "
                              f"groups ({names}; the table then holds the group names)"))  # fmt: skip
    if attribute.bins is not None:
        B = len(attribute.bins) - 1
        for b in range(B - 1, 1, -1):
            merged = bin_merge(attribute, b)
            text = f"{attribute.name}: {B} bins merged into {b}, edges {_edges_text(merged)}"
            options.append(Option("bins", merged, merged.size, text))
    if size > 1:
        options.append(Option("drop", None, 1, f"{attribute.name}: dropped ({size} categories)"))
    return options


def _ladder(options: list[Option]) -> list[Option]:
    """Bin merges thinned to b in {2, 3, 4, 6, 8, 12, 16, 24, ...} and B-1 (keep, groups, drop stay)."""
    rungs = {2, 3} | {2**k for k in range(2, 40)} | {3 * 2**k for k in range(1, 40)}
    bins = [o for o in options if o.kind == "bins"]
    top = bins[0].size if bins else None
    return [o for o in options if o.kind != "bins" or o.size == top or _bins_of(o) in rungs]


def _bins_of(option: Option) -> int:
    assert option.attribute is not None and option.attribute.bins is not None
    return len(option.attribute.bins) - 1


# ---------------------------------------------------------------------------- the suggestions
@dataclass(frozen=True)
class Figures:
    """The plan's figures for one set of alphabets: those ``secure-release plan`` prints."""

    alphabet_sizes: tuple[int, ...]
    K: int
    m: int
    m_star: float
    epsilon: float
    predicted_rmse_per_cell: float
    typical_cell_share: float
    target: float

    @property
    def meets_target(self) -> bool:
        return self.predicted_rmse_per_cell <= self.target

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "alphabet_sizes": list(self.alphabet_sizes)}


def plan_figures(n: int, alphabet_sizes: Sequence[int], epsilon: float, target: float | None = None) -> Figures:
    """The figures of :func:`plan_release` (default m = m*) and the target they are held to
    (``target``, or :func:`default_target` of their K)."""
    plan = plan_release(n, alphabet_sizes, epsilon)
    K = plan.joint_size
    return Figures(plan.alphabet_sizes, K, plan.m, accounting.optimal_sample_size(n, K, plan.epsilon),
                   plan.epsilon, per_cell_rmse(plan), typical_cell_share(K),
                   default_target(K) if target is None else target)  # fmt: skip


@dataclass(frozen=True)
class Suggestion:
    """A set of changes (one per changed attribute), the changed schemas and their figures;
    ``keeps`` names each kept attribute with its category count."""

    figures: Figures
    schemas: tuple[CuratorSchema, ...]
    gives_up: tuple[str, ...]
    attributes_kept: int
    keeps: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.figures.to_dict(),
            "attributes_kept": self.attributes_kept,
            "keeps": list(self.keeps),
            "gives_up": list(self.gives_up),
            "schemas": [{"curator": s.name, "attributes": [attribute_to_dict(a) for a in s.attributes]}
                        for s in self.schemas],
        }  # fmt: skip


@dataclass(frozen=True)
class SuggestionReport:
    """The current figures, the suggestions (sorted by what they keep, at most ``limit``), how
    many more met the target, the epsilon that would suffice with the schemas unchanged, and how
    the search was bounded."""

    n: int
    epsilon: float
    target: float | None
    current: Figures
    suggestions: tuple[Suggestion, ...]
    omitted: int
    epsilon_unchanged: Figures | None
    grid_size: int
    thinned: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "epsilon": self.epsilon,
            "target": "1/(2K)" if self.target is None else self.target,
            "current": self.current.to_dict(),
            "suggestions": [s.to_dict() for s in self.suggestions],
            "omitted": self.omitted,
            "epsilon_unchanged": None if self.epsilon_unchanged is None else self.epsilon_unchanged.to_dict(),
            "search": {"grid_size": self.grid_size, "thinned": list(self.thinned), "max_grid": MAX_GRID},
        }

    # ------------------------------------------------------------------- reading the report
    def columns(self) -> dict[str, list[Any]]:
        """The suggestions as named columns (for a DataFrame): rank, K, m, the per-cell RMSE,
        the target, the attributes kept and what each gives up (joined by "; ")."""
        return {
            "rank": list(range(1, len(self.suggestions) + 1)),
            "K": [s.figures.K for s in self.suggestions],
            "m": [s.figures.m for s in self.suggestions],
            "predicted_rmse_per_cell": [s.figures.predicted_rmse_per_cell for s in self.suggestions],
            "target": [s.figures.target for s in self.suggestions],
            "keeps": [", ".join(s.keeps) for s in self.suggestions],
            "gives_up": ["; ".join(s.gives_up) for s in self.suggestions],
        }

    def block(self) -> printing.Block:
        """The current figures, a row per suggestion (K, m, per-cell RMSE, target, what it keeps),
        what each gives up, the epsilon that would do unchanged and the search's bound."""
        now = self.current
        target = "1/(2K) of each changed K" if self.target is None else printing.sig(self.target)
        verdict = "<=" if now.meets_target else ">"
        lines = (
            f"data:  n = {self.n}, epsilon = {self.epsilon:g}; target: per-cell RMSE <= {target}",
            f"now:  K = {now.K} ({' x '.join(str(k) for k in now.alphabet_sizes)}), m = {now.m} (m*): per-cell "
            f"RMSE {printing.sig(now.predicted_rmse_per_cell)} {verdict} target {printing.sig(now.target)}",
        )
        rows = tuple((str(i), str(s.figures.K), str(s.figures.m), printing.sig(s.figures.predicted_rmse_per_cell),
                      printing.sig(s.figures.target), ", ".join(s.keeps))
                     for i, s in enumerate(self.suggestions, 1))  # fmt: skip
        notes: list[str] = []
        if now.meets_target:
            notes.append("The schemas meet the target as they are: nothing to give up.")
        elif self.grid_size == 0:
            notes.append("Only alphabet sizes given: the schemas are needed to search for drops and merges.")
        elif not self.suggestions:
            notes.append("No change of the schemas (drops, bin merges, group merges) meets the target.")
        for i, s in enumerate(self.suggestions, 1):
            notes += [f"{i}. gives up {item}" for item in s.gives_up]
        if self.omitted:
            notes.append(f"... and {self.omitted} more suggestion(s) (a larger limit lists them)")
        found = self.epsilon_unchanged
        if found is None:
            notes.append(f"unchanged schemas: no epsilon <= {MAX_SUGGESTED_EPSILON:g} meets the target")
        elif not now.meets_target:
            notes.append(f"unchanged schemas: epsilon = {found.epsilon:g} would meet it, at m = {found.m} (m*): "
                         f"per-cell RMSE {printing.sig(found.predicted_rmse_per_cell)}")  # fmt: skip
        if self.grid_size:
            thinned = f"; bin merges thinned for {', '.join(self.thinned)}" if self.thinned else ""
            notes.append(f"searched {self.grid_size} combinations (per attribute: keep, merge into groups, merge "
                         f"adjacent bins or drop; every curator keeps an attribute{thinned})")  # fmt: skip
        return printing.Block(
            "Schema changes that meet the per-cell RMSE target", lines=lines,
            header=("#", "K", "m", "RMSE/cell", "target", "keeps") if rows else (), rows=rows, align="rrrrrl",
            notes=tuple(notes),
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        now = self.current
        more = f" (+{self.omitted} more)" if self.omitted else ""
        return printing.short_repr(
            "SuggestionReport",
            f"n = {self.n}, epsilon = {self.epsilon:g}: {len(self.suggestions)} suggestion(s){more}; now K = {now.K}, "
            f"per-cell RMSE {printing.sig(now.predicted_rmse_per_cell)} "
            f"{'<=' if now.meets_target else '>'} target {printing.sig(now.target)}",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


def search_grid(schemas: Sequence[CuratorSchema]) -> tuple[list[list[Option]], list[str]]:
    """Every attribute's options (curator by curator, in schema order), thinned until their
    product is at most :data:`MAX_GRID`; also the names of the thinned attributes."""
    names = [a.name for s in schemas for a in s.attributes]
    options = [attribute_options(a) for s in schemas for a in s.attributes]
    thinned: list[str] = []
    while prod(len(o) for o in options) > MAX_GRID:
        widest = max(range(len(options)), key=lambda i: (len(options[i]) - len(_ladder(options[i])), -i))
        shorter = _ladder(options[widest])
        if len(shorter) == len(options[widest]):
            raise SearchTooLargeError(
                f"the search would try {prod(len(o) for o in options)} combinations of "
                f"{len(options)} attributes' options (at most {MAX_GRID}); give fewer attributes"
            )
        options[widest] = shorter
        thinned.append(names[widest])
    return options, thinned


def feasible_grid(
    options: Sequence[Sequence[Option]], owners: Sequence[int], n: int, epsilon: float, target: float | None
) -> tuple[npt.NDArray[np.bool_], dict[int, Figures]]:
    """Which cells of the option grid meet the target (every curator keeping an attribute, K >=
    2), and the figures of each distinct K (one :func:`plan_figures` call per K)."""
    shape = tuple(len(o) for o in options)

    def along(axis: int, values: list[Any], dtype: Any) -> npt.NDArray[Any]:  # one axis's values, broadcastable
        view = [1] * len(shape)
        view[axis] = len(values)
        return np.asarray(values, dtype=dtype).reshape(view)

    K = np.ones(shape, dtype=np.int64)
    for axis, opts in enumerate(options):
        K = K * along(axis, [o.size for o in opts], np.int64)
    valid = K >= 2
    for curator in sorted(set(owners)):  # a curator with every attribute dropped is no curator
        all_dropped = np.ones(shape, dtype=np.bool_)
        for axis, opts in enumerate(options):
            if owners[axis] == curator:
                all_dropped = all_dropped & along(axis, [o.kind == "drop" for o in opts], np.bool_)
        valid &= ~all_dropped
    figures: dict[int, Figures] = {}
    for k in np.unique(K[valid]).tolist():
        figures[int(k)] = plan_figures(n, (int(k), 1), epsilon, target)
    meets = {k for k, f in figures.items() if f.meets_target}
    return valid & np.isin(K, np.asarray(sorted(meets), dtype=np.int64)), figures


def pareto_front(feasible: npt.NDArray[np.bool_]) -> npt.NDArray[np.intp]:
    """The cells of ``feasible`` (indices finest first on every axis) that no other feasible
    cell dominates (as fine or finer on every axis, finer on one), as rows of indices: first the
    cells whose one-step-finer neighbours all fail, then those dominated among them removed."""
    local = feasible.copy()
    for axis in range(feasible.ndim):
        finer = [slice(None)] * feasible.ndim
        here = [slice(None)] * feasible.ndim
        finer[axis], here[axis] = slice(None, -1), slice(1, None)
        local[tuple(here)] &= ~feasible[tuple(finer)]
    cells = np.argwhere(local)
    if len(cells) <= 1:
        return cells
    keep = np.ones(len(cells), dtype=np.bool_)
    for start in range(0, len(cells), 256):  # blocks of rows: memory 256 x cells x axes
        block = cells[start:start + 256]
        le = np.all(cells[None, :, :] <= block[:, None, :], axis=2)
        lt = np.any(cells[None, :, :] < block[:, None, :], axis=2)
        keep[start:start + 256] = ~np.any(le & lt, axis=1)
    return np.asarray(cells[keep])


def sufficient_epsilon(
    n: int, alphabet_sizes: Sequence[int], epsilon: float, target: float | None = None
) -> Figures | None:
    """The smallest epsilon (to 0.1%, then rounded up to 3 significant digits) at which the
    unchanged alphabets' plan (m = m*) meets the target, or None if not even
    :data:`MAX_SUGGESTED_EPSILON` does. Bisection in log epsilon between ``epsilon`` and the
    maximum (the per-cell RMSE at m* falls as epsilon grows; the value returned is checked)."""
    now = plan_figures(n, alphabet_sizes, epsilon, target)
    if now.meets_target:
        return now
    if not plan_figures(n, alphabet_sizes, MAX_SUGGESTED_EPSILON, target).meets_target:
        return None
    lo, hi = epsilon, MAX_SUGGESTED_EPSILON
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if plan_figures(n, alphabet_sizes, mid, target).meets_target:
            hi = mid
        else:
            lo = mid
    digits = 2 - math.floor(math.log10(hi))  # hi <= 50: digits >= 1
    rounded = plan_figures(n, alphabet_sizes, round(math.ceil(hi * 10**digits) / 10**digits, digits), target)
    return rounded if rounded.meets_target else plan_figures(n, alphabet_sizes, hi, target)


def suggest_changes(
    schemas: Sequence[CuratorSchema], n: int, epsilon: float, target: float | None = None, limit: int = DEFAULT_LIMIT
) -> SuggestionReport:
    """The smallest schema changes whose plan meets ``target`` (an absolute per-cell RMSE; None:
    :func:`default_target` of the changed K), sorted by what they keep: most attributes kept,
    then most cells K, then fewest attributes changed, then the attributes' order; at most
    ``limit`` (``omitted`` counts the rest). See the module text for the search and its bound."""
    check_target(target)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidSuggestionLimitError(f"limit (how many suggestions to list) must be an integer >= 1, "
                                          f"got {limit!r}")  # fmt: skip
    sizes = tuple(s.alphabet_size for s in schemas)
    current = plan_figures(n, sizes, epsilon, target)
    options, thinned = search_grid(schemas)
    owners = [j for j, s in enumerate(schemas) for _ in s.attributes]
    grid_size = prod(len(o) for o in options)
    found: list[Suggestion] = []
    if not current.meets_target:
        feasible, by_k = feasible_grid(options, owners, n, epsilon, target)
        for cell in pareto_front(feasible).tolist():
            chosen = [options[axis][i] for axis, i in enumerate(cell)]
            changed = tuple(
                CuratorSchema(s.name, tuple(o.attribute for o, j in zip(chosen, owners, strict=True)
                                            if j == jj and o.attribute is not None))
                for jj, s in enumerate(schemas)
            )  # fmt: skip
            alphabet = tuple(c.alphabet_size for c in changed)
            figures = replace(by_k[prod(alphabet)], alphabet_sizes=alphabet)  # the figures depend on K alone
            keeps = tuple(f"{o.attribute.name} ({o.size})" for o in chosen if o.attribute is not None)
            found.append(Suggestion(figures, changed, tuple(o.gives_up for o in chosen if o.kind != "keep"),
                                    len(keeps), keeps))  # fmt: skip
        found.sort(key=lambda s: (-s.attributes_kept, -s.figures.K, len(s.gives_up), s.gives_up))
    return SuggestionReport(
        n, float(epsilon), target, current, tuple(found[:limit]), max(len(found) - limit, 0),
        sufficient_epsilon(n, sizes, epsilon, target), grid_size, tuple(thinned),
    )  # fmt: skip


def suggest_for_alphabets(
    alphabet_sizes: Sequence[int], n: int, epsilon: float, target: float | None = None
) -> SuggestionReport:
    """Only the alphabet sizes known (no schemas): nothing to drop or merge, so only the current
    figures and the epsilon that would meet ``target`` with them unchanged (``grid_size`` 0)."""
    check_target(target)
    current = plan_figures(n, alphabet_sizes, epsilon, target)
    return SuggestionReport(n, float(epsilon), target, current, (), 0,
                            sufficient_epsilon(n, alphabet_sizes, epsilon, target), 0)  # fmt: skip


# ------------------------------------------------------------------ the power view (--power)
@dataclass(frozen=True)
class PairPowerView:
    """What the schemas now and each suggestion do to the detectable dependence of one pair of
    attributes (:func:`mechanism.analysis.power.power_plan` at each one's m = m*, the figures' m); a
    suggestion that drops one of the pair has None: the pair cannot be tested after it."""

    attributes: tuple[str, str]
    current: PowerPlan
    suggestions: tuple[PowerPlan | None, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "attributes": list(self.attributes),
            "current": self.current.to_dict(),
            "suggestions": [None if p is None else p.to_dict() for p in self.suggestions],
        }

    # ------------------------------------------------------------------- reading the view
    def columns(self) -> dict[str, list[Any]]:
        """One row now, then one per suggestion (as named columns, for a DataFrame): which, the
        pair's levels (None: the suggestion drops one of the pair), m, the smallest detectable
        Cramer's V and its ratio to now's."""
        plans = [self.current, *self.suggestions]
        now = self.current.min_detectable_cramers_v
        return {
            "at": ["now", *(f"suggestion {i}" for i in range(1, len(self.suggestions) + 1))],
            "levels": [None if p is None else f"{p.levels[0]} x {p.levels[1]}" for p in plans],
            "m": [None if p is None else p.m for p in plans],
            "min_detectable_cramers_v": [None if p is None else p.min_detectable_cramers_v for p in plans],
            "ratio_to_now": [None if p is None else _ratio_to(p.min_detectable_cramers_v, now) for p in plans],
        }

    def block(self) -> printing.Block:
        """The pair's detectable V now and after each suggestion, as a table."""
        a, b = self.attributes
        cols = self.columns()
        rows = []
        for at, levels, m, v, ratio in zip(*cols.values(), strict=True):
            if levels is None:
                rows.append((at, "-", "-", "not testable", ""))
                continue
            rows.append((at, levels, str(m), printing.fixed(v) if math.isfinite(v) else "none",
                         printing.sig(ratio, 3) if math.isfinite(ratio) else ""))  # fmt: skip
        c = self.current
        notes = ["not testable: the suggestion drops one of the pair"] if None in self.suggestions else []
        if any(row[3] == "none" for row in rows):
            notes.append("none: no table is dependent enough to be detected with this power")
        return printing.Block(
            f"Detectable dependence of {a} x {b}, now and after each suggestion",
            lines=(f"smallest Cramer's V detected with probability {c.power:g} at level {c.alpha:g}; assumes "
                   f"{c.assumption}",),
            header=("at", "levels", "m", "detectable V", "vs now"), rows=tuple(rows), align="lrrrr",
            notes=tuple(notes),
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        v = self.current.min_detectable_cramers_v
        return printing.short_repr(
            "PairPowerView",
            f"{self.attributes[0]} x {self.attributes[1]}: detectable Cramer's V now "
            f"{printing.fixed(v) if math.isfinite(v) else 'none'}, {len(self.suggestions)} suggestion(s)",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


def _ratio_to(value: float, now: float) -> float:
    return value / now if math.isfinite(value) and math.isfinite(now) and now > 0 else math.nan


def pair_power_view(
    schemas: Sequence[CuratorSchema], report: SuggestionReport, a_name: str, b_name: str,
    alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
) -> PairPowerView:  # fmt: skip
    """The :class:`PairPowerView` of attributes ``a_name`` and ``b_name`` for ``report``, the
    suggestions of :func:`suggest_changes` on ``schemas``. Public inputs only."""
    current = power_plan(report.n, list(schemas), report.epsilon, a_name, b_name, alpha=alpha, power=power)
    plans: list[PowerPlan | None] = []
    for suggestion in report.suggestions:
        names = {a.name for s in suggestion.schemas for a in s.attributes}
        plans.append(power_plan(report.n, list(suggestion.schemas), report.epsilon, a_name, b_name, alpha=alpha,
                                power=power) if {a_name, b_name} <= names else None)  # fmt: skip
    return PairPowerView((a_name, b_name), current, tuple(plans))
