"""A statsmodels formula fitted on every imputation of a release and pooled by Rubin's rules.

The imputations are complete tables of the m released records, held as counts per cell
(:mod:`secure_release.imputation`). A model is fitted on each one as the analyst would fit it on
real records, and the M fits are pooled by :func:`secure_release.mechanism.analysis.pooling.pool`
(``mice::pool``'s arithmetic, Barnard-Rubin degrees of freedom with dfcom = m - p for a model of p
parameters of the m records, the Poisson model of their cell counts included: its K - p residual
degrees of freedom count cells, not the records the estimates rest on).

Families: ``binomial`` (a two-level outcome is coded 1 for its second level, as the schema orders
them), ``poisson`` (a log-linear model of the ``count`` column over every cell, zeros included),
``gaussian``, ``gamma``, ``negativebinomial`` (GLMs with the counts as frequency weights), and
``ordinal`` (statsmodels' ``OrderedModel``, logit link, on the records expanded one row each).

A fit that diverges on some imputation (an empty cell separating the outcome; a standard error
far past the others') is never pooled silently: :class:`DegenerateImputationError` names the
imputations and what to do, unless the caller asks to drop them (``on_degenerate="drop"``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.frames import require
from secure_release.mechanism import printing
from secure_release.mechanism.analysis.pooling import PooledEstimate, pool
from secure_release.mechanism.errors import SecureReleaseError

FloatArray = npt.NDArray[np.float64]

GLM_FAMILIES = ("binomial", "poisson", "gaussian", "gamma", "negativebinomial")
FAMILIES = (*GLM_FAMILIES, "ordinal")
#: A fit whose standard error of some coefficient exceeds this many times that coefficient's
#: median standard error over the imputations is degenerate (a near-separation: the estimate runs
#: off towards infinity and its standard error with it).
SE_BLOWUP = 10.0
#: The column of the imputed tables that holds each cell's count (a frequency weight).
COUNT_COLUMN = "count"
ON_DEGENERATE = ("refuse", "drop")


class UnknownFamilyError(SecureReleaseError):
    """The model family is not one the imputed fits know."""


class FormulaError(SecureReleaseError):
    """The formula names a variable the imputed table does not hold, or statsmodels refused it."""


class DegenerateImputationError(SecureReleaseError):
    """Some imputations' fits diverged (separation from an empty cell, no convergence); pooling
    them would give a useless interval, and dropping them silently would hide it."""


@dataclass(frozen=True)
class ImputationFit:
    """One imputation's fit: its coefficients, their variances, dfcom, and why it is degenerate
    (empty when it is not)."""

    imputation: int
    params: FloatArray
    variances: FloatArray
    dfcom: float
    problem: str = ""


@dataclass(frozen=True)
class PooledFit:
    """A model fitted on each of M imputations and pooled by Rubin's rules: print it, or
    ``to_frame()``. ``pooled`` is the :class:`PooledEstimate`; ``fits`` every imputation's fit;
    ``dropped`` the imputations left out (``on_degenerate="drop"``) with their reason."""

    formula: str
    family: str
    pooled: PooledEstimate
    fits: tuple[ImputationFit, ...]
    dropped: tuple[tuple[int, str], ...]
    table: int
    model: str
    outcome_note: str = ""

    def block(self) -> printing.Block:
        base = self.pooled.block()
        dfcom = "inf" if math.isinf(self.pooled.dfcom) else printing.sig(self.pooled.dfcom, 6)
        pairs = (
            ("Formula", self.formula), ("Family", self.family), ("Imputed under", self.model),
            ("Table", str(self.table)), ("Imputations M", str(self.pooled.m)), ("dfcom", dfcom),
        )  # fmt: skip
        notes = list(base.table_notes)
        if self.outcome_note:
            notes.append(self.outcome_note)
        if self.dropped:
            listed = ", ".join(f"{i} ({why})" for i, why in self.dropped)
            notes.append(f"DROPPED imputations {listed}: the pooled result rests on the others; impute under a "
                         "smaller model or merge levels.")  # fmt: skip
        return printing.Block(f"Multiple imputation: {self.family} model pooled by Rubin's rules", pairs=pairs,
                              header=base.header, rows=base.rows, table_notes=tuple(notes), ruled=True)  # fmt: skip

    def to_frame(self, backend: Any = "pandas") -> Any:
        """The pooled table (term, estimate, std.error, statistic, df, p.value, the interval, riv,
        lambda, fmi, ubar, b, t) as a DataFrame."""
        from secure_release.frames import to_frame

        return to_frame({k: np.asarray(v) for k, v in self.pooled.columns().items()}, backend)

    def to_dict(self) -> dict[str, Any]:
        return {"formula": self.formula, "family": self.family, "model": self.model, "table": self.table,
                "m": self.pooled.m, "dfcom": None if math.isinf(self.pooled.dfcom) else self.pooled.dfcom,
                "terms": self.pooled.columns(), "dropped": [list(d) for d in self.dropped]}  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        return printing.short_repr("PooledFit", f"{self.formula} ({self.family}) over M = {self.pooled.m}")

    def _repr_html_(self) -> str:
        return self.block().html()


def check_family(family: str) -> str:
    if family not in FAMILIES:
        raise UnknownFamilyError(f"family {family!r} is not known; use one of {', '.join(FAMILIES)}")
    return family


def _glm_family(sm: Any, family: str) -> Any:
    return {
        "binomial": sm.families.Binomial, "poisson": sm.families.Poisson, "gaussian": sm.families.Gaussian,
        "gamma": sm.families.Gamma, "negativebinomial": sm.families.NegativeBinomial,
    }[family]()  # fmt: skip


def _glm_fits(frames: Sequence[Any], formula: str, family: str) -> tuple[list[Any], tuple[str, ...]]:
    """statsmodels GLM fits of every imputation's cells: the formula is read once (every imputation
    holds the same K cells in the same order), then each fit takes its own counts, as the outcome
    of a Poisson model of the counts or as frequency weights."""
    smf = require("statsmodels.formula.api")
    sm = require("statsmodels.api")
    first = smf.glm(formula, frames[0], family=_glm_family(sm, family))
    names = tuple(str(n) for n in first.exog_names)
    fits = []
    for frame in frames:
        counts = np.asarray(frame[COUNT_COLUMN], dtype=np.float64)
        if family == "poisson":
            fits.append(sm.GLM(counts, first.exog, family=_glm_family(sm, family), offset=None))
        else:
            fits.append(sm.GLM(first.endog, first.exog, family=_glm_family(sm, family), freq_weights=counts))
    return fits, names


def _fit_one(model: Any, family: str, imputation: int, formula: str) -> tuple[ImputationFit, tuple[str, ...]]:
    """One imputation's fit of a prepared statsmodels model, with why it is degenerate."""
    problem = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if family == "ordinal":
                result = model.fit(method="bfgs", disp=False, maxiter=200)
                converged = bool(result.mle_retvals.get("converged", True))
            else:  # IRLS to a deviance change of 1e-12, so the standard errors are the converged fit's
                result = model.fit(tol=1e-12, maxiter=100)
                converged = bool(getattr(result, "converged", True))
        except Exception as exc:  # statsmodels raises PerfectSeparationError, LinAlgError
            name = type(exc).__name__
            if "Separation" in name or "LinAlg" in name:
                return ImputationFit(imputation, np.array([]), np.array([]), math.inf, f"{name}: {exc}"), ()
            raise FormulaError(f"statsmodels could not fit {formula!r} ({family}) on imputation {imputation}: "
                               f"{name}: {exc}") from exc  # fmt: skip
    params = np.asarray(result.params, dtype=np.float64)
    variances = np.asarray(result.bse, dtype=np.float64) ** 2
    if not converged:
        problem = "the fit did not converge"
    elif any("separation" in str(w.message).lower() for w in caught):
        problem = "perfect separation"
    elif not np.all(np.isfinite(variances)):
        problem = "a standard error is not finite"
    names = tuple(str(n) for n in getattr(result.params, "index", model.exog_names))
    return ImputationFit(imputation, params, variances, float(result.df_resid), problem), names


def _models(frames: Sequence[Any], formula: str, family: str) -> tuple[list[Any], tuple[str, ...]]:
    """One prepared statsmodels model an imputation, and the coefficients' names."""
    try:
        if family != "ordinal":
            return _glm_fits(frames, formula, family)
        from statsmodels.miscmodels.ordinal_model import OrderedModel

        models = [OrderedModel.from_formula(formula, frame, distr="logit") for frame in frames]
        return models, ()
    except FormulaError:
        raise
    except Exception as exc:  # patsy's errors name the unknown variable
        raise FormulaError(f"statsmodels could not read {formula!r} ({family}) on the imputed table: "
                           f"{type(exc).__name__}: {exc}") from exc  # fmt: skip


def _blown_up(fits: Sequence[ImputationFit]) -> dict[int, str]:
    """Imputations whose standard error of some coefficient is SE_BLOWUP times that coefficient's
    median over the other fits (the "SE of 1,857" of a fit on an imputation with an empty cell)."""
    good = [f for f in fits if not f.problem]
    if len(good) < 3:
        return {}
    se = np.sqrt(np.stack([f.variances for f in good]))
    median = np.median(se, axis=0)
    out: dict[int, str] = {}
    for f, row in zip(good, se, strict=True):
        worst = int(np.argmax(row / median))
        if row[worst] > SE_BLOWUP * median[worst]:
            out[f.imputation] = f"a standard error {row[worst]:.3g}, {row[worst] / median[worst]:.0f}x the median"
    return out


def pool_fits(
    frames: Sequence[Any], formula: str, family: str, *, table: int, model: str, level: float = 0.95,
    on_degenerate: str = "refuse", outcome_note: str = "",
) -> PooledFit:  # fmt: skip
    """Fit ``formula`` on each imputation's frame (``frames[i]`` is imputation i + 1) and pool by
    Rubin's rules; degenerate fits are refused by name (or dropped, ``on_degenerate="drop"``)."""
    check_family(family)
    records = int(np.asarray(frames[0][COUNT_COLUMN]).sum()) if COUNT_COLUMN in frames[0] else len(frames[0])
    if on_degenerate not in ON_DEGENERATE:
        raise DegenerateImputationError(f"on_degenerate must be one of {ON_DEGENERATE}, not {on_degenerate!r}")
    models, names = _models(frames, formula, family)
    results = [_fit_one(model, family, i + 1, formula) for i, model in enumerate(models)]
    fits = [r[0] for r in results]
    names = names or next((r[1] for r in results if r[1]), ())
    problems = {f.imputation: f.problem for f in fits if f.problem}
    problems.update(_blown_up(fits))
    if problems and on_degenerate == "refuse":
        listed = "; ".join(f"imputation {i}: {why}" for i, why in sorted(problems.items()))
        raise DegenerateImputationError(
            f"{len(problems)} of {len(fits)} imputations give a degenerate fit of {formula!r} ({listed}). Pooling "
            "them gives a useless interval. Impute under a log-linear model that contains the analysis (model=...: "
            "it smooths the empty cells), merge sparse levels, use the project's own PRAM-likelihood model "
            "(logistic()), or drop them knowingly with on_degenerate='drop'"
        )
    kept = [f for f in fits if f.imputation not in problems]
    if len(kept) < 2:
        raise DegenerateImputationError(f"only {len(kept)} of {len(fits)} imputations give a usable fit of "
                                        f"{formula!r}: nothing to pool; impute under a smaller model")  # fmt: skip
    dfcom = kept[0].dfcom if family != "poisson" else records - len(names)
    pooled = pool(np.stack([f.params for f in kept]), np.stack([f.variances for f in kept]), dfcom,
                  names=names, level=level)  # fmt: skip
    dropped = tuple(sorted(problems.items()))
    return PooledFit(formula, family, pooled, tuple(fits), dropped, table, model, outcome_note)
