"""The curator's named errors; each names its kind, so ``infra.errors.abort_with`` sends it with
the right gRPC status."""

from __future__ import annotations

from secure_release.infra.streams import AgreementError  # the agreement stream's own error
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError


class ReleaseRefusedError(AgreementError):
    """A party refused the release (its budget, a permission, a bound): every party exits 3
    (refused), with the refusing party's reason."""

    kind = ErrorKind.PERMISSION_DENIED


class SpecRefusedError(AgreementError):
    """This curator refuses the leader's spec (it differs from its own settings); ``spec`` is the
    leader's spec, which the curator joins at the server only to abort it visibly."""

    def __init__(self, message: str, spec: object) -> None:
        super().__init__(message)
        self.spec = spec


class DesignRefusedError(SpecRefusedError):
    """This curator runs another design than the leader (or none where the leader runs one, or
    one where the leader runs none), or the leader's tables are not what its design gives for the
    agreed n: a refusal, exit 3 at every party, naming both digests."""

    kind = ErrorKind.PERMISSION_DENIED


class DesignFileError(SecureReleaseError):
    """``--design FILE`` is missing, unreadable or not a design file (exit 2)."""


class AlphabetSizeMismatchError(AgreementError):
    """A curator's alphabet size contradicts the leader's --alphabet-sizes (or is missing)."""


class AlignmentModeMismatchError(AgreementError):
    """A curator aligns by another mode (--alignment hash/psi) than the leader."""


class AgreementFixedError(AgreementError):
    """Tags arrived that differ from the ones the fixed agreement was computed from."""


class TagsMissingError(SecureReleaseError):
    """The leader holds no tags from the asking curator (it restarted): send them again."""

    kind = ErrorKind.UNAVAILABLE


class AgreementNotReadyError(SecureReleaseError):
    """The leader is still waiting for tags; ask again later."""

    kind = ErrorKind.UNAVAILABLE


class NotLeadingError(SecureReleaseError):
    """The curator asked does not lead the named release."""

    kind = ErrorKind.NOT_FOUND


class UnknownReleaseError(SecureReleaseError):
    """The curator holds no key for the named release."""

    kind = ErrorKind.NOT_FOUND


class WaitTimeoutError(SecureReleaseError):
    """A wait ran past the run's deadline (``--timeout``); the message names what it waited for."""

    kind = ErrorKind.UNAVAILABLE


class StoppedError(SecureReleaseError):
    """The run was stopped (SIGTERM, or Ctrl-C: :attr:`interrupted`, exit 130) before the
    release had an outcome."""

    kind = ErrorKind.UNAVAILABLE

    def __init__(self, message: str, interrupted: bool = False) -> None:
        super().__init__(message)
        self.interrupted = interrupted


def stopped_error(stop: object, what: str) -> StoppedError:
    """The :class:`StoppedError` of a run whose ``stop`` event was set, naming the signal
    (``stop.signal_name``, SIGTERM for a plain event) and ``what`` it stopped."""
    name = getattr(stop, "signal_name", "SIGTERM")
    return StoppedError(f"stopped ({name}) {what}", interrupted=name == "SIGINT")


class ReleaseAbortedError(SecureReleaseError):
    """The release was aborted (by a curator, or at the deadline); the reason is recorded at the
    server and shown to every party."""

    kind = ErrorKind.FAILED_PRECONDITION


class ReleaseAbortedAsRefusedError(ReleaseAbortedError):
    """The release was aborted because a party refused it (the server's recorded reason says
    so): exit 3 (refused), as at the refusing party."""

    kind = ErrorKind.PERMISSION_DENIED


class KeyNotReadyError(SecureReleaseError):
    """This curator takes part in the release but does not serve its key yet (not sealed)."""

    kind = ErrorKind.UNAVAILABLE


class PsiMismatchError(SecureReleaseError):
    """The PSI ring ended with tags that match across no curators: a member sent valid group
    points that were not its honest re-blinding (or its own list), so the release stops."""

    kind = ErrorKind.FAILED_PRECONDITION


class PsiLimitError(SecureReleaseError):
    """A PSI ring list holds more points than the leader accepts (``--max-rows``)."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


class PsiNotReadyError(SecureReleaseError):
    """The PSI list asked for has not reached the leader yet; ask again later."""

    kind = ErrorKind.UNAVAILABLE


class UploadRefusedError(SecureReleaseError):
    """The server refused or did not commit this curator's part, upload or stored table; the
    message carries the server's reason."""
