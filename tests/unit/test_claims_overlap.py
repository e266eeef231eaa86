# tier: unit
"""Issue 23, item 2: the positions-path overlap analysis, exactly as far as it holds.

By exact enumeration (uniform secret stored order, every sample tuple, every output; rationals)
the worst likelihood ratio given a revealed overlap o of two releases is:
- K = 2: ``server_sampling.overlap_likelihood_ratio`` exactly, for every o;
- K = 3 and 4: larger than that formula (so the formula is not a bound), and above the composed
  e^(eps1 + eps2) even for an overlap below its mean m1 m2 / n.
So the function refuses K != 2 and the positions path is not public
(``variants.run_server_sampled_release`` refuses it), as its docstring and docs/architectures.md
say.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from test_mech_protocol import _tables
from test_mech_variants_privacy_exact import _split_by_overlap

from secure_release.mechanism.protocol.architectures import StoredRelease, run_server_sampled_release
from secure_release.mechanism.protocol.server_sampling import (
    PositionsPathError,
    UnprovedBoundError,
    overlap_likelihood_ratio,
)


def _composed(n: int, m1: int, g1: Fraction, m2: int, g2: Fraction) -> Fraction:
    return (1 + Fraction(m1, n) * (g1 - 1)) * (1 + Fraction(m2, n) * (g2 - 1))


@pytest.mark.parametrize("n,m1,m2,g1,g2", [(3, 2, 2, 5, 5), (3, 1, 1, 3, 2), (3, 2, 1, 2, 3)])
def test_k2_the_formula_is_the_enumerated_worst_ratio(n: int, m1: int, m2: int, g1: int, g2: int) -> None:
    worst = _split_by_overlap(n, 2, [(m1, Fraction(g1)), (m2, Fraction(g2))])
    for o, ratio in worst.items():
        assert ratio == overlap_likelihood_ratio(n, m1, g1, m2, g2, o, 2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "n,m1,m2,K,g1,g2,o,enumerated,formula",
    [
        (3, 2, 2, 3, 5, 5, 1, Fraction(127, 7), Fraction(35, 3)),  # the audit's case (~2 s)
        (3, 2, 1, 4, 4, 3, 1, Fraction(53, 9), Fraction(17, 3)),  # (~2 s)
    ],
)
def test_k3_k4_the_formula_is_exceeded(
    n: int, m1: int, m2: int, K: int, g1: int, g2: int, o: int, enumerated: Fraction, formula: Fraction
) -> None:
    worst = _split_by_overlap(n, K, [(m1, Fraction(g1)), (m2, Fraction(g2))])
    assert worst[o] == enumerated > formula == overlap_likelihood_ratio(n, m1, g1, m2, g2, o, 2)
    if K == 3:  # above the composed loss although the overlap is below its mean
        assert Fraction(o) < Fraction(m1 * m2, n) and worst[o] > _composed(n, m1, Fraction(g1), m2, Fraction(g2))
    with pytest.raises(UnprovedBoundError):
        overlap_likelihood_ratio(n, m1, g1, m2, g2, o, K)


def test_the_positions_path_is_not_public() -> None:
    with pytest.raises(PositionsPathError):
        run_server_sampled_release(list(_tables()), [StoredRelease("r1", 1.0, 10)], key_path="positions")
    out = run_server_sampled_release(list(_tables()), [StoredRelease("r1", 1.0, 10)])
    assert out.key_path.value == "rekeyed" and np.isfinite(out.releases[0].sample_type).all()
