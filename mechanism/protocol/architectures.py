"""The paper's other architectures (Sec. V-B) in memory, built from ``protocol``'s step functions.

- :func:`run_variant_release`: the curator-sampled release with a choice of sampling
  (``seed``: every curator derives the tuple from a shared 32-byte seed, pseudorandom;
  ``indices``: the leader draws the tuple from the OS CSPRNG and ships it packed: no seed
  expansion, exactly uniform if the OS randomness is) and of alignment (``keyed-hash``:
  AES-256-CMAC tags under a key all curators share, :mod:`mechanism.alignment.keyed_hash`, fast;
  ``psi``: the N-party ECDH PSI of :mod:`mechanism.alignment.psi`).
- :func:`run_server_sampled_release`: one encrypted upload of the whole aligned table, then any
  number of releases, each sampled and perturbed by the server and charged to the table's
  ledger (:mod:`mechanism.protocol.server_sampling`).

Step functions the services call, beyond ``protocol``'s: :func:`align_tables` (in-memory only),
:func:`leader_agree_variant`, :func:`agreement_positions`, :func:`sample_fingerprint`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.alignment.keyed_hash import Alignment, TagArray
from secure_release.mechanism.alignment.psi import PsiKey, run_psi
from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError, TooFewCuratorsError
from secure_release.mechanism.estimation import estimators
from secure_release.mechanism.estimation.report import ReleaseEstimate
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.packing import pack_symbols
from secure_release.mechanism.primitives.pads import CipherMode, ReleasePad
from secure_release.mechanism.primitives.sampling import sample_positions
from secure_release.mechanism.privacy.guarantee import plan_report
from secure_release.mechanism.privacy.ledger import PrivacyLedger
from secure_release.mechanism.privacy.plan import ReleasePlan, plan_release
from secure_release.mechanism.protocol.in_memory import (
    Agreement,
    CuratorTable,
    ReleaseResult,
    agree_alignment,
    curator_tags,
    leader_agree,
    release_from_positions,
    researcher_decrypt,
    researcher_estimate,
    server_perturb,
)
from secure_release.mechanism.protocol.index_sharing import (
    draw_index_tuple,
    pack_indices,
    sample_set_fingerprint,
    unpack_indices,
)
from secure_release.mechanism.protocol.server_sampling import (
    KeyPath,
    PositionsPathError,
    TableKey,
    charge_table_release,
    curator_rekey,
    curator_store_table,
    researcher_decrypt_stored,
    server_apply_rekey,
    server_draw_sample,
    server_gather,
    table_ledger_name,
)
from secure_release.mechanism.protocol.tables import TablesPlan
from secure_release.mechanism.schema import JointSchema, SymbolArray, joint_codes, mixed_radix_encode

IndexArray = npt.NDArray[np.int64]


class UnknownVariantError(SecureReleaseError):
    """A sampling or alignment mode that does not exist."""


class SamplingMode(enum.StrEnum):
    """Who fixes the sample and how (one choice per release)."""

    SEED = "seed"
    INDICES = "indices"

    @classmethod
    def parse(cls, text: str) -> SamplingMode:
        try:
            return cls(text.lower())
        except ValueError as exc:
            raise UnknownVariantError(f"unknown sampling {text!r}; allowed: seed, indices") from exc

    @property
    def randomness(self) -> str:
        """What the plan states about the sample's randomness."""
        if self is SamplingMode.SEED:
            return "pseudorandom (ChaCha20 keyed from a 32-byte seed; computational against the researcher)"
        return (
            "from the OS CSPRNG (exactly uniform ordered tuple given uniform OS bytes; no seed expansion; the "
            "release stays computational: PRAM's coins are ChaCha20)"
        )


class AlignmentMode(enum.StrEnum):
    """How the curators find their common ids and the canonical order (one choice per release)."""

    KEYED_HASH = "keyed-hash"
    PSI = "psi"

    @classmethod
    def parse(cls, text: str) -> AlignmentMode:
        try:
            return cls(text.lower())
        except ValueError as exc:
            raise UnknownVariantError(f"unknown alignment {text!r}; allowed: keyed-hash, psi") from exc


def _mode(value: Any, enum_type: type[enum.StrEnum]) -> Any:
    return enum_type.parse(value) if isinstance(value, str) else value  # type: ignore[attr-defined]


@dataclass(frozen=True)
class VariantAgreement:
    """What the leader fixes and sends for a variant release: the base agreement, the sampling
    mode and exactly one of (seed, packed indices)."""

    base: Agreement
    sampling: SamplingMode
    alignment: AlignmentMode
    packed_indices: bytes | None = None
    own_rows: npt.NDArray[np.int64] | npt.NDArray[np.uint32] | None = None
    """As a follower received it: its own rows in the canonical order (the leader sends these, 4
    bytes a row, instead of the common tags; ``base.common`` is then empty)."""
    count: int | None = None
    """As a leader on a cluster fixed it: n, with the common tags left in its shards
    (``base.common`` is then empty)."""

    @property
    def num_common(self) -> int:
        """n: the number of ids every curator holds."""
        if self.count is not None:
            return self.count
        return int(self.base.common.size) if self.own_rows is None else int(self.own_rows.size)

    @property
    def seed(self) -> Seed | None:
        return self.base.seed if self.sampling is SamplingMode.SEED else None

    def plan_report(self) -> dict[str, Any]:
        """The plan (``ReleasePlan.report``) plus the variant and the sample's randomness."""
        report = plan_report(self.base.spec.plan)
        report.update(
            sampling=self.sampling.value,
            sampling_randomness=self.sampling.randomness,
            alignment=self.alignment.value,
            agreement_bytes=self.agreement_sample_bytes,
        )
        return report

    @property
    def agreement_sample_bytes(self) -> int:
        """Bytes the sample costs in the agreement: 32 (seed) or ceil(m ceil(log2 n) / 8)."""
        return 32 if self.packed_indices is None else len(self.packed_indices)


def leader_agree_variant(
    release_id: str,
    curators: Sequence[str],
    tags_by_curator: Mapping[str, TagArray],
    sizes_by_curator: Mapping[str, int],
    epsilon: float,
    m: int | None,
    cipher: CipherMode,
    sampling: SamplingMode | str = SamplingMode.SEED,
    alignment: AlignmentMode | str = AlignmentMode.KEYED_HASH,
    researchers: Sequence[str] = (),
    seed: Seed | None = None,
    indices: IndexArray | None = None,
    common: TagArray | None = None,
    tables: TablesPlan | None = None,
) -> VariantAgreement:
    """The leader's agreement (``protocol.leader_agree``) with the sample fixed by a seed or by
    an OS-drawn index tuple. ``tags_by_curator`` are keyed-hash tags or PSI tags alike.
    ``seed`` / ``indices``: reproducible tests only. ``common``: the common tags, if the caller
    matched the lists already (``alignment.align_all``). ``tables``: a release of a design's
    tables (``in_memory.leader_agree``)."""
    sampling_mode: SamplingMode = _mode(sampling, SamplingMode)
    alignment_mode: AlignmentMode = _mode(alignment, AlignmentMode)
    base = leader_agree(
        release_id, curators, tags_by_curator, sizes_by_curator, epsilon, m, cipher, researchers, seed, common, tables
    )
    if sampling_mode is SamplingMode.SEED:
        if indices is not None:
            raise ShapeMismatchError("a seed-sampled agreement takes no index tuple")
        return VariantAgreement(base, sampling_mode, alignment_mode)
    n, m_ = base.spec.n, base.spec.m
    tuple_ = draw_index_tuple(n, m_) if indices is None else np.asarray(indices, dtype=np.int64)
    if tuple_.size != m_:
        raise ShapeMismatchError(f"the index tuple must hold m = {m_} positions, got {tuple_.size}")
    return VariantAgreement(base, sampling_mode, alignment_mode, pack_indices(tuple_, n))


def agreement_positions(agreement: VariantAgreement) -> IndexArray:
    """Every curator's sample from the agreement: the seed rule, or the unpacked (validated)
    index tuple."""
    spec = agreement.base.spec
    if agreement.sampling is SamplingMode.SEED:
        return sample_positions(agreement.base.seed, spec.n, spec.m, spec.release_id)
    if agreement.packed_indices is None:
        raise ShapeMismatchError("an index-sampled agreement must carry its packed indices")
    return unpack_indices(agreement.packed_indices, spec.n, spec.m)


def sample_fingerprint(agreement: VariantAgreement) -> str:
    """The public fingerprint a curator's ledger records to refuse a reused sample."""
    if agreement.sampling is SamplingMode.SEED:
        return agreement.base.seed.fingerprint
    assert agreement.packed_indices is not None
    return sample_set_fingerprint(agreement_positions(agreement))


@dataclass(frozen=True)
class AlignedTables:
    """The curators' tables in the canonical order of one alignment mode."""

    mode: AlignmentMode
    tags: list[TagArray]
    alignments: list[Alignment]
    symbols: list[SymbolArray]


def align_tables(
    tables: Sequence[CuratorTable],
    mode: AlignmentMode | str = AlignmentMode.KEYED_HASH,
    alignment_key: AlignmentKey | None = None,
    psi_keys: Sequence[PsiKey] | None = None,
) -> AlignedTables:
    """Alignment in memory: keyed-hash tags (``protocol.curator_tags``) or the PSI ring
    (:func:`mechanism.alignment.psi.run_psi`), then ``protocol.agree_alignment``. Keys default to fresh
    OS randomness."""
    mode_: AlignmentMode = _mode(mode, AlignmentMode)
    if mode_ is AlignmentMode.KEYED_HASH:
        key = alignment_key or AlignmentKey.generate()
        tags = [curator_tags(t, key) for t in tables]
    else:
        keys = list(psi_keys) if psi_keys is not None else [PsiKey.generate() for _ in tables]
        tags = run_psi([t.ids for t in tables], keys).tags
    alignments = agree_alignment(tags)
    symbols = [t.symbols()[a.row_order] for t, a in zip(tables, alignments, strict=True)]
    return AlignedTables(mode_, tags, alignments, symbols)


def _result(
    tables: Sequence[CuratorTable],
    aligned: AlignedTables,
    plan: ReleasePlan,
    positions: IndexArray,
    estimate: ReleaseEstimate,
    server_view: dict[str, Any],
    researcher_view: dict[str, Any],
) -> ReleaseResult:
    subset = estimate.curators
    full_codes = joint_codes(aligned.symbols, plan.alphabet_sizes)
    sub_codes = mixed_radix_encode([aligned.symbols[j] for j in subset], estimate.alphabet_sizes)
    sub_size = int(np.prod(estimate.alphabet_sizes))
    return ReleaseResult(
        plan=plan,
        estimate=estimate,
        true_type=estimators.observed_counts(sub_codes, sub_size) / plan.n,
        sample_type=estimators.observed_counts(full_codes[positions], plan.joint_size) / plan.m,
        matched_rows={t.name: a.num_matched for t, a in zip(tables, aligned.alignments, strict=True)},
        unmatched_rows={t.name: a.num_unmatched for t, a in zip(tables, aligned.alignments, strict=True)},
        server_view=server_view,
        researcher_view=researcher_view,
    )


def run_variant_release(
    tables: Sequence[CuratorTable],
    epsilon: float,
    m: int | None = None,
    sampling: SamplingMode | str = SamplingMode.SEED,
    alignment: AlignmentMode | str = AlignmentMode.KEYED_HASH,
    cipher: CipherMode | str = CipherMode.CHACHA20,
    release_id: str = "release-1",
    seed: Seed | None = None,
    indices: IndexArray | None = None,
    alignment_key: AlignmentKey | None = None,
    psi_keys: Sequence[PsiKey] | None = None,
    pram_key: PramKey | None = None,
    granted: Sequence[int] | None = None,
    pad_keys: Sequence[PadKey] | None = None,
) -> ReleaseResult:
    """``protocol.run_release`` with a sampling mode and an alignment mode.

    The leader's agreement goes through :func:`leader_agree_variant` and every curator takes its
    sample from :func:`agreement_positions`, as the services will. With ``sampling="seed"``,
    ``alignment="keyed-hash"`` and the same injected keys this is exactly ``run_release``.
    Injected keys, ``seed`` and ``indices`` are for reproducible tests only.
    """
    if len(tables) < 2:
        raise TooFewCuratorsError(f"a release needs N >= 2 curators, got {len(tables)}")
    schema = JointSchema(tuple(t.schema for t in tables))
    cipher_mode = CipherMode.parse(cipher) if isinstance(cipher, str) else cipher
    aligned = align_tables(tables, alignment, alignment_key, psi_keys)
    names = [f"c{j}" for j in range(len(tables))]  # spec-valid party names for the in-memory run
    agreement = leader_agree_variant(
        release_id,
        names,
        dict(zip(names, aligned.tags, strict=True)),
        dict(zip(names, schema.alphabet_sizes, strict=True)),
        epsilon,
        m,
        cipher_mode,
        sampling,
        aligned.mode,
        seed=seed or Seed.generate(),
        indices=indices,
    )
    plan = agreement.base.spec.plan
    positions = agreement_positions(agreement)
    estimate, server_view, researcher_view = release_from_positions(
        aligned.symbols, plan, positions, cipher_mode, pram_key, pad_keys, granted
    )
    researcher_view["plan_report"] = agreement.plan_report()
    return _result(tables, aligned, plan, positions, estimate, server_view, researcher_view)


# ---------------------------------------------------------------------- server-sampled releases


@dataclass(frozen=True)
class StoredRelease:
    """One release asked of a stored table."""

    release_id: str
    epsilon: float
    m: int | None = None


@dataclass
class ServerSampledResult:
    """The outcome of :func:`run_server_sampled_release`: the one upload and every release."""

    table_id: str
    key_path: KeyPath
    n: int
    upload_bytes: dict[str, int]
    upload_seconds: float
    releases: list[ReleaseResult]
    release_seconds: list[float]
    ledgers: dict[str, PrivacyLedger]
    server_view: dict[str, Any] = field(default_factory=dict)


def run_server_sampled_release(
    tables: Sequence[CuratorTable],
    releases: Sequence[StoredRelease],
    key_path: KeyPath | str = KeyPath.REKEYED,
    table_id: str = "table-1",
    budget: float = 10.0,
    cipher: CipherMode | str = CipherMode.CHACHA20,
    alignment: AlignmentMode | str = AlignmentMode.KEYED_HASH,
    alignment_key: AlignmentKey | None = None,
    psi_keys: Sequence[PsiKey] | None = None,
    table_keys: Sequence[TableKey] | None = None,
    server_seeds: Sequence[Seed] | None = None,
    pram_keys: Sequence[PramKey] | None = None,
    pad_keys: Sequence[Sequence[PadKey]] | None = None,
    granted: Sequence[int] | None = None,
) -> ServerSampledResult:
    """The server-sampled release in memory (:func:`_server_sampled_release`), **rekeyed key path
    only**: the positions path is not public (:class:`PositionsPathError`), because two of its
    releases reveal their overlap and no bound on the resulting loss is proved for joint
    alphabets K >= 3 (``server_sampling.overlap_likelihood_ratio``; issue 23). The other
    arguments are :func:`_server_sampled_release`'s."""
    if _mode(key_path, KeyPath) is not KeyPath.REKEYED:
        raise PositionsPathError(
            "the positions key path is not public: positions repeat across releases, the researcher sees their "
            "overlap, and no bound on that loss is proved for K >= 3 (exact enumeration exceeds the K = 2 formula); "
            "use the rekeyed path"
        )
    return _server_sampled_release(
        tables, releases, KeyPath.REKEYED, table_id, budget, cipher, alignment, alignment_key, psi_keys, table_keys,
        server_seeds, pram_keys, pad_keys, granted,
    )  # fmt: skip


def _server_sampled_release(
    tables: Sequence[CuratorTable],
    releases: Sequence[StoredRelease],
    key_path: KeyPath | str = KeyPath.REKEYED,
    table_id: str = "table-1",
    budget: float = 10.0,
    cipher: CipherMode | str = CipherMode.CHACHA20,
    alignment: AlignmentMode | str = AlignmentMode.KEYED_HASH,
    alignment_key: AlignmentKey | None = None,
    psi_keys: Sequence[PsiKey] | None = None,
    table_keys: Sequence[TableKey] | None = None,
    server_seeds: Sequence[Seed] | None = None,
    pram_keys: Sequence[PramKey] | None = None,
    pad_keys: Sequence[Sequence[PadKey]] | None = None,
    granted: Sequence[int] | None = None,
) -> ServerSampledResult:
    """Both key paths (the positions path for the tests and the enumeration only). Align,
    encrypt and upload each curator's whole table once, then run every release in
    ``releases``: the server draws the sample and applies PRAM; each curator charges its ledger
    for the table (and, on the rekeyed path, returns its re-key column); the researcher decrypts
    and estimates. A refused charge (budget, repeated release id) raises before the release.

    Injected keys and seeds (one per curator / per release) are for reproducible tests only.
    """
    if len(tables) < 2:
        raise TooFewCuratorsError(f"a release needs N >= 2 curators, got {len(tables)}")
    path: KeyPath = _mode(key_path, KeyPath)
    schema = JointSchema(tuple(t.schema for t in tables))
    sizes = schema.alphabet_sizes
    aligned = align_tables(tables, alignment, alignment_key, psi_keys)
    n = aligned.alignments[0].num_matched
    t0 = time.perf_counter()
    stored_and_keys = [
        curator_store_table(sym, k, table_id, None if table_keys is None else table_keys[j])
        for j, (sym, k) in enumerate(zip(aligned.symbols, sizes, strict=True))
    ]
    stored = [c for c, _ in stored_and_keys]
    keys = [key for _, key in stored_and_keys]
    upload_bytes = {t.name: len(pack_symbols(c, k)) for t, c, k in zip(tables, stored, sizes, strict=True)}
    upload_seconds = time.perf_counter() - t0
    ledgers = {t.name: _table_ledger(table_id, budget) for t in tables}
    subset = list(range(len(tables))) if granted is None else list(granted)
    results, seconds = [], []
    for r, rel in enumerate(releases):
        t1 = time.perf_counter()
        plan = plan_release(n, sizes, rel.epsilon, rel.m)
        positions, seed = server_draw_sample(
            n, plan.m, rel.release_id, None if server_seeds is None else server_seeds[r]
        )
        for ledger in ledgers.values():  # all check first, so a refusal charges no one
            ledger.check_reserve(table_ledger_name(table_id), rel.release_id, plan.epsilon, seed.fingerprint)
        for ledger in ledgers.values():  # in memory the release seals at once: reserve, then commit
            charge_table_release(ledger, table_id, rel.release_id, plan.epsilon, seed.fingerprint)
            committed = ledger.commit(rel.release_id, 0.0)
            if committed is not None:
                ledger.append(committed)
        rows = server_gather(stored, positions)
        pram_key = None if pram_keys is None else pram_keys[r]
        if path is KeyPath.REKEYED:
            injected = [None] * len(tables) if pad_keys is None else list(pad_keys[r])
            rekeys = [
                curator_rekey(positions, keys[j], table_id, sizes[j], cipher, injected[j])
                for j in range(len(tables))
            ]
            rows = server_apply_rekey(rows, [d for d, _ in rekeys], sizes)
            perturbed = server_perturb(rows, plan, pram_key or PramKey.generate())
            pads: list[ReleasePad] = [rekeys[j][1] for j in subset]
            decrypted = researcher_decrypt([perturbed[j] for j in subset], pads)
            researcher_view: dict[str, Any] = {"perturbed": perturbed, "pads": pads}
        else:
            perturbed = server_perturb(rows, plan, pram_key or PramKey.generate())
            decrypted = researcher_decrypt_stored(
                [perturbed[j] for j in subset], positions, [keys[j] for j in subset], table_id,
                [sizes[j] for j in subset],
            )
            researcher_view = {"perturbed": perturbed, "positions": positions, "table_keys": [keys[j] for j in subset]}
        estimate = researcher_estimate(decrypted, plan, subset)
        researcher_view["plan"] = plan.to_dict()
        server_view = {"plan": plan.to_dict(), "positions": positions, "gathered": rows, "perturbed": perturbed}
        results.append(_result(tables, aligned, plan, positions, estimate, server_view, researcher_view))
        seconds.append(time.perf_counter() - t1)
    return ServerSampledResult(
        table_id, path, n, upload_bytes, upload_seconds, results, seconds, ledgers,
        {"stored": stored},
    )


def _table_ledger(table_id: str, budget: float) -> PrivacyLedger:
    """A fresh in-memory ledger whose stored-table data set has ``budget``."""
    ledger = PrivacyLedger()
    ledger.append(ledger.set_budget(table_ledger_name(table_id), table_id, budget, 0.0))
    return ledger
