"""The prepare step: this curator's part of the agreed release. Its rows are aligned to the
common tags (in this process, or gathered on its cluster), the agreed m rows sampled (from the
seed or the leader's index tuple) and encrypted under a fresh pad, and pad, sample and table
fingerprint persisted (0600, fsync) before anything is uploaded. A release prepared before a
restart is resumed from that record instead (:func:`resume`).

A designed release (``--design``, ``spec.tables``): the sample is split in order into the tables'
rows, and in table t's rows the record holds (and the pad, one segment a table, encrypts) the
symbol of this curator's attributes in table t (:func:`designed_column`), in process or as the
cluster's sample file is written."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np

from secure_release.curator.cluster.aligned import AlignedPieces
from secure_release.curator.cluster.matching import ClusterLeader
from secure_release.curator.cluster.sample import sample_runs
from secure_release.curator.cluster.sharded import ShardedTable
from secure_release.curator.config import CuratorConfig
from secure_release.curator.leader import LeaderState
from secure_release.curator.records.keystore import Keystore, ReleaseRecord, SampleFile
from secure_release.curator.release.agreement_checks import own_alignment
from secure_release.curator.release.aligning import OwnData
from secure_release.infra.logs import EventLog, peak_rss_mib
from secure_release.infra.memory import release_free_memory
from secure_release.infra.streams import AgreementError
from secure_release.mechanism.alignment import sharding as sh
from secure_release.mechanism.alignment.keyed_hash import RowOrder
from secure_release.mechanism.primitives.keys import PadKey
from secure_release.mechanism.primitives.pads import new_release_pad
from secure_release.mechanism.protocol.architectures import (
    SamplingMode,
    VariantAgreement,
    agreement_positions,
    sample_fingerprint,
)
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.protocol.tables import TablesPlan, project_rows
from secure_release.mechanism.schema import SymbolArray


class PrepareSettings(NamedTuple):
    """What the prepare step reads of the config."""

    name: str  # this curator: its row order in the leader's agreement
    dataset: str  # recorded with the release: the ledger's key of its budget
    test_pad_key: PadKey | None  # tests only: a fixed pad key
    design: TablesPlan | None = None  # --design: the tables whose attributes each row carries
    design_json: bytes = b""  # the design file, kept with the record (the researcher gets it with the key)

    @classmethod
    def of(cls, config: CuratorConfig) -> PrepareSettings:
        """These fields of ``config``."""
        return cls(config.name, config.dataset, config.test_pad_key, config.design, config.design_json)


def prepare_own_part(
    settings: PrepareSettings,
    own: OwnData,
    agreement: VariantAgreement,
    state: LeaderState | None,
    keystore: Keystore,
    log: EventLog,
) -> ReleaseRecord:
    """:func:`prepare` this curator's part of ``agreement``: on a cluster from the runs its engine
    gathered (:func:`cluster_pieces`), else from ``own``'s table, aligned here (a leader reuses
    the row order it matched); the record persisted."""
    if own.sharded is not None:
        return prepare(settings, own, agreement, keystore, log, pieces=cluster_pieces(own, agreement, state))
    leader_rows = state.rows_of(settings.name) if state is not None else None
    return prepare(settings, own, agreement, keystore, log, leader_rows)


def prepare(
    settings: PrepareSettings,
    own: OwnData,
    agreement: VariantAgreement,
    keystore: Keystore,
    log: EventLog,
    leader_rows: RowOrder | None = None,
    aligned: SymbolArray | None = None,
    pieces: AlignedPieces | None = None,
) -> ReleaseRecord:
    """Align to the common tags, take the agreed m rows (from the seed, or the leader's index
    tuple), encrypt them under a fresh pad and persist pad, sample and table fingerprint (0600,
    fsync) before anything is uploaded. ``aligned``: the symbols of the common rows in canonical
    order, as a cluster gathered them (then nothing is aligned here); ``pieces``: the same left
    on the cluster, sampled there into the record's sample file (seed sampling)."""
    spec = agreement.base.spec
    column = designed_column(settings, spec)
    sample_file: SampleFile | None = None
    if pieces is not None:
        sample_file = sample_pieces(own, agreement, keystore, pieces, log, column)
        sample = np.zeros(0, dtype=np.uint32)
    elif aligned is not None:
        sample = column(sample_aligned(own, agreement, aligned, log), 0)
    else:
        sample = column(sample_table(own, agreement, leader_rows, log), 0)
    pad = new_release_pad(spec.cipher, own.alphabet_size, spec.m, settings.test_pad_key,
                          segments=spec.segments_of(settings.name))  # fmt: skip
    fingerprint = sample_fingerprint(agreement)
    record = ReleaseRecord(spec, pad, sample, own.fingerprint, settings.dataset, fingerprint,
                           sampling=agreement.sampling, sample_file=sample_file,
                           design_json=settings.design_json)  # fmt: skip
    keystore.save_record(record)
    log(
        "prepared",
        release_id=spec.release_id,
        m=spec.m,
        sampling=agreement.sampling.value,
        sampling_randomness=agreement.sampling.randomness,
        sample_fingerprint=fingerprint,
        peak_rss_mib=peak_rss_mib(),
    )
    return record


#: A curator's sampled symbols at rows [first_row, ...) as the column it encrypts.
Column = Callable[[SymbolArray, int], SymbolArray]


def designed_column(settings: PrepareSettings, spec: ReleaseSpec) -> Column:
    """What this curator encrypts of its sampled symbols at rows [first_row, ...): the symbols
    themselves (the whole joint), or in a designed release (``spec.tables``) in each table's rows
    the symbol of its attributes in that table (``tables.project_rows``, vectorized)."""
    if not spec.designed:
        return lambda sample, first_row: sample
    design = settings.design
    if design is None or design.digest != spec.design_digest:  # check_agreement refused this already
        raise AgreementError(f"the spec is of design {spec.design_digest}, this curator runs "
                             f"{design.digest if design is not None else 'none'}")  # fmt: skip
    schema, attributes = design.schema_of(settings.name), design.table_attributes
    return lambda sample, first_row: project_rows(sample, schema, attributes, spec.tables, first_row)


def _columns(runs: Iterable[SymbolArray], column: Column) -> Iterator[SymbolArray]:
    """``runs`` (the sample in order, a piece at a time) as ``column`` makes each piece."""
    first_row = 0
    for run in runs:
        yield column(run, first_row)
        first_row += int(run.size)


def sample_pieces(
    own: OwnData, agreement: VariantAgreement, keystore: Keystore, pieces: AlignedPieces, log: EventLog,
    column: Column | None = None,
) -> SampleFile:  # fmt: skip
    """The agreed rows of ``pieces`` (the aligned column left on the cluster) sampled there by
    seed into the release's sample file (as ``column`` makes them: a designed release's file holds
    each table's projected symbols, as the in-process record does); the pieces released."""
    spec = agreement.base.spec
    log("aligned", matched=pieces.num_rows, rows=own.sharded.num_rows if own.sharded else None,
        runs=len(pieces.sizes), peak_rss_mib=peak_rss_mib())  # fmt: skip
    if agreement.sampling is not SamplingMode.SEED:  # config refuses --sampling indices on a cluster
        raise AgreementError("a curator on a cluster samples by seed only (--sampling seed)")
    runs: Iterable[SymbolArray] = sample_runs(pieces, agreement.base.seed, spec.release_id, spec.m, log)
    if column is not None:
        runs = _columns(runs, column)
    sample_file = keystore.write_sample(spec.release_id, runs, own.alphabet_size)
    pieces.release()
    return sample_file


def sample_aligned(own: OwnData, agreement: VariantAgreement, aligned: SymbolArray, log: EventLog) -> SymbolArray:
    """The agreed rows of ``aligned`` (the common rows' symbols in canonical order)."""
    log("aligned", matched=int(aligned.size), rows=own.sharded.num_rows if own.sharded else None,
        peak_rss_mib=peak_rss_mib())  # fmt: skip
    positions = agreement_positions(agreement)
    sample = aligned[positions].astype(np.uint32)
    del positions  # 8 bytes a sampled row, not needed for the pad and the record
    release_free_memory()
    return sample


def sample_table(
    own: OwnData, agreement: VariantAgreement, leader_rows: RowOrder | None, log: EventLog
) -> SymbolArray:
    """The agreed rows of ``own``'s table, aligned here: to the common tags, or in the row order
    the leader computed (a follower checks it)."""
    assert own.table is not None
    if agreement.own_rows is None and leader_rows is None:  # match the common tags ourselves
        alignment = own_alignment(agreement, own.tags, own.sorted_tags)
    else:  # the row order the leader computed (a follower checks it)
        alignment = own_alignment(agreement, own.tags, leader_rows=leader_rows)
    release_free_memory()
    log(
        "aligned",
        matched=alignment.num_matched,
        unmatched=alignment.num_unmatched,
        rows=alignment.num_rows,
        peak_rss_mib=peak_rss_mib(),
    )
    positions = agreement_positions(agreement)
    return own.table.symbols()[alignment.row_order[positions]]  # gathers m rows, not n


def cluster_pieces(own: OwnData, agreement: VariantAgreement, state: LeaderState | None) -> AlignedPieces:
    """The aligned column as runs left on the cluster: the leader's own matched symbols, shard
    by shard, or the runs a follower's workers gathered as its row order arrived."""
    assert own.sharded is not None
    if isinstance(state, ClusterLeader):
        assert state.engine is not None
        dtype = sh.symbol_dtype(own.sharded.alphabet_size)
        return state.aligned_pieces(dtype)
    sink = own.rows_sink
    if sink is None or sink.pieces is None or agreement.count is None:
        raise AgreementError("the leader sent the common tags, not this curator's row order; a curator on a "
                             "cluster needs its rows (upgrade the leader)")  # fmt: skip
    return sink.pieces


def cluster_aligned(
    sharded: ShardedTable, agreement: VariantAgreement, state: LeaderState | None, log: EventLog
) -> SymbolArray:
    """The symbols of the common rows in canonical order, gathered on the cluster: the leader's
    own (it matched them there), or a follower's in the row order the leader sent (store-table)."""
    if isinstance(state, ClusterLeader):
        return state.own_aligned()
    if agreement.own_rows is None:
        raise AgreementError("the leader sent the common tags, not this curator's row order; a curator on a "
                             "cluster needs its rows (upgrade the leader)")  # fmt: skip
    return sharded.aligned_symbols(agreement.own_rows, log)


def resume(release_id: str, state: LeaderState | None, record: ReleaseRecord, log: EventLog) -> ReleaseRecord:
    """A release this curator prepared before it stopped: ``record`` as stored (a leader hands its
    restored agreement to the followers again)."""
    log("resumed", release_id=release_id, retention_until=record.retention_until)
    if state is not None:
        state.publish()
    return record
