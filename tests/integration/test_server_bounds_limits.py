# tier: integration
"""Issue 24, item 7: the server's last open doors, over in-process gRPC on 127.0.0.1 port 0.

Finite arithmetic on every epsilon path (1e308 was UNKNOWN, decimal.Overflow), an operator cap on
epsilon (700 was accepted), at most 16 researchers per release (120,000 were) and 16 curators per
stored table (100,000 were), a stored-table quota per certificate (one curator could fill
--max-tables), a full disk as RESOURCE_EXHAUSTED with nothing stored (was UNKNOWN), the budget
witness (only moves up, only for its own curator), and GetEstimate on a fixed pool (150 distinct
release ids started 150 threads)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from secure_release.infra import tls
from secure_release.infra.logs import EventLog
from secure_release.mechanism.primitives.packing import pack_symbols
from secure_release.mechanism.privacy.accounting import gamma_from_epsilon
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.service import MAX_PENDING, PROCESS_WORKERS, ReleaseTracker, ResearcherService
from secure_release.server.service import ReleaseService
from secure_release.server.state import ServerLimits
from secure_release.server.store import Store
from tests import support

pytestmark = pytest.mark.integration


@pytest.fixture
def live(certs: Path, tmp_path: Path) -> Iterator[tuple[Store, dict[str, pb_grpc.ReleaseServerStub]]]:
    store = Store(tmp_path / "store", ServerLimits(max_tables=6, max_tables_per_curator=2))
    server = tls.make_grpc_server(max_workers=4)
    pb_grpc.add_ReleaseServerServicer_to_server(ReleaseService(store), server)
    port = tls.bind(server, "127.0.0.1", 0, certs / "server", "server")
    server.start()
    chans = {n: tls.secure_channel(f"127.0.0.1:{port}", certs / n, n, peer_role="server") for n in ("alice", "bob")}
    yield store, {n: pb_grpc.ReleaseServerStub(c) for n, c in chans.items()}
    for c in chans.values():
        c.close()
    server.stop(0).wait()
    store.close()


def _refused(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


def _register(stub: pb_grpc.ReleaseServerStub, params: pb.ReleaseParams) -> Any:
    return lambda: stub.RegisterPart(pb.RegisterPartRequest(params=params, curator="alice"), timeout=10)


def test_a_huge_epsilon_is_a_named_invalid_argument_not_unknown(live: Any) -> None:
    _, stubs = live
    params = support.make_params(rid="huge")
    params.epsilon, params.gamma = 1e308, 1e308
    err = _refused(_register(stubs["alice"], params))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert err.details().startswith("InvalidEpsilonError") and "too large" in err.details()


def test_epsilon_past_the_operator_cap_is_refused(live: Any) -> None:
    _, stubs = live
    params = support.make_params(rid="e700")
    params.epsilon = 700.0
    params.gamma = gamma_from_epsilon(params.n, params.m, 700.0)
    err = _refused(_register(stubs["alice"], params))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "cap of 20" in err.details()
    ok = support.make_params(rid="e1")
    stubs["alice"].RegisterPart(pb.RegisterPartRequest(params=ok, curator="alice"), timeout=10)


def test_at_most_16_researchers_per_release(live: Any) -> None:
    store, stubs = live
    full = grpc.StatusCode.RESOURCE_EXHAUSTED
    for count, code in ((16, None), (17, full), (120_000, full)):
        params = support.make_params(rid=f"res{count}", researchers=tuple(f"r{i}" for i in range(count)))
        if code is None:
            reply = _register(stubs["alice"], params)()
            assert len(reply.status.params.researchers) == 16
        else:
            t0 = time.monotonic()
            err = _refused(_register(stubs["alice"], params))
            assert err.code() == code and f"got {count} researchers" in err.details()
            assert time.monotonic() - t0 < 5.0
    with pytest.raises(Exception, match="no release"):
        store.release("res17")


def _table(curators: list[str], tid: str = "t1", curator: str = "alice") -> pb.TableChunk:
    return pb.TableChunk(table_id=tid, curator=curator, curators=curators, n=1000, alphabet_size=3, sequence=0,
                         symbols=pack_symbols(support.columns(1000, (3,))[0], 3))  # fmt: skip


@pytest.mark.parametrize("count", [17, 100_000])
def test_at_most_16_curators_per_stored_table(live: Any, count: int) -> None:
    store, stubs = live
    curators = ["alice", *(f"c{i}" for i in range(count - 1))]
    err = _refused(lambda: stubs["alice"].StoreTable(iter([_table(curators)]), timeout=20))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and f"got {count} curators" in err.details()
    assert store.limits.max_tables > 0 and not store._tables  # nothing stored


def test_one_curator_cannot_fill_the_servers_tables(live: Any) -> None:
    store, stubs = live
    for i in range(2):
        stubs["alice"].StoreTable(iter([_table(["alice", "bob"], f"a{i}")]), timeout=20)
    err = _refused(lambda: stubs["alice"].StoreTable(iter([_table(["alice", "bob"], "a2")]), timeout=20))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-tables-per-curator 2" in err.details()
    # bob still has room (before: alice's tables could take every one of --max-tables)
    stubs["bob"].StoreTable(iter([_table(["alice", "bob"], "b0", "bob")]), timeout=20)
    assert sorted(store._tables) == ["a0", "a1", "b0"]


def test_a_full_disk_is_resource_exhausted_and_stores_nothing(live: Any) -> None:
    store, stubs = live
    params = support.make_params(rid="full")
    support.register_all(stubs, params)
    (pages,) = store._db.execute("PRAGMA page_count").fetchone()
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # the database may not grow: a full disk
    col = support.columns(params.m)[0]
    err = _refused(lambda: support.upload(stubs["alice"], "alice", support.chunks_of(col, 3), rid="full"))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    assert err.details().startswith("StoreFullError") and "no space left" in err.details()
    assert store.release("full", "alice").parts["alice"].chunks == {}  # nothing half-stored
    store._db.execute("PRAGMA max_page_count = 1073741823")
    assert support.upload(stubs["alice"], "alice", support.chunks_of(col, 3), rid="full").committed


def test_the_witness_only_moves_up_and_only_for_its_own_curator(live: Any) -> None:
    _, stubs = live
    key = bytes(32)
    ask = lambda n, eps, record=True, who="alice": stubs["alice"].WitnessLedger(  # noqa: E731
        pb.WitnessRequest(curator=who, dataset_key=key, reservations=n, epsilon_total=eps, record=record), timeout=5
    )
    assert (ask(2, 0.8).reservations, ask(2, 0.8).epsilon_total) == (2, 0.8)
    assert (ask(1, 0.4).reservations, ask(1, 0.4).epsilon_total) == (2, 0.8)  # a rollback cannot lower it
    assert ask(0, 0.0, record=False).reservations == 2
    for bad, code in (
        (lambda: ask(1, 0.1, who="bob"), grpc.StatusCode.PERMISSION_DENIED),
        (lambda: ask(1, float("nan")), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: ask(1, float("inf")), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: ask(1, -1.0), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        assert _refused(bad).code() == code
    other = stubs["bob"].WitnessLedger(pb.WitnessRequest(curator="bob", dataset_key=key), timeout=5)
    assert other.reservations == 0  # per curator: bob's witness of the same key is its own


def test_get_estimate_pollers_are_bounded(tmp_path: Path) -> None:
    """150 GetEstimate(wait) calls with distinct unknown release ids: before, 11 -> 161 threads;
    now the estimation pool holds PROCESS_WORKERS threads and past MAX_PENDING queued ids the
    call is refused at once with RESOURCE_EXHAUSTED."""
    log = EventLog("researcher", "test")

    def process(release_id: str, digest: bytes) -> Any:
        time.sleep(0.05)  # an unknown release: the server answers NOT_FOUND after a while
        raise LookupError(f"no release {release_id!r}")

    tracker = ReleaseTracker(process, log, {})
    server = tls.make_grpc_server(max_workers=8, insecure=True)
    service = ResearcherService(tracker, log, 5.0, frozenset({"analyst/analyst-1"}))
    pb_grpc.add_ResearcherServicer_to_server(service, server)
    port = tls.bind(server, "127.0.0.1", 0, None, "researcher", insecure=True)
    server.start()
    channel = tls.secure_channel(f"127.0.0.1:{port}", None, "analyst-1", insecure=True, role="analyst")
    stub = pb_grpc.ResearcherStub(channel)
    before = threading.active_count()
    peak = before
    codes: dict[grpc.StatusCode, int] = {}
    try:
        for i in range(150):
            try:
                stub.GetEstimate(pb.EstimateRequest(release_id=f"ghost-{i}", wait=True), timeout=0.02)
            except grpc.RpcError as exc:
                codes[exc.code()] = codes.get(exc.code(), 0) + 1
            peak = max(peak, threading.active_count())
        after = threading.active_count()
    finally:
        channel.close()
        server.stop(None)
        tracker.close()  # the queued unknown ids finish (and log) while this test still captures
    assert sum(codes.values()) == 150
    # bounded: the pool's workers plus the gRPC server's own threads, never one per release id
    assert after - before <= PROCESS_WORKERS + 8 + 2, (before, after, peak)
    assert peak - before <= PROCESS_WORKERS + 8 + 2, (before, peak)
    assert MAX_PENDING < 150
    print(f"threads before {before}, after 150 distinct ids {after}, peak {peak}; codes {codes}")


def test_the_server_flags_set_the_caps() -> None:
    from secure_release.server.cli import build_parser, config_from_args

    flags = ["--store", "s", "--insecure", "--max-epsilon", "5", "--max-tables-per-curator", "3"]
    limits = config_from_args(build_parser().parse_args(flags)).limits
    assert (limits.max_epsilon, limits.max_tables_per_curator) == (5.0, 3)
    assert ServerLimits().max_epsilon == 20.0  # the documented default
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--store", "s", "--max-epsilon", "inf"])
