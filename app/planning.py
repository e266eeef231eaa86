"""Before a release, from public inputs only: the plan of m and gamma with its guarantee
(``api.plan``), what to give up when it says noise (``api.suggest``) and the power of a test of
association (``api.power``): ``secure-release plan`` and its ``--suggest`` and ``--power``.

    >>> from secure_release import api
    >>> p = api.plan(n=45222, alphabet=[6, 4], epsilon=0.5)
    >>> p.m, p.K
    (1472, 24)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from secure_release.mechanism.analysis.power import PowerPlan, power_plan
from secure_release.mechanism.analysis.suggest import DEFAULT_LIMIT, SuggestionReport, suggest_changes
from secure_release.mechanism.privacy.guarantee import plan_report, privacy_guarantee, utility_check
from secure_release.mechanism.privacy.plan import ReleasePlan, plan_release
from secure_release.schema_inputs import SchemaSpec, schema_and_id_column


@dataclass(frozen=True)
class Plan:
    """A release plan with its privacy guarantee and a utility check (:func:`plan`)."""

    plan: ReleasePlan

    @property
    def n(self) -> int:
        return self.plan.n

    @property
    def m(self) -> int:
        return self.plan.m

    @property
    def epsilon(self) -> float:
        return self.plan.epsilon

    @property
    def gamma(self) -> float:
        return self.plan.gamma

    @property
    def K(self) -> int:  # noqa: N802 - the paper's name
        return self.plan.joint_size

    @property
    def guarantee(self) -> dict[str, Any]:
        """The guarantee in standard form (:func:`~secure_release.mechanism.privacy.guarantee.privacy_guarantee`)."""
        return privacy_guarantee(self.plan)

    @property
    def utility(self) -> dict[str, Any]:
        """Predicted RMSE against the typical cell share 1/K, with a suggestion when too noisy."""
        return utility_check(self.plan)

    def to_dict(self) -> dict[str, Any]:
        """``secure-release plan --json``: the plan's figures, ``guarantee`` and ``utility``."""
        return {**plan_report(self.plan), "utility": self.utility}


def plan(n: int, alphabet: Sequence[int], epsilon: float, m: int | None = None) -> Plan:
    """Plan a release of ``n`` aligned records, one alphabet size per curator; m defaults to m*.
    Warns (``UserWarning``) when the predicted RMSE exceeds the typical cell share 1/K."""
    p = Plan(plan_release(n, alphabet, epsilon, m))
    message = p.utility["message"]
    if message:
        warnings.warn(message, UserWarning, stacklevel=2)
    return p


def suggest(
    n: int, schemas: Sequence[SchemaSpec], epsilon: float,
    target: float | None = None, limit: int = DEFAULT_LIMIT,
) -> SuggestionReport:
    """What to give up when the plan says noise (``secure-release plan --suggest``): the smallest
    changes of the curators' schemas (files, schema dicts or :class:`CuratorSchema`, in release
    order) that bring the predicted per-cell RMSE at m* under ``target`` (default: half the typical
    share, 1/(2K) of each changed K): drop attributes, merge adjacent bins, merge categories into a
    schema's public ``"groups"``; and the epsilon that would suffice with the schemas unchanged.
    Public inputs only, never the data. Sorted by what each keeps; ``.to_dict()`` is the JSON of
    ``plan --suggest --json``; each suggestion's ``schemas`` are the changed schemas."""
    parsed = [schema_and_id_column(f"curator{j + 1}", spec, None)[0] for j, spec in enumerate(schemas)]
    return suggest_changes(parsed, n, epsilon, target, limit)


def power(
    n: int,
    schemas: Sequence[SchemaSpec],
    epsilon: float,
    a: str,
    b: str,
    m: int | None = None,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
) -> PowerPlan:
    """The power of the test of association of attributes ``a`` and ``b`` before the budget is
    spent (``secure-release plan --power A,B``), from public inputs only: the curators' schemas
    (files, schema dicts or :class:`CuratorSchema`, in release order), n and epsilon. Gives
    ``min_detectable_cramers_v`` (the smallest Cramer's V the test finds with probability ``power``
    at level ``alpha``) at m (default m*), ``best_m`` (the m that minimises it) with the V there,
    and the V at m*, which minimises the error of the whole joint: the ``note`` says when the
    two differ and by how much. Uniform marginals are assumed (``assumption`` says so)."""
    parsed = [schema_and_id_column(f"curator{j + 1}", spec, None)[0] for j, spec in enumerate(schemas)]
    return power_plan(n, parsed, epsilon, a, b, m, alpha=alpha, power=power)

