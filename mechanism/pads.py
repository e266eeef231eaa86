"""Additive encryption over Z_k with one-time or ChaCha20 pads (DESIGN 3.3, Sec. III-A).

c = (x + v) mod k and x = (c - v) mod k, with v exactly uniform on Z_k:

- ``otp``: v drawn from the operating system's CSPRNG (:func:`mechanism.stream.os_bytes`,
  exact rejection sampling); the pad itself (m symbols) is what the researcher receives.
- ``chacha20``: v derived from a fresh 256-bit key. Symbols are produced in blocks of
  :data:`PAD_BLOCK_SYMBOLS`; block b uses the keystream of (HKDF(key, "pad"), nonce = b) and
  exact rejection sampling (:func:`mechanism.stream.uniform_below`), so any block can be
  computed alone (seekable) and encryptor and decryptor agree. Exactly uniform given a random
  function; computationally so under ChaCha20.

Safe API: :func:`new_release_pad` draws a fresh key (or fresh pad) per release and returns a
:class:`ReleasePad` that encrypts exactly once; a second :meth:`ReleasePad.encrypt` raises
:class:`PadReuseError`, because with a reused pad the server learns x - y for every row.
"""

from __future__ import annotations

import enum

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import PadReuseError, ShapeMismatchError, SymbolOutOfRangeError
from secure_release.mechanism.keys import PadKey
from secure_release.mechanism.schema import SymbolArray, check_joint_alphabet, check_symbols
from secure_release.mechanism.stream import KeyStream, nonce_for, os_bytes, uniform_below

PAD_BLOCK_SYMBOLS = 1 << 20
_PAD_NONCE_DOMAIN = 1


class CipherMode(enum.StrEnum):
    """How a curator's pad is made."""

    OTP = "otp"
    CHACHA20 = "chacha20"

    @classmethod
    def parse(cls, text: str) -> CipherMode:
        try:
            return cls(text.lower())
        except ValueError as exc:
            allowed = ", ".join(m.value for m in cls)
            raise SymbolOutOfRangeError(f"unknown cipher {text!r}; allowed: {allowed}") from exc


def _pad_block(stream_key: bytes, alphabet_size: int, block: int) -> SymbolArray:
    """All PAD_BLOCK_SYMBOLS pad symbols of block ``block`` (its own keystream, nonce = block)."""
    stream = KeyStream(stream_key, nonce_for(block, _PAD_NONCE_DOMAIN))
    return uniform_below(alphabet_size, PAD_BLOCK_SYMBOLS, stream.take)


def chacha20_pad(key: PadKey, alphabet_size: int, start: int, count: int) -> SymbolArray:
    """Pad symbols at positions [start, start + count) of the ChaCha20 pad of ``key``."""
    check_joint_alphabet([alphabet_size])
    if start < 0 or count < 0:
        raise ShapeMismatchError(f"pad range must be non-negative, got start={start} count={count}")
    if count == 0:
        return np.zeros(0, dtype=np.uint32)
    stream_key = key.derive("pad")
    first, last = start // PAD_BLOCK_SYMBOLS, (start + count - 1) // PAD_BLOCK_SYMBOLS
    out = np.empty(count, dtype=np.uint32)
    for block in range(first, last + 1):
        lo = max(start, block * PAD_BLOCK_SYMBOLS)
        hi = min(start + count, (block + 1) * PAD_BLOCK_SYMBOLS)
        symbols = _pad_block(stream_key, alphabet_size, block)
        out[lo - start : hi - start] = symbols[
            lo - block * PAD_BLOCK_SYMBOLS : hi - block * PAD_BLOCK_SYMBOLS
        ]
    return out


def otp_pad(alphabet_size: int, count: int) -> SymbolArray:
    """A fresh one-time pad of ``count`` exactly uniform symbols from the OS CSPRNG."""
    check_joint_alphabet([alphabet_size])
    return uniform_below(alphabet_size, count, os_bytes)


def encrypt(symbols: npt.ArrayLike, pad: npt.ArrayLike, alphabet_size: int) -> SymbolArray:
    """c = (x + v) mod k, elementwise (raw primitive; prefer :func:`new_release_pad`)."""
    x, v = _aligned(symbols, pad, alphabet_size)
    if alphabet_size <= 2**31:  # x + v < 2^32: one conditional subtraction, no division
        c = x + v
        np.subtract(c, np.uint32(alphabet_size), out=c, where=c >= np.uint32(alphabet_size))
        return c
    wide = x.astype(np.uint64) + v
    return (wide % np.uint64(alphabet_size)).astype(np.uint32)


def decrypt(ciphertext: npt.ArrayLike, pad: npt.ArrayLike, alphabet_size: int) -> SymbolArray:
    """x = (c - v) mod k, elementwise."""
    c, v = _aligned(ciphertext, pad, alphabet_size)
    x = c - v  # wraps modulo 2^32 where c < v
    np.add(x, np.uint32(alphabet_size % 2**32), out=x, where=c < v)
    return x


def _aligned(
    a: npt.ArrayLike, b: npt.ArrayLike, alphabet_size: int
) -> tuple[SymbolArray, SymbolArray]:
    x = check_symbols(a, alphabet_size)
    v = check_symbols(b, alphabet_size)
    if x.shape != v.shape:
        raise ShapeMismatchError(f"{x.size} symbols but a pad of {v.size}; they must match")
    return x, v


class ReleasePad:
    """The pad of one curator for one release; it encrypts once.

    ``key`` is set for ``chacha20`` (the researcher receives only the key); ``pad_symbols`` for
    ``otp`` (the researcher receives the whole pad). :meth:`pad` recomputes any range.
    """

    __slots__ = ("_used", "alphabet_size", "key", "length", "mode", "pad_symbols")

    def __init__(
        self,
        mode: CipherMode,
        alphabet_size: int,
        length: int,
        key: PadKey | None = None,
        pad_symbols: SymbolArray | None = None,
    ) -> None:
        if (mode is CipherMode.CHACHA20) != (key is not None):
            raise ShapeMismatchError("a chacha20 pad needs a key and an otp pad must not have one")
        if mode is CipherMode.OTP and (pad_symbols is None or pad_symbols.size != length):
            raise ShapeMismatchError(f"an otp pad needs exactly {length} pad symbols")
        self.mode, self.alphabet_size, self.length = mode, alphabet_size, length
        self.key, self.pad_symbols = key, pad_symbols
        self._used = False

    def pad(self, start: int = 0, count: int | None = None) -> SymbolArray:
        """Pad symbols [start, start + count)."""
        count = self.length - start if count is None else count
        if start < 0 or count < 0 or start + count > self.length:
            raise ShapeMismatchError(
                f"pad range [{start}, {start + count}) outside [0, {self.length})"
            )
        if self.pad_symbols is not None:
            return self.pad_symbols[start : start + count]
        assert self.key is not None
        return chacha20_pad(self.key, self.alphabet_size, start, count)

    def encrypt(self, symbols: npt.ArrayLike) -> SymbolArray:
        """Encrypt the release's ``length`` symbols; a second call raises PadReuseError."""
        if self._used:
            raise PadReuseError(
                "this release pad has already encrypted; draw a fresh one with new_release_pad()"
            )
        x = check_symbols(symbols, self.alphabet_size)
        if x.size != self.length:
            raise ShapeMismatchError(f"pad is for {self.length} symbols, got {x.size}")
        self._used = True
        return encrypt(x, self.pad(), self.alphabet_size)

    def decrypt(self, ciphertext: npt.ArrayLike, start: int = 0) -> SymbolArray:
        """Decrypt symbols that sit at positions [start, start + len) of the release."""
        c = check_symbols(ciphertext, self.alphabet_size)
        return decrypt(c, self.pad(start, c.size), self.alphabet_size)

    def __repr__(self) -> str:
        return f"ReleasePad(mode={self.mode.value}, k={self.alphabet_size}, length={self.length})"


def new_release_pad(
    mode: CipherMode | str, alphabet_size: int, length: int, injected_key: PadKey | None = None
) -> ReleasePad:
    """A fresh pad for one curator's column in one release (fresh key or fresh OTP).

    ``injected_key`` exists for reproducible tests only (chacha20): production code passes
    nothing, so every release draws a fresh key from the OS and a pad is never reused.
    """
    mode = CipherMode.parse(mode) if isinstance(mode, str) else mode
    check_joint_alphabet([alphabet_size])
    if mode is CipherMode.CHACHA20:
        key = injected_key if injected_key is not None else PadKey.generate()
        return ReleasePad(mode, alphabet_size, length, key=key)
    if injected_key is not None:
        raise ShapeMismatchError("an otp pad comes from the OS CSPRNG; it takes no key")
    return ReleasePad(mode, alphabet_size, length, pad_symbols=otp_pad(alphabet_size, length))
