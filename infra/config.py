"""Shared plumbing of the curator and researcher shells: JSON-line logs, config, retries."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from secure_release.mechanism.errors import SecureReleaseError

T = TypeVar("T")
ENV_PREFIX = "SECURE_RELEASE_"
TESTING_ENV = "SECURE_RELEASE_TESTING"
RETRYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
)


class ConfigError(SecureReleaseError):
    """A required setting is missing or a test-only flag was used outside tests."""


class JsonLog:
    """Structured JSON-line logs on stderr. Callers pass counts and names only, never keys,
    seeds, pads or plaintext (fields named like secrets are refused outright)."""

    _FORBIDDEN = ("key", "seed", "pad", "secret", "plaintext", "symbols")

    def __init__(self, component: str, name: str, stream: Any = None) -> None:
        self.component, self.name = component, name
        self.stream = stream or sys.stderr

    def __call__(self, event: str, **fields: Any) -> None:
        for f in fields:
            if any(bad in f.lower() for bad in self._FORBIDDEN) and not f.endswith("_fingerprint"):
                raise AssertionError(f"log field {f!r} looks secret; log a fingerprint instead")
        record = {
            "ts": round(time.time(), 3),
            "component": self.component,
            "party": self.name,
            "event": event,
            **fields,
        }
        self.stream.write(json.dumps(record, default=str) + "\n")
        self.stream.flush()


def with_retries(
    fn: Callable[[], T],
    what: str,
    log: JsonLog | None = None,
    attempts: int = 8,
    first_delay: float = 0.2,
    max_delay: float = 5.0,
) -> T:
    """Call ``fn`` retrying transient gRPC failures with exponential backoff."""
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code not in RETRYABLE or attempt == attempts:
                raise
            if log:
                log("retry", what=what, attempt=attempt, code=str(code), delay_s=round(delay, 2))
            time.sleep(delay)
            delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")  # pragma: no cover


def split_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"address must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def write_port_file(path: str | None, port: int) -> None:
    if not path:
        return
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, p)


def apply_env_and_config(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """Defaults from ``--config file.json`` then ``SECURE_RELEASE_<FLAG>`` env (flags win)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    config: dict[str, Any] = {}
    if known.config:
        try:
            config = json.loads(Path(known.config).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--config {known.config}: {exc}") from exc
        config = {k.replace("-", "_"): v for k, v in config.items()}
    defaults: dict[str, Any] = {}
    for action in parser._actions:
        dest = action.dest
        if dest in ("help", "config") or not action.option_strings:
            continue
        env = os.environ.get(ENV_PREFIX + dest.upper())
        value: Any = None
        if env is not None:
            value = env
        elif dest in config:
            value = config[dest]
        if value is None:
            continue
        if isinstance(action, argparse._StoreTrueAction):
            value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        elif isinstance(action, argparse._AppendAction):
            value = value if isinstance(value, list) else [v for v in str(value).split(",") if v]
        elif callable(action.type) and isinstance(value, str):
            value = action.type(value)
        defaults[dest] = value
    parser.set_defaults(**defaults)


def require(args: argparse.Namespace, *names: str) -> None:
    missing = [n for n in names if getattr(args, n, None) in (None, "", [])]
    if missing:
        flags = ", ".join("--" + n.replace("_", "-") for n in missing)
        raise ConfigError(f"missing required setting(s) {flags} (flag, {ENV_PREFIX}<NAME> env or --config)")


def testing_enabled() -> bool:
    return os.environ.get(TESTING_ENV) == "1"


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The sub-parser of subcommand ``name`` (to apply env/config defaults to it)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise KeyError(name)
