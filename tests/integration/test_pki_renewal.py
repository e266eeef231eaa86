"""Renewal and revocation while the services run (in process, mutual TLS on 127.0.0.1 port 0).

A release server whose certificate is replaced mid-release presents the new one on the next
connection and the release completes; a revoked analyst and a revoked researcher are refused
(UNAUTHENTICATED, the serial in the log) by the researcher service, the server and every curator
within one reload; health reports the days left; a handshake the server refuses is said so."""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support import chunks_of, code_of, columns, make_params, register_all, served_serial, upload

from secure_release.curator.service import CuratorService
from secure_release.infra import health as health_cli
from secure_release.infra import identity, pki, tls
from secure_release.infra.certdir import RELOAD_ENV, load_party
from secure_release.infra.health import add_health_and_reflection, check_with_certificate
from secure_release.infra.logs import EventLog
from secure_release.mechanism.primitives.packing import CHUNK_ROWS
from secure_release.mechanism.primitives.pram import PramKey
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.service import ReleaseTracker, ResearcherService
from secure_release.server.service import ReleaseService
from secure_release.server.store import Store

RELOAD = 0.2
PARTIES = [("server", "server"), ("curator", "alice"), ("curator", "bob"), ("researcher", "researcher"),
           ("analyst", "analyst")]  # fmt: skip


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PKI of our own (its files change in these tests), reloaded every RELOAD seconds."""
    monkeypatch.setenv(RELOAD_ENV, str(RELOAD))
    pki.init_pki(tmp_path / "pki", PARTIES)
    return tmp_path / "pki"


def serve(root: Path, name: str, add: object, servicer: object, service: str) -> tuple[grpc.Server, int]:
    server = tls.make_grpc_server(max_workers=4)
    add(servicer, server)  # type: ignore[operator]
    add_health_and_reflection(server, [service])
    port = tls.bind(server, "127.0.0.1", 0, root / name, name)
    server.start()
    return server, port


def renew(root: Path, name: str, role: str, tmp: Path) -> int:
    """``pki request`` elsewhere, ``pki sign --replace``, then move key and certificate in."""
    staging = tmp / f"renew-{name}"
    csr = pki.write_request(staging, role, name, ["localhost", "127.0.0.1"])
    cert = pki.sign_request(root / "ca", csr.read_bytes(), replace=True)
    (staging / f"{name}.pem").write_bytes(pki.cert_pem(cert))
    os.replace(staging / f"{name}.key", root / name / f"{name}.key")
    os.replace(staging / f"{name}.pem", root / name / f"{name}.pem")
    return cert.serial_number


def test_a_server_renewed_mid_release_serves_the_new_certificate_and_the_release_completes(
    root: Path, tmp_path: Path
) -> None:
    store = Store(tmp_path / "store")
    key = PramKey(bytes(range(32)))
    server, port = serve(root, "server", pb_grpc.add_ReleaseServerServicer_to_server,
                         ReleaseService(store, lambda: key), "securerelease.v1.ReleaseServer")  # fmt: skip
    address = f"127.0.0.1:{port}"

    def stub(name: str) -> tuple[grpc.Channel, pb_grpc.ReleaseServerStub]:
        ch = tls.secure_channel(address, root / name, name, peer_role="server")
        return ch, pb_grpc.ReleaseServerStub(ch)

    try:
        old = load_party(root / "server", "server").serial
        assert served_serial(port, root / "analyst", "analyst") == old
        chans = {n: stub(n) for n in ("alice", "bob")}
        register_all({n: s for n, (_, s) in chans.items()}, make_params())
        cols = columns(CHUNK_ROWS + 1000)
        upload(chans["alice"][1], "alice", chunks_of(cols[0], 3))  # alice's part is in
        new = renew(root, "server", "server", tmp_path)
        time.sleep(RELOAD * 2)
        assert served_serial(port, root / "analyst", "analyst") == new != old  # same process, new certificate
        ch, bob = stub("bob")  # a new connection for the rest of the release
        with ch:
            done = upload(bob, "bob", chunks_of(cols[1], 4))
        assert done.status.state == pb.RELEASE_STATE_PERTURBED
        ch, researcher = stub("researcher")
        with ch:
            chunks = list(researcher.FetchPerturbed(pb.FetchRequest(release_id="r1"), timeout=30))
            _, days, serial = check_with_certificate(ch)
        assert chunks and chunks[-1].last
        assert serial == f"{new:x}" and days in (29, 30)
        for c, _ in chans.values():
            c.close()
    finally:
        server.stop(0).wait()
        store.close()


@pytest.fixture
def services(root: Path, tmp_path: Path) -> Iterator[dict[str, int]]:
    """The release server, curators alice and bob and the researcher service, each with its own
    directory of root."""
    store = Store(tmp_path / "store")
    log = EventLog("test", "revocation")
    tracker = ReleaseTracker(lambda rid, digest: pytest.fail("nothing is processed"), log, {})
    running, ports = [], {}
    specs = {
        "server": (pb_grpc.add_ReleaseServerServicer_to_server, ReleaseService(store), "ReleaseServer"),
        "researcher": (pb_grpc.add_ResearcherServicer_to_server, ResearcherService(tracker, log, 1.0), "Researcher"),
    }
    for c in ("alice", "bob"):
        schema = CuratorSchema(c, (Attribute("x", ("a", "b")),))
        specs[c] = (pb_grpc.add_CuratorServicer_to_server, CuratorService(c, schema, log), "Curator")
    for name, (add, servicer, short) in specs.items():
        server, ports[name] = serve(root, name, add, servicer, f"securerelease.v1.{short}")
        running.append(server)
    yield ports
    for server in running:
        server.stop(0).wait()
    store.close()


def test_revoked_analyst_and_researcher_are_refused_within_one_reload(
    root: Path, services: dict[str, int], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    laptop = tmp_path / "laptop"  # the researcher's client, on a lost laptop: its directory has no CRL
    shutil.copytree(root / "researcher", laptop)
    dirs = {"analyst": root / "analyst", "researcher": laptop}

    def channel(me: str, to: str, role: str) -> grpc.Channel:
        return tls.secure_channel(f"127.0.0.1:{services[to]}", dirs[me], me, peer_role=role, peer_name=to)

    def estimate() -> object:
        with channel("analyst", "researcher", "researcher") as ch:
            return pb_grpc.ResearcherStub(ch).GetEstimate(pb.EstimateRequest(release_id="r1"), timeout=5)

    def fetch() -> object:
        with channel("researcher", "server", "server") as ch:
            return list(pb_grpc.ReleaseServerStub(ch).FetchPerturbed(pb.FetchRequest(release_id="r1"), timeout=5))

    def key_from(curator: str) -> object:
        with channel("researcher", curator, "curator") as ch:
            return list(pb_grpc.CuratorStub(ch).ReleaseKey(pb.KeyRequest(release_id="r1"), timeout=5))

    calls = {"analyst -> researcher": estimate, "researcher -> server": fetch,
             "researcher -> alice": lambda: key_from("alice"),
             "researcher -> bob": lambda: key_from("bob")}  # fmt: skip
    before = {what: code_of(call) for what, call in calls.items()}  # past the access check, refused on merits
    assert grpc.StatusCode.UNAUTHENTICATED not in before.values(), before
    revoked = {pki.revoke(root / "ca", name=n)[0].serial_number for n in ("analyst", "researcher")}
    for name in ("server", "alice", "bob", "researcher"):
        shutil.copy(root / "ca" / "crl.pem", root / name / "crl.pem")
    time.sleep(RELOAD * 1.5)
    with caplog.at_level(logging.WARNING, logger="secure_release"):
        after = {what: code_of(call) for what, call in calls.items()}
    assert set(after.values()) == {grpc.StatusCode.UNAUTHENTICATED}, after
    logged = {r.serial for r in caplog.records if r.getMessage() == "revoked_certificate_refused"}  # type: ignore[attr-defined]
    assert logged == {f"{s:x}" for s in revoked}
    assert code_of(lambda: key_from("alice")) == grpc.StatusCode.UNAUTHENTICATED  # every call, not just the first


def test_a_revoked_client_is_stopped_by_its_own_crl_before_connecting(root: Path, services: dict[str, int]) -> None:
    pki.revoke(root / "ca", name="analyst")
    shutil.copy(root / "ca" / "crl.pem", root / "analyst" / "crl.pem")
    with pytest.raises(identity.PkiError, match=r"analyst\.pem \(serial [0-9a-f]+\) is revoked in .*crl\.pem"):
        tls.secure_channel(f"127.0.0.1:{services['researcher']}", root / "analyst", "analyst", peer_role="researcher")


def test_health_reports_days_left_and_warns_a_week_before(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=25)
    csr = pki.write_request(tmp_path / "short", "server", "server", ["localhost"])
    validity = (start, start + dt.timedelta(days=30))
    cert = pki.sign_request(root / "ca", csr.read_bytes(), replace=True, validity=validity)
    (root / "server" / "server.pem").write_bytes(pki.cert_pem(cert))
    os.replace(tmp_path / "short" / "server.key", root / "server" / "server.key")
    server, port = serve(root, "server", pb_grpc.add_ReleaseServerServicer_to_server,
                         ReleaseService(Store(tmp_path / "store")), "securerelease.v1.ReleaseServer")  # fmt: skip
    try:
        args = [f"127.0.0.1:{port}", "--certs", str(root / "analyst"), "--name", "analyst", "--peer-role", "server"]
        assert health_cli.main(args) == 0
        out, err = capsys.readouterr()
        assert f"SERVING; certificate serial {cert.serial_number:x}, 4 days left" in out
        assert "expires in 4 days" in err
    finally:
        server.stop(0).wait()


def test_a_handshake_the_server_refuses_is_said_so_with_its_address(
    root: Path, services: dict[str, int], tmp_path: Path
) -> None:
    """A client whose certificate comes from another CA (its ca.pem also trusts the project's, as
    in a half-done CA change) passes its own checks; the server closes the handshake."""
    pki.init_pki(tmp_path / "other", [("analyst", "analyst")])
    mine = tmp_path / "other" / "analyst"
    (mine / "ca.pem").write_bytes((mine / "ca.pem").read_bytes() + (root / "ca" / "ca.pem").read_bytes())
    address = f"127.0.0.1:{services['researcher']}"
    ch = tls.secure_channel(address, mine, "analyst", peer_role="researcher")
    with ch, pytest.raises(grpc.RpcError) as err:
        pb_grpc.ResearcherStub(ch).ListReleases(pb.ListReleasesRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert err.value.details().startswith(f"TLS handshake with {address} refused: the peer closed the connection")
