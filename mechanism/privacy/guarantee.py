"""The privacy guarantee of one release in standard form (pure; no I/O).

:func:`privacy_guarantee` states what Theorem 3.2 of Lin, Wang, Rane 2013 (docs/references.md) proves about a
release planned as :class:`~mechanism.privacy.plan.ReleasePlan`: epsilon-DP with delta = 0 for one
record of the aligned table under the replace-one relation with n public, for the mechanism
"sample m of n without replacement, then gamma-diagonal PRAM on the joint cell". The ideal
mechanism's guarantee is statistical (exact, tight); the code draws the sample and the PRAM coins
with ChaCha20, so what a release has is *computational* (epsilon, 0)-DP under ChaCha20's
pseudorandomness (issue 23). :func:`guarantee_statement` writes that sentence everywhere it is
printed (``plan``, the API's ``guarantee``, the researcher's report; docs/privacy.md quotes it and
a test checks the quote). :func:`opendp_recipe` and :func:`dp_accounting_recipe` are the exact
lines printed for checking the epsilon with those libraries; a test runs them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.privacy.plan import ReleasePlan

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
COMPOSITION = (
    "sequential: the epsilons of releases on the same data add (each curator's ledger sums them), or, "
    "under a budget's PLD policy, k releases of one fixed epsilon are (eps_total, delta)-DP by optimal "
    "composition (dp_accounting's PLD)"
)
STATISTICAL = (
    "statistical (exact, for any adversary): the ideal mechanism, with a uniformly random ordered m-tuple "
    "and independent uniform PRAM coins, is (epsilon, 0)-DP (Theorem 3.2, tight; enumerated exactly in the "
    "tests), and the arithmetic never rounds in the adversary's favour (gamma rounded down, keep threshold "
    "floor(a 2^64))"
)
COMPUTATIONAL = (
    "computational (what the code runs): the sample is expanded with ChaCha20 from a 32-byte secret seed "
    "(the curators' seed, or the server's own on server-sampled releases) or drawn from the OS CSPRNG "
    "(index sharing), and the PRAM coins are ChaCha20 under a fresh 256-bit OS key, so the guarantee holds "
    "against adversaries that cannot tell ChaCha20's output from uniform, not against unbounded ones "
    "(who could search the key space); with one-time pads the server's view is perfectly hiding, with "
    "ChaCha20 pads computationally"
)


def guarantee_statement(epsilon: float | None = None) -> str:
    """The one sentence that names a release's guarantee, wherever it is printed (issue 23):
    "computational (<epsilon>, 0)-DP under ChaCha20's pseudorandomness" (``eps`` when None)."""
    value = "eps" if epsilon is None else f"{epsilon:.4g}"
    return f"computational ({value}, 0)-DP under ChaCha20's pseudorandomness"


def plan_report(plan: ReleasePlan, sum_sq: float | None = None) -> dict[str, Any]:
    """The plan's figures (:meth:`ReleasePlan.report`) and its guarantee in standard form
    (``guarantee``): the keys of ``secure-release plan --json``."""
    return {**plan.report(sum_sq), "guarantee": privacy_guarantee(plan)}


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
    epsilon = accounting.epsilon_from_gamma(plan.n, plan.m, plan.gamma)
    extra: dict[str, Any] = {"preprocessing": {"rule": PREPROCESSING, "attributes": list(preprocessing)}}
    return ({} if not preprocessing else extra) | {
        "definition": guarantee_statement(),
        "statement": guarantee_statement(epsilon),
        "statistical": STATISTICAL,
        "computational": COMPUTATIONAL,
        "epsilon": epsilon,
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


def opendp_recipe(plan: ReleasePlan) -> list[str]:
    """The exact Python lines (OpenDP 0.16) that compute the release's epsilon: K-ary randomized
    response with OpenDP's privacy map, applied to each of the m sampled records (a replace-one
    change alters one record, so the vector's map is d_in times the record's: the one hand-written
    line), then OpenDP's amplification by a simple random sample of m out of n. Run by
    tests/unit/test_claims_recipes.py; ``epsilon`` equals ours up to OpenDP's own rounding up."""
    prob = accounting.opendp_prob(plan.joint_size, plan.gamma)
    return [
        "import opendp.prelude as dp",
        'dp.enable_features("contrib", "honest-but-curious")',
        f"rr = dp.m.make_randomized_response(list(range({plan.joint_size})), prob={prob!r})",
        f"records = dp.m.make_user_measurement(dp.vector_domain(dp.atom_domain(T=int), size={plan.m}), "
        "dp.change_one_distance(), dp.max_divergence(), lambda x: [rr(v) for v in x], lambda d_in: d_in * rr.map(1))",
        f"epsilon = dp.c.make_population_amplification(records, population_size={plan.n}).map(1)",
    ]


def dp_accounting_recipe(plan: ReleasePlan) -> list[str]:
    """The exact Python lines (dp_accounting) for the release's epsilon. dp_accounting's PLD
    accountant composes the K-ary randomized response (REPLACE_ONE) and rounds its privacy loss up
    to a 1e-4 grid, so ``local_epsilon`` is ln(gamma) rounded up by at most 1e-4; neither of its
    accountants takes a randomized-response event sampled without replacement, so the last line
    applies the amplification (Theorem 3.2, = OpenDP's make_population_amplification). Run by
    tests/unit/test_claims_recipes.py."""
    noise = accounting.dp_accounting_noise_parameter(plan.joint_size, plan.gamma)
    return [
        "import math",
        "import dp_accounting",
        "from dp_accounting.pld import PLDAccountant",
        "accountant = PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)",
        f"accountant.compose(dp_accounting.RandomizedResponseDpEvent(noise_parameter={noise!r}, "
        f"num_buckets={plan.joint_size}))",
        "local_epsilon = accountant.get_epsilon(target_delta=0.0)",
        f"epsilon = math.log1p({plan.m} / {plan.n} * math.expm1(local_epsilon))",
    ]


def _opendp_terms(plan: ReleasePlan, local_epsilon: float) -> dict[str, Any]:
    """OpenDP: randomized response over K categories, amplified by sampling m of n."""
    return {
        "privacy_unit": "ChangeOneDistance, d_in = 1",
        "prob": accounting.opendp_prob(plan.joint_size, plan.gamma),
        "categories": plan.joint_size,
        "local_epsilon": local_epsilon,
        "population_size": plan.n,
        "sample_size": plan.m,
        "recipe": opendp_recipe(plan),
        "agreement": "equal to ours up to OpenDP's rounding up (relative 1e-12)",
    }


def _dp_accounting_terms(plan: ReleasePlan) -> dict[str, Any]:
    """dp_accounting: a randomized-response event (the amplification is Theorem 3.2's)."""
    return {
        "noise_parameter": accounting.dp_accounting_noise_parameter(plan.joint_size, plan.gamma),
        "num_buckets": plan.joint_size,
        "source_dataset_size": plan.n,
        "sample_size": plan.m,
        "neighboring_relation": "REPLACE_ONE",
        "recipe": dp_accounting_recipe(plan),
        "agreement": (
            "local_epsilon is ln(gamma) rounded up to dp_accounting's 1e-4 grid; no dp_accounting accountant "
            "composes sampling without replacement of randomized response, so the amplification is Theorem 3.2's"
        ),
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
    per_cell = accounting.predicted_rmse_per_cell(plan.n, plan.m, K, plan.gamma)
    out: dict[str, Any] = {
        "predicted_rmse": rmse,
        "predicted_rmse_per_cell": per_cell,
        "typical_cell_share": share,
        "ok": per_cell <= share,
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


def tables_guarantee(
    n: int, sample_sizes: Sequence[int], gammas: Sequence[float], joint_sizes: Sequence[int]
) -> dict[str, Any]:
    """The guarantee of a release of several tables from disjoint samples (docs/privacy.md,
    "A release of several tables"): epsilon by Eq. (T1) (``disjoint_tables.release_epsilon``, as
    every ledger charges it), sequential composition (Eq. T3) beside it, delta = 0, the same unit
    and neighbouring relation as one table, and each table's parameters."""
    from secure_release.mechanism.privacy import disjoint_tables

    epsilon = disjoint_tables.release_epsilon(n, sample_sizes, gammas)
    return {
        "definition": guarantee_statement(),
        "statement": guarantee_statement(epsilon),
        "statistical": STATISTICAL.replace("Theorem 3.2", "Eq. (T1) of docs/privacy.md"),
        "computational": COMPUTATIONAL,
        "epsilon": epsilon,
        "sequential_epsilon": disjoint_tables.sequential_epsilon(n, sample_sizes, gammas),
        "delta": 0.0,
        "privacy_unit": PRIVACY_UNIT,
        "neighbouring_relation": NEIGHBOURING,
        "mechanism": (
            "T tables from disjoint samples: a uniform ordered tuple of m_1 + ... + m_T of the n records, "
            "split in order into the tables' groups; a record in group t contributes only table t's "
            "attributes, and gamma_t-diagonal PRAM is applied to table t's joint"
        ),
        "theorem": "Eq. (T1), docs/privacy.md (the ratio maximised over the sets of tables a changed record "
                   "pushes up); sequential composition (Eq. T3) is never below it",
        "parameters": {"n": n, "tables": [{"m": m, "gamma": g, "K": k, "keep_probability": PramChannel(g, k).keep}
                                          for m, g, k in zip(sample_sizes, gammas, joint_sizes, strict=True)]},
    }
