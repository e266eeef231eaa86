"""The researcher's pipeline against in-process fakes of the server and the curators: the report
equals ``mechanism.protocol.in_memory``'s estimate exactly, altered rows and refusals are named, and the
files derive from the typed report."""

from __future__ import annotations

import csv
import io
import json
import logging
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from researcher_fakes import (
    EventRecorder,
    FakeCurator,
    FakeRelease,
    FakeServer,
    make_release,
    reports_equal,
    running,
)

from secure_release.infra.logs import EventLog, JsonFormatter, looks_secret
from secure_release.infra.wire import report_to_pb
from secure_release.mechanism.errors import ErrorKind
from secure_release.mechanism.estimation.report import OUTPUT_COLUMNS, ReleaseReport
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.researcher.client import AbortedBeforeSealError, Endpoints
from secure_release.researcher.errors import DigestMismatchError, KeyMismatchError, NoKeysError, ReleaseNotReadyError
from secure_release.researcher.heatmap import heatmap_png, share_grid
from secure_release.researcher.pipeline import MissingKeysError, process_release
from secure_release.researcher.storage import load_reports, read_report, report_csv, report_json, write_report

LOG = EventLog("researcher", "test")


@pytest.fixture(scope="module")
def chacha() -> FakeRelease:
    return make_release(CipherMode.CHACHA20)


@pytest.fixture(scope="module")
def otp() -> FakeRelease:
    return make_release(CipherMode.OTP)


@pytest.fixture(scope="module")
def joint_report(chacha: FakeRelease) -> ReleaseReport:
    with running(FakeServer(chacha), [FakeCurator(chacha, 0), FakeCurator(chacha, 1)]) as endpoints:
        return process_release(endpoints, "r1", None, LOG, timeout=5)


@pytest.fixture
def recorder() -> Iterator[EventRecorder]:
    handler, logger = EventRecorder(), logging.getLogger("secure_release.researcher")
    logger.addHandler(handler)
    old_level, logger.level = logger.level, logging.INFO
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def _assert_matches(report: ReleaseReport, release: FakeRelease, granted: list[int]) -> None:
    want = release.expected(granted)
    pairs = [
        (report.estimate, want.raw),
        (report.projected, want.projected),
        (report.mle, want.mle),
        (report.standard_error, want.standard_errors),
        (report.ci_low, want.ci_low),
        (report.ci_high, want.ci_high),
        (report.observed, want.counts),
    ]
    for got, expected in pairs:
        assert np.array_equal(got, expected)
    assert report.mle_iterations == want.mle_iterations
    assert list(report.labels) == release.labels(granted)
    assert report.plan == release.spec.plan


@pytest.mark.parametrize("cipher", [CipherMode.CHACHA20, CipherMode.OTP])
def test_report_equals_the_protocol_estimate_exactly(
    cipher: CipherMode, chacha: FakeRelease, otp: FakeRelease, tmp_path: Path
) -> None:
    release = chacha if cipher is CipherMode.CHACHA20 else otp
    out = tmp_path / "results"
    with running(FakeServer(release), [FakeCurator(release, 0), FakeCurator(release, 1)]) as endpoints:
        report = process_release(endpoints, "r1", out, LOG, timeout=5)
    _assert_matches(report, release, [0, 1])
    assert not report.marginal and report.covered == ("alice", "bob") and report.refused == {}
    assert report.attributes == ("education", "married", "region")
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for suffix in ("json", "csv", "png"):
        assert stat.S_IMODE((out / f"r1.{suffix}").stat().st_mode) == 0o600
    assert reports_equal(read_report(out / "r1.json"), report)
    assert sorted(p.name for p in out.iterdir()) == ["r1.csv", "r1.json", "r1.png"]  # no temporary files left


def test_waits_until_the_release_is_perturbed(chacha: FakeRelease) -> None:
    server = FakeServer(chacha, pending_polls=2)
    with running(server, [FakeCurator(chacha, 0), FakeCurator(chacha, 1)]) as endpoints:
        report = process_release(endpoints, "r1", None, LOG, timeout=5)
    assert server.polls == 3
    _assert_matches(report, chacha, [0, 1])


def test_a_release_never_perturbed_is_a_named_timeout(chacha: FakeRelease, tmp_path: Path) -> None:
    with running(FakeServer(chacha, pending_polls=10**6), []) as endpoints, pytest.raises(ReleaseNotReadyError) as err:
        process_release(endpoints, "r1", tmp_path / "out", LOG, timeout=0.5)
    assert "not PERTURBED" in str(err.value) and err.value.kind is ErrorKind.UNAVAILABLE
    assert not (tmp_path / "out").exists()


def test_an_unreachable_server_is_the_same_named_timeout(tmp_path: Path) -> None:
    nowhere = Endpoints(None, "researcher", True, "127.0.0.1:1")
    with pytest.raises(ReleaseNotReadyError, match=r"127\.0\.0\.1:1"):
        process_release(nowhere, "r1", tmp_path / "out", LOG, timeout=0.5)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["rows altered", "status digest", "notice digest"])
def test_digest_mismatch_is_named_and_writes_nothing(how: str, chacha: FakeRelease, tmp_path: Path) -> None:
    server = FakeServer(
        chacha, tamper=how == "rows altered", status_digest=b"\x01" * 32 if how == "status digest" else None
    )
    notified = b"\x02" * 32 if how == "notice digest" else b""
    curators = [FakeCurator(chacha, 0), FakeCurator(chacha, 1)]
    with running(server, curators) as endpoints, pytest.raises(DigestMismatchError) as err:
        process_release(endpoints, "r1", tmp_path / "out", LOG, timeout=5, notified_digest=notified)
    assert "refusing to estimate" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_the_right_digest_in_the_notice_is_accepted(chacha: FakeRelease) -> None:
    server = FakeServer(chacha)
    with running(server, [FakeCurator(chacha, 0), FakeCurator(chacha, 1)]) as endpoints:
        report = process_release(endpoints, "r1", None, LOG, timeout=5, notified_digest=server.digest())
    _assert_matches(report, chacha, [0, 1])


def test_a_refusing_curator_gives_a_marginal_report_that_says_who(
    otp: FakeRelease, tmp_path: Path, recorder: EventRecorder
) -> None:
    with running(FakeServer(otp), [FakeCurator(otp, 0), FakeCurator(otp, 1, refuse=True)]) as endpoints:
        report = process_release(endpoints, "r1", tmp_path, LOG, timeout=5)
    _assert_matches(report, otp, [0])
    assert report.marginal and report.covered == ("alice",) and report.curators == ("alice", "bob")
    assert list(report.refused) == ["bob"] and report.refused["bob"].startswith("PERMISSION_DENIED")
    assert "MARGINAL ONLY" in report.note and "bob" in report.note
    assert report.attributes == ("education", "married")
    saved = json.loads((tmp_path / "r1.json").read_text())
    assert saved["marginal"] is True and "bob" in saved["refused"] and "MARGINAL ONLY" in saved["note"]
    assert {"key_refused", "marginal_only"} <= set(recorder.events())


def test_a_curator_without_an_address_counts_as_refused(chacha: FakeRelease) -> None:
    with running(FakeServer(chacha), [FakeCurator(chacha, 1)]) as endpoints:
        report = process_release(endpoints, "r1", None, LOG, timeout=5)
    assert report.covered == ("bob",) and "--curator alice=HOST:PORT" in report.refused["alice"]
    _assert_matches(report, chacha, [1])


def test_no_granted_key_is_a_named_error(chacha: FakeRelease, tmp_path: Path) -> None:
    curators = [FakeCurator(chacha, 0, refuse=True), FakeCurator(chacha, 1, refuse=True)]
    with running(FakeServer(chacha), curators) as endpoints, pytest.raises(NoKeysError) as err:
        process_release(endpoints, "r1", tmp_path / "out", LOG, timeout=5)
    assert err.value.kind is ErrorKind.PERMISSION_DENIED and "--grant" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_key_for_another_m_is_rejected(chacha: FakeRelease) -> None:
    curators = [FakeCurator(chacha, 0), FakeCurator(chacha, 1, wrong_m=True)]
    with running(FakeServer(chacha), curators) as endpoints, pytest.raises(KeyMismatchError) as err:
        process_release(endpoints, "r1", None, LOG, timeout=5)
    assert "bob's key" in str(err.value) and str(chacha.spec.m) in str(err.value)


def test_report_json_round_trip_is_exact(joint_report: ReleaseReport) -> None:
    again = ReleaseReport.from_dict(json.loads(report_json(joint_report)))
    assert reports_equal(again, joint_report)
    assert again.to_dict() == joint_report.to_dict()


def test_csv_is_the_report_cells(joint_report: ReleaseReport) -> None:
    rows = list(csv.reader(io.StringIO(report_csv(joint_report).decode())))
    assert rows[0] == ["education", "married", "region", *OUTPUT_COLUMNS]
    assert len(rows) == 1 + len(joint_report.labels) == 25
    body = np.array([r[3:] for r in rows[1:]], dtype=np.float64)
    assert np.array_equal(body[:, 0], joint_report.projected) and np.array_equal(body[:, 1], joint_report.estimate)
    assert np.array_equal(body[:, 2], joint_report.mle) and np.array_equal(body[:, 3], joint_report.standard_error)
    assert [tuple(r[:3]) for r in rows[1:]] == list(joint_report.labels)


def test_report_to_pb_carries_every_field(joint_report: ReleaseReport) -> None:
    msg = report_to_pb(joint_report)
    assert msg.release_id == "r1" and not msg.marginal
    assert list(msg.curators) == ["alice", "bob"] and list(msg.attributes) == list(joint_report.attributes)
    assert msg.interval_method == joint_report.interval_method and msg.mle_iterations == joint_report.mle_iterations
    for name, column in [
        ("estimate", joint_report.estimate),
        ("projected", joint_report.projected),
        ("mle", joint_report.mle),
        ("standard_error", joint_report.standard_error),
        ("ci_low", joint_report.ci_low),
        ("ci_high", joint_report.ci_high),
        ("observed", joint_report.observed),
    ]:
        assert np.array_equal([getattr(c, name) for c in msg.cells], column), name
    assert [tuple(c.labels) for c in msg.cells] == list(joint_report.labels)
    plan = joint_report.plan
    assert (msg.privacy.n, msg.privacy.m, msg.privacy.joint_size) == (plan.n, plan.m, plan.joint_size)
    assert (msg.privacy.epsilon, msg.privacy.gamma) == (plan.epsilon, plan.gamma)
    assert msg.privacy.predicted_rmse == plan.report()["predicted_rmse"]


def test_reload_skips_and_logs_unreadable_files(
    joint_report: ReleaseReport, tmp_path: Path, recorder: EventRecorder
) -> None:
    write_report(tmp_path, joint_report)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "renamed.json").write_bytes(report_json(joint_report))  # holds r1, named renamed
    (tmp_path / "partial.json").write_text(json.dumps({"release_id": "partial"}))
    reports = load_reports(tmp_path, LOG)
    assert list(reports) == ["r1"] and reports_equal(reports["r1"], joint_report)
    skipped = sorted(r.file for r in recorder.records if r.getMessage() == "unreadable_result")  # type: ignore[attr-defined]
    assert skipped == ["broken.json", "partial.json", "renamed.json"]


def test_heat_map_folds_the_first_attribute_into_rows(joint_report: ReleaseReport) -> None:
    values, rows, cols = share_grid(joint_report)
    assert rows == ["low", "mid", "high"] and len(cols) == 8 and cols[0] == "no / north"
    assert np.array_equal(values, joint_report.projected.reshape(3, 8))
    pytest.importorskip("matplotlib")
    png = heatmap_png(joint_report)
    assert png is not None and png.startswith(b"\x89PNG\r\n\x1a\n")


def test_logs_carry_no_key_or_row_bytes(chacha: FakeRelease, recorder: EventRecorder) -> None:
    with running(FakeServer(chacha), [FakeCurator(chacha, 0), FakeCurator(chacha, 1)]) as endpoints:
        process_release(endpoints, "r1", None, LOG, timeout=5)
    lines = [JsonFormatter().format(r) for r in recorder.records]
    assert {"fetched", "key_received", "estimated"} <= {json.loads(line)["event"] for line in lines}
    secrets = [pad.key.reveal() for pad in chacha.pads if pad.key is not None]
    assert len(secrets) == 2
    for line in lines:
        assert not any(s.hex() in line or repr(s) in line for s in secrets)
        assert not [name for name in json.loads(line) if looks_secret(name)]  # nothing even named like one


def test_report_survives_the_wire_exactly() -> None:
    """ReleaseReport -> EstimateResponse -> ReleaseReport loses nothing (marginal reports too)."""
    from secure_release.infra.wire import report_from_pb, report_to_pb
    from secure_release.mechanism.estimation.report import ReleaseReport
    from secure_release.mechanism.privacy.plan import plan_release

    plan = plan_release(1000, (3, 2), 1.0, 100)
    report = ReleaseReport(
        release_id="r1", plan=plan, curators=("alice", "bob"), covered=("alice",), attributes=("edu",),
        labels=(("a",), ("b",), ("c",)), estimate=np.array([0.5, 0.25, 0.25]), projected=np.array([0.5, 0.25, 0.25]),
        mle=np.array([0.5, 0.3, 0.2]), standard_error=np.array([0.1, 0.1, 0.1]), ci_low=np.array([0.3, 0.05, 0.0]),
        ci_high=np.array([0.7, 0.45, 0.5]), observed=np.array([50, 25, 25]), mle_iterations=0,
        interval_method="clopper-pearson, 95% per cell", refused={"bob": "PERMISSION_DENIED: no grant"},
    )  # fmt: skip
    back = report_from_pb(report_to_pb(report))
    assert back.to_dict() == report.to_dict()
    assert back.marginal and back.refused == {"bob": "PERMISSION_DENIED: no grant"}


# ---------------------------------------------------------------------------------- refused vs unavailable
@dataclass
class FlakyCurator(FakeCurator):
    """UNAVAILABLE for the first ``outages`` key requests (e.g. restarting), then serves."""

    outages: int = 0
    calls: int = 0

    def ReleaseKey(self, request: pb.KeyRequest, context: Any) -> Iterator[pb.KeyChunk]:  # noqa: N802
        self.calls += 1
        if self.calls <= self.outages:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        yield from super().ReleaseKey(request, context)


@dataclass
class AbortedServer(FakeServer):
    """Reports the release ABORTED with a reason."""

    def GetReleaseStatus(self, request: pb.ReleaseStatusRequest, context: Any) -> pb.ReleaseStatus:  # noqa: N802
        return pb.ReleaseStatus(release_id="r1", state=pb.RELEASE_STATE_ABORTED, abort_reason="bob: epsilon differs")


def test_an_unavailable_curator_is_asked_again_until_it_answers(chacha: FakeRelease) -> None:
    flaky = FlakyCurator(chacha, 1, outages=3)
    with running(FakeServer(chacha), [FakeCurator(chacha, 0), flaky]) as endpoints:
        report = process_release(endpoints, "r1", None, LOG, timeout=20, allow_partial=False)
    assert flaky.calls == 4 and not report.marginal
    _assert_matches(report, chacha, [0, 1])


def test_missing_keys_fail_unless_partial_is_allowed(chacha: FakeRelease, tmp_path: Path) -> None:
    down = FlakyCurator(chacha, 1, outages=10**6)
    with running(FakeServer(chacha), [FakeCurator(chacha, 0), down]) as endpoints:
        with pytest.raises(MissingKeysError, match=r"'bob': 'unavailable: UNAVAILABLE") as err:
            process_release(endpoints, "r1", tmp_path / "out", LOG, timeout=2, allow_partial=False)
        assert "--allow-partial" in str(err.value) and not (tmp_path / "out").exists()
        report = process_release(endpoints, "r1", None, LOG, timeout=2, allow_partial=True)
    assert report.marginal and report.refused["bob"].startswith("unavailable: UNAVAILABLE")
    refusing = [FakeCurator(chacha, 0), FakeCurator(chacha, 1, refuse=True)]
    with running(FakeServer(chacha), refusing) as endpoints, pytest.raises(MissingKeysError, match="'bob': 'PERMI"):
        process_release(endpoints, "r1", None, LOG, timeout=5, allow_partial=False)


def test_an_aborted_release_stops_the_wait_with_its_reason(chacha: FakeRelease) -> None:
    t0 = time.monotonic()
    fakes = running(AbortedServer(chacha), [FakeCurator(chacha, 0), FakeCurator(chacha, 1)])
    with fakes as endpoints, pytest.raises(AbortedBeforeSealError, match="bob: epsilon differs"):
        process_release(endpoints, "r1", None, LOG, timeout=30)
    assert time.monotonic() - t0 < 5
