"""``python -m researcher.healthcheck HOST:PORT [--certs DIR --name NAME | --tcp]``: exit 0 if
the gRPC service answers (standard grpc.health.v1 when available, else channel readiness)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m researcher.healthcheck", description=__doc__)
    p.add_argument("address")
    p.add_argument("--certs")
    p.add_argument("--name", default="analyst")
    p.add_argument("--insecure", action="store_true")
    p.add_argument("--timeout", type=float, default=3.0)
    args = p.parse_args(argv)
    if args.certs:
        from secure_release.infra.tls import secure_channel

        channel = secure_channel(args.address, args.certs, args.name, args.insecure)
    else:
        channel = grpc.insecure_channel(args.address)
    try:
        grpc.channel_ready_future(channel).result(timeout=args.timeout)
    except grpc.FutureTimeoutError:
        sys.stderr.write(f"unhealthy: {args.address} not reachable\n")
        return 1
    finally:
        channel.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
