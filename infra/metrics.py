"""Prometheus metrics for an operator (``--metrics-listen HOST:PORT``, off by default), with
prometheus_client: one registry and one HTTP endpoint per process.

* ``secure_release_releases_total{component, outcome}``: releases by outcome (released, estimated,
  aborted, refunded) as the role's own events say;
* ``secure_release_rpcs_total{method, code}``: RPCs this process served, by method and final
  status code (a server interceptor; calls the access table refuses never reach it);
* ``secure_release_phase_seconds{component, phase}``: time from the previous phase event to this
  one (table_loaded, agreed, prepared, committed, released, fetched, estimated, ...);
* ``secure_release_stored_bytes``: bytes under the server's store directory (read at scrape);
* ``secure_release_budget_left_epsilon{dataset}``: budget left per data set at a curator.

The numbers come from the role's log events (a :class:`logging.Handler`), so no role code gains a
metrics call; like the logs, they carry ids, counts and durations, never a key or a value.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from secure_release.infra.config import ConfigError, pop_option, split_address
from secure_release.infra.logs import ROOT_LOGGER

METRICS_ENV = "SECURE_RELEASE_METRICS_LISTEN"
_OUTCOMES = {"released": "released", "perturbed": "released", "estimated": "estimated", "ledger_refunded": "refunded",
             "aborted": "aborted",
             "release_aborted": "aborted"}  # fmt: skip
_PHASES = frozenset({"table_loaded", "tags_submitted", "agreed", "aligned", "prepared", "registered", "committed",
                     "ledger_committed", "released", "keys_acknowledged", "fetched", "key_received", "estimated",
                     "written", "sealed", "perturbed"})  # fmt: skip


class Metrics:
    """The metrics of one process and the handler and interceptor that feed them."""

    def __init__(self, component: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.component = component
        self.registry = CollectorRegistry()
        self.releases = Counter("secure_release_releases", "Releases by outcome", ["component", "outcome"],
                                registry=self.registry)  # fmt: skip
        self.rpcs = Counter("secure_release_rpcs", "RPCs served, by method and final status code",
                            ["method", "code"], registry=self.registry)  # fmt: skip
        self.phases = Histogram("secure_release_phase_seconds", "Seconds from the previous phase to this one",
                                ["component", "phase"], registry=self.registry,
                                buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800))  # fmt: skip
        self.stored = Gauge("secure_release_stored_bytes", "Bytes under the server's store directory",
                            registry=self.registry)  # fmt: skip
        self.budget = Gauge("secure_release_budget_left_epsilon", "Budget left per data set at a curator",
                            ["dataset"], registry=self.registry)  # fmt: skip
        self._last: float | None = None
        self.port: int | None = None
        self._server: Any = None

    def watch_store(self, store: Path) -> None:
        """Report the bytes under ``store`` at each scrape."""

        def size() -> float:
            return float(sum(p.stat().st_size for p in store.rglob("*") if p.is_file()))

        self.stored.set_function(size)

    def observe(self, record: logging.LogRecord) -> None:
        """Turn one log event into metrics."""
        event = record.getMessage()
        fields = record.__dict__
        outcome = _OUTCOMES.get(event)
        if outcome is not None:
            self.releases.labels(self.component, outcome).inc()
        if event in _PHASES:
            if self._last is not None:
                self.phases.labels(self.component, event).observe(max(0.0, record.created - self._last))
            self._last = record.created
        left = fields.get("budget_left", fields.get("remaining"))
        dataset = fields.get("dataset")
        if isinstance(left, int | float) and dataset is not None:
            self.budget.labels(str(dataset)).set(float(left))

    def handler(self) -> logging.Handler:
        metrics = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                metrics.observe(record)

        return _Handler()

    def interceptor(self) -> _ServerInterceptor:
        return _RpcCounter(self.rpcs)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()


def _code_of(context: Any, failed: bool) -> str:
    code_fn = getattr(context, "code", None)
    code = code_fn() if callable(code_fn) else None
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return str(getattr(code, "name", code))


# The interceptor base is generic only in grpc-stubs, not at runtime.
if TYPE_CHECKING:
    _ServerInterceptor = grpc.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.ServerInterceptor


class _RpcCounter(_ServerInterceptor):
    """Counts every RPC by method and final status code."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = str(details.method).rsplit("/", 1)[-1]
        counter = self.counter

        def unary(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
            def inner(request: Any, context: Any) -> Any:
                failed = True
                try:
                    out = fn(request, context)
                    failed = False
                    return out
                finally:
                    counter.labels(method, _code_of(context, failed)).inc()

            return inner

        def streaming(fn: Callable[[Any, Any], Iterator[Any]]) -> Callable[[Any, Any], Iterator[Any]]:
            def inner(request: Any, context: Any) -> Iterator[Any]:
                failed = True
                try:
                    yield from fn(request, context)
                    failed = False
                finally:
                    counter.labels(method, _code_of(context, failed)).inc()

            return inner

        kinds = (
            ("unary_unary", grpc.unary_unary_rpc_method_handler, unary),
            ("unary_stream", grpc.unary_stream_rpc_method_handler, streaming),
            ("stream_unary", grpc.stream_unary_rpc_method_handler, unary),
            ("stream_stream", grpc.stream_stream_rpc_method_handler, streaming),
        )
        for attr, make, wrap in kinds:
            fn = getattr(handler, attr)
            if fn is not None:
                return make(wrap(fn), request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)  # fmt: skip
        return handler


#: The metrics of this process once :func:`start_metrics` ran (None: off).
ACTIVE: Metrics | None = None


def pop_metrics_listen(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without ``--metrics-listen HOST:PORT`` (anywhere) and the address (or the
    environment's :data:`METRICS_ENV`; None: metrics off)."""
    return pop_option(argv, "--metrics-listen", METRICS_ENV)


def add_metrics_flag(parser: Any) -> None:
    """Document ``--metrics-listen`` on a CLI's top-level parser."""
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help=f"serve Prometheus metrics over HTTP here (off by default; env {METRICS_ENV})",
    )


def start_metrics(address: str | None, component: str) -> Metrics | None:
    """Start the metrics endpoint at ``address`` (None: off) and feed it from the logs; call
    after :func:`~secure_release.infra.logs.setup_logging`."""
    global ACTIVE
    if not address:
        return None
    try:
        from prometheus_client import start_http_server
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ConfigError("--metrics-listen needs prometheus_client (pip install prometheus_client)") from exc
    host, port = split_address(address)
    metrics = Metrics(component)
    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    metrics._server, metrics.port = server, int(server.server_port)
    logging.getLogger(ROOT_LOGGER).addHandler(metrics.handler())
    logging.getLogger(f"{ROOT_LOGGER}.metrics").info(
        "metrics_listening", extra={"component": component, "party": component,
                                    "address": f"{host}:{metrics.port}", "at": time.time()})  # fmt: skip
    ACTIVE = metrics
    return metrics


def interceptors() -> list[_ServerInterceptor]:
    """The RPC counter when metrics are on (for ``make_grpc_server(interceptors=...)``)."""
    return [ACTIVE.interceptor()] if ACTIVE is not None else []
