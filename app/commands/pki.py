"""``secure-release pki``: the project CA and the parties' certificates, keys made where used.

``pki ca`` (the CA's machine), ``pki request`` (each party's machine: its key never leaves it),
``pki sign`` (the CA's machine: a CSR in, a certificate out), ``pki revoke`` (a signed CRL), and
``pki init``, the one-command demo path that runs the same functions on one machine and writes
one directory per party. docs/deployment.md says who runs which on which machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from secure_release.infra.fileio import atomic_write
from secure_release.infra.identity import CERT_VALIDITY_DAYS, ROLES, PkiError
from secure_release.infra.pki import (
    cert_pem,
    create_ca,
    init_pki,
    key_fingerprint,
    parse_serial,
    read_request,
    refresh_crl,
    revoke,
    serial_hex,
    sign_request,
    write_request,
)

_DOCS = "Who runs which command on which machine: docs/deployment.md."


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "pki",
        help="the project CA and the parties' certificates (keys are made where they are used)",
        description=(
            "Public-key infrastructure for mutual TLS. Every party gets a certificate signed by "
            "a project CA; its identity is the URI SAN secure-release://ROLE/NAME, and every RPC "
            "checks the caller's ROLE (curator, server, researcher, analyst) from it and refuses "
            "a certificate revoked in crl.pem. Each party makes its own key with 'pki request' "
            "and sends only the CSR to the CA. " + _DOCS
        ),
    )
    pki_sub = p.add_subparsers(dest="pki_command", metavar="PKI_COMMAND")

    ca = pki_sub.add_parser(
        "ca",
        help="create the project CA: DIR/ca.pem and DIR/ca.key (0600); run it on the CA's machine",
        description="Create the project CA (ECDSA P-256, valid 10 years) in DIR: ca.pem (give it to "
        "every party) and ca.key (0600; it never leaves this machine). " + _DOCS,
    )
    ca.add_argument("directory", type=Path, metavar="DIR", help="the CA's directory (created, 0700)")
    ca.add_argument(
        "--force", action="store_true", help="replace an existing CA (every certificate it signed stops working)"
    )
    ca.set_defaults(func=run_ca)

    req = pki_sub.add_parser(
        "request",
        help="make this party's key (0600) and a certificate signing request NAME.csr in --out DIR",
        description="Make a private key and a certificate signing request for the identity ROLE/NAME "
        "on the machine that will use it. DIR/NAME.key never leaves DIR; send DIR/NAME.csr to the CA "
        "operator, who answers with NAME.pem (and ca.pem). " + _DOCS,
        epilog="Example: secure-release pki request --role curator --name alice --out certs-alice "
        "--hosts alice.example.org",
    )
    req.add_argument("--role", required=True, choices=ROLES, help="the party's role")
    req.add_argument(
        "--name", required=True, help="the party's name (a lowercase DNS label, unique in the deployment)"
    )
    req.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="this party's --certs directory (created, 0700)"
    )
    req.add_argument("--hosts", type=_names, default=[], help="comma-separated DNS names / IPs this party serves under")
    req.set_defaults(func=run_request)

    sign = pki_sub.add_parser(
        "sign",
        help="certify the identity a CSR asks for: NAME.csr in, NAME.pem out (run on the CA's machine)",
        description="Check a certificate signing request (its signature, a role among "
        f"{', '.join(ROLES)}, a valid name, no other identity's names), print the role and name "
        "it certifies, and write the certificate. Refuses a name already certified under another "
        "key unless --replace. " + _DOCS,
    )
    sign.add_argument("csr", type=Path, metavar="NAME.csr", help="the request a party sent")
    sign.add_argument("--ca", required=True, type=Path, metavar="DIR", help="the CA's directory (from 'pki ca')")
    sign.add_argument("--out", required=True, type=Path, metavar="NAME.pem", help="where to write the certificate")
    sign.add_argument(
        "--days", type=int, default=CERT_VALIDITY_DAYS, help=f"validity in days (default {CERT_VALIDITY_DAYS})"
    )
    sign.add_argument("--replace", action="store_true", help="certify a name already certified under another key")
    sign.set_defaults(func=run_sign)

    rev = pki_sub.add_parser(
        "revoke",
        help="revoke a party's certificates (or one serial): writes the signed CRL DIR/crl.pem",
        description="Add every certificate of --name (or the one --serial) to the CA's signed "
        "revocation list DIR/crl.pem. Copy crl.pem into every service's --certs directory: each "
        "reloads it and refuses the revoked certificate on every call. " + _DOCS,
    )
    rev.add_argument("--ca", required=True, type=Path, metavar="DIR", help="the CA's directory (from 'pki ca')")
    who = rev.add_mutually_exclusive_group(required=True)
    who.add_argument("--name", help="revoke every certificate this CA issued to NAME")
    who.add_argument("--serial", help="revoke one certificate by its serial (hex, as 'pki sign' printed it)")
    rev.set_defaults(func=run_revoke)

    crl = pki_sub.add_parser(
        "crl",
        help="sign DIR/crl.pem again with a fresh next update (every revocation kept)",
        description="A CRL is valid 30 days; services log 'crl_out_of_date' after that. Re-sign it "
        "(every entry kept; an empty CRL if none yet) and copy crl.pem to every party. " + _DOCS,
    )
    crl.add_argument("--ca", required=True, type=Path, metavar="DIR", help="the CA's directory (from 'pki ca')")
    crl.set_defaults(func=run_crl)

    init = pki_sub.add_parser(
        "init",
        help="demo only: a CA in DIR/ca and one directory DIR/NAME per party, all on this machine",
        description=(
            "The one-command demo path: 'pki ca' into DIR/ca, then 'pki request' and 'pki sign' "
            "for every party, each into its own DIR/NAME (ca.pem, NAME.pem, NAME.key 0600), "
            "certificates valid 30 days. Whoever runs it has held every key: for separate "
            "organisations use 'pki ca', 'pki request' and 'pki sign' instead. Give each process "
            "only its own DIR/NAME; keep DIR/ca offline. " + _DOCS
        ),
        epilog=(
            "Example (docker compose): secure-release pki init certs --curators alice,bob "
            "--hosts localhost,127.0.0.1,server,alice,bob,researcher"
        ),
    )
    init.add_argument("directory", type=Path, metavar="DIR", help="output directory (created)")
    init.add_argument(
        "--curators",
        type=_names,
        default=["alice", "bob"],
        help="comma-separated curator names (default: alice,bob)",
    )
    init.add_argument("--server", default="server", help="the server's name (default: server)")
    init.add_argument(
        "--researcher",
        type=_names,
        default=["researcher"],
        help="comma-separated researcher names (default: researcher)",
    )
    init.add_argument(
        "--analyst",
        type=_names,
        default=["analyst"],
        help="comma-separated analyst names (default: analyst; '' for none)",
    )
    init.add_argument(
        "--hosts",
        type=_names,
        default=["localhost", "127.0.0.1"],
        help="DNS names / IP addresses put in every certificate (default: localhost,127.0.0.1)",
    )
    init.add_argument(
        "--force",
        action="store_true",
        help="replace an existing CA in DIR (every old certificate stops working)",
    )
    init.set_defaults(func=run_init)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_ca(args: argparse.Namespace) -> int:
    create_ca(args.directory, force=args.force)
    print(f"CA certificate {args.directory / 'ca.pem'}  (give it to every party)")
    print(f"CA key         {args.directory / 'ca.key'}  (0600; never leaves this machine)")
    return 0


def run_request(args: argparse.Namespace) -> int:
    csr = write_request(args.out, args.role, args.name, args.hosts)
    request = read_request(csr.read_bytes(), str(csr))
    print(f"key     {args.out / (args.name + '.key')}  (0600; stays here)")
    print(f"request {csr}  (send it to the CA operator)")
    print(f"key fingerprint {key_fingerprint(request.public_key)}  (tell the CA operator by another channel)")
    return 0


def run_sign(args: argparse.Namespace) -> int:
    try:
        pem = args.csr.read_bytes()
    except FileNotFoundError:
        raise PkiError(f"{args.csr} not found: the CSR made by 'secure-release pki request'") from None
    request = read_request(pem, str(args.csr))
    print(f"certifying role {request.identity.role} name {request.identity.name}"
          f" (hosts: {', '.join(str(h.value) for h in request.hosts) or 'none'})")  # fmt: skip
    fingerprint = key_fingerprint(request.public_key)
    print(f"key fingerprint {fingerprint}  (compare it with the one {request.identity.name} told you)")
    cert = sign_request(args.ca, pem, days=args.days, replace=args.replace, source=str(args.csr))
    atomic_write(args.out, cert_pem(cert), 0o644)
    until = f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    print(f"wrote {args.out}: serial {serial_hex(cert.serial_number)}, valid until {until}")
    print(f"send {args.out} and {args.ca / 'ca.pem'} to {request.identity.name}")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    serial = parse_serial(args.serial) if args.serial else None
    revoked = revoke(args.ca, name=args.name, serial=serial)
    for cert in revoked:
        print(f"revoked serial {serial_hex(cert.serial_number)} (until {cert.not_valid_after_utc:%Y-%m-%d})")
    if not revoked:
        print("already revoked; crl.pem rewritten")
    print(f"wrote {args.ca / 'crl.pem'}: copy it into every party's --certs directory")
    return 0


def run_crl(args: argparse.Namespace) -> int:
    crl = refresh_crl(args.ca)
    until = crl.next_update_utc
    print(f"wrote {args.ca / 'crl.pem'}: {len(crl)} revoked, next update {until:%Y-%m-%d} (copy it to every party)")
    return 0


def run_init(args: argparse.Namespace) -> int:
    parties = [("curator", c) for c in args.curators]
    parties.append(("server", args.server))
    parties += [("researcher", r) for r in args.researcher]
    parties += [("analyst", a) for a in args.analyst]
    init_pki(args.directory, parties, hosts=args.hosts, force=args.force)
    for role, name in parties:
        print(f"{role:<10} {name:<16} {args.directory / name}/  (ca.pem, {name}.pem, {name}.key)")
    print(f"CA         {args.directory / 'ca'}/  (ca.pem, ca.key: keep it offline, give it to no service)")
    return 0

