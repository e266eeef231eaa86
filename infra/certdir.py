"""A party's certificate directory (``--certs DIR``): what it may hold, what is checked before
it is used, and the watcher that reloads it while a service runs.

A party's directory holds ``ca.pem``, ``NAME.pem``, ``NAME.key`` (mode 0600) and, after a
revocation, ``crl.pem``. :func:`check_directory` refuses a directory that also holds ``ca.key``
or any other private key, or whose key file others than its owner may read: the process would
hold secrets that are not its own. :func:`load_party` reads and checks the three files (the key
belongs to the certificate, ``ca.pem`` signed it, and with ``strict`` that it is valid now and
not revoked in ``crl.pem``) and names the file and the date when something is wrong.

:class:`CertWatcher` is the serving side's view of the directory: it re-reads the files when
they change (checked at most every ``reload_seconds``, default :data:`RELOAD_SECONDS`, or
``SECURE_RELEASE_CERT_RELOAD_SECONDS``), hands grpc's dynamic server credentials the new
certificate for the next handshake, answers "is this peer certificate revoked?" for the access
check on every RPC, and logs a warning from :data:`WARN_DAYS` days before its certificate
expires. A change that does not load (a key moved in before its certificate) keeps the old
files in use and logs why.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from secure_release.infra.identity import PkiError
from secure_release.infra.logs import EventLog
from secure_release.infra.pki import verify_issued_by

RELOAD_SECONDS = 10.0
RELOAD_ENV = "SECURE_RELEASE_CERT_RELOAD_SECONDS"
WARN_DAYS = 7
_KEY_MARK = b"PRIVATE KEY-----"
_SCAN_LIMIT = 1 << 20


def reload_seconds() -> float:
    """How often a service looks at its certificate files (``SECURE_RELEASE_CERT_RELOAD_SECONDS``)."""
    text = os.environ.get(RELOAD_ENV, "")
    if not text:
        return RELOAD_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise PkiError(f"{RELOAD_ENV}={text!r} is not a number of seconds") from None
    if not 0.05 <= value <= 86400:
        raise PkiError(f"{RELOAD_ENV} must be between 0.05 and 86400 seconds, got {value}")
    return value


def _day(when: _dt.datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M UTC")


def check_directory(cert_dir: Path, name: str) -> None:
    """Refuse a ``--certs`` directory that holds more than ``name``'s own secrets."""
    cert_dir = Path(cert_dir)
    if not cert_dir.is_dir():
        raise PkiError(f"--certs {cert_dir} is not a directory (it holds ca.pem, {name}.pem and {name}.key)")
    own = f"{name}.key"
    if (cert_dir / "ca.key").exists():
        raise PkiError(
            f"{cert_dir / 'ca.key'}: the CA's private key must not be in a service's --certs directory; "
            "keep it with the CA, offline (docs/deployment.md)"
        )
    for entry in sorted(cert_dir.iterdir()):
        if entry.name == own or (entry.name.startswith(".") and entry.name.endswith(".tmp")) or not entry.is_file():
            continue
        holds_key = entry.suffix == ".key"
        if not holds_key:
            try:
                with entry.open("rb") as fh:
                    holds_key = _KEY_MARK in fh.read(_SCAN_LIMIT)
            except OSError:
                holds_key = False
        if holds_key:
            raise PkiError(
                f"{entry} holds a private key that is not {name}'s; {name}'s --certs directory may hold "
                f"only ca.pem, {name}.pem, {name}.key and crl.pem"
            )
    key = cert_dir / own
    try:
        mode = stat.S_IMODE(key.stat().st_mode)
    except FileNotFoundError:
        raise PkiError(
            f"private key {key} not found; make it with 'secure-release pki request' (docs/deployment.md)"
        ) from None
    if mode & 0o077:
        raise PkiError(f"{key} has mode {mode:04o}: others than its owner may read it; run: chmod 600 {key}")


@dataclass(frozen=True)
class PartyFiles:
    """One consistent reading of a party's directory."""

    directory: Path
    name: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    certificate: x509.Certificate
    revoked: frozenset[int]
    crl_next_update: _dt.datetime | None

    @property
    def cert_path(self) -> Path:
        return self.directory / f"{self.name}.pem"

    @property
    def serial(self) -> int:
        return self.certificate.serial_number

    @property
    def not_after(self) -> _dt.datetime:
        return self.certificate.not_valid_after_utc

    def days_left(self, now: _dt.datetime | None = None) -> int:
        """Whole days until the certificate expires (negative once it has)."""
        delta = self.not_after - (now or _dt.datetime.now(_dt.UTC))
        return int(delta.total_seconds() // 86400)

    def problems(self, now: _dt.datetime | None = None) -> list[str]:
        """Why this party's own certificate cannot be used now ([] if it can)."""
        now = now or _dt.datetime.now(_dt.UTC)
        cert, path = self.certificate, self.cert_path
        out = []
        if now < cert.not_valid_before_utc:
            start = _day(cert.not_valid_before_utc)
            out.append(f"{path} is not valid until {start} (now {_day(now)}); check the clock")
        if now > cert.not_valid_after_utc:
            out.append(
                f"{path} expired on {_day(cert.not_valid_after_utc)}; renew it with 'secure-release pki request' "
                "and 'pki sign' (docs/deployment.md, Renew)"
            )
        if cert.serial_number in self.revoked:
            out.append(
                f"{path} (serial {cert.serial_number:x}) is revoked in {self.directory / 'crl.pem'}; "
                "ask the CA operator for a new certificate"
            )
        return out


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PkiError(
            f"{what} {path} not found; a party's --certs directory holds ca.pem, NAME.pem and NAME.key "
            "('secure-release pki request' and 'pki sign', or 'pki init' for a demo)"
        ) from None


def load_party(cert_dir: Path, name: str, strict: bool = True, now: _dt.datetime | None = None) -> PartyFiles:
    """Check ``cert_dir`` (:func:`check_directory`) and read it. The key must belong to the
    certificate, ``ca.pem`` must have signed it and ``crl.pem`` (if present); with ``strict``
    the certificate must also be valid at ``now`` and not revoked. Raises :class:`PkiError`
    naming the file (and the date)."""


    cert_dir = Path(cert_dir)
    check_directory(cert_dir, name)
    ca_path, cert_path, key_path = cert_dir / "ca.pem", cert_dir / f"{name}.pem", cert_dir / f"{name}.key"
    ca_pem, cert_pem = _read(ca_path, "CA certificate"), _read(cert_path, "certificate")
    key_pem = _read(key_path, "private key")
    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        raise PkiError(f"{ca_path} is not a PEM certificate") from None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise PkiError(f"{cert_path} is not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, None)
    except (ValueError, TypeError):
        raise PkiError(f"{key_path} is not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise PkiError(f"{key_path} is not the key of {cert_path}; replace the two files together")
    if not verify_issued_by(cert, ca):
        raise PkiError(f"{cert_path} is not signed by {ca_path} (the project CA {ca.subject.rfc4514_string()})")
    revoked: frozenset[int] = frozenset()
    next_update = None
    crl_path = cert_dir / "crl.pem"
    if crl_path.exists():
        try:
            crl = x509.load_pem_x509_crl(crl_path.read_bytes())
        except ValueError:
            raise PkiError(f"{crl_path} is not a PEM CRL (copy crl.pem as 'pki revoke' wrote it)") from None
        if not crl.is_signature_valid(ca.public_key()):  # type: ignore[arg-type]
            raise PkiError(f"{crl_path} is not signed by {ca_path}")
        revoked = frozenset(r.serial_number for r in crl)
        next_update = crl.next_update_utc
    files = PartyFiles(cert_dir, name, ca_pem, cert_pem, key_pem, cert, revoked, next_update)
    if strict:
        problems = files.problems(now)
        if problems:
            raise PkiError(problems[0])
    return files


@functools.lru_cache(maxsize=1024)
def serial_of_pem(pem: bytes) -> int | None:
    try:
        return x509.load_pem_x509_certificate(pem).serial_number
    except ValueError:
        return None


class CertWatcher:
    """The serving side's certificate directory, reloaded when its files change."""

    FILES = ("ca.pem", "{name}.pem", "{name}.key", "crl.pem")

    def __init__(
        self,
        cert_dir: Path,
        name: str,
        reload_every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory, self.name = Path(cert_dir), name
        self.reload_every = reload_seconds() if reload_every is None else reload_every
        self.clock = clock
        self.log = EventLog("tls", name)
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self.files = load_party(self.directory, name, strict=True)
        self.version = 0
        self._served = 0
        self._next = clock() + self.reload_every
        self._warned_days: int | None = None
        self._warn()

    def _stat(self) -> tuple[tuple[int, int, int] | None, ...]:
        out: list[tuple[int, int, int] | None] = []
        for pattern in self.FILES:
            try:
                st = (self.directory / pattern.format(name=self.name)).stat()
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def refresh(self, force: bool = False) -> bool:
        """Reload if the files changed (looked at no more often than ``reload_every``)."""
        with self._lock:
            now = self.clock()
            if not force and now < self._next:
                return False
            self._next = now + self.reload_every
            stamp = self._stat()
            if stamp == self._stamp:
                self._warn()
                return False
            self._stamp = stamp
            try:
                files = load_party(self.directory, self.name, strict=False)
            except PkiError as exc:
                self.log.error("certificate_reload_failed", reason=str(exc), still_serving=f"{self.files.serial:x}")
                return False
            changed_cert = files.cert_pem != self.files.cert_pem or files.ca_pem != self.files.ca_pem
            self.files = files
            if changed_cert:
                self.version += 1
            self.log(
                "certificates_reloaded",
                serial=f"{files.serial:x}",
                not_after=files.not_after.isoformat(),
                revoked=len(files.revoked),
            )
            for problem in files.problems():
                self.log.error("certificate_unusable", reason=problem)
            self._warned_days = None
            self._warn()
            return True

    def _warn(self) -> None:
        """Log, once a day, that the certificate expires within WARN_DAYS or the CRL is out of date."""
        days = self.files.days_left()
        if days < WARN_DAYS and days != self._warned_days:
            self.log.warning(
                "certificate_expires_soon",
                file=str(self.files.cert_path),
                days_left=days,
                not_after=self.files.not_after.isoformat(),
                renew="docs/deployment.md#renew",
            )
        stale = self.files.crl_next_update
        if stale is not None and stale < _dt.datetime.now(_dt.UTC) and days != self._warned_days:
            self.log.warning(
                "crl_out_of_date",
                file=str(self.directory / "crl.pem"),
                next_update=stale.isoformat(),
                renew="the CA operator runs 'secure-release pki crl --ca DIR'; copy the new crl.pem here",
            )
        self._warned_days = days

    def server_configuration(self) -> grpc.ServerCertificateConfiguration:
        files = self.files
        return grpc.ssl_server_certificate_configuration(
            [(files.key_pem, files.cert_pem)], root_certificates=files.ca_pem
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """grpc's certificate-config fetcher: called before each new handshake; None = unchanged."""
        try:
            self.refresh()
            if self.version == self._served:
                return None
            self._served = self.version
            return self.server_configuration()
        except Exception as exc:  # never let a fetch error break the handshake path
            self.log.error("certificate_fetch_failed", error_type=type(exc).__name__)
            return None

    def credentials(self) -> grpc.ServerCredentials:
        """Dynamic TLS server credentials requiring a client certificate from ``ca.pem``."""
        self._served = self.version
        # grpc-stubs type the fetcher as never returning None; grpc documents None as "unchanged".
        fetch = cast("Callable[[], grpc.ServerCertificateConfiguration]", self.fetch)
        return grpc.dynamic_ssl_server_credentials(
            self.server_configuration(), fetch, require_client_authentication=True
        )

    def revoked_serial(self, peer_pem: bytes) -> int | None:
        """The peer certificate's serial if the current CRL revokes it, else None."""
        self.refresh()
        serial = serial_of_pem(peer_pem)
        return serial if serial is not None and serial in self.files.revoked else None

    def start(self) -> None:
        """A daemon thread that looks at the files every ``reload_every`` even when no one calls
        (so expiry warnings and reloads are logged on an idle service). It ends with the watcher."""
        ref = weakref.ref(self)
        interval = self.reload_every

        def loop() -> None:
            while True:
                time.sleep(interval)
                watcher = ref()
                if watcher is None:
                    return
                watcher.refresh()
                del watcher

        threading.Thread(target=loop, name=f"certs-{self.name}", daemon=True).start()
