"""Attributes, mixed-radix alphabets and joint codes (DESIGN 3, notation).

Curator j's symbol is the mixed-radix code of its attributes, the first attribute most
significant: with domain sizes (d_1, ..., d_r) and category indices (i_1, ..., i_r),
x_j = ((i_1 d_2 + i_2) d_3 + ...) + i_r, an element of Z_{k_j}, k_j = d_1 ... d_r.
The joint cell over N curators is the mixed-radix code of (x_1, ..., x_N), curator 1 most
significant, in Z_K with K = k_1 ... k_N.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import (
    AlphabetOverflowError,
    DuplicateNameError,
    EmptyDomainError,
    ShapeMismatchError,
    SymbolOutOfRangeError,
    UnknownCategoryError,
)

#: A curator's symbols travel as uint32: its alphabet k_j must be <= 2**32.
MAX_CURATOR_ALPHABET = 2**32
#: Joint codes are int64; K must be <= 2**62 so sums and products stay exact.
MAX_JOINT_ALPHABET = 2**62

SymbolArray = npt.NDArray[np.uint32]
CodeArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Attribute:
    """A categorical attribute with ordered categories (the order fixes the codes)."""

    name: str
    categories: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.categories:
            raise EmptyDomainError(f"attribute {self.name!r} has no categories; give at least one")
        if len(set(self.categories)) != len(self.categories):
            raise UnknownCategoryError(
                f"attribute {self.name!r} lists a category twice; categories must be distinct"
            )

    @property
    def size(self) -> int:
        return len(self.categories)

    def encode(self, values: Sequence[str] | npt.NDArray[np.str_]) -> npt.NDArray[np.int64]:
        """Category indices of ``values`` (vectorized); unknown values raise with their rows."""
        arr = np.asarray(values, dtype=str)
        cats = np.asarray(self.categories, dtype=str)
        order = np.argsort(cats, kind="stable")
        sorted_cats = cats[order]
        pos = np.searchsorted(sorted_cats, arr)
        pos_clipped = np.minimum(pos, len(cats) - 1)
        ok = sorted_cats[pos_clipped] == arr
        if not np.all(ok):
            bad = np.flatnonzero(~ok)
            shown = ", ".join(f"row {int(i)}: {str(arr[i])!r}" for i in bad[:5])
            raise UnknownCategoryError(
                f"attribute {self.name!r}: {bad.size} value(s) outside its categories "
                f"({shown}); allowed: {list(self.categories)}"
            )
        return order[pos_clipped].astype(np.int64)


@dataclass(frozen=True)
class CuratorSchema:
    """One curator's slice: its attributes, in order; the alphabet is their product."""

    name: str
    attributes: tuple[Attribute, ...]

    def __post_init__(self) -> None:
        if not self.attributes:
            raise EmptyDomainError(f"curator {self.name!r} has no attributes; give at least one")
        if self.alphabet_size > MAX_CURATOR_ALPHABET:
            raise AlphabetOverflowError(
                f"curator {self.name!r}: alphabet size {self.alphabet_size} exceeds "
                f"{MAX_CURATOR_ALPHABET} (symbols are uint32); split the attributes across curators"
            )

    @property
    def alphabet_size(self) -> int:
        return prod(a.size for a in self.attributes)

    @property
    def radices(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.attributes)

    def encode(self, columns: Mapping[str, Sequence[str] | npt.NDArray[np.str_]]) -> SymbolArray:
        """Mixed-radix symbols of the rows given as one sequence of labels per attribute."""
        missing = [a.name for a in self.attributes if a.name not in columns]
        if missing:
            raise UnknownCategoryError(
                f"curator {self.name!r}: missing column(s) {missing}; "
                f"expected {[a.name for a in self.attributes]}"
            )
        lengths = {len(columns[a.name]) for a in self.attributes}
        if len(lengths) != 1:
            raise ShapeMismatchError(f"curator {self.name!r}: columns differ in length {lengths}")
        indices = [a.encode(columns[a.name]) for a in self.attributes]
        return mixed_radix_encode(indices, self.radices).astype(np.uint32)

    def decode(self, symbols: npt.ArrayLike) -> dict[str, npt.NDArray[np.str_]]:
        """Labels per attribute for each symbol (inverse of :meth:`encode`)."""
        codes = check_symbols(symbols, self.alphabet_size).astype(np.int64)
        digits = mixed_radix_decode(codes, self.radices)
        return {
            a.name: np.asarray(a.categories, dtype=str)[d]
            for a, d in zip(self.attributes, digits, strict=True)
        }

    def labels(self) -> list[tuple[str, ...]]:
        """The category labels of every symbol 0 .. k-1, in code order."""
        grids = np.indices(self.radices).reshape(len(self.radices), -1)
        return [
            tuple(self.attributes[j].categories[int(grids[j, c])] for j in range(len(self.radices)))
            for c in range(self.alphabet_size)
        ]


@dataclass(frozen=True)
class JointSchema:
    """The N >= 2 curators of a release, in the order of the joint code."""

    curators: tuple[CuratorSchema, ...]

    def __post_init__(self) -> None:
        if len(self.curators) < 1:
            raise EmptyDomainError("a joint schema needs at least one curator")
        names = [c.name for c in self.curators]
        if len(set(names)) != len(names):
            raise DuplicateNameError(f"curator names must be distinct, got {names}")
        check_joint_alphabet(self.alphabet_sizes)

    @property
    def alphabet_sizes(self) -> tuple[int, ...]:
        return tuple(c.alphabet_size for c in self.curators)

    @property
    def joint_size(self) -> int:
        return prod(self.alphabet_sizes)

    @property
    def attribute_names(self) -> list[str]:
        return [a.name for c in self.curators for a in c.attributes]

    def cell_labels(self) -> list[tuple[str, ...]]:
        """Labels (one per attribute, all curators) of every joint cell, in code order."""
        per_curator = [c.labels() for c in self.curators]
        grids = np.indices(self.alphabet_sizes).reshape(len(self.curators), -1)
        return [
            tuple(
                lab for j in range(len(self.curators)) for lab in per_curator[j][int(grids[j, c])]
            )
            for c in range(self.joint_size)
        ]


def check_joint_alphabet(alphabet_sizes: Sequence[int]) -> int:
    """Validate per-curator alphabet sizes and return K = prod k_j."""
    if len(alphabet_sizes) == 0:
        raise EmptyDomainError("no curator alphabets given; need at least one size >= 1")
    for k in alphabet_sizes:
        if int(k) != k or k < 1:
            raise EmptyDomainError(f"alphabet size {k!r} is invalid; each must be an integer >= 1")
        if k > MAX_CURATOR_ALPHABET:
            raise AlphabetOverflowError(
                f"alphabet size {k} exceeds {MAX_CURATOR_ALPHABET} (symbols are uint32)"
            )
    joint = prod(int(k) for k in alphabet_sizes)
    if joint > MAX_JOINT_ALPHABET:
        raise AlphabetOverflowError(
            f"joint alphabet K = {joint} exceeds {MAX_JOINT_ALPHABET} (joint codes are int64)"
        )
    return joint


def check_symbols(symbols: npt.ArrayLike, alphabet_size: int) -> npt.NDArray[np.uint32]:
    """Return ``symbols`` as uint32 after checking every one is in Z_k."""
    arr = np.asarray(symbols)
    if arr.ndim != 1:
        raise ShapeMismatchError(f"symbols must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise SymbolOutOfRangeError(f"symbols must be integers, got dtype {arr.dtype}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= alphabet_size:
            raise SymbolOutOfRangeError(
                f"symbol(s) in [{lo}, {hi}] outside Z_{alphabet_size}; "
                f"allowed 0..{alphabet_size - 1}"
            )
    return arr.astype(np.uint32, copy=False)


def mixed_radix_encode(
    digits: Sequence[npt.NDArray[np.integer]], radices: Sequence[int], dtype: npt.DTypeLike = np.int64
) -> npt.NDArray[Any]:
    """Mixed-radix code of digit columns, the first column most significant, in ``dtype``
    (which must hold the product of the radices; computed in place, no int64 copy of a digit
    column)."""
    if len(digits) != len(radices):
        raise ShapeMismatchError(f"{len(digits)} digit columns for {len(radices)} radices")
    code = np.zeros(len(digits[0]) if digits else 0, dtype=dtype)
    for column, radix in zip(digits, radices, strict=True):
        code *= int(radix)
        np.add(code, column, out=code, casting="unsafe")
    return code


def mixed_radix_decode(codes: npt.NDArray[np.integer], radices: Sequence[int]) -> list[CodeArray]:
    """Digit columns of mixed-radix ``codes`` (inverse of :func:`mixed_radix_encode`)."""
    rest = np.asarray(codes, dtype=np.int64).copy()
    out: list[CodeArray] = []
    for radix in reversed(radices):
        out.append(rest % int(radix))
        rest //= int(radix)
    return out[::-1]


def joint_codes(
    columns: Sequence[npt.NDArray[np.integer]], alphabet_sizes: Sequence[int]
) -> CodeArray:
    """Joint cell codes of per-curator symbol columns (curator 1 most significant)."""
    check_joint_alphabet(alphabet_sizes)
    lengths = {len(c) for c in columns}
    if len(lengths) > 1:
        raise ShapeMismatchError(f"curator columns differ in length: {sorted(lengths)}")
    return mixed_radix_encode(columns, alphabet_sizes)


def split_joint(codes: npt.NDArray[np.integer], alphabet_sizes: Sequence[int]) -> list[SymbolArray]:
    """Per-curator symbols of joint codes (inverse of :func:`joint_codes`)."""
    return [d.astype(np.uint32) for d in mixed_radix_decode(codes, alphabet_sizes)]
