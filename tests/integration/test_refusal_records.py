"""A curator's refusal before the agreement, recorded at the server (``DeclareRelease``) and read
by the researcher's wait (``GetRefusals``): who may write one, when it shows, and its bounds.

An outsider (a curator certificate no party of the release names) cannot make the release look
refused; a researcher cannot write at all (the access table); an oversized reason is
INVALID_ARGUMENT and nothing is stored; the wire round-trips every reason class."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support import code_of, make_params, register_all

from secure_release.infra import tls, wire
from secure_release.infra.wire import MAX_REFUSAL_DETAIL, Declaration, DeclarationError, Refusal, RefusalClass
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.client import Endpoints, RefusedBeforeAgreementError, wait_perturbed
from secure_release.server.refusals import MAX_DECLARATIONS_PER_CURATOR, shown
from secure_release.server.service import ReleaseService
from secure_release.server.store import Store


@pytest.fixture()
def served(certs: Path, tmp_path: Path) -> Iterator[tuple[int, Store]]:
    store = Store(tmp_path / "store")
    server = tls.make_grpc_server(max_workers=4)
    pb_grpc.add_ReleaseServerServicer_to_server(ReleaseService(store), server)
    port = tls.bind(server, "127.0.0.1", 0, certs / "server", "server")
    server.start()
    yield port, store
    server.stop(0).wait()
    store.close()


def _stub(certs: Path, port: int, name: str, role: str = "curator") -> pb_grpc.ReleaseServerStub:
    channel = tls.secure_channel(f"127.0.0.1:{port}", certs / name, name, role=role, peer_role="server")
    return pb_grpc.ReleaseServerStub(channel)


def _declare(stub: pb_grpc.ReleaseServerStub, d: Declaration) -> list[Refusal]:
    return wire.refusals_from_pb(stub.DeclareRelease(wire.declaration_to_pb(d), timeout=5))


def _shown(stub: pb_grpc.ReleaseServerStub, rid: str) -> list[Refusal]:
    return wire.refusals_from_pb(stub.GetRefusals(pb.RefusalQuery(release_id=rid), timeout=5))


def test_every_reason_class_round_trips_on_the_wire() -> None:
    for cls in RefusalClass:
        d = Declaration("r1", "alice", ("alice", "bob"), cls, "NoBudgetError")
        assert wire.declaration_from_pb(wire.declaration_to_pb(d)) == d
        r = Refusal("r1", "alice", cls, "x")
        assert wire.refusals_from_pb(wire.refusals_to_pb([r])) == [r]
    plain = Declaration("r1", "bob", ("alice", "bob"))
    assert wire.declaration_from_pb(wire.declaration_to_pb(plain)) == plain
    with pytest.raises(DeclarationError):
        wire.declaration_from_pb(pb.ReleaseDeclaration(release_id="r1", curator="alice", reason_class=99))  # type: ignore[arg-type]
    with pytest.raises(DeclarationError):  # a party list without the declaring curator
        Declaration("r1", "alice", ("bob", "carol")).validate()


def test_a_leader_refusal_shows_once_a_follower_names_it_and_the_researcher_stops_at_once(
    certs: Path, served: tuple[int, Store]
) -> None:
    port, _ = served
    alice, bob = _stub(certs, port, "alice"), _stub(certs, port, "bob")
    refused = Declaration("r1", "alice", ("alice", "bob"), RefusalClass.BUDGET, "NoBudgetError")
    assert _declare(alice, refused) == []  # nobody else confirmed alice takes part in r1 yet
    assert _declare(bob, Declaration("r1", "bob", ("alice", "bob"))) == [
        Refusal("r1", "alice", RefusalClass.BUDGET, "NoBudgetError")
    ]
    researcher = _stub(certs, port, "researcher", role="researcher")
    assert [r.curator for r in _shown(researcher, "r1")] == ["alice"]
    t0 = time.monotonic()
    with pytest.raises(RefusedBeforeAgreementError) as err:
        wait_perturbed(Endpoints(certs / "researcher", "researcher", False, f"127.0.0.1:{port}"), "r1", 30)
    assert time.monotonic() - t0 < 5
    assert "alice" in str(err.value) and "budget" in str(err.value) and str(err.value).startswith("refused: ")
    # a researcher naming its curators believes only their refusals
    with pytest.raises(Exception) as other:
        wait_perturbed(Endpoints(certs / "researcher", "researcher", False, f"127.0.0.1:{port}", {"bob": "x:1"}),
                       "r1", 1.0)  # fmt: skip
    assert not isinstance(other.value, RefusedBeforeAgreementError)
    # alice's rerun under the same id (her budget set meanwhile) replaces her record: no refusal
    assert _declare(alice, Declaration("r1", "alice", ("alice", "bob"))) == []
    assert _shown(researcher, "r1") == []


def test_an_outsider_cannot_make_a_release_look_refused(certs: Path, served: tuple[int, Store]) -> None:
    port, store = served
    carol, alice, bob = _stub(certs, port, "carol"), _stub(certs, port, "alice"), _stub(certs, port, "bob")
    # carol, no party of r2, refuses it and names herself and alice: nobody confirms her
    _declare(carol, Declaration("r2", "carol", ("alice", "carol"), RefusalClass.DATA, "BadRowsError"))
    _declare(alice, Declaration("r2", "alice", ("alice", "bob")))
    _declare(bob, Declaration("r2", "bob", ("alice", "bob")))
    assert _shown(bob, "r2") == []
    # nor by registering a spec of her own that names alice: only carol registered it
    params = make_params(rid="r2")
    params.curators[:] = ["alice", "carol"]
    carol.RegisterPart(pb.RegisterPartRequest(params=params, curator="carol"), timeout=5)
    assert _shown(alice, "r2") == []
    # she cannot write as alice
    as_alice = Declaration("r2", "alice", ("alice", "bob"), RefusalClass.KEY, "")
    assert code_of(lambda: carol.DeclareRelease(wire.declaration_to_pb(as_alice), timeout=5)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    # once alice and bob bound the real spec, only its curators' refusals may show
    register_all({"alice": alice, "bob": bob}, make_params(rid="r3"))
    _declare(carol, Declaration("r3", "carol", ("carol",), RefusalClass.SEED, ""))
    _declare(bob, Declaration("r3", "bob", ("alice", "bob", "carol")))  # even if bob named her
    assert _shown(alice, "r3") == []
    _declare(bob, Declaration("r3", "bob", ("alice", "bob"), RefusalClass.SEED, "SeedReuseError"))
    assert [(r.curator, r.reason_class) for r in _shown(alice, "r3")] == [("bob", RefusalClass.SEED)]
    assert [r.curator for r in store.refusals("r3")] == ["bob"]


def test_a_researcher_cannot_write_a_refusal(certs: Path, served: tuple[int, Store]) -> None:
    port, store = served
    researcher = _stub(certs, port, "researcher", role="researcher")
    d = Declaration("r4", "alice", ("alice", "bob"), RefusalClass.BUDGET, "")
    assert code_of(lambda: researcher.DeclareRelease(wire.declaration_to_pb(d), timeout=5)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert store.declarations.of("r4") == []


def test_an_oversized_reason_is_refused_and_nothing_is_stored(certs: Path, served: tuple[int, Store]) -> None:
    port, store = served
    alice = _stub(certs, port, "alice")
    big = pb.ReleaseDeclaration(release_id="r5", curator="alice", parties=["alice", "bob"],
                                reason_class=pb.REFUSAL_CLASS_DATA, detail="x" * (MAX_REFUSAL_DETAIL + 1))  # fmt: skip
    assert code_of(lambda: alice.DeclareRelease(big, timeout=5)) == grpc.StatusCode.INVALID_ARGUMENT
    many = pb.ReleaseDeclaration(release_id="r5", curator="alice", parties=["alice", *(f"c{i}" for i in range(16))])
    assert code_of(lambda: alice.DeclareRelease(many, timeout=5)) == grpc.StatusCode.INVALID_ARGUMENT
    assert store.declarations.of("r5") == []


def test_one_curator_keeps_a_bounded_number_of_records(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    try:
        for i in range(MAX_DECLARATIONS_PER_CURATOR + 5):
            store.declare(Declaration(f"r{i}", "carol", ("carol",)), "carol")
        (count,) = store._db.execute("SELECT COUNT(*) FROM declarations WHERE curator = 'carol'").fetchone()
        assert count == MAX_DECLARATIONS_PER_CURATOR
        assert store.declarations.of("r0") == []  # the oldest made room
    finally:
        store.close()


def test_the_rule_alone() -> None:
    refusing = Declaration("r", "alice", ("alice", "bob"), RefusalClass.BUDGET, "")
    assert shown([refusing], []) == []
    assert shown([refusing], [(("alice", "bob"), ["alice"], False)]) == []  # self-registered only
    assert [r.curator for r in shown([refusing], [(("alice", "bob"), ["bob"], False)])] == ["alice"]
    assert shown([refusing], [(("bob", "carol"), ["bob", "carol"], True)]) == []  # bound without alice
