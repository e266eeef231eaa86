"""The access table walked against live services: every RPC in ``infra.auth.ACCESS`` (the three
project services, health and reflection) called over mutual TLS with every role's certificate.
An allowed role gets past the table (its call then succeeds or fails on its merits); any other
role is refused by the interceptor with PERMISSION_DENIED before servicer code runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory

from secure_release.curator.service import CuratorService
from secure_release.infra import tls
from secure_release.infra.auth import ACCESS
from secure_release.infra.health import add_health_and_reflection
from secure_release.infra.logs import EventLog
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.service import ReleaseTracker, ResearcherService
from secure_release.server.service import ReleaseService
from secure_release.server.store import Store

IDENTITIES = {"curator": "alice", "server": "server", "researcher": "researcher", "analyst": "analyst"}
SERVES = {
    "ReleaseServer": ("server", "server"),
    "Curator": ("curator", "bob"),
    "Researcher": ("researcher", "researcher"),
}
POOL = pb.DESCRIPTOR.pool


@pytest.fixture(scope="module")
def services(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, str, str]]]:
    """Service short name -> (port, role it serves as, certificate name), all three running."""
    store = Store(tmp_path_factory.mktemp("store"))
    log = EventLog("test", "access")
    schema = CuratorSchema("bob", (Attribute("sex", ("f", "m")),))
    tracker = ReleaseTracker(lambda rid, digest: pytest.fail("nothing is processed"), log, {})
    servicers: dict[str, Any] = {
        "ReleaseServer": (ReleaseService(store), pb_grpc.add_ReleaseServerServicer_to_server),
        "Curator": (CuratorService("bob", schema, log), pb_grpc.add_CuratorServicer_to_server),
        "Researcher": (ResearcherService(tracker, log, 1.0), pb_grpc.add_ResearcherServicer_to_server),
    }
    running, out = [], {}
    for short, (servicer, add) in servicers.items():
        role, name = SERVES[short]
        server = tls.make_grpc_server(max_workers=8, calls_per_peer=64)
        add(servicer, server)
        add_health_and_reflection(server, [f"securerelease.v1.{short}"])
        port = tls.bind(server, "127.0.0.1", 0, certs / name, name)
        server.start()
        running.append(server)
        out[short] = (port, role, name)
    yield out
    for server in running:
        server.stop(0).wait()
    store.close()


def call(channel: grpc.Channel, method: str) -> None:
    """Call ``method`` with an empty request of its own type, streaming or not."""
    service_name, rpc = method.strip("/").split("/")
    descriptor = POOL.FindServiceByName(service_name).FindMethodByName(rpc)
    request = message_factory.GetMessageClass(descriptor.input_type)()
    response = message_factory.GetMessageClass(descriptor.output_type)
    kind = (
        ("stream" if descriptor.client_streaming else "unary")
        + "_"
        + ("stream" if descriptor.server_streaming else "unary")
    )
    stub = getattr(channel, kind)(
        method, request_serializer=type(request).SerializeToString, response_deserializer=response.FromString
    )
    arg = iter([request]) if descriptor.client_streaming else request
    result = stub(arg, timeout=5)
    if descriptor.server_streaming:
        next(iter(result), None)


def target(method: str, services: dict[str, tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The services that serve ``method`` (health and reflection: all three)."""
    short = method.split("/")[1].rsplit(".", 1)[-1]
    return [services[short]] if short in services else list(services.values())


@pytest.mark.parametrize("method", sorted(ACCESS))
@pytest.mark.parametrize("role", sorted(IDENTITIES))
def test_access_table(certs: Path, services: dict[str, tuple[int, str, str]], method: str, role: str) -> None:
    for port, peer_role, peer_name in target(method, services):
        me = IDENTITIES[role]
        ch = tls.secure_channel(f"127.0.0.1:{port}", certs / me, me, peer_role=peer_role, peer_name=peer_name)
        with ch:
            try:
                call(ch, method)
                code, details = grpc.StatusCode.OK, ""
            except grpc.RpcError as err:
                code, details = err.code(), err.details() or ""
        refused_by_table = code == grpc.StatusCode.PERMISSION_DENIED and "may not call" in details
        if role in ACCESS[method]:
            assert not refused_by_table and code != grpc.StatusCode.UNAUTHENTICATED, (method, role, code, details)
        else:
            assert refused_by_table, (method, role, code, details)


def test_every_served_method_is_in_the_table() -> None:
    """Nothing a project service offers is missing from the table (a missing one fails closed)."""
    for short in SERVES:
        service = POOL.FindServiceByName(f"securerelease.v1.{short}")
        for m in service.methods:
            assert f"/securerelease.v1.{short}/{m.name}" in ACCESS


def test_every_service_answers_health_and_lists_itself_by_reflection(
    certs: Path, services: dict[str, tuple[int, str, str]]
) -> None:
    """grpc.health.v1 Check says SERVING for the server and for the named service, and server
    reflection lists the service, on all three."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    for short, (port, peer_role, peer_name) in services.items():
        ch = tls.secure_channel(
            f"127.0.0.1:{port}", certs / "analyst", "analyst", peer_role=peer_role, peer_name=peer_name
        )
        with ch:
            health = health_pb2_grpc.HealthStub(ch)
            for name in ("", f"securerelease.v1.{short}"):
                status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
                assert status == health_pb2.HealthCheckResponse.SERVING, (short, name)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            answer = next(reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(iter([request]), timeout=5))
            listed = {s.name for s in answer.list_services_response.service}
            assert f"securerelease.v1.{short}" in listed and "grpc.health.v1.Health" in listed, listed


def test_the_stored_table_rpcs_are_for_curators_only() -> None:
    """Server-side sampling: storing, inspecting and deleting a stored table and fetching a server-drawn sample
    are curator calls (the servicer then admits only the table's or release's own curators); a
    researcher, the server or an analyst is refused by the table."""
    for rpc in ("StoreTable", "GetTableStatus", "DeleteTable", "FetchSample"):
        assert ACCESS[f"/securerelease.v1.ReleaseServer/{rpc}"] == frozenset({"curator"}), rpc
