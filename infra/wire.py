"""The wire: the only module where protobuf messages become domain values and back.

Release parameters <-> :class:`~secure_release.mechanism.spec.ReleaseSpec` (with the release
kind: curator- or server-sampled, and the stored table), cipher enum <->
:class:`~secure_release.mechanism.pads.CipherMode`, curator schemas, id-tag chunks, stored-table
chunks and status (server-side sampling), the server's sample chunks, and the researcher's
:class:`~secure_release.mechanism.report.ReleaseReport` <-> ``EstimateResponse``.
Decoding validates: a message that does not make a valid domain value raises a named error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.alignment import TAG_DTYPE, TagArray
from secure_release.mechanism.errors import SecureReleaseError, ShapeMismatchError, UnknownCipherError
from secure_release.mechanism.index_sharing import (
    IndexArray,
    indices_fingerprint,
    packed_size,
    sample_set_fingerprint,
    unpack_indices,
)
from secure_release.mechanism.packing import CHUNK_ROWS
from secure_release.mechanism.pads import CipherMode
from secure_release.mechanism.plan import ReleasePlan
from secure_release.mechanism.psi import POINT_BYTES
from secure_release.mechanism.report import CELL_COLUMNS, ReleaseReport
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.mechanism.spec import ReleaseSpec, check_name, check_names, check_party_name
from secure_release.mechanism.variants import AlignmentMode, SamplingMode, UnknownVariantError
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

TAG_BYTES = TAG_DTYPE.itemsize
#: At most 1 MiB of tags a message.
TAGS_PER_CHUNK = (1 << 20) // TAG_BYTES

#: At most 1 MiB of payload bytes a message (packed indices, PSI points).
PIECE_BYTES = 1 << 20
#: At most 1 MiB of 32-byte PSI points a message.
POINTS_PER_CHUNK = PIECE_BYTES // POINT_BYTES

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


def byte_pieces(raw: bytes, size: int = PIECE_BYTES) -> list[bytes]:
    """``raw`` in pieces of at most ``size`` bytes ([] for no bytes)."""
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def point_chunks(release_id: str, curator: str, owner: str, hop: int, points: bytes) -> Iterator[pb.PsiChunk]:
    """One PSI ring list (concatenated 32-byte points) as PsiChunk messages of at most 1 MiB;
    the first carries the list's point count."""
    if len(points) % POINT_BYTES:
        raise ShapeMismatchError(f"{len(points)} bytes is not a whole number of {POINT_BYTES}-byte points")
    pieces = byte_pieces(points, POINTS_PER_CHUNK * POINT_BYTES) or [b""]
    for seq, piece in enumerate(pieces):
        yield pb.PsiChunk(
            release_id=release_id,
            curator=curator,
            owner=owner,
            hop=hop,
            sequence=seq,
            count=len(points) // POINT_BYTES if seq == 0 else 0,
            points=piece,
            last=seq == len(pieces) - 1,
        )


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


# ---------------------------------------------------------------------------------- stored tables
@dataclass(frozen=True)
class TableDeclaration:
    """What the first message of a StoreTable stream declares (validated names and sizes)."""

    table_id: str
    curator: str
    curators: tuple[str, ...]
    n: int
    alphabet_size: int


def table_chunks(
    declaration: TableDeclaration, chunks: Sequence[bytes], skip: frozenset[int] = frozenset()
) -> Iterator[pb.TableChunk]:
    """A StoreTable stream: the declaration on the first message, every chunk not in ``skip``
    (packed, at most 1 MiB each), then the commit with the digest over all chunks and the count."""
    d = declaration

    def message(first: bool, **fields: object) -> pb.TableChunk:
        msg = pb.TableChunk(table_id=d.table_id, curator=d.curator, **fields)  # type: ignore[arg-type]
        if first:
            msg.curators.extend(d.curators)
            msg.n, msg.alphabet_size = d.n, d.alphabet_size
        return msg

    first = True
    h = hashlib.sha256()
    for seq, data in enumerate(chunks):
        h.update(data)
        if seq in skip:
            continue
        yield message(first, sequence=seq, symbols=data)
        first = False
    yield message(first, commit=True, digest=h.digest(), num_chunks=len(chunks))


def table_declaration_from_pb(chunk: pb.TableChunk) -> TableDeclaration:
    """The declaration of a StoreTable stream's first message (InvalidNameError, ShapeMismatchError)."""
    table_id = check_name(chunk.table_id, "table id")
    curators = check_names(list(chunk.curators), "curator", minimum=2)
    curator = check_party_name(chunk.curator, "curator name")
    if chunk.n < 1:
        raise ShapeMismatchError(f"a stored table needs n >= 1 rows, got {chunk.n}")
    if chunk.alphabet_size < 2:
        raise ShapeMismatchError(f"alphabet size must be >= 2, got {chunk.alphabet_size}")
    return TableDeclaration(table_id, curator, curators, int(chunk.n), int(chunk.alphabet_size))


def table_num_chunks(n: int) -> int:
    """Upload chunks of CHUNK_ROWS symbols a stored table of ``n`` rows takes."""
    return -(-n // CHUNK_ROWS)


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


# ---------------------------------------------------------------------------------- server samples
class SampleStreamError(SecureReleaseError):
    """A FetchSample stream that is out of order, too long, or whose fingerprint does not match."""


def sample_chunks(release_id: str, table_id: str, n: int, m: int, packed: bytes) -> Iterator[pb.SampleChunk]:
    """The server's packed position tuple as SampleChunk messages of at most 1 MiB; the last
    carries its fingerprint."""
    pieces = byte_pieces(packed) or [b""]
    for seq, piece in enumerate(pieces):
        last = seq == len(pieces) - 1
        yield pb.SampleChunk(
            release_id=release_id, table_id=table_id, n=n, m=m, sequence=seq, packed_positions=piece, last=last,
            sample_fingerprint=indices_fingerprint(packed) if last else "",
        )  # fmt: skip


@dataclass(frozen=True)
class ServerSample:
    """The positions a curator received for one server-sampled release (validated)."""

    positions: IndexArray
    packed: bytes
    fingerprint: str  # sample_set_fingerprint(positions): the ledger's reuse check (any order of one set)


def sample_from_chunks(chunks: Iterable[pb.SampleChunk], spec: ReleaseSpec) -> ServerSample:
    """Join a FetchSample stream for ``spec``: chunks in order, for its release, table, n and m,
    no more bytes than m positions over n take (checked while they arrive), then unpacked and
    validated (range, distinctness: InvalidIndexTupleError) and the fingerprint checked."""
    limit, got, pieces, fingerprint = packed_size(spec.n, spec.m), 0, [], ""
    for seq, chunk in enumerate(chunks):
        if chunk.sequence != seq:
            raise SampleStreamError(f"the server sent sample chunk {chunk.sequence} where {seq} was due")
        if (chunk.release_id, chunk.table_id, chunk.n, chunk.m) != (spec.release_id, spec.table_id, spec.n, spec.m):
            raise SampleStreamError(
                f"the server sent a sample of release {chunk.release_id!r} (table {chunk.table_id!r}, n = {chunk.n}, "
                f"m = {chunk.m}); expected {spec.release_id!r} (table {spec.table_id!r}, n = {spec.n}, m = {spec.m})"
            )
        got += len(chunk.packed_positions)
        if got > limit or len(chunk.packed_positions) > PIECE_BYTES:
            raise SampleStreamError(f"the server sent more than the {limit} bytes m positions over n take")
        pieces.append(chunk.packed_positions)
        fingerprint = chunk.sample_fingerprint or fingerprint
    packed = b"".join(pieces)
    positions = unpack_indices(packed, spec.n, spec.m)
    if fingerprint != indices_fingerprint(packed):
        raise SampleStreamError("the sample's fingerprint does not match its positions")
    # the ledger's reuse check takes the order-insensitive fingerprint: a reordered sample is the same sample
    return ServerSample(positions, packed, sample_set_fingerprint(positions))


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


# ---------------------------------------------------------------------------------- tags
class TagPieces(Sequence[bytes]):
    """Tags as byte pieces of at most ``TAGS_PER_CHUNK`` tags (at least one piece), each made
    when it is asked for: a sender never holds a second copy of all its tags."""

    def __init__(self, tags: TagArray) -> None:
        self._tags = np.ascontiguousarray(tags, dtype=TAG_DTYPE)

    def __len__(self) -> int:
        return max(1, -(-self._tags.size // TAGS_PER_CHUNK))

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        start = (index % len(self)) * TAGS_PER_CHUNK
        return self._tags[start : start + TAGS_PER_CHUNK].tobytes()


def _pieces(tags: TagArray) -> TagPieces:
    return TagPieces(tags)


class TagBuffer:
    """Tag bytes joined as they arrive, in one growing buffer (no list of pieces, no second
    copy); :meth:`tags` views it as a TagArray."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def __len__(self) -> int:
        return len(self._buffer)

    def add(self, piece: bytes) -> None:
        self._buffer += piece

    def tags(self) -> TagArray:
        if len(self._buffer) % TAG_BYTES:
            raise ShapeMismatchError(f"{len(self._buffer)} tag bytes is not a multiple of {TAG_BYTES}")
        return np.frombuffer(self._buffer, dtype=TAG_DTYPE)


def tag_chunks(
    release_id: str,
    curator: str,
    tags: TagArray,
    alphabet_size: int,
    alignment: AlignmentMode = AlignmentMode.KEYED_HASH,
) -> Iterator[pb.TagChunk]:
    """A curator's id tags (made by ``alignment``) as TagChunk messages of at most 1 MiB."""
    pieces = _pieces(tags)
    for seq, piece in enumerate(pieces):
        yield pb.TagChunk(
            release_id=release_id,
            curator=curator,
            sequence=seq,
            tags=piece,
            last=seq == len(pieces) - 1,
            alphabet_size=alphabet_size,
            alignment=alignment_to_pb(alignment),
        )


ROW_BYTES = 4  # a row index in an agreement: uint32, little-endian
ROWS_PER_PIECE = PIECE_BYTES // ROW_BYTES


def row_pieces(rows: npt.NDArray[np.int64]) -> Iterator[bytes]:
    """A curator's row order as uint32 little-endian pieces of at most 1 MiB, made lazily
    (rows below 2^32: the leader takes at most --max-rows tags a curator)."""
    if rows.size == 0:
        yield b""
    for start in range(0, rows.size, ROWS_PER_PIECE):
        yield rows[start : start + ROWS_PER_PIECE].astype("<u4").tobytes()


def tag_pieces(tags: TagArray) -> TagPieces:
    """Tags as byte pieces of at most 1 MiB (for AgreementChunk.common_tags), made lazily."""
    return _pieces(tags)


def tags_from_bytes(raw: bytes) -> TagArray:
    if len(raw) % TAG_BYTES:
        raise ShapeMismatchError(f"{len(raw)} tag bytes is not a multiple of {TAG_BYTES}")
    return np.frombuffer(raw, dtype=TAG_DTYPE).copy()


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
