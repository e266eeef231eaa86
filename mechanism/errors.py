"""Named errors. Every message says what was wrong and what is allowed."""

from __future__ import annotations


class SecureReleaseError(ValueError):
    """Base class of every error this project raises on bad input."""


class UnknownCategoryError(SecureReleaseError):
    """A value is not one of the attribute's declared categories."""


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


class BudgetExceededError(SecureReleaseError):
    """A release would take a dataset's privacy loss past its budget."""


class SeedReuseError(SecureReleaseError):
    """A sampling seed was used for a second release; a reused sample gets no amplification."""


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
