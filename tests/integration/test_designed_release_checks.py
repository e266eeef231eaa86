"""What the researcher and the server refuse in a release of several tables (a designed release),
beside tests/integration/test_researcher_tables.py and test_server_designed_release.py: a design with the
spec's digest that does not make the spec the server holds, a key labelled with another schema
than the design's, why each table of a partial release is missing, an analyst reading a release of
several tables as one table; at the server, a symbol outside a table's alphabet by its own name
(INVALID_ARGUMENT) after the state checks. Every release is ``in_memory.run_tables_release``'s with
fixed keys, served by the in-process fakes of tests/researcher_fakes.py."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from researcher_fakes import EventRecorder, FakeCurator, FakeRelease, FakeServer, running

from secure_release.infra.errors import status_code_for
from secure_release.infra.logs import EventLog
from secure_release.infra.wire import report_from_pb, tables_report_from_pb, tables_to_pb
from secure_release.mechanism.analysis.design import Design, design
from secure_release.mechanism.errors import DesignMismatchError, ErrorKind, MultiTableResultError
from secure_release.mechanism.estimation.report import TablesReport
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.packing import pack_symbols
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.in_memory import CuratorTable, TablesResult, run_tables_release
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
from secure_release.researcher.errors import KeyMismatchError, ReleaseDesignMismatchError
from secure_release.researcher.pipeline import MissingKeysError, process_release
from secure_release.server.state import ConflictingChunkError, TableAlphabetError
from secure_release.server.store import Store

LOG = EventLog("researcher", "test")
N = 4000
ALICE = CuratorSchema("alice", (Attribute("A", ("a0", "a1")), Attribute("C", ("c0", "c1", "c2"))))
BOB = CuratorSchema("bob", (Attribute("B", ("b0", "b1")), Attribute("D", ("d0", "d1", "d2", "d3"))))
PAD_KEYS = [PadKey(bytes(range(32))), PadKey(bytes(range(2, 34)))]
PRAM = PramKey(bytes(range(1, 33)))


def _tables(n: int = N, seed: int = 3) -> list[CuratorTable]:
    rng = np.random.default_rng(seed)
    ids = np.array([f"id{i}" for i in range(n)])
    a = rng.integers(0, 2, n)
    b = np.where(rng.random(n) < 0.8, a, 1 - a)
    c, d = rng.integers(0, 3, n), rng.integers(0, 4, n)
    alice = CuratorTable(ALICE, ids, {"A": np.array(["a0", "a1"])[a], "C": np.array(["c0", "c1", "c2"])[c]})
    order = rng.permutation(n)
    bob = CuratorTable(BOB, ids[order], {"B": np.array(["b0", "b1"])[b][order],
                                         "D": np.array(["d0", "d1", "d2", "d3"])[d][order]})  # fmt: skip
    return [alice, bob]


@pytest.fixture(scope="module")
def three() -> Design:
    """Tables holding alice's attributes alone and both curators' (several tables)."""
    d = design(N, [ALICE, BOB], 2.0, ["A ~ B", "C ~ D", "A ~ C"], at_v=0.2)
    assert len(d.release.tables) >= 2
    return d


def _run(d: Design, cipher: CipherMode = CipherMode.CHACHA20) -> TablesResult:
    planned = d.planned_tables()
    return run_tables_release(
        _tables(), [a for a, _, _ in planned], [m for _, m, _ in planned], [g for _, _, g in planned], d.epsilon,
        d.digest(), d.n, cipher, "r1", seed=Seed(bytes(32)), alignment_key=AlignmentKey(bytes(range(3, 35))),
        pram_key=PRAM, pad_keys=PAD_KEYS if cipher is CipherMode.CHACHA20 else None,
    )  # fmt: skip


@dataclass
class DesignCurator(FakeCurator):
    """A fake curator that sends ``design_bytes`` on its first key chunk (KeyChunk.design)."""

    design_bytes: bytes = b""

    def ReleaseKey(self, request: pb.KeyRequest, context: Any) -> Iterator[pb.KeyChunk]:  # noqa: N802
        for i, chunk in enumerate(super().ReleaseKey(request, context)):
            if i == 0:
                chunk.design = self.design_bytes
            yield chunk


def _fakes(
    res: TablesResult,
    sent: bytes,
    schemas: tuple[CuratorSchema, ...] = (ALICE, BOB),
    curators: Sequence[int] = (0, 1),
    spec: ReleaseSpec | None = None,
) -> tuple[FakeServer, list[FakeCurator]]:
    """The fake server (``spec``: the one it says, default the release's) and curators of ``res``,
    each sending ``sent`` as the design and ``schemas`` as its schema."""
    release = FakeRelease(spec or res.spec, res.server_view["perturbed"], res.researcher_view["pads"], schemas)
    return FakeServer(release), [DesignCurator(release, j, design_bytes=sent) for j in curators]


@pytest.fixture
def recorder() -> Iterator[EventRecorder]:
    handler, logger = EventRecorder(), logging.getLogger("secure_release.researcher")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not .level =: it clears the logger's cached levels
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


# ------------------------------------------------------------------------------------ researcher
def test_the_release_fits_its_design_and_the_tables_are_the_in_memory_ones(three: Design) -> None:
    """The positive control of the refusals below: the same fakes with the true design estimate
    every table exactly as the in-memory protocol does."""
    res = _run(three)
    server, curators = _fakes(res, three.canonical_json())
    with running(server, curators) as endpoints:
        report = process_release(endpoints, "r1", None, LOG, timeout=10, allow_partial=False)
    assert isinstance(report, TablesReport) and report.missing == {}
    for got, want in zip(report.tables, res.estimates, strict=True):
        assert got is not None and want is not None
        assert np.array_equal(got.observed, want.counts) and np.array_equal(got.estimate, want.raw)


def test_a_design_with_the_specs_digest_that_is_not_the_specs_release_is_refused(three: Design, tmp_path: Path) -> None:
    """The server names design X (its digest) while its tables are design Y's: the curators send
    X, the digest matches, and the tables do not: refused before anything is fetched or written."""
    res = _run(three)
    other = design(N, [ALICE, BOB], 2.0, ["A ~ D"], at_v=0.2)
    assert other.planned_tables() != three.planned_tables()
    spec = dataclasses.replace(res.spec, design_digest=other.digest()).validate()
    server, curators = _fakes(res, other.canonical_json(), spec=spec)
    with running(server, curators) as endpoints, pytest.raises(ReleaseDesignMismatchError, match="tables") as err:
        process_release(endpoints, "r1", tmp_path / "out", LOG, timeout=10)
    assert isinstance(err.value, KeyMismatchError) and isinstance(err.value, DesignMismatchError)
    assert err.value.kind is ErrorKind.FAILED_PRECONDITION  # the release failed (exit 1), no bad usage
    assert not (tmp_path / "out").exists()


def test_tables_in_another_order_than_the_designs_are_refused(three: Design) -> None:
    res = _run(three)
    swapped = dataclasses.replace(res.spec, tables=tuple(reversed(res.spec.tables))).validate()
    assert swapped.tables != res.spec.tables
    server, curators = _fakes(res, three.canonical_json(), spec=swapped)
    with running(server, curators) as endpoints, pytest.raises(ReleaseDesignMismatchError, match="not the one"):
        process_release(endpoints, "r1", None, LOG, timeout=10)


def test_a_digest_mismatch_is_the_design_error_by_name(three: Design) -> None:
    res = _run(three)
    server, curators = _fakes(res, three.canonical_json() + b" ")
    with running(server, curators) as endpoints, pytest.raises(ReleaseDesignMismatchError, match="SHA-256"):
        process_release(endpoints, "r1", None, LOG, timeout=10)


def test_a_key_labelled_with_another_schema_than_the_designs_is_refused(three: Design) -> None:
    """Same alphabet sizes (the key fits the spec), other attribute names: the cells would be
    labelled wrongly, so nothing is estimated."""
    res = _run(three)
    renamed = CuratorSchema("bob", (Attribute("B2", ("b0", "b1")), Attribute("D", ("d0", "d1", "d2", "d3"))))
    assert renamed.alphabet_size == BOB.alphabet_size
    server, curators = _fakes(res, three.canonical_json(), schemas=(ALICE, renamed))
    with running(server, curators) as endpoints, pytest.raises(ReleaseDesignMismatchError, match="bob's key"):
        process_release(endpoints, "r1", None, LOG, timeout=10)


def test_a_partial_release_names_why_each_table_is_missing(three: Design, recorder: EventRecorder) -> None:
    res = _run(three)
    server, curators = _fakes(res, three.canonical_json(), curators=(0,))
    with running(server, curators) as endpoints:
        with pytest.raises(MissingKeysError, match=r"no tables without every curator's key.*allow-partial"):
            process_release(endpoints, "r1", None, LOG, timeout=10, allow_partial=False)
        report = process_release(endpoints, "r1", None, LOG, timeout=10, allow_partial=True)
    assert isinstance(report, TablesReport)
    with_bob = {t for t, x in enumerate(res.spec.tables) if 1 in x.live}
    assert set(report.missing) == with_bob and with_bob != set(range(len(res.spec.tables)))
    assert all(why.startswith("no key from bob (") and "no address" in why for why in report.missing.values())
    assert [t is None for t in report.tables] == [t in with_bob for t in range(len(res.spec.tables))]
    warned = [r for r in recorder.records if r.getMessage() == "tables_not_estimated"]
    assert len(warned) == 1


def test_the_classic_fetch_event_is_unchanged_and_the_designed_one_counts_tables(
    three: Design, recorder: EventRecorder
) -> None:
    from researcher_fakes import make_release

    classic = make_release(CipherMode.CHACHA20)
    with running(FakeServer(classic), [FakeCurator(classic, 0), FakeCurator(classic, 1)]) as endpoints:
        process_release(endpoints, "r1", None, LOG, timeout=5)
    res = _run(three)
    server, curators = _fakes(res, three.canonical_json())
    with running(server, curators) as endpoints:
        process_release(endpoints, "r1", None, LOG, timeout=10)
    fetched = [r for r in recorder.records if r.getMessage() == "fetched"]
    assert len(fetched) == 2, recorder.events()
    assert not hasattr(fetched[0], "tables") and fetched[1].__dict__.get("tables") == len(res.spec.tables)


def test_an_analyst_never_reads_a_release_of_several_tables_as_one_table(three: Design) -> None:
    res = _run(three)
    server, curators = _fakes(res, three.canonical_json())
    with running(server, curators) as endpoints:
        report = process_release(endpoints, "r1", None, LOG, timeout=10)
    assert isinstance(report, TablesReport)
    resp = tables_to_pb(report)
    back = tables_report_from_pb(resp)
    assert back is not None and back.to_dict() == report.to_dict()
    with pytest.raises(MultiTableResultError, match="tables_report_from_pb"):
        report_from_pb(resp)


# ------------------------------------------------------------------------------------ server
def test_the_servers_refusal_of_a_symbol_outside_its_table_is_named_and_invalid_argument(
    three: Design, tmp_path: Path
) -> None:
    res = _run(three)
    spec = res.spec
    store = Store(tmp_path)
    for c in spec.curators:
        store.register(spec, c, c)
    k = spec.plan.alphabet_sizes[0]
    col = res.server_view["ciphertexts"][0].copy()
    off = [t for t, x in enumerate(spec.tables) if x.alphabet_sizes[0] < k]
    assert off  # some table gives alice fewer symbols than her whole schema
    t = off[0]
    start = sum(x.m for x in spec.tables[:t])
    col[start] = spec.tables[t].alphabet_sizes[0]  # packs (below k), outside table t's alphabet
    bad = pack_symbols(col, k)
    with pytest.raises(TableAlphabetError, match=f"table {t}") as err:
        store.put_chunk("r1", "alice", "alice", 0, bad)
    assert status_code_for(err.value) is grpc.StatusCode.INVALID_ARGUMENT
    assert store.release("r1", "alice").parts["alice"].chunks == {}
    good = pack_symbols(res.server_view["ciphertexts"][0], k)
    assert store.put_chunk("r1", "alice", "alice", 0, good) is True
    # the state checks come first: the same bad chunk at a stored number is a conflict
    with pytest.raises(ConflictingChunkError):
        store.put_chunk("r1", "alice", "alice", 0, bad)
    assert store.release("r1", "alice").parts["alice"].chunks == {0: hashlib.sha256(good).digest()}
    store.close()
