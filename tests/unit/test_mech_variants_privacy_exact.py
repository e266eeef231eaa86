"""Theorem 3.2 by exact enumeration for the index-shared and server-sampled variants.

As tests/unit/test_mech_privacy_exact.py does for the seed variant: for every pair of neighbouring
databases and every output, the likelihood ratio is computed with exact rationals; the largest
must equal e^epsilon = 1 + (m/n)(gamma - 1).

- index sharing: the tuple distribution is not assumed but enumerated from the sampler itself
  (draw_index_tuple fed every finite stream of draws, conditioned on finishing within it);
- server sampling, positions path: the researcher sees (stored positions p, perturbed rows y);
  the stored order sigma is a uniform secret permutation, enumerated;
- server sampling, two releases from one stored table (positions path), binary joint alphabet
  (K = 2): given the revealed overlap o, the largest ratio equals
  server_sampling.overlap_likelihood_ratio, which exceeds the composed e^(eps1 + eps2) exactly
  when o > m1 m2 / n (K >= 3: tests/test_claims_overlap.py).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections import Counter
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest

from secure_release.mechanism.protocol.index_sharing import draw_index_tuple
from secure_release.mechanism.protocol.server_sampling import overlap_likelihood_ratio

Dist = dict[tuple[int, ...], Fraction]


def _channel(K: int, gamma: Fraction) -> list[list[Fraction]]:
    q = gamma + K - 1
    return [[gamma / q if i == j else 1 / q for j in range(K)] for i in range(K)]


class _ExhaustedError(Exception):
    pass


def _stream_source(stream: tuple[int, ...]) -> Callable[[int], np.ndarray]:
    at = [0]

    def draws(count: int) -> np.ndarray:
        if at[0] + count > len(stream):
            raise _ExhaustedError
        out = np.array(stream[at[0] : at[0] + count], dtype=np.int64)
        at[0] += count
        return out

    return draws


def _sampler_distribution(n: int, m: int, length: int) -> Dist:
    """P(tuple) of draw_index_tuple over all n^length equally likely draw streams (first-distinct
    path) or all key vectors in [0, length)^n (random-keys path), conditioned on finishing."""
    counts: Counter[tuple[int, ...]] = Counter()
    if 2 * m <= n:
        for stream in itertools.product(range(n), repeat=length):
            with contextlib.suppress(_ExhaustedError):
                counts[tuple(draw_index_tuple(n, m, draws=_stream_source(stream)).tolist())] += 1
    else:
        for keys in itertools.product(range(length), repeat=n):
            source = iter([np.array(keys, dtype=np.uint64)])

            def key_source(count: int, source=source) -> np.ndarray:  # type: ignore[no-untyped-def]
                try:
                    return next(source)
                except StopIteration:
                    raise _ExhaustedError from None

            with contextlib.suppress(_ExhaustedError):
                counts[tuple(draw_index_tuple(n, m, keys=key_source).tolist())] += 1
    total = sum(counts.values())
    return {t: Fraction(c, total) for t, c in counts.items()}


def _worst_ratio(n: int, K: int, prob: Callable[[tuple[int, ...]], Dist]) -> Fraction:
    dists = {x: prob(x) for x in itertools.product(range(K), repeat=n)}
    worst = Fraction(0)
    for x, px in dists.items():
        assert sum(px.values()) == 1
        for pos in range(n):
            for value in range(K):
                if value != x[pos]:
                    px2 = dists[(*x[:pos], value, *x[pos + 1 :])]
                    worst = max(worst, max(px[y] / px2[y] for y in px))
    return worst


@pytest.mark.parametrize("n,m,length", [(4, 2, 4), (5, 2, 4), (3, 3, 3), (4, 3, 4)])
def test_index_sampler_is_exactly_uniform(n: int, m: int, length: int) -> None:
    dist = _sampler_distribution(n, m, length)
    tuples = list(itertools.permutations(range(n), m))
    assert set(dist) == set(tuples)
    assert all(p == Fraction(1, len(tuples)) for p in dist.values())


@pytest.mark.parametrize("n,m,K,gamma,length", [(4, 2, 2, 3.0, 4), (3, 3, 2, 2.5, 3), (5, 2, 2, 4.0, 3)])
def test_index_shared_variant_epsilon(n: int, m: int, K: int, gamma: float, length: int) -> None:
    g = Fraction(gamma)
    A = _channel(K, g)
    tuple_dist = _sampler_distribution(n, m, length)

    def prob(x: tuple[int, ...]) -> Dist:
        out: Dist = {}
        for y in itertools.product(range(K), repeat=m):
            total = Fraction(0)
            for pi, p_pi in tuple_dist.items():
                term = p_pi
                for i, pos in enumerate(pi):
                    term *= A[x[pos]][y[i]]
                total += term
            out[y] = total
        return out

    assert _worst_ratio(n, K, prob) == 1 + Fraction(m, n) * (g - 1)


def _positions_path_prob(
    x: tuple[int, ...], n: int, K: int, releases: list[tuple[int, Fraction]]
) -> Dist:
    """P(p_1, y_1, ..., p_r, y_r | x): uniform secret sigma, independent uniform tuples p_t."""
    totals, weight = _positions_path_totals(x, n, K, releases)
    return {key: total * weight for key, total in totals.items()}


def _positions_path_totals(
    x: tuple[int, ...], n: int, K: int, releases: list[tuple[int, Fraction]]
) -> tuple[dict[tuple[int, ...], int], Fraction]:
    """:func:`_positions_path_prob` as integers and one weight, the same for every ``x``: each
    channel scaled to integers by the common denominator of its entries (exact, and ~10x sooner
    than summing Fractions)."""
    perms = list(itertools.permutations(range(n)))
    channels = [_channel(K, g) for _, g in releases]
    scales = [math.lcm(*(a.denominator for row in A for a in row)) for A in channels]
    integer = [[[int(a * d) for a in row] for row in A] for A, d in zip(channels, scales, strict=True)]
    tuple_sets = [list(itertools.permutations(range(n), m)) for m, _ in releases]
    weight = Fraction(1, len(perms))
    for ts, d, (m, _) in zip(tuple_sets, scales, releases, strict=True):
        weight /= len(ts) * d**m
    out: dict[tuple[int, ...], int] = {}
    for ps in itertools.product(*tuple_sets):
        for ys in itertools.product(*[itertools.product(range(K), repeat=m) for m, _ in releases]):
            total = 0
            for sigma in perms:
                term = 1
                for p, y, A in zip(ps, ys, integer, strict=True):
                    for pos, out_symbol in zip(p, y, strict=True):
                        term *= A[x[sigma[pos]]][out_symbol]
                total += term
            key = tuple(v for p, y in zip(ps, ys, strict=True) for v in (*p, -1, *y, -2))
            out[key] = total
    return out, weight


@pytest.mark.parametrize("n,m,K,gamma", [(3, 2, 2, 3.0), (4, 2, 2, 2.5), (3, 1, 3, 4.0)])
def test_server_sampled_positions_path_epsilon(n: int, m: int, K: int, gamma: float) -> None:
    g = Fraction(gamma)
    worst = _worst_ratio(n, K, lambda x: _positions_path_prob(x, n, K, [(m, g)]))
    assert worst == 1 + Fraction(m, n) * (g - 1)


def _split_by_overlap(n: int, K: int, releases: list[tuple[int, Fraction]]) -> dict[int, Fraction]:
    """The largest ratio among outputs whose two position tuples share o positions, per o."""
    # The weight of _positions_path_totals is the same for every x: a ratio of probabilities is
    # the ratio of the integer totals, compared by cross-multiplication and made a Fraction once.
    dists = {x: _positions_path_totals(x, n, K, releases)[0] for x in itertools.product(range(K), repeat=n)}
    overlap: dict[tuple[int, ...], int] = {}
    for key in next(iter(dists.values())):
        first = key[: key.index(-1)]
        rest = key[key.index(-2) + 1 :]
        second = rest[: rest.index(-1)]
        overlap[key] = len(set(first) & set(second))
    worst: dict[int, tuple[int, int]] = {}
    for x, px in dists.items():
        for pos in range(n):
            for value in range(K):
                if value == x[pos]:
                    continue
                px2 = dists[(*x[:pos], value, *x[pos + 1 :])]
                for key, p in px.items():
                    q, o = px2[key], overlap[key]
                    best = worst.get(o)
                    if best is None or p * best[1] > best[0] * q:
                        worst[o] = (p, q)
    return {o: Fraction(p, q) for o, (p, q) in worst.items()}


@pytest.mark.parametrize("n,m1,m2,K,g1,g2", [(3, 1, 1, 2, 3.0, 2.0), (3, 2, 1, 2, 2.0, 3.0), (3, 2, 2, 2, 3.0, 2.5)])
def test_two_releases_positions_path_overlap(n: int, m1: int, m2: int, K: int, g1: float, g2: float) -> None:
    r = [(m1, Fraction(g1)), (m2, Fraction(g2))]
    worst = _split_by_overlap(n, K, r)
    composed = (1 + Fraction(m1, n) * (r[0][1] - 1)) * (1 + Fraction(m2, n) * (r[1][1] - 1))
    assert set(worst) == set(range(max(0, m1 + m2 - n), min(m1, m2) + 1))
    for o, ratio in worst.items():
        assert ratio == overlap_likelihood_ratio(n, m1, g1, m2, g2, o, K)
        assert (ratio > composed) == (Fraction(o) > Fraction(m1 * m2, n))
