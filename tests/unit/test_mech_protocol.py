"""The whole protocol in memory (mechanism.protocol.in_memory.run_release) with injected keys."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest

from secure_release.mechanism.errors import PadReuseError, TooFewCuratorsError
from secure_release.mechanism.primitives import keys as keys_module
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.sampling import sample_positions
from secure_release.mechanism.protocol.in_memory import CuratorTable, agree_alignment, curator_tags, run_release
from secure_release.mechanism.schema import Attribute, CuratorSchema

ALICE = CuratorSchema("alice", (Attribute("edu", ("a", "b", "c")), Attribute("mar", ("m", "s"))))
BOB = CuratorSchema("bob", (Attribute("sex", ("f", "m")), Attribute("sal", ("lo", "hi"))))


def _tables() -> tuple[CuratorTable, CuratorTable]:
    rng = np.random.default_rng(1)
    ids = np.array([f"id{i}" for i in range(300)])
    alice = CuratorTable(
        ALICE,
        ids[:280],
        {"edu": rng.choice(["a", "b", "c"], 280), "mar": rng.choice(["m", "s"], 280)},
    )
    bob_ids = ids[20:][::-1].copy()  # a different row order at Bob
    bob = CuratorTable(
        BOB, bob_ids, {"sex": rng.choice(["f", "m"], 280), "sal": rng.choice(["lo", "hi"], 280)}
    )
    return alice, bob


@pytest.fixture
def deterministic_pad_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pad keys are fresh OS randomness by design; for a byte-for-byte repeat the test makes
    PadKey.generate cycle through two fixed keys (one per curator, so each run gets the same
    pair)."""
    counter = itertools.count()

    def fixed(cls: type[PadKey]) -> PadKey:
        return cls(hashlib.sha256(b"pad-%d" % (next(counter) % 2)).digest())

    monkeypatch.setattr(keys_module.PadKey, "generate", classmethod(fixed))


def _run(cipher: str = "chacha20", granted: list[int] | None = None, m: int | None = 100):
    alice, bob = _tables()
    return run_release(
        [alice, bob],
        1.0,
        m=m,
        cipher=cipher,
        release_id="r1",
        seed=Seed(bytes(32)),
        alignment_key=AlignmentKey(bytes(range(32))),
        pram_key=PramKey(bytes([7]) * 32),
        granted=granted,
    )


def test_deterministic_with_injected_keys(deterministic_pad_keys: None) -> None:
    r1, r2 = _run(), _run()
    assert np.array_equal(r1.estimate.counts, r2.estimate.counts)
    assert np.array_equal(r1.estimate.raw, r2.estimate.raw)
    assert np.array_equal(r1.estimate.mle, r2.estimate.mle)
    for a, b in zip(r1.server_view["perturbed"], r2.server_view["perturbed"], strict=True):
        assert np.array_equal(a, b)


def test_pad_keys_are_fresh_per_run() -> None:
    # without injected pad keys two runs encrypt differently (fresh key per release and curator)
    r1, r2 = _run(), _run()
    assert not np.array_equal(r1.server_view["ciphertexts"][0], r2.server_view["ciphertexts"][0])
    # everything the seed fixes is the same
    assert np.array_equal(r1.sample_type, r2.sample_type)
    assert np.array_equal(r1.true_type, r2.true_type)


def test_alignment_counts_and_plan(deterministic_pad_keys: None) -> None:
    r = _run()
    assert r.matched_rows == {"alice": 260, "bob": 260}
    assert r.unmatched_rows == {"alice": 20, "bob": 20}
    assert r.plan.n == 260 and r.plan.m == 100 and r.plan.alphabet_sizes == (6, 4)
    assert r.estimate.counts.sum() == 100
    assert r.estimate.raw.size == 24 and not r.estimate.is_marginal
    assert abs(r.estimate.raw.sum() - 1) < 1e-9
    assert abs(r.estimate.projected.sum() - 1) < 1e-9 and r.estimate.projected.min() >= 0
    assert abs(r.true_type.sum() - 1) < 1e-12 and abs(r.sample_type.sum() - 1) < 1e-12
    # EM may stop at max_iterations when the MLE is on the simplex boundary (sublinear
    # convergence); it must still be a distribution
    assert r.estimate.mle_iterations == 0 and r.estimate.mle_converged  # closed form
    assert abs(r.estimate.mle.sum() - 1) < 1e-9 and r.estimate.mle.min() >= 0
    # unified intervals on the observed rate within [b, a + b], mapped through A^-1: they hold
    # the raw estimate clipped to [0, 1]
    clipped = np.clip(r.estimate.raw, 0.0, 1.0)
    assert np.all(r.estimate.ci_low >= 0) and np.all(r.estimate.ci_high <= 1)
    assert np.all(r.estimate.ci_low <= clipped) and np.all(clipped <= r.estimate.ci_high)
    assert r.estimate.interval_label == "unified, 95% per cell"
    # the server never sees plaintext: its view holds only ciphertexts, perturbed rows, the plan
    assert set(r.server_view) == {"plan", "ciphertexts", "perturbed"}


def test_true_type_matches_joined_tables() -> None:
    alice, bob = _tables()
    r = _run(m=None)
    a_map = dict(zip(alice.ids.tolist(), alice.symbols().tolist(), strict=True))
    b_map = dict(zip(bob.ids.tolist(), bob.symbols().tolist(), strict=True))
    common = set(a_map) & set(b_map)
    expected = np.zeros(24)
    for i in common:
        expected[a_map[i] * 4 + b_map[i]] += 1
    assert np.allclose(r.true_type, expected / len(common))
    assert r.plan.m >= 1  # m* chosen by the plan


def test_sample_is_the_shared_tuple() -> None:
    # the alignment is the ascending-tag order; the sample_type is the histogram at the positions
    alice, bob = _tables()
    key = AlignmentKey(bytes(range(32)))
    aligns = agree_alignment([curator_tags(alice, key), curator_tags(bob, key)])
    a_sym = alice.symbols()[aligns[0].row_order]
    b_sym = bob.symbols()[aligns[1].row_order]
    assert np.array_equal(alice.ids[aligns[0].row_order], bob.ids[aligns[1].row_order])
    pos = sample_positions(Seed(bytes(32)), 260, 100, "r1")
    cells = a_sym[pos].astype(np.int64) * 4 + b_sym[pos]
    assert np.allclose(_run().sample_type, np.bincount(cells, minlength=24) / 100)


@pytest.mark.parametrize("cipher", ["chacha20", "otp"])
def test_granted_subset_gives_marginal(cipher: str) -> None:
    r = _run(cipher=cipher, granted=[0])
    assert r.estimate.is_marginal
    assert r.estimate.curators == (0,)
    assert r.estimate.alphabet_sizes == (6,)
    assert r.estimate.raw.size == 6 and r.estimate.counts.sum() == 100
    assert abs(r.estimate.raw.sum() - 1) < 1e-9
    assert r.true_type.size == 6
    r1 = _run(cipher=cipher, granted=[1])
    assert r1.estimate.raw.size == 4 and r1.true_type.size == 4
    assert len(r.researcher_view["pads"]) == 1


def test_pads_used_once_and_errors() -> None:
    r = _run()
    pad = r.researcher_view["pads"][0]
    with pytest.raises(PadReuseError):
        pad.encrypt(np.zeros(100, dtype=np.uint32))
    alice, _bob = _tables()
    with pytest.raises(TooFewCuratorsError):
        run_release([alice], 1.0)
