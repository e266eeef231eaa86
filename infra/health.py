"""Standard gRPC health checking (grpc.health.v1) and server reflection for every service, and
the client check the compose healthchecks run: ``python -m secure_release.infra.health``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from secure_release.infra.tls import secure_channel


def add_health_and_reflection(server: grpc.Server, service_names: Sequence[str]) -> health.HealthServicer:
    """Register health (every named service SERVING, and the server as a whole under '') and
    reflection on ``server``; returns the health servicer (for graceful shutdown)."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *service_names):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    names = (*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    return servicer


def check(channel: grpc.Channel, service: str = "", timeout: float = 3.0) -> str:
    """The serving status name of ``service`` ('' = the whole server) via grpc.health.v1 Check."""
    stub = health_pb2_grpc.HealthStub(channel)
    resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m secure_release.infra.health",
        description="Exit 0 if the service at ADDRESS answers grpc.health.v1 Check with SERVING "
        "(over mutual TLS with --certs/--name), 1 otherwise.",
    )
    p.add_argument("address", help="HOST:PORT")
    p.add_argument("--certs", help="directory with ca.pem, NAME.pem, NAME.key")
    p.add_argument("--name", default="analyst", help="certificate name to present (default analyst)")
    p.add_argument("--service", default="", help="service name to ask about ('' = the whole server)")
    p.add_argument(
        "--peer-role",
        choices=("server", "curator", "researcher"),
        help="the role the service's certificate must carry (required with --certs)",
    )
    p.add_argument("--insecure", action="store_true", help="plaintext (tests only)")
    p.add_argument("--timeout", type=float, default=3.0)
    args = p.parse_args(argv)
    channel = secure_channel(
        args.address,
        args.certs,
        args.name,
        args.insecure,
        role="analyst" if args.insecure else None,
        peer_role=args.peer_role,
    )
    try:
        status = check(channel, args.service, args.timeout)
    except grpc.RpcError as exc:
        sys.stderr.write(f"unhealthy: {args.address}: {exc.code().name}: {exc.details()}\n")
        return 1
    finally:
        channel.close()
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    raise SystemExit(main())
