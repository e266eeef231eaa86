"""Rubin's rules: one pooled inference from M analyses of M imputations (DESIGN 13; Rubin 1987,
p. 76; Barnard and Rubin 1999), following R's ``mice::pool`` (``pool.vector``, ``barnard.rubin``)
and ``summary.mipo`` exactly, so the two agree to rounding.

For each of Q parameters, with estimates q_i and complete-data variances u_i (squared standard
errors) from the M imputations:

- qbar = mean q_i, ubar = mean u_i, b = the sample variance of the q_i (M - 1 denominator);
- t = ubar + (1 + 1/M) b (the total variance), riv = (1 + 1/M) b / ubar, lambda = (1 + 1/M) b / t;
- df: Barnard-Rubin with lambda floored at 1e-4 as mice floors it, nu_old = (M - 1)/lambda^2,
  nu_obs = (dfcom + 1)/(dfcom + 3) dfcom (1 - lambda), nu = nu_old nu_obs / (nu_old + nu_obs);
  at dfcom = inf, nu = nu_old (the limit; mice's own arithmetic gives NaN there, its default
  dfcom of 999999 stands for it);
- fmi = (riv + 2/(df + 3)) / (1 + riv);
- the t statistic qbar / sqrt(t), the two-sided p-value 2 (1 - F_t(|t|; max(df, 0.001))) and the
  interval qbar +- t_{df}(1 - (1 - level)/2) sqrt(t).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats

from secure_release.mechanism import printing
from secure_release.mechanism.errors import (
    InvalidLevelError,
    NonFiniteInputError,
    SecureReleaseError,
    ShapeMismatchError,
)

FloatArray = npt.NDArray[np.float64]

#: mice's floor on lambda in the Barnard-Rubin degrees of freedom (barnard.rubin.R).
LAMBDA_FLOOR = 1e-4
#: mice's floor on df in the p-value (summary.mipo: pmax(df, 0.001)).
DF_FLOOR = 0.001


class TooFewAnalysesError(SecureReleaseError):
    """Pooling needs the estimates of at least two imputations (M >= 2)."""


class InvalidDfcomError(SecureReleaseError):
    """The complete-data degrees of freedom dfcom must be a number > 0 (math.inf for large samples)."""


def between_variance(estimates: FloatArray) -> FloatArray:
    """b: the variance of the M estimates with the M - 1 denominator (R's ``var``), per parameter."""
    return np.asarray(estimates.var(axis=0, ddof=1), dtype=np.float64)


def total_variance(ubar: FloatArray, b: FloatArray, m: int) -> FloatArray:
    """Rubin (1987) p. 76: t = ubar + (1 + 1/M) b."""
    return np.asarray(ubar + (1.0 + 1.0 / m) * b, dtype=np.float64)


def relative_increase_in_variance(ubar: FloatArray, b: FloatArray, m: int) -> FloatArray:
    """riv = (1 + 1/M) b / ubar."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray((1.0 + 1.0 / m) * b / ubar, dtype=np.float64)


def barnard_rubin_df(m: int, b: FloatArray, t: FloatArray, dfcom: float) -> FloatArray:
    """Barnard and Rubin (1999) degrees of freedom as ``mice::barnard.rubin``: lambda =
    (1 + 1/M) b / t floored at :data:`LAMBDA_FLOOR`, nu_old = (M - 1)/lambda^2, nu_obs = (dfcom + 1)
    / (dfcom + 3) dfcom (1 - lambda), nu = nu_old nu_obs / (nu_old + nu_obs); nu_old when dfcom is
    infinite."""
    lam = np.maximum((1.0 + 1.0 / m) * b / t, LAMBDA_FLOOR)
    df_old = (m - 1) / lam**2
    if math.isinf(dfcom):
        return np.asarray(df_old, dtype=np.float64)
    df_obs = (dfcom + 1.0) / (dfcom + 3.0) * dfcom * (1.0 - lam)
    return np.asarray(df_old * df_obs / (df_old + df_obs), dtype=np.float64)


def fraction_missing_information(riv: FloatArray, df: FloatArray) -> FloatArray:
    """mice's fmi = (riv + 2/(df + 3)) / (1 + riv)."""
    return np.asarray((riv + 2.0 / (df + 3.0)) / (1.0 + riv), dtype=np.float64)


@dataclass(frozen=True)
class PooledEstimate:
    """Q parameters pooled over M imputations by Rubin's rules (one entry per parameter)."""

    names: tuple[str, ...]
    m: int
    estimate: FloatArray
    ubar: FloatArray
    b: FloatArray
    t: FloatArray
    dfcom: float
    df: FloatArray
    riv: FloatArray
    lambda_: FloatArray
    fmi: FloatArray
    level: float

    @property
    def standard_error(self) -> FloatArray:
        """sqrt(t)."""
        return np.asarray(np.sqrt(self.t), dtype=np.float64)

    @property
    def statistic(self) -> FloatArray:
        """qbar / sqrt(t)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(self.estimate / self.standard_error, dtype=np.float64)

    @property
    def p_value(self) -> FloatArray:
        """Two-sided, Student t with max(df, 0.001) degrees of freedom (``summary.mipo``)."""
        return np.asarray(2.0 * stats.t.sf(np.abs(self.statistic), np.maximum(self.df, DF_FLOOR)), dtype=np.float64)

    @property
    def ci_low(self) -> FloatArray:
        """qbar + t_{df}((1 - level)/2) sqrt(t) (``confint.mipo``)."""
        return np.asarray(self.estimate + stats.t.ppf((1.0 - self.level) / 2.0, self.df) * self.standard_error)

    @property
    def ci_high(self) -> FloatArray:
        """qbar + t_{df}(1 - (1 - level)/2) sqrt(t)."""
        return np.asarray(self.estimate + stats.t.ppf(1.0 - (1.0 - self.level) / 2.0, self.df) * self.standard_error)

    def columns(self) -> dict[str, list[Any]]:
        """The summary as named columns (for a DataFrame), in ``summary(pool(...))``'s spirit."""
        return {
            "term": list(self.names), "estimate": self.estimate.tolist(), "std.error": self.standard_error.tolist(),
            "statistic": self.statistic.tolist(), "df": self.df.tolist(), "p.value": self.p_value.tolist(),
            "ci_low": self.ci_low.tolist(), "ci_high": self.ci_high.tolist(), "riv": self.riv.tolist(),
            "lambda": self.lambda_.tolist(), "fmi": self.fmi.tolist(), "ubar": self.ubar.tolist(),
            "b": self.b.tolist(), "t": self.t.tolist(),
        }  # fmt: skip

    def block(self) -> printing.Block:
        """R's ``summary(pool(fit), conf.int = TRUE)`` as a table: term, estimate, SE, df, t, p,
        the interval, riv and fmi."""
        lo_name, hi_name = printing.interval_columns(self.level)
        header = ("term", "estimate", "std.error", "df", "statistic", "p.value", lo_name, hi_name, "riv", "fmi")
        rows = tuple(
            (name, printing.fixed(e), printing.fixed(s), printing.sig(d), printing.sig(z), printing.p_value(p),
             printing.fixed(lo), printing.fixed(hi), printing.sig(r), printing.sig(f))
            for name, e, s, d, z, p, lo, hi, r, f in zip(
                self.names, self.estimate, self.standard_error, self.df, self.statistic, self.p_value, self.ci_low,
                self.ci_high, self.riv, self.fmi, strict=True)
        )  # fmt: skip
        dfcom = "inf" if math.isinf(self.dfcom) else printing.sig(self.dfcom, 6)
        return printing.Block(
            "Pooled estimates by Rubin's rules", pairs=(("Imputations M", str(self.m)), ("dfcom", dfcom)),
            header=header, rows=rows,
            table_notes=("df: Barnard-Rubin (1999); fmi as mice::pool computes it.",), ruled=True,
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        return printing.short_repr("PooledEstimate", f"{len(self.names)} parameters over M = {self.m} imputations")

    def _repr_html_(self) -> str:
        return self.block().html()


def _as_matrix(values: npt.ArrayLike, what: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ShapeMismatchError(f"{what} must be an array (M,) or (M, Q), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise NonFiniteInputError(f"{what} hold non-finite values")
    return arr


def pool(
    estimates: npt.ArrayLike,
    variances: npt.ArrayLike,
    dfcom: float = math.inf,
    names: Sequence[str] | None = None,
    level: float = 0.95,
) -> PooledEstimate:
    """Rubin's rules over M analyses: ``estimates`` and ``variances`` (squared standard errors), each
    (M,) for one parameter or (M, Q); ``dfcom`` the complete-data degrees of freedom (m - p for a
    model of p parameters on m records; math.inf for large samples); ``names`` of the Q
    parameters; the interval at ``level``. Follows ``mice::pool`` (see the module docstring)."""
    q = _as_matrix(estimates, "the estimates")
    u = _as_matrix(variances, "the variances")
    if q.shape != u.shape:
        raise ShapeMismatchError(f"estimates {q.shape} and variances {u.shape} differ in shape")
    m, count = q.shape
    if m < 2:
        raise TooFewAnalysesError(f"pooling needs M >= 2 imputations' estimates, got {m}")
    if np.any(u < 0):
        raise NonFiniteInputError("variances must be >= 0 (squared standard errors)")
    if isinstance(dfcom, bool) or not isinstance(dfcom, int | float) or math.isnan(dfcom) or dfcom <= 0:
        raise InvalidDfcomError(f"dfcom must be a number > 0 (math.inf for large samples), got {dfcom!r}")
    if isinstance(level, bool) or not isinstance(level, int | float) or not 0.0 < level < 1.0:
        raise InvalidLevelError(f"the level must lie strictly between 0 and 1, got {level!r}")
    labels = tuple(names) if names is not None else tuple(f"q{j + 1}" for j in range(count))
    if len(labels) != count:
        raise ShapeMismatchError(f"{len(labels)} names for {count} parameters")
    qbar, ubar, b = q.mean(axis=0), u.mean(axis=0), between_variance(q)
    t = total_variance(ubar, b, m)
    df = barnard_rubin_df(m, b, t, float(dfcom))
    riv = relative_increase_in_variance(ubar, b, m)
    lam = np.asarray((1.0 + 1.0 / m) * b / t, dtype=np.float64)
    fmi = fraction_missing_information(riv, df)
    return PooledEstimate(labels, m, qbar, ubar, b, t, float(dfcom), df, riv, lam, fmi, float(level))
