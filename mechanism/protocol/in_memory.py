"""The whole protocol in memory, one call (like libprio/janus: each role a pure interface).

Steps, each a named function the services reuse unchanged:

1. :func:`curator_tags`, :func:`agree_alignment`      keyed id tags, common ids, canonical order
   :func:`leader_agree`                                the leading curator's agreement (spec, seed)
2. :func:`~mechanism.primitives.sampling.sample_positions`        the shared ordered m-tuple
3. :func:`curator_encrypt`                             sample + fresh pad + encrypt
4. :func:`server_perturb`                              PRAM once on the joint ciphertext rows
5. :func:`researcher_decrypt`, :func:`researcher_estimate`  decrypt and estimate

:func:`run_release` strings them together and returns the estimate and what each party saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.alignment.keyed_hash import (
    TAG_DTYPE,
    Alignment,
    IdArray,
    TagArray,
    align_all,
    common_tags,
    id_tags,
)
from secure_release.mechanism.errors import ShapeMismatchError, TooFewCuratorsError
from secure_release.mechanism.estimation import estimators
from secure_release.mechanism.estimation.report import ReleaseEstimate
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode, ReleasePad, new_release_pad
from secure_release.mechanism.primitives.pram import perturb
from secure_release.mechanism.primitives.sampling import sample_positions
from secure_release.mechanism.privacy.plan import ReleasePlan, plan_release
from secure_release.mechanism.protocol.spec import ReleaseSpec, designed_spec
from secure_release.mechanism.protocol.tables import (
    TableLayout,
    TablesPlan,
    count_rows,
    layouts_for,
    perturb_rows,
    project_rows,
    segments_of,
    symbol_map,
    table_plan,
)
from secure_release.mechanism.schema import (
    CuratorSchema,
    JointSchema,
    SymbolArray,
    joint_codes,
    mixed_radix_encode,
)


@dataclass(frozen=True)
class CuratorTable:
    """One curator's vertical slice: ids and one label column per attribute."""

    schema: CuratorSchema
    ids: npt.NDArray[np.str_]
    columns: Mapping[str, npt.NDArray[np.str_]]

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def num_rows(self) -> int:
        return len(self.ids)

    def symbols(self) -> SymbolArray:
        return self.schema.encode(self.columns)

    def id_values(self) -> IdArray:
        """The ids in the form :func:`alignment.id_tags` hashes fastest (a table read from a
        file keeps them as an Arrow array)."""
        return self.ids


def curator_tags(table: CuratorTable, key: AlignmentKey) -> TagArray:
    """Step 1a: the tags a curator sends to the other curators (never the ids)."""
    return id_tags(table.id_values(), key)


def agree_alignment(tag_lists: Sequence[TagArray]) -> list[Alignment]:
    """Step 1b: every curator's row order over the ids all of them hold."""
    return align_all(tag_lists)[1]  # common_tags + align for each, each list sorted once


class Agreement(NamedTuple):
    """What the leading curator fixes for one release and sends to every curator."""

    spec: ReleaseSpec
    seed: Seed
    common: TagArray  # the tags every curator holds, ascending: the canonical row order


def leader_agree(
    release_id: str,
    curators: Sequence[str],
    tags_by_curator: Mapping[str, TagArray],
    sizes_by_curator: Mapping[str, int],
    epsilon: float,
    m: int | None,
    cipher: CipherMode,
    researchers: Sequence[str] = (),
    seed: Seed | None = None,
    common: TagArray | None = None,
    tables: TablesPlan | None = None,
) -> Agreement:
    """Step 1c, the leading curator: from every curator's tags and alphabet size, the common
    tags (ascending: the canonical order), n = their number, the plan (m defaults to m*) and a
    fresh sampling seed (``seed``: reproducible tests only), as a validated :class:`ReleaseSpec`.

    ``curators`` is the joint-code order; the spec's alphabet sizes follow it. ``common``: the
    common tags if the caller computed them already (with every list's rows, ``align_all``).
    ``tables``: a release of a design's tables (``spec.designed_spec``; its epsilon and m_t, not
    ``epsilon`` and ``m``).
    """
    missing = [c for c in curators if c not in tags_by_curator or c not in sizes_by_curator]
    if missing:
        raise ShapeMismatchError(
            f"the agreement needs the tags and alphabet size of every curator in {list(curators)}; "
            f"missing {missing}"
        )
    if common is None:
        common = common_tags([tags_by_curator[c] for c in curators])
    common = np.ascontiguousarray(common.astype(TAG_DTYPE, copy=False))
    if tables is not None:
        spec = designed_spec(release_id, curators, cipher, int(common.size), tables, researchers)
        return Agreement(spec, seed or Seed.generate(), common)
    plan = plan_release(int(common.size), [sizes_by_curator[c] for c in curators], epsilon, m)
    spec = ReleaseSpec(release_id, tuple(curators), cipher, plan, tuple(researchers)).validate()
    return Agreement(spec, seed or Seed.generate(), common)


def curator_encrypt(
    aligned_symbols: SymbolArray,
    positions: npt.NDArray[np.int64],
    alphabet_size: int,
    cipher: CipherMode | str,
    injected_key: PadKey | None = None,
) -> tuple[SymbolArray, ReleasePad]:
    """Step 3: sample the aligned column at ``positions`` and encrypt it under a fresh pad
    (``injected_key``: reproducible tests only)."""
    pad = new_release_pad(cipher, alphabet_size, int(positions.size), injected_key)
    return pad.encrypt(aligned_symbols[positions]), pad


def server_perturb(
    ciphertexts: Sequence[SymbolArray], plan: ReleasePlan, key: PramKey
) -> list[SymbolArray]:
    """Step 4: gamma-diagonal PRAM on the joined ciphertext rows, once."""
    if any(c.size != plan.m for c in ciphertexts):
        raise ShapeMismatchError(f"every curator must upload exactly m = {plan.m} symbols")
    return perturb(ciphertexts, plan.alphabet_sizes, plan.channel, key)


def researcher_decrypt(
    perturbed: Sequence[SymbolArray], pads: Sequence[ReleasePad]
) -> list[SymbolArray]:
    """Step 5a: remove each curator's pad (Lemma 3.1: the result is PRAM of the sample)."""
    return [pad.decrypt(c) for c, pad in zip(perturbed, pads, strict=True)]


def researcher_estimate(
    columns: Sequence[SymbolArray], plan: ReleasePlan, curators: Sequence[int] | None = None
) -> ReleaseEstimate:
    """Step 5b: raw A^-1, simplex projection, MLE and standard errors, on the joint or on the
    marginal of the curators whose keys the researcher holds (``curators``)."""
    subset = tuple(range(len(plan.alphabet_sizes))) if curators is None else tuple(curators)
    sizes = tuple(plan.alphabet_sizes[j] for j in subset)
    codes = mixed_radix_encode(list(columns), sizes)
    return estimate_from_counts(estimators.observed_counts(codes, int(np.prod(sizes))), plan, subset)


def estimate_from_counts(
    counts: npt.NDArray[np.int64], plan: ReleasePlan, curators: Sequence[int] | None = None
) -> ReleaseEstimate:
    """:func:`researcher_estimate` from the observed counts of the decrypted joint (or marginal)
    symbols alone: every estimator here reads only the counts, so a researcher may count chunk by
    chunk and never hold the m rows."""
    subset = tuple(range(len(plan.alphabet_sizes))) if curators is None else tuple(curators)
    sizes = tuple(plan.alphabet_sizes[j] for j in subset)
    is_marginal = len(subset) < len(plan.alphabet_sizes)
    channel = plan.channel
    if is_marginal:
        raw = estimators.estimate_marginal(counts, channel)
        se = estimators.marginal_standard_errors(raw, plan.n, plan.m, channel)
    else:
        raw = estimators.estimate_joint(counts, channel)
        se = estimators.standard_errors(raw, plan.n, plan.m, channel)
    mle = estimators.estimate_mle_exact(counts, channel.keep)
    if is_marginal:
        intervals = estimators.marginal_intervals(counts, plan.n, channel)
    else:
        intervals = estimators.joint_intervals(counts, plan.n, channel)
    return ReleaseEstimate(
        curators=subset,
        alphabet_sizes=sizes,
        counts=counts,
        raw=raw,
        projected=estimators.project_to_simplex(raw),
        mle=mle.estimate,
        standard_errors=se,
        ci_low=intervals.low,
        ci_high=intervals.high,
        mle_iterations=mle.iterations,
        mle_converged=mle.converged,
        is_marginal=is_marginal,
        interval_label=intervals.label,
    )


@dataclass
class ReleaseResult:
    """The outcome of :func:`run_release` with every party's view."""

    plan: ReleasePlan
    estimate: ReleaseEstimate
    true_type: npt.NDArray[np.float64]
    sample_type: npt.NDArray[np.float64]
    matched_rows: dict[str, int]
    unmatched_rows: dict[str, int]
    server_view: dict[str, Any] = field(default_factory=dict)
    researcher_view: dict[str, Any] = field(default_factory=dict)

    @property
    def l2_error(self) -> float:
        return estimators.l2_error(self.estimate.raw, self.true_type)


def release_from_positions(
    aligned: Sequence[SymbolArray],
    plan: ReleasePlan,
    positions: npt.NDArray[np.int64],
    cipher: CipherMode | str = CipherMode.CHACHA20,
    pram_key: PramKey | None = None,
    pad_keys: Sequence[PadKey] | None = None,
    granted: Sequence[int] | None = None,
) -> tuple[ReleaseEstimate, dict[str, Any], dict[str, Any]]:
    """Steps 3-5 for a given sample of aligned columns: encrypt, PRAM, decrypt, estimate.
    Returns the estimate, the server's view and the researcher's view."""
    uploads = [
        curator_encrypt(sym, positions, k, cipher, None if pad_keys is None else pad_keys[j])
        for j, (sym, k) in enumerate(zip(aligned, plan.alphabet_sizes, strict=True))
    ]
    ciphertexts = [c for c, _ in uploads]
    perturbed = server_perturb(ciphertexts, plan, pram_key or PramKey.generate())
    subset = list(range(len(aligned))) if granted is None else list(granted)
    pads = [uploads[j][1] for j in subset]
    decrypted = researcher_decrypt([perturbed[j] for j in subset], pads)
    estimate = researcher_estimate(decrypted, plan, subset)
    server_view = {"plan": plan.to_dict(), "ciphertexts": ciphertexts, "perturbed": perturbed}
    researcher_view = {"perturbed": perturbed, "pads": pads, "plan": plan.to_dict()}
    return estimate, server_view, researcher_view


def run_release(
    tables: Sequence[CuratorTable],
    epsilon: float,
    m: int | None = None,
    cipher: CipherMode | str = CipherMode.CHACHA20,
    release_id: str = "release-1",
    seed: Seed | None = None,
    alignment_key: AlignmentKey | None = None,
    pram_key: PramKey | None = None,
    granted: Sequence[int] | None = None,
    pad_keys: Sequence[PadKey] | None = None,
) -> ReleaseResult:
    """Run alignment -> sampling -> encryption -> PRAM -> decryption -> estimation in memory.

    ``seed``, ``alignment_key`` and ``pram_key`` default to fresh OS randomness; tests inject
    them, and ``pad_keys`` (one per curator, chacha20) too: the pads do not change the
    distribution of the estimate, but a replaced row decrypts to (u - v) mod k, so exact
    reproduction needs the same pads. ``granted`` lists the curators whose keys the researcher
    receives (default: all).
    """
    if len(tables) < 2:
        raise TooFewCuratorsError(f"a release needs N >= 2 curators, got {len(tables)}")
    schema = JointSchema(tuple(t.schema for t in tables))
    alignment_key = alignment_key or AlignmentKey.generate()
    alignments = agree_alignment([curator_tags(t, alignment_key) for t in tables])
    n = alignments[0].num_matched
    plan = plan_release(n, schema.alphabet_sizes, epsilon, m)
    seed = seed or Seed.generate()
    positions = sample_positions(seed, plan.n, plan.m, release_id)
    aligned = [t.symbols()[a.row_order] for t, a in zip(tables, alignments, strict=True)]
    estimate, server_view, researcher_view = release_from_positions(
        aligned, plan, positions, cipher, pram_key, pad_keys, granted
    )
    subset = list(range(len(tables))) if granted is None else list(granted)
    full_codes = joint_codes(aligned, plan.alphabet_sizes)
    sub_codes = mixed_radix_encode([aligned[j] for j in subset], estimate.alphabet_sizes)
    sub_size = int(np.prod(estimate.alphabet_sizes))
    true_type = estimators.observed_counts(sub_codes, sub_size) / plan.n
    sample_type = estimators.observed_counts(full_codes[positions], plan.joint_size) / plan.m
    return ReleaseResult(
        plan=plan,
        estimate=estimate,
        true_type=true_type,
        sample_type=sample_type,
        matched_rows={t.name: a.num_matched for t, a in zip(tables, alignments, strict=True)},
        unmatched_rows={t.name: a.num_unmatched for t, a in zip(tables, alignments, strict=True)},
        server_view=server_view,
        researcher_view=researcher_view,
    )


# ------------------------------------------------------------------ a release of several tables
@dataclass
class TablesResult:
    """The outcome of :func:`run_tables_release`: the agreed spec (with its table layouts), per
    table its plan, estimate (None where the researcher lacks a key of a curator in it), the
    true type over the n aligned rows, and every party's view."""

    spec: ReleaseSpec
    plans: tuple[ReleasePlan, ...]
    estimates: tuple[ReleaseEstimate | None, ...]
    true_types: tuple[npt.NDArray[np.float64], ...]
    matched_rows: dict[str, int]
    server_view: dict[str, Any] = field(default_factory=dict)
    researcher_view: dict[str, Any] = field(default_factory=dict)


def run_tables_release(
    tables: Sequence[CuratorTable],
    table_attributes: Sequence[Sequence[str]],
    sample_sizes: Sequence[int],
    gammas: Sequence[float],
    epsilon: float,
    design_digest: str,
    planned_n: int | None = None,
    cipher: CipherMode | str = CipherMode.CHACHA20,
    release_id: str = "release-1",
    seed: Seed | None = None,
    alignment_key: AlignmentKey | None = None,
    pram_key: PramKey | None = None,
    granted: Sequence[int] | None = None,
    pad_keys: Sequence[PadKey] | None = None,
) -> TablesResult:
    """A release of several tables (``protocol/tables.py``) in memory, one alignment: table t
    holds ``table_attributes[t]``, with m_t and gamma_t as planned for ``planned_n`` records
    (rescaled to the aligned n by ``layouts_for``). The sampled ordered tuple of M = sum m_t rows
    is split in order into the tables' disjoint groups; each curator encrypts its designed column
    under a pad with one segment a table, the server applies each table's PRAM, the researcher
    decrypts, counts each table and estimates it as a release of its own (n, m_t, gamma_t)."""
    if len(tables) < 2:
        raise TooFewCuratorsError(f"a release needs N >= 2 curators, got {len(tables)}")
    schemas = [t.schema for t in tables]
    alignment_key = alignment_key or AlignmentKey.generate()
    alignments = agree_alignment([curator_tags(t, alignment_key) for t in tables])
    n = alignments[0].num_matched
    planned = [(tuple(a), int(m), float(g)) for a, m, g in zip(table_attributes, sample_sizes, gammas, strict=True)]
    layouts = layouts_for(n, schemas, planned, epsilon, planned_n)
    sizes = tuple(s.alphabet_size for s in schemas)
    total = sum(x.m for x in layouts)
    plan = ReleasePlan(n, total, sizes, epsilon, max(x.gamma for x in layouts))
    spec = ReleaseSpec(release_id, tuple(s.name for s in schemas), CipherMode(cipher), plan,
                       tables=layouts, design_digest=design_digest).validate()  # fmt: skip
    positions = sample_positions(seed or Seed.generate(), n, total, release_id)
    aligned = [t.symbols()[a.row_order] for t, a in zip(tables, alignments, strict=True)]
    attrs = [p[0] for p in planned]
    pads, ciphertexts = [], []
    for j, schema in enumerate(schemas):
        column = project_rows(aligned[j][positions], schema, attrs, layouts)
        key = None if pad_keys is None else pad_keys[j]
        pad = new_release_pad(cipher, schema.alphabet_size, total, key, segments_of(layouts, j))
        ciphertexts.append(pad.encrypt(column))
        pads.append(pad)
    perturbed = perturb_rows(ciphertexts, layouts, pram_key or PramKey.generate())
    subset = set(range(len(tables)) if granted is None else granted)
    decrypted = [pads[j].decrypt(perturbed[j]) if j in subset else None for j in range(len(tables))]
    counts = [np.zeros(prod(x.alphabet_sizes[j] for j in x.live), dtype=np.int64) for x in layouts]
    count_rows(decrypted, layouts, 0, counts)
    plans = tuple(table_plan(n, epsilon, x) for x in layouts)
    estimates = tuple(
        estimate_from_counts(c, p) if all(j in subset for j in x.live) else None
        for c, p, x in zip(counts, plans, layouts, strict=True)
    )
    true_types = tuple(_true_type(aligned, schemas, a, x) for a, x in zip(attrs, layouts, strict=True))
    return TablesResult(
        spec=spec,
        plans=plans,
        estimates=estimates,
        true_types=true_types,
        matched_rows={t.name: a.num_matched for t, a in zip(tables, alignments, strict=True)},
        server_view={"spec": spec.to_dict(), "ciphertexts": ciphertexts, "perturbed": perturbed},
        researcher_view={"perturbed": perturbed, "pads": [pads[j] for j in sorted(subset)]},
    )


def _true_type(
    aligned: Sequence[SymbolArray], schemas: Sequence[CuratorSchema], attributes: Sequence[str], layout: TableLayout
) -> npt.NDArray[np.float64]:
    """Table ``attributes``' shares over every aligned row (in-memory runs and tests only)."""
    digits = [symbol_map(schemas[j], attributes)[aligned[j]] for j in layout.live]
    sizes = [layout.alphabet_sizes[j] for j in layout.live]
    n = int(aligned[0].size)
    return np.bincount(mixed_radix_encode(digits, sizes), minlength=prod(sizes)) / n
