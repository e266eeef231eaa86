"""Two curators' whole runs in one process (leader and follower over loopback gRPC), with the
upload to the release server replaced by a recorder: the same spec at both, ciphertexts equal to
mechanism.protocol.in_memory.run_release's with the same keys, the budget reserved then committed, and a
rerun after the commit resuming from the record (same ciphertext, no second reservation)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import secure_release.curator.release.runner as runner
from secure_release.curator.config import CuratorConfig
from secure_release.curator.records.keystore import Keystore
from secure_release.curator.records.ledgerfile import file_fingerprint
from secure_release.curator.release import opening
from secure_release.curator.table import load_schema, read_table
from secure_release.curator.waits import Deadline
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.packing import unpack_symbols
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.protocol.in_memory import run_release
from secure_release.mechanism.protocol.spec import ReleaseSpec
from secure_release.mechanism.schema import SymbolArray
from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb

AKEY = AlignmentKey(bytes(range(32)))
SEED = Seed(bytes([4]) * 32)
PAD_KEYS = {"alice": PadKey(bytes([1]) * 32), "bob": PadKey(bytes([2]) * 32)}
SCHEMAS = {
    "alice": {"edu": ["a", "b", "c"], "mar": ["m", "s"]},
    "bob": {"sex": ["f", "m"], "sal": ["lo", "hi"]},
}


def _write(tmp: Path) -> None:
    rng = np.random.default_rng(3)
    for name, attrs in SCHEMAS.items():
        ids = np.arange(0, 500) if name == "alice" else np.arange(40, 560)[::-1]
        cols = {a: rng.choice(cats, ids.size) for a, cats in attrs.items()}
        lines = ["id," + ",".join(attrs)] + [
            ",".join([f"p{i}", *(str(cols[a][r]) for a in attrs)]) for r, i in enumerate(ids)
        ]
        (tmp / f"{name}.csv").write_text("\n".join(lines) + "\n")
        schema = {"curator": name, "attributes": [{"name": a, "categories": c} for a, c in attrs.items()]}
        (tmp / f"{name}.json").write_text(json.dumps(schema))


def _config(tmp: Path, name: str) -> CuratorConfig:
    return CuratorConfig(
        name=name, release_id="r1", epsilon=1.0, m=120, cipher=CipherMode.CHACHA20,
        curators=("alice", "bob"), leader=name == "alice", leader_address=None, expected_sizes=None,
        notify="res", grants=(), data=tmp / f"{name}.csv", schema=tmp / f"{name}.json",
        dataset=f"{name}.csv", keystore=tmp / f"ks-{name}", server="127.0.0.1:1", certs=None,
        listen_host="127.0.0.1", listen_port=0, port_file=str(tmp / f"{name}.port"), insecure=True,
        timeout=20.0, exit_after_keys=True, alignment_key=AKEY,
        test_seed=SEED if name == "alice" else None, test_pad_key=PAD_KEYS[name],
    )  # fmt: skip


class FakeWitnessStub:
    """The server's budget witness in memory (moves only up, as server/witness.py)."""

    held: ClassVar[dict[tuple[str, bytes], tuple[int, float]]] = {}

    def WitnessLedger(self, request: pb.WitnessRequest, timeout: float | None = None) -> pb.WitnessReply:  # noqa: N802
        key = (request.curator, bytes(request.dataset_key))
        count, total = self.held.get(key, (0, 0.0))
        if request.record:
            count, total = max(count, request.reservations), max(total, request.epsilon_total)
            self.held[key] = (count, total)
        return pb.WitnessReply(reservations=count, epsilon_total=total)


class FakeLink:
    """The release server as seen by one curator: records what it was sent; always sealed."""

    uploads: ClassVar[dict[str, tuple[ReleaseSpec, SymbolArray]]] = {}
    registered: ClassVar[list[str]] = []

    def __init__(self, config: CuratorConfig, log: Any, deadline: Any) -> None:
        self.config, self.deadline = config, deadline
        self.stub = FakeWitnessStub()

    def register(self, spec: ReleaseSpec) -> None:
        self.registered.append(self.config.name)

    def upload(self, spec: ReleaseSpec, ciphertext: SymbolArray) -> None:
        self.uploads[self.config.name] = (spec, ciphertext)

    def upload_chunks(self, spec: ReleaseSpec, num_chunks: int, chunk_of: Callable[[int], bytes],
                      streams: int = 1) -> None:  # fmt: skip
        """What the server would store: the chunks joined and unpacked."""
        packed = b"".join(chunk_of(seq) for seq in range(num_chunks))
        self.upload(spec, unpack_symbols(packed, spec.alphabet_of(self.config.name)))

    def wait_sealed(self) -> pb.ReleaseStatus:
        return pb.ReleaseStatus(release_id=self.config.release_id, state=pb.RELEASE_STATE_PERTURBED)

    def abort(self, reason: str, give_up_s: float = 10.0) -> tuple[None, bool]:
        raise AssertionError(f"no abort expected: {reason}")

    def wind_down(self, give_up_s: float = 10.0) -> Deadline:
        """As ServerLink's: until the run's deadline (then ``give_up_s``)."""
        return Deadline(max(give_up_s, self.deadline.left()))

    def close(self) -> None:
        pass


def _run_both(tmp_path: Path) -> dict[str, int]:
    alice = _config(tmp_path, "alice")
    codes: dict[str, int] = {}
    port_file = tmp_path / "alice.port"
    port_file.unlink(missing_ok=True)
    leader = threading.Thread(target=lambda: codes.__setitem__("alice", runner.run(alice)))
    leader.start()
    deadline = time.monotonic() + 20
    while not port_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    bob = replace(_config(tmp_path, "bob"), leader_address=f"127.0.0.1:{int(port_file.read_text())}")
    codes["bob"] = runner.run(bob)
    leader.join(20)
    return codes


def test_two_curators_run_to_the_upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path)
    monkeypatch.setattr(opening, "ServerLink", FakeLink)
    FakeLink.uploads.clear()
    FakeWitnessStub.held.clear()
    fingerprints = {name: file_fingerprint(tmp_path / f"{name}.csv") for name in ("alice", "bob")}
    for name in fingerprints:
        Keystore(tmp_path / f"ks-{name}").ledger.set_budget(f"{name}.csv", f"{name}.csv", 2.0)
    assert _run_both(tmp_path) == {"alice": 0, "bob": 0}
    uploads = dict(FakeLink.uploads)
    assert uploads["alice"][0] == uploads["bob"][0] and uploads["alice"][0].n == 460
    tables = [read_table(tmp_path / f"{n}.csv", load_schema(tmp_path / f"{n}.json")) for n in ("alice", "bob")]
    expected = run_release(tables, 1.0, m=120, release_id="r1", seed=SEED, alignment_key=AKEY,
                           pram_key=PramKey(bytes(32)), pad_keys=list(PAD_KEYS.values()))  # fmt: skip
    for j, name in enumerate(("alice", "bob")):
        assert np.array_equal(uploads[name][1], expected.server_view["ciphertexts"][j])
        ledger = Keystore(tmp_path / f"ks-{name}").ledger.read()
        assert [e.kind.value for e in ledger.entries] == ["budget", "reserve", "commit"]
        assert ledger.spent(f"{name}.csv") == pytest.approx(1.0)
        assert ledger.tables(f"{name}.csv") == [fingerprints[name]]  # the table read, recorded
    # A rerun after the commit resumes from the record: the same ciphertext, nothing charged again.
    FakeLink.uploads.clear()
    assert _run_both(tmp_path) == {"alice": 0, "bob": 0}
    for name in ("alice", "bob"):
        assert np.array_equal(FakeLink.uploads[name][1], uploads[name][1])
        assert len(Keystore(tmp_path / f"ks-{name}").ledger.read().entries) == 3
