"""The closed-form (water-filling) MLE against EM, its KKT conditions, and its interior case."""

import numpy as np
import pytest

from secure_release.mechanism.errors import NonFiniteInputError
from secure_release.mechanism.estimation import estimators as est
from secure_release.mechanism.estimation import reference
from secure_release.mechanism.primitives.pram import PramChannel


def _cases(seed: int, count: int) -> list[tuple[np.ndarray, float]]:
    # fixed-seed inputs only: every assertion below is exact, none is statistical
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        K = int(rng.integers(2, 30))
        keep = float(rng.uniform(0.02, 0.9))
        counts = rng.integers(0, 50, K).astype(float)
        counts[rng.random(K) < 0.3] = 0
        counts[0] += 1
        out.append((counts, keep))
    return out


def test_closed_form_is_at_least_as_likely_as_em_and_equals_converged_em() -> None:
    compared = 0
    for counts, keep in _cases(7, 120):
        exact = est.estimate_mle_exact(counts, keep)
        em = reference.estimate_mle(counts, keep, tolerance=1e-14, max_iterations=100_000)
        assert exact.log_likelihood >= em.log_likelihood - 1e-9
        if em.converged:
            compared += 1
            np.testing.assert_allclose(exact.estimate, em.estimate, atol=1e-8)
    assert compared >= 60  # enough cases where EM reached its fixed point


def test_kkt_conditions_hold() -> None:
    for counts, keep in _cases(8, 200):
        p = est.mle_water_filling(counts, keep)
        assert abs(p.sum() - 1) < 1e-12 and np.all(p >= 0)
        g = (1 - keep) / counts.size
        grad = keep * counts / (keep * p + g)
        lam = grad[p > 0]
        assert np.ptp(lam) <= 1e-9 * lam.max()  # equal gradient on the support
        assert np.all(grad[p == 0] <= lam.max() * (1 + 1e-9))  # no gain from leaving the boundary


def test_interior_case_is_the_channel_inverse() -> None:
    channel = PramChannel(30.0, 6)
    counts = np.array([100.0, 120, 90, 110, 95, 105])
    np.testing.assert_allclose(
        est.mle_water_filling(counts, channel.keep), est.estimate_joint(counts, channel), atol=1e-12
    )


def test_rows_are_independent() -> None:
    cases = _cases(9, 10)
    counts = np.array([np.resize(c, 12) + 1 for c, _ in cases])
    batch = est.mle_water_filling(counts, 0.3)
    for row, c in zip(batch, counts, strict=True):
        np.testing.assert_allclose(row, est.mle_water_filling(c, 0.3), atol=0)


def test_bad_input_is_named() -> None:
    with pytest.raises(NonFiniteInputError):
        est.mle_water_filling(np.zeros(4), 0.5)
    with pytest.raises(NonFiniteInputError):
        est.mle_water_filling(np.array([1.0, -1.0]), 0.5)
    with pytest.raises(NonFiniteInputError):
        est.mle_water_filling(np.array([1.0, 2.0]), 0.0)
