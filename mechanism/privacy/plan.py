"""The public parameters of one release and the plan a curator or the CLI prints."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from math import prod
from typing import Any

from secure_release.mechanism import printing
from secure_release.mechanism.errors import EmptyDomainError
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.primitives.sampling import check_sample_size
from secure_release.mechanism.privacy import accounting
from secure_release.mechanism.schema import check_joint_alphabet


@dataclass(frozen=True)
class ReleasePlan:
    """n, m, alphabets, epsilon and the derived gamma; everything the server may know."""

    n: int
    m: int
    alphabet_sizes: tuple[int, ...]
    epsilon: float
    gamma: float

    @property
    def joint_size(self) -> int:
        return prod(self.alphabet_sizes)

    @property
    def channel(self) -> PramChannel:
        return PramChannel(self.gamma, self.joint_size)

    def report(self, sum_sq: float | None = None) -> dict[str, Any]:
        """The plan's figures as a JSON-ready dict (with the guarantee:
        :func:`mechanism.privacy.guarantee.plan_report`, the keys of ``secure-release plan --json``)."""
        K = self.joint_size
        return {
            "n": self.n,
            "m": self.m,
            "K": K,
            "alphabet_sizes": list(self.alphabet_sizes),
            "epsilon": self.epsilon,
            "gamma": self.gamma,
            "m_star": accounting.optimal_sample_size(self.n, K, self.epsilon),
            "m_min_error": accounting.error_minimizing_sample_size(self.n, K, self.epsilon, sum_sq),
            "predicted_rmse": accounting.predicted_rmse(self.n, self.m, K, self.gamma, sum_sq),
            "predicted_rmse_per_cell": accounting.predicted_rmse_per_cell(self.n, self.m, K, self.gamma, sum_sq),
            "bound": accounting.error_bound(self.m, K, self.gamma),
            "bound_tight": accounting.error_bound_tight(self.m, K, self.gamma),
            "keep_probability": self.channel.keep,
            "krr_keep_probability": accounting.krr_keep_probability(K, self.gamma),
            "dp_accounting_noise_parameter": accounting.dp_accounting_noise_parameter(
                K, self.gamma
            ),
            "pram_epsilon_without_sampling": accounting.epsilon_from_gamma(
                self.n, self.n, self.gamma
            ),
            "warning": self.utility_warning(sum_sq),
        }

    def utility_warning(self, sum_sq: float | None = None) -> str | None:
        """A warning when the predicted per-cell RMSE (l2 RMSE / sqrt K, DESIGN 3's exact MSE
        spread over the K cells) exceeds the typical cell share 1/K: the estimate of a typical
        cell is then mostly noise. Names an m (same epsilon) or an epsilon that would not."""
        K = self.joint_size
        root_k = math.sqrt(K)
        rmse = accounting.predicted_rmse(self.n, self.m, K, self.gamma, sum_sq)
        typical = 1.0 / K
        if rmse / root_k <= typical:
            return None
        head = (
            f"predicted per-cell RMSE {rmse / root_k:.3g} (l2 RMSE {rmse:.3g} / sqrt K) exceeds "
            f"the typical cell share 1/K = {typical:.3g}: a typical cell's estimate is mostly "
            "noise. Read the estimate column (the headline, each table's projection of its own raw estimate: never "
            "further from that table's true shares than its raw column, the A^-1 estimate, which can be negative "
            "here) and its intervals, not single raw cells."
        )
        m_best, best = accounting.best_rmse_at_epsilon(self.n, K, self.epsilon, sum_sq)
        if best / root_k <= typical:
            return (
                f"{head} At epsilon = {self.epsilon:g}, m = {m_best} would not "
                f"(per-cell RMSE {best / root_k:.3g})."
            )
        eps = accounting.smallest_epsilon_for_rmse(self.n, K, root_k * typical, sum_sq)
        tail = (
            f" No m in [1, {self.n}] avoids this at epsilon = {self.epsilon:g} (best per-cell "
            f"RMSE {best / root_k:.3g} at m = {m_best});"
        )
        if eps is None:
            return head + tail + " nor does any epsilon <= 50: use fewer cells or more records."
        m_eps, rmse_eps = accounting.best_rmse_at_epsilon(self.n, K, eps, sum_sq)
        return (
            head
            + tail
            + f" epsilon >= {eps:.3g} would not (m = {m_eps}: per-cell {rmse_eps / root_k:.3g})."
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["alphabet_sizes"] = list(self.alphabet_sizes)
        return d

    # ------------------------------------------------------------------- reading the plan
    def rows(self) -> list[tuple[str, str, str]]:
        """The plan as (name, value rounded for reading, meaning) rows: the public parameters,
        m*, and the predicted error against the typical cell share (DESIGN 3's exact MSE)."""
        K = self.joint_size
        rmse = accounting.predicted_rmse(self.n, self.m, K, self.gamma)
        sizes = " x ".join(str(k) for k in self.alphabet_sizes)
        return [
            ("n", f"{self.n}", "records all curators hold (after alignment); public"),
            ("m", f"{self.m}", "records sampled, the same m at every curator"),
            ("K", f"{K}", f"joint cells: the product of the curators' alphabet sizes ({sizes})"),
            ("epsilon", f"{self.epsilon:g}", "privacy level"),
            ("gamma", f"{self.gamma:.4g}", "PRAM's diagonal weight (Eq. 2)"),
            ("keep a", f"{self.channel.keep:.4g}", "a sampled record keeps its cell w.p. a, else a uniform one"),
            ("m*", f"{accounting.optimal_sample_size(self.n, K, self.epsilon):.4g}", "the m of least error (Cor. 3.6)"),
            ("RMSE", f"{rmse:.4g}", "predicted l2 RMSE of the raw estimate, exact, worst case over the data"),
            ("RMSE/cell", f"{rmse / math.sqrt(K):.4g}", f"l2 / sqrt K; the typical cell share 1/K = {1 / K:.4g}"),
        ]

    def block(self) -> printing.Block:
        """The plan laid out for reading (:meth:`rows` as a table, the utility warning under it)."""
        warning = self.utility_warning()
        return printing.Block("Release plan", header=("parameter", "value", "meaning"), rows=self.rows(), align="lrl",
                              notes=(f"WARNING: {warning}",) if warning else ())  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        sizes = " x ".join(str(k) for k in self.alphabet_sizes)
        return (f"<ReleasePlan n = {self.n}, m = {self.m}, K = {self.joint_size} ({sizes}), "
                f"epsilon = {self.epsilon:g}, gamma = {self.gamma:.4g}>")  # fmt: skip

    def _repr_html_(self) -> str:
        """The same table as an HTML fragment (every string escaped)."""
        return self.block().html()


def plan_release(
    n: int, alphabet_sizes: Sequence[int], epsilon: float, m: int | None = None
) -> ReleasePlan:
    """The plan for a release: m defaults to m* (Cor. 3.6) rounded into [1, n]; gamma by Eq. (2)."""
    sizes = tuple(int(k) for k in alphabet_sizes)
    K = check_joint_alphabet(sizes)
    if K < 2:
        raise EmptyDomainError(
            f"alphabets {list(sizes)} give a joint alphabet of K = {K} cell: a single cell's "
            "share is 1 by definition and there is nothing to release; need K >= 2"
        )
    eps = accounting.check_epsilon(epsilon)
    check_sample_size(n, 1)
    if m is None:
        m = accounting.optimal_sample_size_int(n, K, eps)
    check_sample_size(n, m)
    return ReleasePlan(n, int(m), sizes, eps, accounting.gamma_from_epsilon(n, m, eps))
