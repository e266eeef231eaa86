"""Rogue certificates against a live release server: every one is refused before any servicer
code runs (foreign CA, expired, no role, two roles, a wrong role, a role the CA never issues)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from secure_release.infra import tls
from secure_release.infra.pki import Authority, host_names, identity_names, issue, write_party
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc


def project_ca(certs: Path) -> Authority:
    key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), None)
    cert = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    return Authority(key, cert)  # type: ignore[arg-type]


def rogue_dir(certs: Path, tmp_path: Path, sans: list[x509.GeneralName], validity: object = None) -> Path:
    """A certs directory holding the project CA certificate and a rogue party 'rogue'."""
    directory = tmp_path / "rogue"
    directory.mkdir()
    (directory / "ca.pem").write_bytes((certs / "ca.pem").read_bytes())
    key, cert = issue(project_ca(certs), "rogue", sans, validity=validity)  # type: ignore[arg-type]
    write_party(directory, "rogue", key, cert)
    return directory


def fetch_code(port: int, directory: Path) -> grpc.StatusCode:
    ch = tls.secure_channel(f"127.0.0.1:{port}", directory, "rogue", peer_role="server")
    with ch, pytest.raises(grpc.RpcError) as err:
        list(pb_grpc.ReleaseServerStub(ch).FetchPerturbed(pb.FetchRequest(release_id="r"), timeout=5))
    return err.value.code()  # type: ignore[no-any-return]


HOSTS = host_names(["localhost", "127.0.0.1"])


def test_expired_certificate_fails_the_handshake(certs: Path, tmp_path: Path, server_port: int) -> None:
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    d = rogue_dir(
        certs, tmp_path, [*HOSTS, *identity_names("researcher", "rogue")], (past, past + dt.timedelta(days=1))
    )
    assert fetch_code(server_port, d) == grpc.StatusCode.UNAVAILABLE


def test_certificate_without_a_role_is_unauthenticated(certs: Path, tmp_path: Path, server_port: int) -> None:
    d = rogue_dir(certs, tmp_path, HOSTS)
    assert fetch_code(server_port, d) == grpc.StatusCode.UNAUTHENTICATED


def test_certificate_with_two_roles_is_unauthenticated(certs: Path, tmp_path: Path, server_port: int) -> None:
    sans = [
        *HOSTS,
        *identity_names("researcher", "rogue"),
        x509.UniformResourceIdentifier("secure-release://curator/rogue"),
    ]
    d = rogue_dir(certs, tmp_path, sans)
    assert fetch_code(server_port, d) == grpc.StatusCode.UNAUTHENTICATED


def test_unknown_role_is_unauthenticated(certs: Path, tmp_path: Path, server_port: int) -> None:
    sans = [*HOSTS, x509.UniformResourceIdentifier("secure-release://admin/rogue")]
    d = rogue_dir(certs, tmp_path, sans)
    assert fetch_code(server_port, d) == grpc.StatusCode.UNAUTHENTICATED


def test_wrong_role_is_denied_by_the_table(certs: Path, tmp_path: Path, server_port: int) -> None:
    d = rogue_dir(certs, tmp_path, [*HOSTS, *identity_names("curator", "rogue")])
    assert fetch_code(server_port, d) == grpc.StatusCode.PERMISSION_DENIED


def test_a_valid_researcher_passes_the_table(certs: Path, tmp_path: Path, server_port: int) -> None:
    """Control: the same construction with the right role gets past authentication (the missing
    release is then NOT_FOUND), so the refusals above come from the certificates."""
    d = rogue_dir(certs, tmp_path, [*HOSTS, *identity_names("researcher", "rogue")])
    assert fetch_code(server_port, d) == grpc.StatusCode.NOT_FOUND
