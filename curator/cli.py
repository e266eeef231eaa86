"""``python -m secure_release.curator run``: one curator's side of a secure release.

Config: flags, ``SECURE_RELEASE_<FLAG>`` environment variables (e.g. SECURE_RELEASE_EPSILON=0.5)
or ``--config file.json`` (keys are flag names); flags win over env, env over the file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from secure_release.curator.badrows import bad_rows_to
from secure_release.curator.commands import (
    add_budget_parser,
    add_release_parser,
    add_table_parser,
    budget,
    release,
    table,
)
from secure_release.curator.config import DEFAULT_KEY_RETENTION_S, POSITIONS_PATH_REFUSAL
from secure_release.curator.records.keystore import KeystoreError, TableChangedError
from secure_release.curator.table import BadRowsError, SchemaFileError
from secure_release.infra import metrics
from secure_release.infra.config import ConfigError, apply_env_and_config, subcommand_parser
from secure_release.infra.entry import run_main
from secure_release.infra.exitcodes import USAGE
from secure_release.infra.logs import add_log_format_flag, pop_log_format, setup_logging
from secure_release.infra.memory import return_freed_memory_promptly
from secure_release.mechanism.errors import (
    InvalidNameError,
    NonFiniteInputError,
    UnknownCipherError,
)
from secure_release.mechanism.protocol.spec import DEFAULT_MAX_EPSILON

#: Errors in what the operator gave (flags, files, keystore): exit code 2.
USAGE_ERRORS = (
    ConfigError,
    BadRowsError,
    SchemaFileError,
    InvalidNameError,
    NonFiniteInputError,
    UnknownCipherError,
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
     the curator serves its pad key to the researchers it granted (--grant); it exits 0 once
     each of them stored its result and acknowledged the key, or when the key retention ends
     (--key-retention, the upper bound), or on SIGTERM; --serve-until-stopped keeps serving.

The budget is set beforehand, never per run, per data set (--dataset, default the --data file's
name; a refreshed table under the same name spends from the same budget); --certs/--name sign the
ledger's head and --server carries over what the server's witness knows was spent:
  secure-release-curator budget set --keystore ks-alice --data alice.csv --epsilon 2.0 \\
      --certs certs/alice --name alice --server 127.0.0.1:7000

Exit codes: 0 released (keys served), 1 the release failed or was aborted (the reason is printed
and recorded at the server), 2 a usage, config or input error, 3 refused (no budget set, or the
budget does not cover the release), at this curator or at any other party of the release.

Example (two terminals; certificates from 'secure-release pki init certs', one directory per party, the key from
'secure-release keygen alignment align.key', schemas from 'secure-release schema draft'; the
leader comes first in --curators; see docs/own-data.md for the server and researcher):
  secure-release-curator run --data alice.csv --schema alice.json --release-id r1 --epsilon 0.5 \\
      --server 127.0.0.1:7000 --certs certs/alice --name alice --curators alice,bob --leader \\
      --listen 127.0.0.1:7101 --alignment-key-file align.key --grant researcher --keystore ks-alice
  secure-release-curator run --data bob.csv --schema bob.json --release-id r1 --epsilon 0.5 \\
      --server 127.0.0.1:7000 --certs certs/bob --name bob --curators alice,bob \\
      --leader-address 127.0.0.1:7101 --listen 127.0.0.1:7102 --alignment-key-file align.key \\
      --grant researcher --keystore ks-bob

A table past one machine's memory (pip install 'secure-release[cluster]'; docs/own-data.md):
add to the same command a directory of Parquet files and the cluster engine, e.g.
  --data people/ --engine dask --workers 4 --worker-memory 4GiB       (an embedded cluster)
  --data people/ --engine dask --scheduler-file scheduler.json        (your running cluster)
"""

DESIGN_EPILOG = """
A release designed for questions (--design FILE): the researcher plans the tables that answer
its questions under one epsilon ('secure-release plan --question "salary ~ education | sex"
--question "marital ~ sex" --n N --schema alice.json --schema bob.json --epsilon 1 --out design.json')
and gives every curator the same file. The run is a release as above (hash or PSI alignment, seed or
indices sampling, chacha20 or otp, --engine dask), except that the m = sum m_t sampled records are
split in order into the tables: in table t's records each curator uploads only its attributes in
that table, under its pad (one segment a table), and the server perturbs each table with its own
gamma_t. The leader sizes the tables for the aligned n; each follower checks the spec against its
own design (the digest and the tables) and refuses another. The researcher gets the design file
with the first key chunk and estimates each table.
  secure-release-curator run --design design.json --data alice.csv --schema alice.json --release-id r2 ...
"""

SERVER_SAMPLED_EPILOG = """
Server-side sampling (--sampling server): once the curators stored their aligned
columns encrypted under table keys ('store-table'), each release needs only the table key:
  1. every curator computes the same spec from its table record (n and alphabet sizes fixed when
     the table was stored, --epsilon, --m) and registers it (no leader, no data file);
  2. once every named curator registered it, the server draws a fresh uniform ordered m-tuple of
     stored positions from its OS CSPRNG; each curator fetches it (never the researcher), charges
     its ledger for the table's data set (the one it was stored from; 'budget set --table-id'),
     and uploads its re-key column delta = (w - v_p) mod k for a fresh per-release pad w;
  3. the server adds it to the stored rows, applies PRAM once and erases re-key columns and
     positions; the researcher fetches and asks for keys exactly as for any release.
Why only the rekeyed key path: """ + POSITIONS_PATH_REFUSAL + """.

Example (after 'store-table --table-id adult'):
  secure-release-curator budget set --keystore ks-alice --table-id adult --epsilon 2.0 --certs certs/alice --name alice
  secure-release-curator run --sampling server --table-id adult --release-id r1 --epsilon 0.5 \\
      --server 127.0.0.1:7000 --certs certs/alice --name alice --curators alice,bob --grant researcher \\
      --keystore ks-alice --listen 127.0.0.1:7101
"""

STORE_DESCRIPTION = """\
Store this curator's whole table once for server-side sampling. The curators align
exactly as for a release (keyed hash or PSI through the leader; --curators, --leader or
--leader-address as for 'run'); then each encrypts its whole aligned column under a fresh table key
(ChaCha20 pads seekable by row; the key stays in the keystore, 0600, and is never logged or sent),
records the table (key, n, every curator's alphabet size, its schema) and uploads the ciphertext
once to the server in chunks of at most 1 MiB with a digest. A restart resumes: identical chunks
are replayed harmlessly; a table whose content would differ is refused (store it under a new id).
Exit 0 once every curator of the table committed its column."""

STORE_EPILOG = """\
Example (two terminals; the leader comes first in --curators):
  secure-release-curator store-table --table-id adult --data alice.csv --schema alice.json \\
      --server 127.0.0.1:7000 --certs certs/alice --name alice --curators alice,bob --leader \\
      --listen 127.0.0.1:7101 --alignment-key-file align.key --keystore ks-alice
  secure-release-curator store-table --table-id adult --data bob.csv --schema bob.json \\
      --server 127.0.0.1:7000 --certs certs/bob --name bob --curators alice,bob \\
      --leader-address 127.0.0.1:7101 --alignment-key-file align.key --keystore ks-bob
Then: 'budget set --table-id adult', 'run --sampling server --table-id adult ...', and when the
table is no longer needed 'table delete adult' (the server erases its ciphertext; this curator
forgets the table key).
"""


def build_parser() -> argparse.ArgumentParser:
    """The curator's command line (``run``, ``store-table``, ``budget``, ``release``, ``table``)."""
    parser = argparse.ArgumentParser(
        prog="secure-release-curator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_format_flag(parser)
    metrics.add_metrics_flag(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_budget_parser(sub)
    add_release_parser(sub)
    add_table_parser(sub)
    p = sub.add_parser(
        "run",
        help="take part in one release and serve keys afterwards",
        description="Take part in one release as a curator, then serve keys.",
        epilog=EPILOG + DESIGN_EPILOG + SERVER_SAMPLED_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(p, storing=False)
    s = sub.add_parser(
        "store-table",
        help="align with the other curators and upload this curator's whole encrypted column once "
        "(server-side sampling: releases then need no data file)",
        description=STORE_DESCRIPTION,
        epilog=STORE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_arguments(s, storing=True)
    return parser


def add_run_arguments(p: argparse.ArgumentParser, storing: bool) -> None:
    """The flags of ``run`` or (``storing``) ``store-table``, which aligns exactly like a release
    but has no release settings."""
    p.add_argument("--config", help="JSON file of settings (keys: flag names)")
    g = p.add_argument_group("data")
    g.add_argument("--data", help="CSV (or .parquet) file, or a directory or glob of Parquet or CSV files "
                   "(hive key=value directories become columns), or a PostgreSQL database "
                   "postgresql://[USER@]HOST[:PORT]/DB with --query: an id column and the schema's attributes"
                   + ("" if storing else " (not with --sampling server)"))  # fmt: skip
    g.add_argument("--schema", help='schema JSON: {"curator", "id_column", "attributes": [...]}')
    g.add_argument("--query", help="SQL run on --data as a DuckDB database (.duckdb) or a PostgreSQL database "
                   "(postgresql://[USER@]HOST[:PORT]/DB): its result is the table")
    g.add_argument("--data-password-file", metavar="FILE", help="with a postgresql:// --data: the file whose first "
                   "line is the role's password (default: libpq's own places: ~/.pgpass, PGPASSFILE, PGPASSWORD, a "
                   "service file); a password in the URL is refused")
    g.add_argument("--bad-rows", metavar="FILE", help="if the table has bad rows, write every one (file, line, column, "
                   "value, problem) to FILE, readable by you only (0600); the error shows a summary per column")
    g.add_argument(
        "--dataset",
        help="the data set (the population) whose budget this release spends (default: the name of the --data "
        "file or directory; with --sampling server, the name the table was stored under)",
    )
    r = p.add_argument_group("table" if storing else "release")
    r.add_argument(
        "--table-id",
        help="the stored table's id, the same at every curator (e.g. adult-2024)"
        if storing
        else "with --sampling server: the stored table the server samples (see 'store-table')",
    )
    if storing:
        p.set_defaults(release_id=None, epsilon=None, m=None, cipher="chacha20", sampling="seed",
                       researcher="researcher", grant=[], key_retention=DEFAULT_KEY_RETENTION_S,
                       exit_after_keys=False, serve_until_stopped=True, key_path="rekeyed")  # fmt: skip
    else:
        r.add_argument("--release-id", help="release identifier, the same at every curator (e.g. r1)")
        r.add_argument("--epsilon", type=float, help="privacy level epsilon > 0 of this release")
        r.add_argument(
            "--max-epsilon",
            type=float,
            default=DEFAULT_MAX_EPSILON,
            help=f"refuse a release with a larger epsilon (default {DEFAULT_MAX_EPSILON:g})",
        )
        r.add_argument("--m", type=int, default=None, help="sample size (default: m*, Cor. 3.6)")
        r.add_argument(
            "--design",
            default=None,
            metavar="FILE",
            help="release the tables of a design made for the researcher's questions (the file `secure-release plan "
            "--question ... --out FILE` wrote, the same file at every curator): one alignment, and the sampled records "
            "split into the design's tables, each from records of its own (disjoint), with its own gamma, the whole at "
            "the design's epsilon (the ledger charges it once; --epsilon may be left out, or must equal it; no --m). "
            "Its schema of this curator must be --schema's. The leader's spec carries the design's digest: a curator "
            "running another design (or none) refuses it, and every party exits 3 naming both digests. Not with "
            "--sampling server (see 'A release designed for questions' below)",
        )
        r.add_argument(
            "--cipher",
            default="chacha20",
            choices=["otp", "chacha20"],
            help="pad kind: chacha20 (researcher gets a 32-byte key) or otp (gets the pad)",
        )
        r.add_argument(
            "--sampling",
            default="seed",
            choices=["seed", "indices", "server"],
            help="who samples, the same at every curator: seed (the leader sends a 32-byte seed; the sample "
            "is pseudorandom, ChaCha20), indices (the leader draws the ordered m-tuple from the OS CSPRNG and "
            "sends it packed, ceil(log2 n) bits a position; drawn from the OS CSPRNG) or server (the server draws the "
            "m-tuple of a stored table, --table-id; no data file, no leader; see below)",
        )
        r.add_argument(
            "--key-path",
            default="rekeyed",
            help="with --sampling server: rekeyed (the only path across the services: each curator re-keys "
            "the sampled rows to a fresh per-release pad). 'positions' is refused: " + POSITIONS_PATH_REFUSAL,
        )
    r.add_argument(
        "--alignment",
        default="hash",
        choices=["hash", "psi"],
        help="how the curators align ids, the same at every curator: hash (keyed-hash tags under the "
        "shared --alignment-key-file; fast) or psi (N-party ECDH private set intersection through the "
        "leader; no shared key; reveals only the intersection to followers; ~0.12-0.22 ms per id per curator)",
    )
    r.add_argument(
        "--psi-workers",
        type=int,
        default=1,
        help="with --alignment psi: processes sharing this curator's hashing and blinding (e.g. its cores); "
        "with --engine dask its workers do that instead",
    )
    r.add_argument(
        "--psi-slice-points",
        type=int,
        default=None,
        help="with --alignment psi and --engine dask: points a slice of a ring list holds (default 65536, "
        "2.1 MB): the lists travel and are blinded a slice at a time, two slices a worker in flight",
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
    if not storing:
        r.add_argument("--researcher", default="researcher", help="researcher the server notifies")
        r.add_argument(
            "--grant",
            action="append",
            default=[],
            help="researcher certificate name allowed to fetch this curator's key (repeatable)",
        )
    r.add_argument("--keystore", help="directory of pads, table keys and the ledger (0600; default keystore-NAME)")
    r.add_argument(
        "--alignment-key-file",
        help="file holding the shared alignment key (64 hex digits); or set SECURE_RELEASE_ALIGNMENT_KEY",
    )
    if not storing:
        r.add_argument(
            "--key-retention",
            type=float,
            default=DEFAULT_KEY_RETENTION_S,
            help="seconds the key is served after the release is sealed (also after a restart)",
        )
    r.add_argument(
        "--max-rows",
        type=int,
        default=None,
        help="leader: most ids (tags or PSI points) a curator may send; the leader holds 16 bytes a tag "
        "(default 2^24 = 16.8 M ids, 256 MiB); with --engine dask it spools 20 bytes a tag to disk "
        "(default there 2^30 = 1.07 G ids, 20 GiB of spool at most)",
    )
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
        help="seconds from start until the table is stored (every wait ends then)"
        if storing
        else "seconds from start until the release is sealed (every wait ends then; then it is aborted)",
    )
    if not storing:
        n.add_argument(
            "--serve-until-stopped",
            action="store_true",
            help="keep serving the key after every granted researcher acknowledged it, until SIGTERM or "
            "the key retention ends (default: exit 0 once every granted researcher stored its result "
            "and acknowledged the key)",
        )
        n.add_argument("--exit-after-keys", action="store_true", help="(the default now; kept for old scripts)")
    c = p.add_argument_group(
        "cluster (pip install 'secure-release[cluster]'; keyed-hash alignment and seed sampling)",
        "A table past one machine's memory: read, hash, shuffle and align it on a Dask cluster inside this "
        "curator's trust domain. --data may then be a directory or glob of Parquet or CSV files.",
    )
    c.add_argument("--engine", choices=("local", "dask"), default=None,
                   help="local: this process (default); dask: an embedded cluster, or --scheduler's")  # fmt: skip
    c.add_argument("--scheduler", help="tcp://HOST:PORT (or tls://) of this curator's running Dask scheduler")
    c.add_argument("--scheduler-file", help="the scheduler file of this curator's running Dask scheduler")
    c.add_argument("--workers", type=int, help="embedded cluster: worker processes (default: one a core, at most 8)")
    c.add_argument("--worker-memory", help="embedded cluster: each worker's memory limit (spills above; default 2GiB)")
    c.add_argument("--shards", type=int, help="tag shards, a power of two (default: at most 4 M tags a shard)")
    c.add_argument("--shard-store", choices=("auto", "disk", "memory"), default=None,
                   help="where an embedded cluster keeps the shards between stages: memory (the workers hold 17 "
                   "bytes a row, spilling past their limit), disk (the ids and symbols compressed in the keystore's "
                   "dask-spill directory, about the input's size; tags recomputed where needed), or auto (the "
                   "default: disk once 17 bytes a row pass 60%% of the workers' memory)")  # fmt: skip
    c.add_argument("--tag-streams", type=int,
                   help="a follower: concurrent TLS streams its tags go to the leader in, one a run of shards "
                   "(default 0: one a worker of the cluster, at most 8; 1: one stream; the leader needs this "
                   "version to take more than one)")  # fmt: skip
    t = p.add_argument_group("testing only (need SECURE_RELEASE_TESTING=1)")
    t.add_argument("--insecure-test-seed", help=argparse.SUPPRESS)
    t.add_argument("--insecure-test-pad-key", help=argparse.SUPPRESS)
    t.add_argument("--insecure-test-psi-key", help=argparse.SUPPRESS)
    t.add_argument("--insecure-test-table-key", help=argparse.SUPPRESS)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the curator CLI; returns the exit code of the shared convention (infra/exitcodes.py:
    0 success, 1 failed or aborted release, 2 usage, config or input error, 3 refused)."""
    program = argv is None  # this process was started for this command (not a caller's)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()

    def body() -> int:
        rest, log_format = pop_log_format(argv)
        rest, metrics_address = metrics.pop_metrics_listen(rest)
        if rest and rest[0] in ("run", "store-table"):
            apply_env_and_config(subcommand_parser(parser, rest[0]), rest[1:])
        args = parser.parse_args(rest)
        commands = ("run", "store-table", "budget", "release", "table")
        if args.command not in commands or getattr(args, "action", "") is None:
            parser.print_help()
            return USAGE
        if _embedded_cluster(args):  # before this process starts a thread or reads a key
            from secure_release.curator.cluster.forkserver import start_forkserver

            start_forkserver(in_process=program)
        if getattr(args, "engine", "local") == "dask":  # after the forkserver: not inherited by the workers
            return_freed_memory_promptly()
        setup_logging(log_format=log_format)
        metrics.start_metrics(metrics_address, "curator")
        with bad_rows_to(getattr(args, "bad_rows", None)):  # refused rows: every cell to the owner's file
            return _dispatch(args)

    return run_main("secure-release-curator", body, usage_errors=USAGE_ERRORS)


def _embedded_cluster(args: argparse.Namespace) -> bool:
    """Whether this command runs a release on an embedded Dask cluster (whose workers are
    forks of a server started first: :func:`~secure_release.curator.cluster.forkserver.start_forkserver`)."""
    no_scheduler = getattr(args, "scheduler", None) is None and getattr(args, "scheduler_file", None) is None
    return args.command == "run" and getattr(args, "engine", None) == "dask" and no_scheduler


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "budget":
        return budget(args)
    if args.command == "release":
        return release(args)
    if args.command == "table":
        return table(args)
    from secure_release.curator.config import config_from_args

    if args.command == "store-table":
        from secure_release.curator.release.stored import store_table

        return store_table(config_from_args(args, storing=True))
    config = config_from_args(args)
    if config.server_sampled:
        from secure_release.curator.release.stored import run_server_sampled

        return run_server_sampled(config)
    from secure_release.curator.release.runner import run

    return run(config)
