# tier: unit
"""Issue 24, items 1-2: someone who can write the keystore directory, but holds neither the
curator's private key nor the server, cannot rewind the budget. Each of the seven rewrites that
went undetected before (and then let a third release of 0.4 through on a 1.0 budget with 0.8
spent) is refused here, by the head's signature, by validation on load, or by the server's
witness (an in-memory stand-in with the server's rule: it only moves up)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.curator.records.witness import BudgetWitness, LedgerBehindError
from secure_release.mechanism.privacy.ledger import (
    GENESIS,
    EntryKind,
    LedgerEntry,
    LedgerHead,
    LedgerTamperedError,
    NoBudgetError,
    PrivacyLedger,
)
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

D = "adult"


class WitnessStub:
    """The server's witness rule in memory: per (curator, key) counts that only move up."""

    held: ClassVar[dict[tuple[str, bytes], tuple[int, float]]]

    def __init__(self) -> None:
        self.held = {}

    def WitnessLedger(self, request: pb.WitnessRequest, timeout: float | None = None) -> pb.WitnessReply:  # noqa: N802
        key = (request.curator, bytes(request.dataset_key))
        count, total = self.held.get(key, (0, 0.0))
        if request.record:
            count, total = max(count, request.reservations), max(total, request.epsilon_total)
            self.held[key] = (count, total)
        return pb.WitnessReply(reservations=count, epsilon_total=total)


def _rechained(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """What an attacker computes: seq, prev and digest of every entry, recomputed (plain SHA-256)."""
    out: list[LedgerEntry] = []
    for i, e in enumerate(entries):
        draft = replace(e, seq=i, prev=out[-1].digest if out else GENESIS, digest="")
        out.append(replace(draft, digest=draft.computed_digest()))
    return out


def _write(ledger: LedgerFile, entries: list[LedgerEntry], head: bool = True) -> None:
    """Write forged entries and (``head``) an unsigned head matching them, as the attacker can."""
    ledger.path.write_text("".join(e.to_json() + "\n" for e in entries))
    if head:
        ledger.head_path.write_text(LedgerHead(len(entries), entries[-1].digest if entries else GENESIS).to_json())
    else:
        ledger.head_path.unlink(missing_ok=True)


class Curator:
    """One curator's ledger (signed with its certificate key) and its witness at the server."""

    def __init__(self, directory: Path, certs: Path) -> None:
        self.ledger = LedgerFile(directory, HeadSigner.from_certs(certs / "alice", "alice"))
        self.witness = BudgetWitness(WitnessStub(), "alice", self.ledger.signer)  # type: ignore[arg-type]

    def reserve(self, release_id: str, epsilon: float) -> None:
        """Reserve as the runner does (local check, witness check, append, witness record) and commit."""
        self.try_reserve(release_id, epsilon)
        self.ledger.update(lambda led: led.commit(release_id, 2.0))

    def try_reserve(self, release_id: str, epsilon: float) -> None:
        led = self.ledger.read()
        led.check_reserve(D, release_id, epsilon, None)
        self.witness.check(led, D)
        seed = f"seed-{release_id}"
        self.ledger.update(lambda led: led.reserve(D, D, release_id, epsilon, seed, 1.0, table="f" * 64))
        self.witness.check(self.ledger.read(), D, record=True)


@pytest.fixture
def alice(tmp_path: Path, certs: Path) -> Curator:
    """Budget 1.0, two committed releases of 0.4: 0.8 spent; a third of 0.4 must be refused."""
    cur = Curator(tmp_path / "ks", certs)
    cur.ledger.set_budget(D, D, 1.0)
    cur.reserve("r1", 0.4)
    cur.reserve("r2", 0.4)
    with pytest.raises(Exception, match="exceeds the budget"):
        cur.try_reserve("r3", 0.4)
    return cur


def _entries(cur: Curator) -> list[LedgerEntry]:
    return list(cur.ledger.read().entries)


def test_1_a_negative_stored_epsilon_is_refused_naming_the_entry(alice: Curator) -> None:
    entries = _entries(alice)
    entries[1] = replace(entries[1], epsilon=-5.0)  # the reserve of r1; its commit says 0.4
    entries[2] = replace(entries[2], epsilon=-5.0)
    _write(alice.ledger, _rechained(entries))
    with pytest.raises(LedgerTamperedError, match="not signed"):
        alice.try_reserve("r3", 0.4)
    alice.ledger.signer = None  # even without the signature layer, validation alone refuses it
    with pytest.raises(LedgerTamperedError, match=r"entry 1 .*epsilon must be >= 0"):
        alice.ledger.read()


def test_2_a_forged_budget_entry_is_refused_by_the_signature(alice: Curator) -> None:
    entries = _entries(alice)
    forged = replace(entries[0], epsilon=1e9)
    _write(alice.ledger, _rechained([*entries, replace(forged, seq=len(entries))]))
    with pytest.raises(LedgerTamperedError, match="not signed by this curator's key"):
        alice.try_reserve("r3", 0.4)


def test_3_dropped_entries_with_the_head_rewritten_are_refused(alice: Curator) -> None:
    _write(alice.ledger, _entries(alice)[:3])  # r2's reserve and commit gone, head recomputed
    with pytest.raises(LedgerTamperedError, match="not signed"):
        alice.try_reserve("r3", 0.4)


def test_4_dropped_entries_with_the_head_deleted_are_refused(alice: Curator) -> None:
    _write(alice.ledger, _entries(alice)[:3], head=False)
    with pytest.raises(LedgerTamperedError, match=r"ledger\.head is missing"):
        alice.try_reserve("r3", 0.4)


def test_5_an_older_copy_of_both_files_is_behind_the_witness(tmp_path: Path, certs: Path) -> None:
    cur = Curator(tmp_path / "ks2", certs)
    cur.ledger.set_budget(D, D, 1.0)
    cur.reserve("r1", 0.4)
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "ks2", old)  # the attacker keeps a copy after one release
    cur.reserve("r2", 0.4)
    for name in ("ledger.jsonl", "ledger.head"):
        shutil.copy(old / name, tmp_path / "ks2" / name)  # validly signed, but rolled back
    assert cur.ledger.read().spent(D) == pytest.approx(0.4)  # the signature cannot tell
    with pytest.raises(LedgerBehindError, match="witness has seen 2"):
        cur.try_reserve("r3", 0.4)


def test_6_a_fresh_replacement_ledger_is_refused(alice: Curator, tmp_path: Path) -> None:
    fresh = LedgerFile(tmp_path / "attacker")  # the attacker's own, without the curator's key
    fresh.set_budget(D, D, 1.0)
    for name in ("ledger.jsonl", "ledger.head"):
        shutil.copy(tmp_path / "attacker" / name, alice.ledger.directory / name)
    with pytest.raises(LedgerTamperedError, match="not signed"):
        alice.try_reserve("r3", 0.4)


def test_6b_both_files_deleted_refuses_until_a_budget_is_set_and_the_witness_carries_spending_over(
    alice: Curator,
) -> None:
    alice.ledger.path.unlink()
    with pytest.raises(NoBudgetError, match="deleted"):
        alice.try_reserve("r3", 0.4)
    alice.ledger.head_path.unlink()
    with pytest.raises(NoBudgetError):
        alice.try_reserve("r3", 0.4)
    from secure_release.curator.records.witness import carry_over

    carried = carry_over(alice.ledger, alice.witness, D, D)  # what `budget set --server` does first
    alice.ledger.set_budget(D, D, 1.0)
    assert carried is not None and carried.kind is EntryKind.CARRY and carried.count == 2
    assert alice.ledger.read().spent(D) == pytest.approx(0.8)
    with pytest.raises(Exception, match="exceeds the budget"):
        alice.try_reserve("r3", 0.4)
    alice.try_reserve("r3", 0.2)  # what truly remains can still be spent


def test_7_a_torn_tail_with_an_older_head_is_behind_the_witness(alice: Curator) -> None:
    entries = _entries(alice)
    old_head = alice.ledger.signer.sign(PrivacyLedger(entries[:3]).head())  # type: ignore[union-attr]
    text = "".join(e.to_json() + "\n" for e in entries[:4]) + entries[4].to_json()[:20]
    alice.ledger.path.write_text(text)  # r2's commit torn, its reserve past the (older) head
    alice.ledger.head_path.write_text(old_head.to_json())
    with pytest.raises(LedgerBehindError):
        alice.try_reserve("r3", 0.4)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_non_finite_stored_epsilon_is_the_tampering_error(tmp_path: Path, value: str) -> None:
    ledger = LedgerFile(tmp_path)
    ledger.set_budget(D, D, 1.0)
    line = json.loads(ledger.path.read_text())
    text = json.dumps(line).replace('"epsilon": 1.0', f'"epsilon": {value}')
    ledger.path.write_text(text + "\n")
    with pytest.raises(LedgerTamperedError, match="entry 0"):
        ledger.read()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"kind": "grant"}, "entry 0"),
        ({"retention": "forever"}, "unknown keys"),
        ({"policy": "pld"}, "policy must be a .pld. object"),
        ({"seq": 1.5}, "seq"),
        ({"count": -1}, "count"),
    ],
)
def test_unknown_kinds_keys_and_malformed_numbers_are_refused(tmp_path: Path, change: dict[str, object],
                                                              words: str) -> None:  # fmt: skip
    ledger = LedgerFile(tmp_path)
    ledger.set_budget(D, D, 1.0)
    data = {**json.loads(ledger.path.read_text()), **change}
    ledger.path.write_text(json.dumps(data) + "\n")
    with pytest.raises(LedgerTamperedError, match=words):
        ledger.read()


def test_a_commit_without_its_reservation_is_refused(tmp_path: Path) -> None:
    ledger = LedgerFile(tmp_path)
    ledger.set_budget(D, D, 1.0)
    entries = list(ledger.read().entries)
    commit = LedgerEntry(1, EntryKind.COMMIT, D, "", "ghost", 0.4, "s", 1.0, entries[0].digest)
    _write(ledger, _rechained([*entries, commit]))
    with pytest.raises(LedgerTamperedError, match=r"entry 1 \(commit of 'ghost'\)"):
        ledger.read()


def test_entries_written_before_the_extensions_keep_their_digest() -> None:
    """Optional keys are left out at their default, so older ledgers still verify."""
    e = PrivacyLedger().set_budget(D, D, 1.0, 0.0)
    assert "table" not in e.body() and "count" not in e.body()
    assert "table" in PrivacyLedger().set_budget(D, D, 1.0, 0.0, table="f" * 64).body()


def test_a_reservation_by_a_concurrent_release_between_the_read_and_the_answer_is_not_a_rollback(
    alice: Curator,
) -> None:
    """Two releases of one data set share a keystore: r4 reads the ledger, r5 (another process)
    reserves (ledger, then witness), then r4 asks the witness, which now counts r5. The ledger
    read again after the answer holds r5: no LedgerBehindError (the fault campaign's seed 20
    found this race). Without the re-read, the same situation is refused; a real rollback is
    refused with it too."""
    alice.ledger.set_budget(D, D, 3.0)
    stale = alice.ledger.read()  # r4's read, before r5 reserves
    alice.try_reserve("r5", 0.4)  # the concurrent release: ledger entry, then the witness moved up
    with pytest.raises(LedgerBehindError):
        alice.witness.check(stale, D)  # what a single read gave: a race taken for a rollback
    alice.witness.check(stale, D, reread=alice.ledger.read)  # the read after the answer counts r5
    alice.witness.check(stale, D, record=True, reread=alice.ledger.read)
    with pytest.raises(LedgerBehindError):  # a ledger really behind stays refused when read again
        alice.witness.check(stale, D, reread=lambda: stale)
