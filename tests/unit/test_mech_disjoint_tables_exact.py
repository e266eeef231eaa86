"""Eq. (T1) of docs/privacy.md ("A release of several tables from disjoint samples") checked
exactly by enumeration, and mechanism.privacy.disjoint_tables against it.

The mechanism enumerated: a uniform ordered tuple of M = sum_t m_t distinct positions of n records;
slots 0..m_1-1 are group 1, the next m_2 group 2, ...; the record at a slot of group t is projected
on table t's attributes and goes through gamma_t-diagonal PRAM on table t's joint. For every
database (every record value at every position), every replace-one neighbour (every position,
every other value) and every output, the likelihood ratio is compared with the bound in integers:
gamma_t = a_t/b_t makes every PRAM entry proportional to a_t (kept) or b_t (changed), with a
normalising factor that is the same for every database, so each likelihood is an integer sum over
tuples and the ratio an exact rational. The largest ratio is never above e^epsilon of Eq. (T1),
and equals it exactly in the cases where a maximizing subset S is realised by three records
(``_realisable``): here tables with disjoint attribute sets (A, B; A, B, C; ternary A, B), and
(A, AB) at gamma = (2, 4); it is strictly below in the others listed ((A, AB), (A, AB, BC),
(AB, BC, AC) when the maximizer pushes A up but AB down).
"""

from __future__ import annotations

import itertools
import math
import random
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_release.mechanism.errors import (
    InvalidEpsilonError,
    InvalidGammaError,
    InvalidSampleSizeError,
    NonFiniteInputError,
    ShapeMismatchError,
)
from secure_release.mechanism.privacy.accounting import epsilon_from_gamma, gamma_from_epsilon
from secure_release.mechanism.privacy.disjoint_tables import (
    gammas_for_epsilon,
    release_epsilon,
    sequential_epsilon,
    subset_bound_base,
    subset_bound_epsilon,
    worst_subset,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "privacy.md"
A, B, C = 0, 1, 2
# (n, attribute sizes of a record, tables as attribute tuples, m_t, gamma_t, tight)
CASES = [
    (3, (2, 2), ((A,), (B,)), (1, 1), (4.0, 2.0), True),  # the example: naive 0.8473 < 0.8755
    (4, (2, 2), ((A,), (B,)), (1, 1), (4.0, 2.0), True),  # two maximizers: S = {A} and {A, B}
    (4, (2, 2), ((A,), (B,)), (2, 1), (3.0, 1.5), True),
    (3, (2, 2), ((A,), (B,)), (2, 1), (4.0, 2.0), True),  # sum m_t = n: q_0 = 0
    (5, (2, 2), ((A,), (B,)), (2, 2), (2.0, 1.25), True),
    (3, (3, 3), ((A,), (B,)), (1, 1), (4.0, 2.0), True),  # ternary
    (3, (2, 2), ((A,), (A, B)), (1, 1), (2.0, 4.0), True),  # overlapping, S = {AB}: realisable
    (3, (2, 2), ((A,), (A, B)), (1, 1), (4.0, 2.0), False),  # S = {A}: not realisable
    (4, (2, 2), ((A,), (A, B)), (1, 2), (8.0, 1.5), False),
    (3, (3, 2), ((A,), (A, B)), (1, 1), (4.0, 1.25), False),
    (4, (2, 2, 2), ((A,), (B,), (C,)), (1, 1, 1), (4.0, 2.0, 1.5), True),
    (5, (2, 2, 2), ((A,), (B,), (C,)), (1, 1, 1), (8.0, 2.0, 1.25), True),
    (4, (2, 2, 2), ((A,), (A, B), (B, C)), (1, 1, 1), (4.0, 2.0, 1.5), False),
    (4, (2, 2, 2), ((A, B), (B, C), (A, C)), (1, 1, 1), (4.0, 1.25, 1.25), False),
]


def _projections(attrs: tuple[int, ...], tables: tuple[tuple[int, ...], ...]) -> list[npt.NDArray[np.int64]]:
    """For each table, the code in [0, K_t) of every record value's table-t part."""
    records = list(itertools.product(*(range(a) for a in attrs)))
    out = []
    for table in tables:
        codes = {part: k for k, part in enumerate(itertools.product(*(range(attrs[i]) for i in table)))}
        out.append(np.array([codes[tuple(r[i] for i in table)] for r in records], dtype=np.int64))
    return out


def _likelihoods(
    n: int,
    attrs: tuple[int, ...],
    tables: tuple[tuple[int, ...], ...],
    sizes: tuple[int, ...],
    gammas: tuple[float, ...],
) -> npt.NDArray[np.int64]:
    """L[x, y] proportional to P(y | x) (one factor for all x), x indexed by sum_i x_i V^(n-1-i)."""
    proj = _projections(attrs, tables)
    weights = []
    for table, gamma in zip(proj, gammas, strict=True):
        g, K = Fraction(gamma), int(table.max()) + 1
        weights.append(
            np.full((K, K), g.denominator, dtype=np.int64) + (g.numerator - g.denominator) * np.eye(K, dtype=np.int64)
        )
    slots = [t for t, m in enumerate(sizes) for _ in range(m)]
    tuples = np.array(list(itertools.permutations(range(n), len(slots))), dtype=np.int64)
    V = math.prod(attrs)
    X = np.array(list(itertools.product(range(V), repeat=n)), dtype=np.int64)
    out = []
    for chunk in np.array_split(X, max(1, len(X) // 256)):
        G: npt.NDArray[np.int64] | None = None
        for s, t in enumerate(slots):
            F = weights[t][proj[t][chunk[:, tuples[:, s]]]]  # (databases, tuples, K_t)
            G = F if G is None else (G[:, :, :, None] * F[:, :, None, :]).reshape(len(chunk), len(tuples), -1)
        assert G is not None
        out.append(G.sum(axis=1))
    return np.concatenate(out)


def _worst_ratio(n: int, V: int, L: npt.NDArray[np.int64], bound: Fraction) -> tuple[Fraction, bool]:
    """(the largest P(y|x)/P(y|x') over neighbours and outputs, exactly; is every ratio <= bound).

    The bound is checked on every entry in integers; the maximum is found among the entries whose
    float ratio is within 1e-12 of the float maximum (the floats of these integers are exact and
    one division errs by 2^-53 at most, so every true maximum is among them), then in Fractions."""
    assert int(L.max()) * max(bound.numerator, bound.denominator) < 2**62  # no int64 overflow
    X = np.array(list(itertools.product(range(V), repeat=n)), dtype=np.int64)
    index = np.arange(len(X))
    within, pairs, top = True, [], 0.0
    for j in range(n):
        for shift in range(1, V):
            other = index + ((X[:, j] + shift) % V - X[:, j]) * V ** (n - 1 - j)
            within &= bool(np.all(L * bound.denominator <= bound.numerator * L[other]))
            ratio = L / L[other]
            pairs.append((other, ratio))
            top = max(top, float(ratio.max()))
    worst = Fraction(0)
    for other, ratio in pairs:
        for x, y in zip(*np.nonzero(ratio >= top * (1 - 1e-12)), strict=True):
            worst = max(worst, Fraction(int(L[x, y]), int(L[other[x], y])))
    return worst, within


def _brute_force_base(n: int, sizes: tuple[int, ...], gammas: tuple[float, ...]) -> Fraction:
    """Eq. (T1) read literally: the max over all 2^T subsets, in Fractions."""
    q = [Fraction(m, n) for m in sizes]
    g = [Fraction(x) for x in gammas]
    q0 = 1 - sum(q)
    best = Fraction(0)
    for inside in itertools.product((False, True), repeat=len(q)):
        num = q0 + sum((qt * (gt if s else 1) for qt, gt, s in zip(q, g, inside, strict=True)), Fraction(0))
        den = q0 + sum((qt * (1 if s else 1 / gt) for qt, gt, s in zip(q, g, inside, strict=True)), Fraction(0))
        best = max(best, num / den)
    return best


def _maximizers(n: int, sizes: tuple[int, ...], gammas: tuple[float, ...]) -> list[frozenset[int]]:
    q = [Fraction(m, n) for m in sizes]
    g = [Fraction(x) for x in gammas]
    q0, best = 1 - sum(q), _brute_force_base(n, sizes, gammas)
    out = []
    for k in range(len(q) + 1):
        for S in itertools.combinations(range(len(q)), k):
            num = q0 + sum(q[t] * (g[t] if t in S else 1) for t in range(len(q)))
            den = q0 + sum(q[t] * (1 if t in S else 1 / g[t]) for t in range(len(q)))
            if num / den == best:
                out.append(frozenset(S))
    return out


def _realisable(attrs: tuple[int, ...], tables: tuple[tuple[int, ...], ...], S: frozenset[int]) -> bool:
    """Records w, v, v' with v and v' different on every table and v different from w on exactly
    the tables of S: a database of n - 1 copies of w and v (or v') attains Eq. (T1) for S."""
    records = list(itertools.product(*(range(a) for a in attrs)))

    def part(r: tuple[int, ...], t: int) -> tuple[int, ...]:
        return tuple(r[i] for i in tables[t])

    T = range(len(tables))
    return any(
        {t for t in T if part(v, t) != part(w, t)} == S and all(part(v, t) != part(u, t) for t in T)
        for w, v, u in itertools.product(records, repeat=3)
    )


def _naive_base(n: int, sizes: tuple[int, ...], gammas: tuple[float, ...]) -> Fraction:
    """The naive extension of Eq. (1): 1 + sum_t q_t (gamma_t - 1); wrong (below the true worst case)."""
    return 1 + sum((Fraction(m, n) * (Fraction(g) - 1) for m, g in zip(sizes, gammas, strict=True)), Fraction(0))


@pytest.mark.parametrize("n,attrs,tables,sizes,gammas,tight", CASES)
def test_worst_likelihood_ratio_against_the_bound(
    n: int,
    attrs: tuple[int, ...],
    tables: tuple[tuple[int, ...], ...],
    sizes: tuple[int, ...],
    gammas: tuple[float, ...],
    tight: bool,
) -> None:
    bound = subset_bound_base(n, sizes, gammas)
    assert bound == _brute_force_base(n, sizes, gammas)
    worst, within = _worst_ratio(n, math.prod(attrs), _likelihoods(n, attrs, tables, sizes, gammas), bound)
    assert within and worst <= bound
    assert (worst == bound) is tight
    assert any(_realisable(attrs, tables, S) for S in _maximizers(n, sizes, gammas)) is tight
    assert worst_subset(n, sizes, gammas) in _maximizers(n, sizes, gammas)
    assert math.exp(subset_bound_epsilon(n, sizes, gammas)) >= float(bound) * (1 - 1e-15)


def test_the_naive_formula_is_below_the_true_worst_case() -> None:
    """n = 3, m = (1, 1), gamma = (4, 2), record (A, B), tables A and B: the changed record raises
    the likelihood of table A's output and lowers table B's; the worst ratio is 12/5 (0.8755),
    the naive ln(1 + sum q_t (gamma_t - 1)) = ln 7/3 (0.8473)."""
    n, attrs, tables, sizes, gammas = 3, (2, 2), ((A,), (B,)), (1, 1), (4.0, 2.0)
    worst, _ = _worst_ratio(n, 4, _likelihoods(n, attrs, tables, sizes, gammas), Fraction(12, 5))
    assert worst == Fraction(12, 5) == subset_bound_base(n, sizes, gammas)
    assert _naive_base(n, sizes, gammas) == Fraction(7, 3) < worst
    assert round(subset_bound_epsilon(n, sizes, gammas), 4) == 0.8755
    assert round(math.log(_naive_base(n, sizes, gammas)), 4) == 0.8473
    assert worst_subset(n, sizes, gammas) == {0}
    # attained by x = (v, w, w), x' = (v', w, w) with w = (0, 0), v = (1, 0), v' = (0, 1) and
    # output (y_A, y_B) = (1, 0): A's output is v's (up), B's is w's, which v' does not share (down)
    L = _likelihoods(n, attrs, tables, sizes, gammas)
    code = {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}  # a record's index among the values
    x, x_prime, y = code[1, 0] * 4**2, code[0, 1] * 4**2, 1 * 2 + 0  # databases sum_i x_i 4^(2-i)
    assert Fraction(int(L[x, y]), int(L[x_prime, y])) == Fraction(12, 5)


def test_one_table_is_theorem_3_2_by_enumeration() -> None:
    n, attrs, tables, sizes, gammas = 3, (2, 2), ((A, B),), (2,), (3.0,)
    bound = 1 + Fraction(2, 3) * 2
    worst, within = _worst_ratio(n, 4, _likelihoods(n, attrs, tables, sizes, gammas), bound)
    assert within and worst == bound == subset_bound_base(n, sizes, gammas)


gamma_floats = st.floats(1.0, 1e6, exclude_min=True, allow_nan=False)


@st.composite
def releases(draw: st.DrawFn, max_tables: int = 6) -> tuple[int, tuple[int, ...], tuple[float, ...]]:
    n = draw(st.integers(1, 10**6))
    T = draw(st.integers(1, min(max_tables, n)))
    sizes: list[int] = []
    for t in range(T):
        sizes.append(draw(st.integers(1, n - sum(sizes) - (T - 1 - t))))
    return n, tuple(sizes), tuple(draw(gamma_floats) for _ in range(T))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 10**6), st.data(), gamma_floats)
def test_one_table_equals_theorem_3_2(n: int, data: st.DataObject, gamma: float) -> None:
    m = data.draw(st.integers(1, n))
    eps = epsilon_from_gamma(n, m, gamma)
    assert subset_bound_base(n, [m], [gamma]) == 1 + Fraction(m, n) * (Fraction(gamma) - 1)
    assert subset_bound_epsilon(n, [m], [gamma]) == eps
    assert sequential_epsilon(n, [m], [gamma]) == eps
    assert release_epsilon(n, [m], [gamma]) == eps
    assert worst_subset(n, [m], [gamma]) == ({0} if m < n else set())  # m = n: S = {} ties at gamma
    target = data.draw(st.floats(1e-4, 30.0))
    assert gammas_for_epsilon(n, [m], target, [data.draw(st.floats(0.1, 10.0))]) == (gamma_from_epsilon(n, m, target),)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(releases(), st.randoms(use_true_random=False))
def test_sorted_prefixes_equal_every_subset_and_order_does_not_matter(
    release: tuple[int, tuple[int, ...], tuple[float, ...]], rnd: random.Random
) -> None:
    """Eq. (T2): comparing the T + 1 prefixes of the gammas sorted downwards finds Eq. (T1)'s max
    over all 2^T subsets; the bound does not depend on the order of the tables."""
    n, sizes, gammas = release
    base = subset_bound_base(n, sizes, gammas)
    assert base == _brute_force_base(n, sizes, gammas)
    perm = list(range(len(sizes)))
    rnd.shuffle(perm)
    permuted_sizes, permuted_gammas = [sizes[t] for t in perm], [gammas[t] for t in perm]
    assert subset_bound_base(n, permuted_sizes, permuted_gammas) == base
    assert subset_bound_epsilon(n, permuted_sizes, permuted_gammas) == subset_bound_epsilon(n, sizes, gammas)
    assert worst_subset(n, sizes, gammas) in _maximizers(n, sizes, gammas)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(releases())
def test_the_bound_is_never_above_sequential_composition(
    release: tuple[int, tuple[int, ...], tuple[float, ...]],
) -> None:
    """Eq. (T1) <= Eq. (T3), exactly (strictly for T >= 2), so the charge min(T1, T3) is T1."""
    n, sizes, gammas = release
    product = math.prod(
        (1 + Fraction(m, n) * (Fraction(g) - 1) for m, g in zip(sizes, gammas, strict=True)), start=Fraction(1)
    )
    base = subset_bound_base(n, sizes, gammas)
    assert base < product if len(sizes) >= 2 else base == product
    assert (
        release_epsilon(n, sizes, gammas)
        == subset_bound_epsilon(n, sizes, gammas)
        <= sequential_epsilon(n, sizes, gammas)
    )


@settings(max_examples=100, deadline=None, derandomize=True)
@given(releases(), st.floats(1e-4, 30.0), st.data())
def test_gammas_for_epsilon_never_exceeds_and_nearly_reaches_epsilon(
    release: tuple[int, tuple[int, ...], tuple[float, ...]], epsilon: float, data: st.DataObject
) -> None:
    n, sizes, _ = release
    weights = [data.draw(st.floats(0.01, 100.0)) for _ in sizes]
    gammas = gammas_for_epsilon(n, sizes, epsilon, weights)
    got = release_epsilon(n, sizes, gammas)
    assert got <= epsilon
    assert got >= epsilon * (1 - 1e-9)
    if len(sizes) >= 2:
        # gamma_t = 1 + w_t s, each rounded to a float: compare within the two roundings (gamma_0's,
        # carried over scaled by w_t / w_0, and gamma_t's own), as (g - 1) alone can lose 9 digits
        scale = (gammas[0] - 1) / weights[0]
        for g, w in zip(gammas, weights, strict=True):
            slack = 2 * math.ulp(g) + 2 * (w / weights[0]) * math.ulp(gammas[0])
            assert abs(g - (1 + w * scale)) <= slack + 1e-9 * (g - 1)


def test_named_errors_at_the_exact_boundaries() -> None:
    assert subset_bound_epsilon(5, [2, 3], [2.0, 3.0]) > 0  # sum m_t = n allowed
    assert gammas_for_epsilon(5, [2, 3], 1.0)[0] > 1
    just_above_one = math.nextafter(1.0, 2.0)
    assert subset_bound_epsilon(5, [1, 1], [just_above_one, 2.0]) > 0
    functions = (subset_bound_base, subset_bound_epsilon, sequential_epsilon, release_epsilon, worst_subset)
    for f in functions:
        bad_sizes: list[list[Any]] = [[2, 4], [0, 1], [1.5, 1], [True, 1], []]
        for sizes in bad_sizes:
            with pytest.raises(InvalidSampleSizeError):
                f(5, sizes, [2.0] * len(sizes))
        with pytest.raises(InvalidSampleSizeError):
            f(0, [1], [2.0])
        for gamma in (1.0, 0.5, -2.0):
            with pytest.raises(InvalidGammaError):
                f(5, [1, 1], [2.0, gamma])
        for gamma in (math.nan, math.inf):
            with pytest.raises(NonFiniteInputError):
                f(5, [1, 1], [gamma, 2.0])
        with pytest.raises(ShapeMismatchError):
            f(5, [1, 1], [2.0])
    with pytest.raises(InvalidSampleSizeError):
        gammas_for_epsilon(5, [3, 3], 1.0)
    with pytest.raises(InvalidEpsilonError):
        gammas_for_epsilon(5, [1, 1], 0.0)
    with pytest.raises(InvalidEpsilonError):
        gammas_for_epsilon(5, [1, 1], 1e4)  # a gamma would overflow a float
    with pytest.raises(ShapeMismatchError):
        gammas_for_epsilon(5, [1, 1], 1.0, [1.0])
    with pytest.raises(InvalidGammaError):
        gammas_for_epsilon(5, [1, 1], 1.0, [1.0, 0.0])
    with pytest.raises(NonFiniteInputError):
        gammas_for_epsilon(5, [1, 1], 1.0, [1.0, math.inf])


def test_the_table_in_docs_privacy_is_what_the_functions_give() -> None:
    """The rows of the section's table: n, m, gamma, Eq. (T1), sequential (T3), naive."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## A release of several tables from disjoint samples") :]
    rows = re.findall(
        r"^\| (\d+) \| \(([\d, ]+)\) \| \(([\d., ]+)\) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", section, re.M
    )
    assert len(rows) >= 6
    for n_text, m_text, g_text, bound, sequential, naive in rows:
        n = int(n_text)
        sizes = tuple(int(m) for m in m_text.split(","))
        gammas = tuple(float(g) for g in g_text.split(","))
        assert f"{release_epsilon(n, sizes, gammas):.4f}" == bound
        assert f"{sequential_epsilon(n, sizes, gammas):.4f}" == sequential
        assert f"{math.log(_naive_base(n, sizes, gammas)):.4f}" == naive
