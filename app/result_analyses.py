"""The analyses of a released estimate (docs/analysis.md): tests of independence, measures of
association, logistic models, the design's questions, a marginal's chart
(``api.Result.test_independence``, ``association``, ``logistic``, ``questions``, ...). The
statistics are in ``mechanism/analysis``; ``app/analysis.py`` feeds them a release and shapes
their results. Post-processing of the released counts: none of these spends privacy budget.

A release of several tables: each analysis reads the table that holds every attribute it names
(``ResultBase._route``), and :meth:`ResultAnalyses.questions` answers the design's questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from secure_release import analysis
from secure_release.frames import Backend, require, to_frame
from secure_release.mechanism.errors import NoTableHoldsError, SecureReleaseError
from secure_release.result_views import ResultViews


class NoDesignError(SecureReleaseError):
    """``questions()`` (``secure-release analyst questions``) of a release of the whole joint: only
    a release designed for questions (``plan --question``, ``api.design``) has questions to answer."""


class ResultAnalyses(ResultViews):
    """The analyses of a :class:`~secure_release.api.Result`; each forwards to the table that
    answers it (``self._route(...)``), then calls ``app/analysis.py`` on that table's report."""

    def questions(self, *, seed: int = 0, draws: int = 999, level: float = 0.95) -> analysis.QuestionAnswers:
        """Every question of the design answered from the table that holds it, the one every analysis
        of its attributes reads (``_route``: of several, the largest m_t a_t^2; the design's own
        table unless another tells more), so a pair prints one interval everywhere: for ``A ~ B`` and
        ``A ~ B | C + D`` the likelihood-ratio test's p-value and Cramer's V with its interval, for
        ``Y ~ X1 + X2`` of a binary Y the logistic deviance test of X1 (else the planned test of
        independence, and the answer says so), each beside the design's planned detectable V and
        its power at the design's ``at_v`` (:func:`analysis.answer_question`). Prints as a table
        (``str``, a notebook's HTML); ``to_frame()``, ``columns()``, ``to_dict()``. A release of
        the whole joint has no design: :class:`NoDesignError`. Spends no privacy budget."""
        from secure_release.mechanism.analysis.questions import parse_question

        d, t = self.design, self.tables_report
        if d is None or t is None:
            raise NoDesignError(
                f"release {self.report.release_id!r} is one table of the whole joint, not a release designed for "
                "questions: it has no questions to answer. Ask yours with test_independence, association or "
                "logistic (`secure-release analyst test`), or design a release for them (`secure-release plan "
                "--question`)"
            )
        out = []
        for i, (text, figure) in enumerate(zip(d.questions, d.release.figures, strict=True)):
            question = parse_question(text)
            try:  # the table every analysis of these attributes reads, so one pair prints one interval
                part = self._route(question.attributes)
                table = next(k for k, p in enumerate(self.parts, start=1) if p is part)
            except NoTableHoldsError:
                why = t.missing.get(figure.table, "its table was not estimated")
                out.append(analysis.unanswered(
                    i + 1, text, question.kind, figure.detectable_v, figure.power_at_v,
                    f"its table {figure.table + 1} was not estimated: {why}",
                ))  # fmt: skip
                continue
            out.append(analysis.answer_question(part.report, question, i + 1, table, figure.detectable_v,
                                                figure.power_at_v, seed=seed, draws=draws, level=level))  # fmt: skip
        return analysis.QuestionAnswers(t.release_id, t.design_digest, tuple(out), d.alpha, d.power, d.at_v, d.n,
                                        self.report.plan.n, t.epsilon, t.sequential_epsilon)  # fmt: skip


    def test_independence(
        self,
        a: Sequence[str] | str,
        b: Sequence[str] | str,
        given: Sequence[str] | str | None = None,
        *,
        method: str = "auto",
        draws: int = 999,
        seed: int = 0,
    ) -> analysis.AssociationTest:
        """Test H0: ``a`` and ``b`` are independent (within every level of ``given``). Each is an
        attribute name or a list of names, from any curators. A likelihood-ratio test of the
        perturbed multinomial, its null fitted by EM; the p-value from a seeded parametric
        bootstrap wherever the chi-square approximation is not trustworthy (``method`` says
        which). Returns ``statistic``, ``df``, ``p_value`` and ``method``."""
        if self.parts:
            return self._route(a, b, given).test_independence(a, b, given, method=method, draws=draws, seed=seed)
        return analysis.test_independence(self.report, a, b, given, method=method, draws=draws, seed=seed)

    def association(
        self,
        a: Sequence[str] | str,
        b: Sequence[str] | str,
        *,
        ordered: Sequence[str] = (),
        level: float = 0.95,
        seed: int = 0,
    ) -> analysis.Association:
        """How strongly ``a`` and ``b`` are associated: ``cramers_v`` with ``ci_low`` and
        ``ci_high``, the mutual information, the odds ratio and risk difference of two binary
        attributes, Kendall's tau-b of two ordered ones (binned numbers, or named in ``ordered``),
        each with its interval at ``level``."""
        if self.parts:
            return self._route(a, b).association(a, b, ordered=ordered, level=level, seed=seed)
        return analysis.association(self.report, a, b, ordered=ordered, level=level, seed=seed)

    def association_rows(self, *, seed: int = 0, draws: int = 999) -> list[analysis.AssociationRow]:
        """Every pair of attributes held by different curators, tested and measured, sorted by the
        Holm-adjusted p-value (a release of several tables: every such pair of any table, each
        tested on the table that answers it, as :meth:`test_independence` routes, adjusted over
        all of them)."""
        if not self.parts:
            return analysis.associations(self.report, seed=seed, draws=draws)
        pairs = dict.fromkeys(x for p in self.parts if p is not None for x in analysis.cross_curator_pairs(p.report))
        chosen = [(self._route(a, b).report, a, b) for a, b in pairs]
        return analysis.adjusted_associations(chosen, seed=seed, draws=draws)

    def associations(self, backend: Backend = "pandas", *, seed: int = 0, draws: int = 999) -> Any:
        """:meth:`association_rows` as a DataFrame: a, b, the curators holding them, statistic,
        df, p_value, p_holm (Holm-adjusted over the pairs), cramers_v with v_ci_low and
        v_ci_high, mutual_information with its interval; sorted by p_holm."""
        return to_frame(analysis.association_columns(self.association_rows(seed=seed, draws=draws)), backend)

    def logistic(
        self,
        outcome: str,
        covariates: Sequence[str] | str,
        *,
        interactions: Sequence[tuple[str, str]] = (),
        level: float = 0.95,
    ) -> analysis.Model:
        """A logistic regression of ``outcome`` (two levels; more: a multinomial logit) on
        ``covariates`` (main effects, dummy-coded against their first category, and the named
        pairwise ``interactions``), fitted on the likelihood of the perturbed counts by EM over
        the true cells: coefficients with standard errors and intervals."""
        if self.parts:
            part = self._route(outcome, covariates)
            return part.logistic(outcome, covariates, interactions=interactions, level=level)
        return analysis.logistic(self.report, outcome, covariates, interactions=interactions, level=level)

    def compare_models(self, reduced: analysis.Model, full: analysis.Model) -> analysis.ModelComparison:
        """The deviance test of a reduced model against a fuller one (both from :meth:`logistic`)."""
        if self.parts:
            return self._route(full.outcome, full.over).compare_models(reduced, full)
        return analysis.compare_models(self.report, reduced, full)

    def plot_marginal(self, attribute: str, ax: Any = None) -> Any:
        """A bar chart of one attribute's marginal (needs matplotlib): the headline estimate on
        each bar, its value above it and the share's 95% interval (``plotting.marginal_bars``,
        the chart of the report page)."""
        from secure_release.plotting import marginal_bars

        if self.parts:
            return self._route(attribute).plot_marginal(attribute, ax)
        plt = require("matplotlib.pyplot")
        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3))
        title = f"{self.report.release_id}: {attribute} (epsilon {self.plan.epsilon:g}, m {self.plan.m})"
        marginal_bars(ax, self.marginal_table(attribute), title)
        return ax

