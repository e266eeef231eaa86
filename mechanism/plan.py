"""The public parameters of one release and the plan a curator or the CLI prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from math import prod
from typing import Any

from secure_release.mechanism import accounting
from secure_release.mechanism.pram import PramChannel
from secure_release.mechanism.sampling import check_sample_size
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
        """The plan as a JSON-ready dict (keys of ``secure-release plan --json``)."""
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
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["alphabet_sizes"] = list(self.alphabet_sizes)
        return d


def plan_release(
    n: int, alphabet_sizes: Sequence[int], epsilon: float, m: int | None = None
) -> ReleasePlan:
    """The plan for a release: m defaults to m* (Cor. 3.6) rounded into [1, n]; gamma by Eq. (2)."""
    sizes = tuple(int(k) for k in alphabet_sizes)
    K = check_joint_alphabet(sizes)
    eps = accounting.check_epsilon(epsilon)
    check_sample_size(n, 1)
    if m is None:
        m = accounting.optimal_sample_size_int(n, max(K, 2), eps)
    check_sample_size(n, m)
    return ReleasePlan(n, int(m), sizes, eps, accounting.gamma_from_epsilon(n, m, eps))
