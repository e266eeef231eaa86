"""The agreement-level variants across the services: ``--sampling indices`` (the leader's
packed index tuple travels in the agreement stream) and ``--alignment psi`` (the ECDH ring through
the leader's PsiSend/PsiReceive). Each release equals the in-memory
``mechanism.protocol.architectures.run_variant_release`` with the same randomness; two curators' whole runs in
one process (loopback gRPC, the server replaced by a recorder), then real processes over mutual
TLS with the server and the researcher."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_curator_run import AKEY, PAD_KEYS, SEED, FakeLink, FakeWitnessStub, _config, _write
from test_curator_service import SCHEMA as SVC_SCHEMA
from test_curator_service import AbortedError, _as
from test_faults_kill import CURATORS, PADS, PRAM, Deployment

import secure_release.curator.release.runner as runner
from secure_release.curator.config import CuratorConfig
from secure_release.curator.leader import LeaderState
from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import LedgerFile
from secure_release.curator.records.ledgersign import HeadSigner
from secure_release.curator.release import opening
from secure_release.curator.service import CuratorService
from secure_release.curator.table import load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.infra.logs import EventLog
from secure_release.infra.streams import (
    PIECE_BYTES,
    AgreementError,
    agreement_chunks,
    agreement_from_chunks,
    point_chunks,
)
from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, align, common_tags
from secure_release.mechanism.alignment.psi import POINT_BYTES, PsiKey, hash_to_group
from secure_release.mechanism.primitives.keys import PramKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.protocol.architectures import (
    AlignmentMode,
    SamplingMode,
    VariantAgreement,
    run_variant_release,
)
from secure_release.mechanism.protocol.in_memory import Agreement
from secure_release.mechanism.protocol.index_sharing import (
    InvalidIndexTupleError,
    pack_indices,
    sample_set_fingerprint,
    unpack_indices,
)
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

PSI_KEYS = {"alice": PsiKey(bytes([5]) * 32), "bob": PsiKey(bytes([6]) * 32)}
Change = Callable[[CuratorConfig], CuratorConfig]


# ------------------------------------------------------------------------------ the wire
def test_the_agreement_stream_carries_a_large_index_tuple_in_pieces_of_at_most_1_mib() -> None:
    n, m = 1 << 20, 700_000  # 700,000 x 20 bits = 1.75 MB: two index pieces
    spec = ReleaseSpec("r1", ("alice", "bob"), CipherMode.CHACHA20, plan_release(n, (6, 4), 1.0, m), ("res",))
    common = np.zeros(3, dtype=TAG_DTYPE)
    positions = np.random.default_rng(1).permutation(n)[:m]
    packed = pack_indices(positions, n)
    sent = VariantAgreement(Agreement(spec, Seed.generate(), common), SamplingMode.INDICES, AlignmentMode.PSI, packed)
    chunks = list(agreement_chunks(sent))
    assert len(packed) == 1_750_000 and len(chunks) == 3
    assert all(len(c.common_tags) + len(c.packed_indices) <= PIECE_BYTES for c in chunks)
    assert not any(c.sampling_seed for c in chunks)  # no seed travels with index sharing
    got = agreement_from_chunks(iter(chunks))
    assert got.packed_indices == packed and got.sampling is SamplingMode.INDICES and got.alignment is AlignmentMode.PSI
    assert np.array_equal(unpack_indices(got.packed_indices, n, m), positions)
    # a truncated tuple, one byte too many, or a seed beside the tuple are refused
    short = list(agreement_chunks(sent))
    short[-1].packed_indices = short[-1].packed_indices[:-1]
    with pytest.raises(InvalidIndexTupleError):
        agreement_from_chunks(iter(short))
    long = list(agreement_chunks(sent))
    long[-1].packed_indices += b"\0"
    with pytest.raises(AgreementError, match="more packed index bytes"):
        agreement_from_chunks(iter(long))
    seeded = list(agreement_chunks(sent))
    seeded[0].sampling_seed = bytes(32)
    with pytest.raises(AgreementError, match="must not carry a seed"):
        agreement_from_chunks(iter(seeded))


# ------------------------------------------------------------------------------ in one process
def _run_both(tmp: Path, alice_change: Change, bob_change: Change) -> dict[str, object]:
    """Leader (thread) and follower, each run to the end; the exit value or the exception."""
    out: dict[str, object] = {}
    port_file = tmp / "alice.port"
    port_file.unlink(missing_ok=True)

    def call(name: str, config: CuratorConfig) -> None:
        try:
            out[name] = runner.run(config)
        except Exception as exc:
            out[name] = exc

    leader = threading.Thread(target=call, args=("alice", alice_change(_config(tmp, "alice"))))
    leader.start()
    end = time.monotonic() + 20
    while not port_file.exists() and time.monotonic() < end:
        time.sleep(0.02)
    bob = replace(_config(tmp, "bob"), leader_address=f"127.0.0.1:{int(port_file.read_text())}")
    call("bob", bob_change(bob))
    leader.join(30)
    return out


def _prepared(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list:  # type: ignore[type-arg]
    _write(tmp)
    monkeypatch.setattr(opening, "ServerLink", FakeLink)
    FakeLink.uploads.clear()
    FakeWitnessStub.held.clear()  # a fresh server witness for every deployment
    for name in ("alice", "bob"):
        Keystore(tmp / f"ks-{name}").ledger.set_budget(f"{name}.csv", f"{name}.csv", 2.0)
    return [read_table(tmp / f"{n}.csv", load_schema(tmp / f"{n}.json")) for n in ("alice", "bob")]


def test_index_sharing_across_the_curators_equals_the_in_memory_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = _prepared(tmp_path, monkeypatch)
    indices: Change = lambda c: replace(c, sampling=SamplingMode.INDICES)  # noqa: E731
    assert _run_both(tmp_path, indices, indices) == {"alice": 0, "bob": 0}
    stored = Keystore(tmp_path / "ks-alice").load_agreement("r1")
    assert stored is not None and stored.agreement.sampling is SamplingMode.INDICES
    packed = stored.agreement.packed_indices
    assert packed is not None and len(packed) == -(-120 * 9 // 8)  # m = 120 positions of ceil(log2 460) bits
    positions = unpack_indices(packed, 460, 120)
    expected = run_variant_release(tables, 1.0, m=120, sampling="indices", release_id="r1", indices=positions,
                                   alignment_key=AKEY, pram_key=PramKey(bytes(32)),
                                   pad_keys=list(PAD_KEYS.values()))  # fmt: skip
    for j, name in enumerate(("alice", "bob")):
        assert np.array_equal(FakeLink.uploads[name][1], expected.server_view["ciphertexts"][j])
        record = Keystore(tmp_path / f"ks-{name}").load_record("r1")
        assert record is not None and record.sampling is SamplingMode.INDICES
        reserve = Keystore(tmp_path / f"ks-{name}").ledger.read().entries[1]
        assert reserve.seed_fingerprint == record.seed_fingerprint == sample_set_fingerprint(positions)
    assert json.loads((tmp_path / "ks-bob" / "release-r1.json").read_text())["sampling_randomness"].startswith(
        "from the OS CSPRNG"
    )


def test_psi_across_the_curators_gives_one_canonical_order_and_the_in_memory_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = _prepared(tmp_path, monkeypatch)

    def psi(c: CuratorConfig) -> CuratorConfig:
        return replace(c, alignment=AlignmentMode.PSI, alignment_key=None, test_psi_key=PSI_KEYS[c.name])

    assert _run_both(tmp_path, psi, psi) == {"alice": 0, "bob": 0}
    expected = run_variant_release(tables, 1.0, m=120, alignment="psi", release_id="r1", seed=SEED,
                                   psi_keys=list(PSI_KEYS.values()), pram_key=PramKey(bytes(32)),
                                   pad_keys=list(PAD_KEYS.values()))  # fmt: skip
    for j, name in enumerate(("alice", "bob")):
        assert np.array_equal(FakeLink.uploads[name][1], expected.server_view["ciphertexts"][j])
    # the leader kept its own PSI tags with the agreement (a restart cannot redo the ring alone)
    stored = Keystore(tmp_path / "ks-alice").load_agreement("r1")
    assert stored is not None and stored.own_tags is not None and stored.agreement.alignment is AlignmentMode.PSI
    # the leader persisted every curator's rows in the canonical order (not the common tags)
    assert stored.agreement.base.common.size == 0 and set(stored.rows) == {"alice", "bob"}
    common = common_tags(_psi_tags(tables))
    assert common.size == 460
    # both curators' rows in the canonical order name the same individuals, as the leader stored them
    ids = [t.ids[align(t_tags, common).row_order] for t, t_tags in
           zip(tables, _psi_tags(tables), strict=True)]  # fmt: skip
    assert np.array_equal(ids[0], ids[1])
    assert all(np.array_equal(t.ids[stored.rows[c]], ids[0]) for t, c in zip(tables, ("alice", "bob"), strict=True))


def _psi_tags(tables: list) -> list:  # type: ignore[type-arg]
    from secure_release.mechanism.alignment.psi import run_psi

    return run_psi([t.ids for t in tables], list(PSI_KEYS.values())).tags


def test_a_follower_aligning_otherwise_fails_the_agreement_for_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _prepared(tmp_path, monkeypatch)
    monkeypatch.setattr(FakeLink, "abort", lambda self, reason, give_up_s=10.0: (None, True))
    out = _run_both(
        tmp_path,
        lambda c: replace(c, alignment=AlignmentMode.PSI, alignment_key=None, timeout=8.0),
        lambda c: replace(c, timeout=8.0),
    )
    assert "aligns by keyed-hash, the leader by psi" in str(out["alice"]), out
    assert "aligns by keyed-hash, the leader by psi" in str(out["bob"]), out


# ------------------------------------------------------------------------------ real processes
ROWS, M_REAL, EPS = 1200, 300, 0.5


@pytest.fixture(scope="module")
def small_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A small demo table (PSI costs ~0.12-0.22 ms of one core per id per curator)."""
    base = tmp_path_factory.mktemp("variants")
    write_demo_data(base / "data", rows=ROWS, seed=5)
    (base / "align.key").write_text(AKEY.reveal().hex())
    tables = [read_table(base / "data" / f"{c}.csv", load_schema(base / "data" / f"{c}.json")) for c in CURATORS]
    return {"base": base, "tables": tables}


def _deploy(world: dict[str, object], certs: Path, tmp: Path, rid: str, extra: dict[str, list[str]]) -> Deployment:
    root = tmp / rid
    root.mkdir()
    (root / "data").symlink_to(Path(str(world["base"])) / "data")
    (root / "align.key").write_text((Path(str(world["base"])) / "align.key").read_text())
    for c in CURATORS:
        LedgerFile(root / f"ks-{c}", HeadSigner.from_certs(certs / c, c)).set_budget(f"{c}.csv", f"{c}.csv", 2.0)
    dep = Deployment(root, certs, rid, timeout=60.0)
    dep.extra = extra
    return dep


def _wait(dep: Deployment, roles: tuple[str, ...], seconds: float) -> dict[str, int | None]:
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(dep.procs[r].poll() is None for r in roles):
        time.sleep(0.05)
    return {r: dep.procs[r].poll() for r in roles}


@pytest.mark.slow
def test_indices_and_psi_over_the_services_equal_the_in_memory_release(
    small_world: dict[str, object], certs: Path, tmp_path: Path
) -> None:
    variant = {
        c: ["--sampling", "indices", "--alignment", "psi", "--insecure-test-psi-key", PSI_KEYS[c].reveal().hex(),
            "--m", str(M_REAL), "--epsilon", str(EPS)]
        for c in CURATORS
    }  # fmt: skip
    dep = _deploy(small_world, certs, tmp_path, "v1", variant)
    try:
        for role in ("server", "alice", "bob", "researcher"):
            dep.start(role)
        codes = _wait(dep, ("researcher",), 90)
    finally:
        dep.close()
    assert codes == {"researcher": 0}, dep.log("alice").read_text()[-2000:]
    stored = Keystore(dep.root / "ks-alice").load_agreement("v1")
    assert stored is not None and stored.agreement.packed_indices is not None
    n = stored.agreement.base.spec.n
    positions = unpack_indices(stored.agreement.packed_indices, n, M_REAL)
    ref = run_variant_release(small_world["tables"], EPS, M_REAL, "indices", "psi", "chacha20", "v1",  # type: ignore[arg-type]
                              indices=positions, psi_keys=[PSI_KEYS[c] for c in CURATORS], pram_key=PRAM,
                              pad_keys=[PADS[c] for c in CURATORS])  # fmt: skip
    got = np.array([c["raw"] for c in json.loads((dep.root / "results" / "v1.json").read_text())["cells"]])
    assert np.array_equal(got, ref.estimate.raw)
    for c in CURATORS:  # PSI scalars and index tuples are never logged: counts and fingerprints only
        text = dep.log(c).read_text()
        assert PSI_KEYS[c].reveal().hex() not in text and stored.agreement.packed_indices.hex()[:32] not in text
        assert '"psi_aligned"' in text and '"sampling": "indices"' in text


@pytest.mark.slow
def test_a_follower_whose_sampling_differs_refuses_and_the_release_is_aborted(
    small_world: dict[str, object], certs: Path, tmp_path: Path
) -> None:
    m = ["--m", str(M_REAL)]
    dep = _deploy(small_world, certs, tmp_path, "v2", {"alice": [*m, "--sampling", "indices"], "bob": m})
    try:
        for role in ("server", "alice", "bob", "researcher"):
            dep.start(role)
        codes = _wait(dep, ("alice", "bob", "researcher"), 40)
    finally:
        dep.close()
    assert codes == {"alice": 1, "bob": 1, "researcher": 1}, codes
    assert "sampling ('indices' != 'seed')" in dep.log("bob").read_text()
    researcher = dep.log("researcher").read_text()
    assert "aborted" in researcher and "sampling" in researcher
    assert Keystore(dep.root / "ks-bob").ledger.read().releases().get("v2") is None  # bob reserved nothing


def test_cli_flags_reach_the_config(tmp_path: Path) -> None:
    from secure_release.curator.cli import build_parser
    from secure_release.curator.config import ConfigError, config_from_args

    _write(tmp_path)
    base = ["run", "--data", str(tmp_path / "bob.csv"), "--schema", str(tmp_path / "bob.json"), "--release-id", "r1",
            "--epsilon", "1", "--curators", "alice,bob", "--server", "127.0.0.1:1", "--name", "bob",
            "--leader-address", "127.0.0.1:2", "--insecure"]  # fmt: skip
    cfg = config_from_args(build_parser().parse_args([*base, "--sampling", "indices", "--alignment", "psi"]))
    assert cfg.sampling is SamplingMode.INDICES and cfg.alignment is AlignmentMode.PSI and cfg.alignment_key is None
    assert cfg.psi_workers == 1
    psi = [*base, "--alignment", "psi", "--psi-workers"]
    assert config_from_args(build_parser().parse_args([*psi, "2"])).psi_workers == 2
    with pytest.raises(ConfigError, match="--psi-workers"):
        config_from_args(build_parser().parse_args([*psi, "0"]))
    done = subprocess.run([sys.executable, "-m", "secure_release.curator", *base, "--sampling", "random"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "--sampling" in done.stderr


# ------------------------------------------------------------------------------ PsiSend / PsiReceive refusals
def _psi_leader(max_points: int = 100) -> tuple[CuratorService, LeaderState]:
    service = CuratorService("alice", SVC_SCHEMA, EventLog("curator", "alice"))
    state = LeaderState("r1", ("alice", "bob", "carol"), None, 1.0, None, CipherMode.OTP, ("res",), SEED,
                        alignment=AlignmentMode.PSI, max_points=max_points)  # fmt: skip
    service.lead(state)
    return service, state


def _points(count: int) -> bytes:
    return b"".join(hash_to_group([f"id{i}" for i in range(count)]))


class _Stream:
    """A chunk stream that counts how many chunks the servicer consumed."""

    def __init__(self, chunks: list[pb.PsiChunk]) -> None:
        self.chunks, self.taken = chunks, 0

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> pb.PsiChunk:
        if self.taken == len(self.chunks):
            raise StopIteration
        self.taken += 1
        return self.chunks[self.taken - 1]


@pytest.mark.parametrize(
    ("who", "owner", "hop", "count", "code", "error"),
    [
        ("dave", "bob", 1, 3, "PERMISSION_DENIED", "not a curator"),  # membership, before any point
        ("carol", "bob", 1, 3, "PERMISSION_DENIED", "the ring has 'bob' send it"),  # not its turn
        ("bob", "bob", 1, 101, "RESOURCE_EXHAUSTED", "--max-rows"),  # the leader's bound
        ("bob", "bob", 4, 3, "INVALID_ARGUMENT", "routes no PSI list"),  # no such hop (N = 3)
        ("carol", "bob", 2, 3, "INVALID_ARGUMENT", "has None points"),  # hop 2 before hop 1
    ],
)
def test_psi_send_refuses_before_buffering(who: str, owner: str, hop: int, count: int, code: str, error: str) -> None:
    service, _ = _psi_leader()
    points = _points(min(count, 3))
    chunks = list(point_chunks("r1", who, owner, hop, points))
    chunks[0].count = count
    chunks += [pb.PsiChunk(release_id="r1", curator=who, owner=owner, hop=hop, sequence=1, points=points)]
    stream = _Stream(chunks)
    with pytest.raises(AbortedError) as info:
        service.PsiSend(stream, _as("curator", who))
    assert info.value.code.name == code and error in info.value.details, info.value.details
    assert stream.taken == 1  # refused on the first chunk: nothing after it was read


def test_psi_lists_go_hop_by_hop_to_the_curator_the_ring_routes_them_to() -> None:
    service, state = _psi_leader()
    sent = _points(5)
    resp = service.PsiSend(iter(point_chunks("r1", "bob", "bob", 1, sent)), _as("curator", "bob"))
    assert resp.points_received == 5
    # bob's list after one blinding goes to carol, nobody else
    with pytest.raises(AbortedError, match="goes to 'carol'"):
        list(service.PsiReceive(pb.PsiRequest(release_id="r1", curator="alice", owner="bob", hop=1),
                                _as("curator", "alice")))  # fmt: skip
    got = list(service.PsiReceive(pb.PsiRequest(release_id="r1", curator="carol", owner="bob", hop=1),
                                  _as("curator", "carol")))  # fmt: skip
    assert b"".join(c.points for c in got) == sent and got[0].count == 5
    # not there yet: UNAVAILABLE (the caller retries)
    with pytest.raises(AbortedError) as info:
        list(service.PsiReceive(pb.PsiRequest(release_id="r1", curator="alice", owner="carol", hop=1),
                                _as("curator", "alice", 0.6)))  # fmt: skip
    assert info.value.code.name == "UNAVAILABLE"
    assert state.error is None
    # hop 2 must hold as many points as bob's list: a member's wrong list ends the release for
    # everybody at once, naming it (issue 24; before, the leader waited for the ring's deadline)
    with pytest.raises(AbortedError, match="has 5 points"):
        service.PsiSend(iter(point_chunks("r1", "carol", "bob", 2, _points(4))), _as("curator", "carol"))
    assert state.error is not None and "'carol' sent a wrong PSI list" in state.error


def test_a_changed_resend_of_a_psi_list_ends_the_release_naming_the_member() -> None:
    service, state = _psi_leader()
    service.PsiSend(iter(point_chunks("r1", "bob", "bob", 1, _points(5))), _as("curator", "bob"))
    with pytest.raises(AbortedError, match="other points"):
        service.PsiSend(iter(point_chunks("r1", "bob", "bob", 1, _points(6)[POINT_BYTES:])), _as("curator", "bob"))
    assert state.error is not None and "'bob' sent a wrong PSI list" in state.error
