"""The align step: the tags the curators align their rows on. With keyed-hash alignment the ids
are hashed when the run opens, in this process (:func:`hashed_tags`) or sharded on the curator's
engine (:func:`shard_table`); with ``--alignment psi`` the ids become points (:func:`psi_points`
on a cluster) and then tags through the ECDH ring with the leader (:func:`align_ids`). The tags,
the table and its fingerprint travel on as :class:`OwnData`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from secure_release.curator.cluster.aligned import ShardRowSink
from secure_release.curator.cluster.engine import Engine
from secure_release.curator.cluster.matching import ClusterLeader
from secure_release.curator.cluster.sharded import ShardedTable
from secure_release.curator.config import CuratorConfig
from secure_release.curator.leader import LeaderState
from secure_release.curator.release.follower import TagSource, cluster_workers
from secure_release.curator.table import EncodedTable, TableSpec, raise_repeats
from secure_release.curator.waits import Deadline
from secure_release.infra.logs import EventLog
from secure_release.infra.memory import release_free_memory
from secure_release.mechanism.alignment.keyed_hash import (
    TAG_DTYPE,
    DuplicateIdError,
    SortedTags,
    TagArray,
    has_repeated_tag,
    sort_tags,
)
from secure_release.mechanism.alignment.psi import PsiKey
from secure_release.mechanism.primitives.keys import AlignmentKey
from secure_release.mechanism.protocol.architectures import AlignmentMode
from secure_release.mechanism.protocol.in_memory import CuratorTable, curator_tags


@dataclass(frozen=True)
class OwnData:
    """This curator's table, its fingerprint and the keyed tags of its ids."""

    table: CuratorTable | None  # None on a cluster: the rows are ``sharded``
    tags: TagArray
    fingerprint: str = ""
    sorted_tags: SortedTags | None = None  # the tags sorted for align (and the repeat check)
    sharded: ShardedTable | None = None  # --engine dask: the rows as tag shards on the cluster
    rows_sink: ShardRowSink | None = None  # a follower on a cluster: its row order, gathered as it arrives
    psi_key: PsiKey | None = None  # PSI on a cluster: the key ``sharded``'s points are blinded with
    psi_kept: bool = False  # ... kept from an earlier run of this follower (the ring resumes)

    @property
    def alphabet_size(self) -> int:
        """Number of symbols of this curator's joint attribute code."""
        if self.table is None:
            assert self.sharded is not None
            return self.sharded.alphabet_size
        return self.table.schema.alphabet_size

    def tag_source(self) -> TagSource:
        """The tags as :func:`agree` sends them: the array, or the shards one at a time."""
        return self.sharded.tag_pieces if self.sharded is not None else self.tags


class TableSource(NamedTuple):
    """What reading the table and hashing its ids read of the config."""

    data: Path
    query: str | None  # --query: SQL on a DuckDB --data file
    alignment_key: AlignmentKey | None  # None with --alignment psi

    @classmethod
    def of(cls, config: CuratorConfig) -> TableSource:
        """These fields of ``config``."""
        return cls(config.data, config.query, config.alignment_key)


def hashed_tags(source: TableSource, table: CuratorTable) -> tuple[CuratorTable, SortedTags]:
    """The table without its ids and its keyed tags, sorted for :func:`align` (the sort the
    leader's matching reuses); :class:`BadRowsError` (every repeated id with its lines) if two
    tags are equal, before any tag leaves this process. ``table`` must have been read with
    ``check_repeats=False`` or checked already (a repeat costs no second hash and sort here)."""
    assert source.alignment_key is not None
    sorted_tags = sort_tags(curator_tags(table, source.alignment_key))
    if isinstance(table, EncodedTable):
        if has_repeated_tag(sorted_tags):
            raise_repeats(source.data, table, source.query)
        table = table.without_ids()  # hashed: the ids are not needed again
    elif has_repeated_tag(sorted_tags):
        raise DuplicateIdError("an id occurs more than once in this curator's table; ids must be unique")
    release_free_memory()
    return table, sorted_tags


def own_data(source: TableSource, table: CuratorTable, fingerprint: str) -> OwnData:
    """``table`` with the keyed tags of its ids (:func:`hashed_tags`); with PSI no tags yet (the
    ring computes them once the release is set up; a resume needs none)."""
    if source.alignment_key is None:
        return OwnData(table, np.zeros(0, dtype=TAG_DTYPE), fingerprint)
    table, sorted_tags = hashed_tags(source, table)
    return OwnData(table, sorted_tags.tags, fingerprint, sorted_tags)


class ClusterSettings(NamedTuple):
    """What starting the curator's engine and sharding its table read of the config."""

    engine: str  # --engine
    scheduler: str | None
    scheduler_file: str | None
    workers: int | None
    worker_memory: str
    keystore: Path  # the embedded workers spill under it
    shard_bits: int | None
    timeout: float | None = None  # the run's --timeout: a stage on the cluster waits no longer
    release_id: str = "release"  # names the engine's store of this release's shards (under the keystore)
    shard_store: str = "auto"  # --shard-store

    @classmethod
    def of(cls, config: CuratorConfig) -> ClusterSettings:
        """These fields of ``config``."""
        return cls(config.engine, config.scheduler, config.scheduler_file, config.workers, config.worker_memory,
                   config.keystore, config.shard_bits, config.timeout, config.release_id,
                   config.shard_store)  # fmt: skip


def start_engine(settings: ClusterSettings, log: EventLog, stop: threading.Event | None = None) -> Engine:
    """The engine ``--engine`` names, its workers warmed up (the stage modules imported); ``stop``
    (SIGTERM) ends any stage it waits for within a second."""
    from secure_release.curator.cluster.engine import open_engine

    return open_engine(settings.engine, scheduler=settings.scheduler, scheduler_file=settings.scheduler_file,
                       workers=settings.workers, worker_memory=settings.worker_memory, log=log,
                       spill_dir=spill_dir(settings.keystore), stop=stop, timeout_s=settings.timeout)  # fmt: skip


def spill_dir(keystore: Path) -> str:
    """Where an embedded cluster's workers spill (tags and symbols): ``<keystore>/dask-spill``,
    0700 like the keystore, never a shared /tmp."""
    path = Path(keystore) / "dask-spill"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return str(path)


def shard_table(
    cluster: ClusterSettings, source: TableSource, log: EventLog, spec: TableSpec, state: LeaderState | None,
    engine: Engine | None = None, stop: threading.Event | None = None,
) -> ShardedTable:  # fmt: skip
    """The table read, hashed and sharded by the curator's engine (started here unless given;
    closed again if that fails); a cluster leader spools its followers' tags in the keystore
    directory."""
    from secure_release.curator.cluster.sharded import load_sharded

    assert source.alignment_key is not None
    engine = engine if engine is not None else start_engine(cluster, log, stop)
    try:
        sharded = load_sharded(engine, str(source.data), spec, source.alignment_key, log, cluster.shard_bits,
                               store_parent=spill_dir(cluster.keystore), store_name=cluster.release_id,
                               keep_in=cluster.shard_store)  # fmt: skip
    except BaseException:
        engine.close()
        raise
    if isinstance(state, ClusterLeader):
        state.attach(sharded, cluster.keystore)
    return sharded


def psi_points(
    config: CuratorConfig, log: EventLog, spec: TableSpec, state: LeaderState | None, engine: Engine | None,
    fingerprint: str,
) -> OwnData:  # fmt: skip
    """PSI on a cluster: the table read, checked and blinded into point shards under this
    release's PSI key (:func:`~secure_release.curator.cluster.ring.load_points`; the key this
    curator kept if it ran before, the leader's too); nothing on a resume (no ``engine``)."""
    from secure_release.curator.cluster.ring import load_points
    from secure_release.curator.release.psi_ring import ring_key

    if engine is None:
        return OwnData(None, np.zeros(0, dtype=TAG_DTYPE), fingerprint)
    try:
        key, kept = ring_key(config, state)
        points = load_points(engine, str(config.data), spec, key, len(config.curators), log, config.shard_bits)
    except BaseException:
        engine.close()
        raise
    return OwnData(None, np.zeros(0, dtype=TAG_DTYPE), fingerprint, None, points, psi_key=key, psi_kept=kept)


def align_ids(
    config: CuratorConfig, own: OwnData, state: LeaderState | None, restored_tags: TagArray | None,
    deadline: Deadline, log: EventLog,
) -> OwnData:  # fmt: skip
    """The align step: with ``--alignment psi``, ``own`` with its PSI tags (on a cluster
    :func:`cluster_psi`, else :func:`psi_tags`); with keyed-hash tags (made when the run opened)
    ``own`` as it is."""
    if config.alignment is AlignmentMode.PSI and own.sharded is not None:
        own = cluster_psi(config, own, state, deadline, log)
    elif config.alignment is AlignmentMode.PSI:
        own = replace(own, tags=psi_tags(config, own.table, state, restored_tags, deadline, log))
    return own


def psi_tags(
    config: CuratorConfig,
    table: CuratorTable | None,
    state: LeaderState | None,
    restored_tags: TagArray | None,
    deadline: Deadline,
    log: EventLog,
) -> TagArray:
    """This curator's PSI tags (of ``table``'s ids): from the ECDH ring through the leader, or (a
    leader resuming a fixed agreement) ``restored_tags``, the tags it persisted with it (its
    kept scalar may be gone by then)."""
    from secure_release.curator.release.psi_ring import run_ring

    if restored_tags is not None:
        return restored_tags
    if state is not None and state.agreement is not None:
        from secure_release.curator.records.keystore import KeystoreError

        raise KeystoreError(f"the stored agreement of {config.release_id!r} lacks the leader's own PSI tags")
    assert table is not None
    return run_ring(config, table.ids, state, log, deadline)


def cluster_psi(config: CuratorConfig, own: OwnData, state: LeaderState | None, deadline: Deadline,
                log: EventLog) -> OwnData:  # fmt: skip
    """The PSI ring on this curator's cluster: ``own``'s point shards become its PSI tag shards
    (:func:`~secure_release.curator.release.psi_ring.run_cluster_ring`), which the agreement then
    uses as a keyed-hash curator's (a leader spools its follower's tags against them)."""
    from secure_release.curator.release.psi_ring import run_cluster_ring

    assert own.sharded is not None and own.psi_key is not None
    workers = cluster_workers(own.sharded.engine)
    tags = run_cluster_ring(config, own.sharded, own.psi_key, own.psi_kept, state, log, deadline, workers)
    if isinstance(state, ClusterLeader):
        state.attach(tags, config.keystore)
    return replace(own, sharded=tags, rows_sink=None if state is not None else ShardRowSink(tags), psi_key=None)
