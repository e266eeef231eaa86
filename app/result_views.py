"""The cells of a released estimate as arrays and DataFrames: every cell, a marginal, a
conditional (``api.Result.cells``, ``marginal``, ``conditional``; pandas by default, polars with
``backend="polars"``). Post-processing of the released counts: none spends privacy budget.

A release of several tables: :meth:`ResultViews.cells` and the other views of every cell are of
its first estimated table (``report``; every table's are ``part(t)``'s), and a marginal or a
conditional reads the table that holds its attributes (``ResultBase._route``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.frames import Backend, to_frame
from secure_release.mechanism.estimation import marginals
from secure_release.result_base import ResultBase


class ResultViews(ResultBase):
    """The cells, marginals and conditionals of a :class:`~secure_release.api.Result`."""

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
