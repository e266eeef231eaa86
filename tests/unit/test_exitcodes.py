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


class _PeerError(Exception):
    """A gRPC error as a peer's answer reaches a caller (``infra.exitcodes`` reads its status)."""

    is_rpc_error = True

    def __init__(self, status: str, details: str) -> None:
        super().__init__(details)
        self._status, self._details = status, details

    def code(self) -> object:
        return type("Code", (), {"name": self._status})()

    def details(self) -> str:
        return self._details


def _raised_from(peer: BaseException) -> BaseException:
    """The follower's ReleaseRefusedError made of the leader's answer ``peer`` ("from None")."""
    from secure_release.curator.errors import ReleaseRefusedError

    try:
        try:
            raise peer
        except _PeerError as exc:
            raise ReleaseRefusedError(f"the leader alice refused: {exc.code()}: {exc.details()}") from None
    except ReleaseRefusedError as refused:
        return refused


def test_a_data_refusal_is_marked_for_the_others_but_exits_2_at_its_curator() -> None:
    from secure_release.curator.release.failing import classed_reason, refusal_class
    from secure_release.infra.exitcodes import is_refusal
    from secure_release.infra.wire import RefusalClass
    from secure_release.mechanism.alignment.keyed_hash import DuplicateIdError

    exc = DuplicateIdError("id 'p-000417' appears twice")
    assert exit_code_for(exc) == USAGE  # the refusing curator's own bad input: its operator fixes the file
    assert refusal_class(exc) is RefusalClass.DATA
    reason = classed_reason("bob", "r1", exc)
    assert is_refusal(reason) and reason == "refused: bob refuses release 'r1': data (DuplicateIdError)", reason
    assert "p-000417" not in reason  # the error's name, never the value


def test_a_certificate_the_leader_refuses_is_a_key_refusal_of_the_follower() -> None:
    from secure_release.curator.release.failing import classed_reason, refusal_class
    from secure_release.infra.wire import RefusalClass

    revoked = _raised_from(_PeerError("UNAUTHENTICATED", "the client certificate of curator/bob is revoked"))
    assert exit_code_for(revoked) == REFUSED and refusal_class(revoked) is RefusalClass.KEY
    assert classed_reason("bob", "r1", revoked).startswith("refused: bob: ReleaseRefusedError: the leader alice")
    # the leader passing on another party's refusal (a marked reason) is not bob's: that party declares it
    passed_on = _raised_from(_PeerError("PERMISSION_DENIED", "refused: carol refuses release 'r1': budget"))
    assert refusal_class(passed_on) is None
    assert refusal_class(_PeerError("PERMISSION_DENIED", "curator/bob may not call X")) is RefusalClass.KEY
    assert refusal_class(_PeerError("UNAVAILABLE", "connection refused")) is None
