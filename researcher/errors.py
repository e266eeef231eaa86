"""The researcher's named errors. Each says what was wrong and what is allowed, and names the
:class:`~secure_release.mechanism.errors.ErrorKind` it travels as (``infra.errors``)."""

from __future__ import annotations

from secure_release.infra.streams import FetchError  # defined beside the streams it guards
from secure_release.mechanism.errors import DesignMismatchError, ErrorKind, SecureReleaseError


class ReleaseNotReadyError(FetchError):
    """The release was not PERTURBED on the server within the allowed wait."""

    kind = ErrorKind.UNAVAILABLE


class DigestMismatchError(FetchError):
    """The perturbed rows do not hash to the digest the server published for them."""


class KeyMismatchError(FetchError):
    """A curator's key does not fit the release (curator, cipher, alphabet size, m or schema)."""


class ReleaseDesignMismatchError(KeyMismatchError, DesignMismatchError):
    """A release of several tables whose design, as the curators sent it with their keys, is not
    the release's: its SHA-256 is not the spec's design digest, it does not make the spec's tables
    (m_t, gamma_t, alphabets) at the release's n, or its schema of a curator is not the one that
    curator's key labels. Nothing is estimated."""


class NoKeysError(SecureReleaseError):
    """No curator granted its key: there is nothing the researcher may estimate."""

    kind = ErrorKind.PERMISSION_DENIED


class EstimateNotFoundError(SecureReleaseError):
    """No estimate of the asked release exists here (yet)."""

    kind = ErrorKind.NOT_FOUND


class ReleaseFailedError(SecureReleaseError):
    """Processing a release failed for a reason outside the project's own errors (an RPC)."""

    kind = ErrorKind.FAILED_PRECONDITION


class NotAReaderError(SecureReleaseError):
    """The caller is not among the identities allowed to read this researcher's estimates."""

    kind = ErrorKind.PERMISSION_DENIED
