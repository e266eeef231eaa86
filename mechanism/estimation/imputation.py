"""Proper multiple imputation of a release's true cells (DESIGN 13; Rubin 1987).

A release holds o, the perturbed counts of m records over K joint cells, and the channel
A = a I + b J (:class:`PramChannel`). The records' true cells are missing data with a known
misclassification channel, so data augmentation (Tanner and Wong 1987) draws them from their
posterior: alternately the complete counts z given theta and o
(:func:`~.loglinear_draws.impute_complete_counts`, O(K)) and theta given z, under the saturated
joint (a Dirichlet draw) or a hierarchical log-linear model named by its generating class (a
cycle of Bayesian IPF, :func:`~.loglinear_draws.bayesian_ipf_cycle`).

Prior: Dirichlet(alpha) per cell, by default the uniform prior on the simplex, alpha = 1
(:data:`DEFAULT_ALPHA`, Bayes-Laplace); under a log-linear model the constrained Dirichlet prior of
that per-cell hyperparameter. Not Jeffreys' alpha = 1/2 (:data:`JEFFREYS_ALPHA`, still offered):
its density is infinite on the simplex's faces, so where the keep probability is low the chain
lingers on empty cells, and an imputation with an empty cell separates a logistic fit. Measured on
n = 2,000 records, K = 8, epsilon 0.5 (m = 220, keep 0.42), 200 releases of 20 imputations each:
with alpha = 1/2, 18-26% of releases had such an imputation and the pooled interval of a logistic
coefficient was 1.34x the PRAM-likelihood fit's; with alpha = 1, 0.5-2.5% and 1.13x, coverage
0.965-0.985 at both (docs/analysis.md, "Any model: multiply-imputed records").

Randomness: a numpy ``Generator`` the caller seeds. The imputations are post-processing of a
released table, not privacy-critical: any seeded generator will do and a seed reproduces them.

Chains: ``chains`` (at least 2) run in lockstep from random starts (one theta step with the
observed counts taken as complete). By default a pilot of :data:`PILOT_SWEEPS` sweeps measures
the per-sweep rate rho of the slowest summary (:func:`~.mixing.slowest_rate`) and the spacing
is the smallest s with rho^s <= 0.0025 (:func:`~.mixing.choose_spacing`); then burn-in up to
:data:`BURN_IN_SPACINGS` spacings since the start (the pilot's sweeps count); then the M
imputations, round-robin across the chains, one every s sweeps of a chain.
The result carries the split-R-hat (Vehtari et al. 2021, rank-normalised, bulk and tail) and
the autocorrelations measured on every sweep after the burn-in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from secure_release.mechanism import printing
from secure_release.mechanism.errors import (
    EmptySampleError,
    InvalidCountsError,
    InvalidSeedError,
    SecureReleaseError,
    ShapeMismatchError,
)
from secure_release.mechanism.estimation import loglinear_draws as draws
from secure_release.mechanism.estimation import mixing
from secure_release.mechanism.estimation.loglinear_draws import (
    InvalidGeneratingClassError,
    LogLinearModel,
    check_generating_class,
)
from secure_release.mechanism.primitives.pram import PramChannel

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Jeffreys' Dirichlet hyperparameter (offered, not the default: see the module docstring).
JEFFREYS_ALPHA = 0.5
#: The default prior per cell: the uniform Dirichlet on the simplex (Bayes-Laplace).
DEFAULT_ALPHA = 1.0
#: Sweeps of the pilot run that measures the per-sweep autocorrelation (when no spacing is given).
PILOT_SWEEPS = 100
#: Warm-up before the first imputation, in spacings, the pilot's sweeps included.
BURN_IN_SPACINGS = 5
#: Tables up to this many cells track every cell's theta; larger ones the cells most observed.
ALL_CELLS_UP_TO = 16
#: Larger tables: the cells with the largest observed counts tracked one by one.
TRACKED_CELLS = 6

__all__ = [
    "ChannelSizeError",
    "ImputationResult",
    "InvalidGeneratingClassError",
    "InvalidPriorError",
    "InvalidSpacingError",
    "LogLinearModel",
    "MixingDiagnostics",
    "TooFewChainsError",
    "TooFewImputationsError",
    "check_counts",
    "check_generating_class",
    "expand_records",
    "impute",
    "posterior_theta",
]


class TooFewImputationsError(SecureReleaseError):
    """Rubin's rules need at least two imputations (M >= 2): the between-imputation variance of
    one is undefined."""


class TooFewChainsError(SecureReleaseError):
    """Mixing is measured between chains: at least two chains (an integer >= 2)."""


class InvalidPriorError(SecureReleaseError):
    """The Dirichlet prior's hyperparameter alpha must be a finite number > 0 (Jeffreys: 1/2)."""


class InvalidSpacingError(SecureReleaseError):
    """The spacing between imputations must be an integer >= 1 and the burn-in an integer >= 0."""


class ChannelSizeError(ShapeMismatchError):
    """The counts, the channel and the attribute sizes must describe one joint alphabet of K cells."""


@dataclass(frozen=True)
class MixingDiagnostics:
    """How well the chains mixed, per scalar summary (``summaries``: its names).

    ``rhat``: split-R-hat over the chains (:func:`~.mixing.split_rhat`, rank-normalised, bulk and
    tail) of every sweep after the burn-in; ``sweep_autocorrelation``: the lag-1 autocorrelation
    per sweep there; ``imputation_autocorrelation``: the autocorrelation at the spacing (between
    consecutive imputations of one chain), from every pair of sweeps that far apart;
    ``pilot_autocorrelation``: the slowest per-sweep rho the pilot measured (NaN without a pilot)."""

    summaries: tuple[str, ...]
    rhat: FloatArray
    sweep_autocorrelation: FloatArray
    imputation_autocorrelation: FloatArray
    pilot_autocorrelation: float
    rhat_method: str = "rank-normalised split-R-hat (Vehtari et al. 2021), max of bulk and tail"

    @property
    def max_rhat(self) -> float:
        """The largest R-hat over the summaries (NaN if none is defined)."""
        finite = self.rhat[np.isfinite(self.rhat)]
        return float(finite.max()) if finite.size else math.nan

    @property
    def max_imputation_autocorrelation(self) -> float:
        """The largest |autocorrelation| between consecutive imputations over the summaries."""
        finite = np.abs(self.imputation_autocorrelation[np.isfinite(self.imputation_autocorrelation)])
        return float(finite.max()) if finite.size else math.nan


@dataclass(frozen=True)
class ImputationResult:
    """M imputations of a release's complete counts (DESIGN 13).

    ``imputations``: (M, K) int64, each row the complete counts of the m records (frequency
    weights; :meth:`records` expands one to joint codes); ``theta``: (M, K) the posterior draw of
    the joint drawn with each imputation (posterior draws of theta for users who want them);
    ``chain``: which chain gave each; ``alpha`` and ``prior``: the Dirichlet hyperparameter per cell
    and the prior in words; ``model``: the log-linear model (None: the saturated joint);
    ``spacing``, ``burn_in``, ``pilot_sweeps``: sweeps between imputations of a chain, after the
    pilot before the first, and of the pilot; ``diagnostics``: :class:`MixingDiagnostics`."""

    imputations: IntArray
    theta: FloatArray
    chain: IntArray
    alpha: float
    prior: str
    model: LogLinearModel | None
    spacing: int
    burn_in: int
    pilot_sweeps: int
    chains: int
    diagnostics: MixingDiagnostics

    @property
    def num_imputations(self) -> int:
        return int(self.imputations.shape[0])

    @property
    def m(self) -> int:
        """The records of every imputation."""
        return int(self.imputations[0].sum())

    @property
    def model_text(self) -> str:
        """The imputation model in words."""
        return "saturated joint" if self.model is None else f"log-linear {self.model.describe()}"

    def records(self, index: int) -> IntArray:
        """Imputation ``index`` as m joint codes (:func:`expand_records`)."""
        return expand_records(self.imputations[index])

    def block(self) -> printing.Block:
        """The imputation's settings and the mixing table (one row per summary)."""
        d = self.diagnostics
        pairs = (
            ("Imputations M", str(self.num_imputations)),
            ("Records m", str(self.m)),
            ("Cells K", str(self.imputations.shape[1])),
            ("Chains", str(self.chains)),
            ("Model", self.model_text),
            ("Prior", self.prior),
            ("Pilot sweeps", str(self.pilot_sweeps)),
            ("Burn-in sweeps", str(self.burn_in)),
            ("Spacing (sweeps)", str(self.spacing)),
            ("Max R-hat", printing.sig(d.max_rhat)),
        )
        columns = zip(d.summaries, d.rhat, d.sweep_autocorrelation, d.imputation_autocorrelation, strict=True)
        rows = [(name, printing.sig(r), printing.sig(s), printing.sig(i)) for name, r, s, i in columns]
        return printing.Block(
            "Multiple imputation of a perturbed release", pairs=pairs,
            header=("summary", "R-hat", "lag-1 per sweep", "between imputations"), rows=tuple(rows),
            table_notes=(f"R-hat: {d.rhat_method}.",), ruled=True,
        )  # fmt: skip

    def __str__(self) -> str:
        return self.block().text()

    def __repr__(self) -> str:
        return printing.short_repr(
            "ImputationResult",
            f"M = {self.num_imputations}, m = {self.m}, {self.model_text}, spacing = {self.spacing}, "
            f"max R-hat = {printing.sig(self.diagnostics.max_rhat)}",
        )

    def _repr_html_(self) -> str:
        return self.block().html()


def expand_records(counts: npt.ArrayLike) -> IntArray:
    """One imputation's counts per cell as m joint codes, cell by cell in code order (np.repeat)."""
    c = np.asarray(counts, dtype=np.int64)
    return np.repeat(np.arange(c.size, dtype=np.int64), c)


def check_counts(counts: npt.ArrayLike, channel: PramChannel) -> IntArray:
    """The observed counts as int64: one non-negative integer per cell of the channel's K, m > 0."""
    if not isinstance(channel, PramChannel):
        raise ChannelSizeError(f"the channel must be a PramChannel, got {type(channel).__name__}")
    c = np.asarray(counts)
    if c.ndim != 1 or c.size != channel.joint_size:
        raise ChannelSizeError(f"{c.size} counts in shape {c.shape} for a channel of K = {channel.joint_size} cells")
    if not np.issubdtype(c.dtype, np.number) or not np.all(np.isfinite(c)) or np.any(c < 0) or np.any(c != np.round(c)):
        raise InvalidCountsError("the observed counts must be non-negative integers")
    out = c.astype(np.int64)
    if out.sum() <= 0:
        raise EmptySampleError("no observed records: nothing to impute")
    return out


def _check_settings(num_imputations: int, chains: int, alpha: float, burn_in: int | None, spacing: int | None) -> None:
    if isinstance(num_imputations, bool) or not isinstance(num_imputations, int | np.integer) or num_imputations < 2:
        raise TooFewImputationsError(f"M must be an integer >= 2, got {num_imputations!r}")
    if isinstance(chains, bool) or not isinstance(chains, int | np.integer) or chains < 2:
        raise TooFewChainsError(f"chains must be an integer >= 2, got {chains!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha) or alpha <= 0:
        raise InvalidPriorError(f"alpha must be a finite number > 0 (Jeffreys: 0.5), got {alpha!r}")
    for name, value, low in (("spacing", spacing, 1), ("burn_in", burn_in, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low):
            raise InvalidSpacingError(f"{name} must be an integer >= {low}, got {value!r}")


def _resolve_model(
    model: Sequence[Sequence[int | str]] | None, sizes: Sequence[int] | None, names: Sequence[str] | None, K: int
) -> LogLinearModel | None:
    if model is None:
        return None
    if sizes is None:
        raise InvalidGeneratingClassError("a log-linear model needs the attributes' sizes (sizes=...)")
    resolved = check_generating_class(model, sizes, names)
    if resolved.joint_size != K:
        raise ChannelSizeError(
            f"attribute sizes {list(resolved.sizes)} make {resolved.joint_size} cells, the channel {K}"
        )
    return None if resolved.saturated else resolved


@dataclass
class _Chains:
    """The lockstep chains' state and what one sweep needs."""

    observed: IntArray
    keep: float
    off_diagonal: float
    alpha: float
    model: LogLinearModel | None
    rng: np.random.Generator
    theta: FloatArray
    tracked: npt.NDArray[np.intp]
    low: npt.NDArray[np.intp]

    def theta_step(self, complete: IntArray) -> FloatArray:
        if self.model is None:
            return draws.draw_theta_saturated(complete, self.alpha, self.rng)
        return draws.bayesian_ipf_cycle(self.theta, complete, self.alpha, self.model, self.rng)

    def sweep(self) -> IntArray:
        """One sweep of every chain: z given (theta, o), then theta given z; returns z (C, K)."""
        complete = draws.impute_complete_counts(self.observed, self.theta, self.keep, self.off_diagonal, self.rng)
        self.theta = self.theta_step(complete)
        return complete

    def summaries(self) -> FloatArray:
        """(C, S): the tracked cells' theta, the low cells' total share, the observed log-likelihood."""
        parts = [self.theta[:, self.tracked]]
        if self.low.size:
            parts.append(self.theta[:, self.low].sum(axis=1, keepdims=True))
        loglik = draws.observed_log_likelihood(self.observed, self.theta, self.keep, self.off_diagonal)
        parts.append(loglik[:, None])
        return np.concatenate(parts, axis=1)

    def run(self, sweeps: int) -> FloatArray:
        """``sweeps`` sweeps, returning the trace (C, sweeps, S)."""
        trace = [self._traced() for _ in range(sweeps)]
        if not trace:
            return np.empty((self.theta.shape[0], 0, self.summaries().shape[1]))
        return np.stack(trace, axis=1)

    def advance(self, sweeps: int) -> None:
        """``sweeps`` sweeps, untraced (the burn-in)."""
        for _ in range(sweeps):
            self.sweep()

    def _traced(self) -> FloatArray:
        self.sweep()
        return self.summaries()


def _summary_cells(observed: IntArray) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], tuple[str, ...]]:
    """The cells tracked one by one, the low half tracked as one share, and the summaries' names."""
    K = observed.size
    order = np.argsort(-observed, kind="stable")
    if K <= ALL_CELLS_UP_TO:
        tracked, low = np.arange(K), np.arange(0)
    else:
        tracked, low = np.sort(order[:TRACKED_CELLS]), np.sort(order[K // 2 :])
    names = [f"theta[{int(c)}]" for c in tracked]
    if low.size:
        names.append(f"share of the {low.size} least observed cells")
    names.append("log-likelihood of o")
    return tracked.astype(np.intp), low.astype(np.intp), tuple(names)


def impute(
    counts: npt.ArrayLike,
    channel: PramChannel,
    num_imputations: int,
    rng: np.random.Generator,
    *,
    model: Sequence[Sequence[int | str]] | None = None,
    sizes: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    alpha: float = DEFAULT_ALPHA,
    chains: int = 2,
    burn_in: int | None = None,
    spacing: int | None = None,
) -> ImputationResult:
    """M proper multiple imputations of the release's complete counts (DESIGN 13).

    ``counts``: the observed perturbed counts o (K cells, joint codes); ``channel``: the release's
    PRAM channel; ``rng``: a seeded numpy Generator; ``model``: None for the saturated joint, else a
    generating class over the attributes of ``sizes`` (indices, or names given ``names``), e.g.
    [(0, 1), (0, 2), (1, 2)]; ``alpha``: the Dirichlet hyperparameter per cell (> 0; default 1, uniform);
    ``chains`` (>= 2) in lockstep; ``spacing``: sweeps between imputations of a chain (None: from
    a pilot); ``burn_in``: sweeps before the first imputation, after the pilot (None:
    :data:`BURN_IN_SPACINGS` spacings less the pilot's sweeps, at least 0; without a pilot,
    :data:`PILOT_SWEEPS` plus :data:`BURN_IN_SPACINGS` spacings)."""
    observed = check_counts(counts, channel)
    _check_settings(num_imputations, chains, alpha, burn_in, spacing)
    if not isinstance(rng, np.random.Generator):
        raise InvalidSeedError(f"rng must be a numpy Generator (np.random.default_rng(seed)), got {type(rng).__name__}")
    loglinear = _resolve_model(model, sizes, names, channel.joint_size)
    tracked, low, summary_names = _summary_cells(observed)
    C, M = int(chains), int(num_imputations)
    state = _Chains(observed, channel.keep, channel.off_diagonal, float(alpha), loglinear, rng,
                    np.full((C, observed.size), 1.0 / observed.size), tracked, low)  # fmt: skip
    state.theta = state.theta_step(np.broadcast_to(observed, (C, observed.size)).copy())
    pilot_rho, pilot_sweeps = math.nan, 0
    if spacing is None:
        pilot = state.run(PILOT_SWEEPS)
        pilot_sweeps = PILOT_SWEEPS
        pilot_rho = mixing.slowest_rate(pilot[:, PILOT_SWEEPS // 2 :])
        spacing = mixing.choose_spacing(pilot_rho)
    if burn_in is None:
        burn_in = max(BURN_IN_SPACINGS * int(spacing) - pilot_sweeps, 0) + (PILOT_SWEEPS if pilot_sweeps == 0 else 0)
    state.advance(int(burn_in))
    rounds = -(-M // C)
    imputations = np.empty((rounds * C, observed.size), dtype=np.int64)
    thetas = np.empty((rounds * C, observed.size), dtype=np.float64)
    traces = []
    for r in range(rounds):
        traces.append(state.run(int(spacing) - 1))
        complete = state.sweep()
        traces.append(state.summaries()[:, None, :])
        imputations[r * C : (r + 1) * C] = complete
        thetas[r * C : (r + 1) * C] = state.theta
    trace = np.concatenate(traces, axis=1)
    diagnostics = MixingDiagnostics(
        summary_names, mixing.split_rhat(trace), mixing.lag_autocorrelation(trace, 1),
        mixing.lag_autocorrelation(trace, int(spacing)), pilot_rho,
    )  # fmt: skip
    named = {JEFFREYS_ALPHA: " (Jeffreys)", DEFAULT_ALPHA: " (uniform)"}
    prior = f"Dirichlet({alpha:g}) per cell" + named.get(float(alpha), "")
    return ImputationResult(
        imputations[:M], thetas[:M], np.tile(np.arange(C, dtype=np.int64), rounds)[:M], float(alpha),
        prior if loglinear is None else f"constrained {prior}", loglinear, int(spacing), int(burn_in),
        pilot_sweeps, C, diagnostics,
    )  # fmt: skip


def posterior_theta(
    counts: npt.ArrayLike,
    channel: PramChannel,
    num_draws: int,
    rng: np.random.Generator,
    *,
    model: Sequence[Sequence[int | str]] | None = None,
    sizes: Sequence[int] | None = None,
    alpha: float = DEFAULT_ALPHA,
    chains: int = 2,
) -> FloatArray:
    """``num_draws`` (>= 2) posterior draws of the joint theta, (num_draws, K): the theta drawn
    with each imputation of :func:`impute` (spacing from its pilot)."""
    result = impute(counts, channel, num_draws, rng, model=model, sizes=sizes, alpha=alpha, chains=chains)
    return result.theta
