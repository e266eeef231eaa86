"""Stored tables (server-side sampling): pure rules, no I/O.

A stored table is every curator's whole aligned column, each encrypted under that curator's
table key (``mechanism.protocol.server_sampling.curator_store_table``), uploaded once and kept for many
releases. The first curator to upload declares the table (its curators in joint-code order and
n); every other curator must declare the same, plus its own alphabet size. The table is
**complete** once every curator committed its column; only then may a release sample it.

Uploads follow the release rules (server/state.py): chunks of CHUNK_ROWS symbols, each
identified by its SHA-256; an identical replay succeeds in every state (a restarted curator
resumes); a chunk number that already holds other bytes, or a repeated commit with another
digest, is refused with ALREADY_EXISTS, so a table's content never changes once stored (a
changed table needs a new table id: under the same table key the server would learn x - x').
Every method validates completely before it changes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from secure_release.infra.streams import TableDeclaration, table_num_chunks
from secure_release.infra.wire import TablePartView
from secure_release.mechanism.errors import ErrorKind
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, symbol_width
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.server.state import (
    ChunkShapeError,
    ConflictingChunkError,
    IncompleteUploadError,
    LimitExceededError,
    NotACuratorError,
    ParameterMismatchError,
    ServerStateError,
)


class UnknownTableError(ServerStateError):
    """No stored table with that id."""

    kind = ErrorKind.NOT_FOUND


class TableIncompleteError(ServerStateError):
    """A release names a stored table that not every curator has committed yet."""

    kind = ErrorKind.FAILED_PRECONDITION


class TableStoredError(ServerStateError):
    """This curator's column of the table is committed with another digest (content is final)."""

    kind = ErrorKind.ALREADY_EXISTS


class TableStreamError(ServerStateError):
    """A StoreTable stream that is empty, mixes tables or curators, or carries an oversized message."""


class TableInUseError(ServerStateError):
    """The table cannot be deleted while a release from it is open (abort that release first)."""

    kind = ErrorKind.FAILED_PRECONDITION


@dataclass
class TablePart:
    """One curator's column: its alphabet size (0: not declared yet) and chunk digests."""

    alphabet_size: int = 0
    chunks: dict[int, bytes] = field(default_factory=dict)
    committed: bool = False
    digest: bytes = b""


@dataclass
class StoredTable:
    table_id: str
    curators: tuple[str, ...]
    n: int
    parts: dict[str, TablePart] = field(default_factory=dict)
    owner: str = ""  # the certificate that declared it first (its quota counts it)

    @classmethod
    def create(cls, declaration: TableDeclaration, max_rows: int, owner: str = "") -> StoredTable:
        """A new table from its first declaration, within the server's row limit."""
        if declaration.n > max_rows:
            raise LimitExceededError(
                f"a stored table of n = {declaration.n} rows exceeds this server's limit of {max_rows} rows"
            )
        return cls(declaration.table_id, declaration.curators, declaration.n, owner=owner)

    # ------------------------------------------------------------------ queries
    @property
    def num_chunks(self) -> int:
        return table_num_chunks(self.n)

    def rows_in_chunk(self, seq: int) -> int:
        return min(CHUNK_ROWS, self.n - seq * CHUNK_ROWS)

    @property
    def complete(self) -> bool:
        """Every curator committed its column."""
        return all(c in self.parts and self.parts[c].committed for c in self.curators)

    @property
    def alphabet_sizes(self) -> tuple[int, ...]:
        return tuple(self.parts[c].alphabet_size if c in self.parts else 0 for c in self.curators)

    def views(self) -> dict[str, TablePartView]:
        return {c: TablePartView(p.alphabet_size, tuple(p.chunks), p.committed) for c, p in self.parts.items()}

    # ------------------------------------------------------------------ checks
    def check_member(self, curator: str, caller: str) -> None:
        """The caller acts for itself and is a curator of this table."""
        if curator != caller:
            raise NotACuratorError(f"caller {caller!r} may not act for curator {curator!r}")
        if curator not in self.curators:
            raise NotACuratorError(f"{curator!r} is not a curator of stored table {self.table_id!r}")

    def check_declaration(self, d: TableDeclaration, caller: str) -> bool:
        """Membership, the same curators and n as declared before, and this curator's alphabet
        size (its first declaration fixes it). True if the declaration is new for this curator."""
        self.check_member(d.curator, caller)
        if d.curators != self.curators or d.n != self.n:
            raise ParameterMismatchError(
                f"stored table {self.table_id!r} has curators {list(self.curators)} and n = {self.n}; "
                f"{d.curator!r} declared {list(d.curators)} and n = {d.n}"
            )
        symbol_width(d.alphabet_size)  # fits the wire (InvalidAlphabetError otherwise)
        part = self.parts.get(d.curator)
        if part is not None and part.alphabet_size != d.alphabet_size:
            raise ParameterMismatchError(
                f"{d.curator!r} declared alphabet size {part.alphabet_size} for stored table {self.table_id!r}, "
                f"now {d.alphabet_size}"
            )
        return part is None

    def declare(self, d: TableDeclaration, caller: str) -> bool:
        """Record a checked declaration (True if new)."""
        if not self.check_declaration(d, caller):
            return False
        self.parts[d.curator] = TablePart(d.alphabet_size)
        return True

    def part(self, curator: str, caller: str) -> TablePart:
        """The caller's declared part."""
        self.check_member(curator, caller)
        part = self.parts.get(curator)
        if part is None:
            raise NotACuratorError(f"{curator!r} has not declared its part of stored table {self.table_id!r}")
        return part

    def is_replay(self, curator: str, seq: int, sha: bytes) -> bool:
        part = self.parts.get(curator)
        return part is not None and part.chunks.get(seq) == sha

    def accept_chunk(self, curator: str, caller: str, seq: int, rows: int, sha: bytes) -> bool:
        """A validated chunk of ``rows`` symbols. True if new, False if an identical repeat."""
        part = self.part(curator, caller)
        if part.chunks.get(seq) == sha:
            return False
        if seq in part.chunks:
            raise ConflictingChunkError(
                f"chunk {seq} of {curator!r} in stored table {self.table_id!r} is already stored with different "
                "bytes; a stored table never changes (store a changed table under a new table id)"
            )
        if part.committed:
            raise TableStoredError(f"{curator!r} has committed its column of {self.table_id!r}; no more chunks")
        if not 0 <= seq < self.num_chunks:
            raise ChunkShapeError(f"chunk {seq} is out of range: n = {self.n} gives chunks 0..{self.num_chunks - 1}")
        want = self.rows_in_chunk(seq)
        if rows != want:
            raise ChunkShapeError(f"chunk {seq} must hold exactly {want} symbols, got {rows}")
        part.chunks[seq] = sha
        return True

    def check_commit(self, curator: str, caller: str, num_chunks: int, digest: bytes) -> bool:
        """Checks before the store computes the digest. False if already committed with this
        digest (a replay); a different digest after commit is :class:`TableStoredError`."""
        part = self.part(curator, caller)
        if part.committed:
            if digest != part.digest:
                raise TableStoredError(
                    f"{curator!r} already committed stored table {self.table_id!r} with digest "
                    f"{part.digest.hex()[:16]}...; its content never changes"
                )
            return False
        if num_chunks != self.num_chunks:
            raise IncompleteUploadError(f"commit says {num_chunks} chunks; n = {self.n} needs {self.num_chunks}")
        missing = [s for s in range(self.num_chunks) if s not in part.chunks]
        if missing:
            raise IncompleteUploadError(f"{curator!r} commits with {len(missing)} chunk(s) missing, first {missing[0]}")
        return True

    def commit(self, curator: str, caller: str, num_chunks: int, digest: bytes, computed: bytes) -> bool:
        """Commit a column; ``computed`` is the digest over the stored chunks. True if new."""
        if not self.check_commit(curator, caller, num_chunks, digest):
            return False
        if digest != computed:
            raise IncompleteUploadError(f"digest mismatch for {curator!r}: the stored chunks hash to {computed.hex()}")
        part = self.parts[curator]
        part.committed, part.digest = True, digest
        return True

    def check_release(self, spec: ReleaseSpec) -> None:
        """A server-sampled release of this table: complete, the same curators (in joint-code
        order), n and alphabet sizes."""
        if not self.complete:
            pending = [c for c in self.curators if c not in self.parts or not self.parts[c].committed]
            raise TableIncompleteError(f"stored table {self.table_id!r} is not complete: waiting for {pending}")
        if spec.curators != self.curators or spec.n != self.n or spec.plan.alphabet_sizes != self.alphabet_sizes:
            raise ParameterMismatchError(
                f"release {spec.release_id!r} declares curators {list(spec.curators)}, n = {spec.n}, alphabet sizes "
                f"{list(spec.plan.alphabet_sizes)}; stored table {self.table_id!r} has {list(self.curators)}, "
                f"n = {self.n}, {list(self.alphabet_sizes)}"
            )
