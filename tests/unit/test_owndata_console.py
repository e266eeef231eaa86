"""Output for people, logs for machines (issue 26, item 7): --log-format json|text (text by
default on a terminal only), one readable line per event with its note, secrets redacted in
both, and every --help under the installed command name."""

from __future__ import annotations

import io
import json
import logging
import re
import tomllib
from pathlib import Path

import pytest

from secure_release.cli import build_parser as app_parser
from secure_release.curator.cli import build_parser as curator_parser
from secure_release.infra.logs import (
    EventLog,
    UnknownLogFormatError,
    pop_log_format,
    setup_logging,
)
from secure_release.researcher.cli import build_parser as researcher_parser
from secure_release.server.cli import build_parser as server_parser

ROOT = Path(__file__).resolve().parents[2]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_logging() -> object:
    yield
    logging.getLogger("secure_release").handlers[:] = []


def test_text_on_a_terminal_json_otherwise() -> None:
    tty = _Tty()
    setup_logging(stream=tty)
    log = EventLog("curator", "alice")
    log("serving_keys", release_id="r1", note="serving the key to researcher until 2026-12-01 10:00, Ctrl-C to stop")
    log("table_loaded", rows=344, alphabet_size=6, pad_key="abcd")
    plain = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", tty.getvalue()).split())  # rich colours and wraps
    events = plain.split(" INFO ")
    assert len(events) == 3, plain  # one record a line (wrapped at the terminal's width at most)
    assert events[1].startswith("alice serving the key to researcher until 2026-12-01 10:00, Ctrl-C to stop")
    assert "table loaded: rows=344, alphabet_size=6, pad_key=[redacted]" in events[2] and "{" not in plain
    pipe = io.StringIO()
    setup_logging(stream=pipe)
    EventLog("curator", "alice")("table_loaded", rows=1, pad_key="abcd")
    record = json.loads(pipe.getvalue())
    assert record["event"] == "table_loaded" and record["pad_key"] == "[redacted]"


def test_the_flag_wins_in_either_direction() -> None:
    pipe, tty = io.StringIO(), _Tty()
    setup_logging(stream=pipe, log_format="text")
    EventLog("server", "server")("listening", address="127.0.0.1:1")
    assert "listening: address=127.0.0.1:1" in pipe.getvalue()
    setup_logging(stream=tty, log_format="json")
    EventLog("server", "server")("listening", address="127.0.0.1:1")
    assert json.loads(tty.getvalue())["address"] == "127.0.0.1:1"


def test_log_format_is_taken_from_anywhere_in_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECURE_RELEASE_LOG_FORMAT", raising=False)
    assert pop_log_format(["run", "--log-format", "text", "--x", "1"]) == (["run", "--x", "1"], "text")
    assert pop_log_format(["--log-format=json", "fetch"]) == (["fetch"], "json")
    assert pop_log_format(["fetch"]) == (["fetch"], None)
    with pytest.raises(UnknownLogFormatError, match="allowed: json, text"):
        pop_log_format(["--log-format", "yaml"])
    monkeypatch.setenv("SECURE_RELEASE_LOG_FORMAT", "text")
    assert pop_log_format(["serve"]) == (["serve"], "text")


def test_every_help_shows_the_installed_command_name() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    parsers = {"secure-release": app_parser(), "secure-release-curator": curator_parser(),
               "secure-release-server": server_parser(), "secure-release-researcher": researcher_parser()}  # fmt: skip
    assert set(parsers) == set(scripts)
    for name, parser in parsers.items():
        assert parser.prog == name
        assert parser.format_usage().startswith(f"usage: {name} ")
    budget = curator_parser()._subparsers._group_actions[0].choices["budget"]  # type: ignore[union-attr,index]
    assert budget.prog == "secure-release-curator budget"
    for name in ("secure-release-curator", "secure-release-server", "secure-release-researcher"):
        assert "--log-format" in parsers[name].format_help()


def test_a_missing_file_is_named_without_an_errno() -> None:
    from secure_release.infra.exitcodes import describe

    with pytest.raises(OSError) as info:
        Path("/nonexistent/certs/alice.pem").read_text(encoding="ascii")
    assert describe(info.value) == "/nonexistent/certs/alice.pem: no such file or directory"
