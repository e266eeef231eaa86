"""infra.logs: every record carries component, party and (when bound) release_id, whichever
call style made it; secret-looking fields are redacted."""

from __future__ import annotations

import io
import json
import logging

from secure_release.infra.logs import REDACTED, EventLog, setup_logging


def _records(emit: object) -> list[dict[str, object]]:
    stream = io.StringIO()
    setup_logging("INFO", stream)
    try:
        assert callable(emit)
        emit()
    finally:
        logging.getLogger("secure_release").handlers.clear()
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_both_call_styles_give_the_same_fields() -> None:
    log = EventLog("server", "cloud")

    def emit() -> None:
        log("registered", release="r1", curator="alice")
        log.info("registered", extra={"release": "r1", "curator": "alice"})
        log.warning("slow", release_id="r1", curator="alice")

    first, second, third = _records(emit)
    for rec in (first, second):
        assert {k: rec[k] for k in ("component", "party", "release_id", "curator", "event", "level")} == {
            "component": "server", "party": "cloud", "release_id": "r1", "curator": "alice",
            "event": "registered", "level": "info",
        }  # fmt: skip
        assert "release" not in rec
    assert third["level"] == "warning" and third["release_id"] == "r1"


def test_a_bound_release_and_a_renamed_party_reach_every_record() -> None:
    log = EventLog("curator", "x")
    log.party = "alice"
    bound = log.for_release("r9")
    (rec,) = _records(lambda: bound.error("aborted", reason="timeout"))
    assert (rec["component"], rec["party"], rec["release_id"], rec["level"]) == ("curator", "alice", "r9", "error")


def test_secret_fields_are_redacted_in_both_styles() -> None:
    log = EventLog("curator", "alice")

    def emit() -> None:
        log("keyed", pad_key="00ff", sample_fingerprint="abc")
        log.info("keyed", extra={"seed": "11"})

    a, b = _records(emit)
    assert a["pad_key"] == REDACTED and a["sample_fingerprint"] == "abc" and a["redacted"] is True
    assert b["seed"] == REDACTED
