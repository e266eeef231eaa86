"""secure-release-researcher: decrypt and estimate secure releases.

  serve   run the Researcher service: the server notifies it when a release is perturbed; it
          fetches the perturbed rows, asks each curator for its key, estimates and writes
          <out>/<release>.json, .csv and .png; analysts read estimates with GetEstimate.
  fetch   one-shot: wait for one release, estimate it, write the files and print the JSON.

Without every curator's key (refused, or unreachable until --timeout) the release fails (exit 1)
naming the missing curators, unless --allow-partial: then only the marginal of the granting
curators is estimated and the output says so ("marginal": true, "refused": {...}).
An aborted release fails with the reason the server recorded.

Exit codes: 0 success, 1 the release failed, was aborted or a key is missing, 2 usage or config.

Config: flags, SECURE_RELEASE_<FLAG> env, or --config file.json.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from secure_release.infra import metrics
from secure_release.infra.config import (
    ConfigError,
    apply_env_and_config,
    require,
    split_address,
    subcommand_parser,
    write_port_file,
)
from secure_release.infra.entry import run_main, serve_until_signal
from secure_release.infra.exitcodes import USAGE
from secure_release.infra.fileio import require_dir
from secure_release.infra.health import add_health_and_reflection
from secure_release.infra.logs import EventLog, add_log_format_flag, pop_log_format, setup_logging
from secure_release.infra.tls import bind, make_grpc_server
from secure_release.mechanism.estimation.report import TablesReport
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.client import Endpoints, check_seconds
from secure_release.researcher.heatmap import prewarm
from secure_release.researcher.pipeline import process_release
from secure_release.researcher.service import ReleaseTracker, ResearcherService
from secure_release.researcher.storage import AnyReport, load_reports, report_json

COMMANDS = ("serve", "fetch")
SERVICE_NAME = "securerelease.v1.Researcher"

_CURATORS = "--curator alice=127.0.0.1:7101 --curator bob=127.0.0.1:7102"
EXAMPLE = (
    "Examples:\n"
    "  secure-release-researcher serve --listen 127.0.0.1:7200 --certs certs/researcher --name researcher \\\n"
    f"      --server 127.0.0.1:7000 {_CURATORS} --analyst analyst --out results\n"
    "  secure-release-researcher fetch --release-id r1 --certs certs/researcher --name researcher \\\n"
    f"      --server 127.0.0.1:7000 {_CURATORS} --out results\n"
    "Exit codes: 0 estimated, 1 failed (aborted, a key missing without --allow-partial, an RPC),\n"
    "2 a bad setting, 3 refused.\n"
)


def _common(p: argparse.ArgumentParser) -> None:
    """The flags both subcommands take."""
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
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds for one release end to end: the wait until PERTURBED, the fetch and every key (finite, > 0)",
    )
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="estimate the marginal of the granting curators when a key is missing (default: fail)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``serve`` and ``fetch`` parsers (their flags are part of the compose file's contract)."""
    parser = argparse.ArgumentParser(
        prog="secure-release-researcher",
        description=__doc__,
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_format_flag(parser)
    metrics.add_metrics_flag(parser)
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
    s.add_argument(
        "--analyst",
        action="append",
        default=[],
        help="certificate name of an analyst who may read the estimates (repeat; this researcher always may)",
    )
    f = sub.add_parser(
        "fetch",
        help="estimate one release and print it",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(f)
    f.add_argument("--release-id", help="the release to estimate")
    f.add_argument(
        "--json",
        action="store_true",
        help="a release of several tables: print its JSON, not a short block per table (one table: always JSON)",
    )
    return parser


def parse_curators(items: Sequence[str]) -> dict[str, str]:
    """``NAME=HOST:PORT`` flags -> {name: address}; a malformed or repeated one is a ConfigError."""
    curators: dict[str, str] = {}
    for item in items:
        name, sep, address = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise ConfigError(f"--curator takes NAME=HOST:PORT, got {item!r}")
        try:
            split_address(address)
        except ConfigError as exc:
            raise ConfigError(f"--curator {item!r}: {exc}") from None
        if name in curators:
            raise ConfigError(f"--curator {name} given twice ({curators[name]} and {address}); give each once")
        curators[name] = address
    return curators


def parse_args(argv: list[str]) -> argparse.Namespace | None:
    """Flags over env over --config; None when no subcommand was given (help printed)."""
    parser = build_parser()
    if argv and argv[0] in COMMANDS:
        apply_env_and_config(subcommand_parser(parser, argv[0]), argv[1:])
    args = parser.parse_args(argv)
    if args.command not in COMMANDS:
        parser.print_help()
        return None
    require(args, "server", "name")
    if not args.insecure:
        require(args, "certs")
    if args.command == "fetch":
        require(args, "release_id")
    check_seconds(args.timeout, "--timeout")
    return args


def endpoints_of(args: argparse.Namespace) -> Endpoints:
    """Where to connect and as whom, from the parsed flags."""
    certs = require_dir(args.certs, "--certs") if args.certs else None
    return Endpoints(certs, args.name, args.insecure, args.server, parse_curators(args.curator))


def fetch(args: argparse.Namespace, log: EventLog) -> int:
    """``fetch``: estimate one release, write its files and print its JSON (a release of several
    tables: a short block per table, its JSON with ``--json``)."""
    report = process_release(
        endpoints_of(args), args.release_id, _out(args), log, args.timeout, allow_partial=args.allow_partial
    )
    if isinstance(report, TablesReport) and not args.json:
        sys.stdout.write(tables_text(report))
    else:
        sys.stdout.write(report_json(report).decode())
    return 0


def tables_text(report: TablesReport, top: int = 5) -> str:
    """A release of several tables in short: the release's epsilon, then per table its
    attributes, m_t, gamma_t and its ``top`` largest estimated cells (or why it is missing)."""
    lines = [
        f"release {report.release_id}: {len(report.tables)} tables, epsilon {report.epsilon:.6g} (Eq. T1; "
        f"sequential {report.sequential_epsilon:.6g}), design {report.design_digest[:16]}",
    ]
    for t, table in enumerate(report.tables):
        if table is None:
            lines.append(f"table {t + 1}: not estimated ({report.missing.get(t, 'no estimate')})")
            continue
        plan = table.plan
        lines.append(f"table {t + 1}: {' x '.join(table.attributes)}  m={plan.m} gamma={plan.gamma:.6g} "
                     f"cells={len(table.labels)}")  # fmt: skip
        order = np.argsort(-table.estimate, kind="stable")[:top]
        for i in order.tolist():
            lines.append(f"  {'/'.join(table.labels[i]):<32} {float(table.estimate[i]):9.4f} "
                         f"[{float(table.ci_low[i]):.4f}, {float(table.ci_high[i]):.4f}]")  # fmt: skip
    return "\n".join(lines) + "\n"


def serve(args: argparse.Namespace, log: EventLog) -> int:
    """``serve``: run the Researcher service until SIGTERM or Ctrl-C."""
    endpoints, out = endpoints_of(args), _out(args)

    def process(release_id: str, notified_digest: bytes) -> AnyReport:
        return process_release(endpoints, release_id, out, log, args.timeout, notified_digest, args.allow_partial)

    tracker = ReleaseTracker(process, log, load_reports(out, log) if out is not None else {})
    if out is not None:
        prewarm()  # the heat map's plotting library, while the release is still on its way
    server = make_grpc_server(insecure=args.insecure, interceptors=metrics.interceptors())
    readers = frozenset({f"researcher/{args.name}", *(f"analyst/{a}" for a in args.analyst if a)})
    pb_grpc.add_ResearcherServicer_to_server(ResearcherService(tracker, log, args.timeout, readers), server)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    host, port = split_address(args.listen)
    bound = bind(server, host, port, endpoints.certs, args.name, args.insecure)
    server.start()
    write_port_file(args.port_file, bound)
    log("listening", address=f"{host}:{bound}", reloaded=len(tracker.finished()))
    try:
        serve_until_signal()
    finally:
        health.enter_graceful_shutdown()
        server.stop(grace=1.0).wait()
    return 0


def _out(args: argparse.Namespace) -> Path | None:
    return Path(args.out) if args.out else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``serve`` or ``fetch``; exit codes of the shared convention (infra/exitcodes.py): 1 if
    the release failed (aborted, a key missing, an RPC), 2 on a bad setting, 3 if refused."""

    def body() -> int:
        rest, log_format = pop_log_format(list(sys.argv[1:] if argv is None else argv))
        rest, metrics_address = metrics.pop_metrics_listen(rest)
        args = parse_args(rest)
        if args is None:
            return USAGE
        setup_logging(log_format=log_format)
        metrics.start_metrics(metrics_address, "researcher")
        log = EventLog("researcher", args.name)
        return fetch(args, log) if args.command == "fetch" else serve(args, log)

    return run_main("secure-release-researcher", body, usage_errors=(ConfigError, OSError))
