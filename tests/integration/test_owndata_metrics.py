"""Metrics for an operator (issue 26, item 10): ``--metrics-listen`` serves Prometheus text with
releases by outcome, RPCs by method and code, phase durations, bytes stored and budget left."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from secure_release.curator.release.opening import start_server
from secure_release.curator.service import CuratorService
from secure_release.infra import metrics
from secure_release.infra.logs import ROOT_LOGGER, EventLog
from secure_release.infra.tls import secure_channel
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc


@pytest.fixture()
def active(tmp_path: Path) -> Iterator[metrics.Metrics]:
    root = logging.getLogger(ROOT_LOGGER)
    before, level = list(root.handlers), root.level
    root.setLevel(logging.INFO)
    started = metrics.start_metrics("127.0.0.1:0", "curator")
    assert started is not None and started.port
    try:
        yield started
    finally:
        started.stop()
        metrics.ACTIVE = None
        root.handlers[:], root.level = before, level


def _scrape(m: metrics.Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def test_off_by_default() -> None:
    assert metrics.start_metrics(None, "curator") is None and metrics.interceptors() == []


def test_events_and_rpcs_become_metrics(active: metrics.Metrics, tmp_path: Path) -> None:
    log = EventLog("curator", "alice")
    log("table_loaded", rows=10)
    log("agreed", release_id="r1")
    log("released", release_id="r1", budget_left=1.5, dataset="alice.csv", pad_key="never exported")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "blob").write_bytes(b"x" * 1234)
    active.watch_store(tmp_path / "store")
    service = CuratorService("alice", CuratorSchema("alice", (Attribute("a", ("x", "y")),)), log)
    config = SimpleNamespace(listen_host="127.0.0.1", listen_port=0, certs=None, name="alice", insecure=True,
                             port_file=str(tmp_path / "port"), leader=False)  # fmt: skip
    server = start_server(config, service, log)  # type: ignore[arg-type]
    try:
        address = f"127.0.0.1:{int((tmp_path / 'port').read_text())}"
        with secure_channel(address, None, "researcher", True, role="researcher", peer_role="curator") as channel:
            stub = pb_grpc.CuratorStub(channel)
            for _ in range(2):
                with pytest.raises(grpc.RpcError):
                    list(stub.ReleaseKey(pb.KeyRequest(release_id="nope"), timeout=5))
    finally:
        server.stop(None)
    got = _scrape(active)
    assert got[("secure_release_releases_total", (("component", "curator"), ("outcome", "released")))] == 1
    assert got[("secure_release_rpcs_total", (("code", "NOT_FOUND"), ("method", "ReleaseKey")))] == 2
    assert got[("secure_release_phase_seconds_count", (("component", "curator"), ("phase", "released")))] == 1
    assert got[("secure_release_budget_left_epsilon", (("dataset", "alice.csv"),))] == 1.5
    assert got[("secure_release_stored_bytes", ())] == 1234
    assert not any("never exported" in str(key) for key in got)
