"""Schema: mixed-radix codes, joint codes and their named errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_release.mechanism.errors import (
    AlphabetOverflowError,
    EmptyDomainError,
    SymbolOutOfRangeError,
    UnknownCategoryError,
)
from secure_release.mechanism.schema import (
    MAX_CURATOR_ALPHABET,
    MAX_JOINT_ALPHABET,
    Attribute,
    CuratorSchema,
    JointSchema,
    check_joint_alphabet,
    check_symbols,
    joint_codes,
    mixed_radix_decode,
    mixed_radix_encode,
    split_joint,
)


def _attr(name: str, d: int) -> Attribute:
    return Attribute(name, tuple(f"{name}{i}" for i in range(d)))


radices_st = st.lists(st.integers(1, 7), min_size=1, max_size=4)


@st.composite
def schema_and_rows(draw: st.DrawFn) -> tuple[CuratorSchema, dict[str, list[str]]]:
    radices = draw(radices_st)
    attrs = tuple(_attr(f"a{j}", d) for j, d in enumerate(radices))
    schema = CuratorSchema("c", attrs)
    rows = draw(st.integers(0, 30))
    cols = {a.name: [draw(st.sampled_from(a.categories)) for _ in range(rows)] for a in attrs}
    return schema, cols


@settings(max_examples=60, deadline=None)
@given(schema_and_rows())
def test_curator_encode_decode_round_trip(data: tuple[CuratorSchema, dict[str, list[str]]]) -> None:
    schema, cols = data
    symbols = schema.encode(cols)
    assert symbols.dtype == np.uint32
    assert np.all(symbols < schema.alphabet_size)
    back = schema.decode(symbols)
    for name, values in cols.items():
        assert list(back[name]) == values


def test_curator_encode_first_attribute_most_significant() -> None:
    schema = CuratorSchema("c", (_attr("x", 3), _attr("y", 2)))
    sym = schema.encode({"x": ["x0", "x1", "x2", "x2"], "y": ["y1", "y0", "y0", "y1"]})
    assert sym.tolist() == [1, 2, 4, 5]
    assert schema.labels()[5] == ("x2", "y1")


@settings(max_examples=60, deadline=None)
@given(radices_st, st.data())
def test_mixed_radix_round_trip(radices: list[int], data: st.DataObject) -> None:
    rows = data.draw(st.integers(0, 20))
    digits = [
        np.array(
            data.draw(st.lists(st.integers(0, r - 1), min_size=rows, max_size=rows)), dtype=np.int64
        )
        for r in radices
    ]
    code = mixed_radix_encode(digits, radices)
    assert np.all((code >= 0) & (code < int(np.prod(radices))))
    for got, want in zip(mixed_radix_decode(code, radices), digits, strict=True):
        assert np.array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=4), st.data())
def test_joint_codes_split_round_trip(sizes: list[int], data: st.DataObject) -> None:
    K = int(np.prod(sizes))
    codes = np.array(data.draw(st.lists(st.integers(0, K - 1), max_size=25)), dtype=np.int64)
    cols = split_joint(codes, sizes)
    assert all(c.dtype == np.uint32 for c in cols)
    assert all(np.all(c < k) for c, k in zip(cols, sizes, strict=True))
    assert np.array_equal(joint_codes(cols, sizes), codes)


def test_joint_codes_exhaustive_bijection() -> None:
    sizes = [3, 2, 4]
    grid = np.indices(sizes).reshape(3, -1)
    codes = joint_codes([grid[0], grid[1], grid[2]], sizes)
    assert codes.tolist() == list(range(24))  # curator 1 most significant, lexicographic


def test_unknown_category() -> None:
    schema = CuratorSchema("c", (_attr("x", 3),))
    with pytest.raises(UnknownCategoryError, match="x9"):
        schema.encode({"x": ["x0", "x9"]})
    with pytest.raises(UnknownCategoryError):
        schema.encode({"y": ["x0"]})
    with pytest.raises(UnknownCategoryError):
        Attribute("d", ("a", "a"))


def test_empty_domain() -> None:
    with pytest.raises(EmptyDomainError):
        Attribute("x", ())
    with pytest.raises(EmptyDomainError):
        CuratorSchema("c", ())
    with pytest.raises(EmptyDomainError):
        check_joint_alphabet([])
    with pytest.raises(EmptyDomainError):
        check_joint_alphabet([3, 0])


class _BigAttr:
    """Stand-in attribute with a huge domain (avoids building billions of labels)."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size


def test_alphabet_overflow_curator() -> None:
    # exactly 2**32 passes, 2**32 + 1 fails
    CuratorSchema("c", (_BigAttr("a", 2**16), _BigAttr("b", 2**16)))  # type: ignore[arg-type]
    with pytest.raises(AlphabetOverflowError):
        CuratorSchema("c", (_BigAttr("a", 2**32 + 1),))  # type: ignore[arg-type]
    assert check_joint_alphabet([MAX_CURATOR_ALPHABET]) == 2**32
    with pytest.raises(AlphabetOverflowError):
        check_joint_alphabet([MAX_CURATOR_ALPHABET + 1])


def test_alphabet_overflow_joint() -> None:
    assert check_joint_alphabet([2**31, 2**31]) == MAX_JOINT_ALPHABET
    with pytest.raises(AlphabetOverflowError):
        check_joint_alphabet([2**31, 2**31, 2])
    with pytest.raises(AlphabetOverflowError):
        check_joint_alphabet([2**32, 2**31])
    a = CuratorSchema("a", (_BigAttr("x", 2**32),))  # type: ignore[arg-type]
    b = CuratorSchema("b", (_BigAttr("y", 2**31),))  # type: ignore[arg-type]
    with pytest.raises(AlphabetOverflowError):
        JointSchema((a, b))


def test_symbol_out_of_range() -> None:
    assert check_symbols(np.array([0, 4]), 5).tolist() == [0, 4]
    with pytest.raises(SymbolOutOfRangeError):
        check_symbols(np.array([0, 5]), 5)
    with pytest.raises(SymbolOutOfRangeError):
        check_symbols(np.array([-1, 2]), 5)
    with pytest.raises(SymbolOutOfRangeError):
        check_symbols(np.array([0.5]), 5)
    schema = CuratorSchema("c", (_attr("x", 3),))
    with pytest.raises(SymbolOutOfRangeError):
        schema.decode(np.array([3]))


def test_duplicate_curator_names_are_a_named_error() -> None:
    from secure_release.mechanism.errors import DuplicateNameError
    from secure_release.mechanism.schema import Attribute, CuratorSchema, JointSchema

    a = CuratorSchema("alice", (Attribute("x", ("0", "1")),))
    with pytest.raises(DuplicateNameError, match="distinct"):
        JointSchema((a, a))
