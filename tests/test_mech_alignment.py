"""Alignment: SipHash-2-4 reference vectors and keyed id tags."""

from __future__ import annotations

import numpy as np
import pytest

from secure_release.mechanism.alignment import DuplicateIdError, align, common_tags, id_tags, siphash24
from secure_release.mechanism.keys import AlignmentKey

# External reference vectors: Aumasson & Bernstein, SipHash paper / reference implementation,
# key 00..0f, message 00..(len-1).
SIPHASH_VECTORS = [(0, 0x726FDB47DD0E0E31), (8, 0x93F5F5799A932462), (15, 0xA129CA6149BE45E5)]


@pytest.mark.parametrize("length,expected", SIPHASH_VECTORS)
def test_siphash_reference_vectors(length: int, expected: int) -> None:
    msg = np.arange(16, dtype=np.uint8)[None, :]
    assert int(siphash24(bytes(range(16)), msg, length)[0]) == expected
    # vectorized: many identical rows give the same value
    many = np.repeat(msg, 5, axis=0)
    assert np.all(siphash24(bytes(range(16)), many, length) == np.uint64(expected))


def test_id_tags_alignment() -> None:
    key = AlignmentKey(bytes(range(32)))
    a = np.array(["x", "alice", "bob", "ü-unicode", "carol"])
    b = np.array(["carol", "bob", "zed", "x"])
    ta, tb = id_tags(a, key), id_tags(b, key)
    assert ta[2] == tb[1] and ta[0] == tb[3]
    assert id_tags(a, AlignmentKey(bytes(32)))[0] != ta[0]
    agreed = common_tags([ta, tb])
    al_a, al_b = align(ta, agreed), align(tb, agreed)
    assert al_a.num_matched == 3 and al_a.num_unmatched == 2 and al_b.num_unmatched == 1
    assert a[al_a.row_order].tolist() == b[al_b.row_order].tolist()
    assert sorted(a[al_a.row_order].tolist()) == ["bob", "carol", "x"]
    with pytest.raises(DuplicateIdError):
        align(id_tags(np.array(["x", "x"]), key), agreed)
