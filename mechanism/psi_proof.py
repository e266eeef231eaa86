"""A curator's proof that it re-blinded a PSI ring list honestly (issue 24, item 8): pure.

A hop takes a list X_1..X_n to Y_i = k X_i under the curator's scalar k. The curator publishes
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
table. The check costs 2 x 64 scalar multiplications per list, not n.
"""

from __future__ import annotations

import hashlib
import os

from nacl import bindings as sodium

from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.psi import POINT_BYTES, PsiKey

PROOF_POSITIONS = 64
PROOF_BYTES = 3 * 32  # T1, T2 (points) and s (scalar)
_DOMAIN = b"secure-release psi reblind proof v1\n"


class ReblindProofError(SecureReleaseError):
    """A re-blinded PSI list does not verify against its input and the sender's public key."""


def proof_context(owner: str, hop: int) -> bytes:
    """What a proof is bound to besides the two lists: whose list, after which hop."""
    return f"{owner}\n{hop}\n".encode()


def public_point(key: PsiKey) -> bytes:
    """B = k G, the curator's public key for this alignment."""
    return bytes(sodium.crypto_scalarmult_ed25519_base_noclamp(key.scalar()))


def _scalar(*parts: bytes) -> bytes:
    return bytes(sodium.crypto_core_ed25519_scalar_reduce(hashlib.sha512(_DOMAIN + b"".join(parts)).digest()))


def _combination(context: bytes, inp: bytes, out: bytes) -> tuple[bytes, bytes]:
    """(X, Y): the same Fiat-Shamir combination of positions of the input and the output."""
    count = len(inp) // POINT_BYTES
    seed = hashlib.sha512(_DOMAIN + context + hashlib.sha256(inp).digest() + hashlib.sha256(out).digest()).digest()
    picks = range(count) if count <= PROOF_POSITIONS else [
        int.from_bytes(hashlib.sha256(seed + i.to_bytes(4, "big")).digest()[:8], "big") % count
        for i in range(PROOF_POSITIONS)
    ]  # fmt: skip
    x = y = b""
    for i, p in enumerate(picks):
        c = _scalar(seed, i.to_bytes(4, "big"))
        xi = sodium.crypto_scalarmult_ed25519_noclamp(c, inp[p * POINT_BYTES : (p + 1) * POINT_BYTES])
        yi = sodium.crypto_scalarmult_ed25519_noclamp(c, out[p * POINT_BYTES : (p + 1) * POINT_BYTES])
        x = xi if not x else sodium.crypto_core_ed25519_add(x, xi)
        y = yi if not y else sodium.crypto_core_ed25519_add(y, yi)
    return bytes(x), bytes(y)


def prove_reblind(key: PsiKey, context: bytes, inp: bytes, out: bytes) -> bytes:
    """The proof (T1 || T2 || s) that ``out`` is ``inp`` raised to ``key``; ``context`` binds it to
    the release, owner and hop."""
    x, y = _combination(context, inp, out)
    r = bytes(sodium.crypto_core_ed25519_scalar_reduce(os.urandom(64)))
    t1 = sodium.crypto_scalarmult_ed25519_base_noclamp(r)
    t2 = sodium.crypto_scalarmult_ed25519_noclamp(r, x)
    e = _scalar(public_point(key), x, y, t1, t2)
    s = sodium.crypto_core_ed25519_scalar_add(r, sodium.crypto_core_ed25519_scalar_mul(e, key.scalar()))
    return bytes(t1) + bytes(t2) + bytes(s)


def verify_reblind(public: bytes, context: bytes, inp: bytes, out: bytes, proof: bytes) -> None:
    """:class:`ReblindProofError` unless ``proof`` shows ``out`` = ``inp`` under the scalar of ``public``."""
    if len(proof) != PROOF_BYTES or len(public) != 32 or len(inp) != len(out) or not inp:
        raise ReblindProofError(
            "a re-blinded PSI list needs a 96-byte proof, a 32-byte key and as many points as its input"
        )
    t1, t2, s = proof[:32], proof[32:64], proof[64:]
    try:
        x, y = _combination(context, inp, out)
        e = _scalar(public, x, y, t1, t2)
        left1 = sodium.crypto_scalarmult_ed25519_base_noclamp(s)
        right1 = sodium.crypto_core_ed25519_add(t1, sodium.crypto_scalarmult_ed25519_noclamp(e, public))
        left2 = sodium.crypto_scalarmult_ed25519_noclamp(s, x)
        right2 = sodium.crypto_core_ed25519_add(t2, sodium.crypto_scalarmult_ed25519_noclamp(e, y))
    except (RuntimeError, TypeError, ValueError) as exc:  # libsodium refuses a malformed point
        raise ReblindProofError(f"the re-blinding proof is malformed ({type(exc).__name__})") from exc
    if left1 != right1 or left2 != right2:
        raise ReblindProofError("the re-blinded list is not its input raised to the sender's key")
