"""The agreement without a network: mechanism.protocol.in_memory.leader_agree against run_release's
alignment and plan, the follower's check of the leader's spec, the leader's tag collection, and
the prepare step against run_release's ciphertexts."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from secure_release.curator.config import CuratorConfig
from secure_release.curator.errors import AgreementFixedError, AlphabetSizeMismatchError
from secure_release.curator.leader import LeaderState
from secure_release.curator.records.keystore import Keystore
from secure_release.curator.release.agreement import leader_state
from secure_release.curator.release.agreement_checks import check_agreement, spec_differences
from secure_release.curator.release.aligning import OwnData
from secure_release.curator.release.budget import check_ledger, reserve
from secure_release.curator.release.preparing import prepare
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import AgreementError
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, align
from secure_release.mechanism.errors import (
    BudgetExceededError,
    InvalidSampleSizeError,
    SeedReuseError,
    ShapeMismatchError,
)
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.ledger import NoBudgetError
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode, VariantAgreement
from secure_release.mechanism.protocol.in_memory import (
    Agreement,
    CuratorTable,
    agree_alignment,
    curator_tags,
    leader_agree,
    run_release,
)
from secure_release.mechanism.schema import Attribute, CuratorSchema

ALICE = CuratorSchema("alice", (Attribute("edu", ("a", "b", "c")), Attribute("mar", ("m", "s"))))
BOB = CuratorSchema("bob", (Attribute("sex", ("f", "m")), Attribute("sal", ("lo", "hi"))))
AKEY = AlignmentKey(bytes(range(32)))
SEED = Seed(bytes([3]) * 32)
PAD_KEYS = (PadKey(bytes([1]) * 32), PadKey(bytes([2]) * 32))
LOG = EventLog("curator", "test")


def _tables() -> tuple[CuratorTable, CuratorTable]:
    rng = np.random.default_rng(5)
    ids = np.array([f"id{i}" for i in range(400)])
    alice = CuratorTable(
        ALICE, ids[:370], {"edu": rng.choice(["a", "b", "c"], 370), "mar": rng.choice(["m", "s"], 370)}
    )
    bob_ids = ids[25:][::-1].copy()  # another order and other missing ids
    bob = CuratorTable(BOB, bob_ids, {"sex": rng.choice(["f", "m"], 375), "sal": rng.choice(["lo", "hi"], 375)})
    return alice, bob


def _agree(m: int | None, cipher: CipherMode = CipherMode.CHACHA20):  # type: ignore[no-untyped-def]
    alice, bob = _tables()
    tags = {"alice": curator_tags(alice, AKEY), "bob": curator_tags(bob, AKEY)}
    sizes = {"alice": 6, "bob": 4}
    return leader_agree("r1", ("alice", "bob"), tags, sizes, 1.0, m, cipher, ("res",), SEED), tags


def _variant(agreement: Agreement) -> VariantAgreement:
    """A seed-sampled, keyed-hash agreement as the curator handles it."""
    return VariantAgreement(agreement, SamplingMode.SEED, AlignmentMode.KEYED_HASH)


def _config(name: str, tmp_path: Path, **changes: object) -> CuratorConfig:
    config = CuratorConfig(
        name=name, release_id="r1", epsilon=1.0, m=None, cipher=CipherMode.CHACHA20,
        curators=("alice", "bob"), leader=name == "alice",
        leader_address=None if name == "alice" else "127.0.0.1:1", expected_sizes=None,
        notify="res", grants=(), data=tmp_path / f"{name}.csv",
        schema=tmp_path / f"{name}.json", dataset="d", keystore=tmp_path / f"ks-{name}",
        server="127.0.0.1:1", certs=None, listen_host="127.0.0.1", listen_port=0, port_file=None,
        insecure=True, timeout=5.0, exit_after_keys=True, alignment_key=AKEY,
    )  # fmt: skip
    return replace(config, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("m", [None, 90])
def test_leader_agree_matches_run_release(m: int | None) -> None:
    (spec, seed, common), tags = _agree(m)
    alice, bob = _tables()
    result = run_release([alice, bob], 1.0, m=m, release_id="r1", seed=SEED, alignment_key=AKEY)
    assert spec.plan == result.plan and spec.n == 345
    assert spec.curators == ("alice", "bob") and spec.researchers == ("res",) and seed is SEED
    assert common.dtype == TAG_DTYPE and common.flags.c_contiguous
    expected = agree_alignment([tags["alice"], tags["bob"]])
    for name, want in zip(("alice", "bob"), expected, strict=True):
        assert np.array_equal(align(tags[name], common).row_order, want.row_order)


def test_leader_agree_refusals() -> None:
    alice, bob = _tables()
    tags = {"alice": curator_tags(alice, AKEY)}
    with pytest.raises(ShapeMismatchError, match=r"missing \['bob'\]"):
        leader_agree("r1", ("alice", "bob"), tags, {"alice": 6, "bob": 4}, 1.0, None, CipherMode.OTP)
    tags["bob"] = curator_tags(bob, AlignmentKey(bytes(32)))  # another key: no id in common
    with pytest.raises(InvalidSampleSizeError):
        leader_agree("r1", ("alice", "bob"), tags, {"alice": 6, "bob": 4}, 1.0, None, CipherMode.OTP)
    fresh = leader_agree("r1", ("alice", "bob"), {"alice": tags["alice"], "bob": tags["alice"]},
                         {"alice": 6, "bob": 4}, 1.0, None, CipherMode.OTP)  # fmt: skip
    assert fresh.seed.reveal() != SEED.reveal()  # no injected seed: a fresh one


def test_follower_accepts_the_leaders_spec_and_keeps_its_own_grants(tmp_path: Path) -> None:
    agreement, _ = _agree(None)
    bob = _config("bob", tmp_path, grants=("other",))
    assert spec_differences(bob, 4, agreement.spec, int(agreement.common.size)) == []
    checked = check_agreement(bob, 4, _variant(agreement)).base
    assert checked.spec.researchers == ("res", "other") and checked.spec.plan == agreement.spec.plan


@pytest.mark.parametrize(
    ("changes", "own_size", "count", "expected"),
    [
        ({"epsilon": 0.5}, 4, None, "epsilon (1.0 != 0.5)"),
        ({"m": 50}, 4, None, "m ("),
        ({"cipher": CipherMode.OTP}, 4, None, "cipher ('chacha20' != 'otp')"),
        ({"release_id": "r2"}, 4, None, "release_id ('r1' != 'r2')"),
        ({"curators": ("bob", "alice")}, 4, None, "curators"),
        ({}, 8, None, "alphabet_sizes ([6, 4] != [6, 8])"),
        ({}, 4, 344, "n (345 != 344)"),
    ],
)
def test_follower_names_each_difference(
    tmp_path: Path, changes: dict[str, object], own_size: int, count: int | None, expected: str
) -> None:
    agreement, _ = _agree(None)
    bob = _config("bob", tmp_path, **changes)
    problems = spec_differences(bob, own_size, agreement.spec, count or int(agreement.common.size))
    assert any(expected in p for p in problems), problems
    if count is None:
        with pytest.raises(AgreementError, match="differs from ours"):
            check_agreement(bob, own_size, _variant(agreement))


def test_follower_reports_an_impossible_plan(tmp_path: Path) -> None:
    agreement, _ = _agree(90)
    problems = spec_differences(_config("bob", tmp_path), 4, agreement.spec, 10)  # m 90 > n 10
    assert problems and "InvalidSampleSizeError" in problems[0]


def _state(expected: tuple[int, ...] | None = None) -> LeaderState:
    return LeaderState("r1", ("alice", "bob"), expected, 1.0, None, CipherMode.CHACHA20, ("res",), SEED)


def test_leader_state_collects_and_agrees_once() -> None:
    alice, bob = _tables()
    state = _state()
    state.add_tags("alice", curator_tags(alice, AKEY), 6)
    assert not state.wait_all_tags(0.01)
    state.add_tags("bob", curator_tags(bob, AKEY), 4)
    agreement = state.collect(1.0)
    assert agreement.base.spec.plan.alphabet_sizes == (6, 4) and agreement.base.spec.n == 345
    assert state.wait_agreement(0.0) is None  # fixed, but served only once the leader registered it
    state.publish()
    assert state.wait_agreement(0.0) is agreement
    state.add_tags("bob", curator_tags(bob, AKEY), 4)  # an identical resubmission is fine
    with pytest.raises(AgreementFixedError):
        state.add_tags("bob", curator_tags(alice, AKEY), 4)


def test_leader_state_times_out_and_tells_the_followers() -> None:
    alice, _ = _tables()
    state = _state()
    state.add_tags("alice", curator_tags(alice, AKEY), 6)
    with pytest.raises(AgreementError, match=r"timed out after 0.05 s waiting for the tags of \['bob'\]"):
        state.collect(0.05)
    with pytest.raises(AgreementError, match="timed out"):
        state.wait_agreement(0.0)


def test_a_leader_waiting_for_tags_stops_within_a_second_of_sigterm_and_tells_the_followers() -> None:
    """SIGTERM (the run's stop event) ends the leader's wait for a follower's tags within a step,
    and the followers are told; before, one wait of the whole --timeout ignored it."""
    import time

    from secure_release.curator.errors import StoppedError
    from secure_release.curator.release.agreement import collect_tags
    from secure_release.curator.waits import Deadline

    alice, bob = _tables()
    state = _state()
    state.add_tags("alice", curator_tags(alice, AKEY), 6)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(StoppedError, match="SIGTERM"):
        collect_tags(state, Deadline(60.0, stop), step_s=0.2)
    assert time.monotonic() - started < 2.0
    with pytest.raises(AgreementError, match="stopped"):
        state.wait_agreement(0.0)
    late = _state()  # tags that arrive are collected as before, and a deadline is named in full
    late.add_tags("alice", curator_tags(alice, AKEY), 6)
    with pytest.raises(AgreementError, match=r"timed out after 0.5 s waiting for the tags of \['bob'\]"):
        collect_tags(late, Deadline(0.5, threading.Event()), step_s=0.2)
    fine = _state()
    fine.add_tags("alice", curator_tags(alice, AKEY), 6)
    threading.Timer(0.3, lambda: fine.add_tags("bob", curator_tags(bob, AKEY), 4)).start()
    assert collect_tags(fine, Deadline(30.0, threading.Event()), step_s=0.2).base.spec.n == 345


def test_leader_state_size_cross_check_fails_at_once() -> None:
    alice, bob = _tables()
    state = _state((6, 5))
    state.add_tags("alice", curator_tags(alice, AKEY), 6)
    waiter_result: list[bool] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(state.wait_all_tags(10.0)))
    waiter.start()
    with pytest.raises(AlphabetSizeMismatchError, match="'bob' has alphabet size 4, but --alphabet-sizes"):
        state.add_tags("bob", curator_tags(bob, AKEY), 4)
    waiter.join(2.0)
    assert waiter_result == [False]  # woken at once, not after its 10 s
    with pytest.raises(AlphabetSizeMismatchError, match="sent no alphabet size"):
        _state().add_tags("bob", curator_tags(bob, AKEY), 0)
    filled = _state((6, 4))
    filled.add_tags("bob", curator_tags(bob, AKEY), 0)  # --alphabet-sizes fills a missing size in
    assert filled.sizes["bob"] == 4


def test_leader_state_refuses_its_own_wrong_size(tmp_path: Path) -> None:
    with pytest.raises(AlphabetSizeMismatchError, match="gives alice size 7, its schema has 6"):
        leader_state(_config("alice", tmp_path, expected_sizes=(7, 4)), 6)
    assert leader_state(_config("alice", tmp_path, expected_sizes=(6, 4)), 6).expected_sizes == (6, 4)


def test_prepare_matches_run_release_and_persists_what_a_resume_needs(tmp_path: Path) -> None:
    agreement, tags = _agree(90)
    tables = dict(zip(("alice", "bob"), _tables(), strict=True))
    result = run_release(list(tables.values()), 1.0, m=90, release_id="r1", seed=SEED, alignment_key=AKEY,
                         pram_key=PramKey(bytes(32)), pad_keys=PAD_KEYS)  # fmt: skip
    for j, name in enumerate(("alice", "bob")):
        config = _config(name, tmp_path, m=90, test_pad_key=PAD_KEYS[j])
        keystore = Keystore(config.keystore)
        record = prepare(config, OwnData(tables[name], tags[name], "f" * 64), _variant(agreement), keystore, LOG)
        assert np.array_equal(record.ciphertext(), result.server_view["ciphertexts"][j])
        stored = keystore.load_record("r1")
        assert stored is not None and np.array_equal(stored.ciphertext(), record.ciphertext())
        assert stored.table_fingerprint == "f" * 64 and stored.spec == record.spec


def test_the_ledger_refuses_before_anything_is_sent(tmp_path: Path) -> None:
    config = _config("alice", tmp_path)
    keystore = Keystore(config.keystore)
    with pytest.raises(NoBudgetError, match="budget set"):
        check_ledger(config, keystore)
    keystore.ledger.set_budget("d", "d", 0.5)  # the data set is config.dataset, its name
    with pytest.raises(BudgetExceededError, match=r"at most 0\.5 remains"):
        check_ledger(config, keystore)
    keystore.ledger.set_budget("d", "d", 1.5)
    check_ledger(config, keystore)
    reserve(config, keystore, "f" * 64, "seed1", LOG)
    reserve(config, keystore, "f" * 64, "seed1", LOG)  # a resume: the same reservation, once
    assert keystore.ledger.read().spent("d") == pytest.approx(1.0)
    assert keystore.ledger.read().tables("d") == ["f" * 64]  # the table read is recorded
    with pytest.raises(SeedReuseError):  # the same release id with another seed
        reserve(config, keystore, "f" * 64, "seed2", LOG)
