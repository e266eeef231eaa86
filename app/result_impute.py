"""Multiply-imputed records of a released estimate (``api.Result.impute``; DESIGN 13): M proper
imputations of every released table's records under the release's exact PRAM channel, for any
model in statsmodels, R or Stata, pooled by Rubin's rules (``secure_release.imputation``).
Post-processing of the released counts: spends no privacy budget."""

from __future__ import annotations

from collections.abc import Sequence

from secure_release.imputation import DEFAULT_IMPUTATIONS, Imputations, impute_tables
from secure_release.mechanism.estimation.imputation import DEFAULT_ALPHA
from secure_release.result_base import ResultBase


class ResultImpute(ResultBase):
    """``impute()`` of a :class:`~secure_release.api.Result`: a release of several tables imputes
    each estimated table."""

    def impute(
        self, M: int = DEFAULT_IMPUTATIONS, *, seed: int = 0,
        model: str | Sequence[Sequence[str]] | None = None, alpha: float = DEFAULT_ALPHA,
    ) -> Imputations:  # fmt: skip
        """``M`` imputations of the released records' true cells, drawn by data augmentation from
        their posterior given the perturbed counts (a Dirichlet(``alpha``) prior per cell, by default
        1: the uniform prior on the simplex), under the saturated joint or the log-linear ``model`` (R's notation, e.g.
        ``"y*x1 + y*x2 + x1*x2"``: choose one that contains your analysis for intervals close to
        the direct fit's; the saturated joint is valid for every analysis but wider). ``seed``
        fixes the draws. The result prints its mixing diagnostics, ``.fit(formula, family)``
        pools a statsmodels model by Rubin's rules, ``.to_frame()`` is the long format for R's
        ``mice`` and Stata's ``mi``. Spends no privacy budget."""
        parts = [(i, p.report) for i, p in enumerate(self.parts or (self,), start=1) if p is not None]
        return impute_tables(parts, M, seed=seed, model=model, alpha=alpha)
