"""The Researcher service over gRPC (behind the access table) and the researcher CLI, against
in-process fakes of the server and the curators."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from researcher_fakes import FakeCurator, FakeRelease, FakeServer, make_release, reports_equal, running

from secure_release.infra.logs import ROOT_LOGGER, EventLog
from secure_release.infra.pki import init_pki
from secure_release.infra.tls import bind, make_grpc_server, secure_channel
from secure_release.infra.wire import report_to_pb
from secure_release.mechanism.estimation.report import ReleaseReport
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.cli import main
from secure_release.researcher.client import Endpoints
from secure_release.researcher.errors import NoKeysError
from secure_release.researcher.pipeline import process_release
from secure_release.researcher.service import ReleaseTracker, ResearcherService
from secure_release.researcher.storage import load_reports, read_report

LOG = EventLog("researcher", "test")


@pytest.fixture(scope="module")
def release() -> FakeRelease:
    return make_release(CipherMode.CHACHA20)


@contextlib.contextmanager
def researcher_service(tracker: ReleaseTracker) -> Iterator[str]:
    server = make_grpc_server(max_workers=4, insecure=True)
    readers = frozenset({"researcher/researcher-1", "analyst/analyst-1"})
    pb_grpc.add_ResearcherServicer_to_server(ResearcherService(tracker, LOG, 5.0, readers), server)
    port = bind(server, "127.0.0.1", 0, None, "researcher", insecure=True)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def stub(address: str, role: str) -> pb_grpc.ResearcherStub:
    return pb_grpc.ResearcherStub(secure_channel(address, None, f"{role}-1", insecure=True, role=role))


def tracker_for(endpoints: Endpoints, out: Path) -> ReleaseTracker:
    def process(release_id: str, digest: bytes) -> ReleaseReport:
        return process_release(endpoints, release_id, out, LOG, 5.0, digest)

    return ReleaseTracker(process, LOG, load_reports(out, LOG))


def test_notify_then_get_estimate_serves_the_report(release: FakeRelease, tmp_path: Path) -> None:
    fake_server = FakeServer(release)
    with running(fake_server, [FakeCurator(release, 0), FakeCurator(release, 1)]) as endpoints:
        tracker = tracker_for(endpoints, tmp_path)
        with researcher_service(tracker) as address:
            ack = stub(address, "server").NotifyReady(
                pb.ReadyNotice(release_id="r1", perturbed_digest=fake_server.digest()), timeout=5
            )
            assert ack.accepted
            resp = stub(address, "analyst").GetEstimate(pb.EstimateRequest(release_id="r1", wait=True), timeout=10)
            listed = stub(address, "researcher").ListReleases(pb.ListReleasesRequest(), timeout=5)
    assert resp == report_to_pb(read_report(tmp_path / "r1.json"))
    assert [c.estimate for c in resp.cells] == release.expected().raw.tolist()
    assert list(listed.release_ids) == ["r1"]


def test_a_restarted_service_serves_reports_from_disk(release: FakeRelease, tmp_path: Path) -> None:
    with running(FakeServer(release), [FakeCurator(release, 0), FakeCurator(release, 1)]) as endpoints:
        first = process_release(endpoints, "r1", tmp_path, LOG, 5.0)
    unreachable = Endpoints(None, "researcher", True, "127.0.0.1:1")
    with researcher_service(tracker_for(unreachable, tmp_path)) as address:
        resp = stub(address, "analyst").GetEstimate(pb.EstimateRequest(release_id="r1"), timeout=5)
    assert resp == report_to_pb(first)


def _code(call: object) -> tuple[grpc.StatusCode, str]:
    assert isinstance(call, grpc.RpcError)
    return call.code(), call.details()


def _call(fn: object, request: object) -> object:
    try:
        return fn(request, timeout=10)  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc


def test_roles_unknown_releases_and_bad_ids_are_refused(release: FakeRelease, tmp_path: Path) -> None:
    tracker = ReleaseTracker(lambda rid, digest: pytest.fail("nothing should be processed"), LOG, {})
    with researcher_service(tracker) as address:
        notify = _call(stub(address, "analyst").NotifyReady, pb.ReadyNotice(release_id="r1"))
        unknown = _call(stub(address, "analyst").GetEstimate, pb.EstimateRequest(release_id="r9"))
        bad_id = _call(stub(address, "analyst").GetEstimate, pb.EstimateRequest(release_id="../etc", wait=True))
        curator = _call(stub(address, "curator").ListReleases, pb.ListReleasesRequest())
        other = pb_grpc.ResearcherStub(secure_channel(address, None, "analyst-2", insecure=True, role="analyst"))
        stranger = _call(other.GetEstimate, pb.EstimateRequest(release_id="r1"))
        stranger_list = _call(other.ListReleases, pb.ListReleasesRequest())
    assert _code(notify)[0] == grpc.StatusCode.PERMISSION_DENIED
    # an analyst this researcher did not name may read nothing, not even the list of releases
    assert _code(stranger) == (grpc.StatusCode.PERMISSION_DENIED, _code(stranger)[1])
    assert "NotAReaderError" in _code(stranger)[1] and _code(stranger_list)[0] == grpc.StatusCode.PERMISSION_DENIED
    assert _code(unknown) == (grpc.StatusCode.NOT_FOUND, _code(unknown)[1])
    assert "EstimateNotFoundError" in _code(unknown)[1] and "wait=true" in _code(unknown)[1]
    assert _code(bad_id)[0] == grpc.StatusCode.INVALID_ARGUMENT and "release id" in _code(bad_id)[1]
    assert _code(curator)[0] == grpc.StatusCode.PERMISSION_DENIED


def test_a_failed_release_is_reported_with_its_error_kind(release: FakeRelease, tmp_path: Path) -> None:
    fakes = running(FakeServer(release, tamper=True), [FakeCurator(release, 0), FakeCurator(release, 1)])
    with fakes as endpoints, researcher_service(tracker_for(endpoints, tmp_path)) as address:
        failed = _call(stub(address, "analyst").GetEstimate, pb.EstimateRequest(release_id="r1", wait=True))
    code, details = _code(failed)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith("DigestMismatchError")
    assert list(tmp_path.iterdir()) == []


def test_over_mutual_tls_the_certificate_is_the_identity(release: FakeRelease, tmp_path: Path) -> None:
    parties = [("server", "server"), ("curator", "alice"), ("curator", "bob")]
    init_pki(tmp_path, [*parties, ("researcher", "researcher"), ("analyst", "carol")])
    curators = [FakeCurator(release, 0), FakeCurator(release, 1)]
    with running(FakeServer(release), curators, certs=tmp_path) as endpoints:
        report = process_release(endpoints, "r1", None, LOG, 5.0)
    assert report.estimate.tolist() == release.expected().raw.tolist()
    # the keys are fetched first (the rows are then counted as they stream): both curators refuse the role
    with (
        running(FakeServer(release), curators, certs=tmp_path, as_name="carol") as endpoints,
        pytest.raises(NoKeysError) as refused,
    ):
        process_release(endpoints, "r1", None, LOG, 5.0)
    assert str(refused.value).count("role analyst may not call ReleaseKey; allowed: researcher") == 2


# ---------------------------------------------------------------------------------- CLI
@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger(ROOT_LOGGER)
    saved = (root.handlers[:], root.level, root.propagate)
    yield
    root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]


BASE = ["fetch", "--insecure", "--server", "127.0.0.1:1", "--release-id", "r1"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-3"])
def test_timeout_must_be_finite_and_positive(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, f"--timeout={value}"]) == 2
    err = capsys.readouterr().err
    assert "--timeout must be a finite number of seconds > 0" in err


def test_timeout_from_env_and_config_is_checked_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"timeout": NaN}')  # Python's json accepts NaN
    assert main([*BASE, "--config", str(config)]) == 2
    monkeypatch.setenv("SECURE_RELEASE_TIMEOUT", "inf")
    assert main(BASE) == 2
    assert capsys.readouterr().err.count("finite number of seconds") == 2


@pytest.mark.parametrize("flag", ["alice", "alice=nowhere", "=127.0.0.1:7101"])
def test_malformed_curator_flag_is_named(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--curator", flag]) == 2
    assert "--curator" in capsys.readouterr().err


def test_fetch_prints_and_writes_the_report(
    release: FakeRelease, tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    out = tmp_path / "results"
    with running(FakeServer(release), [FakeCurator(release, 0), FakeCurator(release, 1)]) as endpoints:
        curators = [f"--curator={name}={address}" for name, address in endpoints.curators.items()]
        argv = ["fetch", "--insecure", "--server", endpoints.server, *curators, "--out", str(out)]
        assert main([*argv, "--release-id", "r1", "--timeout", "5"]) == 0
    printed = ReleaseReport.from_dict(json.loads(capsys.readouterr().out))
    assert reports_equal(printed, read_report(out / "r1.json"))
    assert printed.estimate.tolist() == release.expected().raw.tolist()
