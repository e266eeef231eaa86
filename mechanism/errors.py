"""Named errors, one hierarchy for the whole project. Every message says what was wrong and
what is allowed.

Each class names its :class:`ErrorKind`, a wire-neutral category; ``infra.errors`` holds the
one table that maps kinds to gRPC status codes for every service (this package imports no grpc).
"""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    """What kind of failure an error is, independent of any transport."""

    INVALID_ARGUMENT = "invalid_argument"  # the request itself is malformed or out of range
    NOT_FOUND = "not_found"  # it names something that does not exist (here)
    ALREADY_EXISTS = "already_exists"  # it conflicts with something already stored
    FAILED_PRECONDITION = "failed_precondition"  # valid, but not in the current state
    PERMISSION_DENIED = "permission_denied"  # the caller may not do this
    RESOURCE_EXHAUSTED = "resource_exhausted"  # a budget or a configured bound is used up
    UNAVAILABLE = "unavailable"  # transient: try again later


class SecureReleaseError(ValueError):
    """Base class of every error this project raises on bad input."""

    kind: ErrorKind = ErrorKind.INVALID_ARGUMENT


class InvalidNameError(SecureReleaseError):
    """A release id or party name breaks the grammar [A-Za-z0-9][A-Za-z0-9._-]{0,127}."""


class DuplicateNameError(SecureReleaseError):
    """A list of names that must be distinct (curators, parties) repeats one."""


class TooFewCuratorsError(SecureReleaseError):
    """A release needs at least two curators."""


class UnknownCipherError(SecureReleaseError):
    """A cipher mode other than the supported ones (otp, chacha20)."""


class EmptySampleError(SecureReleaseError):
    """An estimate was asked of zero observed rows."""


class UnknownDatasetError(SecureReleaseError):
    """A named (bundled or synthetic) dataset that does not exist."""


class UnknownEstimatorError(SecureReleaseError):
    """An estimator name other than the supported ones (raw, projected, mle)."""


class InvalidCountsError(SecureReleaseError):
    """A count table has negative, non-integer or no counts."""


class UnknownCategoryError(SecureReleaseError):
    """A value is not one of the attribute's declared categories."""


class InvalidBinsError(SecureReleaseError):
    """An attribute's bins (public edges), clamp or schema fields are malformed."""


class EmptyDomainError(SecureReleaseError):
    """An attribute, a curator or a joint alphabet has no categories."""


class AlphabetOverflowError(SecureReleaseError):
    """An alphabet is too large for the integer type that carries its symbols."""


class SymbolOutOfRangeError(SecureReleaseError):
    """A symbol is outside Z_k for its alphabet size k."""


class InvalidGammaError(SecureReleaseError):
    """gamma must be a finite number > 1."""


class InvalidSampleSizeError(SecureReleaseError):
    """m must be an integer in [1, n] (and n >= 1)."""


class InvalidEpsilonError(SecureReleaseError):
    """epsilon must be a finite number > 0."""


class NonFiniteInputError(SecureReleaseError):
    """An input that must be a finite number is NaN or infinite."""


class InvalidSeedError(SecureReleaseError):
    """A seed or key has the wrong length or type."""


class PadReuseError(SecureReleaseError):
    """A pad (key) was asked to encrypt a second time."""

    kind = ErrorKind.FAILED_PRECONDITION


class BudgetExceededError(SecureReleaseError):
    """A release would take a dataset's privacy loss past its budget."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


class PolicyEpsilonError(SecureReleaseError):
    """A release's epsilon differs from the per-release epsilon its budget's accounting policy
    fixed (the PLD count of releases holds only for that epsilon)."""

    kind = ErrorKind.FAILED_PRECONDITION


class SeedReuseError(SecureReleaseError):
    """A sampling seed was used for a second release; a reused sample gets no amplification.
    A refusal (exit 3 at every party, ALREADY_EXISTS on the wire): the seed or release id is
    already spent."""

    kind = ErrorKind.ALREADY_EXISTS


class ShapeMismatchError(SecureReleaseError):
    """Arrays that must agree in length or alphabet do not."""


class GammaAboveClaimError(InvalidGammaError):
    """A declared gamma is above Eq. 2's value: the release would be less private than claimed."""


class GammaMismatchError(InvalidGammaError):
    """A declared gamma is further below Eq. 2's value than the allowed tolerance."""


class UnknownIntervalMethodError(SecureReleaseError):
    """A confidence-interval method name is not one this project implements."""


class InvalidLevelError(SecureReleaseError):
    """A confidence level must be a finite number strictly between 0 and 1."""


class InvalidGroupsError(SecureReleaseError):
    """A categorical attribute's public hierarchy (``"groups"``) is malformed: every category but
    the missing label must be in exactly one non-empty, named group."""


class SearchTooLargeError(SecureReleaseError):
    """The search for schema changes (``plan --suggest``) would enumerate more combinations than
    its bound, even with every binned attribute's merges thinned."""


class InvalidSuggestionLimitError(SecureReleaseError):
    """How many suggestions ``plan --suggest`` lists (``limit``, ``--max-suggestions``) must be an
    integer >= 1."""


class UnknownAttributeError(UnknownCategoryError):
    """An analysis names an attribute the release does not have (the message lists those it has)."""


class RepeatedAttributeError(SecureReleaseError):
    """An analysis names one attribute twice: twice in a list, or in both a and given."""


class OldResultError(SecureReleaseError):
    """A saved result written before reports carried the observed counts: it cannot be analysed;
    the message says how to fetch it again."""


class NotNestedModelsError(SecureReleaseError):
    """A deviance test of two models that are not nested (same outcome, the reduced model's terms
    a strict subset of the full model's)."""


class TooFewLevelsError(SecureReleaseError):
    """An independence test needs at least two levels on each of the two tested attributes."""


class EmptyStratumError(SecureReleaseError):
    """A stratum of the conditioning attribute has no observed records; merge its levels or test
    without conditioning on it."""


class InvalidKeepError(SecureReleaseError):
    """A PRAM keep probability a must be a finite number in (0, 1]."""


class UnknownTestMethodError(SecureReleaseError):
    """A p-value method other than the supported ones (auto, bootstrap, chi2)."""


class InvalidDrawsError(SecureReleaseError):
    """A parametric bootstrap needs an integer number of draws >= 1."""


class TooFewOutcomeLevelsError(TooFewLevelsError):
    """A regression's outcome needs at least two levels (logistic: 2, multinomial: more)."""


class DesignRowsError(ShapeMismatchError):
    """A regression's design matrix must have one row per covariate cell (the columns of the
    observed table) and one name per column."""


class RankDeficientDesignError(SecureReleaseError):
    """A regression's design matrix (or its rows with observed records, at keep = 1) is not of
    full column rank: some coefficient is not identified; drop or merge a column."""


class InvalidInteractionError(SecureReleaseError):
    """A design's interaction must name two distinct attributes by their index."""


class DifferentTablesError(NotNestedModelsError):
    """A deviance test of two fits of different observed tables (or keep probabilities): the
    likelihoods are not comparable."""


class FlatLikelihoodWarning(UserWarning):
    """A fitted model's likelihood is (nearly) flat along some coefficient, even where the fit
    converged: its standard error is above 10 on the logit scale, or not finite (the information
    matrix is singular there), because too few records inform it (a covariate level with almost
    none at a small m). The coefficient is not estimated; merge bins or levels, spend more epsilon
    or release more records. A warning, not an error: the fit is returned, flagged
    (``ModelFit.not_estimated``)."""


class InvalidQuestionError(SecureReleaseError):
    """A researcher's question is not one of the forms a design plans: ``A ~ B`` (independence),
    ``A ~ B | C + D`` (independence given a set) or ``Y ~ X1 + X2`` (a model: an outcome and two or
    more predictors); a side is empty, a token is neither a name nor ``~``, ``+`` or ``|``, or a
    question is asked twice."""


class MultiTableResultError(SecureReleaseError):
    """A result of a release of several tables read where one table is expected (a reader of
    single-table results, or ``ReleaseReport.from_dict``): it never reads one of the tables as the
    whole; load it with ``load_result`` of a version that knows ``secure-release/result/2``."""


class NoTableHoldsError(UnknownAttributeError):
    """An analysis names attributes that no single table of a release of several tables holds
    together; the message lists the release's tables."""


class DesignMismatchError(SecureReleaseError):
    """A curator runs a different design than the leader (their digests differ), or a design that
    does not fit the release (its schemas, its tables)."""
