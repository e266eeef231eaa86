"""Alignment kernels: tags hashed from Arrow buffers equal the AES-CMAC reference on every layout
path, and the sort-merge matching is exact under prefix ties, repeats and any list order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives import cmac
from cryptography.hazmat.primitives.ciphers import algorithms
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_release.mechanism.alignment.keyed_hash import (
    TAG_DTYPE,
    DuplicateIdError,
    align,
    align_all,
    common_tags,
    id_tags,
)
from secure_release.mechanism.errors import ShapeMismatchError
from secure_release.mechanism.primitives.keys import AlignmentKey

KEY = AlignmentKey(bytes(range(32)))


def _reference(values: list[bytes]) -> list[bytes]:
    derived = KEY.derive("alignment-cmac")
    out = []
    for v in values:
        mac = cmac.CMAC(algorithms.AES(derived))
        mac.update(v)
        out.append(mac.finalize())
    return out


def _tags_bytes(tags: np.ndarray) -> list[bytes]:
    return [tags[i : i + 1].tobytes() for i in range(tags.size)]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=40), st.integers(0, 5), st.data())
def test_arrow_binary_tags_match_reference_on_every_path(values: list[bytes], cut: int, data: st.DataObject) -> None:
    # mixed lengths (gather path), and a slice with a non-zero offset
    arr = pa.array(values, pa.binary())
    assert _tags_bytes(id_tags(arr, KEY)) == _reference(values)
    start = min(cut, len(values) - 1)
    part = arr.slice(start)
    assert _tags_bytes(id_tags(part, KEY)) == _reference(values[start:])
    large = pa.array(values, pa.large_binary())
    assert _tags_bytes(id_tags(large, KEY)) == _reference(values)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 11, 12, 13, 15, 16, 17, 31, 32, 33])
def test_fixed_length_and_inline_paths(length: int) -> None:
    rng = np.random.default_rng(length)
    values = [bytes(rng.integers(1, 256, length, dtype=np.uint8)) for _ in range(300)]
    assert _tags_bytes(id_tags(pa.array(values, pa.binary()), KEY)) == _reference(values)  # one length
    mixed = [v[: (i % (length + 1))] for i, v in enumerate(values)]  # lengths 0..length: inline if <= 12
    assert _tags_bytes(id_tags(pa.array(mixed, pa.binary()), KEY)) == _reference(mixed)
    sliced = pa.array(mixed, pa.binary()).slice(5, 200)
    assert _tags_bytes(id_tags(sliced, KEY)) == _reference(mixed[5:205])


def test_arrow_paths_cross_chunk_boundaries() -> None:
    # more rows than one processing step (2^16) on the inline and the fixed-stride paths
    n = 70_000
    text = np.char.add("id", np.arange(n).astype(str))  # 3..7 bytes: inline path
    fixed = np.char.zfill(np.arange(n).astype(str), 9)  # 9 bytes each: fixed-stride path
    for ids in (text, fixed):
        got = id_tags(pa.array(ids), KEY)
        assert np.array_equal(got, id_tags(ids, KEY))
        sample = np.arange(0, n, 997)
        assert _tags_bytes(got[sample]) == _reference([ids[i].encode() for i in sample])


def test_arrow_text_integers_chunked_and_null() -> None:
    text = ["x", "alice", "ü-unicode", "0123456789abcdef", "a" * 40, "日本"]
    want = id_tags(np.array(text), KEY)
    assert np.array_equal(id_tags(pa.array(text), KEY), want)
    assert np.array_equal(id_tags(pa.array(text, pa.large_string()), KEY), want)
    assert np.array_equal(id_tags(pa.chunked_array([text[:2], text[2:]]), KEY), want)
    assert np.array_equal(id_tags(pa.array(text, pa.string_view()), KEY), want)
    ints = [0, 7, 123456789012345, -5]
    assert np.array_equal(id_tags(pa.array(ints, pa.int64()), KEY), id_tags(np.array(ints), KEY))
    assert id_tags(pa.array([], pa.string()), KEY).size == 0
    with pytest.raises(ShapeMismatchError, match="null"):
        id_tags(pa.array(["a", None]), KEY)
    with pytest.raises(ShapeMismatchError):
        id_tags(pa.array([1.5]), KEY)


def _tags(pairs: list[tuple[int, int]]) -> np.ndarray:
    out = np.empty(len(pairs), dtype=TAG_DTYPE)
    out["hi"] = [h for h, _ in pairs]
    out["lo"] = [lo for _, lo in pairs]
    return out


_WORD = st.tuples(st.integers(0, 3), st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_WORD, max_size=20), min_size=1, max_size=4), st.sampled_from([0, 2**63 - 8, 2**64 - 4]))
def test_match_exact_for_any_number_of_lists_with_repeats(lists: list[list[tuple[int, int]]], base: int) -> None:
    # hi words from a tiny range: packed prefixes tie everywhere, and lists may repeat a tag
    shifted = [[(base + h, lo) for h, lo in pairs] for pairs in lists]
    tag_lists = [_tags(pairs) for pairs in shifted]
    expected = sorted(set.intersection(*(set(p) for p in shifted)))
    agreed = common_tags(tag_lists)
    assert list(zip(agreed["hi"].tolist(), agreed["lo"].tolist(), strict=True)) == expected
    repeats = [any(p.count(t) > 1 for t in expected) for p in shifted]
    if any(repeats):
        with pytest.raises(DuplicateIdError):
            align_all(tag_lists)
    else:
        got, alignments = align_all(tag_lists)
        assert np.array_equal(got, agreed)
        for pairs, tags, a in zip(shifted, tag_lists, alignments, strict=True):
            assert [pairs[r] for r in a.row_order.tolist()] == expected
            assert np.array_equal(align(tags, agreed).row_order, a.row_order)


def test_match_large_lists_with_forced_prefix_ties() -> None:
    # 200 000 random tags per list plus tags that share the top 44 bits of hi with others
    rng = np.random.default_rng(7)
    hi = rng.integers(0, 2**63, 200_000, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    lo = rng.integers(0, 2**63, 200_000, dtype=np.int64).astype(np.uint64)
    twins_hi = hi[:50] ^ np.uint64(1)  # same prefix, different tag
    a = _tags(list(zip(hi.tolist() + twins_hi.tolist(), lo.tolist() + lo[:50].tolist(), strict=True)))
    keep = rng.permutation(200_000)[:120_000]
    b_pairs = list(zip(hi[keep].tolist(), lo[keep].tolist(), strict=True)) + list(
        zip(twins_hi[:20].tolist(), lo[:20].tolist(), strict=True))
    b = _tags([b_pairs[i] for i in rng.permutation(len(b_pairs))])
    expected = sorted(set(zip(a["hi"].tolist(), a["lo"].tolist(), strict=True))
                      & set(zip(b["hi"].tolist(), b["lo"].tolist(), strict=True)))
    agreed, (al_a, al_b) = align_all([a, b])
    assert list(zip(agreed["hi"].tolist(), agreed["lo"].tolist(), strict=True)) == expected
    assert np.array_equal(a[al_a.row_order], agreed) and np.array_equal(b[al_b.row_order], agreed)
    assert np.array_equal(align(b, agreed).row_order, al_b.row_order)


def test_align_follows_an_agreed_list_in_any_order_and_refuses_bad_ones() -> None:
    ids_a = np.array(["x", "alice", "bob", "carol", "dan"])
    ta = id_tags(ids_a, KEY)
    agreed = common_tags([ta, id_tags(np.array(["carol", "bob", "x"]), KEY)])
    shuffled = agreed[::-1].copy()
    rows = align(ta, shuffled).row_order
    assert np.array_equal(ta[rows], shuffled)
    with pytest.raises(ShapeMismatchError):
        align(ta, np.concatenate([agreed, agreed[:1]]))  # agreed repeats a tag
    with pytest.raises(ShapeMismatchError):
        align(id_tags(np.array(["x"]), KEY), agreed)
    with pytest.raises(DuplicateIdError):
        align(id_tags(np.array(["x", "bob", "carol", "x"]), KEY), agreed)
    # a repeat outside the agreed set cannot change the alignment and is not an error here
    extra = id_tags(np.array(["x", "bob", "carol", "zed", "zed"]), KEY)
    assert np.array_equal(extra[align(extra, agreed).row_order], agreed)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1 << 20])
def test_the_chunked_steps_equal_the_whole_array_ones(step: int) -> None:
    from secure_release.mechanism.alignment.keyed_hash import _equal_neighbours, _join_prefixes

    rng = np.random.default_rng(step)
    values = np.sort(rng.integers(0, 1 << 20, 200, dtype=np.int64))  # many equal neighbours after >> 4
    shift = np.int64(4)
    key = values >> shift
    assert np.array_equal(_equal_neighbours(values, shift, step), np.flatnonzero(key[1:] == key[:-1]))
    # the join: packs = (unique prefix << 11) | row; 60 prefixes shared, of which 20 with other tags
    bits, row_mask = 10, np.int64((1 << 10) - 1)
    prefixes = rng.choice(1 << 30, 200, replace=False).astype(np.int64)
    left_prefix, right_prefix = prefixes[:100], np.concatenate([prefixes[:60], prefixes[100:140]])
    left_tags = rng.integers(0, 1 << 62, (100, 2), dtype=np.int64).view(np.uint64).view("V16").reshape(-1)
    right_tags = rng.integers(0, 1 << 62, (100, 2), dtype=np.int64).view(np.uint64).view("V16").reshape(-1)
    right_tags[:40] = left_tags[:40]  # same prefix and same tag: a match; rows 40..59 differ in the tag
    left_rows, right_rows = rng.permutation(100), rng.permutation(100)
    left = np.sort((left_prefix << (bits + 1)) | left_rows)
    right = np.sort((right_prefix << (bits + 1)) | right_rows)
    shuffled_left = np.empty_like(left_tags)
    shuffled_left[left_rows] = left_tags
    shuffled_right = np.empty_like(right_tags)
    shuffled_right[right_rows] = right_tags
    mine, theirs = _join_prefixes(left, right, np.int64(bits + 1), row_mask, shuffled_left, shuffled_right, None, step)
    expected = np.sort((left_prefix[:40] << (bits + 1)) | left_rows[:40])
    assert np.array_equal(mine, expected)
    assert np.array_equal(shuffled_left[mine & row_mask], shuffled_right[theirs])
    assert theirs.size == 40


def test_align_with_tags_sorted_ahead_equals_align() -> None:
    from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, align, common_tags, sort_tags

    rng = np.random.default_rng(11)
    own = np.zeros(5000, dtype=TAG_DTYPE)
    own["hi"] = rng.integers(0, 1 << 40, own.size).astype(np.uint64) << np.uint64(20)  # shared prefixes
    own["lo"] = rng.integers(0, 1 << 63, own.size).astype(np.uint64)
    other = own[rng.permutation(own.size)[:3000]].copy()
    agreed = common_tags([own, other])
    plain = align(own, agreed)
    ahead = align(own, agreed, sort_tags(own))
    assert np.array_equal(plain.row_order, ahead.row_order) and ahead.num_matched == 3000
    stranger = sort_tags(own.copy())  # sorted from another array: not used, same result
    assert np.array_equal(align(own, agreed, stranger).row_order, plain.row_order)
    from secure_release.mechanism.alignment.keyed_hash import align_all

    common, rows = align_all([own, other])
    common_ahead, rows_ahead = align_all([own, other], sort_tags(own))
    assert np.array_equal(common, common_ahead) and np.array_equal(common, agreed)
    assert all(np.array_equal(a.row_order, b.row_order) for a, b in zip(rows, rows_ahead, strict=True))
    assert np.array_equal(rows[0].row_order, plain.row_order)
