"""Privacy ledger: sequential composition, budget and seed-reuse refusal."""

from __future__ import annotations

import json
import math

import pytest

from secure_release.mechanism.accounting import epsilon_from_gamma
from secure_release.mechanism.errors import (
    BudgetExceededError,
    InvalidEpsilonError,
    NonFiniteInputError,
    SeedReuseError,
)
from secure_release.mechanism.ledger import LedgerEntry, PrivacyLedger


def test_budget_exactly_reached_passes_just_above_fails() -> None:
    led = PrivacyLedger(1.0)
    led.charge("adult", "r1", 0.5, "f1")
    led.charge("adult", "r2", 0.3, "f2")
    with pytest.raises(BudgetExceededError):
        led.charge("adult", "r3", 0.2 + 1e-9, "f3")
    assert len(led.entries) == 2
    led.charge("adult", "r3", 0.2, "f3")  # exactly at the budget (0.5 + 0.3 + 0.2 = 1)
    assert math.isclose(led.spent("adult"), 1.0)
    assert led.remaining("adult") == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(BudgetExceededError):
        led.charge("adult", "r4", 1e-6, "f4")
    # another dataset has its own budget
    led.charge("census", "r1", 1.0, "f5")
    with pytest.raises(BudgetExceededError):
        led.charge("census", "r9", 1.0 + 1e-9, "f9")


def test_opendp_style_boundary_ln9() -> None:
    # plain PRAM at gamma = 9 costs exactly ln 9:
    # a budget of ln 9 admits it, one of ln 8.99999 does not
    eps = epsilon_from_gamma(100, 100, 9.0)
    PrivacyLedger(math.log(9)).charge("d", "r", eps, "s")
    with pytest.raises(BudgetExceededError):
        PrivacyLedger(math.log(8.99999)).charge("d", "r", eps, "s")


def test_seed_reuse_refused_and_nothing_recorded() -> None:
    led = PrivacyLedger(10.0)
    led.charge("d", "r1", 0.1, "seedA")
    before = led.to_dict()
    with pytest.raises(SeedReuseError):
        led.charge("d", "r2", 0.1, "seedA")  # same seed, new release
    with pytest.raises(SeedReuseError):
        led.charge("other", "r2", 0.1, "seedA")  # same seed on another dataset
    with pytest.raises(SeedReuseError):
        led.charge("d", "r1", 0.1, "seedB")  # same release id twice
    with pytest.raises(InvalidEpsilonError):
        led.charge("d", "r5", 0.0, "seedC")
    with pytest.raises(NonFiniteInputError):
        led.charge("d", "r5", math.nan, "seedC")
    assert led.to_dict() == before
    led.check("d", "r2", 0.1, "seedB")  # check records nothing
    assert led.to_dict() == before
    entry = led.charge("d", "r2", 0.1, "seedB")
    assert entry == LedgerEntry("d", "r2", 0.1, "seedB")


def test_round_trip() -> None:
    led = PrivacyLedger(2.5)
    led.charge("a", "r1", 0.5, "s1")
    led.charge("b", "r1", 1.25, "s2")
    data = json.loads(json.dumps(led.to_dict()))
    back = PrivacyLedger.from_dict(data)
    assert back == led
    assert back.spent("a") == 0.5 and back.remaining("b") == 1.25
    with pytest.raises(SeedReuseError):
        back.charge("a", "r2", 0.1, "s2")
    assert PrivacyLedger.from_dict({"budget": 1.0}).entries == []


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_budget(bad: float) -> None:
    with pytest.raises(NonFiniteInputError):
        PrivacyLedger(bad)
