"""``python -m server`` / ``secure-release-server``: run the cloud server.

Configuration, lowest to highest precedence: ``--config file.json`` (keys named like the long
options, e.g. ``{"listen": "0.0.0.0:7000", "store": "/data"}``), environment variables
``SECURE_RELEASE_<OPTION>`` (e.g. ``SECURE_RELEASE_LISTEN``, ``SECURE_RELEASE_STORE``,
``SECURE_RELEASE_CERTS``, ``SECURE_RELEASE_INSECURE=1``), then command-line options.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from secure_release.infra import tls as security
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.keys import PramKey
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.server.service import ReleaseService, make_notifier
from secure_release.server.store import Store

TEST_KEY_ENV = "SECURE_RELEASE_TESTING"
_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, event, and the record's ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _STD_ATTRS and not k.startswith("_"):
                out[k] = v if isinstance(v, str | int | float | bool | None) else str(v)
        return json.dumps(out, sort_keys=True)


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("secure_release")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


OPTIONS = (
    "listen",
    "store",
    "certs",
    "name",
    "insecure",
    "researcher_address",
    "port_file",
    "log_level",
    "grace",
    "insecure_test_pram_key",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="secure-release-server",
        description=(
            "The untrusted cloud server of secure-release. Curators register their parts and "
            "upload packed ciphertext in chunks; once every curator has committed, the server "
            "seals the release, applies gamma-diagonal PRAM exactly once with a fresh key, "
            "stores the result durably (SQLite, WAL, synchronous=FULL) and only then reports it "
            "PERTURBED; the researcher then fetches it. The server never sees a key or "
            "plaintext. Every RPC requires mutual TLS with a certificate from the project CA "
            "('secure-release pki init') and checks the caller's role."
        ),
        epilog=(
            "Configuration: --config FILE.json < env SECURE_RELEASE_<OPTION> < command line. "
            "Example: python -m server --listen 127.0.0.1:7000 --store ./store --certs ./certs "
            "--name server --port-file server.port"
        ),
    )
    p.add_argument("--config", type=Path, help="JSON file of options (keys like 'listen', 'store')")
    p.add_argument(
        "--listen", help="HOST:PORT to serve on; port 0 picks a free port (default 127.0.0.1:0)"
    )
    p.add_argument("--store", type=Path, help="directory of the durable store (required)")
    p.add_argument("--certs", type=Path, help="directory with ca.pem, NAME.pem and NAME.key")
    p.add_argument("--name", help="this server's certificate name (default: server)")
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="serve WITHOUT TLS; callers name themselves in metadata. Tests/demos only",
    )
    p.add_argument(
        "--researcher-address",
        help="HOST:PORT of the researcher to notify when a release is perturbed (best effort)",
    )
    p.add_argument("--port-file", type=Path, help="write the bound port to this file")
    p.add_argument("--log-level", help="DEBUG, INFO (default), WARNING")
    p.add_argument("--grace", type=float, help="seconds to finish RPCs on SIGTERM (default 5)")
    p.add_argument(
        "--insecure-test-pram-key",
        metavar="HEX",
        help="TESTS ONLY: use this 64-hex-digit PRAM key instead of a fresh one per "
        f"release; refused unless {TEST_KEY_ENV}=1. Makes the noise predictable.",
    )
    return p


def resolve(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "name": "server",
        "insecure": False,
        "log_level": "INFO",
        "grace": 5.0,
    }
    if args.config:
        data = json.loads(Path(args.config).read_text())
        unknown = set(data) - set(OPTIONS) - {k.replace("_", "-") for k in OPTIONS}
        if unknown:
            raise SecureReleaseError(f"unknown keys in {args.config}: {sorted(unknown)}")
        conf.update({k.replace("-", "_"): v for k, v in data.items()})
    for opt in OPTIONS:
        v = env.get("SECURE_RELEASE_" + opt.upper())
        if v is not None:
            conf[opt] = v.lower() in ("1", "true", "yes") if opt == "insecure" else v
    for opt in OPTIONS:
        v = getattr(args, opt)
        if v is not None:
            conf[opt] = v
    if not conf.get("store"):
        raise SecureReleaseError("--store DIR is required (or SECURE_RELEASE_STORE)")
    if not conf["insecure"] and not conf.get("certs"):
        raise SecureReleaseError("--certs DIR is required unless --insecure (tests only)")
    return conf


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        conf = resolve(args, dict(os.environ))
        return serve(conf)
    except SecureReleaseError as exc:
        sys.stderr.write(f"secure-release-server: error: {type(exc).__name__}: {exc}\n")
        return 2


def serve(conf: dict[str, Any]) -> int:
    setup_logging(str(conf["log_level"]))
    log = logging.getLogger("secure_release.server")
    key_factory = PramKey.generate
    if conf.get("insecure_test_pram_key"):
        if os.environ.get(TEST_KEY_ENV) != "1":
            raise SecureReleaseError(
                f"--insecure-test-pram-key is for tests only; set {TEST_KEY_ENV}=1 to allow it"
            )
        fixed = PramKey.from_hex(str(conf["insecure_test_pram_key"]))
        key_factory = lambda: fixed  # noqa: E731
        log.warning("using an injected PRAM key (tests only)", extra={"pram_key": repr(fixed)})
    host, _, port = str(conf["listen"]).rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    certs = Path(conf["certs"]) if conf.get("certs") else None
    insecure = bool(conf["insecure"])
    store = Store(Path(conf["store"]))
    notify = None
    if conf.get("researcher_address"):
        notify = make_notifier(str(conf["researcher_address"]), certs, str(conf["name"]), insecure)
    service = ReleaseService(store, key_factory, notify)
    for rid in store.sealed_releases():  # crashed between sealing and PRAM: finish it first
        service.perturb_if_sealed(rid)

    server = security.make_grpc_server()
    pb_grpc.add_ReleaseServerServicer_to_server(service, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = security.bind(server, host, int(port), certs, str(conf["name"]), insecure)
    server.start()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("securerelease.v1.ReleaseServer", health_pb2.HealthCheckResponse.SERVING)
    if conf.get("port_file"):
        pf = Path(conf["port_file"])
        tmp = pf.with_name(pf.name + ".tmp")
        tmp.write_text(f"{bound}\n")
        os.replace(tmp, pf)
    print(f"secure-release server listening on {host}:{bound}", flush=True)
    log.info(
        "listening",
        extra={"host": host, "port": bound, "tls": not insecure, "store": str(store.path)},
    )

    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(0.5):
        pass
    log.info("stopping", extra={"grace": float(conf["grace"])})
    health_servicer.enter_graceful_shutdown()
    server.stop(float(conf["grace"])).wait()
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
