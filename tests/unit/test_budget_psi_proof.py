# tier: unit
"""Issue 24, item 8: the re-blinding proof a PSI member sends with every list it re-blinds
(mechanism/alignment/psi_proof.py). An honest hop verifies; a list of other valid points, a list raised to
another key, a proof moved to another owner or hop, a changed proof and a list with half its
points replaced are refused. Positions and coefficients are a hash of both lists (no seed): half
the points replaced escapes with probability 2^-64 < 1e-6."""

from __future__ import annotations

import pytest

from secure_release.mechanism.alignment.psi import POINT_BYTES, PsiKey, hash_to_group, psi_reblind
from secure_release.mechanism.alignment.psi_group import ORDER
from secure_release.mechanism.alignment.psi_proof import (
    PROOF_BYTES,
    PROOF_POSITIONS,
    ReblindProofError,
    proof_context,
    prove_reblind,
    public_point,
    verify_reblind,
)

KEY = PsiKey(bytes(range(32)))
INP = b"".join(hash_to_group([f"id{i}" for i in range(300)]))
OUT = psi_reblind(INP, KEY)
CTX = proof_context("alice", 2)
PROOF = prove_reblind(KEY, CTX, INP, OUT)


def test_an_honest_reblinding_verifies() -> None:
    verify_reblind(public_point(KEY), CTX, INP, OUT, PROOF)
    short = INP[: 5 * POINT_BYTES]  # fewer points than PROOF_POSITIONS: every point is checked
    assert PROOF_POSITIONS > 5
    verify_reblind(public_point(KEY), CTX, short, psi_reblind(short, KEY),
                   prove_reblind(KEY, CTX, short, psi_reblind(short, KEY)))  # fmt: skip


def _s_plus_one() -> bytes:
    return ((int.from_bytes(PROOF[-32:], "big") + 1) % ORDER).to_bytes(32, "big")


def _half_replaced() -> bytes:
    forged = b"".join(hash_to_group([f"forged{i}" for i in range(150)]))
    return forged + OUT[150 * POINT_BYTES :]


@pytest.mark.parametrize(
    ("public", "ctx", "out", "proof"),
    [
        (public_point(KEY), CTX, b"".join(hash_to_group([f"x{i}" for i in range(300)])), PROOF),
        (public_point(KEY), CTX, psi_reblind(INP, PsiKey(bytes(32 * [9]))), PROOF),
        (public_point(PsiKey(bytes(32 * [9]))), CTX, OUT, PROOF),
        (public_point(KEY), proof_context("bob", 2), OUT, PROOF),
        (public_point(KEY), proof_context("alice", 3), OUT, PROOF),
        (public_point(KEY), CTX, OUT, PROOF[:-32] + bytes(32)),
        (public_point(KEY), CTX, OUT, PROOF[:-32] + _s_plus_one()),
        (public_point(KEY), CTX, OUT, PROOF[:-32] + ORDER.to_bytes(32, "big")),
        (public_point(KEY), CTX, OUT, PROOF[:-1]),
        (public_point(KEY)[:32], CTX, OUT, PROOF),
        (public_point(KEY), CTX, OUT, b"\x02" * PROOF_BYTES),
        (public_point(KEY), CTX, _half_replaced(), PROOF),
    ],
    ids=[
        "other points",
        "other key",
        "other public key",
        "other owner",
        "other hop",
        "zero s",
        "s + 1",
        "s = order",
        "short proof",
        "32-byte public key",
        "proof of invalid points",
        "half replaced",
    ],
)
def test_a_wrong_reblinding_is_refused(public: bytes, ctx: bytes, out: bytes, proof: bytes) -> None:
    with pytest.raises(ReblindProofError):
        verify_reblind(public, ctx, INP, out, proof)


def test_a_forger_who_proves_its_own_forgery_under_its_key_is_still_refused_under_the_pinned_key() -> None:
    """A proof is about the sender's pinned public key: a list re-blinded under another key verifies
    only under that other key, which the leader does not accept once the first was pinned."""
    other = PsiKey(bytes(32 * [5]))
    out = psi_reblind(INP, other)
    proof = prove_reblind(other, CTX, INP, out)
    verify_reblind(public_point(other), CTX, INP, out, proof)
    with pytest.raises(ReblindProofError):
        verify_reblind(public_point(KEY), CTX, INP, out, proof)
