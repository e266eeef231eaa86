"""``secure-release-server`` (``python -m secure_release.server``): run the cloud server.

Configuration, lowest to highest precedence: ``--config file.json`` (keys named like the long
options, e.g. ``{"listen": "0.0.0.0:7000", "store": "/data"}``), environment variables
``SECURE_RELEASE_<OPTION>`` (e.g. ``SECURE_RELEASE_LISTEN``, ``SECURE_RELEASE_STORE``,
``SECURE_RELEASE_CERTS``, ``SECURE_RELEASE_INSECURE=1``), then command-line options.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from secure_release.infra import metrics, tls
from secure_release.infra.config import (
    ConfigError,
    apply_env_and_config,
    finite_float,
    positive_float,
    split_address,
    testing_enabled,
    write_port_file,
)
from secure_release.infra.entry import run_main, serve_until_signal
from secure_release.infra.fileio import require_dir
from secure_release.infra.health import add_health_and_reflection
from secure_release.infra.logs import add_log_format_flag, pop_log_format, setup_logging
from secure_release.mechanism.primitives.keys import PramKey, Seed
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server.service import ReleaseService, make_notifier
from secure_release.server.service import log as service_log
from secure_release.server.state import ServerLimits
from secure_release.server.store import Store

SERVICE_NAME = "securerelease.v1.ReleaseServer"


@dataclass(frozen=True)
class ServerConfig:
    """Every setting of one server process, checked once."""

    host: str
    port: int
    store: Path
    certs: Path | None
    name: str
    insecure: bool
    researcher_address: str | None
    port_file: str | None
    log_level: str
    grace: float
    test_pram_key: PramKey | None
    limits: ServerLimits
    retention_seconds: float
    calls_per_peer: int
    stream_idle_seconds: float
    test_sample_seed: Seed | None = None


def build_parser() -> argparse.ArgumentParser:
    """The server's flags (each also settable by env or --config)."""
    p = argparse.ArgumentParser(
        prog="secure-release-server",
        description=(
            "The untrusted cloud server of secure-release. Curators register their parts and "
            "upload packed ciphertext in chunks; once every curator has committed, the server "
            "seals the release, applies gamma-diagonal PRAM exactly once with a fresh key, "
            "stores the result durably (SQLite, WAL, synchronous=FULL) and only then reports it "
            "PERTURBED; the researcher then fetches it. It also keeps stored tables (server-side "
            "sampling: each curator's whole encrypted column, uploaded once; for each server-sampled "
            "release it draws the positions from its OS CSPRNG, adds the curators' re-key columns and "
            "applies PRAM). The server never sees a key or plaintext. Every RPC requires mutual TLS "
            "with a certificate from the project CA "
            "('secure-release pki init') and passes the role table (infra/auth.py)."
        ),
        epilog=(
            "Configuration: --config FILE.json < env SECURE_RELEASE_<OPTION> < command line.\n"
            "Example:\n  secure-release-server --listen 127.0.0.1:7000 --store ./store --certs ./certs/server "
            "--name server --port-file server.port --researcher-address 127.0.0.1:7200"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="JSON file of options (keys like 'listen', 'store')")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT; port 0 picks a free port")
    p.add_argument("--store", help="directory of the durable store (required)")
    p.add_argument("--certs", help="directory with ca.pem, NAME.pem and NAME.key")
    p.add_argument("--name", default="server", help="this server's certificate name")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve WITHOUT TLS; callers name themselves in metadata. Tests/demos only",
    )
    p.add_argument(
        "--researcher-address",
        help="HOST:PORT of the researcher to notify when a release is perturbed (best effort)",
    )
    p.add_argument("--port-file", help="write the bound port to this file")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING")
    p.add_argument("--grace", type=finite_float, default=5.0, help="seconds to finish RPCs on SIGTERM")
    bounds = ServerLimits()
    p.add_argument("--max-n", type=int, default=bounds.max_n, help="largest n (records) accepted")
    p.add_argument("--max-m", type=int, default=bounds.max_m, help="largest m (rows) accepted")
    p.add_argument("--max-curators", type=int, default=bounds.max_curators, help="curators per release")
    p.add_argument("--max-releases", type=int, default=bounds.max_releases_in_flight, help="releases in flight at once")
    p.add_argument(
        "--max-tables",
        type=int,
        default=bounds.max_tables,
        help="stored tables (server-side sampling) held at once; a curator of a table deletes it",
    )
    p.add_argument("--max-table-rows", type=int, default=bounds.max_table_rows, help="largest n of a stored table")
    p.add_argument(
        "--max-tables-per-curator",
        type=int,
        default=bounds.max_tables_per_curator,
        help="stored tables one curator certificate may have created and still hold (so one curator cannot "
        "fill --max-tables for everyone)",
    )
    p.add_argument(
        "--max-epsilon",
        type=positive_float,
        default=bounds.max_epsilon,
        help=f"largest epsilon of one release (default {bounds.max_epsilon:g}: e^eps is the likelihood ratio)",
    )
    p.add_argument("--calls-per-peer", type=int, default=4, help="calls one peer may have in flight")
    p.add_argument(
        "--retention-days",
        type=positive_float,
        default=30.0,
        help="delete a release's perturbed rows and records this long after it was released or aborted",
    )
    p.add_argument(
        "--stream-idle-seconds",
        type=positive_float,
        default=30.0,
        help="cancel an upload stream that sends nothing for this long",
    )
    p.add_argument(
        "--insecure-test-pram-key",
        metavar="HEX",
        help="TESTS ONLY: use this 64-hex-digit PRAM key instead of a fresh one per release; "
        "refused unless SECURE_RELEASE_TESTING=1. Makes the noise predictable.",
    )
    p.add_argument(
        "--insecure-test-sample-seed",
        metavar="HEX",
        help="TESTS ONLY: draw every server-sampled release's positions from this 64-hex-digit seed "
        "(with its release id) instead of a fresh OS seed; refused unless SECURE_RELEASE_TESTING=1",
    )
    metrics.add_metrics_flag(p)
    add_log_format_flag(p)
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Check the parsed settings and build the typed config (ConfigError on anything wrong)."""
    if not args.store:
        raise ConfigError("--store DIR is required (or SECURE_RELEASE_STORE)")
    if not args.insecure and not args.certs:
        raise ConfigError("--certs DIR is required unless --insecure (tests only)")
    if args.certs:
        require_dir(args.certs, "--certs")
    if args.grace < 0:
        raise ConfigError(f"--grace must be >= 0 seconds, got {args.grace}")
    key = None
    if args.insecure_test_pram_key:
        if not testing_enabled():
            raise ConfigError("--insecure-test-pram-key is for tests only; set SECURE_RELEASE_TESTING=1")
        key = PramKey.from_hex(str(args.insecure_test_pram_key))
    sample_seed = None
    if args.insecure_test_sample_seed:
        if not testing_enabled():
            raise ConfigError("--insecure-test-sample-seed is for tests only; set SECURE_RELEASE_TESTING=1")
        sample_seed = Seed.from_hex(str(args.insecure_test_sample_seed))
    host, port = split_address(str(args.listen))
    flags = ("max_n", "max_m", "max_curators", "max_releases", "max_tables", "max_table_rows",
             "max_tables_per_curator", "calls_per_peer")  # fmt: skip
    for flag in flags:
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    return ServerConfig(
        host=host or "127.0.0.1",
        port=port,
        store=Path(args.store),
        certs=Path(args.certs) if args.certs else None,
        name=str(args.name),
        insecure=bool(args.insecure),
        researcher_address=args.researcher_address or None,
        port_file=args.port_file or None,
        log_level=str(args.log_level),
        grace=float(args.grace),
        test_pram_key=key,
        limits=ServerLimits(
            args.max_n, args.max_m, args.max_curators, args.max_releases, args.max_tables, args.max_table_rows,
            float(args.max_epsilon), args.max_tables_per_curator,
        ),
        retention_seconds=float(args.retention_days) * 86400.0,
        calls_per_peer=int(args.calls_per_peer),
        stream_idle_seconds=float(args.stream_idle_seconds),
        test_sample_seed=sample_seed,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, configure and serve until SIGTERM/SIGINT; exit codes per infra/exitcodes.py."""
    parser = build_parser()

    def body() -> int:
        rest, log_format = pop_log_format(list(sys.argv[1:] if argv is None else argv))
        rest, metrics_address = metrics.pop_metrics_listen(rest)
        apply_env_and_config(parser, rest)
        return serve(config_from_args(parser.parse_args(rest)), log_format, metrics_address)

    return run_main("secure-release-server", body)


def serve(config: ServerConfig, log_format: str | None = None, metrics_address: str | None = None) -> int:
    """Open the store, finish any sealed release, serve, and stop gracefully on a signal."""
    setup_logging(config.log_level, log_format=log_format)
    started = metrics.start_metrics(metrics_address, "server")
    if started is not None:
        started.watch_store(Path(config.store))
    log = service_log
    log.party = config.name
    key_factory = PramKey.generate
    if config.test_pram_key is not None:
        fixed = config.test_pram_key
        key_factory = lambda: fixed  # noqa: E731
        log.warning("using an injected PRAM key (tests only)")
    if config.test_sample_seed is not None:
        log.warning("using an injected server sample seed (tests only)")
    store = Store(config.store, config.limits, config.test_sample_seed)
    notify = None
    if config.researcher_address:
        notify = make_notifier(config.researcher_address, config.certs, config.name, config.insecure)
    service = ReleaseService(store, key_factory, notify)
    for rid in store.sealed_releases():  # crashed between sealing and PRAM: finish it first
        service.perturb_if_sealed(rid)

    server = tls.make_grpc_server(
        interceptors=metrics.interceptors(),
        insecure=config.insecure,
        calls_per_peer=config.calls_per_peer,
        stream_idle_seconds=config.stream_idle_seconds,
    )
    pb_grpc.add_ReleaseServerServicer_to_server(service, server)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    bound = tls.bind(server, config.host, config.port, config.certs, config.name, config.insecure)
    server.start()
    write_port_file(config.port_file, bound)
    print(f"secure-release server listening on {config.host}:{bound}", flush=True)
    log.info("listening", extra={"host": config.host, "port": bound, "tls": not config.insecure})

    next_sweep = 0.0

    def sweep() -> None:
        nonlocal next_sweep
        if time.monotonic() >= next_sweep:
            expired = store.expire(time.time() - config.retention_seconds)
            if expired:
                log.info("expired", extra={"releases": len(expired)})
            next_sweep = time.monotonic() + 60.0

    serve_until_signal(tick=sweep)
    log.info("stopping", extra={"grace": config.grace})
    health.enter_graceful_shutdown()
    server.stop(config.grace).wait()
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
