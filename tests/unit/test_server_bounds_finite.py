# tier: unit
"""Issue 24, item 7: finite arithmetic on every epsilon/gamma path. An epsilon of 1e308 raised
``decimal.Overflow`` (the server answered UNKNOWN) and math.expm1's OverflowError elsewhere; now
the exact comparison decides by magnitude first, and an epsilon whose gamma is no float is a named
:class:`InvalidEpsilonError`."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from secure_release.mechanism.errors import InvalidEpsilonError
from secure_release.mechanism.privacy import accounting as acc


@pytest.mark.parametrize("exponent", [1e308, 1e6, 800.0, 710.0])
def test_compare_with_exp_never_overflows(exponent: float) -> None:
    big = Fraction(1.7e308)
    assert acc.compare_with_exp(big, Fraction(exponent)) == -1  # e^exponent is larger
    assert acc.compare_with_exp(Fraction(1, 10**300), Fraction(-exponent)) == 1


def test_the_magnitude_shortcut_agrees_with_the_exact_decision_near_the_boundary() -> None:
    for x in (0.5, 3.0, 10.0, 40.0, 300.0):
        e = Fraction(math.exp(x))  # within one ulp of e^x: only the exact path can decide
        exact = acc.compare_with_exp(e, Fraction(x))
        assert exact in (-1, 1)
        assert acc.compare_with_exp(e * Fraction(3, 2), Fraction(x)) == 1
        assert acc.compare_with_exp(e * Fraction(2, 3), Fraction(x)) == -1


def test_a_gamma_that_is_no_float_is_a_named_error() -> None:
    with pytest.raises(InvalidEpsilonError, match="too large"):
        acc.gamma_from_epsilon(1 << 20, 1000, 1e308)
    with pytest.raises(InvalidEpsilonError, match="too large"):
        acc.check_declared_gamma(1 << 20, 1000, 1e308, 1e308)
    assert math.isfinite(acc.gamma_from_epsilon(1 << 20, 1000, 700.0))


def test_the_planning_formulas_stay_finite_at_huge_epsilon() -> None:
    assert acc.optimal_sample_size(1000, 4, 800.0) == 1000.0
    assert acc.error_minimizing_sample_size(1000, 4, 800.0) == 1000
    assert acc.amplified_epsilon(800.0, 0.5) == pytest.approx(800.0 + math.log(0.5))
    assert acc.amplified_epsilon(1.0, 0.5) == pytest.approx(math.log1p(0.5 * math.expm1(1.0)))
