"""The release server's store on a release of several tables (a designed release): the
ciphertext columns of ``in_memory.run_tables_release`` (fixed keys), uploaded chunk by chunk,
survive a restart with the spec's tables, and PRAM gives exactly the in-memory protocol's
perturbed columns (a table spanning a chunk boundary included); a symbol outside a table's
alphabet is refused (INVALID_ARGUMENT) and nothing is stored."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from secure_release.mechanism.errors import ErrorKind
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.packing import CHUNK_ROWS, pack_symbols, unpack_symbols
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy import disjoint_tables
from secure_release.mechanism.protocol.in_memory import CuratorTable, TablesResult, run_tables_release
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.server.state import ChunkShapeError, ReleaseState
from secure_release.server.store import Store

ALICE = CuratorSchema("alice", (Attribute("A", ("a0", "a1")), Attribute("C", ("c0", "c1", "c2"))))
BOB = CuratorSchema("bob", (Attribute("B", ("b0", "b1")), Attribute("D", ("d0", "d1", "d2", "d3"))))
PRAM = PramKey(bytes(range(1, 33)))
DIGEST = hashlib.sha256(b"a design").hexdigest()
#: Table 0 ends past the first upload chunk: its rows are perturbed in two calls.
N, SIZES = CHUNK_ROWS + 20_000, (CHUNK_ROWS + 1000, 3000, 12_000)
TABLES = [("A", "B"), ("C",), ("C", "D")]


def _tables(n: int, seed: int = 3) -> list[CuratorTable]:
    rng = np.random.default_rng(seed)
    ids = np.array([f"id{i}" for i in range(n)])
    a, b, c, d = rng.integers(0, 2, n), rng.integers(0, 2, n), rng.integers(0, 3, n), rng.integers(0, 4, n)
    alice = CuratorTable(ALICE, ids, {"A": np.array(["a0", "a1"])[a], "C": np.array(["c0", "c1", "c2"])[c]})
    order = rng.permutation(n)
    bob = CuratorTable(BOB, ids[order], {"B": np.array(["b0", "b1"])[b][order],
                                         "D": np.array(["d0", "d1", "d2", "d3"])[d][order]})  # fmt: skip
    return [alice, bob]


@pytest.fixture(scope="module", params=[CipherMode.CHACHA20, CipherMode.OTP], ids=["chacha20", "otp"])
def designed(request: pytest.FixtureRequest) -> TablesResult:
    gammas = disjoint_tables.gammas_for_epsilon(N, list(SIZES), 2.0)
    keys = [PadKey(bytes(range(32))), PadKey(bytes(range(2, 34)))] if request.param is CipherMode.CHACHA20 else None
    res = run_tables_release(_tables(N), TABLES, SIZES, gammas, 2.0, DIGEST, N, request.param, "r1",
                             seed=Seed(bytes(32)), alignment_key=AlignmentKey(bytes(range(3, 35))), pram_key=PRAM,
                             pad_keys=keys)  # fmt: skip
    assert res.spec.m > CHUNK_ROWS and res.spec.num_chunks == 2
    assert [x.m for x in res.spec.tables] == list(SIZES)
    return res


def _chunks(col: np.ndarray, k: int) -> list[bytes]:
    return [pack_symbols(col[i : i + CHUNK_ROWS], k) for i in range(0, len(col), CHUNK_ROWS)]


def _upload(store: Store, res: TablesResult) -> None:
    spec = res.spec
    for j, c in enumerate(spec.curators):
        store.register(spec, c, c)
        parts = _chunks(res.server_view["ciphertexts"][j], spec.plan.alphabet_sizes[j])
        for seq, data in enumerate(parts):
            assert store.put_chunk(spec.release_id, c, c, seq, data)
        store.commit(spec.release_id, c, c, len(parts), hashlib.sha256(b"".join(parts)).digest())


def test_pram_on_the_uploaded_tables_is_the_in_memory_protocols(designed: TablesResult, tmp_path: Path) -> None:
    spec = designed.spec
    store = Store(tmp_path)
    _upload(store, designed)
    assert store.release("r1").state == ReleaseState.SEALED
    store.close()
    store = Store(tmp_path)  # restart: the spec comes back with its tables and design digest
    back = store.release("r1").spec
    assert back == spec and back.tables == spec.tables and back.design_digest == DIGEST
    store.perturb("r1", lambda: PRAM)
    fetched = list(store.fetch("r1"))
    store.close()
    for j, k in enumerate(spec.plan.alphabet_sizes):
        col = np.concatenate([unpack_symbols(f.columns[j], k) for f in fetched])
        assert np.array_equal(col, designed.server_view["perturbed"][j]), spec.curators[j]
    # and not the classic whole-joint PRAM: some rows changed, and the ciphertext is gone
    assert any(
        not np.array_equal(designed.server_view["perturbed"][j], designed.server_view["ciphertexts"][j])
        for j in range(2)
    )


def test_a_symbol_outside_its_tables_alphabet_is_refused_and_nothing_stored(
    designed: TablesResult, tmp_path: Path
) -> None:
    spec = designed.spec
    store = Store(tmp_path)
    store.register(spec, "alice", "alice")
    col = designed.server_view["ciphertexts"][0].copy()
    k_whole = spec.plan.alphabet_sizes[0]
    assert spec.tables[0].alphabet_sizes[0] == 2 < k_whole  # alice's A alone in table 0
    good = _chunks(col, k_whole)
    for row in (5, CHUNK_ROWS + 10):  # table 0 in chunk 0, then in chunk 1 (table 0's tail)
        bad = col.copy()
        bad[row] = 2  # a whole-schema symbol (packs), outside table 0's alphabet for alice
        seq = row // CHUNK_ROWS
        with pytest.raises(ChunkShapeError, match=r"table 0.*curator 0.*symbol 2.*0\.\.1") as err:
            store.put_chunk("r1", "alice", "alice", seq, _chunks(bad, k_whole)[seq])
        assert err.value.kind is ErrorKind.INVALID_ARGUMENT
        assert seq not in store.release("r1", "alice").parts["alice"].chunks
    # table 1 (C alone) has no attribute of bob's: bob's symbol there must be 0
    store.register(spec, "bob", "bob")
    bob = designed.server_view["ciphertexts"][1].copy()
    start1 = SIZES[0]
    assert bob[start1 : start1 + SIZES[1]].max() == 0
    bob[start1 + 1] = 1
    with pytest.raises(ChunkShapeError, match="table 1"):
        store.put_chunk("r1", "bob", "bob", 1, _chunks(bob, spec.plan.alphabet_sizes[1])[1])
    # nothing was stored: the right chunks are new, and the release seals
    for seq, data in enumerate(good):
        assert store.put_chunk("r1", "alice", "alice", seq, data) is True
    store.commit("r1", "alice", "alice", len(good), hashlib.sha256(b"".join(good)).digest())
    right = _chunks(designed.server_view["ciphertexts"][1], spec.plan.alphabet_sizes[1])
    for seq, data in enumerate(right):
        assert store.put_chunk("r1", "bob", "bob", seq, data) is True
    store.commit("r1", "bob", "bob", len(right), hashlib.sha256(b"".join(right)).digest())
    assert store.release("r1").state == ReleaseState.SEALED
    store.close()
