"""Settings for every role's CLI: flags, then ``SECURE_RELEASE_<FLAG>`` environment, then
``--config file.json`` (flags win); addresses, port files and the test-only switch."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from secure_release.mechanism.errors import SecureReleaseError

ENV_PREFIX = "SECURE_RELEASE_"
TESTING_ENV = "SECURE_RELEASE_TESTING"


class ConfigError(SecureReleaseError):
    """A required setting is missing or a test-only flag was used outside tests."""


def split_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) with a port in 0..65535 (0: the OS picks one)."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"an address is HOST:PORT with a port in 0..65535, got {text!r}")
    return host.strip("[]"), int(port)


def finite_float(text: str) -> float:
    """argparse type: a finite number (NaN and infinities are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (seconds, budgets)."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


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
        if not isinstance(config, dict):
            raise ConfigError(f"--config {known.config}: a JSON object of settings is needed")
        config = {k.replace("-", "_"): v for k, v in config.items()}
        known_dests = {a.dest for a in parser._actions if a.option_strings}
        unknown = sorted(set(config) - known_dests)
        if unknown:
            raise ConfigError(
                f"--config {known.config}: unknown setting(s) {unknown}; "
                f"allowed: {sorted(known_dests - {'help', 'config'})}"
            )
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


def pop_option(argv: list[str], flag: str, env: str) -> tuple[list[str], str | None]:
    """``argv`` without ``FLAG VALUE`` or ``FLAG=VALUE`` (anywhere: before or after a
    subcommand) and the value (the last one given; else the environment variable ``env``; else
    None). For the options every service CLI shares (``--log-format``, ``--metrics-listen``)."""
    out, value, i = [], os.environ.get(env) or None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == flag and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith(flag + "="):
            value, i = arg.partition("=")[2], i + 1
            continue
        out.append(arg)
        i += 1
    return out, value
