"""The pure release state machine."""

from __future__ import annotations

import dataclasses

import pytest

from secure_release.mechanism.errors import InvalidGammaError, ShapeMismatchError, TooFewCuratorsError
from secure_release.mechanism.primitives.packing import CHUNK_ROWS
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.server import state as st


def params(
    m: int = CHUNK_ROWS + 5, n: int = 10 * CHUNK_ROWS, sizes: tuple[int, ...] = (3, 4), **kw: object
) -> ReleaseSpec:
    """A valid spec; ``kw`` replaces spec fields, ``gamma`` replaces the plan's gamma."""
    plan = plan_release(n, sizes, 1.0, m)
    if "gamma" in kw:
        plan = dataclasses.replace(plan, gamma=kw.pop("gamma"))  # type: ignore[arg-type]
    spec = ReleaseSpec("r1", ("alice", "bob"), CipherMode.CHACHA20, plan)
    return dataclasses.replace(spec, **kw)  # type: ignore[arg-type]


def test_full_lifecycle() -> None:
    rel = st.Release.create(params())
    assert rel.register(params(), "alice", "alice") and rel.register(params(), "bob", "bob")
    assert not rel.register(params(), "alice", "alice")  # idempotent
    assert rel.state == st.ReleaseState.REGISTERED
    for c in ("alice", "bob"):
        assert rel.accept_chunk(c, c, 0, CHUNK_ROWS, b"a" * 32)
        assert not rel.accept_chunk(c, c, 0, CHUNK_ROWS, b"a" * 32)
        assert rel.accept_chunk(c, c, 1, 5, b"b" * 32)
    assert rel.state == st.ReleaseState.UPLOADING
    assert not rel.commit("alice", "alice", 2, b"d", b"d")
    assert rel.commit("bob", "bob", 2, b"d", b"d")
    assert rel.state == st.ReleaseState.SEALED
    with pytest.raises(st.NotReadyError):
        rel.check_fetch()
    rel.perturbed(b"p")
    rel.check_fetch()
    with pytest.raises(st.NotReadyError):
        rel.perturbed(b"p")


@pytest.mark.parametrize(
    "change",
    [
        dict(n=10 * CHUNK_ROWS + 1),
        dict(m=7),
        dict(sizes=(4, 3)),
        dict(cipher=CipherMode.OTP),
        dict(curators=("bob", "alice")),
    ],
)
def test_mismatched_parameters(change: dict[str, object]) -> None:
    rel = st.Release.create(params())
    rel.register(params(), "alice", "alice")
    other = params(**change)  # gamma stays consistent: only the mismatch is tested
    with pytest.raises(st.ParameterMismatchError):
        rel.register(other, "bob", "bob")
    assert not rel.parts["bob"].registered


def test_invalid_params_and_identity() -> None:
    with pytest.raises(InvalidGammaError, match="gamma"):
        st.Release.create(params(gamma=3.0))
    with pytest.raises(TooFewCuratorsError):
        st.Release.create(params(curators=("alice",), sizes=(3,)))
    with pytest.raises(ShapeMismatchError):
        st.Release.create(params(curators=("alice", "bob", "carol")))
    rel = st.Release.create(params())
    with pytest.raises(st.NotACuratorError):
        rel.register(params(), "alice", "bob")
    with pytest.raises(st.NotACuratorError):
        rel.register(params(), "mallory", "mallory")


def test_chunk_rules() -> None:
    rel = st.Release.create(params())
    with pytest.raises(st.NotRegisteredError):
        rel.accept_chunk("alice", "alice", 0, CHUNK_ROWS, b"a")
    rel.register(params(), "alice", "alice")
    with pytest.raises(st.ChunkShapeError):
        rel.accept_chunk("alice", "alice", 0, CHUNK_ROWS - 1, b"a")
    with pytest.raises(st.ChunkShapeError):
        rel.accept_chunk("alice", "alice", 1, 4, b"a")
    with pytest.raises(st.ChunkShapeError):
        rel.accept_chunk("alice", "alice", 2, 5, b"a")
    rel.accept_chunk("alice", "alice", 0, CHUNK_ROWS, b"a")
    with pytest.raises(st.ConflictingChunkError):
        rel.accept_chunk("alice", "alice", 0, CHUNK_ROWS, b"z")
    with pytest.raises(st.IncompleteUploadError):
        rel.commit("alice", "alice", 2, b"d", b"d")
    rel.accept_chunk("alice", "alice", 1, 5, b"b")
    with pytest.raises(st.IncompleteUploadError):
        rel.commit("alice", "alice", 2, b"d", b"other")
    assert not rel.parts["alice"].committed
    rel.commit("alice", "alice", 2, b"d", b"d")
    with pytest.raises(st.ReleaseSealedError):
        rel.accept_chunk("alice", "alice", 2, 5, b"c")


def test_abort_before_sealing_and_never_after() -> None:
    rel = st.Release.create(params())
    rel.register(params(), "alice", "alice")
    rel.accept_chunk("alice", "alice", 0, CHUNK_ROWS, b"a" * 32)
    with pytest.raises(st.NotACuratorError):
        rel.abort("bob", "alice", "not yours")
    with pytest.raises(st.NotACuratorError):
        rel.abort("mallory", "mallory", "not a member")
    assert rel.abort("bob", "bob", "epsilon differs") and rel.state == st.ReleaseState.ABORTED
    assert not rel.abort("alice", "alice", "again")  # idempotent
    assert rel.abort_reason == "bob: epsilon differs"
    # an identical replay still succeeds; anything new is refused with the reason
    assert not rel.accept_chunk("alice", "alice", 0, CHUNK_ROWS, b"a" * 32)
    with pytest.raises(st.AbortedAtServerError, match="epsilon differs"):
        rel.accept_chunk("alice", "alice", 1, 5, b"b" * 32)
    with pytest.raises(st.AbortedAtServerError):
        rel.register(params(), "bob", "bob")
    with pytest.raises(st.NotReadyError):
        rel.check_fetch()

    sealed = st.Release.create(params())
    for c in ("alice", "bob"):
        sealed.register(params(), c, c)
        sealed.accept_chunk(c, c, 0, CHUNK_ROWS, b"a" * 32)
        sealed.accept_chunk(c, c, 1, 5, b"b" * 32)
        sealed.commit(c, c, 2, b"d", b"d")
    with pytest.raises(st.ReleaseSealedError, match="can no longer be aborted"):
        sealed.abort("alice", "alice", "too late")


def test_replays_succeed_in_every_state() -> None:
    rel = st.Release.create(params())
    for c in ("alice", "bob"):
        rel.register(params(), c, c)
        rel.accept_chunk(c, c, 0, CHUNK_ROWS, b"a" * 32)
        rel.accept_chunk(c, c, 1, 5, b"b" * 32)
        rel.commit(c, c, 2, b"d", b"d")
    for state_change in (None, b"p"):
        if state_change:
            rel.perturbed(state_change)
        assert not rel.accept_chunk("alice", "alice", 1, 5, b"b" * 32)
        assert not rel.commit("alice", "alice", 2, b"d", b"")
        with pytest.raises(st.ReleaseSealedError):
            rel.accept_chunk("alice", "alice", 1, 5, b"c" * 32)
