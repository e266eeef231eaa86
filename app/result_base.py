"""The foundation of the notebook's :class:`~secure_release.api.Result`: what it holds, and which
of a release's tables answers what.

``api.Result`` is assembled from one class per concern, each a subclass of :class:`ResultBase`
in a module of its own: the cells (``result_views``), the analyses (``result_analyses``), the
exports (``result_export``). This base holds the fields, the plan, attributes and guarantee, the
printing, and the routing of a release of several tables (a designed release):
:meth:`ResultBase.tables` lists them, :meth:`ResultBase.part` gives one, and
:meth:`ResultBase._route` picks the table that holds the attributes an analysis names. Every
method of a concern reads one table of cells; in a release of several tables it first forwards
to ``self._route(names)``, the part that holds them (typed ``Self``: a part is of its whole's
class), whose same method then reads that table's cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self, cast

import numpy as np
import numpy.typing as npt

from secure_release import analysis
from secure_release.mechanism.analysis.design import Design
from secure_release.mechanism.errors import NoTableHoldsError
from secure_release.mechanism.estimation.report import ReleaseReport, TablesReport
from secure_release.mechanism.privacy.guarantee import guarantee_statement, privacy_guarantee, tables_guarantee
from secure_release.mechanism.privacy.plan import ReleasePlan

FloatArray = npt.NDArray[np.float64]


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is one: "1 table", "3 tables"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@dataclass(frozen=True, repr=False)
class ResultBase:
    """The fields of a released estimate and the routing of a release of several tables (the
    class documentation is :class:`secure_release.api.Result`'s)."""

    report: ReleaseReport
    truth: FloatArray | None = None
    warnings: tuple[str, ...] = field(default=())
    #: A release of several tables (a designed release): one single-table Result a table, in the
    #: design's order (None: not estimated, ``tables_report.missing`` says why), and the release's
    #: :class:`TablesReport`. ``report`` (and ``truth``) is then the first estimated table's.
    parts: tuple[ResultBase | None, ...] = field(default=())
    tables_report: TablesReport | None = None
    #: A table of a release of several tables: the whole release (its guarantee is the table's).
    whole: ResultBase | None = field(default=None, repr=False, compare=False)

    # ---------------------------------------------------------- a release of several tables
    @property
    def designed(self) -> bool:
        """Whether this is a release of several tables (a design's), not the whole joint."""
        return self.tables_report is not None

    @property
    def design(self) -> Design | None:
        """The design the curators ran (a release of several tables), else None."""
        return None if self.tables_report is None else Design.from_dict(self.tables_report.design)

    def part(self, table: int) -> Self:
        """Table ``table`` (1-based, as :meth:`tables` numbers them) as a single-table Result: its
        cells, marginals, page. A release of the whole joint has one table, itself."""
        parts = self.parts or (self,)
        if not 1 <= table <= len(parts):
            held = "table 1" if len(parts) == 1 else f"tables 1 to {len(parts)}"
            raise NoTableHoldsError(f"release {self.report.release_id!r} has {held}, not {table}; "
                                    f"its tables: {self._table_list()}")  # fmt: skip
        found = parts[table - 1]
        if found is None:
            assert self.tables_report is not None
            why = self.tables_report.missing.get(table - 1, "not estimated")
            raise NoTableHoldsError(f"table {table} of release {self.report.release_id!r} was not estimated: {why}")
        return cast(Self, found)  # a part is of its whole's class (api.result_from_tables)

    def _table_list(self) -> str:
        """The release's tables for a message: 'table 1 (a, x); table 2 (b, y): not estimated (why)'."""
        out = []
        for info in self.tables().rows:
            text = f"table {info.table} ({', '.join(info.attributes)})"
            out.append(text + (f": not estimated ({info.missing})" if info.missing else ""))
        return "; ".join(out)

    def _route(self, *names: Sequence[str] | str | None) -> Self:
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
        return cast(Self, max(holding, key=lambda p: p.report.plan.m * p.report.plan.channel.keep**2))

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
            count = counted(len(t.tables), "table")
            lines = [f"<Result {t.release_id}: {count} from disjoint samples of n={self.report.plan.n}, "
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

