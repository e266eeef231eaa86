"""The privacy guarantee of one release in standard form (pure; no I/O).

:func:`privacy_guarantee` states what Theorem 3.2 of seeds/001 (Lin, Wang, Rane) proves about a
release planned as :class:`~mechanism.plan.ReleasePlan`: pure epsilon-DP (delta = 0) for one
record of the aligned table under the replace-one relation with n public, for the mechanism
"sample m of n without replacement, then gamma-diagonal PRAM on the joint cell" — and the same
mechanism's parameters in OpenDP's and dp_accounting's terms, so a reader can check the epsilon
with those libraries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from secure_release.mechanism import accounting
from secure_release.mechanism.plan import ReleasePlan

PRIVACY_UNIT = (
    "one record of the aligned table: one individual's values of every attribute at every curator"
)
NEIGHBOURING = (
    "replace-one (bounded DP): two aligned tables are neighbours when they have the same n records "
    "and differ in the attribute values of one record; n is public. Add/remove-one is not covered: "
    "adding or removing a record changes n, and with it gamma and m"
)
MECHANISM = (
    "uniform sample of m of the n aligned records without replacement (drawn by the curators from a "
    "shared secret seed or index tuple, or by the server from a stored table; never shown to the "
    "researcher), then gamma-diagonal PRAM on each sampled record's joint cell (K-ary randomized "
    "response with local epsilon ln(gamma)), applied once"
)
THEOREM = "Lin, Wang, Rane, Theorem 3.2: epsilon = ln(1 + (m/n)(gamma - 1)), tight (Example 3.3)"
COMPOSITION = "sequential: the epsilons of releases on the same data add (each curator's ledger sums them)"


PREPROCESSING = (
    "each curator maps its own values to categories before the release by public rules fixed in its "
    "schema (bins at public edges, clamping to the outer bins, a public label for missing cells): a "
    "fixed, data-independent map of each record, so the guarantee holds for the records as given; "
    "the released categories describe the mapped values"
)


def privacy_guarantee(plan: ReleasePlan, preprocessing: Sequence[str] = ()) -> dict[str, Any]:
    """The guarantee of ``plan`` as a JSON-ready dict: epsilon, delta = 0, the privacy unit, the
    neighbouring relation, the mechanism, and its parameters in OpenDP's and dp_accounting's terms.

    ``epsilon`` is recomputed from (n, m, gamma) by Theorem 3.2, so it is the value the parameters
    actually give (equal to ``plan.epsilon`` up to rounding for a plan made by ``plan_release``).
    ``preprocessing``: one sentence per attribute with public preprocessing
    (:meth:`~mechanism.schema.Attribute.describe`); when given, the guarantee states them.
    """
    K = plan.joint_size
    local_epsilon = math.log(plan.gamma)
    extra: dict[str, Any] = {"preprocessing": {"rule": PREPROCESSING, "attributes": list(preprocessing)}}
    return ({} if not preprocessing else extra) | {
        "definition": "pure epsilon-differential privacy",
        "epsilon": accounting.epsilon_from_gamma(plan.n, plan.m, plan.gamma),
        "delta": 0.0,
        "privacy_unit": PRIVACY_UNIT,
        "neighbouring_relation": NEIGHBOURING,
        "mechanism": MECHANISM,
        "theorem": THEOREM,
        "composition": COMPOSITION,
        "parameters": {
            "n": plan.n,
            "m": plan.m,
            "sampling_rate": plan.m / plan.n,
            "K": K,
            "gamma": plan.gamma,
            "local_epsilon": local_epsilon,
            "keep_probability": plan.channel.keep,
        },
        "opendp": _opendp_terms(plan, local_epsilon),
        "dp_accounting": _dp_accounting_terms(plan),
    }


def _opendp_terms(plan: ReleasePlan, local_epsilon: float) -> dict[str, Any]:
    """OpenDP: randomized response over K categories, amplified by sampling m of n."""
    return {
        "privacy_unit": "ChangeOneDistance, d_in = 1 (equivalently SymmetricDistance, d_in = 2)",
        "measurement": "make_randomized_response(categories=<the K joint cells>, prob=prob)",
        "prob": accounting.opendp_prob(plan.joint_size, plan.gamma),
        "categories": plan.joint_size,
        "local_epsilon": local_epsilon,
        "amplification": "make_population_amplification(measurement, population_size=n) on a sample of m",
        "population_size": plan.n,
        "sample_size": plan.m,
    }


def _dp_accounting_terms(plan: ReleasePlan) -> dict[str, Any]:
    """dp_accounting: a randomized-response event inside a sampled-without-replacement event."""
    return {
        "event": (
            "SampledWithoutReplacementDpEvent(source_dataset_size=n, sample_size=m, "
            "event=RandomizedResponseDpEvent(noise_parameter, num_buckets=K))"
        ),
        "noise_parameter": accounting.dp_accounting_noise_parameter(plan.joint_size, plan.gamma),
        "num_buckets": plan.joint_size,
        "source_dataset_size": plan.n,
        "sample_size": plan.m,
        "neighboring_relation": "REPLACE_ONE",
    }


#: Search range for the epsilon that would make a release useful.
def utility_check(plan: ReleasePlan) -> dict[str, Any]:
    """The plan's utility against the typical cell share 1/K, by the one rule
    :meth:`ReleasePlan.utility_warning` states (the predicted per-cell RMSE, l2 RMSE / sqrt K, must
    not exceed 1/K): the figures, ``ok``, the m (same epsilon) or the epsilon (with its best m)
    that would pass, and ``message`` (None when the plan is fine)."""
    K = plan.joint_size
    root_k, share = math.sqrt(K), 1.0 / K
    rmse = accounting.predicted_rmse(plan.n, plan.m, K, plan.gamma)
    out: dict[str, Any] = {
        "predicted_rmse": rmse,
        "predicted_rmse_per_cell": rmse / root_k,
        "typical_cell_share": share,
        "ok": rmse / root_k <= share,
        "suggested_m": None,
        "suggested_epsilon": None,
        "message": plan.utility_warning(),
    }
    if out["ok"]:
        return out
    m_best, best = accounting.best_rmse_at_epsilon(plan.n, K, plan.epsilon)
    if best / root_k <= share:
        out["suggested_m"] = m_best
        return out
    eps = accounting.smallest_epsilon_for_rmse(plan.n, K, root_k * share)
    if eps is not None:
        out["suggested_epsilon"], out["suggested_m"] = eps, accounting.best_rmse_at_epsilon(plan.n, K, eps)[0]
    return out
