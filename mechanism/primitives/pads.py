"""Additive encryption over Z_k with one-time or ChaCha20 pads (DESIGN 3.3, Sec. III-A).

c = (x + v) mod k and x = (c - v) mod k, with v exactly uniform on Z_k:

- ``otp``: v drawn from the operating system's CSPRNG (:func:`mechanism.primitives.stream.os_bytes`,
  exact rejection sampling); the pad itself (m symbols) is what the researcher receives.
- ``chacha20``: v derived from a fresh 256-bit key. Symbols are produced in blocks of
  :data:`PAD_BLOCK_SYMBOLS`; block b uses the keystream of (HKDF(key, "pad"), nonce = b) and
  exact rejection sampling (:func:`mechanism.primitives.stream.uniform_below`), so any block can be
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

from secure_release.mechanism.errors import PadReuseError, ShapeMismatchError, UnknownCipherError
from secure_release.mechanism.primitives.keys import PadKey
from secure_release.mechanism.primitives.stream import (
    CHACHA_BLOCK_BYTES,
    KeyStream,
    candidates,
    keystream_at,
    nonce_for,
    os_bytes,
    symbol_word_bytes,
    uniform_below,
)
from secure_release.mechanism.schema import SymbolArray, check_joint_alphabet, check_symbols

PAD_BLOCK_SYMBOLS = 1 << 20
_SCAN_SYMBOLS = 1 << 18  # rejection counting reads the keystream in pieces of this many words
_SMALL_PAD_SYMBOLS = 1 << 16  # a ReleasePad keeps a pad this short after its first use
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
            raise UnknownCipherError(f"unknown cipher {text!r}; allowed: {allowed}") from exc


def _pad_range(stream_key: bytes, alphabet_size: int, block: int, lo: int, hi: int) -> SymbolArray:
    """Pad symbols [lo, hi) of block ``block`` (block-local positions), computing only the
    keystream they need.

    The rule is that of :func:`uniform_below` over the block's own keystream (nonce = block):
    symbol i is the candidate of word i unless that word is rejected; the rejected symbols of
    the whole block are refilled, in order, from the keystream after the block's
    PAD_BLOCK_SYMBOLS words. Only when a word in [lo, hi) is rejected (probability below
    (hi - lo) k / 2^w) does this read the rest of the block, to rank the rejection among all
    of the block's rejections. The output equals ``uniform_below(k, PAD_BLOCK_SYMBOLS)[lo:hi]``.
    """
    nonce = nonce_for(block, _PAD_NONCE_DOMAIN)
    width = symbol_word_bytes(alphabet_size)
    out, rejected = candidates(alphabet_size, keystream_at(stream_key, nonce, lo * width, (hi - lo) * width))
    if rejected.size == 0:
        return out
    before = _rejections(stream_key, alphabet_size, nonce, 0, lo)
    # refill word j (j = rank among the block's rejections) sits right after the block's words;
    # only if one of those is rejected too does the refill's own refill need the block's total
    refill_raw = keystream_at(stream_key, nonce, (PAD_BLOCK_SYMBOLS + before) * width, rejected.size * width)
    refill, rejected_again = candidates(alphabet_size, refill_raw)
    if rejected_again.size:
        after = _rejections(stream_key, alphabet_size, nonce, hi, PAD_BLOCK_SYMBOLS)
        total = before + rejected.size + after
        refill_source = KeyStream(stream_key, nonce, PAD_BLOCK_SYMBOLS * width // CHACHA_BLOCK_BYTES)
        refill = uniform_below(alphabet_size, total, refill_source.take)[before : before + rejected.size]
    out[rejected] = refill
    return out


def _rejections(stream_key: bytes, alphabet_size: int, nonce: bytes, lo: int, hi: int) -> int:
    """How many first-level words in [lo, hi) of a pad block are rejected."""
    width = symbol_word_bytes(alphabet_size)
    count = 0
    for start in range(lo, hi, _SCAN_SYMBOLS):
        stop = min(hi, start + _SCAN_SYMBOLS)
        raw = keystream_at(stream_key, nonce, start * width, (stop - start) * width)
        count += candidates(alphabet_size, raw)[1].size
    return count


def chacha20_pad(key: PadKey, alphabet_size: int, start: int, count: int) -> SymbolArray:
    """Pad symbols at positions [start, start + count) of the ChaCha20 pad of ``key``.

    Cost is proportional to ``count`` (only the keystream bytes these positions use), except
    when one of them needs a rejection refill: then its whole 2^20-symbol block is scanned.
    """
    check_joint_alphabet([alphabet_size])
    if start < 0 or count < 0:
        raise ShapeMismatchError(f"pad range must be non-negative, got start={start} count={count}")
    if count == 0:
        return np.zeros(0, dtype=np.uint32)
    return _chacha20_pad(key.derive("pad"), alphabet_size, start, count)


def _chacha20_pad(stream_key: bytes, alphabet_size: int, start: int, count: int) -> SymbolArray:
    """:func:`chacha20_pad` given the derived stream key."""
    if count == 0:
        return np.zeros(0, dtype=np.uint32)
    first, last = start // PAD_BLOCK_SYMBOLS, (start + count - 1) // PAD_BLOCK_SYMBOLS
    if first == last:
        base = first * PAD_BLOCK_SYMBOLS
        return _pad_range(stream_key, alphabet_size, first, start - base, start + count - base)
    out = np.empty(count, dtype=np.uint32)
    for block in range(first, last + 1):
        base = block * PAD_BLOCK_SYMBOLS
        lo, hi = max(start, base), min(start + count, base + PAD_BLOCK_SYMBOLS)
        out[lo - start : hi - start] = _pad_range(stream_key, alphabet_size, block, lo - base, hi - base)
    return out


def otp_pad(alphabet_size: int, count: int) -> SymbolArray:
    """A fresh one-time pad of ``count`` exactly uniform symbols from the OS CSPRNG."""
    check_joint_alphabet([alphabet_size])
    return uniform_below(alphabet_size, count, os_bytes)


def encrypt(symbols: npt.ArrayLike, pad: npt.ArrayLike, alphabet_size: int) -> SymbolArray:
    """c = (x + v) mod k, elementwise (raw primitive; prefer :func:`new_release_pad`)."""
    x, v = _aligned(symbols, pad, alphabet_size)
    return _add_mod(x, v, alphabet_size)


def _add_mod(x: SymbolArray, v: SymbolArray, alphabet_size: int) -> SymbolArray:
    """(x + v) mod k for symbols already in Z_k."""
    if alphabet_size <= 2**31:  # x + v < 2^32: c - k wraps above c exactly when c < k
        c = np.add(x, v, dtype=np.uint32)
        np.minimum(c, np.subtract(c, np.uint32(alphabet_size)), out=c)
        return c
    wide = x.astype(np.uint64) + v
    return (wide % np.uint64(alphabet_size)).astype(np.uint32)


def decrypt(ciphertext: npt.ArrayLike, pad: npt.ArrayLike, alphabet_size: int) -> SymbolArray:
    """x = (c - v) mod k, elementwise."""
    c, v = _aligned(ciphertext, pad, alphabet_size)
    return _sub_mod(c, v, alphabet_size)


def _sub_mod(c: SymbolArray, v: SymbolArray, alphabet_size: int) -> SymbolArray:
    """(c - v) mod k for symbols already in Z_k."""
    x = np.subtract(c, v, dtype=np.uint32)  # wraps modulo 2^32 where c < v
    if alphabet_size > 2**31:  # x + k may wrap for a correct x: add k only where c < v
        np.add(x, np.uint32(alphabet_size % 2**32), out=x, where=c < v)
        return x
    # where c < v the wrapped difference is >= 2^32 - k + 1 > c, and adding k fixes it: take the
    # smaller of x and x + k (mod 2^32), which is x exactly when c >= v
    np.minimum(x, np.add(x, np.uint32(alphabet_size)), out=x)
    return x


def _checked(symbols: npt.ArrayLike, alphabet_size: int) -> SymbolArray:
    """``symbols`` as uint32 in Z_k (one max pass for unsigned input)."""
    arr = np.asarray(symbols)
    if arr.ndim == 1 and arr.dtype.kind == "u" and arr.dtype.itemsize <= 4:
        if arr.size and int(arr.max()) >= alphabet_size:
            return check_symbols(arr, alphabet_size)  # raises with the full message
        return arr.astype(np.uint32, copy=False)
    return check_symbols(arr, alphabet_size)


def _aligned(
    a: npt.ArrayLike, b: npt.ArrayLike, alphabet_size: int
) -> tuple[SymbolArray, SymbolArray]:
    x = _checked(a, alphabet_size)
    v = _checked(b, alphabet_size)
    if x.shape != v.shape:
        raise ShapeMismatchError(f"{x.size} symbols but a pad of {v.size}; they must match")
    return x, v


#: One table of a designed release, as one curator's pad sees it: (m_t, k_t) = the table's rows
#: and this curator's alphabet in it (1: none of its attributes is in the table, every symbol 0).
Segments = tuple[tuple[int, int], ...]


def check_segments(segments: Segments, alphabet_size: int, length: int) -> Segments:
    """Raise unless the segments' rows sum to ``length`` and each k_t is in 1..``alphabet_size``."""
    out = tuple((int(m), int(k)) for m, k in segments)
    if not out or sum(m for m, _ in out) != length or any(m < 1 for m, _ in out):
        raise ShapeMismatchError(f"table segments {list(out)} must have rows >= 1 summing to m = {length}")
    if any(not 1 <= k <= alphabet_size for _, k in out):
        raise ShapeMismatchError(f"table segments {list(out)} need alphabets in 1..{alphabet_size}")
    return out


def segment_stream_key(key: PadKey, table: int) -> bytes:
    """The ChaCha20 stream key of table ``table``'s pad in a designed release: its own HKDF label,
    so no keystream word serves two tables (each table's pad is exactly uniform on its Z_k_t)."""
    return key.derive(f"pad table {table}")


class ReleasePad:
    """The pad of one curator for one release; it encrypts once.

    ``key`` is set for ``chacha20`` (the researcher receives only the key); ``pad_symbols`` for
    ``otp`` (the researcher receives the whole pad). :meth:`pad` recomputes any range.

    ``segments`` (a release of several tables, docs/privacy.md): rows [s_t, s_t + m_t) belong to
    table t and are added modulo that table's k_t (this curator's alphabet there, 1 if it has no
    attribute in it); ``alphabet_size`` is then the packing alphabet (the curator's whole schema),
    and a chacha20 pad draws table t from its own stream key (:func:`segment_stream_key`).
    """

    __slots__ = ("_small_pad", "_stream_key", "_used", "alphabet_size", "key", "length", "mode", "pad_symbols",
                 "segments")  # fmt: skip

    def __init__(
        self,
        mode: CipherMode,
        alphabet_size: int,
        length: int,
        key: PadKey | None = None,
        pad_symbols: SymbolArray | None = None,
        segments: Segments | None = None,
    ) -> None:
        if (mode is CipherMode.CHACHA20) != (key is not None):
            raise ShapeMismatchError("a chacha20 pad needs a key and an otp pad must not have one")
        if mode is CipherMode.OTP and (pad_symbols is None or pad_symbols.size != length):
            raise ShapeMismatchError(f"an otp pad needs exactly {length} pad symbols")
        self.mode, self.alphabet_size, self.length = mode, alphabet_size, length
        self.key, self.pad_symbols = key, pad_symbols
        self.segments = None if segments is None else check_segments(segments, alphabet_size, length)
        self._stream_key = key.derive("pad") if key is not None else b""  # derived once per pad
        self._small_pad: SymbolArray | None = None  # a short chacha20 pad, computed once
        self._used = False
        if self.segments is not None and pad_symbols is not None:
            _check_moduli(pad_symbols, self.moduli(0, length))

    def _starts(self) -> list[int]:
        assert self.segments is not None
        return [0, *np.cumsum([m for m, _ in self.segments]).tolist()]

    def moduli(self, start: int, count: int) -> SymbolArray | None:
        """Each row's modulus k_t over [start, start + count) (None: one release-wide k)."""
        if self.segments is None:
            return None
        starts = self._starts()
        out = np.empty(count, dtype=np.uint32)
        for t, (_, k) in enumerate(self.segments):
            lo, hi = max(start, starts[t]), min(start + count, starts[t + 1])
            if lo < hi:
                out[lo - start : hi - start] = k
        return out

    def _segment_pad(self, start: int, count: int) -> SymbolArray:
        """ChaCha20 pad of a designed release: table t's rows from table t's own stream."""
        assert self.segments is not None and self.key is not None
        starts, out = self._starts(), np.empty(count, dtype=np.uint32)
        for t, (_, k) in enumerate(self.segments):
            lo, hi = max(start, starts[t]), min(start + count, starts[t + 1])
            if lo >= hi:
                continue
            if k == 1:
                out[lo - start : hi - start] = 0
            else:
                stream = segment_stream_key(self.key, t)
                out[lo - start : hi - start] = _chacha20_pad(stream, k, lo - starts[t], hi - lo)
        return out

    def pad(self, start: int = 0, count: int | None = None) -> SymbolArray:
        """Pad symbols [start, start + count)."""
        count = self.length - start if count is None else count
        if start < 0 or count < 0 or start + count > self.length:
            raise ShapeMismatchError(
                f"pad range [{start}, {start + count}) outside [0, {self.length})"
            )
        if self.pad_symbols is not None:
            return self.pad_symbols[start : start + count]
        compute = self._segment_pad if self.segments is not None else self._whole_pad
        if self.length <= _SMALL_PAD_SYMBOLS:  # short releases: compute the pad once, then slice
            if self._small_pad is None:
                self._small_pad = compute(0, self.length)
            return self._small_pad[start : start + count]
        return compute(start, count)

    def _whole_pad(self, start: int, count: int) -> SymbolArray:
        return _chacha20_pad(self._stream_key, self.alphabet_size, start, count)

    def encrypt(self, symbols: npt.ArrayLike) -> SymbolArray:
        """Encrypt the release's ``length`` symbols; a second call raises PadReuseError."""
        if self._used:
            raise PadReuseError(
                "this release pad has already encrypted; draw a fresh one with new_release_pad()"
            )
        x = _checked(symbols, self.alphabet_size)
        if x.size != self.length:
            raise ShapeMismatchError(f"pad is for {self.length} symbols, got {x.size}")
        self._used = True
        return self.encrypt_range(x, 0)

    def encrypt_range(self, symbols: npt.ArrayLike, start: int = 0) -> SymbolArray:
        """c = (x + v) mod k over rows [start, start + len) with no once-only guard: for a record
        that binds this pad to one sample (``curator.records.keystore``), never to other plaintext."""
        x = _checked(symbols, self.alphabet_size)
        ks = self.moduli(start, x.size)
        if ks is None:
            return _add_mod(x, self.pad(start, x.size), self.alphabet_size)
        _check_moduli(x, ks)
        return _add_mod_rows(x, self.pad(start, x.size), ks)

    def decrypt(self, ciphertext: npt.ArrayLike, start: int = 0) -> SymbolArray:
        """Decrypt symbols that sit at positions [start, start + len) of the release."""
        c = _checked(ciphertext, self.alphabet_size)
        ks = self.moduli(start, c.size)
        if ks is None:
            return _sub_mod(c, self.pad(start, c.size), self.alphabet_size)
        _check_moduli(c, ks)
        v = self.pad(start, c.size)
        return ((c.astype(np.int64) - v + ks) % ks).astype(np.uint32)

    def __repr__(self) -> str:
        tables = "" if self.segments is None else f", tables={len(self.segments)}"
        return f"ReleasePad(mode={self.mode.value}, k={self.alphabet_size}, length={self.length}{tables})"


def _check_moduli(symbols: SymbolArray, moduli: SymbolArray | None) -> None:
    """Raise unless each symbol is below its row's modulus."""
    if moduli is not None and symbols.size and bool(np.any(symbols >= moduli)):
        row = int(np.flatnonzero(symbols >= moduli)[0])
        raise ShapeMismatchError(
            f"symbol {int(symbols[row])} at row {row} is outside its table's alphabet 0..{int(moduli[row]) - 1}"
        )


def _add_mod_rows(x: SymbolArray, v: SymbolArray, moduli: SymbolArray) -> SymbolArray:
    """(x + v) mod k_row, elementwise, for symbols already in Z_k_row."""
    return ((x.astype(np.uint64) + v) % moduli).astype(np.uint32)


def new_release_pad(
    mode: CipherMode | str,
    alphabet_size: int,
    length: int,
    injected_key: PadKey | None = None,
    segments: Segments | None = None,
) -> ReleasePad:
    """A fresh pad for one curator's column in one release (fresh key or fresh OTP).

    ``injected_key`` exists for reproducible tests only (chacha20): production code passes
    nothing, so every release draws a fresh key from the OS and a pad is never reused.
    ``segments``: the (m_t, k_t) of each table of a designed release (:class:`ReleasePad`).
    """
    mode = CipherMode.parse(mode) if isinstance(mode, str) else mode
    check_joint_alphabet([alphabet_size])
    if segments is not None:
        segments = check_segments(segments, alphabet_size, length)
    if mode is CipherMode.CHACHA20:
        key = injected_key if injected_key is not None else PadKey.generate()
        return ReleasePad(mode, alphabet_size, length, key=key, segments=segments)
    if injected_key is not None:
        raise ShapeMismatchError("an otp pad comes from the OS CSPRNG; it takes no key")
    if segments is None:
        return ReleasePad(mode, alphabet_size, length, pad_symbols=otp_pad(alphabet_size, length))
    parts = [otp_pad(k, m) if k > 1 else np.zeros(m, dtype=np.uint32) for m, k in segments]
    return ReleasePad(mode, alphabet_size, length, pad_symbols=np.concatenate(parts), segments=segments)
