"""The server's durable store: SQLite in WAL mode with synchronous=FULL.

The store is created 0600 in a 0700 directory. Tables: ``releases`` (spec JSON, state,
perturbed digest), ``parts`` (per curator: registered, committed, digest), ``chunks`` (release,
curator, seq, bytes, sha256) and ``perturbed`` (release, seq, curator index, bytes);
``declarations`` (per release and curator: its parties and a refusal before the agreement,
server/refusals.py, which says who may write one and what it costs). A call
returns only after its transaction committed, so whatever it acknowledges survives a crash.
Every check runs on a copy of the
in-memory release state (server/state.py) before anything is written, so a rejected call stores
nothing; a chunk (the one call made thousands of times a release) is checked on the live state
without a copy, and recorded there only once its row is written. Memory does not depend on m:
upload, PRAM and fetch go one chunk at a time.

PRAM runs once per release: all perturbed chunks and the state change to PERTURBED are written
in one transaction, which also erases the pre-PRAM ciphertext (only its SHA-256 stays); the
PRAM key lives only in memory during that call. A perturbed release
is never perturbed again.

Stored tables (server-side sampling): ``tables`` (id, curators, n), ``table_parts``
(per curator: alphabet size, committed, digest) and ``table_chunks`` (the long-lived ciphertext
columns) persist what server/tables.py accepts; ``samples`` holds the positions the server drew
for a server-sampled release (drawn from the OS CSPRNG in the transaction that binds the
release). For such a release the curators upload re-key columns into ``chunks`` as ciphertext;
PRAM gathers the stored rows at the positions chunk by chunk, adds the re-key columns and
perturbs, and its transaction erases the re-key columns and the positions (their fingerprint
stays); the gathered pre-PRAM rows only ever exist in memory. The stored table stays until a
curator of it deletes it (``delete_table``: rows deleted with ``secure_delete`` on, the file
vacuumed and the WAL checkpointed).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from secure_release.infra.fileio import check_owned, open_nofollow, private_dir
from secure_release.infra.streams import TableDeclaration
from secure_release.infra.wire import Declaration, Refusal
from secure_release.mechanism.errors import ErrorKind, SecureReleaseError, ShapeMismatchError
from secure_release.mechanism.primitives.keys import PramKey, Seed
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols, symbol_width, unpack_symbols
from secure_release.mechanism.primitives.pram import PRAM_BLOCK_ROWS, perturb
from secure_release.mechanism.protocol.index_sharing import (
    IndexArray,
    indices_fingerprint,
    pack_indices,
    unpack_indices,
)
from secure_release.mechanism.protocol.server_sampling import server_apply_rekey, server_draw_sample
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.protocol.tables import check_rows, perturb_rows
from secure_release.mechanism.schema import SymbolArray
from secure_release.server.refusals import Declarations, shown
from secure_release.server.sqltx import StoreFullError, transaction
from secure_release.server.state import (
    AbortedAtServerError,
    ChunkShapeError,
    LimitExceededError,
    NoSuchReleaseError,
    NotReadyError,
    Part,
    Release,
    ReleaseState,
    ServerLimits,
    ServerStateError,
    TableAlphabetError,
)
from secure_release.server.tables import StoredTable, TableInUseError, TablePart, UnknownTableError
from secure_release.server.witness import Witness

assert CHUNK_ROWS == PRAM_BLOCK_ROWS, "upload chunk s must be PRAM block s"

MAX_CHUNK_BYTES = 4 * CHUNK_ROWS  # 1 MiB


def check_table_rows(symbols: SymbolArray, spec: ReleaseSpec, curator: str, first_row: int) -> None:
    """A chunk of a release of several tables: every row's symbol below its table's alphabet for
    this curator (``TableAlphabetError``, INVALID_ARGUMENT, before anything is stored)."""
    try:
        check_rows(symbols, spec.tables, spec.curators.index(curator), first_row)
    except ShapeMismatchError as exc:
        raise TableAlphabetError(f"chunk at row {first_row} of {curator!r}: {exc}") from None


class StoreError(ServerStateError):
    """The store directory or database cannot be used (not a directory, corrupt, unreadable)."""


class NotServerSampledError(ServerStateError):
    """Positions were asked of a release the curators sample themselves."""

    kind = ErrorKind.FAILED_PRECONDITION


_SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    release_id TEXT NOT NULL,
    spec_key TEXT NOT NULL,
    params TEXT NOT NULL,
    state INTEGER NOT NULL,
    perturbed_digest BLOB NOT NULL DEFAULT x'',
    abort_reason TEXT NOT NULL DEFAULT '',
    finished_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (release_id, spec_key)
);
CREATE TABLE IF NOT EXISTS parts (
    release_id TEXT NOT NULL,
    curator TEXT NOT NULL,
    spec_key TEXT NOT NULL,
    registered INTEGER NOT NULL DEFAULT 0,
    committed INTEGER NOT NULL DEFAULT 0,
    digest BLOB NOT NULL DEFAULT x'',
    PRIMARY KEY (release_id, curator)
);
CREATE TABLE IF NOT EXISTS chunks (
    release_id TEXT NOT NULL,
    curator TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    sha256 BLOB NOT NULL,
    PRIMARY KEY (release_id, curator, seq)
);
CREATE TABLE IF NOT EXISTS tables (
    table_id TEXT PRIMARY KEY,
    curators TEXT NOT NULL,
    n INTEGER NOT NULL,
    created_at REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS table_parts (
    table_id TEXT NOT NULL,
    curator TEXT NOT NULL,
    alphabet_size INTEGER NOT NULL,
    committed INTEGER NOT NULL DEFAULT 0,
    digest BLOB NOT NULL DEFAULT x'',
    PRIMARY KEY (table_id, curator)
);
CREATE TABLE IF NOT EXISTS table_chunks (
    table_id TEXT NOT NULL,
    curator TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    sha256 BLOB NOT NULL,
    PRIMARY KEY (table_id, curator, seq)
);
CREATE TABLE IF NOT EXISTS samples (
    release_id TEXT PRIMARY KEY,
    packed BLOB NOT NULL,
    fingerprint TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS perturbed (
    release_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    col INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (release_id, seq, col)
);
"""

#: A release id holds at most this many competing specs before every curator of one registered.
MAX_CANDIDATES_PER_ID = 4


def spec_key(spec: ReleaseSpec) -> str:
    """What identifies a spec among the candidates of one release id (granted researchers aside)."""
    fields = {k: v for k, v in spec.to_dict().items() if k != "researchers"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class FetchedChunk:
    seq: int
    first_row: int
    columns: list[bytes]


class Store:
    """Durable release store. Thread-safe (one connection behind a lock)."""

    def __init__(self, directory: Path, limits: ServerLimits | None = None, sample_seed: Seed | None = None) -> None:
        """``sample_seed``: tests only (the server's sample seed of every server-sampled release;
        the release id still enters each draw). Otherwise each release's seed is fresh."""
        directory = Path(directory)
        self.limits = limits or ServerLimits()
        self.sample_seed = sample_seed
        self.path = directory / "releases.sqlite3"
        try:
            private_dir(directory)  # refuses a link or another user's directory
            for extra in ("-wal", "-shm", "-journal"):  # SQLite would follow a planted link
                side = self.path.with_name(self.path.name + extra)
                if os.path.lexists(side):
                    check_owned(side, os.lstat(side), want_dir=False)
            # Created 0600 before SQLite opens it (never through a link; the mode is set on the
            # descriptor); the -wal and -shm files inherit the mode.
            os.close(open_nofollow(self.path, os.O_CREAT | os.O_RDWR))
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect on a new file
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            if "owner" not in {row[1] for row in self._db.execute("PRAGMA table_info(tables)")}:
                self._db.execute("ALTER TABLE tables ADD COLUMN owner TEXT NOT NULL DEFAULT ''")  # older stores
            self._lock = threading.RLock()
            self.witness = Witness(self._db, self._lock)
            self.declarations = Declarations(self._db, self._lock)
            # Per release id, its candidate specs; once every curator of one has registered,
            # that one is bound and the others are discarded (nobody can squat an id).
            self._releases: dict[str, list[Release]] = {}
            self._tables: dict[str, StoredTable] = {}
            self._load()
        except (OSError, sqlite3.DatabaseError, KeyError, ValueError) as exc:  # UnsafePathError too
            raise StoreError(
                f"cannot use {directory} as the server's store ({type(exc).__name__}: {exc}); "
                "--store must name a directory this user owns, holding a releases.sqlite3 "
                "written by this server (or nothing)"
            ) from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -------------------------------------------------------------------- loading
    def _load(self) -> None:
        by_key: dict[tuple[str, str], Release] = {}
        for rid, key, params_json, state, pdigest, reason in self._db.execute(
            "SELECT release_id, spec_key, params, state, perturbed_digest, abort_reason FROM releases"
        ):
            spec = ReleaseSpec.from_dict(json.loads(params_json))
            parts = {c: Part() for c in spec.curators}
            rel = Release(spec, ReleaseState(state), parts, bytes(pdigest), str(reason))
            by_key[(rid, key)] = rel
            self._releases.setdefault(rid, []).append(rel)
        for rid, cur, key, reg, com, dig in self._db.execute(
            "SELECT release_id, curator, spec_key, registered, committed, digest FROM parts"
        ):
            part = by_key[(rid, key)].parts[cur]
            part.registered, part.committed, part.digest = bool(reg), bool(com), bytes(dig)
        for rid, cur, seq, sha in self._db.execute("SELECT release_id, curator, seq, sha256 FROM chunks"):
            self._find(rid, cur).parts[cur].chunks[int(seq)] = bytes(sha)
        for tid, curators_json, n, owner in self._db.execute("SELECT table_id, curators, n, owner FROM tables"):
            self._tables[tid] = StoredTable(tid, tuple(json.loads(curators_json)), int(n), owner=str(owner))
        for tid, cur, k, com, dig in self._db.execute(
            "SELECT table_id, curator, alphabet_size, committed, digest FROM table_parts"
        ):
            self._tables[tid].parts[cur] = TablePart(int(k), {}, bool(com), bytes(dig))
        for tid, cur, seq, sha in self._db.execute("SELECT table_id, curator, seq, sha256 FROM table_chunks"):
            self._tables[tid].parts[cur].chunks[int(seq)] = bytes(sha)

    # -------------------------------------------------------------------- lookup
    def _find(self, release_id: str, curator: str | None = None) -> Release:
        """The release a call means: for a curator, the candidate it registered in (else the
        bound one, else one naming it); for anyone else, the bound release only."""
        candidates = self._releases.get(release_id)
        if not candidates:
            raise NoSuchReleaseError(f"no release {release_id!r} is registered")
        if curator is not None:
            for rel in candidates:
                if curator in rel.parts and rel.parts[curator].registered:
                    return rel
        for rel in candidates:
            if rel.is_bound:
                return rel
        if curator is None:
            aborted = [r for r in candidates if r.state == ReleaseState.ABORTED]
            if aborted:  # a release that ended before every curator registered: say why
                return aborted[0]
            raise NoSuchReleaseError(f"no release {release_id!r} is registered by all its curators yet")
        for rel in candidates:
            if curator in rel.parts:
                return rel
        return candidates[0]

    def release(self, release_id: str, curator: str | None = None) -> Release:
        """A snapshot copy of the release a call means (see :meth:`_find`)."""
        with self._lock:
            return copy.deepcopy(self._find(release_id, curator))

    def _keep(self, rel: Release) -> None:
        """Put the updated copy ``rel`` in place of its candidate."""
        candidates = self._releases.setdefault(rel.spec.release_id, [])
        key = spec_key(rel.spec)
        for i, old in enumerate(candidates):
            if spec_key(old.spec) == key:
                candidates[i] = rel
                return
        candidates.append(rel)

    def _tx(self) -> contextlib.AbstractContextManager[None]:
        return transaction(self._db)

    # -------------------------------------------------------------------- events
    def _target_for_registration(self, spec: ReleaseSpec, curator: str) -> Release | None:
        """The candidate this registration joins (None: a new one)."""
        candidates = self._releases.get(spec.release_id, [])
        for rel in candidates:  # already registered somewhere: that one decides
            if curator in rel.parts and rel.parts[curator].registered:
                return rel
        for rel in candidates:
            if rel.is_bound:
                return rel
        for rel in candidates:
            if spec_key(rel.spec) == spec_key(spec):
                return rel
        return None

    def _check_new_candidate(self, spec: ReleaseSpec) -> None:
        done = (ReleaseState.PERTURBED, ReleaseState.ABORTED)
        in_flight = sum(r.state not in done for rels in self._releases.values() for r in rels)
        if in_flight >= self.limits.max_releases_in_flight:
            raise LimitExceededError(
                f"{in_flight} releases are in flight; this server takes at most "
                f"{self.limits.max_releases_in_flight} at once"
            )
        if len(self._releases.get(spec.release_id, [])) >= MAX_CANDIDATES_PER_ID:
            raise LimitExceededError(
                f"release {spec.release_id!r} already has {MAX_CANDIDATES_PER_ID} competing specs; "
                "agree on one, or use another release id"
            )

    def register(self, spec: ReleaseSpec, curator: str, caller: str) -> Release:
        """A curator's part of ``spec``: joins the candidate with the same spec or starts one
        (within the limits). When every curator of a candidate has registered it is bound and
        the id's other candidates, which nobody else agreed to, are discarded."""
        self.limits.check(spec)
        with self._lock:
            if spec.table_id:
                table = self._tables.get(spec.table_id)
                if table is None:
                    raise UnknownTableError(f"no stored table {spec.table_id!r}; store it first (store-table)")
                table.check_release(spec)
            existing = self._target_for_registration(spec, curator)
            if existing is None:
                self._check_new_candidate(spec)
            rel = copy.deepcopy(existing) if existing else Release.create(spec)
            if not rel.register(spec, curator, caller):
                return copy.deepcopy(rel)
            key = spec_key(rel.spec)
            losers = [r for r in self._releases.get(spec.release_id, []) if rel.is_bound and spec_key(r.spec) != key]
            with self._tx():
                if existing is None:
                    self._db.execute(
                        "INSERT INTO releases (release_id, spec_key, params, state) VALUES (?, ?, ?, ?)",
                        (spec.release_id, key, json.dumps(rel.spec.to_dict()), int(rel.state)),
                    )
                self._db.execute(
                    "INSERT OR REPLACE INTO parts (release_id, curator, spec_key, registered) VALUES (?, ?, ?, 1)",
                    (spec.release_id, curator, key),
                )
                for loser in losers:
                    self._discard(loser)
                if rel.is_bound and rel.spec.table_id:
                    self._draw_sample(rel.spec)
            self._keep(rel)
            if losers:
                self._releases[spec.release_id] = [rel]
            return copy.deepcopy(rel)

    def _draw_sample(self, spec: ReleaseSpec) -> None:
        """The server's fresh uniform ordered m-tuple of stored positions for a just-bound
        server-sampled release (inside its binding transaction); the seed is dropped here."""
        positions, _ = server_draw_sample(spec.n, spec.m, spec.release_id, self.sample_seed)
        packed = pack_indices(positions, spec.n)
        self._db.execute(
            "INSERT OR REPLACE INTO samples (release_id, packed, fingerprint) VALUES (?, ?, ?)",
            (spec.release_id, packed, indices_fingerprint(packed)),
        )

    def sample(self, release_id: str, curator: str, caller: str) -> tuple[ReleaseSpec, bytes]:
        """The spec and packed positions of a server-sampled release, for one of its registered
        curators, once every curator registered it and until PRAM (or an abort) erased them."""
        with self._lock:
            rel = self._find(release_id, curator)
            rel.check_member(curator, caller)
            if not rel.spec.table_id:
                raise NotServerSampledError(f"release {release_id!r} is sampled by its curators, not the server")
            if rel.state == ReleaseState.ABORTED:
                raise AbortedAtServerError(f"release {release_id!r} was aborted: {rel.abort_reason}")
            if not rel.is_bound:
                pending = [c for c, p in rel.parts.items() if not p.registered]
                raise NotReadyError(f"release {release_id!r} is not registered by {pending} yet; no sample drawn")
            row = self._db.execute("SELECT packed FROM samples WHERE release_id = ?", (release_id,)).fetchone()
            if row is None or not row[0]:
                raise NotReadyError(f"release {release_id!r} is {rel.state.name.lower()}; its positions are erased")
            return copy.deepcopy(rel.spec), bytes(row[0])

    # -------------------------------------------------------------------- stored tables
    def table(self, table_id: str, caller: str) -> StoredTable:
        """A snapshot of a stored table, for its curators only."""
        with self._lock:
            table = self._tables.get(table_id)
            if table is None:
                raise UnknownTableError(f"no stored table {table_id!r}")
            table.check_member(caller, caller)
            return copy.deepcopy(table)

    def _table_for(self, d: TableDeclaration, caller: str) -> tuple[StoredTable, bool]:
        """A working copy of the declared table (created if new, within the limits) with the
        caller's declaration checked and applied, and whether the table is new."""
        existing = self._tables.get(d.table_id)
        if existing is None:
            if len(self._tables) >= self.limits.max_tables:
                raise LimitExceededError(
                    f"{len(self._tables)} tables are stored; this server keeps at most {self.limits.max_tables}; "
                    "delete one first"
                )
            owned = sum(t.owner == caller for t in self._tables.values())
            if owned >= self.limits.max_tables_per_curator:
                raise LimitExceededError(
                    f"{caller!r} already holds {owned} stored tables, the most one curator may hold here "
                    f"(--max-tables-per-curator {self.limits.max_tables_per_curator}); delete one first"
                )
            table = StoredTable.create(d, self.limits.max_table_rows, caller)
        else:
            table = copy.deepcopy(existing)
        table.declare(d, caller)
        return table, existing is None

    def _persist_declaration(self, table: StoredTable, new_table: bool, curator: str, new_part: bool) -> None:
        if new_table:
            self._db.execute(
                "INSERT INTO tables (table_id, curators, n, created_at, owner) VALUES (?, ?, ?, ?, ?)",
                (table.table_id, json.dumps(list(table.curators)), table.n, time.time(), table.owner),
            )
        if new_part:
            self._db.execute(
                "INSERT INTO table_parts (table_id, curator, alphabet_size) VALUES (?, ?, ?)",
                (table.table_id, curator, table.parts[curator].alphabet_size),
            )

    def put_table_chunk(self, d: TableDeclaration, caller: str, seq: int, data: bytes) -> bool:
        """Validate and durably store one chunk of a curator's stored column (with the table
        and the curator's declaration if new, in the same transaction: a refused chunk stores
        nothing). True if new, False if an identical repeat."""
        if len(data) > MAX_CHUNK_BYTES:
            raise ChunkShapeError(f"a chunk holds at most {MAX_CHUNK_BYTES} bytes, got {len(data)}")
        sha = hashlib.sha256(data).digest()
        with self._lock:
            table, new_table = self._table_for(d, caller)
            new_part = new_table or d.curator not in self._tables[d.table_id].parts
            if table.is_replay(d.curator, seq, sha):
                return False
            symbols = unpack_symbols(data, d.alphabet_size)  # range and whole-symbol length
            if not table.accept_chunk(d.curator, caller, seq, int(symbols.size), sha):
                return False
            with self._tx():
                self._persist_declaration(table, new_table, d.curator, new_part)
                self._db.execute(
                    "INSERT INTO table_chunks (table_id, curator, seq, data, sha256) VALUES (?, ?, ?, ?, ?)",
                    (d.table_id, d.curator, seq, data, sha),
                )
            self._tables[d.table_id] = table
            return True

    def commit_table(self, d: TableDeclaration, caller: str, num_chunks: int, digest: bytes) -> StoredTable:
        """Commit a curator's column (the digest over its stored chunks must match)."""
        with self._lock:
            table, new_table = self._table_for(d, caller)
            new_part = new_table or d.curator not in self._tables[d.table_id].parts
            computed = b""
            if table.check_commit(d.curator, caller, num_chunks, digest):
                h = hashlib.sha256()
                for seq in range(num_chunks):
                    h.update(self._table_chunk(d.table_id, d.curator, seq))
                computed = h.digest()
                table.commit(d.curator, caller, num_chunks, digest, computed)
                with self._tx():
                    self._persist_declaration(table, new_table, d.curator, new_part)
                    self._db.execute(
                        "UPDATE table_parts SET committed = 1, digest = ? WHERE table_id = ? AND curator = ?",
                        (digest, d.table_id, d.curator),
                    )
                self._tables[d.table_id] = table
            return copy.deepcopy(table)

    def _table_chunk(self, table_id: str, curator: str, seq: int) -> bytes:
        row = self._db.execute(
            "SELECT data FROM table_chunks WHERE table_id = ? AND curator = ? AND seq = ?", (table_id, curator, seq)
        ).fetchone()
        if row is None:  # pragma: no cover - the state machine checked presence
            raise ChunkShapeError(f"chunk {seq} of {curator!r} in stored table {table_id!r} is missing")
        return bytes(row[0])

    def delete_table(self, table_id: str, curator: str, caller: str) -> StoredTable:
        """Delete a stored table and erase its ciphertext (a curator of it asks). Refused while
        a release from it is registered but not yet perturbed or aborted. Releases already
        perturbed from it keep their perturbed rows (until their retention)."""
        with self._lock:
            table = self._tables.get(table_id)
            if table is None:
                raise UnknownTableError(f"no stored table {table_id!r}")
            table.check_member(curator, caller)
            done = (ReleaseState.PERTURBED, ReleaseState.ABORTED)
            open_ = sorted(
                {r.spec.release_id for rels in self._releases.values() for r in rels
                 if r.spec.table_id == table_id and r.state not in done}
            )  # fmt: skip
            if open_:
                raise TableInUseError(
                    f"stored table {table_id!r} is sampled by open release(s) {open_}; abort them first"
                )
            self._db.execute("PRAGMA secure_delete=ON")
            try:
                with self._tx():
                    for name in ("tables", "table_parts", "table_chunks"):
                        self._db.execute(f"DELETE FROM {name} WHERE table_id = ?", (table_id,))
                self._db.execute("PRAGMA incremental_vacuum")
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.execute("PRAGMA secure_delete=OFF")
            del self._tables[table_id]
            return copy.deepcopy(table)

    def _gather(self, table_id: str, curator: str, alphabet_size: int, positions: IndexArray) -> SymbolArray:
        """The stored ciphertext of ``curator`` at ``positions`` (sample order), reading each
        stored chunk the sample touches once (memory: the m gathered rows and one chunk)."""
        out = np.empty(positions.size, dtype=np.uint32)
        blocks = positions // CHUNK_ROWS
        order = np.argsort(blocks, kind="stable")
        uniq, starts = np.unique(blocks[order], return_index=True)
        ends = [*starts[1:].tolist(), int(order.size)]
        for block, start, end in zip(uniq.tolist(), starts.tolist(), ends, strict=True):
            column = unpack_symbols(self._table_chunk(table_id, curator, block), alphabet_size)
            at = order[start:end]
            out[at] = column[positions[at] - block * CHUNK_ROWS]
        return out

    def _discard(self, rel: Release) -> None:
        """Delete a candidate that lost its id to a bound spec (inside a transaction)."""
        rid, key = rel.spec.release_id, spec_key(rel.spec)
        mine = [c for c, p in rel.parts.items() if p.registered]
        self._db.execute("DELETE FROM releases WHERE release_id = ? AND spec_key = ?", (rid, key))
        self._db.execute("DELETE FROM parts WHERE release_id = ? AND spec_key = ?", (rid, key))
        self._db.executemany("DELETE FROM chunks WHERE release_id = ? AND curator = ?", [(rid, c) for c in mine])

    def put_chunk(self, release_id: str, curator: str, caller: str, seq: int, data: bytes) -> bool:
        """Validate and durably store one chunk. True if new, False if an identical repeat."""
        if len(data) > MAX_CHUNK_BYTES:
            raise ChunkShapeError(f"a chunk holds at most {MAX_CHUNK_BYTES} bytes, got {len(data)}")
        sha = hashlib.sha256(data).digest()
        with self._lock:
            # Checked on the live release, not a copy: a copy costs O(chunks stored) a chunk,
            # O(chunks^2) an upload. Nothing changes in memory until the row is durable.
            rel = self._find(release_id, curator)
            rel.check_member(curator, caller)  # who may upload, before decoding anything
            if rel.is_replay(curator, seq, sha):
                return False  # an identical replay succeeds in every state
            rel.check_open()
            k = rel.spec.alphabet_of(curator)
            symbols = unpack_symbols(data, k)  # range and whole-symbol length
            if not rel.check_chunk(curator, caller, seq, len(symbols), sha):
                return False
            if rel.spec.tables:  # a release of several tables: each row within its table's alphabet
                check_table_rows(symbols, rel.spec, curator, seq * CHUNK_ROWS)
            new_state = rel.state_with_chunk()
            with self._tx():
                self._db.execute(
                    "INSERT INTO chunks (release_id, curator, seq, data, sha256) VALUES (?, ?, ?, ?, ?)",
                    (release_id, curator, seq, data, sha),
                )
                if new_state != rel.state:
                    self._set_state(rel.spec, new_state)
            rel.add_chunk(curator, seq, sha)
            return True

    def commit(self, release_id: str, curator: str, caller: str, num_chunks: int, digest: bytes) -> Release:
        """Commit a curator's part (the digest over its stored chunks must match)."""
        with self._lock:
            rel = copy.deepcopy(self._find(release_id, curator))
            computed = b""
            if rel.check_commit(curator, caller, num_chunks):
                h = hashlib.sha256()
                for seq in range(num_chunks):
                    h.update(self._chunk(release_id, curator, seq))
                computed = h.digest()
            if rel.commit(curator, caller, num_chunks, digest, computed) or computed:
                with self._tx():
                    self._db.execute(
                        "UPDATE parts SET committed = 1, digest = ? WHERE release_id = ? AND curator = ?",
                        (digest, release_id, curator),
                    )
                    self._set_state(rel.spec, rel.state)
                self._keep(rel)
            return copy.deepcopy(rel)

    def declare(self, declaration: Declaration, caller: str) -> list[Refusal]:
        """Record ``caller``'s declaration of a release (server/refusals.py says who may and
        what it costs); the release's refusals that show after it."""
        self.declarations.declare(declaration, caller)
        return self.refusals(declaration.release_id)

    def refusals(self, release_id: str) -> list[Refusal]:
        """The refusals of ``release_id`` that show (:func:`~secure_release.server.refusals.shown`)."""
        with self._lock:
            candidates = [
                (rel.spec.curators, [c for c, p in rel.parts.items() if p.registered], rel.is_bound)
                for rel in self._releases.get(release_id, [])
            ]
            return shown(self.declarations.of(release_id), candidates)

    def abort(self, release_id: str, curator: str, caller: str, reason: str) -> Release:
        """Abort a release before sealing (idempotent); its ciphertext is erased at once."""
        with self._lock:
            rel = copy.deepcopy(self._find(release_id, curator))
            if rel.abort(curator, caller, reason):
                mine = [(release_id, c) for c in rel.parts]
                with self._tx():
                    self._db.execute(
                        "UPDATE releases SET state = ?, abort_reason = ?, finished_at = ? "
                        "WHERE release_id = ? AND spec_key = ?",
                        (int(rel.state), rel.abort_reason, time.time(), release_id, spec_key(rel.spec)),
                    )
                    self._db.executemany("UPDATE chunks SET data = x'' WHERE release_id = ? AND curator = ?", mine)
                    self._db.execute("UPDATE samples SET packed = x'' WHERE release_id = ?", (release_id,))
                self._db.execute("PRAGMA incremental_vacuum")
                self._keep(rel)
            return copy.deepcopy(rel)

    def _set_state(self, spec: ReleaseSpec, state: ReleaseState) -> None:
        self._db.execute(
            "UPDATE releases SET state = ? WHERE release_id = ? AND spec_key = ?",
            (int(state), spec.release_id, spec_key(spec)),
        )

    def _chunk(self, release_id: str, curator: str, seq: int) -> bytes:
        row = self._db.execute(
            "SELECT data FROM chunks WHERE release_id = ? AND curator = ? AND seq = ?",
            (release_id, curator, seq),
        ).fetchone()
        if row is None:  # pragma: no cover - the state machine checked presence
            raise ChunkShapeError(f"chunk {seq} of {curator!r} is missing")
        return bytes(row[0])

    def chunk_bytes(self, release_id: str, curator: str, seq: int) -> bytes:
        """The stored bytes of one chunk (empty once PRAM or an abort erased them)."""
        with self._lock:
            self._find(release_id, curator)
            return self._chunk(release_id, curator, seq)

    # -------------------------------------------------------------------- PRAM
    def perturb(self, release_id: str, key_factory: Callable[[], PramKey]) -> Release:
        """Apply PRAM once to a sealed release and persist it with the state change.

        A perturbed release is returned as it is (never re-perturbed). The key comes from
        ``key_factory`` and is dropped when this call returns.
        """
        with self._lock:
            rel = copy.deepcopy(self._find(release_id))
            if rel.state == ReleaseState.PERTURBED:
                return rel
            p = rel.spec
            sizes, channel = p.plan.alphabet_sizes, p.plan.channel
            gathered = self._gathered(p)
            key = key_factory()
            h = hashlib.sha256()
            with self._tx():
                self._db.execute("DELETE FROM perturbed WHERE release_id = ?", (release_id,))
                for seq in range(p.num_chunks):
                    cols = [
                        unpack_symbols(self._chunk(release_id, c, seq), k)
                        for c, k in zip(p.curators, sizes, strict=True)
                    ]
                    if gathered is not None:  # server-sampled: stored rows + re-key columns
                        lo = seq * CHUNK_ROWS
                        cols = server_apply_rekey([g[lo : lo + cols[0].size] for g in gathered], cols, sizes)
                    if p.tables:  # each table's rows: gamma_t-diagonal PRAM on its joint, its own keystream
                        out = perturb_rows(cols, p.tables, key, first_row=seq * CHUNK_ROWS)
                    else:
                        out = perturb(cols, sizes, channel, key, first_row=seq * CHUNK_ROWS)
                    for j, (col, k) in enumerate(zip(out, sizes, strict=True)):
                        packed = pack_symbols(col, k)
                        h.update(packed)
                        self._db.execute(
                            "INSERT INTO perturbed (release_id, seq, col, data) VALUES (?, ?, ?, ?)",
                            (release_id, seq, j, packed),
                        )
                rel.perturbed(h.digest())
                self._db.execute(
                    "UPDATE releases SET state = ?, perturbed_digest = ?, finished_at = ? "
                    "WHERE release_id = ? AND spec_key = ?",
                    (int(rel.state), rel.perturbed_digest, time.time(), release_id, spec_key(rel.spec)),
                )
                # Data minimisation: the pre-PRAM ciphertext goes in the same transaction (its
                # SHA-256 stays, so replays of identical chunks remain idempotent).
                self._db.execute("UPDATE chunks SET data = x'' WHERE release_id = ?", (release_id,))
                self._db.execute("UPDATE samples SET packed = x'' WHERE release_id = ?", (release_id,))
            self._db.execute("PRAGMA incremental_vacuum")
            del key, gathered
            self._keep(rel)
            return copy.deepcopy(rel)

    def _gathered(self, spec: ReleaseSpec) -> list[SymbolArray] | None:
        """Server-sampled: every curator's stored rows at the release's positions (None for a
        curator-sampled release). In memory only, during PRAM."""
        if not spec.table_id:
            return None
        row = self._db.execute("SELECT packed FROM samples WHERE release_id = ?", (spec.release_id,)).fetchone()
        if row is None or not row[0]:
            raise NotReadyError(f"release {spec.release_id!r} has no sample to perturb")
        if spec.table_id not in self._tables:
            raise UnknownTableError(f"stored table {spec.table_id!r} of release {spec.release_id!r} is gone")
        positions = unpack_indices(bytes(row[0]), spec.n, spec.m)
        return [
            self._gather(spec.table_id, c, k, positions)
            for c, k in zip(spec.curators, spec.plan.alphabet_sizes, strict=True)
        ]

    def expire(self, finished_before: float) -> list[str]:
        """Delete every release that was perturbed or aborted before ``finished_before`` (a
        time.time() value): spec, parts, chunk digests and perturbed rows. Returns their ids."""
        with self._lock:
            gone = [
                rid
                for (rid,) in self._db.execute(
                    "SELECT release_id FROM releases WHERE finished_at > 0 AND finished_at < ?", (finished_before,)
                )
            ]
            if not gone:
                return []
            with self._tx():
                for table in ("releases", "parts", "chunks", "perturbed", "samples"):
                    self._db.executemany(f"DELETE FROM {table} WHERE release_id = ?", [(r,) for r in gone])
            self._db.execute("PRAGMA incremental_vacuum")
            for rid in gone:
                self._releases.pop(rid, None)
            return sorted(set(gone))

    def sealed_releases(self) -> list[str]:
        with self._lock:
            return sorted(r for r, rels in self._releases.items() for rel in rels if rel.state == ReleaseState.SEALED)

    # -------------------------------------------------------------------- fetch
    def fetch(self, release_id: str) -> Iterator[FetchedChunk]:
        """The perturbed rows, one chunk at a time (raises NotReadyError unless perturbed)."""
        with self._lock:
            rel = self._find(release_id)
            rel.check_fetch()
            num, ncols = rel.spec.num_chunks, len(rel.spec.curators)
        for seq in range(num):
            with self._lock:
                rows = self._db.execute(
                    "SELECT col, data FROM perturbed WHERE release_id = ? AND seq = ? ORDER BY col",
                    (release_id, seq),
                ).fetchall()
            if len(rows) != ncols:  # pragma: no cover - written in one transaction
                raise SecureReleaseError(f"perturbed chunk {seq} of {release_id!r} is incomplete")
            yield FetchedChunk(seq, seq * CHUNK_ROWS, [bytes(d) for _, d in rows])


__all__ = ["MAX_CHUNK_BYTES", "FetchedChunk", "Store", "StoreFullError", "symbol_width"]
