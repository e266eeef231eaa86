"""Gamma-diagonal PRAM (DESIGN 3.4) and Lemma 3.1 (PRAM commutes with the additive pad)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from secure_release.mechanism.errors import InvalidGammaError, NonFiniteInputError, ShapeMismatchError
from secure_release.mechanism.primitives.keys import PadKey, PramKey
from secure_release.mechanism.primitives.pads import chacha20_pad, decrypt, encrypt
from secure_release.mechanism.primitives.pram import PRAM_BLOCK_ROWS, PramChannel, check_gamma, perturb, perturb_block
from secure_release.mechanism.schema import joint_codes

Z_1E7 = float(stats.norm.isf(0.5e-7))  # two-sided alpha = 1e-7 -> z = 5.33
CHI2_CRIT = lambda df: float(stats.chi2.ppf(1 - 1e-6, df))  # noqa: E731  alpha = 1e-6


@pytest.mark.parametrize(
    "gamma,K",
    [(3.0, 24), (1.5, 2), (21.0, 24), (1e6, 7), (1 + 1e-9, 5), (2.5, 10**6), (100, 2**40)],
)
def test_channel_parameters(gamma: float, K: int) -> None:
    ch = PramChannel(gamma, K)
    g = Fraction(gamma)
    q = g + K - 1
    assert math.isclose(ch.normalizer, float(q), rel_tol=1e-15)
    assert math.isclose(ch.keep, float((g - 1) / q), rel_tol=1e-9)
    assert math.isclose(ch.off_diagonal, float(1 / q), rel_tol=1e-15)
    assert math.isclose(ch.diagonal, float(g / q), rel_tol=1e-15)
    assert math.isclose(ch.diagonal, ch.keep + ch.off_diagonal, rel_tol=1e-9)
    # rows of A sum to 1: diagonal + (K-1) off-diagonal
    assert math.isclose(ch.diagonal + (K - 1) * ch.off_diagonal, 1.0, rel_tol=1e-12)
    # keep threshold: exactly floor(a 2^64) with rationals, so a - 2^-64 < a' <= a
    thr = ch.keep_threshold
    exact = (g - 1) / q * 2**64
    assert thr == math.floor(exact)
    assert Fraction(thr, 2**64) <= (g - 1) / q < Fraction(thr + 1, 2**64)
    assert 0 <= thr < 2**64


def test_keep_threshold_not_float_rounded() -> None:
    # a = 1/3 exactly for gamma = 2, K = 2: floor(2^64 / 3) = 6148914691236517205
    assert PramChannel(2.0, 2).keep_threshold == 6148914691236517205
    assert PramChannel(2.0, 2).keep_threshold == 2**64 // 3


@pytest.mark.parametrize("bad", [1, 1.0, 0.5, 0, -3, True, "3", None])
def test_invalid_gamma(bad: object) -> None:
    with pytest.raises(InvalidGammaError):
        check_gamma(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidGammaError):
        PramChannel(bad, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_gamma(bad: float) -> None:
    with pytest.raises(NonFiniteInputError):
        PramChannel(bad, 4)


def test_gamma_boundary_passes() -> None:
    assert check_gamma(1 + 1e-12) == 1 + 1e-12
    assert check_gamma(2) == 2.0


def _cols(rows: int, sizes: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, k, rows, dtype=np.uint64).astype(np.uint32) for k in sizes]


# KAT: generated once from the implementation of 2026-11-22 and pinned (the server's PRAM
# must be reproducible from its key for audit and re-serving).
PRAM_KAT = [
    (
        bytes(32),
        3.0,
        [
            [5, 3, 2, 1, 5, 5, 0, 1, 0, 3, 0, 5, 1, 3, 0, 4, 0, 5, 2, 3],
            [1, 1, 2, 0, 1, 0, 2, 1, 3, 2, 3, 3, 0, 2, 3, 2, 0, 1, 1, 3],
        ],
    ),
    (
        bytes(range(32)),
        30.0,
        [
            [0, 1, 2, 2, 4, 5, 0, 1, 2, 3, 4, 5, 0, 2, 2, 3, 4, 5, 0, 1],
            [0, 1, 2, 2, 0, 1, 2, 3, 0, 1, 2, 3, 0, 3, 2, 3, 1, 1, 2, 3],
        ],
    ),
]


@pytest.mark.parametrize("raw,gamma,expected", PRAM_KAT)
def test_perturb_known_answers(raw: bytes, gamma: float, expected: list[list[int]]) -> None:
    x = [np.arange(20, dtype=np.uint32) % 6, np.arange(20, dtype=np.uint32) % 4]
    out = perturb(x, [6, 4], PramChannel(gamma, 24), PramKey(raw))
    assert [o.tolist() for o in out] == expected
    assert all(o.dtype == np.uint32 for o in out)


def test_perturb_independent_of_chunking() -> None:
    sizes = (6, 4)
    rows = PRAM_BLOCK_ROWS + 1234
    cols = _cols(rows, sizes)
    ch, key = PramChannel(3.0, 24), PramKey(bytes(range(32)))
    whole = perturb(cols, sizes, ch, key)
    first = perturb([c[:PRAM_BLOCK_ROWS] for c in cols], sizes, ch, key)
    second = perturb([c[PRAM_BLOCK_ROWS:] for c in cols], sizes, ch, key, first_row=PRAM_BLOCK_ROWS)
    for j in range(2):
        assert np.array_equal(whole[j], np.concatenate([first[j], second[j]]))
    blk = perturb_block([c[PRAM_BLOCK_ROWS:] for c in cols], sizes, ch, key, 1)
    for j in range(2):
        assert np.array_equal(blk[j], whole[j][PRAM_BLOCK_ROWS:])
    # inputs are not modified in place
    assert np.array_equal(cols[0], _cols(rows, sizes)[0])
    # a different key changes the output
    other = perturb(cols, sizes, ch, PramKey(bytes(32)))
    assert not np.array_equal(other[0], whole[0])


def test_perturb_errors() -> None:
    sizes = (6, 4)
    cols = _cols(10, sizes)
    ch, key = PramChannel(3.0, 24), PramKey(bytes(32))
    with pytest.raises(ShapeMismatchError):
        perturb(cols, sizes, ch, key, first_row=5)
    with pytest.raises(ShapeMismatchError):
        perturb(cols, (6, 5), ch, key)
    with pytest.raises(ShapeMismatchError):
        perturb([cols[0], cols[1][:5]], sizes, ch, key)
    with pytest.raises(ShapeMismatchError):
        perturb(cols[:1], sizes, ch, key)
    with pytest.raises(ShapeMismatchError):
        perturb_block(_cols(PRAM_BLOCK_ROWS + 1, sizes), sizes, ch, key, 0)
    bad = [cols[0].copy(), cols[1].copy()]
    bad[1][0] = 4
    from secure_release.mechanism.errors import SymbolOutOfRangeError

    with pytest.raises(SymbolOutOfRangeError):
        perturb(bad, sizes, ch, key)


@pytest.mark.parametrize("gamma", [3.0, 21.0])
def test_perturb_statistics(gamma: float) -> None:
    """Input all in cell 0 (K = 24). Output cell 0 w.p. gamma/q, each other cell w.p. 1/q.
    Fixed key. Unchanged fraction: z-test at two-sided alpha 1e-7; full cell distribution:
    chi-square, df = 23, alpha 1e-6."""
    sizes, K, rows = (6, 4), 24, 300_000
    ch = PramChannel(gamma, K)
    cols = [np.zeros(rows, dtype=np.uint32), np.zeros(rows, dtype=np.uint32)]
    out = perturb(cols, sizes, ch, PramKey(bytes([int(gamma)]) * 32))
    cells = joint_codes(out, sizes)
    obs = np.bincount(cells, minlength=K).astype(float)
    p0 = ch.diagonal
    z = (obs[0] - rows * p0) / math.sqrt(rows * p0 * (1 - p0))
    assert abs(z) < Z_1E7
    expected = np.full(K, rows * ch.off_diagonal)
    expected[0] = rows * p0
    chi2 = float(((obs - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_CRIT(K - 1)


def test_perturb_replacements_uniform_per_curator() -> None:
    """Rows that changed are uniform on the other K - 1 cells; each curator's replaced symbol is
    uniform on Z_kj (checked on the joint: chi-square over 23 cells, alpha 1e-6)."""
    sizes, K, rows = (3, 8), 24, 200_000
    ch = PramChannel(1.5, K)  # mostly replaced
    cols = [np.full(rows, 2, dtype=np.uint32), np.full(rows, 5, dtype=np.uint32)]
    out = perturb(cols, sizes, ch, PramKey(bytes(range(1, 33))))
    cells = joint_codes(out, sizes)
    own = 2 * 8 + 5
    changed = cells[cells != own]
    obs = np.delete(np.bincount(changed, minlength=K), own).astype(float)
    exp = changed.size / (K - 1)
    assert float(((obs - exp) ** 2 / exp).sum()) < CHI2_CRIT(K - 2)


# ---------------------------------------------------------------- Lemma 3.1


def _channel_matrix(gamma: Fraction, sizes: tuple[int, ...]) -> list[list[Fraction]]:
    """A built by enumerating the PRAM rule: keep w.p. a, else an independent uniform symbol
    per curator."""
    K = math.prod(sizes)
    a = (gamma - 1) / (gamma + K - 1)
    A = [[Fraction(0)] * K for _ in range(K)]
    for i in range(K):
        A[i][i] += a
        for j in range(K):
            A[i][j] += (1 - a) * math.prod(Fraction(1, k) for k in sizes)
    return A


@pytest.mark.parametrize("sizes", [(2, 3), (3, 2), (2, 2, 2)])
@pytest.mark.parametrize("gamma", [Fraction(3), Fraction(5, 2)])
def test_lemma_3_1_exact(sizes: tuple[int, ...], gamma: Fraction) -> None:
    K = math.prod(sizes)
    A = _channel_matrix(gamma, sizes)
    q = gamma + K - 1
    # A = a I + b J: diagonal gamma/q, off-diagonal 1/q
    for i in range(K):
        for j in range(K):
            assert A[i][j] == (gamma / q if i == j else 1 / q)
    cells = list(itertools.product(*(range(k) for k in sizes)))
    index = {c: i for i, c in enumerate(cells)}
    for pad in cells:  # every pad (v, w, ...)
        enc = [
            index[tuple((c + v) % k for c, v, k in zip(x, pad, sizes, strict=True))] for x in cells
        ]
        dec = {
            index[tuple((c + v) % k for c, v, k in zip(x, pad, sizes, strict=True))]: index[x]
            for x in cells
        }
        composite = [[Fraction(0)] * K for _ in range(K)]
        for i in range(K):
            for j in range(K):  # ciphertext output j -> decrypted cell dec[j]
                composite[i][dec[j]] += A[enc[i]][j]
        assert composite == A


def test_lemma_3_1_through_real_code() -> None:
    """decrypt(perturb(encrypt(x))) and perturb(x) have the same (input, output) distribution:
    two-sample chi-square on the 2 x 36 contingency table, df = 35, alpha = 1e-6. Fixed keys."""
    sizes, K, rows = (2, 3), 6, 120_000
    cols = _cols(rows, sizes, seed=11)
    ch = PramChannel(2.0, K)
    pads = [chacha20_pad(PadKey(bytes([j + 1]) * 32), k, 0, rows) for j, k in enumerate(sizes)]
    cipher = [encrypt(c, v, k) for c, v, k in zip(cols, pads, sizes, strict=True)]
    through = perturb(cipher, sizes, ch, PramKey(bytes([9]) * 32))
    decrypted = [decrypt(c, v, k) for c, v, k in zip(through, pads, sizes, strict=True)]
    direct = perturb(cols, sizes, ch, PramKey(bytes([10]) * 32))
    x = joint_codes(cols, sizes)
    pair_a = x * K + joint_codes(decrypted, sizes)
    pair_b = x * K + joint_codes(direct, sizes)
    table = np.vstack([np.bincount(pair_a, minlength=K * K), np.bincount(pair_b, minlength=K * K)])
    chi2, _p, dof, _ = stats.chi2_contingency(table, correction=False)
    assert dof == K * K - 1
    assert chi2 < CHI2_CRIT(dof)
    # and both match A: conditional on x, the output is x w.p. gamma/q
    stay = np.count_nonzero(pair_a // K == pair_a % K)
    p0 = ch.diagonal
    assert abs(stay - rows * p0) / math.sqrt(rows * p0 * (1 - p0)) < Z_1E7
