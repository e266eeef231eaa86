"""The PSI's group (issue 41): secp256k1 through libsecp256k1 (coincurve's bundled build).

Group: the points of secp256k1, y^2 = x^3 + 7 over F_p, p = 2^256 - 2^32 - 977. Its order
:data:`ORDER` is prime and the cofactor is 1, so every point on the curve other than the identity
generates the whole group: there is no subgroup to check. Encoding: SEC 1 compressed, 33 bytes
(0x02 or 0x03 by the parity of y, then x big-endian). A received encoding is accepted only if it is
33 bytes, its first byte is 0x02 or 0x03, x < p (canonical) and x^3 + 7 is a square (the point is
on the curve); the identity has no compressed encoding, so it is refused too
(``secp256k1_ec_pubkey_parse``, :func:`check_points`). Scalars are integers in [1, ORDER), 32
bytes big-endian; the ring's masks and their inverses are arithmetic mod ORDER
(:func:`scalar_mul`, :func:`scalar_inverse`). A variable-base multiplication is libsecp256k1's
constant-time ``secp256k1_ec_pubkey_tweak_mul``.

Hash to the group (:func:`hash_to_point`): H(id) = SwiftEC(u, t) with u || t = SHA-512(domain ||
id), the ElligatorSwift decoding of BIP 324 (``secp256k1_ellswift_decode``). Why it is a random
oracle into the group:

1. SHA-512 is modelled as a random oracle, so u and t (32 bytes each, reduced mod p) are
   independent and within 2^-224 of uniform on F_p.
2. SwiftEC (Chavez-Saab, Rodriguez-Henriquez, Tibouchi, "SwiftEC: Shallue-van de Woestijne
   Indifferentiable Function to Elliptic Curves", Asiacrypt 2022, eprint 2022/759) is one
   well-distributed map f: F_p^2 -> E; the paper shows that f(h(m)), h a random oracle into
   F_p^2, is indifferentiable from a random oracle into E (the notion of RFC 9380's
   hash_to_curve, which needs two maps and an addition where SwiftEC needs one).
3. libsecp256k1 gives y the parity of t. Negating t leaves x unchanged, so the pairs (u, t) that
   decode to one x split exactly in half by the parity of t: both points of that x are equally
   likely. Its deviations from the paper (u = 0, t = 0 or u^3 + t^2 + 7 = 0 decode to a
   finite point instead of the identity) have probability about 3/p.

So H(id) is a random oracle into the group (up to 2^-128), which is what the DDH argument of the
ring needs (``mechanism/alignment/psi.py``). RFC 9380's secp256k1_XMD:SHA-256_SSWU_RO_ would serve too, but
libsecp256k1 has no call for it and in Python integers it costs about 480 us an id here (about 30
times SwiftEC), nearly the whole PSI's cost per id before; docs/architectures.md section 2 has the
measurements.
The decoding runs in variable time (libsecp256k1 decodes public ElligatorSwift keys with it): the
time to hash a list depends on its ids only through which of SwiftEC's three candidates is a valid
x for each, never on a secret scalar, and no party sees per-id timings of another.

libsecp256k1 has no batch calls, so each list is one Python loop over C calls, writing into one
output buffer (the per-element loop is the unavoidable cost of the mode; about 0.3 us of Python per
call against 40 us of multiplication). The context is coincurve's randomized global one; every
call used takes it as const, so concurrent threads may share it; scratch buffers are per call.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Sequence
from typing import Any

from coincurve.context import GLOBAL_CONTEXT

from secure_release.mechanism.errors import SecureReleaseError

_SECP: Any = importlib.import_module("coincurve._libsecp256k1")  # coincurve's cffi module (no type stubs)
_FFI: Any = _SECP.ffi
_LIB: Any = _SECP.lib
_CTX: Any = GLOBAL_CONTEXT.ctx
_COMPRESSED = int(_LIB.SECP256K1_EC_COMPRESSED)

GROUP_NAME = "secp256k1 (prime order, cofactor 1; libsecp256k1 via coincurve)"
POINT_BYTES = 33
SCALAR_BYTES = 32
FIELD_PRIME = 2**256 - 2**32 - 977
ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
ONE = (1).to_bytes(SCALAR_BYTES, "big")


class InvalidPointError(SecureReleaseError):
    """A received list is not a whole number of 33-byte points, or holds an encoding that is not a
    canonical compressed point of secp256k1 (prefix 0x02/0x03, x < p, on the curve); the
    identity has no such encoding."""


def _bad_point(index: int) -> InvalidPointError:
    return InvalidPointError(
        f"point {index} of the list is not a canonical 33-byte compressed secp256k1 point (prefix 0x02 or 0x03, "
        "x below the field prime, on the curve; the identity is never allowed)"
    )


# ------------------------------------------------------------------------------------------- scalars
def scalar_int(scalar: bytes) -> int:
    """A scalar's 32 big-endian bytes as an integer in [1, ORDER) (:class:`InvalidPointError` otherwise)."""
    value = int.from_bytes(scalar, "big")
    if len(scalar) != SCALAR_BYTES or not 0 < value < ORDER:
        raise InvalidPointError("a scalar must be 32 big-endian bytes of an integer in [1, group order)")
    return value


def scalar_bytes(value: int) -> bytes:
    """value mod ORDER as 32 big-endian bytes; zero is refused (it would map every point to the identity)."""
    value %= ORDER
    if value == 0:
        raise InvalidPointError("a scalar is zero mod the group order (probability 2^-256): draw a fresh key")
    return value.to_bytes(SCALAR_BYTES, "big")


def scalar_from_uniform(data: bytes) -> bytes:
    """s = int(data) mod ORDER for 64 uniform bytes: within 2^-256 of uniform on Z_ORDER."""
    if len(data) != 64:
        raise InvalidPointError(f"a scalar is derived from 64 uniform bytes, got {len(data)}")
    return scalar_bytes(int.from_bytes(data, "big"))


def scalar_mul(a: bytes, b: bytes) -> bytes:
    """a b mod ORDER."""
    return scalar_bytes(scalar_int(a) * scalar_int(b))


def scalar_inverse(a: bytes) -> bytes:
    """a^-1 mod ORDER (ORDER is prime, a != 0)."""
    return scalar_bytes(pow(scalar_int(a), -1, ORDER))


# -------------------------------------------------------------------------------------------- points
def _serialize(pk: Any, out: Any, size: Any) -> None:
    size[0] = POINT_BYTES
    _LIB.secp256k1_ec_pubkey_serialize(_CTX, out, size, pk, _COMPRESSED)


def _packed(data: bytes) -> int:
    if not isinstance(data, bytes | bytearray) or len(data) % POINT_BYTES:
        size = len(data) if isinstance(data, bytes | bytearray) else type(data).__name__
        raise InvalidPointError(f"a point list must be a whole number of {POINT_BYTES}-byte points, got {size}")
    return len(data) // POINT_BYTES


def check_points(packed: bytes) -> bytes:
    """``packed`` (concatenated 33-byte encodings), every point parsed and re-encoded: the same
    bytes for a valid list, :class:`InvalidPointError` naming the first bad point otherwise."""
    count = _packed(packed)
    src, out = _FFI.from_buffer(packed), _FFI.new("unsigned char[]", max(count, 1) * POINT_BYTES)
    pk, size = _FFI.new("secp256k1_pubkey *"), _FFI.new("size_t *")
    parse = _LIB.secp256k1_ec_pubkey_parse
    for i in range(count):
        at = i * POINT_BYTES
        if not parse(_CTX, pk, src + at, POINT_BYTES):
            raise _bad_point(i)
        _serialize(pk, out + at, size)
    result = bytes(_FFI.buffer(out, count * POINT_BYTES))
    if result != packed:  # parse accepts only canonical encodings, so this cannot differ
        raise InvalidPointError("a point list is not in canonical compressed encoding")
    return result


def blind_packed(scalar: bytes, packed: bytes) -> bytes:
    """P^s (written additively: s P) for every point of a packed list, packed in the same order;
    every point is validated first (:func:`check_points`)."""
    scalar_int(scalar)
    count = _packed(packed)
    src, out = _FFI.from_buffer(packed), _FFI.new("unsigned char[]", max(count, 1) * POINT_BYTES)
    pk, size = _FFI.new("secp256k1_pubkey *"), _FFI.new("size_t *")
    parse, mul = _LIB.secp256k1_ec_pubkey_parse, _LIB.secp256k1_ec_pubkey_tweak_mul
    for i in range(count):
        at = i * POINT_BYTES
        if not parse(_CTX, pk, src + at, POINT_BYTES):
            raise _bad_point(i)
        if not mul(_CTX, pk, scalar):  # a valid scalar on a valid point never fails
            raise InvalidPointError(f"the multiplication of point {i} failed")
        _serialize(pk, out + at, size)
    return bytes(_FFI.buffer(out, count * POINT_BYTES))


def _swiftec_input(domain: bytes, raw_id: bytes) -> bytes:
    """u || t = SHA-512(domain || id): the 64 bytes ElligatorSwift decodes."""
    return hashlib.sha512(domain + raw_id).digest()


def hash_packed(domain: bytes, raw_ids: Sequence[bytes], scalar: bytes | None = None) -> bytes:
    """H(id) (:func:`hash_to_point`) for every encoded id, packed; with ``scalar``, s H(id)
    instead, in the same pass (no encode and re-parse between the hash and the multiplication)."""
    if scalar is not None:
        scalar_int(scalar)
    count = len(raw_ids)
    out = _FFI.new("unsigned char[]", max(count, 1) * POINT_BYTES)
    pk, size = _FFI.new("secp256k1_pubkey *"), _FFI.new("size_t *")
    decode, mul, sha512 = _LIB.secp256k1_ellswift_decode, _LIB.secp256k1_ec_pubkey_tweak_mul, hashlib.sha512
    for i, raw in enumerate(raw_ids):
        decode(_CTX, pk, sha512(domain + raw).digest())  # always succeeds: every 64 bytes decode
        if scalar is not None and not mul(_CTX, pk, scalar):
            raise InvalidPointError(f"the multiplication of point {i} failed")
        _serialize(pk, out + i * POINT_BYTES, size)
    return bytes(_FFI.buffer(out, count * POINT_BYTES))


def hash_to_point(domain: bytes, raw_id: bytes) -> bytes:
    """H(id) = SwiftEC(SHA-512(domain || id)), compressed (module doc: a random oracle into the group)."""
    return hash_packed(domain, [raw_id])


def swiftec_decode(ell64: bytes) -> bytes:
    """BIP 324's ElligatorSwift decoding of 64 bytes u || t, compressed (y has the parity of t)."""
    if len(ell64) != 64:
        raise InvalidPointError(f"an ElligatorSwift encoding is 64 bytes, got {len(ell64)}")
    pk, out, size = _FFI.new("secp256k1_pubkey *"), _FFI.new("unsigned char[]", POINT_BYTES), _FFI.new("size_t *")
    _LIB.secp256k1_ellswift_decode(_CTX, pk, ell64)
    _serialize(pk, out, size)
    return bytes(_FFI.buffer(out, POINT_BYTES))


def point_mul(scalar: bytes, point: bytes) -> bytes:
    """s P for one point (validated)."""
    if len(point) != POINT_BYTES:
        raise InvalidPointError(f"a point is {POINT_BYTES} bytes, got {len(point)}")
    return blind_packed(scalar, point)


def base_mul(scalar: bytes) -> bytes:
    """s G, G the standard generator."""
    scalar_int(scalar)
    pk, out, size = _FFI.new("secp256k1_pubkey *"), _FFI.new("unsigned char[]", POINT_BYTES), _FFI.new("size_t *")
    if not _LIB.secp256k1_ec_pubkey_create(_CTX, pk, scalar):
        raise InvalidPointError("the base multiplication failed")
    _serialize(pk, out, size)
    return bytes(_FFI.buffer(out, POINT_BYTES))


def point_sum(points: Sequence[bytes]) -> bytes:
    """P_1 + ... + P_k (each validated); :class:`InvalidPointError` if the sum is the identity
    (which has no encoding)."""
    packed = b"".join(points)
    count = _packed(packed)
    if count == 0 or any(len(p) != POINT_BYTES for p in points):
        raise InvalidPointError(f"a sum needs at least one {POINT_BYTES}-byte point")
    keys = _FFI.new("secp256k1_pubkey[]", count)
    for i in range(count):
        if not _LIB.secp256k1_ec_pubkey_parse(_CTX, keys + i, packed[i * POINT_BYTES : (i + 1) * POINT_BYTES],
                                              POINT_BYTES):  # fmt: skip
            raise _bad_point(i)
    ptrs = _FFI.new("secp256k1_pubkey *[]", [keys + i for i in range(count)])
    pk, out, size = _FFI.new("secp256k1_pubkey *"), _FFI.new("unsigned char[]", POINT_BYTES), _FFI.new("size_t *")
    if not _LIB.secp256k1_ec_pubkey_combine(_CTX, pk, ptrs, count):
        raise InvalidPointError("the points sum to the identity")
    _serialize(pk, out, size)
    return bytes(_FFI.buffer(out, POINT_BYTES))
