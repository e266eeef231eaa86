"""One JSON-line log format for every role, a readable text form for a person at a terminal,
and the guard that keeps secrets out of both.

``--log-format json|text`` (every CLI; default: text on a terminal, JSON otherwise, so compose
and log shippers keep JSON): text prints one line per event with rich, the event's ``note``
(a sentence for a person) when it has one, else the event and its fields.

Every record is one JSON object on stderr: ``time``, ``level``, ``component``, ``party``,
``event`` and the event's fields. :class:`SecretFieldFilter` runs on every record: a field
whose name looks secret (key, seed, pad, secret, plaintext, symbols, password, token) has its
value replaced by ``"[redacted]"`` and the record is marked ``redacted``; fingerprints
(``*_fingerprint``) are allowed. Callers log ids, counts, digests and fingerprints only.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

from secure_release.infra.config import pop_option
from secure_release.mechanism.errors import SecureReleaseError

ROOT_LOGGER = "secure_release"
SECRET_WORDS = ("key", "seed", "pad", "secret", "plaintext", "symbols", "password", "token")
REDACTED = "[redacted]"
_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def looks_secret(field_name: str) -> bool:
    low = field_name.lower()
    return not low.endswith("_fingerprint") and any(word in low for word in SECRET_WORDS)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STD_ATTRS and not k.startswith("_")}


class SecretFieldFilter(logging.Filter):
    """Redacts the value of every field named like a secret (never drops the record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in _fields(record):
            if looks_secret(name):
                setattr(record, name, REDACTED)
                record.redacted = True
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        for k, v in _fields(record).items():
            out[k] = v if isinstance(v, str | int | float | bool | None) else str(v)
        if record.exc_info and record.exc_info[0] is not None:
            out["error_type"] = record.exc_info[0].__name__
        return json.dumps(out, sort_keys=True)


LOG_FORMATS = ("json", "text")
LOG_FORMAT_ENV = "SECURE_RELEASE_LOG_FORMAT"
#: Fields the text form leaves out (the party is the line's prefix; the rest is for machines).
_QUIET_FIELDS = frozenset({"component", "party", "note", "peak_rss_mib", "redacted"})


class TextFormatter(logging.Formatter):
    """One line a person reads at a glance: ``party  note`` or ``party  event words: k=v, ...``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        who = str(fields.get("party", ""))
        note = fields.get("note")
        if note:
            text = str(note)
        else:
            shown = ", ".join(f"{k}={v}" for k, v in fields.items() if k not in _QUIET_FIELDS)
            text = record.getMessage().replace("_", " ") + (f": {shown}" if shown else "")
        return f"{who:<10} {text}" if who else text


class UnknownLogFormatError(SecureReleaseError):
    """``--log-format`` other than json or text."""


def pop_log_format(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without ``--log-format X`` (anywhere: before or after a subcommand) and X (or
    the environment's :data:`LOG_FORMAT_ENV`, or None: chosen by :func:`setup_logging`)."""
    out, fmt = pop_option(argv, "--log-format", LOG_FORMAT_ENV)
    if fmt is not None and fmt not in LOG_FORMATS:
        raise UnknownLogFormatError(f"--log-format {fmt!r}: allowed: {', '.join(LOG_FORMATS)}")
    return out, fmt


def add_log_format_flag(parser: Any) -> None:
    """Document ``--log-format`` on a CLI's top-level parser (:func:`pop_log_format` takes it
    out of argv before parsing, so it works before or after a subcommand)."""
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="json (one object a line, for machines) or text (one readable line per event); "
        f"default: text on a terminal, json otherwise (env {LOG_FORMAT_ENV})",
    )


def setup_logging(level: str = "INFO", stream: TextIO | None = None, log_format: str | None = None) -> None:
    """Send every ``secure_release.*`` logger to ``stream`` (stderr): JSON lines, or readable
    text lines (with rich) when ``log_format`` is "text" or, unset, when the stream is a terminal."""
    target = stream or sys.stderr
    if log_format is None:
        log_format = "text" if target.isatty() else "json"
    handler: logging.Handler
    if log_format == "text":
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(file=target, stderr=target is sys.stderr), show_path=False,
                              markup=False, rich_tracebacks=False, log_time_format="%H:%M:%S")  # fmt: skip
        handler.setFormatter(TextFormatter())
    else:
        handler = logging.StreamHandler(target)
        handler.setFormatter(JsonFormatter())
    handler.addFilter(SecretFieldFilter())
    root = logging.getLogger(ROOT_LOGGER)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def peak_rss_mib() -> int | None:
    """This process's peak resident memory so far (Linux VmHWM, MiB); None where unknown."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


#: Keyword arguments of :meth:`logging.Logger.log` itself; any other keyword is an event field.
_LOG_KWARGS = frozenset({"exc_info", "stack_info", "stacklevel", "extra"})


class EventLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The one logging front-end of every component: each record carries ``component``, ``party``
    and, once bound with :meth:`for_release`, ``release_id``.

    Two call styles give the same record: ``log("event", field=value)`` (and ``log.warning``,
    ``log.error`` with fields as keywords) and the :mod:`logging` style
    ``log.info("event", extra={"field": value})``. A field named ``release`` is recorded as
    ``release_id``, so every component names a release the same way.
    """

    def __init__(self, component: str, party: str, release_id: str | None = None) -> None:
        bound: dict[str, Any] = {"component": component, "party": party}
        if release_id:
            bound["release_id"] = release_id
        super().__init__(logging.getLogger(f"{ROOT_LOGGER}.{component}"), bound)

    @property
    def component(self) -> str:
        return str(self.bound["component"])

    @property
    def party(self) -> str:
        return str(self.bound["party"])

    @party.setter
    def party(self, name: str) -> None:
        self.bound["party"] = name

    @property
    def bound(self) -> dict[str, Any]:
        assert isinstance(self.extra, dict)
        return self.extra

    def for_release(self, release_id: str) -> EventLog:
        """The same component and party, every record naming ``release_id``."""
        return EventLog(self.component, self.party, release_id)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        fields = {**self.bound, **(kwargs.get("extra") or {})}
        if "release" in fields:
            fields.setdefault("release_id", fields.pop("release"))
        kwargs["extra"] = fields
        return msg, kwargs

    def _emit(self, level: int, event: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        fields = {k: kwargs.pop(k) for k in list(kwargs) if k not in _LOG_KWARGS}
        if fields:
            kwargs["extra"] = {**(kwargs.get("extra") or {}), **fields}
        self.log(level, event, *args, **kwargs)

    def __call__(self, event: str, level: int = logging.INFO, **fields: Any) -> None:
        self._emit(level, event, (), fields)

    def info(self, event: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._emit(logging.INFO, event, args, kwargs)

    def warning(self, event: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._emit(logging.WARNING, event, args, kwargs)

    def error(self, event: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._emit(logging.ERROR, event, args, kwargs)
