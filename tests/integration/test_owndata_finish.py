"""A curator that finishes (issue 26, item 5): it serves its key until every granted researcher
acknowledged it (after storing its result durably; a fetch alone is not enough), with the key
retention as the upper bound and --serve-until-stopped as the opt-in to keep serving; a
researcher that restarts before its acknowledgement still gets the key."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import grpc
import numpy as np
import pytest
from support import make_spec

from secure_release.curator.records.keystore import ReleaseRecord
from secure_release.curator.release.serving import serve_until_acknowledged
from secure_release.curator.service import CuratorService
from secure_release.infra.auth import AuthedContext
from secure_release.infra.identity import Identity
from secure_release.infra.logs import EventLog
from secure_release.mechanism.primitives.pads import CipherMode, new_release_pad
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.researcher.client import Endpoints, acknowledge_keys

SCHEMA = CuratorSchema("alice", (Attribute("edu", ("a", "b", "c")),))


class _AbortedError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class _Context:
    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise _AbortedError(code, details)

    def time_remaining(self) -> float:
        return 5.0


def _as(name: str) -> Any:
    return AuthedContext(_Context(), Identity("researcher", name))  # type: ignore[arg-type]


def _service(grants: tuple[str, ...] = ("res", "res2")) -> CuratorService:
    service = CuratorService("alice", SCHEMA, EventLog("curator", "alice"))
    service.add_release("r1", new_release_pad(CipherMode.CHACHA20, 3, 10), list(grants))
    return service


def test_a_fetch_is_not_an_acknowledgement_and_a_restarted_researcher_gets_the_key_again() -> None:
    service = _service()
    first = list(service.ReleaseKey(pb.KeyRequest(release_id="r1"), _as("res")))
    assert not service.wait_keys_acknowledged("r1", timeout=0.01)  # fetched, not stored
    again = list(service.ReleaseKey(pb.KeyRequest(release_id="r1"), _as("res")))  # the researcher restarted
    assert again[0].chacha20_key == first[0].chacha20_key
    assert not service.AcknowledgeKey(pb.KeyAck(release_id="r1"), _as("res")).all_acknowledged
    assert service.unacknowledged("r1") == ["res2"]
    with pytest.raises(_AbortedError) as refused:
        service.AcknowledgeKey(pb.KeyAck(release_id="r1"), _as("eve"))
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert service.AcknowledgeKey(pb.KeyAck(release_id="r1"), _as("res2")).all_acknowledged
    assert service.AcknowledgeKey(pb.KeyAck(release_id="r1"), _as("res2")).all_acknowledged  # idempotent
    assert service.wait_keys_acknowledged("r1", timeout=0.01)


def _record(retention_s: float) -> ReleaseRecord:
    spec = replace(make_spec(m=10, n=40), release_id="r1")
    record = ReleaseRecord(spec, new_release_pad(CipherMode.CHACHA20, 3, 10), np.zeros(10, np.uint32),
                           "f" * 64, "d", "s")  # fmt: skip
    return replace(record, retention_until=time.time() + retention_s)


def _serve(exit_after_keys: bool, retention_s: float, keystore: Path | None = None) -> tuple[
        CuratorService, threading.Thread, threading.Event, list[dict[str, Any]]]:  # fmt: skip
    service = CuratorService("alice", SCHEMA, EventLog("curator", "alice"))
    events: list[dict[str, Any]] = []

    real = EventLog("curator", "alice")

    class Log:
        def __call__(self, event: str, **fields: Any) -> None:
            real(event, **fields)  # a field the logging module reserves would fail here
            events.append({"event": event, **fields})

    config = SimpleNamespace(release_id="r1", grants=("res",), exit_after_keys=exit_after_keys, keystore=keystore)
    stop = threading.Event()
    thread = threading.Thread(
        target=serve_until_acknowledged, args=(config, service, Log(), _record(retention_s), stop), daemon=True
    )
    thread.start()
    while "r1" not in service.keys:
        time.sleep(0.01)
    return service, thread, stop, events


def test_the_curator_finishes_once_every_granted_researcher_acknowledged() -> None:
    service, thread, _stop, events = _serve(exit_after_keys=True, retention_s=3600)
    list(service.ReleaseKey(pb.KeyRequest(release_id="r1"), _as("res")))
    thread.join(1.0)
    assert thread.is_alive()  # fetched only: still serving
    waiting = next(e for e in events if e["event"] == "serving_keys")["note"]
    assert waiting.startswith("serving the key to res until each acknowledges it or ") and "Ctrl-C to stop" in waiting
    service.AcknowledgeKey(pb.KeyAck(release_id="r1"), _as("res"))
    thread.join(3.0)
    assert not thread.is_alive() and events[-1]["event"] == "keys_acknowledged"


def test_the_key_retention_bounds_the_wait_and_serving_until_stopped_is_opt_in() -> None:
    _, thread, _, events = _serve(exit_after_keys=True, retention_s=0.5)
    thread.join(5.0)
    assert not thread.is_alive() and events[-1]["event"] == "key_retention_ended"
    service, thread, stop, _ = _serve(exit_after_keys=False, retention_s=3600)
    service.AcknowledgeKey(pb.KeyAck(release_id="r1"), _as("res"))
    thread.join(1.5)
    assert thread.is_alive()  # --serve-until-stopped: an acknowledgement does not end it
    stop.set()
    thread.join(3.0)
    assert not thread.is_alive()


def test_the_researcher_acknowledges_each_curator_whose_key_it_used(tmp_path: Path) -> None:
    from secure_release.curator.release.opening import start_server

    service = _service(grants=("researcher",))
    config = SimpleNamespace(listen_host="127.0.0.1", listen_port=0, certs=None, name="alice", insecure=True,
                             port_file=str(tmp_path / "port"), leader=False)  # fmt: skip
    server = start_server(config, service, EventLog("curator", "alice"))  # type: ignore[arg-type]
    try:
        port = int((tmp_path / "port").read_text())
        endpoints = Endpoints(server="127.0.0.1:1", certs=None, name="researcher", insecure=True,
                              curators={"alice": f"127.0.0.1:{port}"})  # fmt: skip
        acknowledge_keys(endpoints, "r1", ["alice"], EventLog("researcher", "researcher"))
        assert service.wait_keys_acknowledged("r1", timeout=1.0)
    finally:
        server.stop(None)


def test_a_restarted_curator_remembers_the_acknowledgement(tmp_path: Path) -> None:
    service, thread, _stop, _ = _serve(exit_after_keys=True, retention_s=3600, keystore=tmp_path)
    service.AcknowledgeKey(pb.KeyAck(release_id="r1"), _as("res"))
    thread.join(3.0)
    assert not thread.is_alive()
    assert (tmp_path / "acknowledged-r1.json").read_text() == '["res"]'
    _, again, _stop2, events = _serve(exit_after_keys=True, retention_s=3600, keystore=tmp_path)  # the restart
    again.join(3.0)
    assert not again.is_alive() and events[-1]["event"] == "keys_acknowledged"
