"""Rubin's rules as mice::pool computes them: hand-computed known answers for a tiny case, the
dfcom limits, b = 0, a vector of parameters, the print and the named errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from secure_release.mechanism.analysis.pooling import (
    InvalidDfcomError,
    TooFewAnalysesError,
    pool,
)
from secure_release.mechanism.errors import InvalidLevelError, NonFiniteInputError, ShapeMismatchError


def test_known_answer_by_hand() -> None:
    """M = 3, q = (1, 2, 3), u = 0.5 each, dfcom = 10, by hand: qbar = 2, ubar = 1/2, b = 1,
    t = 1/2 + (4/3) 1 = 11/6, riv = (4/3)/(1/2) = 8/3, lambda = (4/3)/(11/6) = 8/11,
    nu_old = 2/(8/11)^2 = 121/32, nu_obs = (11/13) 10 (3/11) = 30/13,
    nu = (121/32)(30/13) / (121/32 + 30/13) = 3630/2533,
    fmi = (8/3 + 2/(3630/2533 + 3)) / (11/3) = 35010/41173."""
    result = pool([1.0, 2.0, 3.0], [0.5, 0.5, 0.5], dfcom=10)
    assert result.m == 3 and result.names == ("q1",)
    assert result.estimate[0] == pytest.approx(2.0, rel=1e-14)
    assert result.ubar[0] == pytest.approx(0.5, rel=1e-14)
    assert result.b[0] == pytest.approx(1.0, rel=1e-14)
    assert result.t[0] == pytest.approx(11 / 6, rel=1e-14)
    assert result.riv[0] == pytest.approx(8 / 3, rel=1e-14)
    assert result.lambda_[0] == pytest.approx(8 / 11, rel=1e-14)
    assert result.df[0] == pytest.approx(3630 / 2533, rel=1e-12)
    assert result.fmi[0] == pytest.approx(35010 / 41173, rel=1e-12)
    se = math.sqrt(11 / 6)
    assert result.standard_error[0] == pytest.approx(se, rel=1e-14)
    assert result.statistic[0] == pytest.approx(2 / se, rel=1e-14)
    df = 3630 / 2533
    assert result.p_value[0] == pytest.approx(2 * stats.t.sf(2 / se, df), rel=1e-10)
    half = stats.t.ppf(0.975, df) * se
    assert result.ci_low[0] == pytest.approx(2 - half, rel=1e-10)
    assert result.ci_high[0] == pytest.approx(2 + half, rel=1e-10)


def test_infinite_dfcom_gives_the_old_df_and_large_dfcom_tends_to_it() -> None:
    est, var = [1.0, 2.0, 3.0], [0.5, 0.5, 0.5]
    assert pool(est, var).df[0] == pytest.approx(121 / 32, rel=1e-14)  # (M - 1)/lambda^2
    assert pool(est, var, dfcom=1e12).df[0] == pytest.approx(121 / 32, rel=1e-9)
    small = pool(est, var, dfcom=1).df[0]
    assert small == pytest.approx((121 / 32) * (0.5 * 3 / 11) / (121 / 32 + 0.5 * 3 / 11), rel=1e-12)


def test_no_between_variance() -> None:
    """b = 0: t = ubar, riv = 0, lambda floored at 1e-4 in the df (mice), fmi = 2/(df + 3)."""
    result = pool([2.0, 2.0, 2.0, 2.0], [0.25, 0.35, 0.3, 0.3], dfcom=50)
    assert result.b[0] == 0.0 and result.t[0] == pytest.approx(0.3, rel=1e-14) and result.riv[0] == 0.0
    old = 3 / 1e-8
    obs = 51 / 53 * 50 * (1 - 1e-4)
    assert result.df[0] == pytest.approx(old * obs / (old + obs), rel=1e-12)
    assert result.fmi[0] == pytest.approx(2 / (result.df[0] + 3), rel=1e-12)
    assert result.lambda_[0] == 0.0


def test_a_vector_of_parameters_pools_column_by_column() -> None:
    rng = np.random.default_rng(3)
    est = rng.normal(size=(5, 3))
    var = rng.uniform(0.1, 1.0, size=(5, 3))
    joint = pool(est, var, dfcom=40, names=("a", "b", "c"), level=0.9)
    for j in range(3):
        alone = pool(est[:, j], var[:, j], dfcom=40, level=0.9)
        for field in ("estimate", "t", "df", "riv", "fmi", "p_value", "ci_low", "ci_high"):
            assert getattr(joint, field)[j] == pytest.approx(getattr(alone, field)[0], rel=1e-14)
    text = str(joint)
    assert "Rubin" in text and "[0.05" in text and "fmi" in text and "Barnard-Rubin" in text
    assert set(joint.columns()) >= {"term", "estimate", "std.error", "df", "p.value", "riv", "fmi"}


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (([1.0], [0.1]), {}, TooFewAnalysesError),
        (([1.0, 2.0], [0.1]), {}, ShapeMismatchError),
        (([1.0, 2.0], [0.1, -0.1]), {}, NonFiniteInputError),
        (([1.0, math.nan], [0.1, 0.1]), {}, NonFiniteInputError),
        (([1.0, 2.0], [0.1, 0.1]), {"dfcom": 0}, InvalidDfcomError),
        (([1.0, 2.0], [0.1, 0.1]), {"dfcom": math.nan}, InvalidDfcomError),
        (([1.0, 2.0], [0.1, 0.1]), {"level": 1.0}, InvalidLevelError),
        (([1.0, 2.0], [0.1, 0.1]), {"names": ("a", "b")}, ShapeMismatchError),
        ((np.zeros((2, 2, 2)), np.zeros((2, 2, 2))), {}, ShapeMismatchError),
    ],
)
def test_named_errors(args: tuple[object, object], kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        pool(*args, **kwargs)  # type: ignore[arg-type]
