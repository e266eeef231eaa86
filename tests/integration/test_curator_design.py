"""A curator running a designed release (``run --design FILE``) without a network: the leader's
agreement is the in-memory designed spec, each curator's prepared record uploads exactly the
ciphertext columns of ``in_memory.run_tables_release`` with the same keys (chacha20; otp by
decryption, its pads being random), on the in-process and on the cluster path, seed or index
sampling; the record survives the keystore (pad segments, sample, design) and its key carries the
design; a follower refuses another design by name; the config refuses a design that is not the
curator's own schema, or does not fit the release, before anything is sent. Exact checks only."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from secure_release.curator.cli import build_parser, main
from secure_release.curator.cluster.aligned import AlignedPieces
from secure_release.curator.cluster.engine import InlineEngine
from secure_release.curator.config import CuratorConfig, config_from_args
from secure_release.curator.errors import DesignFileError, DesignRefusedError
from secure_release.curator.leader import LeaderState
from secure_release.curator.records.keystore import Keystore, KeystoreError, ReleaseRecord
from secure_release.curator.release.agreement import leader_state
from secure_release.curator.release.agreement_checks import check_agreement
from secure_release.curator.release.aligning import OwnData
from secure_release.curator.release.opening import ResumeSettings, resumable_record
from secure_release.curator.release.preparing import prepare
from secure_release.curator.service import CuratorService
from secure_release.infra.auth import AuthedContext
from secure_release.infra.config import ConfigError, apply_env_and_config, subcommand_parser
from secure_release.infra.designfile import write_design
from secure_release.infra.exitcodes import REFUSED, USAGE, exit_code_for
from secure_release.infra.identity import Identity
from secure_release.infra.logs import EventLog
from secure_release.mechanism.alignment.keyed_hash import align
from secure_release.mechanism.analysis.design import Design, design
from secure_release.mechanism.errors import DesignMismatchError
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.packing import pack_symbols
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.architectures import (
    AlignmentMode,
    SamplingMode,
    VariantAgreement,
    agreement_positions,
)
from secure_release.mechanism.protocol.in_memory import CuratorTable, curator_tags, run_tables_release
from secure_release.mechanism.protocol.tables import TablesPlan, project_rows, row_starts
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

ALICE = CuratorSchema("alice", (Attribute("edu", ("a", "b", "c")), Attribute("mar", ("m", "s"))))
BOB = CuratorSchema("bob", (Attribute("sex", ("f", "m")), Attribute("sal", ("lo", "hi"))))
NAMES = ("alice", "bob")
SIZES = {"alice": 6, "bob": 4}
AKEY = AlignmentKey(bytes(range(32)))
SEED = Seed(bytes([3]) * 32)
PRAM = PramKey(bytes([4]) * 32)
PAD_KEYS = (PadKey(bytes([1]) * 32), PadKey(bytes([2]) * 32))
LOG = EventLog("curator", "test")
#: Table 0 is (edu | sex, sal): both curators, alice 3 symbols and bob 4; table 1 (mar, sex): 2 and 2.
QUESTIONS = ["sal ~ edu | sex", "mar ~ sex"]
PLANNED_N = 400  # the aligned n is 345: the leader rescales the design's m_t and gamma_t to it


def _tables() -> tuple[CuratorTable, CuratorTable]:
    rng = np.random.default_rng(5)
    ids = np.array([f"id{i}" for i in range(400)])
    alice = CuratorTable(
        ALICE, ids[:370], {"edu": rng.choice(["a", "b", "c"], 370), "mar": rng.choice(["m", "s"], 370)}
    )
    bob_ids = ids[25:][::-1].copy()  # another order and other missing ids
    bob = CuratorTable(BOB, bob_ids, {"sex": rng.choice(["f", "m"], 375), "sal": rng.choice(["lo", "hi"], 375)})
    return alice, bob


@pytest.fixture(scope="module")
def the_design() -> Design:
    return design(PLANNED_N, [ALICE, BOB], 1.0, QUESTIONS)


@pytest.fixture(scope="module")
def another_design() -> Design:
    return design(PLANNED_N, [ALICE, BOB], 1.0, ["sal ~ edu", "mar ~ sex"])


def _plan(d: Design) -> TablesPlan:
    return TablesPlan(d.schemas, tuple(d.planned_tables()), d.epsilon, d.n, d.digest())


def _config(name: str, tmp_path: Path, d: Design | None, **changes: Any) -> CuratorConfig:
    config = CuratorConfig(
        name=name, release_id="r1", epsilon=1.0, m=None, cipher=CipherMode.CHACHA20, curators=NAMES,
        leader=name == "alice", leader_address=None if name == "alice" else "127.0.0.1:1", expected_sizes=None,
        notify="res", grants=(), data=tmp_path / f"{name}.csv", schema=tmp_path / f"{name}.json", dataset="d",
        keystore=tmp_path / f"ks-{name}", server="127.0.0.1:1", certs=None, listen_host="127.0.0.1",
        listen_port=0, port_file=None, insecure=True, timeout=5.0, exit_after_keys=True, alignment_key=AKEY,
        test_seed=SEED, design=None if d is None else _plan(d), design_json=b"" if d is None else d.canonical_json(),
    )  # fmt: skip
    return replace(config, **changes)


def _agreement(config: CuratorConfig) -> tuple[VariantAgreement, dict[str, Any]]:
    """The leader's agreement as LeaderState fixes it from both curators' tags."""
    alice, bob = _tables()
    tags = {"alice": curator_tags(alice, AKEY), "bob": curator_tags(bob, AKEY)}
    state: LeaderState = leader_state(config, SIZES["alice"])
    for name in NAMES:
        state.add_tags(name, tags[name], SIZES[name])
    return state.agree(), tags


def _reference(d: Design, cipher: CipherMode) -> Any:
    planned = d.planned_tables()
    return run_tables_release(
        list(_tables()), [a for a, _, _ in planned], [m for _, m, _ in planned], [g for _, _, g in planned],
        d.epsilon, d.digest(), d.n, cipher, "r1", seed=SEED, alignment_key=AKEY, pram_key=PRAM,
        pad_keys=list(PAD_KEYS) if cipher is CipherMode.CHACHA20 else None,
    )  # fmt: skip


def _prepare(
    name: str, config: CuratorConfig, agreement: VariantAgreement, tags: dict[str, Any], pieces: bool = False
) -> ReleaseRecord:
    table = dict(zip(NAMES, _tables(), strict=True))[name]
    own = OwnData(table, tags[name], "f" * 64)
    keystore = Keystore(config.keystore)
    if not pieces:
        return prepare(config, own, agreement, keystore, LOG)  # type: ignore[arg-type]
    # the cluster path: the aligned column as runs on an engine, sampled there into the sample file
    rows = align(tags[name], agreement.base.common).row_order
    column = table.symbols()[rows]
    engine = InlineEngine(2)
    try:
        cuts = [0, 40, 41, 200, column.size]
        runs = list(itertools.pairwise(cuts))
        sources = [[engine.put(column[lo:hi])] for lo, hi in runs]
        aligned = AlignedPieces(engine, sources, [hi - lo for lo, hi in runs], str(column.dtype))
        return prepare(config, own, agreement, keystore, LOG, pieces=aligned)  # type: ignore[arg-type]
    finally:
        engine.close()


@pytest.mark.parametrize("pieces", [False, True], ids=["in-process", "cluster"])
def test_a_designed_curator_uploads_the_in_memory_ciphertexts_chacha20(
    the_design: Design, tmp_path: Path, pieces: bool
) -> None:
    ref = _reference(the_design, CipherMode.CHACHA20)
    agreement, tags = _agreement(_config("alice", tmp_path, the_design))
    spec = agreement.base.spec
    assert spec.n == 345 != the_design.n  # rescaled to the aligned n
    assert replace(spec, researchers=()) == ref.spec and spec.design_digest == the_design.digest()
    for j, name in enumerate(NAMES):
        config = _config(name, tmp_path, the_design, test_pad_key=PAD_KEYS[j])
        checked = check_agreement(config, SIZES[name], agreement)  # the follower accepts its own design
        record = _prepare(name, config, checked, tags, pieces)
        assert (record.sample_file is not None) is pieces
        want = ref.server_view["ciphertexts"][j]
        assert np.array_equal(record.ciphertext(), want)
        assert record.ciphertext_chunk(0) == pack_symbols(want, SIZES[name])  # what an upload chunk carries
        assert record.pad.segments == spec.segments_of(name) and record.design_json == the_design.canonical_json()


def test_a_designed_curator_uploads_the_in_memory_columns_otp(the_design: Design, tmp_path: Path) -> None:
    ref = _reference(the_design, CipherMode.OTP)
    agreement, tags = _agreement(_config("alice", tmp_path, the_design, cipher=CipherMode.OTP))
    spec = agreement.base.spec
    starts = row_starts(spec.tables)
    for j, name in enumerate(NAMES):
        record = _prepare(name, _config(name, tmp_path, the_design, cipher=CipherMode.OTP), agreement, tags)
        ours = record.ciphertext()
        theirs = ref.server_view["ciphertexts"][j]
        # every table's rows are below its alphabet for this curator, and decrypt to the in-memory column
        for t, layout in enumerate(spec.tables):
            assert int(ours[starts[t] : starts[t + 1]].max()) < layout.alphabet_sizes[j]
        assert np.array_equal(record.pad.decrypt(ours), ref.researcher_view["pads"][j].decrypt(theirs))
        assert not np.array_equal(ours, theirs)  # fresh OS pads (equal with odds 2^-(m log2 k) at most)


def test_index_sampling_projects_the_leaders_positions(the_design: Design, tmp_path: Path) -> None:
    config = _config("alice", tmp_path, the_design, sampling=SamplingMode.INDICES)
    agreement, tags = _agreement(config)
    assert agreement.sampling is SamplingMode.INDICES
    spec = agreement.base.spec
    positions = agreement_positions(agreement)
    for j, name in enumerate(NAMES):
        table = _tables()[j]
        record = _prepare(name, _config(name, tmp_path, the_design, sampling=SamplingMode.INDICES), agreement, tags)
        rows = align(tags[name], agreement.base.common).row_order
        want = project_rows(table.symbols()[rows][positions], table.schema, _plan(the_design).table_attributes,
                            spec.tables)  # fmt: skip
        assert np.array_equal(record.pad.decrypt(record.ciphertext()), want)


@pytest.mark.parametrize("cipher", [CipherMode.CHACHA20, CipherMode.OTP])
def test_the_keystore_keeps_a_designed_record_and_its_key_carries_the_design(
    the_design: Design, tmp_path: Path, cipher: CipherMode
) -> None:
    agreement, tags = _agreement(_config("alice", tmp_path, the_design, cipher=cipher))
    config = _config("bob", tmp_path, the_design, cipher=cipher, test_pad_key=PAD_KEYS[1])
    if cipher is CipherMode.OTP:
        config = replace(config, test_pad_key=None)
    record = _prepare("bob", config, check_agreement(config, 4, agreement), tags)
    keystore = Keystore(config.keystore)
    stored = keystore.load_record("r1")
    assert stored is not None and stored.spec == record.spec
    assert stored.pad.segments == record.pad.segments == record.spec.segments_of("bob")
    assert np.array_equal(stored.sample, record.sample) and np.array_equal(stored.ciphertext(), record.ciphertext())
    assert np.array_equal(stored.pad.pad(), record.pad.pad())
    assert stored.design_json == the_design.canonical_json()
    assert hashlib.sha256(stored.design_json).hexdigest() == stored.spec.design_digest
    # a resume with the same design takes the record; another design (or none) is refused by name
    settings = ResumeSettings("r1", 1.0, NAMES, SamplingMode.SEED, the_design.digest())
    assert resumable_record(settings, keystore, "f" * 64) is not None
    for digest in ("", "0" * 64):
        with pytest.raises(DesignMismatchError, match=the_design.digest()):
            resumable_record(settings._replace(design_digest=digest), keystore, "f" * 64)
    # a restarted curator serves the stored design with the first key chunk only
    service = CuratorService("bob", BOB, EventLog("curator", "bob"))
    service.add_release("r1", stored.pad, ["res"], stored.design_json)
    chunks = list(service.ReleaseKey(pb.KeyRequest(release_id="r1"), _as_researcher("res")))
    assert chunks[0].design == the_design.canonical_json() and chunks[0].m == record.spec.m
    assert all(c.design == b"" for c in chunks[1:])
    # segments that are no curator's tables of the spec, or on a record of the whole joint, are refused
    path = config.keystore / "release-r1.json"
    data = json.loads(path.read_text())
    for bad in ([[record.spec.m, 4]], None):
        changed = dict(data)
        if bad is None:
            changed.pop("segments")
        else:
            changed["segments"] = bad
        path.write_text(json.dumps(changed))
        with pytest.raises(KeystoreError, match="malformed"):
            keystore.load_record("r1")


class _FakeContext:
    def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"{code}: {details}")

    def time_remaining(self) -> float:
        return 5.0


def _as_researcher(name: str) -> Any:
    return AuthedContext(_FakeContext(), Identity("researcher", name))  # type: ignore[arg-type]


def test_a_classic_record_is_unchanged(tmp_path: Path) -> None:
    """Without --design nothing changes: no segments, no design in the record or the key."""
    agreement, tags = _agreement(_config("alice", tmp_path, None))
    assert not agreement.base.spec.designed
    record = _prepare("alice", _config("alice", tmp_path, None, test_pad_key=PAD_KEYS[0]), agreement, tags)
    data = record.to_dict()
    assert "segments" not in data and "design" not in data and "tables" not in data["spec"]
    assert record.pad.segments is None and record.design_json == b""


def test_a_follower_refuses_another_design_naming_both_digests(
    the_design: Design, another_design: Design, tmp_path: Path
) -> None:
    agreement, _ = _agreement(_config("alice", tmp_path, the_design))
    mine, theirs = another_design.digest(), the_design.digest()
    cases = {
        "another design": (_config("bob", tmp_path, another_design), [theirs, mine]),
        "no design": (_config("bob", tmp_path, None), [theirs, "none"]),
    }
    classic, _ = _agreement(_config("alice", tmp_path, None))
    for what, (config, named) in cases.items():
        with pytest.raises(DesignRefusedError) as info:
            check_agreement(config, 4, agreement)
        assert all(text in str(info.value) for text in named), (what, str(info.value))
        assert exit_code_for(info.value) == REFUSED
    with pytest.raises(DesignRefusedError, match=f"design none.*{theirs}") as info:
        check_agreement(_config("bob", tmp_path, the_design), 4, classic)  # a classic spec to a designed follower
    # the same digest with other tables (a leader that rescaled them otherwise) is refused too
    spec = agreement.base.spec
    bent = replace(spec, tables=(replace(spec.tables[0], gamma=spec.tables[0].gamma * 0.5), *spec.tables[1:]))
    forged = replace(agreement, base=agreement.base._replace(spec=bent))
    with pytest.raises(DesignRefusedError, match="tables"):
        check_agreement(_config("bob", tmp_path, the_design), 4, forged)


# ----------------------------------------------------------------------------- the config
@pytest.fixture()
def files(tmp_path: Path, the_design: Design) -> Path:
    (tmp_path / "align.key").write_text("ab" * 32 + "\n")
    (tmp_path / "alice.csv").write_text("")
    for schema in (ALICE, BOB):
        attrs = [{"name": a.name, "categories": list(a.categories)} for a in schema.attributes]
        (tmp_path / f"{schema.name}.json").write_text(json.dumps({"curator": schema.name, "attributes": attrs}))
    write_design(the_design, tmp_path / "design.json")
    return tmp_path


def _argv(root: Path, *extra: str) -> list[str]:
    return [
        "--data", str(root / "alice.csv"), "--schema", str(root / "alice.json"), "--release-id", "r1",
        "--server", "127.0.0.1:7000", "--name", "alice", "--curators", "alice,bob", "--leader", "--insecure",
        "--alignment-key-file", str(root / "align.key"), "--design", str(root / "design.json"), *extra,
    ]  # fmt: skip


def _from_args(argv: list[str]) -> CuratorConfig:
    parser = build_parser()
    apply_env_and_config(subcommand_parser(parser, "run"), argv)
    return config_from_args(parser.parse_args(["run", *argv]))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("SECURE_RELEASE_"):
            monkeypatch.delenv(name)


def test_the_config_reads_the_design(files: Path, the_design: Design) -> None:
    config = _from_args(_argv(files))  # no --epsilon: the design's
    assert config.design is not None and config.design.digest == the_design.digest()
    assert config.epsilon == the_design.epsilon and config.design_json == the_design.canonical_json()
    assert _from_args(_argv(files, "--epsilon", repr(the_design.epsilon))).epsilon == the_design.epsilon
    assert _from_args(_argv(files, "--engine", "dask")).engine == "dask"  # the cluster path projects its sample
    assert _from_args(_argv(files, "--sampling", "indices", "--cipher", "otp")).sampling is SamplingMode.INDICES
    assert _from_args(_argv(files, "--alignment", "psi")).alignment is AlignmentMode.PSI


def test_a_schema_that_is_not_the_designs_is_refused_by_name(files: Path, the_design: Design) -> None:
    changed = {"curator": "alice", "attributes": [{"name": "edu", "categories": ["a", "b", "c", "d"]},
                                                  {"name": "mar", "categories": ["m", "s"]}]}  # fmt: skip
    (files / "alice.json").write_text(json.dumps(changed))
    with pytest.raises(DesignMismatchError, match=r"another schema for 'alice'.*edu\(3\).*edu\(4\)") as info:
        _from_args(_argv(files))
    assert exit_code_for(info.value) == USAGE
    # through the command line: exit 2 before anything is sent (the server address is never called)
    assert main(["run", *_argv(files)]) == USAGE


@pytest.mark.parametrize(
    ("extra", "error", "match"),
    [
        (["--epsilon", "0.5"], DesignMismatchError, "differs from the design's total epsilon"),
        (["--m", "30"], ConfigError, "give no --m"),
        (["--sampling", "server", "--table-id", "t1"], ConfigError, "server-side sampling"),
        (["--curators", "alice,carol"], DesignMismatchError, r"for the curators \['alice', 'bob'\]"),
        (["--max-epsilon", "0.5"], ConfigError, "exceeds this curator's cap"),
    ],
)
def test_a_design_that_does_not_fit_the_release_is_refused(
    files: Path, extra: list[str], error: type[Exception], match: str
) -> None:
    argv = _argv(files)
    if "--curators" in extra:
        argv[argv.index("--curators") + 1] = extra[1]
        extra = []
    with pytest.raises(error, match=match) as info:
        _from_args([*argv, *extra])
    assert exit_code_for(info.value) == USAGE


@pytest.mark.parametrize("content", [None, "not json", json.dumps({"format": "secure-release/design/1"}), "[]"])
def test_an_unreadable_design_file_is_refused_by_name(files: Path, content: str | None) -> None:
    path = files / "design.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    with pytest.raises(DesignFileError, match=f"--design {path} is not a readable design") as info:
        _from_args(_argv(files))
    assert exit_code_for(info.value) == USAGE


def test_help_teaches_the_design() -> None:
    parser = build_parser()
    text = subcommand_parser(parser, "run").format_help()
    assert "--design FILE" in text and "digest" in text and "A release designed for questions" in text
