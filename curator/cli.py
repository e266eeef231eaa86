"""``python -m secure_release.curator run``: one curator's side of a secure release.

Config: flags, ``SECURE_RELEASE_<FLAG>`` environment variables (e.g. SECURE_RELEASE_EPSILON=0.5)
or ``--config file.json`` (keys are flag names); flags win over env, env over the file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import grpc

from secure_release.curator.commands import add_budget_parser, add_release_parser, budget, release
from secure_release.curator.config import DEFAULT_KEY_RETENTION_S
from secure_release.curator.keystore import KeystoreError, TableChangedError
from secure_release.curator.table import BadRowsError, SchemaFileError
from secure_release.infra.config import ConfigError, apply_env_and_config, subcommand_parser
from secure_release.infra.exitcodes import USAGE, describe, exit_code_for
from secure_release.infra.logs import setup_logging
from secure_release.mechanism.errors import (
    InvalidNameError,
    NonFiniteInputError,
    SecureReleaseError,
    UnknownCipherError,
)
from secure_release.mechanism.ledger import NoBudgetError

#: Errors in what the operator gave (flags, files, keystore): exit code 2.
USAGE_ERRORS = (
    ConfigError,
    BadRowsError,
    SchemaFileError,
    InvalidNameError,
    NonFiniteInputError,
    UnknownCipherError,
    NoBudgetError,
    KeystoreError,
    TableChangedError,
    OSError,
)

EPILOG = """\
How a release runs:
  1. every curator reads its table (CSV or Parquet) against its schema JSON;
  2. curators send keyed id tags (never ids) and their alphabet sizes to the leader, who fixes
     the common ids, n, m, gamma and a fresh sampling seed and sends them back over mutual TLS;
  3. each curator reserves epsilon in its ledger (a release past the data set's budget is
     refused and aborted for everybody), samples the same m rows, persists pad and sample, adds
     the pad, uploads what the server lacks and commits; a restart resumes where it stopped;
  4. once the server seals the release the reservation is committed (an abort refunds it), and
     the curator serves its pad key to the researchers it granted (--grant) until the key
     retention ends (--key-retention) or SIGTERM.

The budget is set beforehand, never per run:
  python -m secure_release.curator budget set --keystore ks-alice --data alice.csv --epsilon 2.0

Exit codes: 0 released (keys served), 1 the release failed or was aborted (the reason is printed
and recorded at the server), 2 a usage, config or input error, 3 refused (e.g. the budget does
not cover the release).

Example (two terminals; certificates from 'secure-release pki init certs', the key from
'secure-release keygen alignment align.key', schemas from 'secure-release schema draft'; the
leader comes first in --curators; see docs/own-data.md for the server and researcher):
  secure-release-curator run --data alice.csv --schema alice.json --release-id r1 --epsilon 0.5 \\
      --server 127.0.0.1:7000 --certs certs --name alice --curators alice,bob --leader \\
      --listen 127.0.0.1:7101 --alignment-key-file align.key --grant researcher --keystore ks-alice
  secure-release-curator run --data bob.csv --schema bob.json --release-id r1 --epsilon 0.5 \\
      --server 127.0.0.1:7000 --certs certs --name bob --curators alice,bob \\
      --leader-address 127.0.0.1:7101 --listen 127.0.0.1:7102 --alignment-key-file align.key \\
      --grant researcher --keystore ks-bob
"""


def build_parser() -> argparse.ArgumentParser:
    """The curator's command line (one sub-command, ``run``)."""
    parser = argparse.ArgumentParser(
        prog="python -m secure_release.curator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_budget_parser(sub)
    add_release_parser(sub)
    p = sub.add_parser(
        "run",
        help="take part in one release and serve keys afterwards",
        description="Take part in one release as a curator, then serve keys.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="JSON file of settings (keys: flag names)")
    g = p.add_argument_group("data")
    g.add_argument("--data", help="CSV (or .parquet) file: an id column and the schema's attributes")
    g.add_argument("--schema", help='schema JSON: {"curator", "id_column", "attributes": [...]}')
    g.add_argument("--query", help="SQL run on --data as a DuckDB database (.duckdb): its result is the table")
    g.add_argument("--dataset", help="the data set's name for people (the ledger keys it by its SHA-256)")
    r = p.add_argument_group("release")
    r.add_argument("--release-id", help="release identifier, the same at every curator (e.g. r1)")
    r.add_argument("--epsilon", type=float, help="privacy level epsilon > 0 of this release")
    r.add_argument("--m", type=int, default=None, help="sample size (default: m*, Cor. 3.6)")
    r.add_argument(
        "--cipher",
        default="chacha20",
        choices=["otp", "chacha20"],
        help="pad kind: chacha20 (researcher gets a 32-byte key) or otp (gets the pad)",
    )
    r.add_argument(
        "--sampling",
        default="seed",
        choices=["seed", "indices"],
        help="how the curators share the sample, the same at every curator: seed (the leader sends a "
        "32-byte seed; the sample is pseudorandom, ChaCha20) or indices (the leader draws the ordered "
        "m-tuple from the OS CSPRNG and sends it packed, ceil(log2 n) bits a position; truly random)",
    )
    r.add_argument(
        "--alignment",
        default="hash",
        choices=["hash", "psi"],
        help="how the curators align ids, the same at every curator: hash (keyed-hash tags under the "
        "shared --alignment-key-file; fast) or psi (N-party ECDH private set intersection through the "
        "leader; no shared key; reveals only the intersection to followers; ~1 ms per id per curator)",
    )
    r.add_argument("--curators", help="all curators in joint-code order, comma separated (alice,bob)")
    r.add_argument(
        "--alphabet-sizes",
        help="leader only, optional: cross-check of each curator's alphabet size in --curators "
        "order (6,4); every curator sends its own size with its tags, and a mismatch stops the "
        "release with an error",
    )
    r.add_argument("--leader", action="store_true", help="this curator leads the agreement")
    r.add_argument("--leader-address", help="followers: HOST:PORT of the leading curator")
    r.add_argument("--researcher", default="researcher", help="researcher the server notifies")
    r.add_argument(
        "--grant",
        action="append",
        default=[],
        help="researcher certificate name allowed to fetch this curator's key (repeatable)",
    )
    r.add_argument("--keystore", help="directory of pads and the ledger (0600; default keystore-NAME)")
    r.add_argument(
        "--alignment-key-file",
        help="file holding the shared alignment key (64 hex digits); or set SECURE_RELEASE_ALIGNMENT_KEY",
    )
    r.add_argument(
        "--key-retention",
        type=float,
        default=DEFAULT_KEY_RETENTION_S,
        help="seconds the key is served after the release is sealed (also after a restart)",
    )
    r.add_argument("--max-rows", type=int, default=10_000_000, help="leader: most tags a curator may send")
    n = p.add_argument_group("network")
    n.add_argument("--server", help="HOST:PORT of the release server")
    n.add_argument("--certs", help="directory with ca.pem, NAME.pem, NAME.key")
    n.add_argument("--name", help="this curator's name (its certificate name)")
    n.add_argument("--listen", default="127.0.0.1:0", help="where the Curator service listens")
    n.add_argument("--port-file", help="write the bound port here")
    n.add_argument("--insecure", action="store_true", help="plaintext gRPC (tests/demos only!)")
    n.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds from start until the release is sealed (every wait ends then; then it is aborted)",
    )
    n.add_argument(
        "--exit-after-keys",
        action="store_true",
        help="exit once every granted researcher fetched the key (default: serve until SIGTERM)",
    )
    t = p.add_argument_group("testing only (need SECURE_RELEASE_TESTING=1)")
    t.add_argument("--insecure-test-seed", help=argparse.SUPPRESS)
    t.add_argument("--insecure-test-pad-key", help=argparse.SUPPRESS)
    t.add_argument("--insecure-test-psi-key", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the curator CLI; returns the exit code of the shared convention (infra/exitcodes.py:
    0 success, 1 failed or aborted release, 2 usage, config or input error, 3 refused)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        if argv and argv[0] == "run":
            apply_env_and_config(subcommand_parser(parser, "run"), argv[1:])
        args = parser.parse_args(argv)
        if args.command not in ("run", "budget", "release") or getattr(args, "action", "") is None:
            parser.print_help()
            return 2
        os.umask(0o077)  # keystores, ledgers, pads: every file 0600, every directory 0700
        setup_logging()
        return _dispatch(args)
    except KeyboardInterrupt:
        return 130
    except USAGE_ERRORS as exc:
        sys.stderr.write(f"curator: error: {describe(exc)}\n")
        return USAGE
    except (SecureReleaseError, grpc.RpcError) as exc:  # one line, no traceback of secrets
        sys.stderr.write(f"curator: error: {describe(exc)}\n")
        return exit_code_for(exc)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "budget":
        return budget(args)
    if args.command == "release":
        return release(args)
    from secure_release.curator.config import config_from_args
    from secure_release.curator.runner import run

    return run(config_from_args(args))
