"""The researcher's questions of a release: tests of association, effect sizes, models (DESIGN 11).

Thin composition: a released report's observed counts are summed onto the named attributes
(:mod:`mechanism.analysis.subtables`) and handed to the pure functions of :mod:`mechanism.analysis.association`,
:mod:`mechanism.analysis.effects` and :mod:`mechanism.analysis.regression`. Everything here reads only what the
researcher already holds (the observed perturbed counts, gamma, K, m, n): it is post-processing of
the release and spends no privacy budget.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.frames import Backend, to_frame
from secure_release.mechanism import printing
from secure_release.mechanism.analysis import association as assoc
from secure_release.mechanism.analysis import conditional_v, subtables
from secure_release.mechanism.analysis import effects as fx
from secure_release.mechanism.analysis import regression as reg
from secure_release.mechanism.errors import (
    FlatLikelihoodWarning,
    NotNestedModelsError,
    OldResultError,
    UnknownAttributeError,
)
from secure_release.mechanism.estimation.report import ReleaseReport

Names = Sequence[str] | str

#: What every analysis output says about its privacy cost.
NO_BUDGET = "post-processing of the released counts: spends no privacy budget"


def _names(value: Names | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def release_layout(report: ReleaseReport) -> subtables.Layout:
    """The attributes of a report's cells and the curator that holds each."""
    if report.observed.size != len(report.labels):
        raise OldResultError(
            f"release {report.release_id} was saved without its observed counts (an older version "
            "wrote it); fetch it again from the researcher service: "
            "`secure-release analyst show RELEASE --json`, or api.fetch_result(...)"
        )
    sizes = {c: k for c, k in zip(report.curators, report.plan.alphabet_sizes, strict=False)}
    covered = list(report.covered)
    return subtables.layout(report.attributes, report.labels, covered, [sizes[c] for c in covered])


@dataclass(frozen=True)
class AssociationTest:
    """A test of H0: ``a`` and ``b`` are independent (within every stratum of ``given``)."""

    a: tuple[str, ...]
    b: tuple[str, ...]
    given: tuple[str, ...]
    statistic: float
    df: int
    p_value: float
    method: str
    m: int
    strata: int

    @property
    def hypothesis(self) -> str:
        within = f" within every level of {', '.join(self.given)}" if self.given else ""
        return f"{', '.join(self.a)} independent of {', '.join(self.b)}{within}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": list(self.a),
            "b": list(self.b),
            "given": list(self.given),
            "hypothesis": self.hypothesis,
            "statistic": self.statistic,
            "df": self.df,
            "p_value": self.p_value,
            "method": self.method,
            "m": self.m,
            "strata": self.strata,
            "privacy": NO_BUDGET,
        }

    # ------------------------------------------------------------------- reading the test
    @property
    def title(self) -> str:
        """The test's name (the first line of its print)."""
        return "Likelihood-ratio test of independence on perturbed counts"

    @property
    def data(self) -> str:
        """What was tested: the attributes, the strata and m."""
        given = f" given {', '.join(self.given)} ({self.strata} strata)" if self.given else ""
        return f"{', '.join(self.a)} and {', '.join(self.b)}{given}; m = {self.m} released records"

    def block(self, effects: Sequence[str] = (), extra: Sequence[str] = (), data: str = "") -> printing.Block:
        """R's ``print.htest`` layout (:func:`~secure_release.mechanism.printing.htest_block`)."""
        within = f" within some level of {', '.join(self.given)}" if self.given else ""
        return printing.htest_block(
            self.title, data or self.data, self.statistic, self.df, self.p_value, statistic_name="G",
            null=self.hypothesis, alternative=f"{', '.join(self.a)} and {', '.join(self.b)} are associated{within}",
            effects=effects, method=self.method, extra=(*extra, NO_BUDGET),
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        given = f" | {', '.join(self.given)}" if self.given else ""
        return printing.short_repr(
            "AssociationTest",
            f"{', '.join(self.a)} ~ {', '.join(self.b)}{given}: G = {printing.sig(self.statistic)}, df = {self.df}, "
            f"p-value = {printing.p_value(self.p_value)}, m = {self.m}",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is one: "1 table", "3 tables"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _tested_table(
    report: ReleaseReport, a: Names, b: Names, given: Names | None, method: str, draws: int, seed: int
) -> tuple[list[list[str]], npt.NDArray[np.int64], assoc.IndependenceTest]:
    """The (a, b, given) groups, their observed table (I, J, L) and its test of independence."""
    lay = release_layout(report)
    groups = [_names(a), _names(b), _names(given)]
    subtables.check_names(lay, groups, ("a", "b", "given"))
    if not groups[0] or not groups[1]:
        raise UnknownAttributeError(
            f"a test needs attributes on both sides; the release has {list(lay.attributes)}"
        )
    table = subtables.attribute_table(report.observed, lay, groups)
    result = assoc.independence_test(table, report.plan.channel.keep, method=method, draws=draws, seed=seed)
    return groups, table, result


def _shaped_test(report: ReleaseReport, groups: list[list[str]], result: assoc.IndependenceTest) -> AssociationTest:
    return AssociationTest(
        tuple(groups[0]), tuple(groups[1]), tuple(groups[2]), float(result.statistic), int(result.df),
        float(result.p_value), result.method, int(report.plan.m), int(result.null_fit.shape[2]),
    )  # fmt: skip


def test_independence(
    report: ReleaseReport,
    a: Names,
    b: Names,
    given: Names | None = None,
    *,
    method: str = "auto",
    draws: int = 999,
    seed: int = 0,
) -> AssociationTest:
    """The likelihood-ratio test of (conditional) independence of the perturbed multinomial
    (:func:`mechanism.analysis.association.independence_test`) on the table of ``a`` x ``b`` x ``given``."""
    groups, _, result = _tested_table(report, a, b, given, method, draws, seed)
    return _shaped_test(report, groups, result)


@dataclass(frozen=True)
class Association:
    """Effect sizes of the association of ``a`` and ``b`` with their intervals."""

    a: tuple[str, ...]
    b: tuple[str, ...]
    effects: fx.AssociationEffects
    levels: tuple[int, int]

    @property
    def cramers_v(self) -> float:
        return float(self.effects.cramers_v.estimate)

    @property
    def ci_low(self) -> float:
        return float(self.effects.cramers_v.low)

    @property
    def ci_high(self) -> float:
        return float(self.effects.cramers_v.high)

    @property
    def mutual_information(self) -> float:
        return float(self.effects.mutual_information.estimate)

    @property
    def odds_ratio(self) -> fx.Effect | None:
        return self.effects.odds_ratio

    @property
    def risk_difference(self) -> fx.Effect | None:
        return self.effects.risk_difference

    @property
    def kendall_tau_b(self) -> fx.Effect | None:
        return self.effects.kendall_tau_b

    def measures(self) -> list[fx.Effect]:
        """Every effect this pair has, Cramer's V first."""
        e = self.effects
        optional = [e.odds_ratio, e.risk_difference, e.kendall_tau_b]
        return [e.cramers_v, e.mutual_information, *[x for x in optional if x is not None]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": list(self.a),
            "b": list(self.b),
            "levels": list(self.levels),
            "level": self.effects.level,
            "method": self.effects.method,
            "effects": {x.name: {"estimate": x.estimate, "ci_low": x.low, "ci_high": x.high} for x in self.measures()},
            "privacy": NO_BUDGET,
        }

    # ------------------------------------------------------------------- reading the effects
    def block(self) -> printing.Block:
        """The effects as a table with their intervals, then the method."""
        return self.effects.block(
            f"Association of {', '.join(self.a)} with {', '.join(self.b)} ({self.levels[0]} x {self.levels[1]} "
            f"table), {printing.level_text(self.effects.level)} intervals",
            notes=(NO_BUDGET,),
        )

    def to_frame(self, backend: Backend = "pandas") -> Any:
        """The effects as a DataFrame: effect, estimate, ci_low, ci_high (pandas or polars)."""
        return to_frame(self.effects.columns(), backend)

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        return printing.short_repr(
            "Association",
            f"{', '.join(self.a)} ~ {', '.join(self.b)} ({self.levels[0]} x {self.levels[1]}): Cramer's V = "
            f"{printing.fixed(self.cramers_v)} {printing.interval(self.ci_low, self.ci_high)} "
            f"({printing.level_text(self.effects.level)})",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


def association(
    report: ReleaseReport,
    a: Names,
    b: Names,
    *,
    ordered: Sequence[str] = (),
    level: float = 0.95,
    seed: int = 0,
    draws: int = 999,
    test: assoc.IndependenceTest | None = None,
) -> Association:
    """Cramer's V, the mutual information and (2 x 2) the odds ratio and risk difference, or
    (both ordered: binned numbers or named in ``ordered``) Kendall's tau-b, with intervals
    (:func:`mechanism.analysis.effects.association_effects`). V's interval excludes 0 exactly when
    the test of independence of the pair (:func:`test_independence` with the same ``seed`` and
    ``draws``, or ``test`` when given: the same test) rejects at 1 - ``level``."""
    lay = release_layout(report)
    subtables.check_names(lay, [list(dict.fromkeys(ordered))], ("ordered",))
    groups, table, tested = _tested_table(report, a, b, None, "auto", draws, seed) if test is None else (
        [_names(a), _names(b), []], None, test)  # fmt: skip
    if table is None:
        subtables.check_names(lay, groups[:2], ("a", "b"))
        table = subtables.attribute_table(report.observed, lay, groups[:2])
    pair = table.reshape(table.shape[0], table.shape[1], -1).sum(axis=2)
    is_ordered = all(
        len(g) == 1 and (g[0] in ordered or lay.is_binned(g[0])) for g in groups[:2]
    )
    effects = fx.association_effects(pair, report.plan.channel.keep, ordered=is_ordered, level=level, seed=seed,
                                     test=tested)  # fmt: skip
    return Association(tuple(groups[0]), tuple(groups[1]), effects, (int(pair.shape[0]), int(pair.shape[1])))


@dataclass(frozen=True)
class AssociationRow:
    """One pair of :func:`associations`."""

    test: AssociationTest
    effect: Association
    holders: tuple[str, str]
    p_adjusted: float = field(default=float("nan"))

    def to_dict(self) -> dict[str, Any]:
        v = self.effect.effects.cramers_v
        mi = self.effect.effects.mutual_information
        return {
            "a": self.test.a[0],
            "b": self.test.b[0],
            "curator_a": self.holders[0],
            "curator_b": self.holders[1],
            "statistic": self.test.statistic,
            "df": self.test.df,
            "p_value": self.test.p_value,
            "p_holm": self.p_adjusted,
            "cramers_v": v.estimate,
            "v_ci_low": v.low,
            "v_ci_high": v.high,
            "mutual_information": mi.estimate,
            "mi_ci_low": mi.low,
            "mi_ci_high": mi.high,
        }

    # ------------------------------------------------------------------- reading the row
    def block(self) -> printing.Block:
        """The test in R's ``print.htest`` layout with the curators, Cramer's V and the mutual
        information with their intervals, and the Holm-adjusted p-value."""
        t = self.test
        level = printing.level_text(self.effect.effects.level)
        effects = [
            f"{e.label} = {printing.fixed(e.estimate)}, {level} interval {printing.interval(e.low, e.high)}"
            for e in (self.effect.effects.cramers_v, self.effect.effects.mutual_information)
        ]
        data = (f"{t.a[0]} ({self.holders[0]}) and {t.b[0]} ({self.holders[1]}); m = {t.m} released records")
        return t.block(
            effects=[*effects, f"Holm-adjusted p-value = {printing.p_value(self.p_adjusted)} ({ADJUSTMENT})"],
            data=data,
        )

    def to_frame(self, backend: Backend = "pandas") -> Any:
        """This pair as a one-row DataFrame, the columns of ``Result.associations()``."""
        return to_frame(association_columns([self]), backend)

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        v = self.effect.effects.cramers_v
        return printing.short_repr(
            "AssociationRow",
            f"{self.test.a[0]} ({self.holders[0]}) ~ {self.test.b[0]} ({self.holders[1]}): p-value = "
            f"{printing.p_value(self.test.p_value)}, Holm {printing.p_value(self.p_adjusted)}, Cramer's V = "
            f"{printing.fixed(v.estimate)} {printing.interval(v.low, v.high)}",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


#: How :func:`associations` adjusts its p-values (the page and the CLI print it).
ADJUSTMENT = "Holm (1979) step-down over every cross-curator pair: family-wise error <= alpha"


def associations(report: ReleaseReport, *, seed: int = 0, draws: int = 999) -> list[AssociationRow]:
    """Every pair of attributes held by different curators: the independence test with raw and
    Holm-adjusted p-values, and Cramer's V with its interval; sorted by adjusted p."""
    return adjusted_associations([(report, a, b) for a, b in cross_curator_pairs(report)], seed=seed, draws=draws)


def cross_curator_pairs(report: ReleaseReport) -> list[tuple[str, str]]:
    """The pairs of attributes of ``report`` held by different curators, in attribute order."""
    return subtables.cross_curator_pairs(release_layout(report))


def adjusted_associations(
    pairs: Sequence[tuple[ReleaseReport, str, str]], *, seed: int = 0, draws: int = 999
) -> list[AssociationRow]:
    """:func:`associations` of the given (report, a, b) pairs, each tested on its own report (a
    release of several tables: the table that answers the pair), Holm-adjusted over all of them."""
    rows = []
    for report, a, b in pairs:
        lay = release_layout(report)
        groups, _, tested = _tested_table(report, a, b, None, "auto", draws, seed)
        effect = association(report, a, b, seed=seed, draws=draws, test=tested)
        rows.append(AssociationRow(_shaped_test(report, groups, tested), effect,
                                   (lay.holders[lay.index(a)], lay.holders[lay.index(b)])))  # fmt: skip
    adjusted = subtables.holm_adjust([r.test.p_value for r in rows]) if rows else np.zeros(0)
    out = [AssociationRow(r.test, r.effect, r.holders, float(p)) for r, p in zip(rows, adjusted, strict=True)]
    return sorted(out, key=lambda r: (r.p_adjusted, r.test.p_value, r.test.a, r.test.b))


def association_columns(rows: Sequence[AssociationRow]) -> dict[str, npt.NDArray[Any]]:
    """:func:`associations` as named columns (for a DataFrame)."""
    dicts = [r.to_dict() for r in rows]
    keys = list(dicts[0]) if dicts else []
    return {k: np.asarray([d[k] for d in dicts]) for k in keys}


@dataclass(frozen=True)
class Model:
    """A logistic (or multinomial) regression of ``outcome`` on ``covariates``, fitted on the
    likelihood of the perturbed counts (:func:`mechanism.analysis.regression.fit_logistic`) of the table of
    ``outcome`` x ``over`` (the covariates, and for a reduced model of a comparison the full
    model's covariates too: nested models are compared on one table)."""

    outcome: str
    covariates: tuple[str, ...]
    interactions: tuple[tuple[str, str], ...]
    over: tuple[str, ...]
    fit: reg.ModelFit

    def to_dict(self) -> dict[str, Any]:
        f = self.fit
        return {
            "outcome": self.outcome,
            "outcome_levels": list(f.outcome_levels),
            "covariates": list(self.covariates),
            "interactions": [list(p) for p in self.interactions],
            "coefficients": [
                {"name": n, "coef": float(c), "se": float(s), "ci_low": float(lo), "ci_high": float(hi)}
                for n, c, s, lo, hi in zip(f.names, f.coef, f.standard_error, f.ci_low, f.ci_high, strict=True)
            ],
            "log_likelihood": f.log_likelihood,
            "num_params": f.num_params,
            "level": f.level,
            "converged": f.converged,
            **({"warning": self.warning} if self.warning else {}),
            "privacy": NO_BUDGET,
        }

    # ------------------------------------------------------------------- reading the model
    @property
    def formula(self) -> str:
        """``outcome ~ a + b + a:b`` (``~ 1`` with no covariates)."""
        terms = [*self.covariates, *(f"{p}:{q}" for p, q in self.interactions)]
        return f"{self.outcome} ~ {' + '.join(terms) if terms else '1'}"

    @property
    def not_estimated(self) -> tuple[str, ...]:
        """The coefficients the likelihood does not determine, even where the fit converged
        (:attr:`~secure_release.mechanism.analysis.regression.ModelFit.not_estimated`: a standard
        error above 10 on the logit scale, or not finite)."""
        return self.fit.not_estimated

    @property
    def flat_likelihood_warning(self) -> str:
        """Empty, or which coefficients are not estimated, why, and what to do."""
        return self.fit.flat_likelihood_warning

    def block(self) -> printing.Block:
        """statsmodels' ``summary()`` layout: the header block, then the coefficient table."""
        kind = "Logistic" if len(self.fit.outcome_levels) == 2 else "Multinomial logistic"
        return self.fit.summary_block(
            f"{kind} regression of {self.outcome} on perturbed counts",
            head=(("Model", self.formula),), notes=(NO_BUDGET,),
        )  # fmt: skip

    def to_frame(self, backend: Backend = "pandas") -> Any:
        """The coefficient table as a DataFrame: name, coef, se, z, p_value, ci_low, ci_high,
        not_estimated (pandas or polars)."""
        return to_frame(self.fit.columns(), backend)

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        flag = printing.not_estimated_flag(self.not_estimated)
        return printing.short_repr(
            "Model",
            f"{self.formula}: m = {self.fit.m}, log-likelihood = {printing.sig(self.fit.log_likelihood, 6)}, "
            f"{'converged' if self.fit.converged else 'NOT converged'}, {len(self.fit.names)} coefficients{flag}",
        )

    def _repr_html_(self) -> str:
        return self.block().html()

    @property
    def warning(self) -> str:
        """Empty, or why the coefficients are not estimates (a fit that did not converge)."""
        if self.fit.converged:
            return ""
        return (
            "the fit did not converge: the maximum likelihood is at infinity (some covariate cell predicts "
            "the outcome perfectly in the fitted true table); the coefficients and standard errors are "
            "not estimates. Merge levels or drop a covariate."
        )


def logistic(
    report: ReleaseReport,
    outcome: str,
    covariates: Names,
    *,
    interactions: Sequence[tuple[str, str]] = (),
    level: float = 0.95,
    over: Names | None = None,
) -> Model:
    """Regress ``outcome`` on ``covariates`` (main effects, and the named pairwise interactions),
    on the table of ``outcome`` x ``over`` (default: the covariates; ``over`` may add attributes
    the model ignores, as a reduced model compared with a fuller one must)."""
    lay = release_layout(report)
    names = _names(covariates)
    subtables.check_names(lay, [[outcome], names], ("outcome", "covariates"))
    extra = [x for x in _names(over) if x not in names]
    subtables.check_names(lay, [[outcome], names, extra], ("outcome", "covariates", "over"))
    for pair in interactions:
        if len(pair) != 2 or pair[0] == pair[1] or any(p not in names for p in pair):
            raise UnknownAttributeError(
                f"interaction {list(pair)} must name two different covariates; the covariates are {names}"
            )
    cells = _names(over) if over is not None and not set(names) - set(_names(over)) else [*names, *extra]
    table = subtables.attribute_table(report.observed, lay, [[outcome], cells])
    levels = [lay.levels[lay.index(n)] for n in names]
    categories = [lay.categories[lay.index(n)] for n in names]
    pairs = tuple((names.index(p), names.index(q)) for p, q in interactions)
    design, columns = reg.design_matrix(levels, names, categories, pairs)
    grid = np.indices([lay.levels[lay.index(n)] for n in cells]).reshape(len(cells), -1)
    codes = tuple(grid[cells.index(n)] for n in names)
    row = np.ravel_multi_index(codes, levels) if names else np.zeros(grid.shape[1], dtype=np.int64)
    fit = reg.fit_logistic(
        table,
        report.plan.channel.keep,
        design[row],
        outcome_levels=lay.categories[lay.index(outcome)],
        names=columns,
        level=level,
    )
    model = Model(outcome, tuple(names), tuple((p, q) for p, q in interactions), tuple(cells), fit)
    if model.not_estimated:  # the caller's line: Result.logistic -> logistic
        warnings.warn(f"{model.formula}: {model.flat_likelihood_warning}", FlatLikelihoodWarning, stacklevel=3)
    return model


@dataclass(frozen=True)
class ModelComparison:
    """The deviance test of ``reduced`` against ``full`` on one table."""

    reduced: Model
    full: Model
    statistic: float
    df: int
    p_value: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "reduced": self.reduced.to_dict(),
            "full": self.full.to_dict(),
            "statistic": self.statistic,
            "df": self.df,
            "p_value": self.p_value,
            "privacy": NO_BUDGET,
        }

    # ------------------------------------------------------------------- reading the comparison
    def columns(self) -> dict[str, list[Any]]:
        """R's ``anova`` table as named columns: model (reduced, full), formula, num_params,
        log_likelihood, df, deviance, p_value (NaN on the reduced row)."""
        return {
            "model": ["reduced", "full"],
            "formula": [self.reduced.formula, self.full.formula],
            "num_params": [self.reduced.fit.num_params, self.full.fit.num_params],
            "log_likelihood": [self.reduced.fit.log_likelihood, self.full.fit.log_likelihood],
            "df": [math.nan, float(self.df)],
            "deviance": [math.nan, self.statistic],
            "p_value": [math.nan, self.p_value],
        }

    def to_frame(self, backend: Backend = "pandas") -> Any:
        """:meth:`columns` as a DataFrame (pandas or polars)."""
        return to_frame(self.columns(), backend)

    def block(self) -> printing.Block:
        """R's ``print.htest`` layout, then the two models' parameters and log-likelihoods."""
        r, f = self.reduced, self.full
        added = [c for c in f.covariates if c not in r.covariates] + [
            f"{p}:{q}" for p, q in f.interactions if (p, q) not in r.interactions
        ]
        test = printing.htest_block(
            "Deviance (likelihood-ratio) test of nested logistic models",
            f"{r.formula} against {f.formula}; one table of m = {f.fit.m} records", self.statistic, self.df,
            self.p_value, null=f"the reduced model {r.formula} fits as well as the full model",
            alternative=f"the full model's added terms ({', '.join(added)}) improve the fit",
            method="G = 2 (l_full - l_reduced), p from chi-square(df) (Wilks); the reduced model refitted on the "
            "full model's table",
        )  # fmt: skip
        rows = tuple(
            (name, m.formula, str(m.fit.num_params), printing.sig(m.fit.log_likelihood, 6),
             ", ".join(m.not_estimated) or "-")
            for name, m in (("reduced", r), ("full", f))
        )  # fmt: skip
        notes = [f"WARNING ({name}): {m.flat_likelihood_warning}" for name, m in (("reduced", r), ("full", f))
                 if m.not_estimated]  # fmt: skip
        notes += [f"WARNING ({name}): {m.warning}" for name, m in (("reduced", r), ("full", f)) if m.warning]
        return printing.Block(
            test.title, lines=test.lines, header=("model", "formula", "params", "log-lik", "not estimated"),
            rows=rows, align="llrrl", notes=(*notes, NO_BUDGET),
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        return printing.short_repr(
            "ModelComparison",
            f"{self.reduced.formula} vs {self.full.formula}: G = {printing.sig(self.statistic)}, df = {self.df}, "
            f"p-value = {printing.p_value(self.p_value)}",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


def compare_models(report: ReleaseReport, reduced: Model, full: Model) -> ModelComparison:
    """The deviance (likelihood-ratio) test of a reduced model against a fuller one (RRreg's
    anova): the reduced model is refitted on the full model's table, so both log-likelihoods are
    of the same observed counts."""
    nested = (
        reduced.outcome == full.outcome
        and set(reduced.covariates) <= set(full.covariates)
        and set(reduced.interactions) <= set(full.interactions)
        and (reduced.covariates, reduced.interactions) != (full.covariates, full.interactions)
    )
    if not nested:
        raise NotNestedModelsError(
            f"the models are not nested: {reduced.outcome} ~ {list(reduced.covariates)} against "
            f"{full.outcome} ~ {list(full.covariates)}; the reduced model must have the same outcome "
            "and a strict subset of the full model's covariates and interactions"
        )
    refit = logistic(
        report, reduced.outcome, reduced.covariates, interactions=reduced.interactions,
        level=reduced.fit.level, over=full.over,
    )  # fmt: skip
    g, df, p = reg.deviance_test(refit.fit, full.fit)
    return ModelComparison(refit, full, float(g), int(df), float(p))


# ------------------------------------------------------------------- a release of several tables
# A designed release (``mechanism.analysis.design``) releases several tables from disjoint
# samples; each question of the design is answered from the table that holds its attributes.


def _finite(x: float | None) -> float | None:
    """JSON-safe: None for a missing or non-finite number."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


@dataclass(frozen=True)
class QuestionAnswer:
    """One question of a design answered from a table of the release (:func:`answer_question`).

    ``number`` is the question's place in the design (Q1, Q2, ...), ``table`` the table that
    answered it (1-based, as the design prints them; None when none could). ``test`` names the test
    made, ``statistic`` (G), ``df`` and ``p_value`` are its figures and ``method`` how the p-value
    was made. ``effect`` names the effect size with ``estimate`` and its interval [``ci_low``,
    ``ci_high``] at ``level``: Cramer's V of the pair (``A ~ B``), the pooled within-stratum
    Cramer's V (``A ~ B | C``; both exclude 0 exactly when the test beside them rejects at
    1 - ``level``), or a model's odds ratio of its first predictor with its Wald interval. ``planned_v`` is the design's
    smallest Cramer's V the question's test detects (inf: none), ``planned_power`` the power the
    design planned at its ``at_v`` (None without one). A model of a binary outcome also carries
    its ``coefficients``. Missing numbers are NaN (None in :meth:`to_dict`)."""

    number: int
    question: str
    kind: str
    table: int | None
    test: str
    statistic: float
    df: int | None
    p_value: float
    method: str
    effect: str
    estimate: float
    ci_low: float
    ci_high: float
    level: float
    planned_v: float
    planned_power: float | None
    m: int | None
    note: str = ""
    coefficients: tuple[dict[str, Any], ...] = ()

    @property
    def answered(self) -> bool:
        return self.table is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (non-finite numbers as None)."""
        return {
            "number": self.number, "question": self.question, "kind": self.kind, "table": self.table,
            "test": self.test, "statistic": _finite(self.statistic), "df": self.df, "p_value": _finite(self.p_value),
            "method": self.method, "effect": self.effect, "estimate": _finite(self.estimate),
            "ci_low": _finite(self.ci_low), "ci_high": _finite(self.ci_high), "level": self.level,
            "planned_v": _finite(self.planned_v), "planned_power": _finite(self.planned_power), "m": self.m,
            "note": self.note, "coefficients": [dict(c) for c in self.coefficients],
        }  # fmt: skip


def unanswered(
    number: int, question: str, kind: str, planned_v: float, planned_power: float | None, why: str
) -> QuestionAnswer:
    """A question no table of the release could answer, and why."""
    nan = math.nan
    return QuestionAnswer(number, question, kind, None, "not answered", nan, None, nan, "", "", nan, nan, nan, 0.95,
                          planned_v, planned_power, None, why)  # fmt: skip


def _model_effect(full: Model, b: str, target: str) -> dict[str, Any]:
    """The model's own effect of ``b`` (the predictor the design plans the test for): the odds
    ratio of its coefficient in ``full`` with its Wald interval (exp of the log-odds interval);
    of several levels of ``b``, the coefficient with the largest |z| (the note lists them all)."""
    f = full.fit
    chosen = [i for i, n in enumerate(f.names) if n.startswith(f"{b}[")]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(np.asarray(f.coef)[chosen] / np.asarray(f.standard_error)[chosen])
    i = chosen[int(np.nanargmax(z))] if np.isfinite(z).any() else chosen[0]
    others = ", ".join(c for c in full.covariates if c != b)
    return {"effect": f"odds ratio of {f.names[i]} ({target} = {f.outcome_levels[1]!r}; given {others})",
            "estimate": math.exp(f.coef[i]), "ci_low": math.exp(f.ci_low[i]),
            "ci_high": math.exp(f.ci_high[i])}  # fmt: skip


@dataclass(frozen=True)
class ConditionalAssociation:
    """The conditional Cramer's V of ``a`` and ``b`` given ``given`` (pooled within-stratum,
    :func:`mechanism.analysis.v_interval.conditional_cramers_v`) with its interval at ``level``,
    whose lower end inverts the conditional test of independence (p-value ``p_value``): it
    excludes 0 exactly when that test rejects at 1 - ``level``."""

    a: tuple[str, ...]
    b: tuple[str, ...]
    given: tuple[str, ...]
    estimate: float
    low: float
    high: float
    level: float
    p_value: float

    @property
    def label(self) -> str:
        return f"conditional Cramer's V ({', '.join(self.a)} x {', '.join(self.b)} | {', '.join(self.given)})"

    def to_dict(self) -> dict[str, Any]:
        return {"a": list(self.a), "b": list(self.b), "given": list(self.given), "level": self.level,
                "method": CONDITIONAL_METHOD, "effects": {"conditional_cramers_v": {
                    "estimate": self.estimate, "ci_low": self.low, "ci_high": self.high}},
                "privacy": NO_BUDGET}  # fmt: skip

    def __str__(self) -> str:
        return "\n".join(conditional_association_lines(self))


#: How a conditional V's interval is made (printed under it).
CONDITIONAL_METHOD = (
    "lower end: the conditional test of independence inverted along the straight path from the MLE's "
    "conditional-independence table to the MLE (0 exactly when the test keeps independence); upper end: a "
    "parametric-bootstrap test on the MLE's conditional V along that path, then each stratum tilted"
)


def conditional_association(
    report: ReleaseReport, a: Names, b: Names, given: Names, *, level: float = 0.95, seed: int = 0, draws: int = 999,
    test: assoc.IndependenceTest | None = None,
) -> ConditionalAssociation:  # fmt: skip
    """The conditional Cramer's V of ``a`` and ``b`` given ``given`` with its interval, whose lower
    end inverts the conditional test (:func:`test_independence` with the same ``seed`` and
    ``draws``, or ``test``: the same test) (:func:`mechanism.analysis.conditional_v.conditional_v_interval`)."""
    groups, table, tested = _tested_table(report, a, b, given, "auto", draws, seed)
    tested = tested if test is None else test
    estimate, low, high = conditional_v.conditional_v_interval(
        table, report.plan.channel.keep, float(tested.statistic), float(tested.p_value), level=level, seed=seed
    )
    return ConditionalAssociation(tuple(groups[0]), tuple(groups[1]), tuple(groups[2]), estimate, low, high, level,
                                  float(tested.p_value))  # fmt: skip


def _conditional_effect(
    report: ReleaseReport, a: str, b: str, given: Sequence[str], *, level: float, seed: int, draws: int
) -> tuple[assoc.IndependenceTest, dict[str, Any]]:
    """The conditional test of ``a`` and ``b`` given ``given`` and :func:`conditional_association`
    made with that same test."""
    _, _, tested = _tested_table(report, a, b, list(given), "auto", draws, seed)
    x = conditional_association(report, a, b, list(given), level=level, seed=seed, draws=draws, test=tested)
    return tested, {"effect": x.label, "estimate": x.estimate, "ci_low": x.low, "ci_high": x.high}


def answer_question(
    report: ReleaseReport, question: Any, number: int, table: int, planned_v: float, planned_power: float | None,
    *, seed: int = 0, draws: int = 999, level: float = 0.95,
) -> QuestionAnswer:  # fmt: skip
    """``question`` (a parsed :class:`~secure_release.mechanism.analysis.questions.Question`)
    answered from ``report``, the release's table ``table`` (1-based) that holds its attributes:

    - ``A ~ B``: the likelihood-ratio test of independence (:func:`test_independence`) and Cramer's
      V of A and B with its interval (:func:`association` with that same test: the same numbers
      ``association(A, B)`` prints, 0 outside the interval exactly when the test rejects at
      1 - ``level``);
    - ``A ~ B | C + D``: the test of independence within every level of (C, D), and the pooled
      within-stratum ("conditional") Cramer's V of A and B, whose interval's lower end inverts
      that conditional test (0 outside it exactly when the test rejects);
    - ``Y ~ X1 + X2`` with a binary Y: the deviance test of the logistic model without X1 against
      the full model (:func:`logistic`; X1 is the predictor the design plans the test for), and the
      model's effect: the odds ratio of X1's coefficient with its Wald interval; with Y of more
      levels: the design's planned test, of Y and X1 independent given the other predictors, and
      the conditional Cramer's V (the note says which)."""
    a, b, given = question.tested
    lay = release_layout(report)
    kind = "model" if question.kind == "model" else "conditional independence" if given else "independence"
    common: dict[str, Any] = {"number": number, "question": question.text, "kind": kind, "table": table, "level": level,
              "planned_v": planned_v, "planned_power": planned_power, "m": int(report.plan.m)}  # fmt: skip
    outcome_levels = lay.levels[lay.index(question.target)]
    if question.kind == "model" and outcome_levels == 2:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FlatLikelihoodWarning)
            full = logistic(report, question.target, list(question.others), level=level)
            reduced = logistic(report, question.target, list(question.others[1:]), level=level, over=full.over)
        g, df, p = reg.deviance_test(reduced.fit, full.fit)
        notes = [f"{m.formula}: {m.warning}" for m in (reduced, full) if m.warning]
        notes += [str(w.message) for w in caught if issubclass(w.category, FlatLikelihoodWarning)]
        coefficients = tuple(full.to_dict()["coefficients"])
        shown = [c for c in coefficients if c["name"].startswith(f"{b}[")]
        notes.append(f"{full.formula}, coefficients of {b} (log-odds of {question.target} = "
                     f"{full.fit.outcome_levels[1]!r} against {b}'s first level): "
                     + "; ".join(f"{c['name']} {printing.fixed(c['coef'])} "
                                 f"{printing.interval(c['ci_low'], c['ci_high'])}" for c in shown))  # fmt: skip
        return QuestionAnswer(
            **common, test=f"deviance test of {reduced.formula} against {full.formula}", statistic=float(g), df=int(df),
            p_value=float(p), method="G = 2 (l_full - l_reduced), p from chi-square(df) (Wilks)",
            **_model_effect(full, b, question.target), note="; ".join(notes), coefficients=coefficients,
        )  # fmt: skip
    if given:
        tested, measured = _conditional_effect(report, a, b, given, level=level, seed=seed, draws=draws)
    else:
        _, _, tested = _tested_table(report, a, b, None, "auto", draws, seed)
        effect = association(report, a, b, level=level, seed=seed, draws=draws, test=tested)
        measured = {"effect": f"Cramer's V ({a} x {b})", "estimate": effect.cramers_v, "ci_low": effect.ci_low,
                    "ci_high": effect.ci_high}  # fmt: skip
    within = f" given {', '.join(given)}" if given else ""
    note = ""
    if question.kind == "model":
        note = (f"{question.target} has {outcome_levels} levels: answered by the design's planned test, {a} "
                f"independent of {b} given {', '.join(given)} (a logistic deviance test needs a binary outcome)")
    return QuestionAnswer(**common, test=f"likelihood-ratio test of independence{within}",
                          statistic=float(tested.statistic), df=int(tested.df), p_value=float(tested.p_value),
                          method=tested.method, **measured, note=note)  # fmt: skip


def short_test(test: str) -> str:
    """The test column of the answers: "LR", "LR given C" or "deviance" (the notes say it whole)."""
    if test.startswith("deviance"):
        return "deviance"
    return "LR" + test.removeprefix("likelihood-ratio test of independence")


@dataclass(frozen=True)
class QuestionAnswers:
    """Every question of a design answered from the release's tables (``Result.questions()``):
    prints as a table (``str``, ``_repr_html_``), ``columns()``/``to_frame()`` one row a
    question, ``to_dict()`` the JSON of ``secure-release analyst questions --json``."""

    release_id: str
    design_digest: str
    answers: tuple[QuestionAnswer, ...]
    alpha: float
    power: float
    at_v: float | None
    planned_n: int
    n: int
    epsilon: float
    sequential_epsilon: float

    #: The columns of :meth:`columns`, in order.
    COLUMNS = ("number", "question", "kind", "table", "test", "statistic", "df", "p_value", "method", "effect",
               "estimate", "ci_low", "ci_high", "planned_v", "planned_power", "m", "note")  # fmt: skip

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        """One row a question: :data:`COLUMNS` (NaN where a number is missing; ``table`` 0 for a
        question no table answered)."""
        def col(name: str) -> npt.NDArray[Any]:
            values = [getattr(a, name) for a in self.answers]
            if name in ("table", "df", "m"):
                return np.asarray([0 if v is None else v for v in values], dtype=np.int64)
            if name == "planned_power":
                return np.asarray([math.nan if v is None else v for v in values], dtype=np.float64)
            if name in ("statistic", "p_value", "estimate", "ci_low", "ci_high", "planned_v"):
                return np.asarray(values, dtype=np.float64)
            return np.asarray(values, dtype=np.int64 if name == "number" else object)

        return {name: col(name) for name in self.COLUMNS}

    def to_frame(self, backend: Backend = "pandas") -> Any:
        """:meth:`columns` as a DataFrame (pandas or polars)."""
        return to_frame(self.columns(), backend)

    def to_dict(self) -> dict[str, Any]:
        return {
            "release_id": self.release_id, "design_digest": self.design_digest, "alpha": self.alpha,
            "power": self.power, "at_v": self.at_v, "planned_n": self.planned_n, "n": self.n,
            "epsilon": self.epsilon, "sequential_epsilon": self.sequential_epsilon,
            "questions": [a.to_dict() for a in self.answers], "privacy": NO_BUDGET,
        }  # fmt: skip

    def block(self) -> printing.Block:
        """The answers as one table: each question's table, test, G, df, p-value, effect with its
        interval, and the design's planned V and power beside them; the notes after it."""
        head = ["Q", "question", "table", "test", "G", "df", "p-value", "effect", "estimate", "interval", "V planned"]
        if self.at_v is not None:
            head.append(f"power@{self.at_v:g}")
        rows = []
        for x in self.answers:
            figures = ([printing.sig(x.statistic), str(x.df), printing.p_value(x.p_value)] if x.answered
                       else ["", "", ""])  # fmt: skip
            effect = ([x.effect.split(" (")[0], printing.fixed(x.estimate), printing.interval(x.ci_low, x.ci_high)]
                      if x.answered else ["", "", ""])  # fmt: skip
            row = [f"Q{x.number}", x.question, "" if x.table is None else str(x.table),
                   short_test(x.test) if x.answered else "not answered", *figures, *effect,
                   printing.fixed(x.planned_v, 3) if math.isfinite(x.planned_v) else "none"]  # fmt: skip
            if self.at_v is not None:
                row.append("" if x.planned_power is None else printing.fixed(x.planned_power, 3))
            rows.append(tuple(row))
        plain = "likelihood-ratio test of independence"
        said = [(x.number, [t for t in (x.test if x.answered and x.test != plain else "", x.note) if t])
                for x in self.answers]  # fmt: skip
        notes = [f"Q{number}: " + "; ".join(texts) for number, texts in said if texts]
        methods = dict.fromkeys(x.method for x in self.answers if x.method)
        notes += [f"p-values ({', '.join(f'Q{x.number}' for x in self.answers if x.method == m)}): {m}"
                  for m in methods]  # fmt: skip
        level = next((x.level for x in self.answers if x.answered), 0.95)
        notes += [f"intervals: {printing.level_text(level)} (a V's excludes 0 exactly when the test beside it "
                  f"rejects at {1 - level:.2g}); V planned: the design's smallest Cramer's V each test "
                  f"detects with probability {self.power:g} at level {self.alpha:g}, for {self.planned_n} records "
                  "('none': no useful power)", NO_BUDGET]  # fmt: skip
        n = f"n = {self.n}" + (f" (planned {self.planned_n})" if self.n != self.planned_n else "")
        return printing.Block(
            f"The design's {counted(len(self.answers), 'question')}, answered: release {self.release_id}",
            lines=(f"data:  {n}; epsilon charged (Eq. T1) {printing.sig(self.epsilon, 6)}, sequential (Eq. T3) "
                   f"{printing.sig(self.sequential_epsilon, 6)}; design {self.design_digest[:16]}",),
            header=tuple(head), rows=tuple(rows), align="lllll" + "r" * 3 + "lrl" + "r" * (len(head) - 11),
            notes=tuple(notes),
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        parts = [f"Q{x.number} p = {printing.p_value(x.p_value)}" if x.answered else f"Q{x.number} not answered"
                 for x in self.answers]  # fmt: skip
        return printing.short_repr("QuestionAnswers", f"release {self.release_id}: " + "; ".join(parts))

    def _repr_html_(self) -> str:
        return self.block().html()


@dataclass(frozen=True)
class TableInfo:
    """One table of a release (``Result.tables()``): its number (1-based), attributes, the
    curators holding them, K_t, m_t, gamma_t, keep a_t (None where it was not estimated), the
    design's questions it answers and whether it was estimated."""

    table: int
    attributes: tuple[str, ...]
    curators: tuple[str, ...]
    K: int
    m: int | None
    gamma: float | None
    keep: float | None
    questions: tuple[int, ...] = ()
    missing: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "attributes": list(self.attributes), "curators": list(self.curators),
                "K": self.K, "m": self.m, "gamma": self.gamma, "keep": self.keep,
                "questions": list(self.questions), "missing": self.missing or None}  # fmt: skip


@dataclass(frozen=True)
class ReleaseTables:
    """The tables of a release (``Result.tables()``), printable: table, attributes, K, m, gamma
    and keep a of each, with the questions each answers; the release's epsilon as charged (Eq.
    T1) and by sequential composition (Eq. T3). One row for a release of the whole joint."""

    release_id: str
    rows: tuple[TableInfo, ...]
    epsilon: float
    sequential_epsilon: float
    n: int

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> TableInfo:
        return self.rows[index]

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        """table, attributes (joined by ", "), curators, K, m, gamma, keep (NaN/0 where not
        estimated), questions ("Q1, Q2"), missing."""
        r = self.rows
        return {
            "table": np.asarray([x.table for x in r], dtype=np.int64),
            "attributes": np.asarray([", ".join(x.attributes) for x in r], dtype=object),
            "curators": np.asarray([", ".join(x.curators) for x in r], dtype=object),
            "K": np.asarray([x.K for x in r], dtype=np.int64),
            "m": np.asarray([0 if x.m is None else x.m for x in r], dtype=np.int64),
            "gamma": np.asarray([math.nan if x.gamma is None else x.gamma for x in r], dtype=np.float64),
            "keep": np.asarray([math.nan if x.keep is None else x.keep for x in r], dtype=np.float64),
            "questions": np.asarray([", ".join(f"Q{q}" for q in x.questions) for x in r], dtype=object),
            "missing": np.asarray([x.missing for x in r], dtype=object),
        }

    def to_frame(self, backend: Backend = "pandas") -> Any:
        """:meth:`columns` as a DataFrame (pandas or polars)."""
        return to_frame(self.columns(), backend)

    def to_dict(self) -> dict[str, Any]:
        return {"release_id": self.release_id, "n": self.n, "epsilon": self.epsilon,
                "sequential_epsilon": self.sequential_epsilon, "tables": [x.to_dict() for x in self.rows]}  # fmt: skip

    def block(self) -> printing.Block:
        rows = tuple(
            (str(x.table), ", ".join(x.attributes), str(x.K), "" if x.m is None else str(x.m),
             "" if x.gamma is None else printing.sig(x.gamma), "" if x.keep is None else printing.sig(x.keep),
             ", ".join(f"Q{q}" for q in x.questions) or ("not estimated" if x.missing else ""))
            for x in self.rows
        )  # fmt: skip
        return printing.Block(
            f"Release {self.release_id}: {counted(len(self.rows), 'table')}",
            lines=(f"data:  n = {self.n}; epsilon charged (Eq. T1) {printing.sig(self.epsilon, 6)}, sequential "
                   f"(Eq. T3) {printing.sig(self.sequential_epsilon, 6)}",),
            header=("table", "attributes", "K", "m", "gamma", "keep a", "answers"), rows=rows, align="llrrrrl",
            notes=tuple(f"table {x.table} not estimated: {x.missing}" for x in self.rows if x.missing),
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        text = "; ".join(f"{x.table}: {', '.join(x.attributes)}"
                         + (" (not estimated)" if x.m is None else f" (m={x.m})") for x in self.rows)
        return printing.short_repr("ReleaseTables", f"release {self.release_id}: {text}")

    def _repr_html_(self) -> str:
        return self.block().html()


# ------------------------------------------------------------------------------------ text
def _p(p: float) -> str:
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def test_lines(t: AssociationTest, alpha: float = 0.05) -> list[str]:
    """A test as a person reads it: the hypothesis, the statistic, the p-value and how it was
    made, and what it means at ``alpha``."""
    verdict = (
        f"reject independence at alpha {alpha:g}: the data show an association"
        if t.p_value <= alpha
        else f"no evidence of association at alpha {alpha:g} (which is not evidence of independence: "
        "see the power with `secure-release plan --power`)"
    )
    return [
        f"H0: {t.hypothesis} (m = {t.m} released records"
        + (f", {t.strata} strata)" if t.given else ")"),
        f"  likelihood-ratio statistic G = {t.statistic:.4g} on {t.df} df, p = {_p(t.p_value)}",
        *textwrap.wrap(f"p-value: {t.method}", 100, initial_indent="  ", subsequent_indent="    "),
        f"  -> {verdict}",
        f"  {NO_BUDGET}",
    ]


#: How the text and the page name each effect.
EFFECT_NAMES = printing.EFFECT_NAMES


def _effect_line(e: fx.Effect, level: float) -> str:
    name = EFFECT_NAMES.get(e.name, e.name)
    return f"  {name:<26} {e.estimate:8.4f}   {100 * level:g}% interval [{e.low:.4f}, {e.high:.4f}]"


def association_lines(x: Association) -> list[str]:
    """The effect sizes of a pair, one line each, with their intervals."""
    head = f"Association of {', '.join(x.a)} with {', '.join(x.b)} ({x.levels[0]} x {x.levels[1]} table)"
    return [
        head,
        *(_effect_line(e, x.effects.level) for e in x.measures()),
        *textwrap.wrap(f"intervals: {x.effects.method}", 100, initial_indent="  ", subsequent_indent="    "),
        f"  {NO_BUDGET}",
    ]


def test_effect(
    report: ReleaseReport, a: Names, b: Names, given: Names | None, *, method: str = "auto", draws: int = 999,
    seed: int = 0, level: float = 0.95,
) -> tuple[list[str], dict[str, Any]]:  # fmt: skip
    """The effect printed beside a test (``analyst test``), made with that same test (``method``,
    ``draws``, ``seed``): the pair's effects (:func:`association`) or, with ``given``, the
    conditional V (:func:`conditional_association`); its lines and its JSON."""
    groups, _, tested = _tested_table(report, a, b, given, method, draws, seed)
    if groups[2]:
        x = conditional_association(report, a, b, groups[2], level=level, seed=seed, draws=draws, test=tested)
        return conditional_association_lines(x), x.to_dict()
    pair = association(report, a, b, level=level, seed=seed, draws=draws, test=tested)
    return association_lines(pair), pair.to_dict()


def conditional_association_lines(x: ConditionalAssociation) -> list[str]:
    """A conditional V with its interval, one line, then how it is made."""
    return [
        f"Association of {', '.join(x.a)} with {', '.join(x.b)} within every level of {', '.join(x.given)}",
        f"  {'conditional Cramer' + chr(39) + 's V':<26} {x.estimate:8.4f}   {100 * x.level:g}% interval "
        f"[{x.low:.4f}, {x.high:.4f}]",
        *textwrap.wrap(f"interval: {CONDITIONAL_METHOD}", 100, initial_indent="  ", subsequent_indent="    "),
        f"  {NO_BUDGET}",
    ]


def associations_lines(rows: Sequence[AssociationRow]) -> list[str]:
    """Every cross-curator pair, sorted by the adjusted p-value."""
    if not rows:
        return ["no pair of attributes held by different curators: nothing to test"]
    width_a = max(len("a"), *(len(r.test.a[0]) for r in rows))
    width_b = max(len("b"), *(len(r.test.b[0]) for r in rows))
    level = rows[0].effect.effects.level
    out = [
        f"{'a':<{width_a}}  {'b':<{width_b}}  {'G':>8} {'df':>3}  {'p':>8}  {'p (Holm)':>8}  "
        f"Cramer's V [{100 * level:g}% interval]",
    ]
    for r in rows:
        v = r.effect.effects.cramers_v
        out.append(
            f"{r.test.a[0]:<{width_a}}  {r.test.b[0]:<{width_b}}  {r.test.statistic:8.3f} {r.test.df:>3}  "
            f"{_p(r.test.p_value):>8}  {_p(r.p_adjusted):>8}  {v.estimate:.3f} [{v.low:.3f}, {v.high:.3f}]"
        )
    out += [
        f"p (Holm): {ADJUSTMENT}",
        *textwrap.wrap(f"p-values: {rows[0].test.method}", 100, subsequent_indent="  "),
        *textwrap.wrap(f"intervals: {rows[0].effect.effects.method}", 100, subsequent_indent="  "),
        NO_BUDGET,
    ]
    return out
