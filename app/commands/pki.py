"""``secure-release pki init DIR``: create the project CA and one certificate per party."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from secure_release.infra.pki import init_pki


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "pki",
        help="create the project CA and the certificates of curators, server and researcher",
        description=(
            "Public-key infrastructure for mutual TLS. Every party gets a certificate signed by "
            "a project CA; its identity is the URI SAN secure-release://ROLE/NAME, and every RPC "
            "checks the caller's ROLE (curator, server, researcher, analyst) from it."
        ),
    )
    pki_sub = p.add_subparsers(dest="pki_command", metavar="PKI_COMMAND")
    init = pki_sub.add_parser(
        "init",
        help="create DIR/ca.pem, DIR/ca.key and DIR/NAME.pem, DIR/NAME.key for every party",
        description=(
            "Create a project CA (ECDSA P-256, SHA-256) and one certificate and private key per "
            "party, valid 30 days. Keys are written with mode 0600. Each certificate names its "
            "party in a URI SAN secure-release://ROLE/NAME and lists every --hosts entry as a "
            "DNS or IP SAN, so any party can also serve TLS under those names. Give each process "
            "only its own NAME.key plus ca.pem and NAME.pem; keep ca.key offline."
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


def run_init(args: argparse.Namespace) -> int:
    parties = [("curator", c) for c in args.curators]
    parties.append(("server", args.server))
    parties += [("researcher", r) for r in args.researcher]
    parties += [("analyst", a) for a in args.analyst]
    init_pki(args.directory, parties, hosts=args.hosts, force=args.force)
    for role, name in parties:
        print(
            f"{role:<10} {name:<16} {args.directory / (name + '.pem')}  "
            f"{args.directory / (name + '.key')}"
        )
    print(f"CA         {args.directory / 'ca.pem'} (keep {args.directory / 'ca.key'} offline)")
    return 0
