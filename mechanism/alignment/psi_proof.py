"""A curator's proof that it re-blinded a PSI ring list honestly (issue 24, item 8): pure.

A hop takes a list X_1..X_n to Y_i = k X_i under the curator's scalar k (written additively, in
the PSI's group: secp256k1, :mod:`mechanism.alignment.psi_group`; scalars mod its prime order). The curator publishes
B = k G and proves, without revealing k, that the same k maps a random linear combination of
``PROOF_POSITIONS`` positions of the input onto the same combination of the output:
X = sum c_i X_{p_i}, Y = sum c_i Y_{p_i} with positions p and coefficients c derived from a hash
of both lists (Fiat-Shamir), then a Chaum-Pedersen proof that log_G B = log_X Y
(T1 = r G, T2 = r X, e = H(G, B, X, Y, T1, T2), s = r + e k; the verifier checks
s G = T1 + e B and s X = T2 + e Y).

What it catches: a list replaced or re-blinded under another scalar in more than a small fraction
of its points (a fraction f escapes with probability (1 - f)^64 per try: all of them, never; a
sender grinding 2^g list variants gets about f = g/92 past). Altering a few points only drops
those ids from the intersection, which a member could do anyway by leaving rows out of its own
table. The check costs 2 x 64 scalar multiplications per list, not n. A proof is T1 || T2 || s:
two 33-byte compressed points and a 32-byte big-endian scalar (98 bytes).
"""

from __future__ import annotations

import hashlib
import os

from secure_release.mechanism.alignment.psi import POINT_BYTES, PsiKey
from secure_release.mechanism.alignment.psi_group import (
    SCALAR_BYTES,
    InvalidPointError,
    base_mul,
    point_mul,
    point_sum,
    scalar_bytes,
    scalar_from_uniform,
    scalar_int,
)
from secure_release.mechanism.errors import SecureReleaseError

PROOF_POSITIONS = 64
PROOF_BYTES = 2 * POINT_BYTES + SCALAR_BYTES  # T1, T2 (points) and s (scalar)
_DOMAIN = b"secure-release psi reblind proof v2 secp256k1\n"


class ReblindProofError(SecureReleaseError):
    """A re-blinded PSI list does not verify against its input and the sender's public key."""


def proof_context(owner: str, hop: int) -> bytes:
    """What a proof is bound to besides the two lists: whose list, after which hop."""
    return f"{owner}\n{hop}\n".encode()


def slice_context(owner: str, hop: int, index: int, slices: int) -> bytes:
    """What a proof of one slice of a list is bound to: whose list, after which hop, which slice
    of how many (a slice's proof never verifies for another slice or for the whole list)."""
    return proof_context(owner, hop) + f"slice {index} of {slices}\n".encode()


def public_point(key: PsiKey) -> bytes:
    """B = k G, the curator's public key for this alignment (33 bytes)."""
    return base_mul(key.scalar())


def _scalar(*parts: bytes) -> bytes:
    """A Fiat-Shamir scalar: SHA-512 of the parts reduced mod the group order (never zero)."""
    return scalar_from_uniform(hashlib.sha512(_DOMAIN + b"".join(parts)).digest())


def _combination(context: bytes, inp: bytes, out: bytes) -> tuple[bytes, bytes]:
    """(X, Y): the same Fiat-Shamir combination of positions of the input and the output."""
    count = len(inp) // POINT_BYTES
    seed = hashlib.sha512(_DOMAIN + context + hashlib.sha256(inp).digest() + hashlib.sha256(out).digest()).digest()
    picks = range(count) if count <= PROOF_POSITIONS else [
        int.from_bytes(hashlib.sha256(seed + i.to_bytes(4, "big")).digest()[:8], "big") % count
        for i in range(PROOF_POSITIONS)
    ]  # fmt: skip
    xs, ys = [], []
    for i, p in enumerate(picks):
        c = _scalar(seed, i.to_bytes(4, "big"))
        xs.append(point_mul(c, inp[p * POINT_BYTES : (p + 1) * POINT_BYTES]))
        ys.append(point_mul(c, out[p * POINT_BYTES : (p + 1) * POINT_BYTES]))
    return point_sum(xs), point_sum(ys)


def prove_reblind(key: PsiKey, context: bytes, inp: bytes, out: bytes) -> bytes:
    """The proof (T1 || T2 || s) that ``out`` is ``inp`` raised to ``key``; ``context`` binds it to
    the release, owner and hop."""
    x, y = _combination(context, inp, out)
    r = scalar_from_uniform(os.urandom(64))
    t1, t2 = base_mul(r), point_mul(r, x)
    e = _scalar(public_point(key), x, y, t1, t2)
    s = scalar_bytes(scalar_int(r) + scalar_int(e) * scalar_int(key.scalar()))
    return t1 + t2 + s


def verify_reblind(public: bytes, context: bytes, inp: bytes, out: bytes, proof: bytes) -> None:
    """:class:`ReblindProofError` unless ``proof`` shows ``out`` = ``inp`` under the scalar of ``public``."""
    if len(proof) != PROOF_BYTES or len(public) != POINT_BYTES or len(inp) != len(out) or not inp:
        raise ReblindProofError(
            f"a re-blinded PSI list needs a {PROOF_BYTES}-byte proof, a {POINT_BYTES}-byte key and as many points as "
            "its input"
        )
    t1, t2, s = proof[:POINT_BYTES], proof[POINT_BYTES : 2 * POINT_BYTES], proof[2 * POINT_BYTES :]
    try:
        x, y = _combination(context, inp, out)
        e = _scalar(public, x, y, t1, t2)
        left1, right1 = base_mul(s), point_sum([t1, point_mul(e, public)])
        left2, right2 = point_mul(s, x), point_sum([t2, point_mul(e, y)])
    except InvalidPointError as exc:  # a malformed point or scalar, or a sum at the identity
        raise ReblindProofError(f"the re-blinding proof is malformed ({exc})") from exc
    if left1 != right1 or left2 != right2:
        raise ReblindProofError("the re-blinded list is not its input raised to the sender's key")
