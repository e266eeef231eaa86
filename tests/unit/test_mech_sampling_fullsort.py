"""The one-sort sampling path (m close to n) orders positions exactly by (r_i, i), ties included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_release.mechanism.primitives.sampling import _all_positions_ordered, sorted_by_key


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**12)), min_size=1, max_size=60))
def test_all_positions_exact_when_top_bits_tie(pairs: list[tuple[int, int]]) -> None:
    # only 4 distinct top values plus low noise: the packed top bits tie in long runs
    keys = np.array([(top << 62) | low for top, low in pairs], dtype=np.uint64)
    expected = [i for _, i in sorted((int(k), i) for i, k in enumerate(keys.tolist()))]
    assert _all_positions_ordered(keys.copy()).tolist() == expected
    assert np.array_equal(keys, np.array([(top << 62) | low for top, low in pairs], dtype=np.uint64))


def test_all_positions_matches_sorted_by_key_at_scale() -> None:
    keys = np.random.default_rng(5).integers(0, 2**64, 300_000, dtype=np.uint64)
    keys[1000:1010] = keys[5]  # equal keys: index order
    assert np.array_equal(_all_positions_ordered(keys), sorted_by_key(keys, np.arange(keys.size, dtype=np.int64)))
