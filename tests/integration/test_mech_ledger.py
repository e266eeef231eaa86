"""The privacy ledger as a pure policy: budgets set only by budget entries, two-phase
reservations (reserve -> commit | refund), seed reuse refused, bad charges refused, and a hash
chain that detects edits and truncation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from secure_release.mechanism.errors import BudgetExceededError, NonFiniteInputError, SeedReuseError
from secure_release.mechanism.privacy.ledger import (
    EntryKind,
    LedgerEntry,
    LedgerStateError,
    LedgerTamperedError,
    NoBudgetError,
    PrivacyLedger,
    verify_chain,
)

D = "d" * 64


def _ledger(budget: float = 1.0) -> PrivacyLedger:
    led = PrivacyLedger()
    led.append(led.set_budget(D, "adult", budget, 0.0))
    return led


def _add(led: PrivacyLedger, entry: LedgerEntry | None) -> None:
    assert entry is not None
    led.append(entry)


def test_no_budget_no_release() -> None:
    with pytest.raises(NoBudgetError, match="budget set"):
        PrivacyLedger().check_reserve(D, "r1", 0.1, "s1")


def test_reserve_commit_refund_account_for_every_unit() -> None:
    led = _ledger(1.0)
    _add(led, led.reserve(D, "adult", "r1", 0.4, "s1", 1.0))
    _add(led, led.reserve(D, "adult", "r2", 0.4, "s2", 2.0))
    assert led.spent(D) == pytest.approx(0.8)  # reservations count at once
    with pytest.raises(BudgetExceededError, match=r"at most 0\.2 remains"):
        led.check_reserve(D, "r3", 0.3, "s3")
    _add(led, led.commit("r1", 3.0))
    _add(led, led.refund("r2", 4.0))
    assert led.spent(D) == pytest.approx(0.4) and led.remaining(D) == pytest.approx(0.6)
    assert led.commit("r1", 5.0) is None and led.refund("r2", 5.0) is None  # idempotent
    with pytest.raises(LedgerStateError):
        led.refund("r1", 6.0)  # committed budget never comes back
    with pytest.raises(LedgerStateError):
        led.commit("r2", 6.0)
    with pytest.raises(LedgerStateError, match="fresh id"):
        led.check_reserve(D, "r2", 0.4, "s2")
    assert [e.kind for e in led.entries] == [EntryKind.BUDGET, *[EntryKind.RESERVE] * 2, EntryKind.COMMIT,
                                             EntryKind.REFUND]  # fmt: skip
    assert {r.release_id: r.state for r in led.releases().values()} == {"r1": EntryKind.COMMIT, "r2": EntryKind.REFUND}


def test_a_resumed_reservation_is_not_charged_twice() -> None:
    led = _ledger(1.0)
    _add(led, led.reserve(D, "adult", "r1", 0.4, "s1", 1.0))
    assert led.reserve(D, "adult", "r1", 0.4, "s1", 2.0) is None
    assert led.check_reserve(D, "r1", 0.4, None) is False  # seed not known yet: still the same release
    with pytest.raises(SeedReuseError):
        led.reserve(D, "adult", "r1", 0.5, "s1", 2.0)  # the same id with another epsilon


def test_seed_reuse_refused_and_nothing_recorded() -> None:
    led = _ledger(10.0)
    _add(led, led.reserve(D, "adult", "r1", 0.5, "seed-a", 1.0))
    with pytest.raises(SeedReuseError, match="fresh seed"):
        led.reserve(D, "adult", "r2", 0.5, "seed-a", 2.0)
    assert len(led.entries) == 2


@pytest.mark.parametrize("bad", [0.0, -0.5, math.nan, math.inf, -math.inf, True])
def test_bad_charges_and_budgets_are_refused(bad: float) -> None:
    led = _ledger()
    with pytest.raises(NonFiniteInputError):
        led.reserve(D, "adult", "r1", bad, "s1", 1.0)
    with pytest.raises(NonFiniteInputError):
        led.set_budget(D, "adult", bad, 1.0)


def test_budget_is_exact_at_the_boundary() -> None:
    eps = math.log(9)
    led = _ledger(eps)
    assert led.check_reserve(D, "r", eps, "s")
    with pytest.raises(BudgetExceededError):
        _ledger(math.log(8.99999)).check_reserve(D, "r", eps, "s")


def test_lines_round_trip_and_an_edit_or_truncation_is_detected() -> None:
    led = _ledger(2.0)
    for i in range(3):
        _add(led, led.reserve(D, "adult", f"r{i}", 0.5, f"s{i}", float(i)))
    lines = [e.to_json() for e in led.entries]
    assert PrivacyLedger.from_lines(lines, led.head()).entries == led.entries
    edited = [*lines[:2], lines[2].replace('"epsilon": 0.5', '"epsilon": 0.05'), *lines[3:]]
    with pytest.raises(LedgerTamperedError, match="entry 2 does not verify"):
        PrivacyLedger.from_lines(edited, led.head())
    with pytest.raises(LedgerTamperedError, match="truncated"):
        PrivacyLedger.from_lines(lines[:-1], led.head())
    with pytest.raises(LedgerTamperedError):
        PrivacyLedger.from_lines([lines[0], lines[2], lines[1], lines[3]], led.head())  # reordered
    # one entry past the head: a crash between appending and moving the head, accepted
    verify_chain(led.entries, replace(led.head(), count=3, digest=led.entries[2].digest))
    with pytest.raises(LedgerTamperedError):
        led.append(replace(led.entries[-1], seq=4))
