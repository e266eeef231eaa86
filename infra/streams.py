"""Every chunked gRPC stream of the protocol, each encoder beside its decoder.

A stream is a sequence of messages of at most 1 MiB of payload each; a decoder checks order,
names and bounds while the stream arrives (before it buffers more than the bound allows) and
raises a named error. The streams, in protocol order:

- tags (``SubmitTags``): :func:`tag_chunks` / :func:`read_tag_stream`
- PSI ring lists (``PsiSend``, ``PsiReceive``): :func:`point_chunks` / :func:`read_point_stream`
- the agreement (``GetAgreement``): :func:`agreement_chunks` / :func:`agreement_from_chunks`
- ciphertext (``UploadCiphertext``): :func:`upload_chunks` / :func:`upload_from_chunks`
- stored tables (``StoreTable``): :func:`table_chunks` / :func:`table_declaration_from_pb`
- the server's sample (``FetchSample``): :func:`sample_chunks` / :func:`sample_from_chunks`
- perturbed rows (``FetchPerturbed``): :func:`perturbed_chunks` / :func:`perturbed_from_chunks`
- a curator's key (``ReleaseKey``): :func:`key_chunks` / :func:`key_from_chunks`

The server stores upload and table chunks one by one as they arrive (idempotent, digest-checked
at the commit: server/state.py, server/tables.py); :func:`upload_from_chunks` is the same
stream's reference decoder for one whole stream in memory.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload

import numpy as np
import numpy.typing as npt

from secure_release.infra.wire import (
    alignment_from_pb,
    alignment_to_pb,
    cipher_to_pb,
    sampling_from_pb,
    sampling_to_pb,
    schema_to_pb,
    spec_from_pb,
    spec_to_pb,
)
from secure_release.mechanism.alignment.keyed_hash import TAG_BYTES as TAG_BYTES  # the wire's tag size, defined once
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, TagArray
from secure_release.mechanism.alignment.psi import POINT_BYTES
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, digest_of, pack_symbols
from secure_release.mechanism.primitives.pads import CipherMode, ReleasePad
from secure_release.mechanism.protocol.architectures import AlignmentMode, SamplingMode, VariantAgreement
from secure_release.mechanism.protocol.in_memory import Agreement
from secure_release.mechanism.protocol.index_sharing import (
    IndexArray,
    indices_fingerprint,
    packed_size,
    sample_set_fingerprint,
    unpack_indices,
)
from secure_release.mechanism.protocol.spec import ReleaseSpec, check_name, check_names, check_party_name
from secure_release.mechanism.schema import CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

#: At most 1 MiB of tags a message.
TAGS_PER_CHUNK = (1 << 20) // TAG_BYTES
#: At most 1 MiB of payload bytes a message (packed indices, PSI points).
PIECE_BYTES = 1 << 20
#: At most 1 MiB of PSI points (33 bytes each, mechanism.alignment.psi.POINT_BYTES) a message.
POINTS_PER_CHUNK = PIECE_BYTES // POINT_BYTES


# ---------------------------------------------------------------------------------- errors
class AgreementError(SecureReleaseError):
    """The agreement failed, or the leader's spec contradicts this curator's own settings."""

    kind = ErrorKind.FAILED_PRECONDITION


class CallerNotAllowedError(SecureReleaseError):
    """The caller's certificate name may not do this for this release (impersonation, not a
    member, or no grant)."""

    kind = ErrorKind.PERMISSION_DENIED


class TagStreamError(SecureReleaseError):
    """A tag stream is malformed: chunks out of order, or more than one release."""


class TagLimitError(SecureReleaseError):
    """A curator sent more tags than the leader accepts (``--max-rows``)."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


class PsiStreamError(SecureReleaseError):
    """A PSI ring list is malformed or unexpected: chunks out of order, a count that differs from
    the owner's list, a sender or hop the ring does not route here, or a different resend."""


class FetchError(SecureReleaseError):
    """The perturbed rows or a curator's key did not arrive in the form the release promises."""

    kind = ErrorKind.FAILED_PRECONDITION


class SampleStreamError(SecureReleaseError):
    """A FetchSample stream that is out of order, too long, or whose fingerprint does not match."""


# ---------------------------------------------------------------------------------- pieces
def byte_pieces(raw: bytes, size: int = PIECE_BYTES) -> list[bytes]:
    """``raw`` in pieces of at most ``size`` bytes ([] for no bytes)."""
    return [raw[i : i + size] for i in range(0, len(raw), size)]


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


#: Parts a follower's tags may arrive in (``TagChunk.parts``): concurrent streams, one a shard range.
MAX_TAG_PARTS = 64


@dataclass(frozen=True)
class TagPart:
    """Which part of a follower's tags one stream carries (``TagChunk.part``, ``parts``,
    ``first_row``): part ``index`` of ``count``, its tags' rows ``first_row`` + their index in
    the part. The whole tags in one stream are part 0 of 1 from row 0 (:data:`WHOLE_STREAM`)."""

    index: int = 0
    count: int = 1
    first_row: int = 0

    @property
    def whole(self) -> bool:
        return self.count == 1


WHOLE_STREAM = TagPart()


def tag_chunks(
    release_id: str,
    curator: str,
    tags: TagArray | Iterable[TagArray],
    alphabet_size: int,
    alignment: AlignmentMode = AlignmentMode.KEYED_HASH,
    part: TagPart = WHOLE_STREAM,
) -> Iterator[pb.TagChunk]:
    """A curator's id tags (made by ``alignment``) as TagChunk messages of at most 1 MiB; ``tags``
    may be one array or arrays made one at a time (a sharded table's shards, in order). ``part``:
    which part of the curator's tags they are (the whole stream sends no part fields, so a leader
    from before parts reads it as always)."""
    arrays = [tags] if isinstance(tags, np.ndarray) else tags
    pieces = (piece for array in arrays for piece in _pieces(array) if piece)
    previous: bytes | None = None
    seq = 0
    for piece in pieces:
        if previous is not None:
            yield _tag_chunk(release_id, curator, seq, previous, False, alphabet_size, alignment, part)
            seq += 1
        previous = piece
    yield _tag_chunk(release_id, curator, seq, previous or b"", True, alphabet_size, alignment, part)


def _tag_chunk(
    release_id: str, curator: str, seq: int, piece: bytes, last: bool, alphabet_size: int, alignment: AlignmentMode,
    part: TagPart = WHOLE_STREAM,
) -> pb.TagChunk:  # fmt: skip
    chunk = pb.TagChunk(
        release_id=release_id,
        curator=curator,
        sequence=seq,
        tags=piece,
        last=last,
        alphabet_size=alphabet_size,
        alignment=alignment_to_pb(alignment),
    )
    if not part.whole:
        chunk.part, chunk.parts, chunk.first_row = part.index, part.count, part.first_row
    return chunk


def _part_of(chunk: pb.TagChunk) -> TagPart:
    """The part a chunk says it carries, checked for shape (no part beyond ``parts``, at most
    :data:`MAX_TAG_PARTS`, a whole stream from row 0); its rows are checked against the
    leader's bound by :class:`TagStream` and against the other parts by the leader."""
    if chunk.parts > MAX_TAG_PARTS:
        raise TagStreamError(f"tags in {chunk.parts} parts; a leader takes at most {MAX_TAG_PARTS} parts a curator")
    if chunk.parts <= 1:
        if chunk.part or chunk.first_row:
            raise TagStreamError(
                f"a whole tag stream (parts = {chunk.parts}) is part 0 from row 0, not part {chunk.part} from row "
                f"{chunk.first_row}"
            )
        return WHOLE_STREAM
    if chunk.part >= chunk.parts:
        raise TagStreamError(f"tag part {chunk.part} of {chunk.parts}: parts are numbered 0 to {chunk.parts - 1}")
    return TagPart(int(chunk.part), int(chunk.parts), int(chunk.first_row))


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


@dataclass(frozen=True)
class TagSubmission:
    """One curator's tag stream, read and checked."""

    release_id: str
    tags: TagArray
    alphabet_size: int
    alignment: AlignmentMode = AlignmentMode.KEYED_HASH


def read_tag_stream(chunks: Iterable[pb.TagChunk], sender: str, admit: Callable[[str], int]) -> TagSubmission:
    """Join a TagChunk stream sent by certificate name ``sender``. ``admit(release_id)`` runs on
    the first chunk, before any tag byte is kept: it refuses a sender that is not a curator of
    a release led here, and returns how many tag bytes the sender may send (more: a
    :class:`TagLimitError`). Named errors too if a chunk claims another curator, another
    release or the wrong sequence number."""
    stream = TagStream(chunks, sender, admit)
    pieces = TagBuffer()
    for piece in stream.pieces():
        pieces.add(piece)
    return TagSubmission(stream.release_id, pieces.tags(), stream.alphabet_size, stream.alignment)


class TagStream:
    """A TagChunk stream read one chunk at a time (what :func:`read_tag_stream` joins): the
    header fields are known once the first chunk was read (:meth:`start`)."""

    def __init__(self, chunks: Iterable[pb.TagChunk], sender: str, admit: Callable[[str], int]) -> None:
        self._chunks = iter(chunks)
        self._sender, self._admit = sender, admit
        self.release_id, self.alphabet_size, self.received = "", 0, 0
        self.alignment = AlignmentMode.KEYED_HASH
        self.part = WHOLE_STREAM  # which part of the sender's tags this stream carries
        self._first: pb.TagChunk | None = None
        self._limit = 0

    def start(self) -> None:
        """Read and admit the first chunk (the header); idempotent."""
        if self._first is None:
            first = next(self._chunks, None)
            if first is None:
                raise TagStreamError("an empty tag stream (no chunk came: the sender sent none or cancelled the call)")
            self._check(first, 0)
            self._first = first

    def _check(self, chunk: pb.TagChunk, expected_seq: int) -> None:
        if chunk.curator != self._sender:
            raise CallerNotAllowedError(f"certificate name {self._sender!r} may not submit tags as {chunk.curator!r}")
        if expected_seq == 0:
            self._limit = self._admit(chunk.release_id)
            self.alignment = alignment_from_pb(chunk.alignment)
            self.part = _part_of(chunk)
        elif chunk.release_id != self.release_id:
            raise TagStreamError(f"one release per tag stream: {self.release_id!r}, then {chunk.release_id!r}")
        elif _part_of(chunk) != self.part:
            raise TagStreamError(f"one part per tag stream: {self.part}, then {_part_of(chunk)}")
        if chunk.sequence != expected_seq:
            raise TagStreamError(f"tag chunk {chunk.sequence} out of order (expected {expected_seq})")
        self.received += len(chunk.tags)
        if self.part.first_row * TAG_BYTES + self.received > self._limit:  # a part's rows stay below --max-rows
            where = "" if self.part.whole else f" (part {self.part.index} of its tags, from row {self.part.first_row})"
            raise TagLimitError(
                f"{self._sender!r} sent more than {self._limit // TAG_BYTES} tags for release {chunk.release_id!r}"
                f"{where}; the leader accepts at most --max-rows tags a curator"
            )
        self.release_id = chunk.release_id
        self.alphabet_size = self.alphabet_size or int(chunk.alphabet_size)

    def pieces(self) -> Iterator[bytes]:
        """Each chunk's tag bytes, checked, until the chunk marked last (a stream that stops
        before it is cut short: :class:`TagStreamError`, so a part cut short never counts as
        ended)."""
        self.start()
        chunk = self._first
        assert chunk is not None
        seq = 0
        while True:
            yield chunk.tags
            if chunk.last:
                return
            seq += 1
            nxt = next(self._chunks, None)
            if nxt is None:
                raise TagStreamError(f"the tag stream stopped after chunk {seq - 1}, before its last chunk")
            self._check(nxt, seq)
            chunk = nxt

    def arrays(self) -> Iterator[TagArray]:
        """:meth:`pieces` as tag arrays (each a whole number of tags)."""
        for piece in self.pieces():
            yield tags_from_bytes(piece)


# ---------------------------------------------------------------------------------- PSI ring lists
def point_chunks(
    release_id: str, curator: str, owner: str, hop: int, points: bytes, proof: bytes = b"", public_key: bytes = b"",
    slice_of: tuple[int, int, int, int] | None = None,
) -> Iterator[pb.PsiChunk]:  # fmt: skip
    """One PSI ring list (concatenated POINT_BYTES-byte points) as PsiChunk messages of at most 1 MiB;
    the first carries the list's point count (and a re-blinding's proof and public key).
    ``slice_of``: the points are one slice of a sliced list, (index, slices, first point, points
    of the list), and the first chunk says so."""
    if len(points) % POINT_BYTES:
        raise ShapeMismatchError(f"{len(points)} bytes is not a whole number of {POINT_BYTES}-byte points")
    pieces = byte_pieces(points, POINTS_PER_CHUNK * POINT_BYTES) or [b""]
    for seq, piece in enumerate(pieces):
        chunk = pb.PsiChunk(
            release_id=release_id,
            curator=curator,
            owner=owner,
            hop=hop,
            sequence=seq,
            count=len(points) // POINT_BYTES if seq == 0 else 0,
            points=piece,
            last=seq == len(pieces) - 1,
            proof=proof if seq == 0 else b"",
            public_key=public_key if seq == 0 else b"",
        )
        if slice_of is not None and seq == 0:
            chunk.slice, chunk.slices, chunk.first_point, chunk.list_count = slice_of
        yield chunk


@dataclass(frozen=True)
class PsiList:
    """One PSI ring list (or one slice of it), read and checked."""

    release_id: str
    owner: str
    hop: int
    points: bytes
    proof: bytes = b""  # hop >= 2: the sender's re-blinding proof (mechanism/alignment/psi_proof.py)
    public_key: bytes = b""
    slice: tuple[int, int, int, int] | None = None  # a slice: (index, slices, first point, points of the list)


def read_point_stream(
    chunks: Iterable[pb.PsiChunk], sender: str | None, admit: Callable[[pb.PsiChunk], None] | None = None
) -> PsiList:
    """Join a PsiChunk stream. ``admit(first chunk)`` runs before any point is kept (membership,
    route, count bound); every chunk must name the same release, owner and hop (and, when
    ``sender`` is given, that sender), come in order, hold at most 1 MiB, and together exactly
    the announced number of POINT_BYTES-byte points."""
    pieces: list[bytes] = []
    first: pb.PsiChunk | None = None
    received = 0
    for seq, chunk in enumerate(chunks):
        if sender is not None and chunk.curator != sender:
            raise CallerNotAllowedError(f"certificate name {sender!r} may not send PSI points as {chunk.curator!r}")
        if first is None:
            if admit is not None:
                admit(chunk)
            first = chunk
        elif (chunk.release_id, chunk.owner, chunk.hop) != (first.release_id, first.owner, first.hop):
            raise PsiStreamError("one PSI list per stream: the release, owner or hop changed")
        if chunk.sequence != seq:
            raise PsiStreamError(f"PSI chunk {chunk.sequence} out of order (expected {seq})")
        received += len(chunk.points)
        if len(chunk.points) > PIECE_BYTES or received > first.count * POINT_BYTES:
            raise PsiStreamError(f"a PSI list sent more than its announced {first.count} points")
        pieces.append(chunk.points)
        if chunk.last:
            break
    if first is None:
        raise PsiStreamError("an empty PSI stream")
    if received != first.count * POINT_BYTES:
        raise PsiStreamError(f"a PSI list announced {first.count} points and sent {received} bytes")
    shape = None
    if first.slices:
        shape = (int(first.slice), int(first.slices), int(first.first_point), int(first.list_count))
    return PsiList(
        first.release_id, first.owner, int(first.hop), b"".join(pieces), bytes(first.proof), bytes(first.public_key),
        shape,
    )


# ---------------------------------------------------------------------------------- the agreement
def agreement_chunks(
    agreement: VariantAgreement, rows: npt.NDArray[np.int64] | None = None
) -> Iterator[pb.AgreementChunk]:
    """The agreement as AgreementChunk messages: spec, modes and (seed sampling) the seed on the
    first; the recipient's own ``rows`` in the canonical order (4 bytes a row) or, without them,
    the common tags (16 bytes a tag), in pieces of at most 1 MiB; then (index sharing) the
    packed index tuple in pieces of at most 1 MiB. No chunk carries more than 1 MiB of them."""
    if rows is not None:
        num_main = max(1, -(-rows.size // ROWS_PER_PIECE))
        main: Iterator[tuple[bytes, bytes]] = ((b"", r) for r in row_pieces(rows))  # made as sent
    else:
        tag_part = tag_pieces(agreement.base.common)
        num_main = len(tag_part)
        main = ((t, b"") for t in tag_part)
    index_part = byte_pieces(agreement.packed_indices or b"")
    total = num_main + len(index_part)
    pieces = itertools.chain(((t, r, b"") for t, r in main), ((b"", b"", i) for i in index_part))
    for seq, (tags, own_rows, indices) in enumerate(pieces):
        chunk = pb.AgreementChunk(
            sequence=seq, common_tags=tags, own_rows=own_rows, packed_indices=indices, last=seq == total - 1
        )
        if seq == 0:
            chunk.params.CopyFrom(spec_to_pb(agreement.base.spec))
            chunk.sampling = sampling_to_pb(agreement.sampling)
            chunk.alignment = alignment_to_pb(agreement.alignment)
            if agreement.seed is not None:
                chunk.sampling_seed = agreement.seed.reveal()
        yield chunk


class RowSink(Protocol):
    """Where a follower on a cluster sends its row order as it arrives, instead of one array of
    n rows: :meth:`reset` before each attempt, :meth:`add` for every piece (uint32, in order),
    :meth:`finish` with the total once the stream ended."""

    def reset(self) -> None: ...

    def add(self, rows: npt.NDArray[np.uint32]) -> None: ...

    def finish(self, count: int) -> None: ...


def agreement_from_chunks(chunks: Iterator[pb.AgreementChunk], rows_sink: RowSink | None = None) -> VariantAgreement:
    """Join an AgreementChunk stream into a validated agreement: chunks in order, exactly one of
    seed (SEED) or packed indices (INDICES), the packed tuple no longer than m positions over n
    pack into (checked while it arrives, before it is buffered further) and then unpacked and
    validated (:class:`~secure_release.mechanism.protocol.index_sharing.InvalidIndexTupleError`).
    ``rows_sink``: the recipient's row order goes there piece by piece (the agreement then
    carries its count, not the rows)."""
    first: pb.AgreementChunk | None = None
    tags = TagBuffer()
    rows: npt.NDArray[np.uint32] | None = None  # n rows, filled as they arrive (4 bytes a row, no copy)
    num_rows = 0
    indices: list[bytes] = []
    spec: ReleaseSpec | None = None
    sampling, limit, received = SamplingMode.SEED, 0, 0
    for seq, chunk in enumerate(chunks):
        if chunk.sequence != seq:
            raise AgreementError(f"the leader sent agreement chunk {chunk.sequence} where {seq} was due")
        if first is None:
            first, spec = chunk, spec_from_pb(chunk.params)
            sampling = sampling_from_pb(chunk.sampling)
            limit = packed_size(spec.n, spec.m) if sampling is SamplingMode.INDICES else 0
        assert spec is not None
        received += len(chunk.packed_indices)
        if received > limit or len(chunk.packed_indices) > PIECE_BYTES:
            raise AgreementError(f"the leader sent more packed index bytes than m positions take ({limit})")
        if ROW_BYTES * num_rows + len(chunk.own_rows) > ROW_BYTES * spec.n or len(chunk.own_rows) > PIECE_BYTES:
            raise AgreementError(f"the leader sent more row bytes than n = {spec.n} rows take")
        if len(chunk.own_rows) % ROW_BYTES:
            raise AgreementError(f"the leader sent a row piece of {len(chunk.own_rows)} bytes (4 bytes a row)")
        tags.add(chunk.common_tags)
        if chunk.own_rows:
            piece = np.frombuffer(chunk.own_rows, dtype="<u4")
            if rows_sink is not None:
                rows_sink.add(piece)
                rows = rows if rows is not None else np.zeros(0, dtype="<u4")  # rows arrived
            else:
                rows = np.empty(spec.n, dtype="<u4") if rows is None else rows
                rows[num_rows : num_rows + piece.size] = piece
            num_rows += piece.size
        indices.append(chunk.packed_indices)
    if first is None or spec is None:
        raise AgreementError("the leader sent no agreement")
    alignment = alignment_from_pb(first.alignment)
    common = tags.tags()
    own_rows = None
    if rows is not None:
        if len(common) or num_rows != spec.n:
            got = f"{num_rows} rows (and {len(common)} tags)"
            raise AgreementError(f"the leader sent {got} for n = {spec.n}")
        own_rows = rows  # uint32: half the memory of int64 (10^8 rows: 400 MB, not 800)
        if rows_sink is not None:
            rows_sink.finish(num_rows)
            own_rows = None
    count = num_rows if rows_sink is not None and rows is not None else None
    if sampling is SamplingMode.SEED:
        return VariantAgreement(
            Agreement(spec, Seed(first.sampling_seed), common), sampling, alignment, own_rows=own_rows, count=count
        )
    if first.sampling_seed:
        raise AgreementError("an index-sampled agreement must not carry a seed")
    packed = b"".join(indices)
    unpack_indices(packed, spec.n, spec.m)  # validate now: length, padding, range, distinctness
    # No seed travels with index sharing: the base agreement holds a fresh local seed nobody uses
    # (``agreement_positions`` and ``sample_fingerprint`` read the packed tuple).
    base = Agreement(spec, Seed.generate(), common)
    return VariantAgreement(base, sampling, alignment, packed, own_rows, count=count)


# ---------------------------------------------------------------------------------- ciphertext
def upload_chunks(
    release_id: str, curator: str, chunks: Sequence[bytes], skip: frozenset[int] = frozenset()
) -> Iterator[pb.UploadChunk]:
    """The UploadCiphertext stream: every packed chunk not in ``skip`` (the server already holds
    those), then the commit with the digest and count over all chunks."""
    wanted = (seq for seq in range(len(chunks)) if seq not in skip)
    yield from upload_run(release_id, curator, wanted, chunks.__getitem__)
    yield upload_commit(release_id, curator, len(chunks), digest_of(list(chunks)))


@dataclass(frozen=True)
class Upload:
    """One whole UploadCiphertext stream, joined: the packed chunks by sequence number."""

    release_id: str
    curator: str
    chunks: dict[int, bytes]
    num_chunks: int
    digest: bytes


class UploadStreamError(SecureReleaseError):
    """An upload stream that names two releases or curators, repeats a chunk with other bytes,
    commits a count or digest its chunks do not give, or has no commit."""


def upload_from_chunks(messages: Iterable[pb.UploadChunk]) -> Upload:
    """Join one whole UploadCiphertext stream and check its commit (count and digest over the
    chunks in sequence order)."""
    chunks: dict[int, bytes] = {}
    first: pb.UploadChunk | None = None
    for msg in messages:
        first = first or msg
        if (msg.release_id, msg.curator) != (first.release_id, first.curator):
            raise UploadStreamError("one release and one curator per upload stream")
        if msg.commit:
            if sorted(chunks) != list(range(msg.num_chunks)):
                raise UploadStreamError(f"the commit counts {msg.num_chunks} chunks; the stream held {sorted(chunks)}")
            if digest_of([chunks[i] for i in range(msg.num_chunks)]) != msg.digest:
                raise UploadStreamError("the commit's digest is not the digest of the chunks")
            return Upload(msg.release_id, msg.curator, chunks, int(msg.num_chunks), bytes(msg.digest))
        if chunks.get(msg.sequence, msg.symbols) != msg.symbols:
            raise UploadStreamError(f"chunk {msg.sequence} sent twice with different bytes")
        chunks[int(msg.sequence)] = bytes(msg.symbols)
    raise UploadStreamError("the upload stream ended without a commit")


def upload_run(
    release_id: str, curator: str, seqs: Iterable[int], chunk_of: Callable[[int], bytes]
) -> Iterator[pb.UploadChunk]:
    """The data messages of one UploadCiphertext stream: chunk ``seq`` for each of ``seqs``, in
    that order, each packed (``chunk_of(seq)``) only when the stream asks for it, so a sender
    holds one chunk a stream (no commit: :func:`upload_commit` ends the upload)."""
    for seq in seqs:
        yield pb.UploadChunk(release_id=release_id, curator=curator, sequence=seq, symbols=chunk_of(seq))


def upload_commit(release_id: str, curator: str, num_chunks: int, digest: bytes) -> pb.UploadChunk:
    """The commit of an upload: its chunk count and the SHA-256 over all its chunks in order
    (:func:`upload_digest`). It may travel alone in a stream of its own."""
    return pb.UploadChunk(release_id=release_id, curator=curator, commit=True, digest=digest, num_chunks=num_chunks)


def upload_digest(num_chunks: int, chunk_of: Callable[[int], bytes]) -> bytes:
    """The commit's digest over ``chunk_of(0)``, ..., ``chunk_of(num_chunks - 1)`` in one pass,
    one chunk in memory at a time (what ``digest_of`` gives for the list of them)."""
    hasher = hashlib.sha256()
    for seq in range(num_chunks):
        hasher.update(chunk_of(seq))
    return hasher.digest()


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


# ---------------------------------------------------------------------------------- the server's sample
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


# ---------------------------------------------------------------------------------- perturbed rows
def perturbed_chunks(
    release_id: str, columns_by_chunk: Iterable[tuple[int, int, Sequence[bytes]]], num_chunks: int, digest: bytes
) -> Iterator[pb.PerturbedChunk]:
    """The FetchPerturbed stream: (sequence, first row, one packed column per curator) for every
    chunk; the last carries the digest over every column chunk by chunk."""
    for seq, first_row, columns in columns_by_chunk:
        last = seq == num_chunks - 1
        yield pb.PerturbedChunk(release_id=release_id, sequence=seq, first_row=first_row, columns=list(columns),
                                last=last, digest=digest if last else b"")  # fmt: skip


def perturbed_from_chunks(chunks: Iterable[pb.PerturbedChunk], spec: ReleaseSpec) -> tuple[list[bytes], bytes, bytes]:
    """Join the streamed columns; return them, the SHA-256 over every column chunk by chunk
    (the server's digest) and the digest the last chunk carries."""
    stream = PerturbedStream(chunks, spec)
    parts: list[list[bytes]] = [[] for _ in spec.curators]
    for columns in stream.columns():
        for column_parts, column in zip(parts, columns, strict=True):
            column_parts.append(column)
    return [b"".join(p) for p in parts], stream.computed, stream.streamed


class PerturbedStream:
    """A PerturbedChunk stream read chunk by chunk (what :func:`perturbed_from_chunks` joins):
    :meth:`columns` yields each chunk's packed column of every curator, checked in order; once it
    is exhausted, ``computed`` is the SHA-256 over every column chunk by chunk (the server's
    digest) and ``streamed`` the digest the last chunk carries."""

    def __init__(self, chunks: Iterable[pb.PerturbedChunk], spec: ReleaseSpec) -> None:
        self._chunks, self._spec = chunks, spec
        self.computed, self.streamed = b"", b""

    def columns(self) -> Iterator[list[bytes]]:
        spec, hasher = self._spec, hashlib.sha256()
        for expected_seq, chunk in enumerate(self._chunks):
            if chunk.sequence != expected_seq or len(chunk.columns) != len(spec.curators):
                raise FetchError(
                    f"perturbed chunk {chunk.sequence} (expected {expected_seq}) has {len(chunk.columns)} columns; "
                    f"the release has {len(spec.curators)} curators"
                )
            for column in chunk.columns:
                hasher.update(column)
            yield list(chunk.columns)
            if chunk.last:
                self.computed, self.streamed = hasher.digest(), bytes(chunk.digest)
                return
        raise FetchError(f"the perturbed stream of {spec.release_id!r} ended before its last chunk")


# ---------------------------------------------------------------------------------- a curator's key
def key_chunks(release_id: str, schema: CuratorSchema, pad: ReleasePad, design: bytes = b"") -> Iterator[pb.KeyChunk]:
    """A release's key as KeyChunk messages: the ChaCha20 key in one, or the one-time pad packed
    CHUNK_ROWS symbols a chunk; the first carries cipher, sizes and ``schema`` (and ``design``, the
    design file of a release of several tables)."""
    head = pb.KeyChunk(
        release_id=release_id,
        curator=schema.name,
        cipher=cipher_to_pb(pad.mode),
        alphabet_size=pad.alphabet_size,
        m=pad.length,
        sequence=0,
        design=design,
    )
    head.schema.CopyFrom(schema_to_pb(schema))
    if pad.mode is CipherMode.CHACHA20:
        assert pad.key is not None
        head.chacha20_key = pad.key.reveal()
        head.last = True
        yield head
        return
    count = max(1, -(-pad.length // CHUNK_ROWS))
    for seq in range(count):
        chunk = head if seq == 0 else pb.KeyChunk(release_id=release_id, curator=schema.name, sequence=seq)
        start = seq * CHUNK_ROWS
        chunk.otp_pad = pack_symbols(pad.pad(start, min(CHUNK_ROWS, pad.length - start)), pad.alphabet_size)
        chunk.last = seq == count - 1
        yield chunk


def key_from_chunks(chunks: Iterable[pb.KeyChunk]) -> tuple[pb.KeyChunk, bytes] | None:
    """The first KeyChunk (key, schema, sizes) and the joined OTP pad bytes of all chunks
    (None for an empty stream); the caller checks the head against its release."""
    head: pb.KeyChunk | None = None
    otp: list[bytes] = []
    for chunk in chunks:
        head = head or chunk
        otp.append(chunk.otp_pad)
    return None if head is None else (head, b"".join(otp))
