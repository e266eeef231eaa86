"""The curator's settings as one typed value, built once from flags, ``SECURE_RELEASE_<FLAG>``
environment variables and ``--config file.json`` (flags win over env, env over the file).

Secrets never sit in a config file or on the command line: the alignment key comes from
``--alignment-key-file`` or the environment variable SECURE_RELEASE_ALIGNMENT_KEY (argv is visible
in /proc/PID/cmdline), and a config file holding a secret setting is refused. The privacy budget
is not a run setting at all: ``budget set`` records it in the ledger.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from secure_release.curator.errors import DesignFileError
from secure_release.curator.partitions import dataset_name, require_data
from secure_release.curator.postgres import is_database_url, register_query, set_password_file
from secure_release.curator.table import load_schema
from secure_release.infra.config import ConfigError, require, split_address, testing_enabled
from secure_release.infra.designfile import read_design as read_design_file
from secure_release.infra.fileio import require_dir, require_file
from secure_release.infra.streams import MAX_TAG_PARTS
from secure_release.mechanism.alignment.psi import PsiKey
from secure_release.mechanism.analysis.design import Design
from secure_release.mechanism.errors import (
    DesignMismatchError,
    InvalidQuestionError,
    SecureReleaseError,
    UnknownCipherError,
)
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.accounting import check_epsilon
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode, UnknownVariantError
from secure_release.mechanism.protocol.server_sampling import TableKey
from secure_release.mechanism.protocol.spec import DEFAULT_MAX_EPSILON, check_name, check_names, check_party_name
from secure_release.mechanism.protocol.tables import TablesPlan
from secure_release.mechanism.schema import CuratorSchema

#: Settings that hold secrets: allowed as flags or environment, never in a --config file.
SECRET_SETTINGS = frozenset(
    {
        "alignment_key",
        "alignment_key_hex",
        "insecure_test_seed",
        "insecure_test_pad_key",
        "insecure_test_psi_key",
        "insecure_test_table_key",
    }
)
ALIGNMENT_KEY_ENV = "SECURE_RELEASE_ALIGNMENT_KEY"
DEFAULT_KEY_RETENTION_S = 7 * 24 * 3600.0
REQUIRED = ("data", "schema", "release_id", "epsilon", "curators", "server", "name")
#: ``run --sampling server``: a release from a stored table needs no data file and no leader.
REQUIRED_SERVER_SAMPLED = ("table_id", "release_id", "epsilon", "curators", "server", "name")
#: ``store-table``: the alignment of a release, without a release.
REQUIRED_STORE = ("table_id", "data", "schema", "curators", "server", "name")
#: Why the positions key path (the researcher decrypts with long-lived table keys at the stored
#: positions) is not offered across the services (docs/architectures.md section 3).
POSITIONS_PATH_REFUSAL = (
    "only the rekeyed key path runs across the services; the positions path stays in memory "
    "(mechanism.protocol.server_sampling): positions repeat across releases of one table, so the researcher "
    "would see which rows two releases share, which costs more than epsilon_1 + epsilon_2 for some overlaps "
    "(above m1 m2 / n for a binary joint alphabet, below it too for K >= 3, where no bound is proved; the "
    "ledger's pure-DP budget no longer holds), and a long-lived table key "
    "in the researcher's hands would take away each curator's power to refuse a later release"
)

#: Why ``--design`` is refused with server-side sampling.
DESIGN_SERVER_SAMPLED = (
    "--design releases tables from disjoint samples the curators draw themselves; server-side sampling "
    "(--sampling server, store-table) is not supported for a designed release: run it with --sampling seed or indices"
)


@dataclass(frozen=True)
class CuratorConfig:
    """Everything one curator run needs; secrets are held as redacting key types."""

    name: str
    release_id: str
    epsilon: float
    m: int | None
    cipher: CipherMode
    curators: tuple[str, ...]  # joint-code order
    leader: bool
    leader_address: str | None  # followers only
    expected_sizes: tuple[int, ...] | None  # leader only: --alphabet-sizes cross-check
    notify: str  # the researcher the server notifies (--researcher)
    grants: tuple[str, ...]  # researchers allowed to fetch this curator's key
    data: Path
    schema: Path
    dataset: str  # the data set (the population): the ledger's budget key ("": a stored table's own name)
    keystore: Path
    server: str
    certs: Path | None
    listen_host: str
    listen_port: int
    port_file: str | None
    insecure: bool
    timeout: float
    exit_after_keys: bool  # exit once every granted researcher acknowledged the key (not --serve-until-stopped)
    alignment_key: AlignmentKey | None  # None only with --alignment psi (no shared key needed)
    key_retention: float = DEFAULT_KEY_RETENTION_S  # seconds keys are served after sealing
    max_rows: int = 1 << 24  # leader: tags a follower may send (as --max-rows)
    test_seed: Seed | None = None
    test_pad_key: PadKey | None = None
    sampling: SamplingMode = SamplingMode.SEED  # --sampling: seed or indices (must agree)
    query: str | None = None  # --query: SQL on a DuckDB --data file or a postgresql:// database (read_table)
    alignment: AlignmentMode = AlignmentMode.KEYED_HASH  # --alignment: hash or psi (must agree)
    test_psi_key: PsiKey | None = None
    psi_workers: int = 1  # --psi-workers: processes sharing this curator's PSI work
    psi_slice_points: int | None = None  # --psi-slice-points: a ring list's slice on a cluster (None: 65536)
    table_id: str | None = None  # server-side sampling: the stored table (store-table or run --sampling server)
    storing: bool = False  # store-table: align and upload the whole encrypted column once
    test_table_key: TableKey | None = None
    max_epsilon: float = DEFAULT_MAX_EPSILON  # --max-epsilon: this curator's cap on one release
    engine: str = "local"  # --engine: local (in-process) or dask (the curator's own cluster)
    scheduler: str | None = None  # --scheduler: the curator's running Dask scheduler
    scheduler_file: str | None = None  # --scheduler-file: its scheduler file
    workers: int | None = None  # --workers: an embedded cluster's worker processes
    worker_memory: str = "2GiB"  # --worker-memory: each embedded worker's memory limit
    shard_bits: int | None = None  # --shards (log2): tag shards (default about 10^6 tags a shard)
    shard_store: str = "auto"  # --shard-store: where an embedded cluster keeps the shards (auto, disk, memory)
    tag_streams: int = 0  # --tag-streams: a follower's concurrent tag streams (0: the cluster's workers, at most 8)
    design: TablesPlan | None = None  # --design: a release of the design's tables (its digest must agree)
    design_json: bytes = b""  # the design file's canonical JSON: sent to the researcher with the key

    @property
    def design_digest(self) -> str:
        """The digest of the design this curator runs (``--design``); "" for the whole joint."""
        return self.design.digest if self.design is not None else ""

    @property
    def server_sampled(self) -> bool:
        """``run --sampling server``: a release the server samples from stored table ``table_id``."""
        return self.table_id is not None and not self.storing

    @property
    def researchers(self) -> tuple[str, ...]:
        """The spec's researchers: the one the server notifies first, then the grants."""
        return tuple(dict.fromkeys((self.notify, *self.grants)))


def parse_cipher(text: str) -> CipherMode:
    """``otp`` or ``chacha20`` (any case); else :class:`UnknownCipherError`."""
    try:
        return CipherMode(str(text).lower())
    except ValueError:
        allowed = ", ".join(mode.value for mode in CipherMode)
        raise UnknownCipherError(f"unknown cipher {text!r}; allowed: {allowed}") from None


def parse_sampling(text: str) -> SamplingMode:
    """``--sampling``: ``seed`` (pseudorandom, from a 32-byte seed) or ``indices`` (the leader
    ships the OS-drawn ordered tuple); else a :class:`ConfigError`."""
    try:
        return SamplingMode.parse(str(text))
    except UnknownVariantError as exc:
        raise ConfigError(f"--sampling: {exc}") from None


def parse_alignment(text: str) -> AlignmentMode:
    """``--alignment``: ``hash`` (keyed-hash tags, also spelled ``keyed-hash``) or ``psi``."""
    text = str(text).lower()
    try:
        return AlignmentMode.KEYED_HASH if text == "hash" else AlignmentMode.parse(text)
    except UnknownVariantError:
        raise ConfigError(f"--alignment: unknown alignment {text!r}; allowed: hash, psi") from None


def parse_names(text: str, what: str, minimum: int = 0) -> tuple[str, ...]:
    """A comma-separated list of distinct names following the name grammar."""
    return check_names([part.strip() for part in str(text).split(",") if part.strip()], what, minimum)


def parse_sizes(text: str | None, curators: tuple[str, ...]) -> tuple[int, ...] | None:
    """``--alphabet-sizes``: one integer >= 2 per curator, comma separated (None if unset)."""
    if not text:
        return None
    try:
        sizes = tuple(int(s) for s in str(text).split(","))
    except ValueError:
        raise ConfigError(f"--alphabet-sizes must be comma-separated integers, got {text!r}") from None
    if len(sizes) != len(curators) or min(sizes) < 2:
        raise ConfigError(
            f"--alphabet-sizes needs one integer >= 2 for each of the {len(curators)} curators "
            f"{list(curators)}, got {list(sizes)}"
        )
    return sizes


def check_config_file(path: str | None) -> None:
    """Refuse a --config file that holds a secret setting (its value is never echoed)."""
    if not path:
        return
    try:
        data: Any = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a JSON object of flag names, got {type(data).__name__}")
    secrets = sorted(k for k in data if str(k).replace("-", "_") in SECRET_SETTINGS)
    if secrets:
        raise ConfigError(
            f"--config {path} holds secret setting(s) {secrets}; a config file is no place for "
            "secrets: use --alignment-key-file FILE (0600) or the SECURE_RELEASE_<FLAG> environment"
        )


def _alignment_key(args: argparse.Namespace, mode: AlignmentMode) -> AlignmentKey | None:
    """From ``--alignment-key-file`` or SECURE_RELEASE_ALIGNMENT_KEY, never from argv (not
    needed, hence None, with ``--alignment psi``)."""
    if mode is AlignmentMode.PSI:
        return None
    if args.alignment_key_file:
        return AlignmentKey.from_hex(require_file(args.alignment_key_file, "--alignment-key-file").read_text().strip())
    env = os.environ.get(ALIGNMENT_KEY_ENV, "").strip()
    if env:
        return AlignmentKey.from_hex(env)
    raise ConfigError(
        "the curators must share an alignment key: pass --alignment-key-file FILE (64 hex digits, "
        f"same content at every curator) or set {ALIGNMENT_KEY_ENV}; never give it to the server or researcher"
    )


def _test_table_key(args: argparse.Namespace) -> TableKey | None:
    text = getattr(args, "insecure_test_table_key", None)
    if not text:
        return None
    if not testing_enabled():
        raise ConfigError("--insecure-test-* flags are allowed only with SECURE_RELEASE_TESTING=1")
    return TableKey.from_hex(text)


def _test_secrets(args: argparse.Namespace) -> tuple[Seed | None, PadKey | None, PsiKey | None]:
    psi_hex = getattr(args, "insecure_test_psi_key", None)
    if not (getattr(args, "insecure_test_seed", None) or getattr(args, "insecure_test_pad_key", None) or psi_hex):
        return None, None, None
    if not testing_enabled():
        raise ConfigError("--insecure-test-* flags are allowed only with SECURE_RELEASE_TESTING=1")
    seed_hex, pad_hex = getattr(args, "insecure_test_seed", None), getattr(args, "insecure_test_pad_key", None)
    seed = Seed.from_hex(seed_hex) if seed_hex else None
    pad_key = PadKey.from_hex(pad_hex) if pad_hex else None
    psi_key = PsiKey.from_hex(psi_hex) if psi_hex else None
    return seed, pad_key, psi_key


def _role_settings(args: argparse.Namespace, name: str) -> tuple[bool, str | None]:
    leader, address = bool(args.leader), args.leader_address or None
    if leader and address:
        raise ConfigError("--leader and --leader-address exclude each other: the leader listens, followers call it")
    if not leader and not address:
        raise ConfigError(f"{name} does not lead (--leader), so it needs --leader-address HOST:PORT")
    return leader, address


#: ``--max-rows`` by default: what an in-process leader holds (16 bytes a tag in memory), and
#: what a leader on a cluster spools (20 bytes a tag on disk; row orders go out as uint32).
DEFAULT_MAX_ROWS = {"local": 1 << 24, "dask": 1 << 30}


def _max_rows(value: int | None, engine: str = "local") -> int:
    if value is None:
        return DEFAULT_MAX_ROWS.get(engine, 1 << 24)
    if value < 1 or value >= 1 << 32:
        raise ConfigError(f"--max-rows must be an integer from 1 to 2^32 - 1 (row orders are uint32), got {value}")
    return int(value)


def _psi_workers(value: int) -> int:
    if not 1 <= value <= 64:
        raise ConfigError(f"--psi-workers must be an integer from 1 to 64, got {value}")
    return int(value)


def _psi_slice_points(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 1 << 20:
        raise ConfigError(f"--psi-slice-points must be an integer from 1 to 1048576 (32 MiB a slice), got {value}")
    return None if value is None else int(value)


def _positive(value: float, flag: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{flag} must be a finite number > 0, got {value!r}")
    return float(value)


def _server_sampled_settings(args: argparse.Namespace) -> None:
    """``run --sampling server``: only the rekeyed key path; a stored table, no data file."""
    key_path = str(getattr(args, "key_path", None) or "rekeyed").lower()
    if key_path != "rekeyed":
        raise ConfigError(f"--key-path {key_path}: {POSITIONS_PATH_REFUSAL}")
    require(args, *REQUIRED_SERVER_SAMPLED)


def _store_settings(args: argparse.Namespace) -> None:
    """``store-table``: the alignment runs as a release's would, under the table id, with
    placeholder release settings nobody registers (no sample is drawn from them)."""
    require(args, *REQUIRED_STORE)
    args.release_id = args.table_id
    args.epsilon, args.m, args.cipher = 1.0, None, "chacha20"


def config_from_args(args: argparse.Namespace, storing: bool = False) -> CuratorConfig:
    """The one typed config of a run (``args``: the ``run`` or ``store-table`` sub-command's
    parsed flags, env and config-file defaults already applied). Raises a named error for any
    bad setting."""
    server_sampled = not storing and str(getattr(args, "sampling", None) or "seed").lower() == "server"
    if getattr(args, "design", None) and (server_sampled or storing):
        raise ConfigError(DESIGN_SERVER_SAMPLED)
    if storing:
        _store_settings(args)
    elif server_sampled:
        _server_sampled_settings(args)
    else:
        require(args, *(r for r in REQUIRED if not (r == "epsilon" and getattr(args, "design", None))))
    if not args.insecure:
        require(args, "certs")
        require_dir(args.certs, "--certs")
    check_config_file(args.config)
    if getattr(args, "data", None) and (is_database_url(args.data) or not getattr(args, "query", None)):
        require_data(args.data, "--data", getattr(args, "query", None))
    _password_file_settings(args)
    if getattr(args, "schema", None):
        require_file(args.schema, "--schema")
    test_seed, test_pad_key, test_psi_key = _test_secrets(args)
    test_table_key = _test_table_key(args)
    plain = not (server_sampled or storing)
    sampling = parse_sampling(getattr(args, "sampling", None) or "seed") if plain else SamplingMode.SEED
    alignment = parse_alignment(getattr(args, "alignment", None) or "hash")
    name = check_party_name(args.name, "curator name")
    table_id = check_name(args.table_id, "table id") if storing or server_sampled else None
    # a release from a stored table needs no agreement between curators: the spec follows from the
    # table record, and the server binds it once every curator registered the same one
    leader, leader_address = (False, None) if server_sampled else _role_settings(args, name)
    if test_seed is not None and not leader:
        raise ConfigError("--insecure-test-seed is for the leading curator only (the leader picks the seed)")
    curators = parse_names(args.curators, "curator", minimum=2)
    if name not in curators:
        raise ConfigError(f"--curators must include this curator {name!r}, got {list(curators)}")
    if leader and curators[0] != name:
        raise ConfigError(f"the leader comes first in --curators (followers pin it by name), got {list(curators)}")
    if args.m is not None and args.m < 1:
        raise ConfigError(f"--m must be an integer >= 1 (or unset for m*), got {args.m}")
    host, port = split_address(args.listen)
    release_id = check_name(args.release_id, "release id")
    design, design_json = _design_settings(args, name, curators, server_sampled or storing)
    epsilon = check_epsilon(args.epsilon) if design is None else _design_epsilon(args, design)
    return CuratorConfig(
        name=name,
        release_id=release_id,
        epsilon=epsilon,
        m=args.m,
        cipher=parse_cipher(args.cipher),
        curators=curators,
        leader=leader,
        leader_address=leader_address,
        expected_sizes=parse_sizes(args.alphabet_sizes, curators) if leader else None,
        notify=check_party_name(args.researcher, "researcher"),
        grants=tuple(dict.fromkeys(check_party_name(g, "researcher") for g in args.grant if g)),
        data=Path(args.data or ""),
        query=getattr(args, "query", None) or None,
        schema=Path(args.schema or ""),
        dataset=_dataset_name(args, server_sampled),
        keystore=Path(args.keystore or f"keystore-{name}"),
        server=args.server,
        certs=Path(args.certs) if args.certs else None,
        listen_host=host,
        listen_port=port,
        port_file=args.port_file,
        insecure=bool(args.insecure),
        timeout=_positive(args.timeout, "--timeout"),
        exit_after_keys=not bool(getattr(args, "serve_until_stopped", False)),
        alignment_key=None if server_sampled else _alignment_key(args, alignment),
        key_retention=_positive(args.key_retention, "--key-retention"),
        max_rows=_max_rows(args.max_rows, str(getattr(args, "engine", None) or "local").lower()),
        test_seed=test_seed,
        test_pad_key=test_pad_key,
        sampling=sampling,
        alignment=alignment,
        test_psi_key=test_psi_key,
        table_id=table_id,
        storing=storing,
        test_table_key=test_table_key,
        psi_workers=_psi_workers(getattr(args, "psi_workers", 1)),
        psi_slice_points=_psi_slice_points(getattr(args, "psi_slice_points", None)),
        max_epsilon=_max_epsilon(args, epsilon),
        **_engine_settings(args, sampling, alignment, server_sampled, leader, len(curators)),
        design=design,
        design_json=design_json,
    )


def _design_settings(
    args: argparse.Namespace, name: str, curators: tuple[str, ...], server_side: bool
) -> tuple[TablesPlan | None, bytes]:
    """``--design FILE``: the design every curator of the release runs, read and checked before
    anything is sent: a release the curators sample (no stored table), no ``--m``, a schema for
    exactly the ``--curators``, this curator's the one it runs with (``--schema``), and tables
    that fit them. (None, b"") without the flag."""
    path = getattr(args, "design", None)
    if not path:
        return None, b""
    if server_side:
        raise ConfigError(DESIGN_SERVER_SAMPLED)
    if getattr(args, "m", None) is not None:
        raise ConfigError("--design fixes each table's m_t; give no --m with it")
    design = read_design(path)
    names = [s.name for s in design.schemas]
    if sorted(names) != sorted(curators):
        raise DesignMismatchError(
            f"the design in {path} is for the curators {names}, this release's --curators are {list(curators)}; "
            "every curator of the release runs the same design, made for exactly them"
        )
    mine = design.schemas[names.index(name)]
    if getattr(args, "schema", None):
        own = load_schema(Path(args.schema)).schema
        if own.attributes != mine.attributes:
            raise DesignMismatchError(
                f"the design in {path} holds another schema for {name!r} than --schema {args.schema}: the design's "
                f"{_attributes(mine)}, the schema's {_attributes(own)}; plan the design with this schema"
            )
    plan = TablesPlan(design.schemas, tuple(design.planned_tables()), design.epsilon, design.n, design.digest())
    plan.layouts(design.n, curators)  # the tables fit the schemas at the planned n (named errors)
    return plan, design.canonical_json()


def read_design(path: str | Path) -> Design:
    """The design in ``path`` (``infra.designfile.write_design``); :class:`DesignFileError` naming the file if
    it is missing, unreadable or not a design."""
    try:
        require_file(path, "--design")
        return read_design_file(path)
    except (ConfigError, InvalidQuestionError, KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = str(exc) if isinstance(exc, SecureReleaseError) else f"{type(exc).__name__}: {exc}"
        raise DesignFileError(
            f"--design {path} is not a readable design ({detail}); give the file `secure-release plan --question "
            "... --out FILE` (or api.save_design) wrote, the same at every curator"
        ) from None


def _attributes(schema: CuratorSchema) -> list[str]:
    return [f"{a.name}({len(a.categories)})" for a in schema.attributes]


def _design_epsilon(args: argparse.Namespace, design: TablesPlan) -> float:
    """A designed release's epsilon is the design's; a different --epsilon is refused by name."""
    if args.epsilon is not None and float(args.epsilon) != design.epsilon:
        raise DesignMismatchError(f"--epsilon {args.epsilon!r} differs from the design's total epsilon "
                                  f"{design.epsilon!r}; give the design's or none")  # fmt: skip
    return check_epsilon(design.epsilon)


_MEMORY_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*(B|[KMGT]i?B)?\s*$", re.IGNORECASE)


def _memory_size(text: str) -> str:
    """``--worker-memory``: a size such as 2GiB, 1500MB or 4e9 bytes written as 4000000000."""
    if not _MEMORY_SIZE.match(text):
        raise ConfigError(f"--worker-memory must be a size such as 2GiB, 1500MB or 4000000000 (bytes), got {text!r}")
    return text.strip()


#: Why index sharing and PSI stay on the in-process engine (measured on this 2-core machine).
ENGINE_REFUSALS = {
    "indices": "--sampling indices ships the packed index tuple through the leader (ceil(log2 n) bits a sampled "
    "row: 34 MB at m = 10^7, n = 10^8) and every follower holds and checks all of it; it has no sharded form yet: "
    "use --sampling seed (32 bytes whatever n) with --engine dask",
    "psi": "--alignment psi with three or more curators at a leader on --engine dask: the leader would match "
    "each follower's tags in that follower's own domain (docs/architectures.md section 2), which the cluster's "
    "matching does not do yet; lead with --engine local (--psi-workers N), or let only the followers use their "
    "clusters",
}


def _engine_settings(
    args: argparse.Namespace, sampling: SamplingMode, alignment: AlignmentMode, server_sampled: bool,
    leader: bool = False, num_curators: int = 2,
) -> dict[str, Any]:
    """``--engine`` and the cluster flags, checked: the modes the cluster runs, one way to
    name the scheduler, a power-of-two shard count."""
    engine = str(getattr(args, "engine", None) or "local").lower()
    if engine not in ("local", "dask"):
        raise ConfigError(f"--engine must be local or dask, got {engine!r}")
    scheduler = getattr(args, "scheduler", None) or None
    scheduler_file = getattr(args, "scheduler_file", None) or None
    if engine == "local" and (scheduler or scheduler_file):
        raise ConfigError("--scheduler and --scheduler-file need --engine dask")
    if scheduler and scheduler_file:
        raise ConfigError("--scheduler and --scheduler-file exclude each other: name the cluster one way")
    if engine == "dask":
        if sampling is SamplingMode.INDICES:
            raise ConfigError(f"--engine dask refuses {ENGINE_REFUSALS['indices']}")
        if alignment is AlignmentMode.PSI and leader and num_curators > 2:
            raise ConfigError(f"--engine dask refuses {ENGINE_REFUSALS['psi']}")
        if server_sampled:
            raise ConfigError("--sampling server reads no table: the server samples; run it without --engine dask")
        if getattr(args, "query", None) and not is_database_url(getattr(args, "data", None)):
            raise ConfigError(
                "--query reads a DuckDB database in this process; --engine dask reads files on its workers: export "
                "the query's result to Parquet (DuckDB: COPY (SELECT ...) TO 'people.parquet') and pass that as --data"
            )
    workers = getattr(args, "workers", None)
    if workers is not None and not 1 <= int(workers) <= 256:
        raise ConfigError(f"--workers must be an integer from 1 to 256, got {workers}")
    shards = getattr(args, "shards", None)
    shard_bits = None
    if shards is not None:
        shards = int(shards)
        if shards < 1 or shards & (shards - 1) or shards > 1 << 16:
            raise ConfigError(f"--shards must be a power of two from 1 to 65536, got {shards}")
        shard_bits = shards.bit_length() - 1
    return {
        "tag_streams": _tag_streams(getattr(args, "tag_streams", None), engine),
        "engine": engine,
        "scheduler": scheduler,
        "scheduler_file": scheduler_file,
        "workers": None if workers is None else int(workers),
        "worker_memory": _memory_size(str(getattr(args, "worker_memory", None) or "2GiB")),
        "shard_bits": shard_bits,
        "shard_store": str(getattr(args, "shard_store", None) or "auto"),
    }


def _tag_streams(value: int | None, engine: str) -> int:
    """``--tag-streams``: 0 (the default: one a worker of the cluster, at most 8), or 1 to
    :data:`MAX_TAG_PARTS`; the in-process engine has its tags in one array and sends one stream."""
    streams = 0 if value is None else int(value)
    if not 0 <= streams <= MAX_TAG_PARTS:
        raise ConfigError(f"--tag-streams must be an integer from 0 (one a worker) to {MAX_TAG_PARTS}, got {value}")
    if engine == "local" and streams > 1:
        raise ConfigError(
            f"--tag-streams {streams} needs --engine dask: the in-process engine sends its tags in one stream "
            "(--tag-streams 1, or leave it out)"
        )
    return streams


def _dataset_name(args: argparse.Namespace, server_sampled: bool) -> str:
    """``--dataset`` (a checked name), else the ``--data`` file's or directory's name (a glob's:
    its directory's; "" for a server-sampled release: the name its stored table was stored under)."""
    if args.dataset:
        return check_name(args.dataset, "--dataset")
    return "" if server_sampled else dataset_name(args.data, getattr(args, "query", None))


def _password_file_settings(args: argparse.Namespace) -> None:
    """``--data-password-file``: checked to be a file, and named to the PostgreSQL reader of this
    process (:func:`curator.postgres.set_password_file`; the password itself is read at connect);
    a database's ``--query`` registered for the readers handed only ``--data``."""
    path = getattr(args, "data_password_file", None) or None
    if path is not None:
        if not is_database_url(getattr(args, "data", None)):
            raise ConfigError("--data-password-file is the password of a --data postgresql:// database")
        require_file(path, "--data-password-file")
    set_password_file(path)
    if is_database_url(getattr(args, "data", None)):
        register_query(args.data, getattr(args, "query", None))


def _max_epsilon(args: argparse.Namespace, epsilon: float | None = None) -> float:
    """``--max-epsilon`` (finite, > 0), and the run's epsilon within it (:class:`ConfigError`;
    ``epsilon``: the run's, if not ``--epsilon``'s, e.g. a design's)."""
    cap = getattr(args, "max_epsilon", None)
    cap = DEFAULT_MAX_EPSILON if cap is None else float(cap)
    if not math.isfinite(cap) or cap <= 0:
        raise ConfigError(f"--max-epsilon must be a finite number > 0, got {cap!r}")
    epsilon = args.epsilon if epsilon is None else epsilon
    if epsilon is not None and float(epsilon) > cap:
        raise ConfigError(
            f"--epsilon {epsilon:g} exceeds this curator's cap of {cap:g} per release (--max-epsilon, default "
            f"{DEFAULT_MAX_EPSILON:g}); e^epsilon is the likelihood ratio an adversary may gain"
        )
    return cap
