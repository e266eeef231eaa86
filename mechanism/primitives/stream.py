"""ChaCha20 keystreams and exact uniform integers drawn from them.

``ChaCha20(key, nonce16)`` in ``cryptography`` takes a 16-byte value: a 4-byte little-endian
block counter followed by a 12-byte nonce (RFC 7539 layout). A :class:`KeyStream` is the
keystream of one (key, 12-byte nonce) pair, seekable to any 64-byte block.

:func:`uniform_below` turns bytes into exactly uniform integers in [0, k) by rejection
(multiply-shift; see its docstring for the proof).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms

from secure_release.mechanism.errors import InvalidSeedError, SymbolOutOfRangeError

CHACHA_BLOCK_BYTES = 64
_MAX_COUNTER = 2**32
_LOW_HALF = 0 if sys.byteorder == "little" else 1  # index of a word's low half in a view


def chacha20_keystream(key: bytes, nonce: bytes, first_block: int, num_bytes: int) -> bytes:
    """``num_bytes`` of the ChaCha20 keystream of (key, nonce) from block ``first_block``."""
    if len(key) != 32 or len(nonce) != 12:
        raise InvalidSeedError("ChaCha20 needs a 32-byte key and a 12-byte nonce")
    blocks = -(-num_bytes // CHACHA_BLOCK_BYTES)
    if first_block < 0 or first_block + blocks > _MAX_COUNTER:
        raise InvalidSeedError(
            f"keystream blocks [{first_block}, {first_block + blocks}) exceed the 2^32 counter"
        )
    counter = first_block.to_bytes(4, "little")
    enc = Cipher(algorithms.ChaCha20(key, counter + nonce), mode=None).encryptor()
    return _update(enc, num_bytes).tobytes()


def keystream_words(
    key: bytes, nonce: bytes, first_block: int, count: int
) -> npt.NDArray[np.uint64]:
    """``count`` little-endian 64-bit words of the (key, nonce) keystream from ``first_block``."""
    if len(key) != 32 or len(nonce) != 12:
        raise InvalidSeedError("ChaCha20 needs a 32-byte key and a 12-byte nonce")
    blocks = -(-8 * count // CHACHA_BLOCK_BYTES)
    if first_block < 0 or first_block + blocks > _MAX_COUNTER:
        raise InvalidSeedError(
            f"keystream blocks [{first_block}, {first_block + blocks}) exceed the 2^32 counter"
        )
    counter = first_block.to_bytes(4, "little")
    enc = Cipher(algorithms.ChaCha20(key, counter + nonce), mode=None).encryptor()
    return _update(enc, 8 * count).view("<u8").view(np.uint64)


def keystream_at(key: bytes, nonce: bytes, byte_offset: int, num_bytes: int) -> npt.NDArray[np.uint8]:
    """Keystream bytes [byte_offset, byte_offset + num_bytes) of (key, nonce): seeks to the
    64-byte block holding ``byte_offset`` and computes only the blocks the range touches."""
    first_block, skip = divmod(byte_offset, CHACHA_BLOCK_BYTES)
    if len(key) != 32 or len(nonce) != 12:
        raise InvalidSeedError("ChaCha20 needs a 32-byte key and a 12-byte nonce")
    if first_block + -(-(skip + num_bytes) // CHACHA_BLOCK_BYTES) > _MAX_COUNTER:
        raise InvalidSeedError("keystream range exceeds the 2^32 block counter")
    enc = Cipher(algorithms.ChaCha20(key, first_block.to_bytes(4, "little") + nonce), mode=None).encryptor()
    return _update(enc, skip + num_bytes)[skip:]


_zeros = bytes(0)


def _update(enc: CipherContext, num_bytes: int) -> npt.NDArray[np.uint8]:
    """Encrypt ``num_bytes`` zeros into a fresh array (``update_into``: no extra copy)."""
    global _zeros
    if len(_zeros) < num_bytes:
        _zeros = bytes(max(num_bytes, 2 * len(_zeros)))
    out = np.empty(num_bytes + CHACHA_BLOCK_BYTES, dtype=np.uint8)
    written = enc.update_into(memoryview(_zeros)[:num_bytes], out.data)
    return out[:written]


def nonce_for(index: int, domain: int = 0) -> bytes:
    """The 12-byte nonce (domain: 4 bytes, index: 8 bytes, little-endian)."""
    return domain.to_bytes(4, "little") + index.to_bytes(8, "little")


class KeyStream:
    """A sequential reader of 64-bit words from one ChaCha20 (key, nonce) keystream."""

    __slots__ = ("_enc",)

    def __init__(self, key: bytes, nonce: bytes, first_block: int = 0) -> None:
        if len(key) != 32 or len(nonce) != 12:
            raise InvalidSeedError("ChaCha20 needs a 32-byte key and a 12-byte nonce")
        counter = first_block.to_bytes(4, "little")
        self._enc = Cipher(algorithms.ChaCha20(key, counter + nonce), mode=None).encryptor()

    def read_bytes(self, num_bytes: int) -> bytes:
        return _update(self._enc, num_bytes).tobytes()

    def words(self, count: int) -> npt.NDArray[np.uint64]:
        """The next ``count`` little-endian 64-bit words of the keystream."""
        return _update(self._enc, 8 * count).view("<u8").view(np.uint64)

    def take(self, num_bytes: int) -> npt.NDArray[np.uint8]:
        """The next ``num_bytes`` bytes of the keystream as an array."""
        return _update(self._enc, num_bytes)


_POOL: ThreadPoolExecutor | None = None


def worker_pool() -> ThreadPoolExecutor:
    """A process-wide pool of min(4, cpu count) threads for block-parallel numpy work."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="secure-release")
    return _POOL


ByteSource = Callable[[int], npt.NDArray[np.uint8]]


def rejection_threshold(k: int, word_bits: int = 32) -> int:
    """2^w mod k: a product whose low w bits fall below it is rejected (Lemire 2019)."""
    if isinstance(k, bool) or int(k) != k or not 1 <= k <= 2**32:
        raise SymbolOutOfRangeError(f"alphabet size {k!r} must be an integer in [1, 2^32]")
    return int((2**word_bits) % k)


def uniform_below(k: int, count: int, source: ByteSource) -> npt.NDArray[np.uint32]:
    """``count`` exactly uniform integers in [0, k) from a source of uniform bytes.

    Lemire's multiply-shift with rejection, on w-bit little-endian words (w = 16 if k <= 2^16,
    else 32). For word u, p = u k; the candidate is p >> w, rejected iff (p mod 2^w) < 2^w mod k.
    Among accepted words each value in [0, k) is hit by exactly floor(2^w / k) words, so an
    accepted candidate is exactly uniform. Rule: output i is the candidate of word i; the
    (rare: probability < k / 2^w each) rejected outputs are filled, in order, by a recursive
    call on the following bytes of the source. Outputs are independent and exactly uniform,
    and deterministic given the source.
    """
    threshold = rejection_threshold(k, 16 if k <= 2**16 else 32)
    if count == 0:
        return np.zeros(0, dtype=np.uint32)
    width = symbol_word_bytes(k)
    out, rejected = candidates(k, source(width * count))
    if threshold and rejected.size:
        out[rejected] = uniform_below(k, rejected.size, source)
    return out


def symbol_word_bytes(k: int) -> int:
    """Bytes of keystream per candidate symbol in Z_k: 2 if k <= 2^16, else 4."""
    return 2 if k <= 2**16 else 4


_NONE_REJECTED: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)


def candidates(k: int, raw: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.intp]]:
    """First-level candidates of :func:`uniform_below` for the words in ``raw``, and the
    indices of the rejected ones (whose candidate values are meaningless).

    One multiply into a uint32/uint64 product, one compare on its low half (a strided view, no
    copy) and one in-place shift: the rejection test is skipped when 2^w mod k = 0.
    """
    threshold = rejection_threshold(k, 16 if k <= 2**16 else 32)
    if k == 2**32:
        return raw.view("<u4").astype(np.uint32), np.zeros(0, dtype=np.intp)
    if k <= 2**16:
        product = np.multiply(raw.view("<u2"), np.uint32(k), dtype=np.uint32)
        out = product
        low_half: npt.NDArray[np.unsignedinteger[Any]] = product.view(np.uint16)[_LOW_HALF::2]
        shift = np.uint32(16)
    else:
        wide = np.multiply(raw.view("<u4"), np.uint64(k), dtype=np.uint64)
        low_half = wide.view(np.uint32)[_LOW_HALF::2]
        out = np.empty(wide.size, dtype=np.uint32)
        out[:] = wide >> np.uint64(32)
        shift = np.uint32(0)
    rejected = np.flatnonzero(low_half < threshold) if threshold else _NONE_REJECTED
    if shift:
        np.right_shift(out, shift, out=out)
    return out, rejected


def os_bytes(count: int) -> npt.NDArray[np.uint8]:
    """Uniform bytes from the operating system's CSPRNG."""
    return np.frombuffer(os.urandom(count), dtype=np.uint8)
