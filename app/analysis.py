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
from secure_release.mechanism.analysis import effects as fx
from secure_release.mechanism.analysis import regression as reg
from secure_release.mechanism.analysis import subtables
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
    lay = release_layout(report)
    groups = [_names(a), _names(b), _names(given)]
    subtables.check_names(lay, groups, ("a", "b", "given"))
    if not groups[0] or not groups[1]:
        raise UnknownAttributeError(
            f"a test needs attributes on both sides; the release has {list(lay.attributes)}"
        )
    table = subtables.attribute_table(report.observed, lay, groups)
    result = assoc.independence_test(table, report.plan.channel.keep, method=method, draws=draws, seed=seed)
    return AssociationTest(
        tuple(groups[0]),
        tuple(groups[1]),
        tuple(groups[2]),
        float(result.statistic),
        int(result.df),
        float(result.p_value),
        result.method,
        int(report.plan.m),
        int(table.shape[2]),
    )


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
) -> Association:
    """Cramer's V, the mutual information and (2 x 2) the odds ratio and risk difference, or
    (both ordered: binned numbers or named in ``ordered``) Kendall's tau-b, with intervals
    (:func:`mechanism.analysis.effects.association_effects`)."""
    lay = release_layout(report)
    groups = [_names(a), _names(b)]
    subtables.check_names(lay, groups, ("a", "b"))
    subtables.check_names(lay, [list(dict.fromkeys(ordered))], ("ordered",))
    table = subtables.attribute_table(report.observed, lay, groups)
    is_ordered = all(
        len(g) == 1 and (g[0] in ordered or lay.is_binned(g[0])) for g in groups
    )
    effects = fx.association_effects(table, report.plan.channel.keep, ordered=is_ordered, level=level, seed=seed)
    return Association(tuple(groups[0]), tuple(groups[1]), effects, (int(table.shape[0]), int(table.shape[1])))


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
    lay = release_layout(report)
    rows = []
    for a, b in subtables.cross_curator_pairs(lay):
        test = test_independence(report, a, b, draws=draws, seed=seed)
        effect = association(report, a, b, seed=seed)
        rows.append(AssociationRow(test, effect, (lay.holders[lay.index(a)], lay.holders[lay.index(b)])))
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
