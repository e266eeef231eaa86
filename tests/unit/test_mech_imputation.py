"""Multiple imputation of a release (DESIGN 13): the shapes and laws of the result, the exact
one-record conditional, Bayesian IPF staying in its model, the mixing diagnostics, and the named
errors. The sampler's law is checked exactly in ``test_mech_imputation_exact.py``.

The mixing checks are seeded regressions with generous margins, not statistical claims with a
rate: at the stated settings and seed the chains give R-hat < 1.05 and |autocorrelation between
consecutive imputations| < 0.2 (measured: see each test), deterministic given the seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from secure_release.mechanism.errors import (
    EmptySampleError,
    InvalidCountsError,
    InvalidSeedError,
    SecureReleaseError,
    ShapeMismatchError,
)
from secure_release.mechanism.estimation import loglinear_draws, mixing
from secure_release.mechanism.estimation.imputation import (
    BURN_IN_SPACINGS,
    DEFAULT_ALPHA,
    PILOT_SWEEPS,
    ChannelSizeError,
    ImputationResult,
    InvalidGeneratingClassError,
    InvalidPriorError,
    InvalidSpacingError,
    TooFewChainsError,
    TooFewImputationsError,
    check_generating_class,
    expand_records,
    impute,
    posterior_theta,
)
from secure_release.mechanism.primitives.pram import PramChannel
from secure_release.mechanism.privacy.plan import plan_release


def release(sizes: tuple[int, ...], epsilon: float, seed: int, n: int = 45222) -> tuple[np.ndarray, PramChannel]:
    """Observed counts of a plan's release (m = m*, gamma by Eq. 2) of a random joint."""
    plan = plan_release(n, sizes, epsilon)
    rng = np.random.default_rng(seed)
    theta = rng.dirichlet(np.ones(plan.joint_size))
    channel = plan.channel
    observed = rng.multinomial(plan.m, channel.keep * theta + channel.off_diagonal)
    return observed, channel


# --------------------------------------------------------------------------- the result


def test_imputations_are_complete_counts_of_the_m_records() -> None:
    observed, channel = release((3, 2, 2, 2), 1.0, 1)
    result = impute(observed, channel, 7, np.random.default_rng(2), chains=3)
    assert isinstance(result, ImputationResult)
    assert result.imputations.shape == (7, 24) and result.imputations.dtype == np.int64
    assert np.all(result.imputations.sum(axis=1) == observed.sum()) and np.all(result.imputations >= 0)
    assert result.theta.shape == (7, 24) and np.allclose(result.theta.sum(axis=1), 1.0)
    assert result.chain.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert result.alpha == DEFAULT_ALPHA and "uniform" in result.prior and result.model is None
    assert (
        result.burn_in == max(BURN_IN_SPACINGS * result.spacing - PILOT_SWEEPS, 0)
        and result.pilot_sweeps == PILOT_SWEEPS
    )
    text = str(result)
    assert "saturated joint" in text and "R-hat" in text and "log-likelihood of o" in text


def test_the_same_seed_gives_the_same_imputations() -> None:
    observed, channel = release((2, 2, 2), 0.5, 3)
    one = impute(observed, channel, 4, np.random.default_rng(11), spacing=3)
    two = impute(observed, channel, 4, np.random.default_rng(11), spacing=3)
    other = impute(observed, channel, 4, np.random.default_rng(12), spacing=3)
    assert np.array_equal(one.imputations, two.imputations) and np.array_equal(one.theta, two.theta)
    assert not np.array_equal(one.imputations, other.imputations)
    assert one.burn_in == PILOT_SWEEPS + BURN_IN_SPACINGS * 3 and one.pilot_sweeps == 0


def test_records_expand_counts_to_joint_codes() -> None:
    assert expand_records([2, 0, 1, 3]).tolist() == [0, 0, 2, 3, 3, 3]
    observed, channel = release((2, 2, 2), 1.0, 4)
    result = impute(observed, channel, 2, np.random.default_rng(5), spacing=2)
    codes = result.records(1)
    assert codes.dtype == np.int64 and codes.size == observed.sum()
    assert np.array_equal(np.bincount(codes, minlength=8), result.imputations[1])


def test_posterior_theta_returns_the_draws_of_theta() -> None:
    observed, channel = release((2, 2, 2), 1.0, 6)
    draws = posterior_theta(observed, channel, 5, np.random.default_rng(7))
    again = impute(observed, channel, 5, np.random.default_rng(7)).theta
    assert np.array_equal(draws, again)


# --------------------------------------------------------------------------- the one-record step


def test_kept_probability_is_the_exact_conditional() -> None:
    """P(true = y | obs = y) = pi_y + (1 - pi_y) theta_y, with P(true = x | obs = y) from the full
    matrix A = a I + b J by Bayes' rule."""
    channel = PramChannel(3.5, 5)
    a, b = channel.keep, channel.off_diagonal
    theta = np.array([[0.1, 0.4, 0.05, 0.25, 0.2]])
    A = a * np.eye(5) + b
    posterior = A * theta  # row y: P(obs = y | x) theta_x
    posterior /= posterior.sum(axis=1, keepdims=True)
    pi = loglinear_draws.kept_probabilities(theta, a, b)[0]
    assert np.allclose(pi + (1 - pi) * theta[0], np.diag(posterior), rtol=1e-12)
    off = posterior[0, 1:] / (1 - pi[0])  # the rest of row 0 is a draw from theta
    assert np.allclose(off, theta[0, 1:], rtol=1e-12)


def test_bayesian_ipf_stays_in_the_independence_model() -> None:
    observed, channel = release((3, 4), 1.0, 8)
    result = impute(observed, channel, 6, np.random.default_rng(9), model=[(0,), (1,)], sizes=(3, 4), spacing=2)
    for theta in result.theta:
        table = theta.reshape(3, 4)
        assert np.allclose(table, np.outer(table.sum(axis=1), table.sum(axis=0)), atol=1e-12)
    assert result.model is not None and "constrained" in result.prior and "log-linear" in str(result)


def test_bayesian_ipf_keeps_the_no_three_way_model() -> None:
    """Under [(0,1),(0,2),(1,2)] every 2 x 2 x 2 draw keeps the three-way log odds ratio at 0."""
    observed, channel = release((2, 2, 2), 2.0, 10)
    result = impute(observed, channel, 4, np.random.default_rng(1), model=[(0, 1), (0, 2), (1, 2)], sizes=(2, 2, 2))
    for theta in result.theta:
        t = np.log(theta.reshape(2, 2, 2))
        three_way = (t[1, 1, 1] - t[0, 1, 1] - t[1, 0, 1] - t[1, 1, 0] + t[1, 0, 0] + t[0, 1, 0] + t[0, 0, 1]
                     - t[0, 0, 0])  # fmt: skip
        assert abs(three_way) < 1e-9
    full = impute(observed, channel, 4, np.random.default_rng(1), model=[(0, 1, 2)], sizes=(2, 2, 2))
    assert full.model is None  # the saturated class is the saturated joint


def test_generating_class_by_names_and_contained_generators_dropped() -> None:
    model = check_generating_class([("y", "x1"), ("y",), ["x2", "y"]], (2, 3, 2), names=("y", "x1", "x2"))
    assert model.generators == ((0, 1), (0, 2)) and model.joint_size == 12 and not model.saturated


# --------------------------------------------------------------------------- mixing


@pytest.mark.parametrize("epsilon", [0.5, 4.0])
def test_saturated_chains_mix_at_the_plans_settings(epsilon: float) -> None:
    """Seeded regression: K = 24 (n = 45222, m from the plan), M = 100, two chains."""
    observed, channel = release((3, 2, 2, 2), epsilon, 20)
    result = impute(observed, channel, 100, np.random.default_rng(21))
    assert result.diagnostics.max_rhat < 1.05
    assert result.diagnostics.max_imputation_autocorrelation < 0.2
    assert 1 <= result.spacing <= mixing.MAX_SPACING


def test_loglinear_chains_mix() -> None:
    """Seeded regression: K = 8 with all two-way interactions, epsilon 1, M = 100."""
    observed, channel = release((2, 2, 2), 1.0, 22)
    result = impute(observed, channel, 100, np.random.default_rng(23), model=[(0, 1), (0, 2), (1, 2)], sizes=(2, 2, 2))
    assert result.diagnostics.max_rhat < 1.05
    # 100 imputations give about 100 consecutive pairs: one summary's estimate has a standard error
    # near 0.1, and this is the largest |.| of 9 summaries, so 0.3 is the generous margin
    assert result.diagnostics.max_imputation_autocorrelation < 0.3


def test_rhat_flags_chains_that_disagree() -> None:
    """Planted: two chains of i.i.d. normals, the second shifted by one standard deviation."""
    rng = np.random.default_rng(30)
    same = rng.standard_normal((2, 500, 1))
    assert mixing.split_rhat(same)[0] < 1.01
    shifted = same + np.array([0.0, 1.0])[:, None, None]
    assert mixing.split_rhat(shifted)[0] > 1.1
    wider = same * np.array([1.0, 3.0])[:, None, None]  # same centre, different spread: the tail R-hat
    assert mixing.split_rhat(wider)[0] > 1.1
    assert math.isnan(mixing.split_rhat(same[:, :3])[0])


def test_autocorrelation_and_spacing() -> None:
    rng = np.random.default_rng(31)
    series = np.empty((2, 20_000))
    series[:, 0] = rng.standard_normal(2)
    noise = rng.standard_normal((2, 20_000)) * math.sqrt(1 - 0.8**2)
    for t in range(1, 20_000):
        series[:, t] = 0.8 * series[:, t - 1] + noise[:, t]
    rho = mixing.lag_autocorrelation(series[:, :, None], 1)[0]
    assert abs(rho - 0.8) < 0.03
    assert abs(mixing.lag_autocorrelation(series[:, :, None], 5)[0] - 0.8**5) < 0.05
    assert mixing.choose_spacing(0.5) == 9  # 0.5^9 = 0.00195 <= 0.0025 < 0.5^8 = 0.0039
    assert mixing.choose_spacing(0.04) == 2 and mixing.choose_spacing(0.002) == 1
    assert mixing.choose_spacing(math.nan) == 1
    assert mixing.choose_spacing(1.0) == mixing.MAX_SPACING and mixing.choose_spacing(0.9999) == mixing.MAX_SPACING


# --------------------------------------------------------------------------- errors

CHANNEL = PramChannel(3.0, 4)
COUNTS = np.array([3, 1, 0, 2])


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_imputations": 1}, TooFewImputationsError),
        ({"num_imputations": 2.0}, TooFewImputationsError),
        ({"num_imputations": True}, TooFewImputationsError),
        ({"counts": np.array([3, 1, 0])}, ChannelSizeError),
        ({"counts": np.array([[3, 1], [0, 2]])}, ChannelSizeError),
        ({"channel": PramChannel(3.0, 5)}, ChannelSizeError),
        ({"model": [(0,), (1,)], "sizes": (2, 3)}, ChannelSizeError),
        ({"counts": np.array([3, -1, 0, 2])}, InvalidCountsError),
        ({"counts": np.array([3, 0.5, 0, 2])}, InvalidCountsError),
        ({"counts": np.zeros(4, dtype=int)}, EmptySampleError),
        ({"alpha": 0.0}, InvalidPriorError),
        ({"alpha": -1.0}, InvalidPriorError),
        ({"alpha": math.nan}, InvalidPriorError),
        ({"alpha": math.inf}, InvalidPriorError),
        ({"chains": 1}, TooFewChainsError),
        ({"spacing": 0}, InvalidSpacingError),
        ({"burn_in": -1}, InvalidSpacingError),
        ({"rng": 5}, InvalidSeedError),
        ({"model": [(0,), (1,)]}, InvalidGeneratingClassError),
        ({"model": [], "sizes": (2, 2)}, InvalidGeneratingClassError),
        ({"model": [(0,)], "sizes": (2, 2)}, InvalidGeneratingClassError),
        ({"model": [(0, 2)], "sizes": (2, 2)}, InvalidGeneratingClassError),
        ({"model": [(0, 0), (1,)], "sizes": (2, 2)}, InvalidGeneratingClassError),
        ({"model": [(), (0, 1)], "sizes": (2, 2)}, InvalidGeneratingClassError),
        ({"model": [0, 1], "sizes": (2, 2)}, InvalidGeneratingClassError),
        ({"model": [("a",), ("b",)], "sizes": (2, 2)}, InvalidGeneratingClassError),
    ],
)
def test_named_errors(kwargs: dict[str, object], error: type[SecureReleaseError]) -> None:
    args: dict[str, object] = {"counts": COUNTS, "channel": CHANNEL, "num_imputations": 4,
                               "rng": np.random.default_rng(0), "spacing": 1}  # fmt: skip
    args.update(kwargs)
    with pytest.raises(error):
        impute(args.pop("counts"), args.pop("channel"), args.pop("num_imputations"), args.pop("rng"), **args)  # type: ignore[arg-type]


def test_error_bases() -> None:
    assert issubclass(ChannelSizeError, ShapeMismatchError)
    for error in (TooFewImputationsError, TooFewChainsError, InvalidPriorError, InvalidGeneratingClassError,
                  InvalidSpacingError):  # fmt: skip
        assert issubclass(error, SecureReleaseError)
    with pytest.raises(InvalidGeneratingClassError, match="in no generator"):
        check_generating_class([("y",)], (2, 2), names=("y", "x"))
