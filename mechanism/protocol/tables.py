"""A release of several tables from disjoint samples (docs/privacy.md, Eqs. T1-T4), as the
protocol carries it: one alignment, one sampled ordered tuple of M = sum_t m_t rows, rows
[s_t, s_t + m_t) of it forming table t's group. In table t's rows a curator uploads the symbol of
its attributes in that table (alphabet k_t,j; 1 and always 0 if it has none there), under its pad
modulo k_t,j (``ReleasePad`` with segments), and the server applies gamma_t-diagonal PRAM on
table t's joint (:func:`perturb_rows`). The server learns the m_t and the k_t,j, as it learns m
and k_j of a single table, and nothing else.

:class:`TableLayout` is what the spec carries per table; :func:`layouts_for` makes the layouts of
a design's tables for the aligned n; :func:`check_layouts` is the one check every party runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import (
    ShapeMismatchError,
    UnknownAttributeError,
)
from secure_release.mechanism.estimation.report import ReleaseEstimate, ReleaseReport, TablesReport, build_report
from secure_release.mechanism.primitives.keys import PramKey
from secure_release.mechanism.primitives.pads import Segments
from secure_release.mechanism.primitives.pram import PramChannel, check_gamma, perturb_table
from secure_release.mechanism.privacy import disjoint_tables
from secure_release.mechanism.privacy.plan import ReleasePlan
from secure_release.mechanism.schema import (
    CuratorSchema,
    JointSchema,
    SymbolArray,
    check_joint_alphabet,
    mixed_radix_decode,
    mixed_radix_encode,
)

#: At most this many tables in one release (each is a segment every curator's column carries).
MAX_TABLES = 64


@dataclass(frozen=True)
class TableLayout:
    """One table of a release: its m_t sampled rows, gamma_t, and each curator's alphabet in it
    (spec order; 1 for a curator with no attribute in the table)."""

    m: int
    gamma: float
    alphabet_sizes: tuple[int, ...]

    @property
    def joint_size(self) -> int:
        return prod(self.alphabet_sizes)

    @property
    def channel(self) -> PramChannel:
        return PramChannel(self.gamma, self.joint_size)

    @property
    def live(self) -> tuple[int, ...]:
        """The curators (spec indices) with an attribute in this table."""
        return tuple(j for j, k in enumerate(self.alphabet_sizes) if k > 1)

    def to_dict(self) -> dict[str, Any]:
        return {"m": self.m, "gamma": self.gamma, "alphabet_sizes": list(self.alphabet_sizes)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TableLayout:
        return cls(int(d["m"]), float(d["gamma"]), tuple(int(k) for k in d["alphabet_sizes"]))


def check_layouts(
    n: int, curator_alphabets: Sequence[int], epsilon: float, layouts: Sequence[TableLayout]
) -> tuple[TableLayout, ...]:
    """Raise a named error unless ``layouts`` is a release of 1..MAX_TABLES tables on these
    curators: each m_t >= 1 with sum_t m_t <= n, each k_t,j in 1..k_j with some curator in every
    table, a valid gamma_t, and Eq. (T1)'s epsilon of the whole (``release_epsilon``, rounded up)
    not above ``epsilon``."""
    out = tuple(layouts)
    if not 1 <= len(out) <= MAX_TABLES:
        raise ShapeMismatchError(f"a release has 1 to {MAX_TABLES} tables, got {len(out)}")
    for t, layout in enumerate(out):
        if len(layout.alphabet_sizes) != len(curator_alphabets):
            raise ShapeMismatchError(
                f"table {t} gives {len(layout.alphabet_sizes)} alphabet sizes for {len(curator_alphabets)} curators"
            )
        check_joint_alphabet(layout.alphabet_sizes)
        if any(k > kc for k, kc in zip(layout.alphabet_sizes, curator_alphabets, strict=True)):
            raise ShapeMismatchError(
                f"table {t}'s alphabets {list(layout.alphabet_sizes)} exceed the curators' {list(curator_alphabets)}"
            )
        if not layout.live:
            raise ShapeMismatchError(f"table {t} holds no curator's attribute (every alphabet is 1)")
        check_gamma(layout.gamma)
    ms, gammas = [x.m for x in out], [x.gamma for x in out]
    disjoint_tables.check_sample_sizes(n, ms)
    charged = disjoint_tables.release_epsilon(n, ms, gammas)
    if charged > epsilon:
        raise ShapeMismatchError(
            f"the tables' epsilon (Eq. T1) is {charged!r}, above the release's {epsilon!r}: "
            "a gamma_t is too large for its m_t"
        )
    return out


def row_starts(layouts: Sequence[TableLayout]) -> list[int]:
    """s_0 = 0, s_1 = m_0, ..., s_T = M: table t holds rows [s_t, s_t+1) of the sampled tuple."""
    return [0, *np.cumsum([x.m for x in layouts]).tolist()]


def segments_of(layouts: Sequence[TableLayout], curator: int) -> Segments:
    """The (m_t, k_t,j) of curator ``curator``'s pad (``ReleasePad(segments=...)``)."""
    return tuple((x.m, x.alphabet_sizes[curator]) for x in layouts)


def _overlaps(layouts: Sequence[TableLayout], first_row: int, rows: int) -> list[tuple[int, int, int]]:
    """(table, lo, hi) of the tables' rows within [first_row, first_row + rows), local to it."""
    starts = row_starts(layouts)
    out = []
    for t in range(len(layouts)):
        lo, hi = max(first_row, starts[t]), min(first_row + rows, starts[t + 1])
        if lo < hi:
            out.append((t, lo - first_row, hi - first_row))
    return out


def perturb_rows(
    columns: Sequence[SymbolArray], layouts: Sequence[TableLayout], key: PramKey, first_row: int = 0
) -> list[SymbolArray]:
    """The server's PRAM on rows [first_row, first_row + len) of a release of several tables:
    each table's rows with gamma_t-diagonal PRAM on its joint, from its own keystream
    (``pram.perturb_table``). A caller may split the rows anywhere on a PRAM block boundary."""
    rows = len(columns[0]) if columns else 0
    if any(len(c) != rows for c in columns):
        raise ShapeMismatchError(f"curator columns differ in length: {sorted({len(c) for c in columns})}")
    out = [np.empty(rows, dtype=np.uint32) for _ in columns]
    for t, lo, hi in _overlaps(layouts, first_row, rows):
        x = layouts[t]
        done = perturb_table([c[lo:hi] for c in columns], x.alphabet_sizes, x.channel, key, t, first_row + lo)
        for o, d in zip(out, done, strict=True):
            o[lo:hi] = d
    return out


def check_rows(symbols: SymbolArray, layouts: Sequence[TableLayout], curator: int, first_row: int) -> None:
    """Raise unless each of a curator's symbols at rows [first_row, ...) is below its table's
    alphabet for that curator (the server checks every upload chunk)."""
    for t, lo, hi in _overlaps(layouts, first_row, int(symbols.size)):
        k = layouts[t].alphabet_sizes[curator]
        part = symbols[lo:hi]
        if part.size and int(part.max()) >= k:
            raise ShapeMismatchError(
                f"table {t}'s rows of curator {curator} hold symbol {int(part.max())}; its alphabet there is 0..{k - 1}"
            )


def count_rows(
    columns: Sequence[SymbolArray | None],
    layouts: Sequence[TableLayout],
    first_row: int,
    counts: list[npt.NDArray[np.int64]],
) -> None:
    """Add the decrypted rows [first_row, ...) to each table's observed counts over its live
    curators (``counts[t]`` has prod of their k_t,j cells, curator-major). A column of None: a
    curator whose key the researcher lacks (its tables are not counted: their counts stay
    as they are and the caller reports them missing)."""
    rows = next(len(c) for c in columns if c is not None)
    for t, lo, hi in _overlaps(layouts, first_row, rows):
        x = layouts[t]
        if any(columns[j] is None for j in x.live):
            continue
        digits = [np.asarray(columns[j])[lo:hi] for j in x.live]
        sizes = [x.alphabet_sizes[j] for j in x.live]
        counts[t] += np.bincount(mixed_radix_encode(digits, sizes), minlength=prod(sizes))


def table_plan(n: int, epsilon: float, layout: TableLayout) -> ReleasePlan:
    """Table t as a plan the estimators read: n, m_t, its live curators' alphabets, gamma_t;
    ``epsilon`` is the whole release's (the table alone would be Theorem 3.2 at m_t, gamma_t)."""
    return ReleasePlan(n, layout.m, tuple(layout.alphabet_sizes[j] for j in layout.live), epsilon, layout.gamma)


@dataclass(frozen=True)
class TablesPlan:
    """What a design file fixes for the protocol (``mechanism.analysis.design.Design`` reduced to
    what the parties need): every curator's schema, each table's (attributes, m_t, gamma_t) as
    planned for ``planned_n`` records, the total epsilon and the design's digest."""

    schemas: tuple[CuratorSchema, ...]
    tables: tuple[tuple[tuple[str, ...], int, float], ...]
    epsilon: float
    planned_n: int
    digest: str

    def schema_of(self, curator: str) -> CuratorSchema:
        for s in self.schemas:
            if s.name == curator:
                return s
        raise UnknownAttributeError(
            f"the design has no schema for curator {curator!r}; it has {[s.name for s in self.schemas]}"
        )

    @property
    def table_attributes(self) -> list[tuple[str, ...]]:
        return [a for a, _, _ in self.tables]

    def layouts(self, n: int, curators: Sequence[str]) -> tuple[TableLayout, ...]:
        """The layouts for ``n`` aligned records of ``curators`` (spec order)."""
        return layouts_for(n, [self.schema_of(c) for c in curators], self.tables, self.epsilon, self.planned_n)


# --------------------------------------------------------------------------- from attributes
def sub_schema(schema: CuratorSchema, attributes: Sequence[str]) -> CuratorSchema | None:
    """``schema`` restricted to ``attributes`` (kept in the schema's order), None if it has none."""
    names = set(attributes)
    kept = tuple(a for a in schema.attributes if a.name in names)
    return CuratorSchema(schema.name, kept) if kept else None


def symbol_map(schema: CuratorSchema, attributes: Sequence[str]) -> npt.NDArray[np.uint32]:
    """lut[x] = the symbol of full-schema symbol x in :func:`sub_schema` (0 for every x if the
    curator has none of ``attributes``): a curator's table-t column is ``lut[sample]``."""
    radices = schema.radices
    digits = mixed_radix_decode(np.arange(schema.alphabet_size, dtype=np.int64), radices)
    names = set(attributes)
    keep = [j for j, a in enumerate(schema.attributes) if a.name in names]
    if not keep:
        return np.zeros(schema.alphabet_size, dtype=np.uint32)
    return mixed_radix_encode([digits[j] for j in keep], [radices[j] for j in keep]).astype(np.uint32)


def project_rows(
    sample: SymbolArray, schema: CuratorSchema, tables: Sequence[Sequence[str]], layouts: Sequence[TableLayout],
    first_row: int = 0,
) -> SymbolArray:
    """A curator's sampled full-schema symbols at rows [first_row, ...) as its designed column:
    in table t's rows, the symbol of its attributes in table t (vectorized lookups)."""
    out = np.empty(sample.size, dtype=np.uint32)
    for t, lo, hi in _overlaps(layouts, first_row, int(sample.size)):
        out[lo:hi] = symbol_map(schema, tables[t])[sample[lo:hi]]
    return out


def layouts_for(
    n: int,
    schemas: Sequence[CuratorSchema],
    tables: Sequence[tuple[Sequence[str], int, float]],
    epsilon: float,
    planned_n: int | None = None,
) -> tuple[TableLayout, ...]:
    """The layouts of ``tables`` (attributes, m_t, gamma_t as a design planned them for
    ``planned_n`` records) on the curators' ``schemas`` for ``n`` aligned records. At the planned
    n the m_t and gamma_t are kept; at another n each m_t scales with n (floored, at least 1) and
    the gammas are Eq. (T4)'s for the new sizes with the planned gamma_t - 1 as weights, so the
    whole keeps exactly ``epsilon``. Raises :class:`UnknownAttributeError` for an attribute no
    curator has."""
    known = {a.name for s in schemas for a in s.attributes}
    for attributes, _, _ in tables:
        unknown = sorted(set(attributes) - known)
        if unknown:
            raise UnknownAttributeError(f"a table names {unknown}, which no curator has; there are {sorted(known)}")
    sizes = [
        tuple(1 if (sub := sub_schema(s, attrs)) is None else sub.alphabet_size for s in schemas)
        for attrs, _, _ in tables
    ]
    ms = [int(m) for _, m, _ in tables]
    gammas = [float(g) for _, _, g in tables]
    if planned_n is not None and planned_n != n:
        ms = [max(1, m * n // planned_n) for m in ms]
        while sum(ms) > n:  # only when many tables hit the floor of 1 at a tiny n
            ms[int(np.argmax(ms))] -= 1
        gammas = list(disjoint_tables.gammas_for_epsilon(n, ms, epsilon, [g - 1.0 for g in gammas]))
    layouts = tuple(TableLayout(m, g, k) for m, g, k in zip(ms, gammas, sizes, strict=True))
    return check_layouts(n, [s.alphabet_size for s in schemas], epsilon, layouts)


def tables_report(
    release_id: str,
    curators: Sequence[str],
    n: int,
    epsilon: float,
    layouts: Sequence[TableLayout],
    table_attributes: Sequence[Sequence[str]],
    schemas: Mapping[str, CuratorSchema],
    estimates: Sequence[ReleaseEstimate | None],
    design: Mapping[str, Any],
    design_digest: str,
    missing: Mapping[int, str] | None = None,
) -> TablesReport:
    """The researcher's :class:`TablesReport`: each estimated table labelled with its live
    curators' :func:`sub_schema` (cells in their order), its plan :func:`table_plan`; the whole
    release's epsilon (Eq. T1, as charged) beside sequential composition (Eq. T3)."""
    reports: list[ReleaseReport | None] = []
    for layout, attributes, estimate in zip(layouts, table_attributes, estimates, strict=True):
        if estimate is None:
            reports.append(None)
            continue
        names = [curators[j] for j in layout.live]
        subs = [sub_schema(schemas[c], attributes) for c in names]
        joint = JointSchema(tuple(s for s in subs if s is not None))
        reports.append(build_report(release_id, table_plan(n, epsilon, layout), names, estimate, joint))
    ms, gammas = [x.m for x in layouts], [x.gamma for x in layouts]
    return TablesReport(
        release_id=release_id,
        tables=tuple(reports),
        design=dict(design),
        design_digest=design_digest,
        epsilon=disjoint_tables.release_epsilon(n, ms, gammas),
        sequential_epsilon=disjoint_tables.sequential_epsilon(n, ms, gammas),
        missing=dict(missing or {}),
    )
