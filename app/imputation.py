"""Multiply-imputed records of a release (DESIGN 13), for the analyst's own models and tools.

:func:`impute_tables` draws M proper imputations of every released table's m records by data
augmentation under the release's exact PRAM channel
(:func:`secure_release.mechanism.estimation.imputation.impute`), under the saturated joint or a
log-linear model the analyst names (``"y*x1 + y*x2 + x1*x2"``). The :class:`Imputations` it
returns prints its mixing diagnostics, exports the long format R's ``mice`` and Stata's ``mi``
read (:meth:`Imputations.to_frame`: ``.imp``, the attributes, ``count``), and fits any
statsmodels formula on every imputation, pooled by Rubin's rules (:meth:`Imputations.fit`).
Post-processing of released counts: no privacy budget is spent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.frames import Backend, require, to_frame
from secure_release.imputed_fits import COUNT_COLUMN, FormulaError, PooledFit, check_family, pool_fits
from secure_release.mechanism import printing
from secure_release.mechanism.errors import NoTableHoldsError, SecureReleaseError
from secure_release.mechanism.estimation.imputation import DEFAULT_ALPHA, ImputationResult, impute
from secure_release.mechanism.estimation.report import ReleaseReport

DEFAULT_IMPUTATIONS = 20
IMP_COLUMN = ".imp"
ID_COLUMN = ".id"
SATURATED = "the saturated joint"


class ImputationModelError(SecureReleaseError):
    """The imputation model names an attribute the table does not hold, or is not a list of terms."""


def parse_model(model: str | Sequence[Sequence[str]] | None, attributes: Sequence[str]) -> list[list[str]] | None:
    """A log-linear model's generating class from R's notation (``"y*x1 + y*x2 + x1*x2"``: terms
    joined by ``+``, a term's attributes by ``*`` or ``:``) or a list of attribute lists; None (or
    ``"saturated"``) for the saturated joint."""
    if model is None or (isinstance(model, str) and model.strip() in ("", "saturated")):
        return None
    terms = ([re.split(r"\s*[*:]\s*", t.strip()) for t in model.split("+")] if isinstance(model, str)
             else [list(t) for t in model])  # fmt: skip
    unknown = sorted({a for t in terms for a in t if a not in attributes})
    if unknown or any(not t or "" in t for t in terms):
        raise ImputationModelError(f"the imputation model {model!r} names {unknown or 'an empty term'}; the table's "
                                   f"attributes are {list(attributes)}: write terms as 'a*b + b*c'")  # fmt: skip
    return terms


@dataclass(frozen=True)
class ImputedTable:
    """One released table's M imputations: ``counts`` (M, K) complete counts in joint-code order,
    each row summing to m; ``labels`` the cells' attribute values; the sampler's ``draws``."""

    table: int
    report: ReleaseReport
    model: str
    draws: ImputationResult

    @property
    def attributes(self) -> tuple[str, ...]:
        return self.report.attributes

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        return self.draws.imputations

    @property
    def m(self) -> int:
        return int(self.report.plan.m)

    def levels(self) -> list[list[str]]:
        """Each attribute's values in the schema's order (the joint code's digit order)."""
        return _levels(self.report)

    def cell_columns(self) -> dict[str, npt.NDArray[Any]]:
        """The K cells' attribute values as columns (joint-code order)."""
        values = np.asarray(self.report.labels, dtype=object).reshape(len(self.report.labels), -1)
        return {name: values[:, j] for j, name in enumerate(self.attributes)}

    def frame(self, imputation: int, *, rows: bool = False) -> Any:
        """Imputation ``imputation`` (1-based) as a pandas DataFrame: one row a cell with its
        ``count`` (zeros included), or with ``rows`` one row a record; the attributes are
        categoricals in the schema's order."""
        pd = require("pandas")
        counts = self.counts[imputation - 1]
        cells = self.cell_columns()
        index = np.repeat(np.arange(counts.size), counts) if rows else np.arange(counts.size)
        data: dict[str, Any] = {}
        for (name, values), levels in zip(cells.items(), self.levels(), strict=True):
            data[name] = pd.Categorical(values[index], categories=levels, ordered=True)
        if not rows:
            data[COUNT_COLUMN] = counts.astype(np.int64)
        return pd.DataFrame(data)

    def diagnostics_pairs(self) -> list[tuple[str, str]]:
        d = self.draws.diagnostics
        return [
            (f"table {self.table}", ", ".join(self.attributes)), ("  imputed under", self.model),
            ("  prior", self.draws.prior), ("  m records", str(self.m)),
            ("  spacing, burn-in", f"{self.draws.spacing} and {self.draws.burn_in} sweeps, {self.draws.chains} chains"),
            ("  R-hat (max)", printing.sig(float(np.nanmax(d.rhat)))),
            ("  lag-1 autocorr. of imputations (max |.|)",
             printing.sig(float(np.nanmax(np.abs(d.imputation_autocorrelation))))),
        ]  # fmt: skip


@dataclass(frozen=True)
class Imputations:
    """M multiply-imputed copies of a release's records (one :class:`ImputedTable` a released
    table). Print it for the mixing diagnostics; :meth:`fit` pools a statsmodels formula;
    :meth:`to_frame` is the long format R (``mice::as.mids``) and Stata (``mi import flong``) read."""

    release_id: str
    num_imputations: int
    seed: int
    tables: tuple[ImputedTable, ...]

    def table(self, attributes: Sequence[str] = (), table: int | None = None) -> ImputedTable:
        """The imputed table numbered ``table``, else the one holding every attribute named (of
        several, the one whose counts tell most: the largest m a^2)."""
        if table is not None:
            found = [t for t in self.tables if t.table == table]
            if not found:
                raise NoTableHoldsError(f"release {self.release_id!r} has no imputed table {table}; it has "
                                        f"{[t.table for t in self.tables]}")  # fmt: skip
            return found[0]
        holding = [t for t in self.tables if set(attributes) <= set(t.attributes)]
        if not holding:
            listed = "; ".join(f"table {t.table} ({', '.join(t.attributes)})" for t in self.tables)
            raise NoTableHoldsError(f"no table of release {self.release_id!r} holds {sorted(attributes)} together; "
                                    f"its tables: {listed}")  # fmt: skip
        return max(holding, key=lambda t: t.m * t.report.plan.channel.keep**2)

    def to_frame(self, *, table: int | None = None, rows: bool = False, backend: Backend = "pandas") -> Any:
        """The long format: ``.imp`` (1..M), with ``rows`` a ``.id`` (1..m), the attributes, and
        without ``rows`` the ``count`` of each cell (a frequency weight; zeros kept, so a Poisson
        model of the counts sees every cell)."""
        chosen = self.table(table=table) if table is not None or len(self.tables) == 1 else None
        if chosen is None:
            raise NoTableHoldsError(f"release {self.release_id!r} has {len(self.tables)} tables with different "
                                    "attributes: name one with table=...")  # fmt: skip
        cells = chosen.cell_columns()
        counts = chosen.counts
        M, K = counts.shape
        if rows:
            per = counts.reshape(-1)
            index = np.repeat(np.tile(np.arange(K), M), per)
            imp = np.repeat(np.repeat(np.arange(1, M + 1), K), per)
            columns: dict[str, npt.ArrayLike] = {IMP_COLUMN: imp}
            columns[ID_COLUMN] = np.tile(np.arange(1, chosen.m + 1), M)
            columns.update({name: values[index] for name, values in cells.items()})
        else:
            columns = {IMP_COLUMN: np.repeat(np.arange(1, M + 1), K)}
            columns.update({name: np.tile(values, M) for name, values in cells.items()})
            columns[COUNT_COLUMN] = counts.reshape(-1)
        return to_frame(columns, backend)

    def fit(self, formula: str, family: str = "binomial", *, table: int | None = None, level: float = 0.95,
            on_degenerate: str = "refuse") -> PooledFit:  # fmt: skip
        """Fit a statsmodels formula on every imputation and pool by Rubin's rules
        (:func:`secure_release.imputed_fits.pool_fits`). For ``binomial`` a two-level outcome is
        coded 1 for its second level; for ``poisson`` the outcome is ``count`` (a log-linear model
        of the cell counts, ``"count ~ a*b + c"``); ``ordinal`` fits an ordered logit."""
        check_family(family)
        variables = [v for v in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", formula)
                     if any(v in t.attributes for t in self.tables)]  # fmt: skip
        chosen = self.table(variables, table)
        outcome = formula.split("~", 1)[0].strip()
        if "~" not in formula:
            raise FormulaError(f"{formula!r} is no formula: write 'y ~ x1 + x2'")
        note = ""
        frames = [chosen.frame(i + 1, rows=family == "ordinal") for i in range(chosen.counts.shape[0])]
        if family == "binomial" and outcome in chosen.attributes:
            levels = chosen.levels()[chosen.attributes.index(outcome)]
            if len(levels) != 2:
                raise FormulaError(f"binomial outcome {outcome!r} has {len(levels)} levels {levels}; use "
                                   "I(outcome == 'level') or family='ordinal'")  # fmt: skip
            for f in frames:
                f[outcome] = (f[outcome] == levels[1]).astype(np.int64)
            note = f"{outcome} is coded 1 for {levels[1]!r} and 0 for {levels[0]!r}."
        try:
            return pool_fits(frames, formula, family, table=chosen.table, model=chosen.model, level=level,
                             on_degenerate=on_degenerate, outcome_note=note)  # fmt: skip
        except FormulaError as exc:
            raise FormulaError(f"{exc}; table {chosen.table} holds {list(chosen.attributes)} and "
                               f"'{COUNT_COLUMN}' (the Poisson family's outcome)") from exc  # fmt: skip

    def block(self) -> printing.Block:
        pairs: list[tuple[str, str]] = [("Release", self.release_id), ("Imputations M", str(self.num_imputations)),
                                        ("Seed", str(self.seed))]  # fmt: skip
        for t in self.tables:
            pairs += t.diagnostics_pairs()
        return printing.Block("Multiply-imputed records (data augmentation under the release's PRAM channel)",
                              pairs=pairs, notes=(
            "Fit any model with .fit('y ~ x1 + x2', family=...), pooled by Rubin's rules; or export .to_frame() "
            "for R's mice or Stata's mi. R-hat near 1 and small autocorrelations say the chains mixed.",))  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        return printing.short_repr("Imputations", f"M = {self.num_imputations} of release {self.release_id}, "
                                   f"{len(self.tables)} table{'s' if len(self.tables) != 1 else ''}")  # fmt: skip

    def _repr_html_(self) -> str:
        return self.block().html()


def impute_tables(
    parts: Sequence[tuple[int, ReleaseReport]], num_imputations: int = DEFAULT_IMPUTATIONS, *, seed: int = 0,
    model: str | Sequence[Sequence[str]] | None = None, alpha: float = DEFAULT_ALPHA,
) -> Imputations:  # fmt: skip
    """M imputations of each released table ``(number, report)``: the report's observed counts
    under its PRAM channel; a ``model`` naming attributes imputes each table that holds them all
    under that log-linear model (other tables under their saturated joint)."""
    if not parts:
        raise NoTableHoldsError("the release has no estimated table to impute")
    rng = np.random.default_rng(seed)
    tables = []
    for number, report in parts:
        attrs = report.attributes
        wanted = parse_model(model, attrs) if model is not None and _holds(model, attrs) else None
        if model is not None and wanted is None and len(parts) == 1:
            parse_model(model, attrs)  # names the missing attribute
        sizes = [len(levels) for levels in _levels(report)]
        draws = impute(report.observed, report.plan.channel, num_imputations, rng, model=wanted, sizes=sizes,
                       names=list(attrs), alpha=alpha)  # fmt: skip
        text = SATURATED if wanted is None else " + ".join("*".join(t) for t in wanted)
        tables.append(ImputedTable(number, report, text, draws))
    return Imputations(parts[0][1].release_id, int(num_imputations), int(seed), tuple(tables))


def _levels(report: ReleaseReport) -> list[list[str]]:
    return [list(dict.fromkeys(row[j] for row in report.labels)) for j in range(len(report.attributes))]


def _holds(model: str | Sequence[Sequence[str]], attributes: Sequence[str]) -> bool:
    try:
        parse_model(model, attributes)
    except ImputationModelError:
        return False
    return True
