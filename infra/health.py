"""Standard gRPC health checking (grpc.health.v1) and server reflection for every service, and
the client check the compose healthchecks run: ``python -m secure_release.infra.health``.

Every Check answer of a TLS service also carries, in its trailing metadata, the serial of the
certificate the service presents now and the whole days it has left
(:data:`CERT_DAYS_LEFT_KEY`, :data:`CERT_SERIAL_KEY`); the client prints them and warns from
:data:`~secure_release.infra.certdir.WARN_DAYS` days before expiry.
"""

from __future__ import annotations

import argparse
import sys
import weakref
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from secure_release.infra.certdir import WARN_DAYS
from secure_release.infra.tls import certificates_of, secure_channel

CERT_DAYS_LEFT_KEY = "x-secure-release-cert-days-left"
CERT_SERIAL_KEY = "x-secure-release-cert-serial"


class _CertificateHealth(health.HealthServicer):
    """grpc's health servicer that also reports the served certificate's serial and days left."""

    def __init__(self, server: grpc.Server) -> None:
        super().__init__()
        self._server = weakref.ref(server)

    def Check(self, request: Any, context: Any) -> Any:  # noqa: N802 (grpc's name)
        server = self._server()
        watcher = certificates_of(server) if server is not None else None
        if watcher is not None:
            watcher.refresh()
            files = watcher.files
            context.set_trailing_metadata(
                ((CERT_DAYS_LEFT_KEY, str(files.days_left())), (CERT_SERIAL_KEY, f"{files.serial:x}"))
            )
        return super().Check(request, context)


def add_health_and_reflection(server: grpc.Server, service_names: Sequence[str]) -> health.HealthServicer:
    """Register health (every named service SERVING, and the server as a whole under '') and
    reflection on ``server``; returns the health servicer (for graceful shutdown)."""
    servicer = _CertificateHealth(server)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *service_names):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    names = (*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    return servicer


def check(channel: grpc.Channel, service: str = "", timeout: float = 3.0) -> str:
    """The serving status name of ``service`` ('' = the whole server) via grpc.health.v1 Check."""
    return check_with_certificate(channel, service, timeout)[0]


def check_with_certificate(
    channel: grpc.Channel, service: str = "", timeout: float = 3.0
) -> tuple[str, int | None, str | None]:
    """(status name, days the service's certificate has left, its serial); None where the
    service does not say (a plaintext test server)."""
    stub = health_pb2_grpc.HealthStub(channel)
    resp, call = stub.Check.with_call(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    trailing = dict(call.trailing_metadata() or ())
    days = trailing.get(CERT_DAYS_LEFT_KEY)
    serial = trailing.get(CERT_SERIAL_KEY)
    return (
        str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)),
        int(days) if isinstance(days, str) and days.lstrip("-").isdigit() else None,
        serial if isinstance(serial, str) else None,
    )


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
        status, days, serial = check_with_certificate(channel, args.service, args.timeout)
    except grpc.RpcError as exc:
        sys.stderr.write(f"unhealthy: {args.address}: {exc.code().name}: {exc.details()}\n")
        return 1
    finally:
        channel.close()
    cert = "" if days is None else f"; certificate serial {serial}, {days} days left"
    print(f"{args.address}: {status}{cert}")
    if days is not None and days < WARN_DAYS:
        sys.stderr.write(
            f"WARNING: the certificate of {args.address} expires in {days} days; renew it (docs/deployment.md, Renew)\n"
        )
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    raise SystemExit(main())
