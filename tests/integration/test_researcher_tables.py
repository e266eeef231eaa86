"""The researcher on a release of several tables (a designed release), against in-process fakes of
the server and the curators serving ``in_memory.run_tables_release``'s perturbed rows and pads
(fixed keys): each table's observed counts and estimates equal the in-memory protocol's exactly
(chacha20 and otp); a design whose digest is not the spec's is refused by name; the report is
stored, served over GetEstimate (``tables_json``) and listed; the classic path is untouched."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from researcher_fakes import FakeCurator, FakeRelease, FakeServer, running

from secure_release.infra.logs import EventLog
from secure_release.infra.tls import bind, make_grpc_server, secure_channel
from secure_release.infra.wire import report_from_pb, tables_report_from_pb, tables_to_pb
from secure_release.mechanism.analysis.design import Design, design
from secure_release.mechanism.errors import MultiTableResultError
from secure_release.mechanism.estimation.report import TABLES_FORMAT, ReleaseReport, TablesReport
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.in_memory import CuratorTable, TablesResult, run_tables_release
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.cli import main
from secure_release.researcher.errors import KeyMismatchError
from secure_release.researcher.pipeline import process_release
from secure_release.researcher.service import ReleaseTracker, ResearcherService
from secure_release.researcher.storage import AnyReport, load_reports, read_report

LOG = EventLog("researcher", "test")
N = 4000
ALICE = CuratorSchema("alice", (Attribute("A", ("a0", "a1")), Attribute("C", ("c0", "c1", "c2"))))
BOB = CuratorSchema("bob", (Attribute("B", ("b0", "b1")), Attribute("D", ("d0", "d1", "d2", "d3"))))
PAD_KEYS = (PadKey(bytes(range(32))), PadKey(bytes(range(2, 34))))
PRAM = PramKey(bytes(range(1, 33)))


def _tables(n: int = N, seed: int = 3) -> list[CuratorTable]:
    rng = np.random.default_rng(seed)
    ids = np.array([f"id{i}" for i in range(n)])
    a = rng.integers(0, 2, n)
    b = np.where(rng.random(n) < 0.8, a, 1 - a)
    c, d = rng.integers(0, 3, n), rng.integers(0, 4, n)
    alice = CuratorTable(ALICE, ids, {"A": np.array(["a0", "a1"])[a], "C": np.array(["c0", "c1", "c2"])[c]})
    order = rng.permutation(n)
    bob = CuratorTable(BOB, ids[order], {"B": np.array(["b0", "b1"])[b][order],
                                         "D": np.array(["d0", "d1", "d2", "d3"])[d][order]})  # fmt: skip
    return [alice, bob]


@pytest.fixture(scope="module")
def the_design() -> Design:
    return design(N, [ALICE, BOB], 2.0, ["A ~ B", "C ~ D", "A ~ D"], at_v=0.2)


@dataclass
class Designed:
    release: FakeRelease
    result: TablesResult
    design: Design


def _designed(d: Design, cipher: CipherMode, granted: Sequence[int] | None = None) -> Designed:
    planned = d.planned_tables()
    res = run_tables_release(
        _tables(), [a for a, _, _ in planned], [m for _, m, _ in planned], [g for _, _, g in planned], d.epsilon,
        d.digest(), d.n, cipher, "r1", seed=Seed(bytes(32)), alignment_key=AlignmentKey(bytes(range(3, 35))),
        pram_key=PRAM, pad_keys=list(PAD_KEYS) if cipher is CipherMode.CHACHA20 else None, granted=granted,
    )  # fmt: skip
    pads = res.researcher_view["pads"]  # the granted curators' (the fakes serve both: granted=None)
    return Designed(FakeRelease(res.spec, res.server_view["perturbed"], pads, (ALICE, BOB)), res, d)


@pytest.fixture(scope="module", params=[CipherMode.CHACHA20, CipherMode.OTP], ids=["chacha20", "otp"])
def designed(request: pytest.FixtureRequest, the_design: Design) -> Designed:
    return _designed(the_design, request.param)


@dataclass
class DesignCurator(FakeCurator):
    """A fake curator that sends the design file on its first key chunk (KeyChunk.design)."""

    design_bytes: bytes = b""

    def ReleaseKey(self, request: pb.KeyRequest, context: Any) -> Iterator[pb.KeyChunk]:  # noqa: N802
        for i, chunk in enumerate(super().ReleaseKey(request, context)):
            if i == 0:
                chunk.design = self.design_bytes
            yield chunk


def _curators(rel: Designed, design_bytes: Sequence[bytes] | None = None) -> list[FakeCurator]:
    own = rel.design.canonical_json()
    sent = design_bytes or (own, own)
    return [DesignCurator(rel.release, j, design_bytes=sent[j]) for j in range(2)]


def _assert_tables_match(report: TablesReport, rel: Designed) -> None:
    res, d = rel.result, rel.design
    assert report.design_digest == d.digest() and report.design == d.to_dict()
    assert len(report.tables) == len(res.estimates) == len(d.release.tables)
    for t, (table, estimate, plan) in enumerate(zip(report.tables, res.estimates, res.plans, strict=True)):
        assert table is not None and estimate is not None, t
        assert np.array_equal(table.observed, estimate.counts)
        assert np.array_equal(table.estimate, estimate.raw)
        assert np.array_equal(table.projected, estimate.projected)
        assert np.array_equal(table.standard_error, estimate.standard_errors)
        assert np.array_equal(table.ci_low, estimate.ci_low)
        assert np.array_equal(table.ci_high, estimate.ci_high)
        assert table.plan == plan
        assert table.attributes == d.release.tables[t].attributes
    assert report.missing == {}


def test_each_tables_estimate_equals_the_in_memory_protocol_exactly(designed: Designed, tmp_path: Path) -> None:
    out = tmp_path / "results"
    # chunks of 400 rows: table boundaries fall inside chunks, decryption and counting are ranged
    with running(FakeServer(designed.release), _curators(designed)) as endpoints:
        report = process_release(endpoints, "r1", out, LOG, timeout=10)
    assert isinstance(report, TablesReport)
    _assert_tables_match(report, designed)
    stored = read_report(out / "r1.json")
    assert isinstance(stored, TablesReport) and stored.to_dict() == report.to_dict()
    assert json.loads((out / "r1.json").read_text())["format"] == TABLES_FORMAT
    csvs = [f"r1.t{t}.csv" for t in range(1, len(report.tables) + 1)]
    assert sorted(p.name for p in out.iterdir()) == sorted(["r1.json", *csvs])
    with pytest.raises(MultiTableResultError):  # a classic reader refuses it by name
        ReleaseReport.from_dict(json.loads((out / "r1.json").read_text()))


def test_a_design_whose_digest_differs_from_the_specs_is_refused(the_design: Design, tmp_path: Path) -> None:
    rel = _designed(the_design, CipherMode.CHACHA20)
    other = design(N, [ALICE, BOB], 2.0, ["A ~ B"], at_v=0.2).canonical_json()
    for sent in [(rel.design.canonical_json(), other), (b"", b"")]:
        with (
            running(FakeServer(rel.release), _curators(rel, sent)) as endpoints,
            pytest.raises(KeyMismatchError, match=f"design {rel.design.digest()}") as err,
        ):
            process_release(endpoints, "r1", tmp_path / "out", LOG, timeout=10, allow_partial=False)
        assert "SHA-256" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_table_with_a_curator_without_key_is_missing_by_name(the_design: Design) -> None:
    rel = _designed(the_design, CipherMode.CHACHA20)
    alone = _designed(the_design, CipherMode.CHACHA20, granted=[0])  # the in-memory reference, alice only
    with running(FakeServer(rel.release), _curators(rel)[:1]) as endpoints:
        report = process_release(endpoints, "r1", None, LOG, timeout=10, allow_partial=True)
    assert isinstance(report, TablesReport)
    live = [x.live for x in rel.release.spec.tables]
    assert [t is not None for t in report.tables] == [e is not None for e in alone.result.estimates]
    assert [t is not None for t in report.tables] == [1 not in lv for lv in live]
    assert set(report.missing) == {t for t, lv in enumerate(live) if 1 in lv} and report.missing
    assert all("bob" in why for why in report.missing.values())
    for table, estimate in zip(report.tables, alone.result.estimates, strict=True):
        if table is not None and estimate is not None:
            assert np.array_equal(table.observed, estimate.counts)
            assert np.array_equal(table.estimate, estimate.raw)


@contextlib.contextmanager
def _service(tracker: ReleaseTracker) -> Iterator[str]:
    server = make_grpc_server(max_workers=4, insecure=True)
    readers = frozenset({"researcher/researcher-1", "analyst/analyst-1"})
    pb_grpc.add_ResearcherServicer_to_server(ResearcherService(tracker, LOG, 5.0, readers), server)
    port = bind(server, "127.0.0.1", 0, None, "researcher", insecure=True)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def _stub(address: str, role: str) -> pb_grpc.ResearcherStub:
    return pb_grpc.ResearcherStub(secure_channel(address, None, f"{role}-1", insecure=True, role=role))


def test_get_estimate_serves_the_tables_report_and_lists_it(the_design: Design, tmp_path: Path) -> None:
    rel = _designed(the_design, CipherMode.OTP)
    fake = FakeServer(rel.release)
    with running(fake, _curators(rel)) as endpoints:

        def process(release_id: str, digest: bytes) -> AnyReport:
            return process_release(endpoints, release_id, tmp_path, LOG, 10.0, digest)

        with _service(ReleaseTracker(process, LOG, {})) as address:
            ack = _stub(address, "server").NotifyReady(
                pb.ReadyNotice(release_id="r1", perturbed_digest=fake.digest()), timeout=5
            )
            assert ack.accepted
            resp = _stub(address, "analyst").GetEstimate(pb.EstimateRequest(release_id="r1", wait=True), timeout=20)
            listed = _stub(address, "researcher").ListReleases(pb.ListReleasesRequest(), timeout=5)
    assert resp.release_id == "r1" and resp.tables_json and list(listed.release_ids) == ["r1"]
    served = tables_report_from_pb(resp)
    assert served is not None
    _assert_tables_match(served, rel)
    assert resp == tables_to_pb(served)
    # restarted: served from disk, the same bytes
    reloaded = load_reports(tmp_path, LOG)
    unused = ReleaseTracker(lambda rid, digest: pytest.fail("nothing should be processed"), LOG, reloaded)
    with _service(unused) as address:
        again = _stub(address, "analyst").GetEstimate(pb.EstimateRequest(release_id="r1"), timeout=5)
    assert again == resp


def test_a_classic_estimate_response_has_no_tables() -> None:
    from researcher_fakes import make_release

    from secure_release.infra.wire import report_to_pb

    classic = make_release(CipherMode.CHACHA20)
    with running(FakeServer(classic), [FakeCurator(classic, 0), FakeCurator(classic, 1)]) as endpoints:
        report = process_release(endpoints, "r1", None, LOG, timeout=5)
    assert isinstance(report, ReleaseReport)
    resp = report_to_pb(report)
    assert resp.tables_json == "" and tables_report_from_pb(resp) is None
    assert report_from_pb(resp).release_id == "r1"


def test_fetch_prints_a_block_per_table_or_the_json(
    the_design: Design, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rel = _designed(the_design, CipherMode.CHACHA20)
    with running(FakeServer(rel.release), _curators(rel)) as endpoints:
        curators = [f"--curator={n}={a}" for n, a in endpoints.curators.items()]
        base = ["fetch", "--insecure", "--name=researcher", f"--server={endpoints.server}", *curators,
                "--release-id=r1", "--timeout=10"]  # fmt: skip
        assert main([*base, f"--out={tmp_path / 'a'}"]) == 0
        text = capsys.readouterr().out
        assert main([*base, f"--out={tmp_path / 'b'}", "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
    assert printed["format"] == TABLES_FORMAT and printed["design_digest"] == the_design.digest()
    for t, table in enumerate(the_design.release.tables, start=1):
        assert f"table {t}" in text and " x ".join(table.attributes) in text
    assert "Eq. T1" in text and not text.lstrip().startswith("{")
