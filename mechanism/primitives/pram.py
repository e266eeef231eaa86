"""Gamma-diagonal PRAM on joint rows (Sec. III-A; DESIGN 3.4).

With q = gamma + K - 1, a = (gamma - 1)/q and b = 1/q, each joint row is kept with
probability a, otherwise replaced by a uniform joint cell, i.e. an independent uniform symbol in
every Z_{k_j}. The channel is A = a I + b J: diagonal gamma/q, off-diagonal 1/q. Because the
replacement is uniform on the group Z_{k_1} x ... x Z_{k_N}, it commutes with the additive pad
(Lemma 3.1), so the server can apply it to ciphertext.

Randomness: ChaCha20 under a :class:`~mechanism.primitives.keys.PramKey` (fresh from the OS per release,
injectable in tests). Rows are processed in blocks of :data:`PRAM_BLOCK_ROWS`; block t uses its
own keystream (nonce t), so the result does not depend on how a caller chunks the rows.

Exact keep probability: the keep test is "64-bit word < floor(a 2^64)", computed with exact
rationals from the float gamma, so the realized keep probability a' satisfies
a - 2^-64 < a' <= a. Keeping slightly less often only adds noise: the realized channel is
gamma'-diagonal with gamma' = 1 + K a'/(1 - a') <= gamma, so the privacy claim still holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from secure_release.mechanism.errors import (
    AlphabetOverflowError,
    EmptyDomainError,
    InvalidGammaError,
    InvalidKeepError,
    NonFiniteInputError,
    ShapeMismatchError,
)
from secure_release.mechanism.primitives.keys import PramKey
from secure_release.mechanism.primitives.stream import KeyStream, nonce_for, uniform_below
from secure_release.mechanism.schema import MAX_JOINT_ALPHABET, SymbolArray, check_joint_alphabet, check_symbols

PRAM_BLOCK_ROWS = 1 << 18
_PRAM_NONCE_DOMAIN = 2


def check_gamma(gamma: float) -> float:
    """Raise unless gamma is a finite number > 1."""
    if isinstance(gamma, bool) or not isinstance(gamma, int | float):
        raise InvalidGammaError(f"gamma must be a number > 1, got {gamma!r}")
    if not math.isfinite(gamma):
        raise NonFiniteInputError(f"gamma must be finite, got {gamma!r}")
    if gamma <= 1:
        raise InvalidGammaError(f"gamma must be > 1 (gamma = 1 releases nothing), got {gamma!r}")
    return float(gamma)


def check_keep(keep: float) -> float:
    """Raise unless the keep probability a of a "keep w.p. a, else uniform" channel (DESIGN 3.4,
    11) is a finite number in (0, 1] (a = 1: no perturbation)."""
    if isinstance(keep, bool) or not isinstance(keep, int | float | np.floating) or not math.isfinite(keep):
        raise InvalidKeepError(f"the keep probability a must be a finite number in (0, 1], got {keep!r}")
    if not 0.0 < keep <= 1.0:
        raise InvalidKeepError(f"the keep probability a must lie in (0, 1], got {keep!r}")
    return float(keep)


@dataclass(frozen=True)
class PramChannel:
    """The gamma-diagonal channel A = a I + b J on a joint alphabet of size K."""

    gamma: float
    joint_size: int

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        K = self.joint_size
        if isinstance(K, bool) or int(K) != K or K < 1:
            raise EmptyDomainError(f"joint alphabet size {K!r} must be an integer >= 1")
        if K > MAX_JOINT_ALPHABET:
            raise AlphabetOverflowError(
                f"joint alphabet K = {K} exceeds {MAX_JOINT_ALPHABET} (joint codes are int64)"
            )

    @property
    def normalizer(self) -> float:
        """q = gamma + K - 1."""
        return self.gamma + self.joint_size - 1

    @property
    def keep(self) -> float:
        """a = (gamma - 1)/q: the probability a row is kept as it is."""
        return (self.gamma - 1.0) / self.normalizer

    @property
    def off_diagonal(self) -> float:
        """b = 1/q: A's off-diagonal entry."""
        return 1.0 / self.normalizer

    @property
    def diagonal(self) -> float:
        """gamma/q = a + b: the probability a row comes out unchanged."""
        return self.gamma / self.normalizer

    @property
    def keep_threshold(self) -> int:
        """floor(a 2^64), exactly: a 64-bit word below it keeps the row."""
        gamma = Fraction(self.gamma)
        return math.floor((gamma - 1) / (gamma + self.joint_size - 1) * 2**64)


def perturb_block(
    columns: Sequence[SymbolArray],
    alphabet_sizes: Sequence[int],
    channel: PramChannel,
    key: PramKey,
    block: int,
) -> list[SymbolArray]:
    """PRAM on the rows of block ``block`` (at most PRAM_BLOCK_ROWS rows, all curators).

    Rule: one 64-bit word per row decides keep (word < floor(a 2^64)); then, curator by curator,
    uniform symbols for the replaced rows in row order (:func:`uniform_below`).
    """
    rows = _check_columns(columns, alphabet_sizes, channel)
    if rows > PRAM_BLOCK_ROWS:
        raise ShapeMismatchError(f"a PRAM block holds at most {PRAM_BLOCK_ROWS} rows, got {rows}")
    return _perturb_block(columns, alphabet_sizes, channel, key.derive("pram"), block)


def _perturb_block(
    columns: Sequence[SymbolArray],
    alphabet_sizes: Sequence[int],
    channel: PramChannel,
    stream_key: bytes,
    block: int,
    out: Sequence[SymbolArray] | None = None,
) -> list[SymbolArray]:
    """PRAM of one block, written into ``out`` (fresh arrays if None)."""
    rows = len(columns[0])
    targets = [np.empty(rows, dtype=np.uint32) for _ in columns] if out is None else list(out)
    stream = KeyStream(stream_key, nonce_for(block, _PRAM_NONCE_DOMAIN))
    replaced = np.flatnonzero(stream.words(rows) >= np.uint64(channel.keep_threshold))
    for column, k, new in zip(columns, alphabet_sizes, targets, strict=True):
        new[:] = column
        new[replaced] = uniform_below(int(k), replaced.size, stream.take)  # integer scatter: ~4x a mask
    return targets


def perturb(
    columns: Sequence[SymbolArray],
    alphabet_sizes: Sequence[int],
    channel: PramChannel,
    key: PramKey,
    first_row: int = 0,
) -> list[SymbolArray]:
    """PRAM on rows [first_row, first_row + len) of a release; first_row % PRAM_BLOCK_ROWS == 0.

    The output does not depend on how the rows are split into calls (block t always uses
    keystream t), so a server that streams blocks gets the same bytes as one call, and blocks
    could run anywhere. (A thread pool over blocks measured slower here: the keystream holds
    the GIL and dominates.)
    """
    rows = _check_columns(columns, alphabet_sizes, channel)
    if first_row % PRAM_BLOCK_ROWS:
        raise ShapeMismatchError(f"first_row must be a multiple of {PRAM_BLOCK_ROWS}")
    stream_key = key.derive("pram")
    arrays = [np.asarray(c) for c in columns]
    out = [np.empty(rows, dtype=np.uint32) for _ in columns]

    def run(lo: int) -> None:
        hi = min(rows, lo + PRAM_BLOCK_ROWS)
        block = (first_row + lo) // PRAM_BLOCK_ROWS
        _perturb_block([a[lo:hi] for a in arrays], alphabet_sizes, channel, stream_key, block, [o[lo:hi] for o in out])

    for lo in range(0, rows, PRAM_BLOCK_ROWS):
        run(lo)
    return out


def perturb_table(
    columns: Sequence[SymbolArray],
    alphabet_sizes: Sequence[int],
    channel: PramChannel,
    key: PramKey,
    table: int,
    first_row: int,
) -> list[SymbolArray]:
    """PRAM of table ``table`` of a designed release on its rows [first_row, first_row + len)
    (release row numbers; any start): the table's own keystream (``key`` labelled by the table),
    block b of the release's rows using nonce b, so the bytes do not depend on how a caller
    splits the rows as long as no call splits a block's rows of one table (the server's chunks
    are whole blocks). A column whose alphabet is 1 (a curator with no attribute in the table)
    stays all zero; the rest is gamma_t-diagonal PRAM on the table's joint, as :func:`perturb`."""
    rows = _check_columns(columns, alphabet_sizes, channel)
    if first_row < 0:
        raise ShapeMismatchError(f"first_row must be >= 0, got {first_row}")
    live = [j for j, k in enumerate(alphabet_sizes) if int(k) > 1]
    sizes = [int(alphabet_sizes[j]) for j in live]
    stream_key = key.derive(f"pram table {table}")
    arrays = [np.asarray(c) for c in columns]
    out = [np.array(a, dtype=np.uint32) for a in arrays]
    lo = 0
    while lo < rows:
        block = (first_row + lo) // PRAM_BLOCK_ROWS
        hi = min(rows, (block + 1) * PRAM_BLOCK_ROWS - first_row)
        if live:
            _perturb_block([arrays[j][lo:hi] for j in live], sizes, channel, stream_key, block,
                           [out[j][lo:hi] for j in live])  # fmt: skip
        lo = hi
    return out


def _check_columns(
    columns: Sequence[SymbolArray], alphabet_sizes: Sequence[int], channel: PramChannel
) -> int:
    if len(columns) != len(alphabet_sizes):
        raise ShapeMismatchError(f"{len(columns)} columns for {len(alphabet_sizes)} alphabets")
    if check_joint_alphabet(alphabet_sizes) != channel.joint_size:
        raise ShapeMismatchError(
            f"alphabets {list(alphabet_sizes)} do not multiply to K = {channel.joint_size}"
        )
    lengths = {len(c) for c in columns}
    if len(lengths) != 1:
        raise ShapeMismatchError(f"curator columns differ in length: {sorted(lengths)}")
    for column, k in zip(columns, alphabet_sizes, strict=True):
        check_symbols(column, int(k))
    return lengths.pop()
