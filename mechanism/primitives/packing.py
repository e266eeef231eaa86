"""Packed wire form of symbol columns: little-endian, 1, 2 or 4 bytes a symbol.

The width depends only on the public alphabet size k: 1 byte if k <= 2^8, 2 if k <= 2^16,
else 4. Unpacking checks the length and that every symbol lies in Z_k.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import ShapeMismatchError
from secure_release.mechanism.schema import SymbolArray, check_joint_alphabet, check_symbols

#: Upload and fetch chunks hold this many rows (1 MiB of 4-byte symbols at most).
CHUNK_ROWS = 1 << 18


def symbol_width(alphabet_size: int) -> int:
    """Bytes per symbol on the wire for alphabet size k."""
    check_joint_alphabet([alphabet_size])
    if alphabet_size <= 2**8:
        return 1
    if alphabet_size <= 2**16:
        return 2
    return 4


def _dtype(alphabet_size: int) -> str:
    return {1: "u1", 2: "<u2", 4: "<u4"}[symbol_width(alphabet_size)]


def pack_symbols(symbols: npt.ArrayLike, alphabet_size: int) -> bytes:
    """Packed bytes of symbols in Z_k."""
    return check_symbols(symbols, alphabet_size).astype(_dtype(alphabet_size)).tobytes()


def unpack_symbols(data: bytes, alphabet_size: int) -> SymbolArray:
    """Symbols from packed bytes; raises if the length or a symbol is invalid."""
    width = symbol_width(alphabet_size)
    if len(data) % width:
        raise ShapeMismatchError(
            f"{len(data)} bytes is not a whole number of {width}-byte symbols (k = {alphabet_size})"
        )
    arr = np.frombuffer(data, dtype=_dtype(alphabet_size)).astype(np.uint32)
    return check_symbols(arr, alphabet_size)


def digest_of(chunks: list[bytes]) -> bytes:
    """SHA-256 over packed chunks in order (the upload and fetch digests)."""
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.digest()
