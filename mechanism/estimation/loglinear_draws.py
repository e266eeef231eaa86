"""One sweep of data augmentation for a perturbed release (DESIGN 13): the imputation step (the
true cells given theta and the observed counts) and the two posterior steps (theta given the
complete counts), under the saturated joint or a hierarchical log-linear model.

Every function works on C chains at once, in lockstep: theta is a (C, K) array, one row per
chain, so one numpy call serves every chain. All draws come from the caller's numpy
``Generator``: an imputation is post-processing of a released table, so it needs no
cryptographic randomness and may be reproduced from a seed.

The channel is gamma-diagonal PRAM, A = a I + b J (:class:`PramChannel`: ``keep`` a,
``off_diagonal`` b): P(obs = y | true = x) = b + a [x = y].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import SecureReleaseError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class InvalidGeneratingClassError(SecureReleaseError):
    """A log-linear model's generating class is malformed: a generator is empty, names an
    attribute that does not exist or names one twice, or some attribute is in no generator (it
    would be imputed as uniform); the saturated model is the class of one generator holding every
    attribute."""


def kept_probabilities(theta: FloatArray, keep: float, off_diagonal: float) -> FloatArray:
    """DESIGN 13: P(true = y | obs = y, theta) split into "the record kept its cell".

    P(true = x | obs = y) is proportional to theta_x A[y, x] = theta_x (b + a [x = y]), whose sum
    over x is b + a theta_y. So the true cell is y "through the keep" with probability
    pi_y = a theta_y / (b + a theta_y), and otherwise (probability b / (b + a theta_y)) it is a
    draw from theta over all K cells, y included."""
    weighted = keep * theta
    return np.asarray(weighted / (off_diagonal + weighted), dtype=np.float64)


def impute_complete_counts(
    observed: IntArray, theta: FloatArray, keep: float, off_diagonal: float, rng: np.random.Generator
) -> IntArray:
    """The imputation step of DESIGN 13, O(K) per chain: kept_y ~ Binomial(o_y, pi_y) for every
    cell at once (:func:`kept_probabilities`), the other R = m - sum kept records'
    true cells ~ Multinomial(R, theta); z = kept + that. ``theta`` (C, K) gives (C, K) counts, each
    row summing to m. Given theta the records are independent, so this is an exact draw of the
    complete counts z given (o, theta)."""
    kept = rng.binomial(observed[None, :], kept_probabilities(theta, keep, off_diagonal))
    rest = int(observed.sum()) - kept.sum(axis=1)
    fresh = rng.multinomial(rest, theta / theta.sum(axis=1, keepdims=True))
    return np.asarray(kept + fresh, dtype=np.int64)


def dirichlet_rows(shape_parameters: FloatArray, rng: np.random.Generator) -> FloatArray:
    """One Dirichlet draw per row: independent Gamma(shape) normalised (shapes > 0)."""
    draws = rng.standard_gamma(shape_parameters)
    return np.asarray(draws / draws.sum(axis=-1, keepdims=True), dtype=np.float64)


def draw_theta_saturated(complete: IntArray, alpha: float, rng: np.random.Generator) -> FloatArray:
    """The posterior step under the saturated joint with a Dirichlet(alpha) prior (conjugate):
    theta ~ Dirichlet(z + alpha), one draw per chain (DESIGN 13)."""
    return dirichlet_rows(np.asarray(complete + alpha, dtype=np.float64), rng)


@dataclass(frozen=True)
class LogLinearModel:
    """A hierarchical log-linear model given by its generating class: ``generators`` (each a sorted
    tuple of attribute indices into ``sizes``, the attributes' numbers of levels in the project's
    joint-code order, the first attribute most significant: ``theta.reshape(sizes)``)."""

    sizes: tuple[int, ...]
    generators: tuple[tuple[int, ...], ...]

    @property
    def joint_size(self) -> int:
        return math.prod(self.sizes)

    @property
    def saturated(self) -> bool:
        """True when one generator holds every attribute (the Dirichlet step is then exact)."""
        return any(len(g) == len(self.sizes) for g in self.generators)

    def describe(self) -> str:
        """The class as R's loglin margins read: ``[(0, 1), (1, 2)]``."""
        return "[" + ", ".join("(" + ", ".join(map(str, g)) + ("," if len(g) == 1 else "") + ")"
                               for g in self.generators) + "]"  # fmt: skip


def check_generating_class(
    generators: Sequence[Sequence[int | str]], sizes: Sequence[int], names: Sequence[str] | None = None
) -> LogLinearModel:
    """Validate a generating class and return its :class:`LogLinearModel`.

    A generator lists attributes by index into ``sizes`` or, with ``names``, by name. Every
    generator must be non-empty and name distinct existing attributes, and every attribute must be
    in some generator (an attribute in none would be imputed as uniform, never what a user means).
    Generators contained in another are dropped (they add no constraint)."""
    dims = tuple(int(k) for k in sizes)
    if not dims or any(k < 1 for k in dims):
        raise InvalidGeneratingClassError(f"attribute sizes must be integers >= 1, got {list(sizes)}")
    if names is not None and len(names) != len(dims):
        raise InvalidGeneratingClassError(f"{len(names)} attribute names for {len(dims)} sizes")
    if isinstance(generators, str) or not generators:
        raise InvalidGeneratingClassError("a generating class is a non-empty list of generators (lists of attributes)")
    resolved: list[tuple[int, ...]] = []
    for generator in generators:
        if isinstance(generator, str | int) or not generator:
            raise InvalidGeneratingClassError(
                f"each generator is a non-empty list of attributes, got {generator!r}: write (0,) for one attribute"
            )
        indices = [_attribute_index(item, dims, names) for item in generator]
        if len(set(indices)) != len(indices):
            raise InvalidGeneratingClassError(f"generator {tuple(generator)!r} names an attribute twice")
        resolved.append(tuple(sorted(indices)))
    missing = sorted(set(range(len(dims))) - {j for g in resolved for j in g})
    if missing:
        shown = [names[j] for j in missing] if names is not None else missing
        raise InvalidGeneratingClassError(
            f"attributes {shown} are in no generator: they would be imputed as uniform; add each to a generator "
            f"(alone, e.g. ({missing[0]},), for independence of the rest)"
        )
    maximal = [g for g in dict.fromkeys(resolved) if not any(set(g) < set(h) for h in resolved)]
    return LogLinearModel(dims, tuple(maximal))


def _attribute_index(item: int | str, dims: tuple[int, ...], names: Sequence[str] | None) -> int:
    if isinstance(item, str):
        if names is None or item not in names:
            raise InvalidGeneratingClassError(f"attribute {item!r} is not one of {list(names or [])}")
        return list(names).index(item)
    if isinstance(item, bool) or not isinstance(item, int | np.integer) or not 0 <= int(item) < len(dims):
        raise InvalidGeneratingClassError(f"attribute {item!r} is not an index in [0, {len(dims)})")
    return int(item)


def bayesian_ipf_cycle(
    theta: FloatArray, complete: IntArray, alpha: float, model: LogLinearModel, rng: np.random.Generator
) -> FloatArray:
    """One cycle of Bayesian IPF (Schafer 1997, ch. 8; R package ``cat``, ``bipf``/``dabipf``;
    Gelman et al., BDA): for each generator G in turn, draw the G-margin
    theta*_G ~ Dirichlet(z_G + alpha_G), where z_G is the complete counts' G-margin and alpha_G
    the prior's G-margin (alpha times the number of cells summed into each margin cell, as ``cat``
    sums its prior), and rescale theta(x) *= theta*_G(x_G) / theta_G(x_G). The cycle leaves the
    posterior under the model with the constrained Dirichlet prior invariant; for a decomposable
    model it is an exact draw (the hyper-Dirichlet posterior). ``theta`` must lie inside the model
    (uniform does); the rows are chains."""
    chains = theta.shape[0]
    shape = (chains, *model.sizes)
    table = theta.reshape(shape).copy()
    counts = complete.reshape(shape)
    for generator in model.generators:
        summed = tuple(1 + j for j in range(len(model.sizes)) if j not in generator)
        cells_per_margin = math.prod(model.sizes[j] for j in range(len(model.sizes)) if j not in generator)
        margin = table.sum(axis=summed, keepdims=True)
        count_margin = counts.sum(axis=summed, keepdims=True)
        flat = (count_margin + alpha * cells_per_margin).reshape(chains, -1)
        drawn = dirichlet_rows(flat, rng).reshape(margin.shape)
        table *= drawn / np.where(margin > 0, margin, 1.0)
    out = table.reshape(chains, -1)
    return np.asarray(out / out.sum(axis=1, keepdims=True), dtype=np.float64)


def observed_log_likelihood(observed: IntArray, theta: FloatArray, keep: float, off_diagonal: float) -> FloatArray:
    """log P(o | theta) up to the multinomial constant: sum_y o_y log(b + a theta_y), per chain."""
    seen = observed > 0
    mixed = off_diagonal + keep * theta[:, seen]
    return np.asarray(np.log(mixed) @ observed[seen].astype(np.float64), dtype=np.float64)
