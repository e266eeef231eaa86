# tier: unit
"""Issue 23, item 7: many releases on one budget, tightly (the PLD accounting policy).

- dp_accounting's PLD composition of k pure epsilon-DP releases against the closed-form optimal
  composition of Kairouz, Oh and Viswanath (ICML 2015, Theorem 3.3), itself checked against an
  exact enumeration of the 2^k outcomes of k-fold binary randomized response (its worst case);
- the policy's count (largest k within (eps_total, delta)) at its exact boundary;
- the ledger: a release with another epsilon is refused, the (max + 1)-th release is refused, a
  refund frees a slot, entries without a policy keep their digests;
- ``budget show`` prints both views; the table in docs/privacy.md is what dp_accounting gives.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import pytest

from secure_release.curator.commands import ledger_summary
from secure_release.mechanism.errors import BudgetExceededError, PolicyEpsilonError
from secure_release.mechanism.privacy.accounting import (
    PLD_DISCRETIZATION,
    AccountingPolicy,
    kov_optimal_delta,
    kov_optimal_epsilon,
    pld_composed_epsilon,
    pld_max_releases,
    pld_policy,
)
from secure_release.mechanism.privacy.ledger import LedgerEntry, PrivacyLedger

DOCS = Path(__file__).resolve().parents[2] / "docs" / "privacy.md"
DATASET = "cd" * 32


def _enumerated_delta(epsilon: float, k: int, eps_prime: float) -> float:
    """Hockey-stick divergence of k-fold binary randomized response, summed over all 2^k outcomes."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    total = 0.0
    for outcome in itertools.product((0, 1), repeat=k):
        ones = sum(outcome)
        P = p**ones * (1 - p) ** (k - ones)
        Q = (1 - p) ** ones * p ** (k - ones)
        total += max(0.0, P - math.exp(eps_prime) * Q)
    return total


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 0.37])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_kov_closed_form_is_the_enumerated_optimum(epsilon: float, k: int) -> None:
    for i in range(k // 2 + 1):  # the theorem's points eps_i = (k - 2i) eps ...
        eps_i = (k - 2 * i) * epsilon
        delta_i = sum(
            math.comb(k, lo) * (math.exp((k - lo) * epsilon) - math.exp((k - 2 * i + lo) * epsilon))
            for lo in range(i)
        ) / (1 + math.exp(epsilon)) ** k
        assert kov_optimal_delta(epsilon, k, eps_i) == pytest.approx(delta_i, rel=1e-9, abs=1e-15)
    for eps_prime in (0.0, 0.3 * k * epsilon, 0.77 * k * epsilon):  # ... and between them
        assert kov_optimal_delta(epsilon, k, eps_prime) == pytest.approx(
            _enumerated_delta(epsilon, k, eps_prime), rel=1e-9, abs=1e-15
        )


@pytest.mark.parametrize("delta", [1e-9, 1e-5, 1e-2])
@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 0.37])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_pld_matches_the_kov_optimal_composition(k: int, epsilon: float, delta: float) -> None:
    """dp_accounting's PLD never reports below the optimum and at most its discretisation above
    (exactly equal, up to the bisection, when epsilon is on the PLD grid)."""
    exact = kov_optimal_epsilon(epsilon, k, delta)
    pld = pld_composed_epsilon(epsilon, k, delta)
    assert exact - 1e-9 <= pld <= exact + k * PLD_DISCRETIZATION
    if round(epsilon / PLD_DISCRETIZATION) * PLD_DISCRETIZATION == epsilon:
        assert pld == pytest.approx(exact, abs=1e-9)
    assert pld <= k * epsilon  # never worse than basic composition


def test_policy_count_is_the_exact_boundary() -> None:
    policy = pld_policy(3.0, 1e-9, 0.1)
    k = policy.max_releases
    assert k == pld_max_releases(3.0, 1e-9, 0.1) == 32 > 30  # basic composition allows 30
    assert pld_composed_epsilon(0.1, k, 1e-9) <= 3.0 < pld_composed_epsilon(0.1, k + 1, 1e-9)
    assert policy.additive_budget == pytest.approx(3.2)
    assert AccountingPolicy.from_dict(policy.to_dict()) == policy
    with pytest.raises(Exception, match="allows 32"):
        AccountingPolicy.from_dict({**policy.to_dict(), "max_releases": 33})


def test_the_ledger_enforces_the_policy_and_prints_both_views() -> None:
    policy = pld_policy(3.0, 1e-9, 0.1)
    ledger = PrivacyLedger()
    with pytest.raises(PolicyEpsilonError):  # the policy's total must be the budget
        ledger.set_budget(DATASET, "adult", 2.0, 0.0, policy=policy)
    entry = ledger.set_budget(DATASET, "adult", 3.0, 0.0, policy=policy)
    ledger.append(entry)
    assert LedgerEntry.from_json(entry.to_json()) == entry and ledger.policy(DATASET) == policy
    with pytest.raises(PolicyEpsilonError):  # another epsilon, even a smaller one, is refused
        ledger.reserve(DATASET, "adult", "small", 0.05, "f-small", 0.0)
    for i in range(policy.max_releases):
        got = ledger.reserve(DATASET, "adult", f"r{i}", 0.1, f"f{i}", 0.0)
        assert got is not None
        ledger.append(got)
    assert ledger.release_count(DATASET) == 32 and ledger.spent(DATASET) > 3.0  # past basic composition
    with pytest.raises(BudgetExceededError):
        ledger.reserve(DATASET, "adult", "one-more", 0.1, "f-more", 0.0)
    refund = ledger.refund("r0", 0.0)
    assert refund is not None
    ledger.append(refund)
    assert ledger.reserve(DATASET, "adult", "one-more", 0.1, "f-more", 0.0) is not None  # a refund frees a slot
    views = ledger_summary(ledger)["datasets"][0]["accounting"]
    assert views["basic"] == {"releases_allowed": 30, "epsilon_spent": pytest.approx(3.1), "releases_spent": 31}
    assert views["pld"]["releases_allowed"] == 32 and views["pld"]["releases_left"] == 1
    assert views["pld"]["epsilon_spent"] == pytest.approx(pld_composed_epsilon(0.1, 31, 1e-9)) and (
        views["pld"]["epsilon_spent"] < 3.0
    )


def test_a_policy_cannot_be_set_over_releases_of_another_epsilon() -> None:
    ledger = PrivacyLedger()
    ledger.append(ledger.set_budget(DATASET, "adult", 5.0, 0.0))
    entry = ledger.reserve(DATASET, "adult", "r0", 0.5, "f0", 0.0)
    assert entry is not None
    ledger.append(entry)
    with pytest.raises(PolicyEpsilonError):
        ledger.set_budget(DATASET, "adult", 3.0, 0.0, policy=pld_policy(3.0, 1e-9, 0.1))
    refund = ledger.refund("r0", 0.0)
    assert refund is not None
    ledger.append(refund)  # refunded: nothing of another epsilon is spent
    ledger.append(ledger.set_budget(DATASET, "adult", 3.0, 0.0, policy=pld_policy(3.0, 1e-9, 0.1)))


def test_entries_without_a_policy_keep_their_digest_and_add_epsilons() -> None:
    ledger = PrivacyLedger()
    entry = ledger.set_budget(DATASET, "adult", 1.0, 0.0)
    assert "policy" not in entry.body() and "policy" not in entry.to_json()
    ledger.append(entry)
    assert ledger.policy(DATASET) is None and "accounting" not in ledger_summary(ledger)["datasets"][0]


def test_docs_table_is_what_dp_accounting_gives() -> None:
    text = DOCS.read_text()
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) / ([\d.]+) \| ([\d.]+) / ([\d.]+) \| ([\d.]+) / ([\d.]+) \|$", text, re.M)
    assert [int(r[0]) for r in rows] == [10, 50, 100]
    for row in rows:
        k = int(row[0])
        for j, eps in enumerate((0.1, 0.5, 1.0)):
            basic, pld = float(row[1 + 2 * j]), float(row[2 + 2 * j])
            assert basic == pytest.approx(k * eps)
            assert pld == pytest.approx(pld_composed_epsilon(eps, k, 1e-9), abs=5e-4)
    allowed = re.search(
        r"a total budget of \(10, 1e-9\) allows (\d+) releases of epsilon 0.1 \(basic: 100\),\s+"
        r"(\d+) of 0.5 \(basic: 20\) and (\d+) of 1 \(basic: 10\); \(5, 1e-9\) allows (\d+) of 0.1",
        text,
    )
    assert allowed is not None
    assert [int(x) for x in allowed.groups()] == [
        pld_max_releases(10, 1e-9, 0.1), pld_max_releases(10, 1e-9, 0.5), pld_max_releases(10, 1e-9, 1.0),
        pld_max_releases(5, 1e-9, 0.1),
    ]


def test_budget_set_and_show_through_the_curator_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``budget set --per-release-epsilon --delta`` records the policy; ``budget show`` prints both views."""
    import argparse
    import json

    from secure_release.curator.commands import add_budget_parser, budget
    from secure_release.infra.config import ConfigError

    data = tmp_path / "t.csv"
    data.write_text("id,a\n1,x\n")
    parser = argparse.ArgumentParser()
    add_budget_parser(parser.add_subparsers(dest="command"))
    ks = str(tmp_path / "ks")
    common = ["--keystore", ks, "--data", str(data)]
    with pytest.raises(ConfigError):  # both or neither
        budget(parser.parse_args(["budget", "set", *common, "--epsilon", "3", "--delta", "1e-9"]))
    assert budget(parser.parse_args(["budget", "set", *common, "--epsilon", "3", "--per-release-epsilon", "0.1",
                                     "--delta", "1e-9"])) == 0  # fmt: skip
    set_out = json.loads(capsys.readouterr().out)
    assert set_out["policy"]["max_releases"] == 32 and set_out["budget"] == pytest.approx(3.2)
    assert budget(parser.parse_args(["budget", "show", *common])) == 0
    views = json.loads(capsys.readouterr().out)["datasets"][0]["accounting"]
    assert views["basic"]["releases_allowed"] == 30 and views["pld"]["releases_allowed"] == 32
    assert views["pld"]["releases_left"] == 32 and views["pld"]["epsilon_spent"] == 0.0
