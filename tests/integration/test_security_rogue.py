"""Rogue certificates against a live release server: every one is refused before any servicer
code runs (foreign CA, expired, no role, two roles, a wrong role, a role the CA never issues)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from secure_release.infra import identity, tls
from secure_release.infra.pki import Authority, host_names, identity_names, issue, load_authority, write_party
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc


def project_ca(certs: Path) -> Authority:
    return load_authority(certs / "ca")


def rogue_dir(certs: Path, tmp_path: Path, sans: list[x509.GeneralName], validity: object = None) -> Path:
    """A party directory holding the project CA certificate and a rogue party 'rogue'."""
    directory = tmp_path / "rogue"
    directory.mkdir()
    (directory / "ca.pem").write_bytes((certs / "ca" / "ca.pem").read_bytes())
    key, cert = issue(project_ca(certs), "rogue", sans, validity=validity)  # type: ignore[arg-type]
    write_party(directory, "rogue", key, cert)
    return directory


def raw_channel(port: int, directory: Path) -> grpc.Channel:
    """A channel that presents rogue's files as they are, skipping the client's own checks (a
    rogue client would not run them): what the server does with the certificate is under test."""
    creds = grpc.ssl_channel_credentials(
        (directory / "ca.pem").read_bytes(), (directory / "rogue.key").read_bytes(),
        (directory / "rogue.pem").read_bytes(),
    )  # fmt: skip
    options = [("grpc.ssl_target_name_override", identity.peer_dns_name("server"))]
    return grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options)


def fetch_code(port: int, directory: Path) -> grpc.StatusCode:
    ch = raw_channel(port, directory)
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
    # our own client says why before it connects, with the file and the date
    with pytest.raises(identity.PkiError, match=r"rogue\.pem expired on \d{4}-\d\d-\d\d"):
        tls.secure_channel(f"127.0.0.1:{server_port}", d, "rogue", peer_role="server")


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
