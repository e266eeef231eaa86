"""Alignment: AES-CMAC published vectors, keyed id tags, and the sort-merge alignment."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives import cmac
from cryptography.hazmat.primitives.ciphers import algorithms
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_release.mechanism.alignment.keyed_hash import (
    TAG_DTYPE,
    DuplicateIdError,
    aes_cmac,
    align,
    align_all,
    common_tags,
    id_bytes,
    id_tags,
)
from secure_release.mechanism.errors import ShapeMismatchError
from secure_release.mechanism.primitives.keys import AlignmentKey

# RFC 4493 section 4 (AES-128) and NIST SP 800-38B appendix D.3 (AES-256) examples.
_MSG = bytes.fromhex(
    "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51"
    "30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710"
)
AES128 = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
AES256 = bytes.fromhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
CMAC_VECTORS = [
    (AES128, 0, "bb1d6929e95937287fa37d129b756746"),
    (AES128, 16, "070a16b46b4d4144f79bdd9dd04a287c"),
    (AES128, 40, "dfa66747de9ae63030ca32611497c827"),
    (AES128, 64, "51f0bebf7e3b9d92fc49741779363cfe"),
    (AES256, 0, "028962f61b7bf89efc6b551f4667d983"),
    (AES256, 16, "28a7023f452e8f82bd4bf28d8c37c35c"),
    (AES256, 40, "aaf3d8f1de5640c232f5b169b9c911e6"),
    (AES256, 64, "e1992190549f6ed5696a2c056c315410"),
]


def test_cmac_published_vectors_all_in_one_call() -> None:
    # all eight messages at once, mixed block counts, exercise the column-wise grouping
    for key in (AES128, AES256):
        cases = [(n, tag) for k, n, tag in CMAC_VECTORS if k == key]
        lengths = np.array([n for n, _ in cases])
        matrix = np.tile(np.frombuffer(_MSG, dtype=np.uint8), (len(cases), 1))
        matrix[np.arange(matrix.shape[1])[None, :] >= lengths[:, None]] = 0  # zero-filled rows
        got = aes_cmac(key, matrix, lengths)
        assert [row.tobytes().hex() for row in got] == [tag for _, tag in cases]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=70), min_size=1, max_size=12), st.binary(min_size=32, max_size=32))
def test_cmac_matches_cryptography_reference(messages: list[bytes], key: bytes) -> None:
    width = max(1, max(len(m) for m in messages))
    matrix = np.zeros((len(messages), width), dtype=np.uint8)
    for i, m in enumerate(messages):
        matrix[i, : len(m)] = np.frombuffer(m, dtype=np.uint8)
    got = aes_cmac(key, matrix, np.array([len(m) for m in messages]))
    for row, m in zip(got, messages, strict=True):
        ref = cmac.CMAC(algorithms.AES(key))
        ref.update(m)
        assert row.tobytes() == ref.finalize()


# Pinned tags of this scheme (AES-256-CMAC under HKDF(key 00..1f, "alignment-cmac")); any change
# to the tag rule breaks agreement between curators running different versions.
def test_id_tag_is_cmac_of_utf8_under_derived_key() -> None:
    key = AlignmentKey(bytes(range(32)))
    derived = key.derive("alignment-cmac")
    for text in ["x", "alice", "ü-unicode", "0123456789abcdef", "a" * 40, ""]:
        ref = cmac.CMAC(algorithms.AES(derived))
        ref.update(text.encode())
        assert id_tags(np.array([text]), key).tobytes() == ref.finalize()


def test_integer_ids_hash_as_their_decimal_text() -> None:
    key = AlignmentKey(bytes(32))
    ints = np.array([0, 7, 123456789012345, -5], dtype=np.int64)
    assert np.array_equal(id_tags(ints, key), id_tags(np.array(["0", "7", "123456789012345", "-5"]), key))
    matrix, lengths = id_bytes(np.array([123], dtype=np.uint32))
    assert lengths.tolist() == [3] and matrix[0, :3].tobytes() == b"123"


def test_non_ascii_and_bytes_inputs_agree() -> None:
    key = AlignmentKey(bytes(32))
    text = np.array(["ü-unicode", "plain", "日本"])
    raw = np.array([t.encode() for t in text.tolist()])
    assert np.array_equal(id_tags(text, key), id_tags(raw, key))
    assert np.array_equal(id_tags(text.tolist(), key), id_tags(text, key))
    with pytest.raises(ShapeMismatchError):
        id_tags(np.array([1.5]), key)


def test_id_tags_alignment() -> None:
    key = AlignmentKey(bytes(range(32)))
    a = np.array(["x", "alice", "bob", "ü-unicode", "carol"])
    b = np.array(["carol", "bob", "zed", "x"])
    ta, tb = id_tags(a, key), id_tags(b, key)
    assert ta.dtype == TAG_DTYPE
    assert ta[2] == tb[1] and ta[0] == tb[3]
    assert id_tags(a, AlignmentKey(bytes(32)))[0] != ta[0]
    agreed = common_tags([ta, tb])
    al_a, al_b = align(ta, agreed), align(tb, agreed)
    assert al_a.num_matched == 3 and al_a.num_unmatched == 2 and al_b.num_unmatched == 1
    assert a[al_a.row_order].tolist() == b[al_b.row_order].tolist()
    assert sorted(a[al_a.row_order].tolist()) == ["bob", "carol", "x"]
    with pytest.raises(DuplicateIdError):
        align(id_tags(np.array(["x", "x"]), key), agreed)
    with pytest.raises(ShapeMismatchError):
        align(id_tags(np.array(["x"]), key), agreed)


def _tags(pairs: list[tuple[int, int]]) -> np.ndarray:
    out = np.empty(len(pairs), dtype=TAG_DTYPE)
    out["hi"] = [h for h, _ in pairs]
    out["lo"] = [lo for _, lo in pairs]
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), min_size=0, max_size=25, unique=True),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), min_size=0, max_size=25, unique=True),
    st.sampled_from([0, 2**63 - 1, 2**63, 2**64 - 4]),
)
def test_sort_merge_exact_with_tied_high_words(a: list[tuple[int, int]], b: list[tuple[int, int]], base: int) -> None:
    # tiny high-word range: ties in hi are everywhere, so the lo tie-break path is exercised;
    # base near 2^63 checks the unsigned order across the sign bit
    a = [(base + h, lo) for h, lo in a]
    b = [(base + h, lo) for h, lo in b]
    ta, tb = _tags(a), _tags(b)
    agreed = common_tags([ta, tb])
    expected = sorted(set(a) & set(b))
    assert list(zip(agreed["hi"].tolist(), agreed["lo"].tolist(), strict=True)) == expected
    for tags, pairs in ((ta, a), (tb, b)):
        rows = align(tags, agreed).row_order
        assert [pairs[r] for r in rows.tolist()] == expected


@pytest.mark.parametrize("tied_share", [0.0, 0.01, 0.5])
def test_many_tied_prefixes_take_the_exact_path_and_agree_with_set_intersection(tied_share: float) -> None:
    # n = 40,000 uses 16 row bits, so ids whose hi words differ only in their low 17 bits tie
    # on the prefix; a share of them forces thousands of exact matches (both insert branches)
    rng = np.random.default_rng(5)
    n = 40_000
    hi = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    tied = rng.random(n) < tied_share
    hi[tied] = hi[np.flatnonzero(tied) // 2 * 2] ^ rng.integers(1, 1 << 16, size=int(tied.sum()), dtype=np.uint64)
    lo = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64)
    pairs = list(zip(hi.tolist(), lo.tolist(), strict=True))
    a = [pairs[i] for i in rng.permutation(n)[: 3 * n // 4]]
    b = [pairs[i] for i in rng.permutation(n)[: 3 * n // 4]]
    ta, tb = _tags(a), _tags(b)
    expected = sorted(set(a) & set(b))
    agreed, (al_a, al_b) = align_all([ta, tb])
    assert list(zip(agreed["hi"].tolist(), agreed["lo"].tolist(), strict=True)) == expected
    assert [a[r] for r in al_a.row_order.tolist()] == expected
    assert [b[r] for r in al_b.row_order.tolist()] == expected
