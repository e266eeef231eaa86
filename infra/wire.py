"""The wire: the only module where protobuf messages become domain values and back.

Release parameters <-> :class:`~secure_release.mechanism.protocol.spec.ReleaseSpec` (with the release
kind: curator- or server-sampled, and the stored table), the mode enums (cipher, sampling,
alignment), curator schemas, a stored table's status, and the researcher's
:class:`~secure_release.mechanism.estimation.report.ReleaseReport` <-> ``EstimateResponse``. The chunked
streams (tags, PSI lists, the agreement, uploads, tables, samples, perturbed rows, keys) live
in :mod:`.streams`, each encoder beside its decoder.
Decoding validates: a message that does not make a valid domain value raises a named error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from secure_release.mechanism.errors import SecureReleaseError, UnknownCipherError
from secure_release.mechanism.estimation.report import CELL_COLUMNS, ReleaseReport
from secure_release.mechanism.primitives.packing import CHUNK_ROWS
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.plan import ReleasePlan
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode, UnknownVariantError
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

_PB_OF_CIPHER = {CipherMode.OTP: pb.CIPHER_MODE_OTP, CipherMode.CHACHA20: pb.CIPHER_MODE_CHACHA20}
_CIPHER_OF_PB = {v: k for k, v in _PB_OF_CIPHER.items()}


# ---------------------------------------------------------------------------------- cipher
def cipher_to_pb(mode: CipherMode) -> pb.CipherMode.ValueType:
    return _PB_OF_CIPHER[mode]


def cipher_from_pb(value: int) -> CipherMode:
    try:
        return _CIPHER_OF_PB[value]  # type: ignore[index]
    except KeyError:
        raise UnknownCipherError(
            f"unknown cipher mode {value}; allowed: CIPHER_MODE_OTP (1), CIPHER_MODE_CHACHA20 (2)"
        ) from None


# ---------------------------------------------------------------------------------- variants
_PB_OF_SAMPLING = {SamplingMode.SEED: pb.SAMPLING_MODE_SEED, SamplingMode.INDICES: pb.SAMPLING_MODE_INDICES}
_SAMPLING_OF_PB = {v: k for k, v in _PB_OF_SAMPLING.items()}
_PB_OF_ALIGNMENT = {AlignmentMode.KEYED_HASH: pb.ALIGNMENT_MODE_KEYED_HASH, AlignmentMode.PSI: pb.ALIGNMENT_MODE_PSI}
_ALIGNMENT_OF_PB = {v: k for k, v in _PB_OF_ALIGNMENT.items()}


def sampling_to_pb(mode: SamplingMode) -> pb.SamplingMode.ValueType:
    return _PB_OF_SAMPLING[mode]


def sampling_from_pb(value: int) -> SamplingMode:
    """UNSPECIFIED (a peer from before index sharing) reads as SEED; unknown values raise."""
    if value == pb.SAMPLING_MODE_UNSPECIFIED:
        return SamplingMode.SEED
    try:
        return _SAMPLING_OF_PB[value]  # type: ignore[index]
    except KeyError:
        raise UnknownVariantError(f"unknown sampling mode {value}; allowed: SEED (1), INDICES (2)") from None


def alignment_to_pb(mode: AlignmentMode) -> pb.AlignmentMode.ValueType:
    return _PB_OF_ALIGNMENT[mode]


def alignment_from_pb(value: int) -> AlignmentMode:
    """UNSPECIFIED (a peer from before PSI) reads as KEYED_HASH; unknown values raise."""
    if value == pb.ALIGNMENT_MODE_UNSPECIFIED:
        return AlignmentMode.KEYED_HASH
    try:
        return _ALIGNMENT_OF_PB[value]  # type: ignore[index]
    except KeyError:
        raise UnknownVariantError(f"unknown alignment mode {value}; allowed: KEYED_HASH (1), PSI (2)") from None


# ---------------------------------------------------------------------------------- release
def plan_from_pb(p: pb.ReleaseParams) -> ReleasePlan:
    return ReleasePlan(
        int(p.n),
        int(p.m),
        tuple(int(k) for k in p.alphabet_sizes),
        float(p.epsilon),
        float(p.gamma),
    )


class ReleaseKindError(SecureReleaseError):
    """A release kind that does not exist, or one that contradicts the table id (a server-sampled
    release names its stored table; a curator-sampled one names none)."""


def spec_to_pb(spec: ReleaseSpec) -> pb.ReleaseParams:
    return pb.ReleaseParams(
        kind=pb.RELEASE_KIND_SERVER_SAMPLED if spec.table_id else pb.RELEASE_KIND_CURATOR_SAMPLED,
        table_id=spec.table_id,
        release_id=spec.release_id,
        n=spec.plan.n,
        m=spec.plan.m,
        epsilon=spec.plan.epsilon,
        gamma=spec.plan.gamma,
        curators=list(spec.curators),
        alphabet_sizes=list(spec.plan.alphabet_sizes),
        cipher=cipher_to_pb(spec.cipher),
        researchers=list(spec.researchers),
    )


def spec_from_pb(p: pb.ReleaseParams) -> ReleaseSpec:
    """A validated spec (named errors for anything malformed). UNSPECIFIED kind reads as
    curator-sampled (a peer from before server sampling)."""
    if p.kind == pb.RELEASE_KIND_SERVER_SAMPLED:
        if not p.table_id:
            raise ReleaseKindError("a server-sampled release must name its stored table (table_id)")
    elif p.kind in (pb.RELEASE_KIND_UNSPECIFIED, pb.RELEASE_KIND_CURATOR_SAMPLED):
        if p.table_id:
            raise ReleaseKindError("a curator-sampled release names no stored table; kind must be SERVER_SAMPLED")
    else:
        raise ReleaseKindError(f"unknown release kind {p.kind}; allowed: CURATOR_SAMPLED (1), SERVER_SAMPLED (2)")
    return ReleaseSpec(
        table_id=p.table_id,
        release_id=p.release_id,
        curators=tuple(p.curators),
        cipher=cipher_from_pb(p.cipher),
        plan=plan_from_pb(p),
        researchers=tuple(p.researchers),
    ).validate()


@dataclass(frozen=True)
class TablePartView:
    """One curator's progress on a stored table, as the status reports it."""

    alphabet_size: int
    chunks_held: Iterable[int]
    committed: bool


def table_status_to_pb(
    table_id: str, curators: Sequence[str], n: int, parts: Mapping[str, TablePartView], deleted: bool = False
) -> pb.TableStatus:
    """A stored table's status (complete once every curator committed)."""
    return pb.TableStatus(
        table_id=table_id,
        curators=list(curators),
        n=n,
        parts=[
            pb.TablePartProgress(
                curator=c,
                alphabet_size=parts[c].alphabet_size,
                chunks_held=sorted(parts[c].chunks_held),
                committed=parts[c].committed,
            )
            for c in curators
            if c in parts
        ],
        complete=set(parts) == set(curators) and all(p.committed for p in parts.values()),
        chunk_rows=CHUNK_ROWS,
        deleted=deleted,
    )


# ---------------------------------------------------------------------------------- schemas
def schema_to_pb(schema: CuratorSchema) -> pb.CuratorSchema:
    return pb.CuratorSchema(
        curator=schema.name,
        attributes=[pb.Attribute(name=a.name, categories=list(a.categories)) for a in schema.attributes],
    )


def schema_from_pb(s: pb.CuratorSchema, curator: str) -> CuratorSchema:
    return CuratorSchema(
        s.curator or curator,
        tuple(Attribute(a.name, tuple(a.categories)) for a in s.attributes),
    )


# ---------------------------------------------------------------------------------- report
def report_to_pb(report: ReleaseReport) -> pb.EstimateResponse:
    privacy = report.privacy()
    return pb.EstimateResponse(
        release_id=report.release_id,
        marginal=report.marginal,
        curators=list(report.covered),
        attributes=list(report.attributes),
        cells=[
            pb.Cell(
                labels=list(row.labels),
                estimate=row.estimate,
                projected=row.projected,
                mle=row.mle,
                standard_error=row.standard_error,
                ci_low=row.ci_low,
                ci_high=row.ci_high,
                observed=row.observed,
            )
            for row in report.cells()
        ],
        privacy=pb.PrivacyReport(
            epsilon=privacy["epsilon"],
            gamma=privacy["gamma"],
            m=privacy["m"],
            n=privacy["n"],
            joint_size=privacy["K"],
            predicted_rmse=privacy["predicted_rmse"],
            bound=privacy["bound"],
            bound_tight=privacy["bound_tight"],
            delta=0.0,
            alphabet_sizes=list(report.plan.alphabet_sizes),
        ),
        mle_iterations=report.mle_iterations,
        interval_method=report.interval_method,
        all_curators=list(report.curators),
        refused=dict(report.refused),
    )


def report_from_pb(resp: pb.EstimateResponse) -> ReleaseReport:
    """An ``EstimateResponse`` as the :class:`ReleaseReport` it was made from."""
    p = resp.privacy
    return ReleaseReport.from_dict(
        {
            "release_id": resp.release_id,
            "plan": {
                "n": p.n,
                "m": p.m,
                "alphabet_sizes": list(p.alphabet_sizes),
                "epsilon": p.epsilon,
                "gamma": p.gamma,
            },
            "all_curators": list(resp.all_curators) or list(resp.curators),
            "curators": list(resp.curators),
            "attributes": list(resp.attributes),
            "cells": [{"labels": list(c.labels), **{col: getattr(c, col) for col in CELL_COLUMNS}} for c in resp.cells],
            "mle_iterations": resp.mle_iterations,
            "interval_method": resp.interval_method,
            "refused": dict(resp.refused),
        }
    )
