"""The exit-code convention: every error kind maps to one documented code."""

from __future__ import annotations

from secure_release.infra.exitcodes import FAILURE, REFUSED, USAGE, exit_code_for
from secure_release.mechanism.errors import BudgetExceededError, ErrorKind, InvalidEpsilonError, SecureReleaseError


def test_each_kind_has_its_code() -> None:
    expected = {
        ErrorKind.INVALID_ARGUMENT: USAGE,
        ErrorKind.NOT_FOUND: USAGE,
        ErrorKind.ALREADY_EXISTS: REFUSED,
        ErrorKind.FAILED_PRECONDITION: FAILURE,
        ErrorKind.PERMISSION_DENIED: REFUSED,
        ErrorKind.RESOURCE_EXHAUSTED: REFUSED,
        ErrorKind.UNAVAILABLE: FAILURE,
    }
    assert set(expected) == set(ErrorKind)
    for kind, code in expected.items():
        err = SecureReleaseError("x")
        err.kind = kind
        assert exit_code_for(err) == code, kind
    assert exit_code_for(BudgetExceededError("over")) == REFUSED
    assert exit_code_for(InvalidEpsilonError("nan")) == USAGE
    assert exit_code_for(RuntimeError("boom")) == FAILURE
