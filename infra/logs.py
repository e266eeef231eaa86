"""One JSON-line log format for every role, and the guard that keeps secrets out of it.

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


def setup_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every ``secure_release.*`` logger to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
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


class EventLog:
    """``log("event", field=value, ...)`` for one party: a thin front of :mod:`logging` that
    adds ``component`` and ``party`` to every record."""

    def __init__(self, component: str, party: str) -> None:
        self.component, self.party = component, party
        self.logger = logging.getLogger(f"{ROOT_LOGGER}.{component}")

    def __call__(self, event: str, level: int = logging.INFO, **fields: Any) -> None:
        self.logger.log(level, event, extra={"component": self.component, "party": self.party, **fields})

    def warning(self, event: str, **fields: Any) -> None:
        self(event, logging.WARNING, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self(event, logging.ERROR, **fields)
