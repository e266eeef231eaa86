"""The researcher's result as one typed value: :class:`ReleaseReport`.

The JSON and CSV files, the ``EstimateResponse`` on the wire and the printed tables are all
derived from it (``to_dict``/``from_dict`` for JSON; ``infra.wire`` for the proto).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import MultiTableResultError
from secure_release.mechanism.estimation.estimators import DEFAULT_ESTIMATOR
from secure_release.mechanism.estimation.unified import hold_estimate
from secure_release.mechanism.privacy.guarantee import plan_report
from secure_release.mechanism.privacy.plan import ReleasePlan
from secure_release.mechanism.schema import JointSchema


@dataclass(frozen=True)
class ReleaseEstimate:
    """Estimates of the joint (or a marginal) type with standard errors and 95% intervals
    (``interval_label`` says how they were made, e.g. "clopper-pearson, 95% per cell")."""

    curators: tuple[int, ...]
    alphabet_sizes: tuple[int, ...]
    counts: npt.NDArray[np.int64]
    raw: npt.NDArray[np.float64]
    projected: npt.NDArray[np.float64]
    mle: npt.NDArray[np.float64]
    standard_errors: npt.NDArray[np.float64]
    ci_low: npt.NDArray[np.float64]
    ci_high: npt.NDArray[np.float64]
    mle_iterations: int
    mle_converged: bool
    is_marginal: bool
    interval_label: str


#: The per-cell fields of :class:`ReleaseReport` (and of the proto's ``Cell``), by their own
#: names: ``estimate`` here is the raw A^-1 estimate. Outputs use :data:`OUTPUT_COLUMNS` instead.
CELL_COLUMNS = ("estimate", "projected", "mle", "standard_error", "ci_low", "ci_high", "observed")

#: The output vocabulary: every table, file, page and chart names its per-cell columns so and
#: in this order (the headline first). A marginal has the same; a conditional table has the
#: ones that make sense for a probability (``estimate``, ``mle``, ``ci_low``, ``ci_high``).
OUTPUT_COLUMNS = ("estimate", "raw", "mle", "se", "ci_low", "ci_high", "observed")

#: What each output column holds; the rule for the intervals is in ``ci_low``'s line.
COLUMN_MEANINGS = {
    "estimate": "the headline: this table's raw estimate projected onto its own probability simplex (>= 0, "
    "summing to 1), so never further (l2) from this table's true shares than its raw column; a marginal or "
    "conditional table projects its own raw estimate, so tables need not sum exactly into one another "
    "(docs/estimators.md)",
    "raw": "the unbiased A^-1 estimate of the share (noise can make it negative); for unbiased aggregation",
    "mle": "the maximum-likelihood estimate (EM), >= 0 and summing to 1",
    "se": "the standard error of raw (the exact variance formula at the estimate)",
    "ci_low": "the 95% interval [ci_low, ci_high] is of the true share itself (exact, from the observed count; "
    "report.interval_method), not of one estimator: read it beside estimate, the headline",
    "ci_high": "the interval's upper end (see ci_low)",
    "observed": "how many of the m perturbed, decrypted records fell in the cell",
}

#: The :class:`ReleaseReport` field each output column reads.
FIELD_OF_COLUMN = {
    "estimate": DEFAULT_ESTIMATOR,
    "raw": "estimate",
    "mle": "mle",
    "se": "standard_error",
    "ci_low": "ci_low",
    "ci_high": "ci_high",
    "observed": "observed",
}
#: Reports written before the interval method was recorded used the normal interval.
NORMAL_INTERVAL = "normal (raw estimate +- 1.96 SE)"


def spans_zero(low: npt.ArrayLike, high: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """The cells whose 95% interval ``[low, high]`` reaches 0: their share is not
    distinguishable from an empty cell (the ``*`` of the text tables, ``ci_spans_zero`` of the
    frames, the page's count)."""
    return np.asarray((np.asarray(low) <= 0.0) & (np.asarray(high) >= 0.0))


@dataclass(frozen=True)
class CellRow:
    """One cell of a report, for printing and serialising."""

    labels: tuple[str, ...]
    estimate: float
    projected: float
    mle: float
    standard_error: float
    ci_low: float
    ci_high: float
    observed: int


@dataclass(frozen=True)
class ReleaseReport:
    """A finished release: the cells of the joint (or marginal) estimate and the privacy plan.

    ``covered`` are the curators whose attributes the cells span (all of them unless some
    refused their keys, then ``marginal`` is True and ``refused`` says who and why).
    """

    release_id: str
    plan: ReleasePlan
    curators: tuple[str, ...]
    covered: tuple[str, ...]
    attributes: tuple[str, ...]
    labels: tuple[tuple[str, ...], ...]
    estimate: npt.NDArray[np.float64]
    projected: npt.NDArray[np.float64]
    mle: npt.NDArray[np.float64]
    standard_error: npt.NDArray[np.float64]
    ci_low: npt.NDArray[np.float64]
    ci_high: npt.NDArray[np.float64]
    observed: npt.NDArray[np.int64]
    mle_iterations: int = 0
    interval_method: str = NORMAL_INTERVAL
    refused: Mapping[str, str] = field(default_factory=dict)

    @property
    def headline(self) -> npt.NDArray[np.float64]:
        """The estimate the report leads with (``estimators.DEFAULT_ESTIMATOR``, the projection;
        the raw A^-1 estimate stays in :attr:`estimate`)."""
        out: npt.NDArray[np.float64] = getattr(self, DEFAULT_ESTIMATOR)
        return out

    @property
    def marginal(self) -> bool:
        return len(self.covered) < len(self.curators)

    @property
    def note(self) -> str:
        if not self.marginal:
            return "joint estimate over every curator"
        return (
            "MARGINAL ONLY: curators " + ", ".join(sorted(self.refused)) + " did not grant their "
            "keys; the cells cover only " + ", ".join(self.covered)
        )

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        """The per-cell arrays under their output names, in :data:`OUTPUT_COLUMNS` order."""
        return {name: getattr(self, FIELD_OF_COLUMN[name]) for name in OUTPUT_COLUMNS}

    def cells(self) -> Iterator[CellRow]:
        """The cells in joint-code order."""
        for c, labels in enumerate(self.labels):
            yield CellRow(
                labels,
                float(self.estimate[c]),
                float(self.projected[c]),
                float(self.mle[c]),
                float(self.standard_error[c]),
                float(self.ci_low[c]),
                float(self.ci_high[c]),
                int(self.observed[c]),
            )

    def privacy(self) -> dict[str, Any]:
        """The plan's privacy and utility figures (keys of ``secure-release plan --json``)."""
        return plan_report(self.plan)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON form: cells in the output vocabulary (:data:`OUTPUT_COLUMNS`, explained in
        ``columns``); :meth:`from_dict` reads it and the older form."""
        columns = {name: values.tolist() for name, values in self.columns().items()}
        return {
            "release_id": self.release_id,
            "marginal": self.marginal,
            "note": self.note,
            "refused": dict(self.refused),
            "all_curators": list(self.curators),
            "curators": list(self.covered),
            "attributes": list(self.attributes),
            "interval_method": self.interval_method,
            "headline": DEFAULT_ESTIMATOR,
            "columns": dict(COLUMN_MEANINGS),
            "cells": [
                {"labels": list(labels), **{name: columns[name][c] for name in OUTPUT_COLUMNS}}
                for c, labels in enumerate(self.labels)
            ],
            "plan": self.plan.to_dict(),
            "privacy": self.privacy(),
            "mle_iterations": self.mle_iterations,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReleaseReport:
        """A report from :meth:`to_dict`'s JSON (cells in :data:`OUTPUT_COLUMNS`), or from the
        fields' own names (:data:`CELL_COLUMNS`: files written before the vocabulary, the wire)."""
        if "tables" in d:
            raise MultiTableResultError(
                f"{d.get('release_id', 'this result')!r} is a release of {len(d['tables'])} tables "
                f"(format {d.get('format')!r}); read it with TablesReport.from_dict or load_result, not as one table"
            )
        cells = d["cells"]
        legacy = bool(cells) and "raw" not in cells[0]
        key = {field: field for field in CELL_COLUMNS}
        if not legacy:
            key = {field: name for name, field in FIELD_OF_COLUMN.items()}

        def column(name: str, dtype: type) -> npt.NDArray[Any]:
            return np.array([c[key[name]] for c in cells], dtype=dtype)

        p = d["plan"]
        plan = ReleasePlan(
            int(p["n"]),
            int(p["m"]),
            tuple(int(k) for k in p["alphabet_sizes"]),
            float(p["epsilon"]),
            float(p["gamma"]),
        )
        return cls(
            release_id=str(d["release_id"]),
            plan=plan,
            curators=tuple(d["all_curators"]),
            covered=tuple(d["curators"]),
            attributes=tuple(d["attributes"]),
            labels=tuple(tuple(c["labels"]) for c in cells),
            estimate=column("estimate", np.float64),
            projected=column("projected", np.float64),
            mle=column("mle", np.float64),
            standard_error=column("standard_error", np.float64),
            ci_low=column("ci_low", np.float64),
            ci_high=column("ci_high", np.float64),
            # a file from before reports carried the observed counts has none: the analyses refuse it
            # by name (OldResultError); everything else still reads
            observed=(
                column("observed", np.int64) if not cells or key["observed"] in cells[0] else np.zeros(0, np.int64)
            ),
            mle_iterations=int(d.get("mle_iterations", 0)),
            interval_method=str(d.get("interval_method", NORMAL_INTERVAL)),
            refused=dict(d.get("refused", {})),
        )


def build_report(
    release_id: str,
    plan: ReleasePlan,
    curators: Sequence[str],
    estimate: ReleaseEstimate,
    schema: JointSchema,
    refused: Mapping[str, str] | None = None,
) -> ReleaseReport:
    """Label an estimate with the covered curators' schema (``schema`` spans exactly the
    curators in ``estimate.curators``). Each cell's interval is widened, where needed, to the
    smallest one holding the headline too (:func:`~secure_release.mechanism.estimation.unified.hold_estimate`:
    the projection depends on every cell and can fall below a cell's own interval; a superset
    keeps the coverage); the label then says in how many cells."""
    headline = getattr(estimate, {"estimate": "raw"}.get(DEFAULT_ESTIMATOR, DEFAULT_ESTIMATOR))
    ci_low, ci_high, moved = hold_estimate(estimate.ci_low, estimate.ci_high, headline)
    label = estimate.interval_label
    if moved:
        label += f"; widened to hold the headline estimate in {moved} cell{'s' if moved > 1 else ''}"
    return ReleaseReport(
        release_id=release_id,
        plan=plan,
        curators=tuple(curators),
        covered=tuple(curators[j] for j in estimate.curators),
        attributes=tuple(schema.attribute_names),
        labels=tuple(schema.cell_labels()),
        estimate=estimate.raw,
        projected=estimate.projected,
        mle=estimate.mle,
        standard_error=estimate.standard_errors,
        ci_low=ci_low,
        ci_high=ci_high,
        observed=estimate.counts,
        mle_iterations=int(estimate.mle_iterations),
        interval_method=label,
        refused=dict(refused or {}),
    )


#: The JSON format of a result of several tables (a single table's has no ``format`` key).
TABLES_FORMAT = "secure-release/result/2"


@dataclass(frozen=True)
class TablesReport:
    """A finished release of several tables (``mechanism/protocol/tables.py``): one
    :class:`ReleaseReport` a table (its plan n, m_t, gamma_t and the release's epsilon; its
    curators those with an attribute in it), the design the curators ran (its JSON, as the
    curators sent it; its digest is the spec's), and the whole release's epsilon (Eq. T1, as
    charged) beside sequential composition (Eq. T3)."""

    release_id: str
    tables: tuple[ReleaseReport | None, ...]  # design order; None: not estimated (``missing`` says why)
    design: Mapping[str, Any]
    design_digest: str
    epsilon: float
    sequential_epsilon: float
    missing: Mapping[int, str] = field(default_factory=dict)  # table -> why it was not estimated

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TABLES_FORMAT,
            "release_id": self.release_id,
            "epsilon": self.epsilon,
            "sequential_epsilon": self.sequential_epsilon,
            "design_digest": self.design_digest,
            "design": dict(self.design),
            "missing": {str(t): why for t, why in self.missing.items()},
            "tables": [None if t is None else t.to_dict() for t in self.tables],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TablesReport:
        if d.get("format") != TABLES_FORMAT:
            raise MultiTableResultError(f"not a result of several tables: format {d.get('format')!r}, "
                                        f"expected {TABLES_FORMAT!r}")  # fmt: skip
        return cls(
            release_id=str(d["release_id"]),
            tables=tuple(None if t is None else ReleaseReport.from_dict(t) for t in d["tables"]),
            design=dict(d["design"]),
            design_digest=str(d["design_digest"]),
            epsilon=float(d["epsilon"]),
            sequential_epsilon=float(d["sequential_epsilon"]),
            missing={int(t): str(why) for t, why in d.get("missing", {}).items()},
        )
