"""A curator's privacy ledger: sequential composition of epsilon per dataset (DESIGN 3, Budget).

Releases on the same data compose: their epsilons add. Every release must use a fresh sampling
seed (a reused sample gets no amplification), so the ledger remembers seed fingerprints and
refuses a repeat. The ledger is a pure value; a curator persists :meth:`to_dict`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from secure_release.mechanism.accounting import check_epsilon
from secure_release.mechanism.errors import BudgetExceededError, NonFiniteInputError, SeedReuseError


@dataclass(frozen=True)
class LedgerEntry:
    dataset: str
    release_id: str
    epsilon: float
    seed_fingerprint: str


@dataclass
class PrivacyLedger:
    """Spent epsilon per dataset against one total budget per dataset."""

    budget: float
    entries: list[LedgerEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not math.isfinite(self.budget) or self.budget <= 0:
            raise NonFiniteInputError(
                f"the budget must be a finite number > 0, got {self.budget!r}"
            )

    def spent(self, dataset: str) -> float:
        return math.fsum(e.epsilon for e in self.entries if e.dataset == dataset)

    def remaining(self, dataset: str) -> float:
        return self.budget - self.spent(dataset)

    def check(self, dataset: str, release_id: str, epsilon: float, seed_fingerprint: str) -> None:
        """Raise if this release would be refused (nothing is recorded)."""
        epsilon = check_epsilon(epsilon)
        if any(e.release_id == release_id and e.dataset == dataset for e in self.entries):
            raise SeedReuseError(f"release {release_id!r} is already recorded for {dataset!r}")
        if any(e.seed_fingerprint == seed_fingerprint for e in self.entries):
            raise SeedReuseError(
                f"sampling seed {seed_fingerprint} was already used; "
                "every release needs a fresh seed"
            )
        spent = self.spent(dataset)
        if spent + epsilon > self.budget * (1 + 1e-12):
            raise BudgetExceededError(
                f"dataset {dataset!r}: spent {spent:.6g} + this release {epsilon:.6g} exceeds the "
                f"budget {self.budget:.6g}; at most {max(self.budget - spent, 0):.6g} remains"
            )

    def charge(
        self, dataset: str, release_id: str, epsilon: float, seed_fingerprint: str
    ) -> LedgerEntry:
        """Record a release, or raise (and record nothing) if it is refused."""
        self.check(dataset, release_id, epsilon, seed_fingerprint)
        entry = LedgerEntry(dataset, release_id, float(epsilon), seed_fingerprint)
        self.entries.append(entry)
        return entry

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "entries": [e.__dict__ for e in self.entries]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyLedger:
        return cls(float(data["budget"]), [LedgerEntry(**e) for e in data.get("entries", [])])
