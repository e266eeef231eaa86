"""Stored tables and server-sampled releases in the server's store (no network): declaration,
idempotent chunks, refusals that store nothing, the sample drawn once the release is bound, PRAM
that gathers, re-keys and erases, deletion, restart. And the wire conversions of the new messages."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from secure_release.infra import streams, wire
from secure_release.mechanism.primitives.keys import PadKey, PramKey, Seed
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, digest_of, pack_symbols, unpack_symbols
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.in_memory import server_perturb
from secure_release.mechanism.protocol.index_sharing import indices_fingerprint, pack_indices, sample_set_fingerprint
from secure_release.mechanism.protocol.server_sampling import (
    TableKey,
    curator_rekey,
    curator_store_table,
    server_apply_rekey,
    server_draw_sample,
    server_gather,
)
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.server import state as st
from secure_release.server import tables as tb
from secure_release.server.store import NotServerSampledError, Store

CURATORS = ("alice", "bob")
SIZES = (6, 4)
N = CHUNK_ROWS + 5000  # two stored chunks
M = 3000
SEED = Seed(bytes([9]) * 32)
PRAM = PramKey(bytes([3]) * 32)


def decl(curator: str, n: int = N, k: int | None = None, tid: str = "t1") -> streams.TableDeclaration:
    return streams.TableDeclaration(tid, curator, CURATORS, n, SIZES[CURATORS.index(curator)] if k is None else k)


def stored_columns() -> tuple[list[np.ndarray], list[np.ndarray], list[TableKey]]:
    rng = np.random.default_rng(4)
    plain = [rng.integers(0, k, N).astype(np.uint32) for k in SIZES]
    keys = [TableKey(bytes([j + 1]) * 32) for j in range(len(SIZES))]
    enc = [curator_store_table(x, k, "t1", key) for x, k, key in zip(plain, SIZES, keys, strict=True)]
    return plain, [c for c, _ in enc], [key for _, key in enc]


def chunks(col: np.ndarray, k: int) -> list[bytes]:
    return [pack_symbols(col[i : i + CHUNK_ROWS], k) for i in range(0, col.size, CHUNK_ROWS)]


def store_all(store: Store, cipher: list[np.ndarray], tid: str = "t1") -> None:
    for c, col, k in zip(CURATORS, cipher, SIZES, strict=True):
        parts = chunks(col, k)
        for seq, data in enumerate(parts):
            store.put_table_chunk(decl(c, tid=tid), c, seq, data)
        store.commit_table(decl(c, tid=tid), c, len(parts), digest_of(parts))


def spec(rid: str, m: int = M, tid: str = "t1") -> ReleaseSpec:
    return ReleaseSpec(rid, CURATORS, CipherMode.CHACHA20, plan_release(N, SIZES, 0.5, m), ("researcher",), tid)


def test_a_table_is_stored_idempotently_and_never_changes(tmp_path: Path) -> None:
    store = Store(tmp_path)
    _, cipher, _ = stored_columns()
    parts = chunks(cipher[0], 6)
    assert store.put_table_chunk(decl("alice"), "alice", 0, parts[0])
    assert not store.put_table_chunk(decl("alice"), "alice", 0, parts[0])  # replay: fine
    with pytest.raises(st.ConflictingChunkError, match="different bytes"):
        store.put_table_chunk(decl("alice"), "alice", 0, bytes(len(parts[0])))
    with pytest.raises(st.ParameterMismatchError, match="n = "):
        store.put_table_chunk(decl("bob", n=N + 1), "bob", 0, b"\0" * CHUNK_ROWS)
    with pytest.raises(st.ParameterMismatchError, match="alphabet size 6"):
        store.put_table_chunk(decl("alice", k=5), "alice", 1, parts[1])
    with pytest.raises(st.NotACuratorError, match="may not act for"):
        store.put_table_chunk(decl("bob"), "alice", 0, b"\0" * CHUNK_ROWS)
    with pytest.raises(st.ChunkShapeError, match="out of range"):
        store.put_table_chunk(decl("alice"), "alice", 2, parts[1])
    store.put_table_chunk(decl("alice"), "alice", 1, parts[1])
    table = store.commit_table(decl("alice"), "alice", 2, digest_of(parts))
    assert not table.complete and table.parts["alice"].committed
    assert store.commit_table(decl("alice"), "alice", 2, digest_of(parts)).parts["alice"].committed  # replay
    with pytest.raises(tb.TableStoredError) as err:
        store.commit_table(decl("alice"), "alice", 2, b"\1" * 32)
    assert err.value.kind.name == "ALREADY_EXISTS"
    # a rejected chunk of a new curator stores nothing: no declaration either
    with pytest.raises(Exception, match="outside"):
        store.put_table_chunk(decl("bob"), "bob", 0, b"\x07" * CHUNK_ROWS)
    assert "bob" not in store.table("t1", "alice").parts
    with pytest.raises(st.NotACuratorError):
        store.table("t1", "carol")


def test_limits_refuse_before_anything_is_stored(tmp_path: Path) -> None:
    store = Store(tmp_path, st.ServerLimits(max_tables=1, max_table_rows=N))
    with pytest.raises(st.LimitExceededError, match="exceeds this server's limit"):
        store.put_table_chunk(decl("alice", n=N + 1), "alice", 0, b"\0" * CHUNK_ROWS)
    store.put_table_chunk(decl("alice"), "alice", 0, b"\0" * CHUNK_ROWS)
    with pytest.raises(st.LimitExceededError, match="at most 1"):
        store.put_table_chunk(decl("alice", tid="t2"), "alice", 0, b"\0" * CHUNK_ROWS)
    with pytest.raises(tb.UnknownTableError):
        store.table("t2", "alice")


def test_a_server_sampled_release_gathers_rekeys_perturbs_and_erases(tmp_path: Path) -> None:
    store = Store(tmp_path, sample_seed=SEED)
    _, cipher, keys = stored_columns()
    with pytest.raises(tb.UnknownTableError):
        store.register(spec("r1"), "alice", "alice")
    store_all(store, cipher)
    bad = ReleaseSpec("r1", CURATORS, CipherMode.CHACHA20, plan_release(N, (6, 5), 0.5, M), (), "t1")
    with pytest.raises(st.ParameterMismatchError, match="alphabet sizes"):
        store.register(bad, "alice", "alice")
    s = spec("r1")
    store.register(s, "alice", "alice")
    with pytest.raises(st.NotReadyError, match="not registered by"):
        store.sample("r1", "alice", "alice")
    store.register(s, "bob", "bob")
    with pytest.raises(st.NotACuratorError):
        store.sample("r1", "bob", "alice")
    got_spec, packed = store.sample("r1", "bob", "bob")
    positions, _ = server_draw_sample(N, M, "r1", SEED)
    assert packed == pack_indices(positions, N) and got_spec.table_id == "t1"
    # the curators' re-key columns, uploaded as ciphertext
    pads = [PadKey(bytes([7 + j]) * 32) for j in range(2)]
    rekeys = [curator_rekey(positions, keys[j], "t1", SIZES[j], "chacha20", pads[j]) for j in range(2)]
    for c, (delta, _), k in zip(CURATORS, rekeys, SIZES, strict=True):
        store.put_chunk("r1", c, c, 0, pack_symbols(delta, k))
        store.commit("r1", c, c, 1, digest_of([pack_symbols(delta, k)]))
    rel = store.perturb("r1", lambda: PRAM)
    assert rel.state == st.ReleaseState.PERTURBED
    expected = server_perturb(
        server_apply_rekey(server_gather(cipher, positions), [d for d, _ in rekeys], SIZES), s.plan, PRAM
    )
    fetched = next(iter(store.fetch("r1")))
    for j, k in enumerate(SIZES):
        assert np.array_equal(unpack_symbols(fetched.columns[j], k), expected[j])
    # no pre-PRAM row and no position is left; the stored table stays
    db = sqlite3.connect(tmp_path / "releases.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE release_id = 'r1' AND length(data) > 0").fetchone() == (0,)
    assert db.execute("SELECT packed, fingerprint FROM samples").fetchall() == [(b"", indices_fingerprint(packed))]
    assert db.execute("SELECT COUNT(*) FROM table_chunks WHERE length(data) > 0").fetchone() == (4,)
    with pytest.raises(st.NotReadyError, match="erased"):
        store.sample("r1", "alice", "alice")
    # a restart keeps the table and the release
    store.close()
    again = Store(tmp_path)
    assert again.table("t1", "bob").complete and again.release("r1").state == st.ReleaseState.PERTURBED


def test_a_curator_sampled_release_has_no_server_sample_and_deletion_waits_for_open_releases(tmp_path: Path) -> None:
    store = Store(tmp_path)
    _, cipher, _ = stored_columns()
    store_all(store, cipher)
    plain = ReleaseSpec("plain", CURATORS, CipherMode.CHACHA20, plan_release(N, SIZES, 0.5, M), ())
    store.register(plain, "alice", "alice")
    with pytest.raises(NotServerSampledError):
        store.sample("plain", "alice", "alice")
    store.register(spec("r2"), "alice", "alice")
    with pytest.raises(tb.TableInUseError, match="r2"):
        store.delete_table("t1", "alice", "alice")
    store.abort("r2", "alice", "alice", "stop")
    with pytest.raises(st.NotACuratorError):
        store.delete_table("t1", "carol", "carol")
    gone = store.delete_table("t1", "bob", "bob")
    assert gone.table_id == "t1"
    with pytest.raises(tb.UnknownTableError):
        store.table("t1", "alice")
    db = sqlite3.connect(tmp_path / "releases.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM table_chunks").fetchone() == (0,)
    with pytest.raises(tb.UnknownTableError):
        store.register(spec("r3"), "alice", "alice")


def test_wire_conversions_round_trip_and_refuse() -> None:
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

    s = spec("r1")
    p = wire.spec_to_pb(s)
    assert p.kind == pb.RELEASE_KIND_SERVER_SAMPLED and wire.spec_from_pb(p) == s
    plain = ReleaseSpec("r1", CURATORS, CipherMode.CHACHA20, plan_release(N, SIZES, 0.5, M), ())
    assert wire.spec_to_pb(plain).kind == pb.RELEASE_KIND_CURATOR_SAMPLED and "table_id" not in plain.to_dict()
    for kind, tid, words in ((pb.RELEASE_KIND_SERVER_SAMPLED, "", "must name"),
                             (pb.RELEASE_KIND_CURATOR_SAMPLED, "t1", "names no stored table"), (7, "t1", "unknown")):
        q = wire.spec_to_pb(s)
        q.kind, q.table_id = kind, tid  # type: ignore[assignment]
        with pytest.raises(wire.ReleaseKindError, match=words):
            wire.spec_from_pb(q)
    # table chunks: the declaration on the first message sent, skipped chunks left out, digest over all
    parts = [b"\1" * 10, b"\2" * 10, b"\3" * 4]
    msgs = list(streams.table_chunks(decl("alice"), parts, skip=frozenset({0})))
    assert [m.sequence for m in msgs[:-1]] == [1, 2] and msgs[0].n == N and list(msgs[0].curators) == list(CURATORS)
    assert msgs[-1].commit and msgs[-1].digest == digest_of(parts) and msgs[-1].num_chunks == 3 and not msgs[1].n
    assert streams.table_declaration_from_pb(msgs[0]) == decl("alice")
    only_commit = list(streams.table_chunks(decl("alice"), parts, skip=frozenset({0, 1, 2})))
    assert len(only_commit) == 1 and only_commit[0].n == N  # a commit alone still declares
    bad = pb.TableChunk(table_id="t/1", curator="alice", curators=list(CURATORS), n=5, alphabet_size=6)
    with pytest.raises(Exception, match="table id"):
        streams.table_declaration_from_pb(bad)
    # sample chunks: large tuples in pieces, validated on arrival
    big = ReleaseSpec("r1", CURATORS, CipherMode.CHACHA20, plan_release(1 << 20, SIZES, 5.0, 600_000), (), "t1")
    positions = np.random.default_rng(2).permutation(1 << 20)[:600_000]
    packed = pack_indices(positions, 1 << 20)
    got = list(streams.sample_chunks("r1", "t1", 1 << 20, 600_000, packed))
    assert len(got) == 2 and all(len(c.packed_positions) <= streams.PIECE_BYTES for c in got)
    sample = streams.sample_from_chunks(iter(got), big)
    assert np.array_equal(sample.positions, positions) and sample.fingerprint == sample_set_fingerprint(positions)
    got[-1].sample_fingerprint = "0" * 64
    with pytest.raises(streams.SampleStreamError, match="fingerprint"):
        streams.sample_from_chunks(iter(got), big)
    other = list(streams.sample_chunks("r2", "t1", 1 << 20, 600_000, packed))
    with pytest.raises(streams.SampleStreamError, match="expected 'r1'"):
        streams.sample_from_chunks(iter(other), big)


def test_the_cli_offers_only_the_rekeyed_path_and_test_seeds_need_the_testing_switch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from secure_release.curator.cli import build_parser
    from secure_release.curator.config import config_from_args
    from secure_release.infra.config import ConfigError
    from secure_release.server import cli as server_cli

    base = ["run", "--sampling", "server", "--table-id", "t1", "--release-id", "r1", "--epsilon", "0.5",
            "--curators", "alice,bob", "--server", "127.0.0.1:1", "--name", "bob", "--insecure"]  # fmt: skip
    cfg = config_from_args(build_parser().parse_args(base))
    assert cfg.server_sampled and cfg.table_id == "t1" and not cfg.leader and cfg.alignment_key is None
    with pytest.raises(ConfigError, match=r"for some overlaps .* no bound is proved"):
        config_from_args(build_parser().parse_args([*base, "--key-path", "positions"]))
    with pytest.raises(ConfigError, match=r"table[_-]id"):
        config_from_args(build_parser().parse_args([a for a in base if a not in ("--table-id", "t1")]))
    for name in ("a.csv", "a.json"):  # the config checks that --data and --schema exist
        (tmp_path / name).write_text("")
    monkeypatch.chdir(tmp_path)
    store = ["store-table", "--table-id", "t1", "--data", "a.csv", "--schema", "a.json", "--curators", "alice,bob",
             "--server", "127.0.0.1:1", "--name", "alice", "--leader", "--insecure", "--alignment", "psi"]  # fmt: skip
    stored = config_from_args(build_parser().parse_args(store), storing=True)
    assert stored.storing and not stored.server_sampled and stored.release_id == "t1"
    monkeypatch.delenv("SECURE_RELEASE_TESTING", raising=False)
    with pytest.raises(ConfigError, match="SECURE_RELEASE_TESTING=1"):
        config_from_args(build_parser().parse_args([*store, "--insecure-test-table-key", "00" * 32]), storing=True)
    flags = ["--store", "s", "--insecure", "--insecure-test-sample-seed", "00" * 32]
    args = server_cli.build_parser().parse_args(flags)
    with pytest.raises(ConfigError, match="tests only"):
        server_cli.config_from_args(args)
    monkeypatch.setenv("SECURE_RELEASE_TESTING", "1")
    assert server_cli.config_from_args(args).test_sample_seed is not None
