"""The PKI as separate organisations use it, through the real commands and services: every key
made in its own party's directory, only CSRs and certificates travel, a release runs with four
kinds of parties in their own directories; a service given the CA key, another party's key or a
key others may read exits 2 naming the file; an expired client certificate gets one line."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from secure_release.cluster import Cluster, get_estimate, launch_release
from secure_release.demo_data import write_demo_data
from secure_release.infra import pki
from secure_release.mechanism.primitives.keys import AlignmentKey

PARTIES = [("server", "server", "localhost,127.0.0.1"), ("curator", "alice", "localhost,127.0.0.1"),
           ("curator", "bob", "localhost,127.0.0.1"), ("researcher", "researcher", "localhost,127.0.0.1"),
           ("analyst", "analyst", "")]  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60)


def sr(*args: str) -> subprocess.CompletedProcess[str]:
    done = run("-m", "secure_release", *args)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def orgs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CA on its machine (root/ca), each party on its own (root/NAME), made with the CLI."""
    root = tmp_path_factory.mktemp("orgs")
    sr("pki", "ca", str(root / "ca"))
    for role, name, hosts in PARTIES:
        party = root / name
        sr("pki", "request", "--role", role, "--name", name, "--out", str(party),
           *(["--hosts", hosts] if hosts else []))
        # what travels to the CA: the CSR only
        inbox = root / "ca-inbox" / f"{name}.csr"
        inbox.parent.mkdir(exist_ok=True)
        shutil.copy(party / f"{name}.csr", inbox)
        signed = sr("pki", "sign", str(inbox), "--ca", str(root / "ca"), "--out", str(inbox.with_suffix(".pem")))
        assert f"certifying role {role} name {name}" in signed.stdout
        # what travels back: the certificate and ca.pem
        shutil.copy(root / "ca-inbox" / f"{name}.pem", party / f"{name}.pem")
        shutil.copy(root / "ca" / "ca.pem", party / "ca.pem")
    assert not list((root / "ca-inbox").glob("*.key"))
    keys = list(root.glob("*/*.key"))
    assert len(keys) == 6 and all(p.parent.name == p.stem for p in keys)  # every key in its owner's directory
    return root


def test_four_parties_in_four_directories_run_a_release(orgs: Path, tmp_path: Path) -> None:
    info = write_demo_data(tmp_path / "data", rows=4000, seed=3)
    (tmp_path / "align.key").write_text(AlignmentKey.generate().reveal().hex())
    cluster = Cluster(tmp_path)
    try:
        addrs = launch_release(cluster, tmp_path / "data", orgs, "r-csr", 1.0, 300, "chacha20",
                               tmp_path / "align.key")  # fmt: skip
        resp = get_estimate(addrs["researcher"], orgs, "r-csr", timeout=120)
    finally:
        cluster.close()
    assert resp.privacy.m == 300 and resp.privacy.n == info["n"] and len(resp.cells) == 24


def test_revoked_researcher_and_analyst_are_refused_by_the_running_services(orgs: Path, tmp_path: Path) -> None:
    """After a release: the researcher (its laptop's directory has no CRL) gets a key from alice;
    the CA revokes it and the analyst, crl.pem is copied into every service's directory, and
    within one reload the same calls are refused (UNAUTHENTICATED), with the serial in the logs:
    no key from any curator, no rows from the server, no estimate from the researcher service."""
    import grpc

    from secure_release.infra import tls
    from secure_release.infra.certdir import RELOAD_ENV
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
    from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

    root = tmp_path / "orgs"
    shutil.copytree(orgs, root)
    laptop, ann = tmp_path / "laptop", tmp_path / "ann"
    shutil.copytree(root / "researcher", laptop)
    shutil.copytree(root / "analyst", ann)
    write_demo_data(tmp_path / "data", rows=3000, seed=5)
    (tmp_path / "align.key").write_text(AlignmentKey.generate().reveal().hex())
    cluster = Cluster(tmp_path, env={**os.environ, RELOAD_ENV: "0.2"})
    try:
        serve = ["--serve-until-stopped"]  # the curators keep serving keys after the researcher acknowledged
        addrs = launch_release(cluster, tmp_path / "data", root, "r-rev", 1.0, 200, "chacha20", tmp_path / "align.key",
                               alice_extra=serve, bob_extra=serve)  # fmt: skip
        get_estimate(addrs["researcher"], root, "r-rev", timeout=120)

        def call(what: str) -> grpc.StatusCode:
            try:
                if what in ("alice", "bob"):
                    ch = tls.secure_channel(addrs[what], laptop, "researcher", peer_role="curator", peer_name=what)
                    with ch:
                        list(pb_grpc.CuratorStub(ch).ReleaseKey(pb.KeyRequest(release_id="r-rev"), timeout=10))
                elif what == "server":
                    with tls.secure_channel(addrs["server"], laptop, "researcher", peer_role="server") as ch:
                        request = pb.FetchRequest(release_id="r-rev")
                        list(pb_grpc.ReleaseServerStub(ch).FetchPerturbed(request, timeout=10))
                else:
                    with tls.secure_channel(addrs["researcher"], ann, "analyst", peer_role="researcher") as ch:
                        pb_grpc.ResearcherStub(ch).GetEstimate(pb.EstimateRequest(release_id="r-rev"), timeout=10)
            except grpc.RpcError as exc:
                return exc.code()  # type: ignore[no-any-return]
            return grpc.StatusCode.OK

        parties = ("alice", "bob", "server", "researcher")
        assert {p: call(p) for p in parties} == dict.fromkeys(parties, grpc.StatusCode.OK)
        out = sr("pki", "revoke", "--ca", str(root / "ca"), "--name", "researcher").stdout
        out += sr("pki", "revoke", "--ca", str(root / "ca"), "--name", "analyst").stdout
        serials = set(re.findall(r"revoked serial ([0-9a-f]+)", out))
        for name in parties:
            shutil.copy(root / "ca" / "crl.pem", root / name / "crl.pem")
        time.sleep(0.8)
        assert {p: call(p) for p in parties} == dict.fromkeys(parties, grpc.StatusCode.UNAUTHENTICATED)
    finally:
        cluster.close()
    logged = "".join((tmp_path / f"{p}.log").read_text() for p in parties)
    assert len(serials) == 2 and all(s in logged for s in serials) and "revoked_certificate_refused" in logged


@pytest.mark.parametrize(
    ("intruder", "expected"),
    [("ca.key", ": the CA's private key must not be"), ("bob.key", " holds a private key that is not")],
)
def test_a_service_holding_secrets_not_its_own_exits_2(
    orgs: Path, tmp_path: Path, intruder: str, expected: str
) -> None:
    write_demo_data(tmp_path / "data", rows=200, seed=1)
    (tmp_path / "align.key").write_text(AlignmentKey.generate().reveal().hex())
    (tmp_path / "align.key").chmod(0o600)
    data = tmp_path / "data"
    for name, command in (
        ("server", ["-m", "secure_release.server", "--listen", "127.0.0.1:0", "--store", str(tmp_path / "s")]),
        ("alice", ["-m", "secure_release.curator", "run", "--data", str(data / "alice.csv"), "--schema",
                   str(data / "alice.json"), "--release-id", "r1", "--epsilon", "0.5", "--server", "127.0.0.1:1",
                   "--curators", "alice,bob", "--leader", "--listen", "127.0.0.1:0", "--alignment-key-file",
                   str(tmp_path / "align.key"), "--keystore", str(tmp_path / "ks")]),
        ("researcher", ["-m", "secure_release.researcher", "serve", "--listen", "127.0.0.1:0",
                        "--server", "127.0.0.1:1", "--curator", "alice=127.0.0.1:1", "--out", str(tmp_path / "out")]),
    ):  # fmt: skip
        d = tmp_path / name
        shutil.copytree(orgs / name, d)
        shutil.copy(orgs / ("ca" if intruder == "ca.key" else "bob") / intruder, d / intruder)  # bob's: a curator's
        done = run(*command, "--certs", str(d), "--name", name)
        assert done.returncode == 2, (name, done.stderr)
        assert f"{d / intruder}{expected}" in done.stderr, done.stderr


def test_a_service_whose_key_others_may_read_exits_2(orgs: Path, tmp_path: Path) -> None:
    d = tmp_path / "server"
    shutil.copytree(orgs / "server", d)
    os.chmod(d / "server.key", 0o644)
    done = run("-m", "secure_release.server", "--listen", "127.0.0.1:0", "--store", str(tmp_path / "s"),
               "--certs", str(d), "--name", "server")  # fmt: skip
    assert done.returncode == 2
    assert f"{d / 'server.key'} has mode 0644: others than its owner may read it; run: chmod 600" in done.stderr


def test_an_expired_client_certificate_gets_one_line(orgs: Path, tmp_path: Path) -> None:
    """Signed in the past (explicit validity, no sleeping): the researcher and the analyst
    clients stop before connecting, with the file and the date, in one line."""
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=40)
    for role, name in (("researcher", "researcher"), ("analyst", "analyst")):
        d = tmp_path / name
        csr = pki.write_request(d, role, name)
        validity = (past, past + dt.timedelta(days=30))
        cert = pki.sign_request(orgs / "ca", csr.read_bytes(), replace=True, validity=validity)
        (d / f"{name}.pem").write_bytes(pki.cert_pem(cert))
        shutil.copy(orgs / "ca" / "ca.pem", d / "ca.pem")
    expired_on = f"{past + dt.timedelta(days=30):%Y-%m-%d}"
    fetch = run("-m", "secure_release.researcher", "fetch", "--release-id", "r1",
                "--certs", str(tmp_path / "researcher"), "--name", "researcher", "--server", "127.0.0.1:1",
                "--curator", "alice=127.0.0.1:1", "--out", str(tmp_path / "out"), "--timeout", "5")  # fmt: skip
    show = run("-m", "secure_release", "analyst", "list", "--researcher", "127.0.0.1:1",
               "--certs", str(tmp_path / "analyst"), "--name", "analyst")  # fmt: skip
    for done, name in ((fetch, "researcher"), (show, "analyst")):
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"{tmp_path / name / (name + '.pem')} expired on {expired_on}" in lines[0]


def test_a_server_process_renewed_mid_release_keeps_its_releases(orgs: Path, tmp_path: Path) -> None:
    """The real server process: alice uploads, the server's key and certificate are replaced,
    the next connection gets the new certificate from the same process, bob's upload completes
    the release and the researcher fetches it."""
    from support import chunks_of, columns, make_params, register_all, served_serial, upload

    from secure_release.infra import tls
    from secure_release.infra.certdir import RELOAD_ENV, load_party
    from secure_release.mechanism.primitives.packing import CHUNK_ROWS
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
    from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

    live = tmp_path / "server"
    shutil.copytree(orgs / "server", live)
    env = {**os.environ, RELOAD_ENV: "0.2"}
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "secure_release.server", "--listen", "127.0.0.1:0", "--store", str(tmp_path / "s"),
         "--certs", str(live), "--name", "server", "--port-file", str(port_file), "--grace", "0.5"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _ in range(200):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.05)
        port = int(port_file.read_text())
        address = f"127.0.0.1:{port}"

        def stub(name: str) -> tuple[Any, pb_grpc.ReleaseServerStub]:
            ch = tls.secure_channel(address, orgs / name, name, peer_role="server")
            return ch, pb_grpc.ReleaseServerStub(ch)

        old = load_party(live, "server").serial
        assert served_serial(port, orgs / "analyst", "analyst") == old
        first = {n: stub(n) for n in ("alice", "bob")}
        register_all({n: s for n, (_, s) in first.items()}, make_params())
        cols = columns(CHUNK_ROWS + 1000)
        upload(first["alice"][1], "alice", chunks_of(cols[0], 3))
        staging = tmp_path / "renew"
        csr = pki.write_request(staging, "server", "server", ["localhost", "127.0.0.1"])
        cert = pki.sign_request(orgs / "ca", csr.read_bytes(), replace=True)
        (staging / "server.pem").write_bytes(pki.cert_pem(cert))
        os.replace(staging / "server.key", live / "server.key")
        os.replace(staging / "server.pem", live / "server.pem")
        time.sleep(0.6)
        assert served_serial(port, orgs / "analyst", "analyst") == cert.serial_number != old
        ch, bob = stub("bob")
        with ch:
            assert upload(bob, "bob", chunks_of(cols[1], 4)).status.state == pb.RELEASE_STATE_PERTURBED
        ch, researcher = stub("researcher")
        with ch:
            fetched = list(researcher.FetchPerturbed(pb.FetchRequest(release_id="r1"), timeout=30))
        assert fetched and fetched[-1].last and proc.poll() is None  # same process throughout
        for c, _ in first.values():
            c.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "certificates_reloaded" in err and f"{cert.serial_number:x}" in err
