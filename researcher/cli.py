"""``python -m researcher``: decrypt and estimate secure releases.

  serve   run the Researcher service: the server notifies it when a release is perturbed; it
          fetches the perturbed rows, asks each curator for its key, estimates and writes
          <out>/<release>.json, .csv and .png; analysts read estimates with GetEstimate.
  fetch   one-shot: wait for one release, estimate it, write the files and print the JSON.

If a curator refuses its key, only the marginal of the granting curators is estimated and the
output says so ("marginal": true, "refused": {...}).

Config: flags, SECURE_RELEASE_<FLAG> env, or --config file.json.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from secure_release.infra.config import (
    ConfigError,
    JsonLog,
    apply_env_and_config,
    require,
    split_address,
    subcommand_parser,
    write_port_file,
)
from secure_release.mechanism.errors import SecureReleaseError

_CURATORS = "--curator alice=127.0.0.1:7101 --curator bob=127.0.0.1:7102"
EXAMPLE = (
    "Examples:\n"
    "  python -m researcher serve --listen 127.0.0.1:7200 --certs certs --name researcher \\\n"
    f"      --server 127.0.0.1:7000 {_CURATORS} --out results\n"
    "  python -m researcher fetch --release-id r1 --certs certs --name researcher \\\n"
    f"      --server 127.0.0.1:7000 {_CURATORS} --out results\n"
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="JSON file of settings (keys: flag names)")
    p.add_argument("--certs", help="directory with ca.pem, NAME.pem, NAME.key")
    p.add_argument("--name", default="researcher", help="this researcher's certificate name")
    p.add_argument("--server", help="HOST:PORT of the release server")
    p.add_argument(
        "--curator",
        action="append",
        default=[],
        help="NAME=HOST:PORT of a curator's key service (repeat per curator)",
    )
    p.add_argument("--out", default="results", help="directory for <release>.json/.csv/.png")
    p.add_argument("--insecure", action="store_true", help="plaintext gRPC (tests/demos only!)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a release")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m researcher",
        description=__doc__,
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    s = sub.add_parser(
        "serve",
        help="run the Researcher service",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(s)
    s.add_argument("--listen", default="127.0.0.1:0", help="where the Researcher service listens")
    s.add_argument("--port-file", help="write the bound port here")
    f = sub.add_parser(
        "fetch",
        help="estimate one release and print it",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(f)
    f.add_argument("--release-id", help="the release to estimate")
    return parser


def _curators(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, addr = item.partition("=")
        if not sep:
            raise ConfigError(f"--curator takes NAME=HOST:PORT, got {item!r}")
        split_address(addr)
        out[name.strip()] = addr.strip()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        if argv and argv[0] in ("serve", "fetch"):
            apply_env_and_config(subcommand_parser(parser, argv[0]), argv[1:])
        args = parser.parse_args(argv)
        if args.command not in ("serve", "fetch"):
            parser.print_help()
            return 2
        require(args, "server", "name")
        if not args.insecure:
            require(args, "certs")
        from secure_release.researcher.pipeline import Connection, process_release

        log = JsonLog("researcher", args.name)
        conn = Connection(args.certs, args.name, args.insecure, args.server, _curators(args.curator))
        out = Path(args.out) if args.out else None
        if args.command == "fetch":
            require(args, "release_id")
            result = process_release(conn, args.release_id, out, log, args.timeout)
            print(json.dumps(result, indent=1))
            return 0
        from secure_release.infra.tls import bind, make_grpc_server
        from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
        from secure_release.researcher.service import ResearcherService

        service = ResearcherService(conn, out, log, args.timeout)
        server = make_grpc_server()
        pb_grpc.add_ResearcherServicer_to_server(service, server)
        _add_health(server)
        host, port = split_address(args.listen)
        bound = bind(server, host, port, args.certs, args.name, args.insecure)
        server.start()
        write_port_file(args.port_file, bound)
        log("listening", address=f"{host}:{bound}")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(0.5):
                pass
        finally:
            server.stop(grace=1.0)
        return 0
    except KeyboardInterrupt:
        return 130
    except (SecureReleaseError, ConfigError, OSError) as exc:
        sys.stderr.write(f"researcher: error: {type(exc).__name__}: {exc}\n")
        return 2
    except Exception as exc:
        import grpc

        if isinstance(exc, grpc.RpcError):
            sys.stderr.write(f"researcher: error: RPC failed: {exc.code()}: {exc.details()}\n")
            return 3
        raise


def _add_health(server: object) -> None:
    try:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    except ImportError:
        return
    h = health.HealthServicer()
    h.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(h, server)
