"""PKI files, URI SANs, foreign-CA rejection and peer-role pinning over real mutual TLS (the role
x RPC matrix walks the access table in test_access_table.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from support import PARTIES

from secure_release.infra import tls as security
from secure_release.infra.pki import init_pki
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc


def test_pki_files_modes_and_uri_san(certs: Path) -> None:
    """One directory per party (its key 0600, its certificate, ca.pem), the CA apart."""
    assert stat.S_IMODE((certs / "ca" / "ca.key").stat().st_mode) == 0o600
    ca_pem = (certs / "ca" / "ca.pem").read_bytes()
    for role, name in PARTIES:
        party = certs / name
        assert stat.S_IMODE((party / f"{name}.key").stat().st_mode) == 0o600
        assert (party / "ca.pem").read_bytes() == ca_pem
        assert not (party / "ca.key").exists() and [p.name for p in party.glob("*.key")] == [f"{name}.key"]
        cert = x509.load_pem_x509_certificate((party / f"{name}.pem").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"secure-release://{role}/{name}" in san.get_values_for_type(x509.UniformResourceIdentifier)
        assert "localhost" in san.get_values_for_type(x509.DNSName)
        assert security.identity_of_file(party, name) == security.Identity(role, name)
        assert not list(party.glob(".*"))  # no temporary files left behind


def test_pki_refuses_unknown_role_and_existing_ca(tmp_path: Path, certs: Path) -> None:
    with pytest.raises(security.PkiError, match="unknown role"):
        init_pki(tmp_path / "x", [("admin", "eve")])
    with pytest.raises(security.PkiError, match="exists"):
        init_pki(certs, [("curator", "dave")])
    assert not (certs / "dave").exists()


def test_foreign_ca_rejected_by_handshake(tmp_path: Path, server_port: int) -> None:
    init_pki(tmp_path, [("researcher", "researcher")])  # same name and role, other CA
    with (
        security.secure_channel(
            f"127.0.0.1:{server_port}", tmp_path / "researcher", "researcher", peer_role="server"
        ) as ch,
        pytest.raises(grpc.RpcError) as err,
    ):
        pb_grpc.ReleaseServerStub(ch).GetReleaseStatus(pb.ReleaseStatusRequest(release_id="r"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_tls_ignores_metadata_identity(certs: Path, server_port: int) -> None:
    """A curator on TLS cannot claim to be a researcher through the insecure-mode metadata."""
    with security.secure_channel(f"127.0.0.1:{server_port}", certs / "alice", "alice", peer_role="server") as ch:
        stream = pb_grpc.ReleaseServerStub(ch).FetchPerturbed(
            pb.FetchRequest(release_id="r"),
            timeout=5,
            metadata=[(security.IDENTITY_METADATA_KEY, "researcher/researcher")],
        )
        with pytest.raises(grpc.RpcError) as err:
            list(stream)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


class _Recorder(pb_grpc.ReleaseServerServicer):
    """A fake release server that records every message it is sent."""

    def __init__(self) -> None:
        self.received: list[object] = []

    def RegisterPart(self, request: pb.RegisterPartRequest, context: grpc.ServicerContext) -> pb.RegisterPartResponse:  # noqa: N802
        self.received.append(request)
        return pb.RegisterPartResponse()


@pytest.mark.parametrize("impostor", ["researcher", "alice", "analyst"])
def test_client_refuses_a_peer_of_another_role(certs: Path, impostor: str) -> None:
    """A process with a CA-signed certificate of another role, on the address a curator was
    given as --server, gets no byte of data: the handshake fails on the pinned role."""
    fake = _Recorder()
    server = security.make_grpc_server(max_workers=2)
    pb_grpc.add_ReleaseServerServicer_to_server(fake, server)
    port = security.bind(server, "127.0.0.1", 0, certs / impostor, impostor)
    server.start()
    try:
        ch = security.secure_channel(f"127.0.0.1:{port}", certs / "bob", "bob", peer_role="server")
        with ch, pytest.raises(grpc.RpcError) as err:
            pb_grpc.ReleaseServerStub(ch).RegisterPart(pb.RegisterPartRequest(curator="bob"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert fake.received == []
        # the same client reaches the same impostor when it expects that role: the pin is the cause
        role = security.identity_of_file(certs / impostor, impostor).role
        with security.secure_channel(f"127.0.0.1:{port}", certs / "bob", "bob", peer_role=role) as ch:
            pb_grpc.ReleaseServerStub(ch).RegisterPart(pb.RegisterPartRequest(curator="bob"), timeout=5)
        assert len(fake.received) == 1
    finally:
        server.stop(0).wait()


def test_client_pins_the_named_peer(certs: Path) -> None:
    """With a peer name, a curator expecting the leader alice refuses the curator carol."""
    fake = _Recorder()
    server = security.make_grpc_server(max_workers=2)
    pb_grpc.add_ReleaseServerServicer_to_server(fake, server)
    port = security.bind(server, "127.0.0.1", 0, certs / "carol", "carol")
    server.start()
    try:
        ch = security.secure_channel(f"127.0.0.1:{port}", certs / "bob", "bob", peer_role="curator", peer_name="alice")
        with ch, pytest.raises(grpc.RpcError) as err:
            pb_grpc.ReleaseServerStub(ch).RegisterPart(pb.RegisterPartRequest(curator="bob"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and fake.received == []
    finally:
        server.stop(0).wait()


def test_a_client_must_name_the_role_it_expects(certs: Path) -> None:
    with pytest.raises(security.PkiError, match="role it expects"):
        security.secure_channel("127.0.0.1:1", certs / "bob", "bob")
