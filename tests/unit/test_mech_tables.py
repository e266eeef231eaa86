"""A release of several tables (mechanism/protocol/tables.py) in its primitives: the segmented pad,
the per-table PRAM, the layouts, the spec on the wire and the whole in memory.

Exact checks throughout, except the keep rates of the per-table PRAM (binomial bounds at a
false-failure rate below 1e-6 each, seeded keys).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from scipy import stats

from secure_release.infra.wire import spec_from_pb, spec_to_pb
from secure_release.mechanism.errors import ShapeMismatchError, UnknownAttributeError
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.pads import (
    CipherMode,
    ReleasePad,
    chacha20_pad,
    new_release_pad,
    segment_stream_key,
)
from secure_release.mechanism.primitives.pram import PRAM_BLOCK_ROWS, PramChannel
from secure_release.mechanism.privacy import disjoint_tables
from secure_release.mechanism.privacy.plan import ReleasePlan, plan_release
from secure_release.mechanism.protocol.in_memory import CuratorTable, run_release, run_tables_release
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.protocol.tables import (
    TableLayout,
    check_layouts,
    count_rows,
    layouts_for,
    perturb_rows,
    project_rows,
    row_starts,
    sub_schema,
    symbol_map,
)
from secure_release.mechanism.schema import Attribute, CuratorSchema

KEY = PadKey(bytes(range(32)))
PRAM = PramKey(bytes(range(1, 33)))
DIGEST = hashlib.sha256(b"a design").hexdigest()
#: SHA-256 of a classic release's columns (``test_a_whole_joint_release_is_unchanged``), computed
#: with the code before releases of several tables existed (commit 8ec23af).
CLASSIC_DIGEST = "6372aa6aa7dfeebd95a0d9d98c962ce1a5f2a4f71a53afa2a9abd16481f6a398"

ALICE = CuratorSchema("alice", (Attribute("A", ("a0", "a1")), Attribute("C", ("c0", "c1", "c2"))))
BOB = CuratorSchema("bob", (Attribute("B", ("b0", "b1")), Attribute("D", ("d0", "d1", "d2", "d3"))))


# ------------------------------------------------------------------------------ the pad
def test_segmented_chacha20_pad_is_each_tables_own_stream() -> None:
    segments = ((5, 3), (7, 1), (4, 6))
    pad = ReleasePad(CipherMode.CHACHA20, 6, 16, key=KEY, segments=segments)
    whole = pad.pad()
    # table t's rows are uniform_below(k_t) of its own HKDF stream, positions local to the table
    from secure_release.mechanism.primitives.pads import _chacha20_pad

    assert whole[:5].tolist() == _chacha20_pad(segment_stream_key(KEY, 0), 3, 0, 5).tolist()
    assert whole[5:12].tolist() == [0] * 7  # k = 1: no attribute in the table, pad 0
    assert whole[12:].tolist() == _chacha20_pad(segment_stream_key(KEY, 2), 6, 0, 4).tolist()
    assert all(int(v) < k for v, k in zip(whole, pad.moduli(0, 16), strict=True))  # type: ignore[arg-type]
    for start, count in [(0, 16), (3, 5), (11, 3), (12, 4)]:  # any range is the same rows
        assert pad.pad(start, count).tolist() == whole[start : start + count].tolist()


def test_segmented_pad_round_trips_per_row_modulus() -> None:
    segments = ((40, 3), (30, 1), (30, 6))
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.integers(0, 3, 40), np.zeros(30, int), rng.integers(0, 6, 30)]).astype(np.uint32)
    for mode in CipherMode:
        key = KEY if mode is CipherMode.CHACHA20 else None
        pad = new_release_pad(mode, 6, 100, key, segments=segments)
        c = pad.encrypt(x)
        assert (c[40:70] == 0).all()
        assert (c[:40] < 3).all() and (c[70:] < 6).all()
        assert pad.decrypt(c).tolist() == x.tolist()
        assert pad.decrypt(c[55:90], start=55).tolist() == x[55:90].tolist()
        assert np.concatenate([pad.encrypt_range(x[:33], 0), pad.encrypt_range(x[33:], 33)]).tolist() == c.tolist()


def test_segmented_pad_refuses_a_symbol_outside_its_table() -> None:
    pad = new_release_pad(CipherMode.CHACHA20, 6, 4, KEY, segments=((2, 2), (2, 6)))
    with pytest.raises(ShapeMismatchError, match=r"outside its table's alphabet 0\.\.1"):
        pad.encrypt(np.array([0, 2, 5, 5], dtype=np.uint32))
    with pytest.raises(ShapeMismatchError, match="summing to m = 4"):
        new_release_pad(CipherMode.CHACHA20, 6, 4, KEY, segments=((2, 2), (3, 6)))
    with pytest.raises(ShapeMismatchError, match=r"alphabets in 1\.\.6"):
        new_release_pad(CipherMode.CHACHA20, 6, 4, KEY, segments=((2, 7), (2, 6)))


def test_a_whole_joint_pad_is_unchanged() -> None:
    """No segments: the bytes of the classic pad (the release of one table stays byte for byte)."""
    pad = new_release_pad(CipherMode.CHACHA20, 6, 50, KEY)
    assert pad.pad().tolist() == chacha20_pad(KEY, 6, 0, 50).tolist()
    assert pad.moduli(0, 50) is None


# ------------------------------------------------------------------------------ PRAM
LAYOUTS = (TableLayout(300_000, 3.0, (2, 4)), TableLayout(250_000, 9.0, (3, 1)), TableLayout(10, 2.0, (1, 4)))


def _columns(layouts: tuple[TableLayout, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    starts = row_starts(layouts)
    cols = []
    for j in range(2):
        parts = [rng.integers(0, x.alphabet_sizes[j], x.m) for x in layouts]
        cols.append(np.concatenate(parts).astype(np.uint32))
    assert starts[-1] == cols[0].size
    return cols


def test_perturb_rows_does_not_depend_on_the_block_split() -> None:
    cols = _columns(LAYOUTS)
    whole = perturb_rows(cols, LAYOUTS, PRAM)
    step = PRAM_BLOCK_ROWS
    pieces = [perturb_rows([c[lo : lo + step] for c in cols], LAYOUTS, PRAM, lo) for lo in range(0, cols[0].size, step)]
    for j in range(2):
        assert np.concatenate([p[j] for p in pieces]).tolist() == whole[j].tolist()
    assert (whole[1][300_000:550_000] == 0).all()  # bob has no attribute in table 1
    assert (whole[0][550_000:] == 0).all()


def test_each_table_keeps_at_its_own_rate() -> None:
    """Kept rows (every live column unchanged, probability a_t + (1 - a_t)/K_t) per table, each
    within a two-sided binomial bound of false-failure rate 1e-7."""
    cols = _columns(LAYOUTS)
    out = perturb_rows(cols, LAYOUTS, PRAM)
    starts = row_starts(LAYOUTS)
    for t, x in enumerate(LAYOUTS[:2]):
        lo, hi = starts[t], starts[t + 1]
        same = np.ones(hi - lo, dtype=bool)
        for j in x.live:
            same &= out[j][lo:hi] == cols[j][lo:hi]
        a = PramChannel(x.gamma, x.joint_size).keep
        p = a + (1 - a) / x.joint_size
        low, high = stats.binom.ppf([0.5e-7, 1 - 0.5e-7], hi - lo, p)
        assert low <= int(same.sum()) <= high, (t, int(same.sum()), low, high)


def test_check_layouts_refuses_by_name() -> None:
    n = 100
    g = disjoint_tables.gammas_for_epsilon(n, [30, 40], 1.0)
    ok = (TableLayout(30, g[0], (2, 1)), TableLayout(40, g[1], (1, 4)))
    assert check_layouts(n, (6, 8), 1.0, ok) == ok
    with pytest.raises(ShapeMismatchError, match="above the release's"):
        check_layouts(n, (6, 8), 0.99, ok)
    with pytest.raises(ShapeMismatchError, match="no curator's attribute"):
        check_layouts(n, (6, 8), 1.0, (TableLayout(30, 2.0, (1, 1)),))
    with pytest.raises(ShapeMismatchError, match="exceed the curators'"):
        check_layouts(n, (6, 8), 1.0, (TableLayout(30, 2.0, (7, 1)),))
    with pytest.raises(ShapeMismatchError, match="1 to 64 tables"):
        check_layouts(n, (6, 8), 1.0, ())


# ------------------------------------------------------------------------------ layouts
def test_symbol_map_projects_on_the_tables_attributes() -> None:
    lut = symbol_map(ALICE, ["C"])
    labels = ALICE.labels()  # (A, C) per symbol
    assert [("c0", "c1", "c2")[int(v)] for v in lut] == [c for _, c in labels]
    assert symbol_map(ALICE, ["A", "C"]).tolist() == list(range(6))
    assert symbol_map(ALICE, ["B"]).tolist() == [0] * 6
    assert sub_schema(ALICE, ["B"]) is None
    assert sub_schema(BOB, ["D", "B"]) == BOB


def test_layouts_for_keeps_the_plan_at_its_n_and_rescales_at_another() -> None:
    g = disjoint_tables.gammas_for_epsilon(1000, [300, 500], 1.0)
    planned = [(("A", "B"), 300, g[0]), (("C", "D"), 500, g[1])]
    at = layouts_for(1000, [ALICE, BOB], planned, 1.0, planned_n=1000)
    assert [(x.m, x.gamma, x.alphabet_sizes) for x in at] == [(300, g[0], (2, 2)), (500, g[1], (3, 4))]
    other = layouts_for(800, [ALICE, BOB], planned, 1.0, planned_n=1000)
    assert [x.m for x in other] == [240, 400]
    assert disjoint_tables.release_epsilon(800, [240, 400], [x.gamma for x in other]) <= 1.0
    with pytest.raises(UnknownAttributeError, match="no curator has"):
        layouts_for(1000, [ALICE, BOB], [(("A", "Z"), 300, g[0])], 1.0)


# ------------------------------------------------------------------------------ the spec
def _spec(layouts: tuple[TableLayout, ...] = ()) -> ReleaseSpec:
    if not layouts:
        return ReleaseSpec("r1", ("alice", "bob"), CipherMode.CHACHA20, plan_release(1000, (6, 8), 1.0)).validate()
    total = sum(x.m for x in layouts)
    plan = ReleasePlan(1000, total, (6, 8), 1.0, max(x.gamma for x in layouts))
    return ReleaseSpec("r1", ("alice", "bob"), CipherMode.CHACHA20, plan, tables=layouts,
                       design_digest=DIGEST).validate()  # fmt: skip


def test_spec_carries_the_tables_through_json_and_the_wire() -> None:
    g = disjoint_tables.gammas_for_epsilon(1000, [300, 500], 1.0)
    spec = _spec((TableLayout(300, g[0], (2, 2)), TableLayout(500, g[1], (3, 4))))
    assert ReleaseSpec.from_dict(spec.to_dict()) == spec
    assert spec_from_pb(spec_to_pb(spec)) == spec
    assert spec.segments_of("bob") == ((300, 2), (500, 4))
    classic = _spec()
    assert "tables" not in classic.to_dict() and "design_digest" not in classic.to_dict()
    assert spec_to_pb(classic).SerializeToString() == spec_to_pb(classic).SerializeToString()
    assert not spec_to_pb(classic).tables and classic.segments_of("bob") is None


def test_spec_refuses_tables_that_do_not_add_up() -> None:
    g = disjoint_tables.gammas_for_epsilon(1000, [300, 500], 1.0)
    layouts = (TableLayout(300, g[0], (2, 2)), TableLayout(500, g[1], (3, 4)))
    plan = ReleasePlan(1000, 700, (6, 8), 1.0, g[1])
    with pytest.raises(ShapeMismatchError, match="sum to 800"):
        ReleaseSpec("r1", ("alice", "bob"), CipherMode.CHACHA20, plan, tables=layouts, design_digest=DIGEST).validate()
    plan = ReleasePlan(1000, 800, (6, 8), 1.0, g[1])
    with pytest.raises(ShapeMismatchError, match="64 hex digits"):
        ReleaseSpec("r1", ("alice", "bob"), CipherMode.CHACHA20, plan, tables=layouts, design_digest="x").validate()


# ------------------------------------------------------------------------------ in memory
def _tables(n: int = 4000, seed: int = 3) -> list[CuratorTable]:
    rng = np.random.default_rng(seed)
    ids = np.array([f"id{i}" for i in range(n)])
    a = rng.integers(0, 2, n)
    b = np.where(rng.random(n) < 0.8, a, 1 - a)  # strongly associated with A
    c, d = rng.integers(0, 3, n), rng.integers(0, 4, n)
    alice = CuratorTable(ALICE, ids, {"A": np.array(["a0", "a1"])[a], "C": np.array(["c0", "c1", "c2"])[c]})
    order = rng.permutation(n)
    bob = CuratorTable(BOB, ids[order], {"B": np.array(["b0", "b1"])[b][order],
                                         "D": np.array(["d0", "d1", "d2", "d3"])[d][order]})  # fmt: skip
    return [alice, bob]


def test_kept_rows_decrypt_to_each_tables_projected_sample() -> None:
    """Lemma 3.1 per table: where the server kept a row (every live ciphertext unchanged), the
    researcher's decryption is the sampled record's symbol of the table's attributes, exactly."""
    tables = _tables()
    g = disjoint_tables.gammas_for_epsilon(4000, [1500, 2000], 2.0)
    for cipher in CipherMode:
        keys = [KEY, PadKey(bytes(range(2, 34)))] if cipher is CipherMode.CHACHA20 else None
        res = run_tables_release(tables, [("A", "B"), ("C", "D")], [1500, 2000], g, 2.0, DIGEST, 4000, cipher,
                                 seed=Seed(bytes(32)), pram_key=PRAM, pad_keys=keys)  # fmt: skip
        assert [x.m for x in res.spec.tables] == [1500, 2000]
        est = res.estimates
        assert all(e is not None for e in est)
        assert [int(e.counts.sum()) for e in est if e is not None] == [1500, 2000]
        cipher_cols, perturbed = res.server_view["ciphertexts"], res.server_view["perturbed"]
        pads = res.researcher_view["pads"]
        starts = row_starts(res.spec.tables)
        for t, x in enumerate(res.spec.tables):
            lo, hi = starts[t], starts[t + 1]
            kept = np.ones(hi - lo, dtype=bool)
            for j in x.live:
                kept &= perturbed[j][lo:hi] == cipher_cols[j][lo:hi]
            for j in x.live:
                plain = pads[j].decrypt(cipher_cols[j][lo:hi], start=lo)
                assert (pads[j].decrypt(perturbed[j][lo:hi], start=lo)[kept] == plain[kept]).all()


def test_the_tables_estimates_are_the_counts_of_the_decrypted_rows() -> None:
    tables = _tables()
    g = disjoint_tables.gammas_for_epsilon(4000, [1500, 2000], 2.0)
    res = run_tables_release(tables, [("A", "B"), ("C", "D")], [1500, 2000], g, 2.0, DIGEST, 4000,
                             seed=Seed(bytes(32)), pram_key=PRAM, pad_keys=[KEY, KEY])  # fmt: skip
    pads = res.researcher_view["pads"]
    columns = [p.decrypt(c) for p, c in zip(pads, res.server_view["perturbed"], strict=True)]
    counts = [np.zeros(4, np.int64), np.zeros(12, np.int64)]
    count_rows(columns, res.spec.tables, 0, counts)
    assert [c.tolist() for c in counts] == [e.counts.tolist() for e in res.estimates if e is not None]
    # a curator's designed column, in table t's rows, is its projection on table t's attributes
    col = project_rows(np.arange(6, dtype=np.uint32).repeat(2), ALICE, [("A",), ("C",)],
                       (TableLayout(6, 2.0, (2, 1)), TableLayout(6, 2.0, (3, 1))))  # fmt: skip
    assert col.tolist() == [0] * 6 + [0, 0, 1, 1, 2, 2]


def test_granting_one_curator_leaves_its_tables_only() -> None:
    tables = _tables()
    g = disjoint_tables.gammas_for_epsilon(4000, [1000, 1000, 1000], 2.0)
    res = run_tables_release(tables, [("A", "C"), ("A", "B"), ("D",)], [1000, 1000, 1000], g, 2.0, DIGEST, 4000,
                             seed=Seed(bytes(32)), pram_key=PRAM, granted=[0])  # fmt: skip
    assert [e is not None for e in res.estimates] == [True, False, False]
    assert res.estimates[0] is not None and res.estimates[0].alphabet_sizes == (6,)


def test_a_whole_joint_release_is_unchanged() -> None:
    """Known answer: a classic release with fixed keys gives the bytes it gave before releases of
    several tables existed (SHA-256 of every curator's ciphertext and perturbed column, recorded
    from the code of the previous version)."""
    res = run_release(_tables(), 1.0, 500, seed=Seed(bytes(32)), pram_key=PRAM, pad_keys=[KEY, KEY],
                      alignment_key=AlignmentKey(bytes(range(3, 35))))  # fmt: skip
    h = hashlib.sha256()
    for col in [*res.server_view["ciphertexts"], *res.server_view["perturbed"]]:
        h.update(np.asarray(col, dtype=np.uint32).tobytes())
    assert "tables" not in res.server_view["plan"]
    assert h.hexdigest() == CLASSIC_DIGEST
