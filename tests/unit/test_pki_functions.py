"""The PKI's functions on files: CA, CSR, signing and its refusals, revocation, what a party's
directory may hold, the checks of a party's own certificate, and the watcher's reloads."""

from __future__ import annotations

import datetime as dt
import logging
import re
import shutil
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from secure_release.cli import main as cli_main
from secure_release.infra import pki
from secure_release.infra.certdir import CertWatcher, check_directory, load_party
from secure_release.infra.identity import PkiError, identity_of_certificate

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    pki.create_ca(tmp_path / "ca")
    return tmp_path / "ca"


def party(tmp_path: Path, ca: Path, role: str, name: str, validity: tuple[dt.datetime, dt.datetime] | None = None,
          where: str | None = None) -> Path:  # fmt: skip
    """``pki request`` into tmp_path/<where or name>, ``pki sign``, ca.pem copied: a party's
    directory (``where`` set: a renewal, signed with ``--replace``)."""
    d = tmp_path / (where or name)
    csr = pki.write_request(d, role, name, ["localhost", "127.0.0.1"])
    cert = pki.sign_request(ca, csr.read_bytes(), validity=validity, replace=where is not None)
    (d / f"{name}.pem").write_bytes(pki.cert_pem(cert))
    shutil.copy(ca / "ca.pem", d / "ca.pem")
    return d


def csr_with(sans: list[x509.GeneralName], key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "server")]))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def test_ca_request_sign_make_the_identity_and_keep_the_key_home(tmp_path: Path, ca: Path) -> None:
    assert stat.S_IMODE((ca / "ca.key").stat().st_mode) == 0o600
    d = party(tmp_path, ca, "curator", "alice")
    assert stat.S_IMODE((d / "alice.key").stat().st_mode) == 0o600
    assert sorted(p.name for p in d.iterdir()) == ["alice.csr", "alice.key", "alice.pem", "ca.pem"]
    b"PRIVATE KEY" not in (d / "alice.csr").read_bytes() or pytest.fail("a CSR must carry no key")
    cert = x509.load_pem_x509_certificate((d / "alice.pem").read_bytes())
    assert identity_of_certificate((d / "alice.pem").read_bytes()).role == "curator"  # type: ignore[union-attr]
    dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert set(dns) == {"localhost", "curator.secure-release.invalid", "alice.curator.secure-release.invalid"}
    assert cert.subject.rfc4514_string() == "OU=curator,CN=alice"  # built by the CA, not copied
    assert [c.serial_number for c in pki.issued_certificates(ca)] == [cert.serial_number]
    files = load_party(d, "alice")
    assert files.days_left() in (29, 30)
    with pytest.raises(PkiError, match="exists; to renew"):
        pki.write_request(d, "curator", "alice")
    with pytest.raises(PkiError, match="exists; pass --force"):
        pki.create_ca(ca)


def test_sign_refuses_what_it_must(tmp_path: Path, ca: Path) -> None:
    ident = pki.identity_names
    with pytest.raises(PkiError, match="role 'admin'"):
        pki.sign_request(ca, csr_with([x509.UniformResourceIdentifier("secure-release://admin/eve")]))
    with pytest.raises(PkiError, match="must match"):
        pki.sign_request(ca, csr_with([x509.UniformResourceIdentifier("secure-release://curator/Bad_Name")]))
    with pytest.raises(PkiError, match="exactly one identity"):
        pki.sign_request(ca, csr_with([*ident("curator", "eve")[:2]]))
    with pytest.raises(PkiError, match="another identity's name"):
        pki.sign_request(ca, csr_with([*ident("curator", "eve"), x509.DNSName("server.secure-release.invalid")]))
    with pytest.raises(PkiError, match="not a PEM certificate signing request"):
        pki.sign_request(ca, b"hello")
    # a CSR altered after it was signed: the signature no longer verifies
    good = csr_with(ident("curator", "eve"))
    der = bytearray(x509.load_pem_x509_csr(good).public_bytes(serialization.Encoding.DER))
    at = der.find(b"eve")
    der[at : at + 3] = b"eva"
    tampered = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(PkiError, match="signature does not verify"):
        pki.sign_request(ca, tampered)
    assert pki.issued_certificates(ca) == []
    with pytest.raises(PkiError, match="--days"):
        pki.sign_request(ca, good, days=0)


def test_a_name_certified_under_another_key_needs_replace(tmp_path: Path, ca: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    first = pki.sign_request(ca, csr_with(pki.identity_names("researcher", "rita"), key))
    again = pki.sign_request(ca, csr_with(pki.identity_names("researcher", "rita"), key))  # same key: a renewal
    other = csr_with(pki.identity_names("researcher", "rita"))
    with pytest.raises(pki.NameTakenError, match="already certified as researcher/rita under another key"):
        pki.sign_request(ca, other)
    with pytest.raises(pki.NameTakenError, match=r"same key .* asks for curator/rita"):  # another role
        pki.sign_request(ca, csr_with(pki.identity_names("curator", "rita"), key))
    replaced = pki.sign_request(ca, other, replace=True)
    assert len({first.serial_number, again.serial_number, replaced.serial_number}) == 3
    pki.revoke(ca, name="rita")
    pki.sign_request(ca, csr_with(pki.identity_names("researcher", "rita")))  # revoked: the name is free


def test_revoke_writes_a_signed_crl_that_grows(tmp_path: Path, ca: Path) -> None:
    a = party(tmp_path, ca, "analyst", "ann")
    r = party(tmp_path, ca, "researcher", "rita")
    serial_a = load_party(a, "ann").serial
    assert [c.serial_number for c in pki.revoke(ca, serial=serial_a)] == [serial_a]
    assert pki.revoke(ca, serial=serial_a) == []  # idempotent
    pki.revoke(ca, name="rita")
    crl = x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())
    authority = pki.load_authority(ca)
    assert crl.is_signature_valid(authority.key.public_key())
    assert {e.serial_number for e in crl} == {serial_a, load_party(r, "rita", strict=False).serial}
    assert crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number == 3
    with pytest.raises(pki.NotIssuedError, match="no certificate with name 'nobody'"):
        pki.revoke(ca, name="nobody")
    with pytest.raises(PkiError, match="exactly one"):
        pki.revoke(ca)
    assert pki.parse_serial(f"0x{serial_a:x}") == serial_a
    with pytest.raises(PkiError, match="hexadecimal"):
        pki.parse_serial("zz")


def test_init_writes_one_directory_per_party_and_the_ca_apart(tmp_path: Path) -> None:
    pki.init_pki(tmp_path / "p", [("server", "server"), ("curator", "alice")])
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["alice", "ca", "server"]
    assert sorted(p.name for p in (tmp_path / "p" / "ca").iterdir()) == ["ca.key", "ca.pem", "issued"]
    for name in ("server", "alice"):
        check_directory(tmp_path / "p" / name, name)
        load_party(tmp_path / "p" / name, name)
    assert len(pki.issued_certificates(tmp_path / "p" / "ca")) == 2


def test_a_party_directory_holds_only_its_own_secrets(tmp_path: Path, ca: Path) -> None:
    d = party(tmp_path, ca, "server", "server")
    check_directory(d, "server")
    shutil.copy(ca / "ca.key", d / "ca.key")
    with pytest.raises(PkiError, match=r"ca\.key: the CA's private key must not be"):
        check_directory(d, "server")
    (d / "ca.key").unlink()
    other = party(tmp_path, ca, "curator", "bob")
    shutil.copy(other / "bob.key", d / "bob.key")
    with pytest.raises(PkiError, match=r"bob\.key holds a private key that is not server's"):
        check_directory(d, "server")
    (d / "bob.key").rename(d / "notes.txt")  # renamed: still found by its content
    with pytest.raises(PkiError, match=r"notes\.txt holds a private key"):
        check_directory(d, "server")
    (d / "notes.txt").unlink()
    (d / "server.key").chmod(0o640)
    with pytest.raises(PkiError, match=r"server\.key has mode 0640: others than its owner may read it"):
        load_party(d, "server")


def test_the_own_certificate_is_checked_with_file_and_date(tmp_path: Path, ca: Path) -> None:
    past = NOW - dt.timedelta(days=40)
    d = party(tmp_path, ca, "analyst", "ann", (past, past + dt.timedelta(days=30)))
    with pytest.raises(PkiError, match=rf"ann\.pem expired on {(past + dt.timedelta(days=30)):%Y-%m-%d}"):
        load_party(d, "ann")
    later = NOW + dt.timedelta(days=3)
    d = party(tmp_path, ca, "analyst", "ann2", (later, later + dt.timedelta(days=30)))
    with pytest.raises(PkiError, match=rf"ann2\.pem is not valid until {later:%Y-%m-%d}"):
        load_party(d, "ann2")
    d = party(tmp_path, ca, "analyst", "ann3")
    pki.create_ca(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "ca.pem", d / "ca.pem")
    with pytest.raises(PkiError, match=r"ann3\.pem is not signed by .*ca\.pem"):
        load_party(d, "ann3")
    d = party(tmp_path, ca, "analyst", "ann4")
    pki.revoke(ca, name="ann4")
    shutil.copy(ca / "crl.pem", d / "crl.pem")
    with pytest.raises(PkiError, match=r"ann4\.pem \(serial [0-9a-f]+\) is revoked in .*crl\.pem"):
        load_party(d, "ann4")
    assert load_party(d, "ann4", strict=False).serial in load_party(d, "ann4", strict=False).revoked
    d2 = party(tmp_path, ca, "analyst", "ann5")
    (d2 / "ann5.key").write_bytes((d / "ann4.key").read_bytes())
    with pytest.raises(PkiError, match=r"ann5\.key is not the key of .*ann5\.pem"):
        load_party(d2, "ann5")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_watcher_reloads_on_change_and_keeps_what_works(
    tmp_path: Path, ca: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = party(tmp_path, ca, "server", "server")
    clock = Clock()
    w = CertWatcher(d, "server", reload_every=1.0, clock=clock)
    w.credentials()
    first = w.files.serial
    assert w.fetch() is None  # unchanged
    # a renewal: request elsewhere, sign, move key and certificate in
    new = party(tmp_path, ca, "server", "server", where="renew")
    shutil.copy(new / "server.key", d / "server.key")
    clock.t += 0.5
    assert w.fetch() is None and w.files.serial == first  # not looked at before the interval
    clock.t += 1.0
    with caplog.at_level(logging.ERROR, logger="secure_release"):
        assert w.fetch() is None and w.files.serial == first  # key moved in before its certificate
    assert "certificate_reload_failed" in caplog.text
    shutil.copy(new / "server.pem", d / "server.pem")
    clock.t += 1.0
    assert w.fetch() is not None and w.files.serial == load_party(new, "server").serial != first
    assert w.fetch() is None
    # a CRL arrives: the peer check sees it after one interval
    peer = party(tmp_path, ca, "researcher", "rita")
    pem = (peer / "rita.pem").read_bytes()
    assert w.revoked_serial(pem) is None
    pki.revoke(ca, name="rita")
    shutil.copy(ca / "crl.pem", d / "crl.pem")
    assert w.revoked_serial(pem) is None
    clock.t += 1.0
    assert w.revoked_serial(pem) == load_party(peer, "rita", strict=False).serial


def test_the_watcher_warns_from_seven_days_before_expiry(
    tmp_path: Path, ca: Path, caplog: pytest.LogCaptureFixture
) -> None:
    start = NOW - dt.timedelta(days=25)
    d = party(tmp_path, ca, "server", "server", (start, start + dt.timedelta(days=30, hours=1)))
    with caplog.at_level(logging.WARNING, logger="secure_release"):
        w = CertWatcher(d, "server", reload_every=1.0, clock=Clock())
    assert w.files.days_left() == 5
    record = next(r for r in caplog.records if r.getMessage() == "certificate_expires_soon")
    assert record.days_left == 5 and str(d / "server.pem") == record.file  # type: ignore[attr-defined]
    caplog.clear()
    d2 = party(tmp_path, ca, "server", "server", (NOW - dt.timedelta(days=22), NOW + dt.timedelta(days=8)),
               where="fresh")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="secure_release"):
        CertWatcher(d2, "server", reload_every=1.0, clock=Clock())
    assert "certificate_expires_soon" not in caplog.text


def test_pki_commands_print_what_they_certify_and_refuse_with_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca_dir, out = tmp_path / "ca", tmp_path / "alice"
    assert cli_main(["pki", "ca", str(ca_dir)]) == 0
    assert cli_main(["pki", "request", "--role", "curator", "--name", "alice", "--out", str(out)]) == 0
    told = re.search(r"key fingerprint (\S+)", capsys.readouterr().out)
    assert cli_main(["pki", "sign", str(out / "alice.csr"), "--ca", str(ca_dir), "--out", str(out / "alice.pem")]) == 0
    printed = capsys.readouterr().out
    assert "certifying role curator name alice" in printed and "serial" in printed
    assert told is not None and f"key fingerprint {told.group(1)}" in printed
    other = tmp_path / "alice2"
    assert cli_main(["pki", "request", "--role", "curator", "--name", "alice", "--out", str(other)]) == 0
    sign = ["pki", "sign", str(other / "alice.csr"), "--ca", str(ca_dir), "--out", str(other / "alice.pem")]
    assert cli_main(sign) == 3 and "NameTakenError" in capsys.readouterr().err
    assert not (other / "alice.pem").exists()
    assert cli_main([*sign, "--replace"]) == 0
    assert cli_main(["pki", "sign", str(tmp_path / "nope.csr"), "--ca", str(ca_dir), "--out", "x.pem"]) == 2
    assert cli_main(["pki", "revoke", "--ca", str(ca_dir), "--name", "alice"]) == 0
    assert "revoked serial" in capsys.readouterr().out and (ca_dir / "crl.pem").exists()
    assert cli_main(["pki", "revoke", "--ca", str(ca_dir), "--name", "zed"]) == 2
    with pytest.raises(SystemExit) as exit_:
        cli_main(["pki", "request", "--role", "admin", "--name", "eve", "--out", str(tmp_path / "e")])
    assert exit_.value.code == 2


def test_pki_crl_re_signs_and_an_out_of_date_crl_is_logged(
    tmp_path: Path, ca: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = party(tmp_path, ca, "server", "server")
    gone = party(tmp_path, ca, "analyst", "ann")
    pki.revoke(ca, name="ann")
    long_ago = NOW - dt.timedelta(days=60)
    old = pki.refresh_crl(ca, now=long_ago)  # last signed 60 days ago: out of date 30 days ago
    assert {e.serial_number for e in old} == {load_party(gone, "ann", strict=False).serial}
    shutil.copy(ca / "crl.pem", d / "crl.pem")
    with caplog.at_level(logging.WARNING, logger="secure_release"):
        CertWatcher(d, "server", reload_every=1.0, clock=Clock())
    assert "crl_out_of_date" in caplog.text
    assert cli_main(["pki", "crl", "--ca", str(ca)]) == 0
    fresh = x509.load_pem_x509_crl((ca / "crl.pem").read_bytes())
    assert fresh.next_update_utc > NOW and len(fresh) == 1
    assert fresh.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number == 3
    shutil.copy(ca / "crl.pem", d / "crl.pem")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="secure_release"):
        CertWatcher(d, "server", reload_every=1.0, clock=Clock())
    assert "crl_out_of_date" not in caplog.text


class _Failed:
    def __init__(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("grpc_says", "we_say"),
    [
        ("failed to connect to all addresses; last error: UNAVAILABLE: ipv4:10.0.0.5:7000: Socket closed",
         "the peer closed the connection during the TLS handshake: it refused ann's certificate"),
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:7000: Tls handshake failed "
         "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
         "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate",
         "its certificate is not signed by our ca.pem"),
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:7000: Custom verification check "
         "failed with error: UNAUTHENTICATED: Hostname Verification Check failed.",
         "its certificate is not that of the server this client expects"),
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:7000: Connection refused", None),
        ("Deadline Exceeded", None),
    ],
)  # fmt: skip
def test_a_failed_handshake_is_explained_with_the_address(grpc_says: str, we_say: str | None) -> None:
    from secure_release.infra.tls import explain_handshake

    said = explain_handshake(_Failed(grpc_says), "10.0.0.5:7000", "ann", "server")  # type: ignore[arg-type]
    if we_say is None:
        assert said is None
    else:
        assert said is not None and said.startswith("TLS handshake with 10.0.0.5:7000 refused: ") and we_say in said
