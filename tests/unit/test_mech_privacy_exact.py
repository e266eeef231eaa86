"""Theorem 3.2 checked exactly by enumeration: sampling (uniform ordered m-tuple) + PRAM.

For every pair of neighbouring databases (Hamming distance 1) and every output sequence,
P(y | x) = (1/#tuples) sum_pi prod_i A[x_pi(i), y_i] is computed with exact rationals. The
largest likelihood ratio must equal e^epsilon = 1 + (m/n)(gamma - 1) and be attained on the
paper's Example 3.3.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy.accounting import epsilon_from_gamma, gamma_from_epsilon

CASES = [
    (3, 2, 2, 3.0),
    (4, 2, 3, 2.5),
    (5, 3, 2, 4.0),
    (3, 3, 3, 2.0),
    (4, 1, 4, 7.0),
    (5, 2, 2, 1.5),
]


def _output_distributions(n: int, m: int, K: int, gamma: Fraction) -> dict[tuple[int, ...], dict]:
    q = gamma + K - 1
    A = [[gamma / q if i == j else 1 / q for j in range(K)] for i in range(K)]
    tuples = list(itertools.permutations(range(n), m))
    outputs = list(itertools.product(range(K), repeat=m))
    dists = {}
    for x in itertools.product(range(K), repeat=n):
        dist = {}
        for y in outputs:
            total = Fraction(0)
            for pi in tuples:
                p = Fraction(1)
                for i, pos in enumerate(pi):
                    p *= A[x[pos]][y[i]]
                total += p
            dist[y] = total / len(tuples)
        assert sum(dist.values()) == 1
        dists[x] = dist
    return dists


@pytest.mark.parametrize("n,m,K,gamma", CASES)
def test_max_likelihood_ratio_is_exactly_e_epsilon(n: int, m: int, K: int, gamma: float) -> None:
    g = Fraction(gamma)
    ch = PramChannel(gamma, K)
    q = g + K - 1
    assert math.isclose(ch.diagonal, float(g / q), rel_tol=1e-15)
    assert math.isclose(ch.off_diagonal, float(1 / q), rel_tol=1e-15)
    dists = _output_distributions(n, m, K, g)
    worst = Fraction(0)
    for x, px in dists.items():
        for pos in range(n):
            for value in range(K):
                if value == x[pos]:
                    continue
                x2 = (*x[:pos], value, *x[pos + 1 :])
                px2 = dists[x2]
                worst = max(worst, max(px[y] / px2[y] for y in px))
    claimed = 1 + Fraction(m, n) * (g - 1)
    assert worst == claimed  # exact, over rationals
    assert abs(math.exp(epsilon_from_gamma(n, m, gamma)) - float(worst)) < 1e-12
    # Example 3.3: x = (b, a, ..., a), x' = (a, ..., a), output (b, ..., b) attains it
    a, b = 0, 1
    x = (b,) + (a,) * (n - 1)
    x_prime = (a,) * n
    y = (b,) * m
    assert dists[x][y] / dists[x_prime][y] == claimed


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6), st.data(), st.floats(1.0001, 1e6))
def test_gamma_from_epsilon_inverts_epsilon_from_gamma(
    n: int, data: st.DataObject, gamma: float
) -> None:
    m = data.draw(st.integers(1, n))
    eps = epsilon_from_gamma(n, m, gamma)
    assert eps > 0
    assert math.isclose(gamma_from_epsilon(n, m, eps), gamma, rel_tol=1e-9)
    assert math.isclose(epsilon_from_gamma(n, m, gamma_from_epsilon(n, m, eps)), eps, rel_tol=1e-9)


def test_plain_pram_is_ln_gamma() -> None:
    # OpenDP-style exact boundary: m = n is plain PRAM, epsilon = ln gamma
    for n in (1, 2, 45222):
        assert abs(epsilon_from_gamma(n, n, 9.0) - math.log(9)) <= 1e-15
        assert abs(gamma_from_epsilon(n, n, math.log(9)) - 9.0) <= 1e-14
    assert epsilon_from_gamma(10, 10, 9.0) > math.log(8.99999)
    assert epsilon_from_gamma(10, 10, 8.99999) < math.log(9)
