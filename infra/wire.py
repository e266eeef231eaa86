"""The wire: the only module where protobuf messages become domain values and back.

Release parameters <-> :class:`~secure_release.mechanism.protocol.spec.ReleaseSpec` (with the release
kind: curator- or server-sampled, and the stored table), the mode enums (cipher, sampling,
alignment), curator schemas, a stored table's status, a curator's declaration of a release and
its refusal before the agreement (:class:`Declaration`, :class:`Refusal`), and the researcher's
:class:`~secure_release.mechanism.estimation.report.ReleaseReport` <-> ``EstimateResponse``. The chunked
streams (tags, PSI lists, the agreement, uploads, tables, samples, perturbed rows, keys) live
in :mod:`.streams`, each encoder beside its decoder.
Decoding validates: a message that does not make a valid domain value raises a named error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from secure_release.mechanism.errors import MultiTableResultError, SecureReleaseError, UnknownCipherError
from secure_release.mechanism.estimation.report import CELL_COLUMNS, ReleaseReport, TablesReport
from secure_release.mechanism.primitives.packing import CHUNK_ROWS
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.plan import ReleasePlan
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode, UnknownVariantError
from secure_release.mechanism.protocol.spec import MAX_PARTIES, ReleaseSpec, check_name, check_party_name
from secure_release.mechanism.protocol.tables import TableLayout
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
        tables=[pb.TableParams(m=t.m, gamma=t.gamma, alphabet_sizes=list(t.alphabet_sizes)) for t in spec.tables],
        design_digest=spec.design_digest,
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
        tables=tuple(TableLayout(int(t.m), float(t.gamma), tuple(int(k) for k in t.alphabet_sizes)) for t in p.tables),
        design_digest=p.design_digest,
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
    """An ``EstimateResponse`` as the :class:`ReleaseReport` it was made from; a release of several
    tables (``tables_json``) raises :class:`MultiTableResultError` (read it with
    :func:`tables_report_from_pb`), never an empty table."""
    if resp.tables_json:
        raise MultiTableResultError(
            f"release {resp.release_id!r} is a release of several tables; read it with tables_report_from_pb"
        )
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


# ---------------------------------------------------------------------------------- refusals
#: A refusal's public detail: at most this many printable characters (an error's name and a
#: public count, never a value of the data).
MAX_REFUSAL_DETAIL = 200


class RefusalClass(StrEnum):
    """Why a curator refuses a release, as every party is told (never the data)."""

    BUDGET = "budget"  # no budget set for the data set, or too little left
    DATA = "data"  # a data check failed: bad rows, a repeated id, a table that changed
    KEY = "key"  # a key or certificate refused
    SEED = "seed"  # a seed or pad reused


_PB_OF_REFUSAL = {
    RefusalClass.BUDGET: pb.REFUSAL_CLASS_BUDGET,
    RefusalClass.DATA: pb.REFUSAL_CLASS_DATA,
    RefusalClass.KEY: pb.REFUSAL_CLASS_KEY,
    RefusalClass.SEED: pb.REFUSAL_CLASS_SEED,
}
_REFUSAL_OF_PB = {v: k for k, v in _PB_OF_REFUSAL.items()}


class DeclarationError(SecureReleaseError):
    """A release declaration or refusal out of bounds: a bad name, too many parties, a party
    named twice, an unknown reason class, a detail too long or not printable (INVALID_ARGUMENT:
    nothing is stored)."""


@dataclass(frozen=True)
class Declaration:
    """One curator's record of a release: the parties it takes part with and, if it refuses,
    the reason class and a short public detail."""

    release_id: str
    curator: str
    parties: tuple[str, ...] = ()
    refusal: RefusalClass | None = None
    detail: str = ""

    def validate(self) -> Declaration:
        """Itself if every field is within its bounds, else :class:`DeclarationError`."""
        try:
            check_name(self.release_id, "release id")
            check_party_name(self.curator, "curator")
            for party in self.parties:
                check_party_name(party, "party")
        except SecureReleaseError as exc:
            raise DeclarationError(str(exc)) from None
        if len(self.parties) > MAX_PARTIES:
            raise DeclarationError(f"a declaration names at most {MAX_PARTIES} parties, got {len(self.parties)}")
        if len(set(self.parties)) != len(self.parties):
            raise DeclarationError(f"a declaration names each party once, got {list(self.parties)}")
        if self.parties and self.curator not in self.parties:
            raise DeclarationError(f"curator {self.curator!r} declares parties {list(self.parties)} without itself")
        if len(self.detail) > MAX_REFUSAL_DETAIL or not self.detail.isprintable():
            raise DeclarationError(
                f"a refusal's detail is at most {MAX_REFUSAL_DETAIL} printable characters, got {len(self.detail)}"
            )
        if self.refusal is None and self.detail:
            raise DeclarationError("a detail needs a reason class (a declaration without a refusal carries none)")
        return self


@dataclass(frozen=True)
class Refusal:
    """A curator's refusal of a release, as the other parties see it."""

    release_id: str
    curator: str
    reason_class: RefusalClass
    detail: str = ""

    def message(self) -> str:
        """One line for the other parties' last line: marked as a refusal (exit 3), naming the
        curator and the reason class."""
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"refused: {self.curator} refuses release {self.release_id!r} before the agreement: "
            f"{self.reason_class.value}{detail}"
        )


def _refusal_class_from_pb(value: int) -> RefusalClass | None:
    if value == pb.REFUSAL_CLASS_UNSPECIFIED:
        return None
    try:
        return _REFUSAL_OF_PB[value]  # type: ignore[index]
    except KeyError:
        raise DeclarationError(
            f"unknown refusal class {value}; allowed: "
            + ", ".join(f"{c.value} ({int(v)})" for c, v in _PB_OF_REFUSAL.items())
        ) from None


def check_release_id(release_id: str) -> str:
    """``release_id`` if it follows the grammar, else :class:`DeclarationError`."""
    return Declaration(release_id, "x").validate().release_id


def declaration_to_pb(d: Declaration) -> pb.ReleaseDeclaration:
    return pb.ReleaseDeclaration(
        release_id=d.release_id,
        curator=d.curator,
        parties=list(d.parties),
        reason_class=_PB_OF_REFUSAL[d.refusal] if d.refusal is not None else pb.REFUSAL_CLASS_UNSPECIFIED,
        detail=d.detail,
    )


def declaration_from_pb(m: pb.ReleaseDeclaration) -> Declaration:
    """The validated declaration (:class:`DeclarationError` if out of bounds)."""
    return Declaration(
        str(m.release_id), str(m.curator), tuple(str(p) for p in m.parties),
        _refusal_class_from_pb(int(m.reason_class)), str(m.detail),
    ).validate()  # fmt: skip


def refusals_to_pb(refusals: Iterable[Refusal]) -> pb.RefusalList:
    return pb.RefusalList(
        refusals=[
            pb.Refusal(release_id=r.release_id, curator=r.curator, reason_class=_PB_OF_REFUSAL[r.reason_class],
                       detail=r.detail)
            for r in refusals
        ]
    )  # fmt: skip


def refusals_from_pb(m: pb.RefusalList) -> list[Refusal]:
    """The validated refusals of a list (:class:`DeclarationError` for one out of bounds; an
    UNSPECIFIED class is not a refusal)."""
    out = []
    for r in m.refusals:
        d = Declaration(str(r.release_id), str(r.curator), (), _refusal_class_from_pb(int(r.reason_class)),
                        str(r.detail)).validate()  # fmt: skip
        if d.refusal is None:
            raise DeclarationError(f"a refusal of {d.curator!r} carries no reason class")
        out.append(Refusal(d.release_id, d.curator, d.refusal, d.detail))
    return out


def tables_to_pb(report: TablesReport) -> pb.EstimateResponse:
    """A release of several tables as an ``EstimateResponse`` (its JSON in ``tables_json``)."""
    return pb.EstimateResponse(release_id=report.release_id,
                               tables_json=json.dumps(report.to_dict(), allow_nan=False))  # fmt: skip


def tables_report_from_pb(resp: pb.EstimateResponse) -> TablesReport | None:
    """The :class:`TablesReport` of a release of several tables; None for a single table."""
    if not resp.tables_json:
        return None
    return TablesReport.from_dict(json.loads(resp.tables_json))
