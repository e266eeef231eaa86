"""The server's durable store: SQLite in WAL mode with synchronous=FULL.

The store is created 0600 in a 0700 directory. Tables: ``releases`` (spec JSON, state,
perturbed digest), ``parts`` (per curator: registered, committed, digest), ``chunks`` (release,
curator, seq, bytes, sha256) and ``perturbed`` (release, seq, curator index, bytes). A call
returns only after its transaction committed, so whatever it acknowledges survives a crash.
Every check runs on a copy of the
in-memory release state (server/state.py) before anything is written, so a rejected call stores
nothing. Memory does not depend on m: upload, PRAM and fetch go one chunk at a time.

PRAM runs once per release: all perturbed chunks and the state change to PERTURBED are written
in one transaction, which also erases the pre-PRAM ciphertext (only its SHA-256 stays); the
PRAM key lives only in memory during that call. A perturbed release
is never perturbed again.
"""

from __future__ import annotations

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

from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.keys import PramKey
from secure_release.mechanism.packing import CHUNK_ROWS, pack_symbols, symbol_width, unpack_symbols
from secure_release.mechanism.pram import PRAM_BLOCK_ROWS, perturb
from secure_release.mechanism.spec import ReleaseSpec
from secure_release.server.state import (
    ChunkShapeError,
    LimitExceededError,
    Part,
    Release,
    ReleaseState,
    ServerLimits,
    ServerStateError,
    UnknownReleaseError,
)

assert CHUNK_ROWS == PRAM_BLOCK_ROWS, "upload chunk s must be PRAM block s"

MAX_CHUNK_BYTES = 4 * CHUNK_ROWS  # 1 MiB


class StoreError(ServerStateError):
    """The store directory or database cannot be used (not a directory, corrupt, unreadable)."""


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

    def __init__(self, directory: Path, limits: ServerLimits | None = None) -> None:
        directory = Path(directory)
        self.limits = limits or ServerLimits()
        self.path = directory / "releases.sqlite3"
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
            # Created 0600 before SQLite opens it; the -wal and -shm files inherit the mode.
            os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
            os.chmod(self.path, 0o600)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect on a new file
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._lock = threading.RLock()
            # Per release id, its candidate specs; once every curator of one has registered,
            # that one is bound and the others are discarded (nobody can squat an id).
            self._releases: dict[str, list[Release]] = {}
            self._load()
        except (OSError, sqlite3.DatabaseError, KeyError, ValueError) as exc:
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

    # -------------------------------------------------------------------- lookup
    def _find(self, release_id: str, curator: str | None = None) -> Release:
        """The release a call means: for a curator, the candidate it registered in (else the
        bound one, else one naming it); for anyone else, the bound release only."""
        candidates = self._releases.get(release_id)
        if not candidates:
            raise UnknownReleaseError(f"no release {release_id!r} is registered")
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
            raise UnknownReleaseError(f"no release {release_id!r} is registered by all its curators yet")
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

    def _tx(self) -> _Tx:
        return _Tx(self._db)

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
            self._keep(rel)
            if losers:
                self._releases[spec.release_id] = [rel]
            return copy.deepcopy(rel)

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
            rel = copy.deepcopy(self._find(release_id, curator))
            rel.check_member(curator, caller)  # who may upload, before decoding anything
            if rel.is_replay(curator, seq, sha):
                return False  # an identical replay succeeds in every state
            rel.check_open()
            k = rel.spec.alphabet_of(curator)
            symbols = unpack_symbols(data, k)  # range and whole-symbol length
            old_state = rel.state
            if not rel.accept_chunk(curator, caller, seq, len(symbols), sha):
                return False
            with self._tx():
                self._db.execute(
                    "INSERT INTO chunks (release_id, curator, seq, data, sha256) VALUES (?, ?, ?, ?, ?)",
                    (release_id, curator, seq, data, sha),
                )
                if rel.state != old_state:
                    self._set_state(rel)
            self._keep(rel)
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
                    self._set_state(rel)
                self._keep(rel)
            return copy.deepcopy(rel)

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
                self._db.execute("PRAGMA incremental_vacuum")
                self._keep(rel)
            return copy.deepcopy(rel)

    def _set_state(self, rel: Release) -> None:
        self._db.execute(
            "UPDATE releases SET state = ? WHERE release_id = ? AND spec_key = ?",
            (int(rel.state), rel.spec.release_id, spec_key(rel.spec)),
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
            key = key_factory()
            h = hashlib.sha256()
            with self._tx():
                self._db.execute("DELETE FROM perturbed WHERE release_id = ?", (release_id,))
                for seq in range(p.num_chunks):
                    cols = [
                        unpack_symbols(self._chunk(release_id, c, seq), k)
                        for c, k in zip(p.curators, sizes, strict=True)
                    ]
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
            self._db.execute("PRAGMA incremental_vacuum")
            del key
            self._keep(rel)
            return copy.deepcopy(rel)

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
                for table in ("releases", "parts", "chunks", "perturbed"):
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


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        else:
            self._db.execute("ROLLBACK")


__all__ = ["MAX_CHUNK_BYTES", "FetchedChunk", "Store", "symbol_width"]
