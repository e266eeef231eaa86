"""Two curators' whole runs in one process (leader and follower over loopback gRPC), with the
upload to the release server replaced by a recorder: the same spec at both, ciphertexts equal to
mechanism.protocol.run_release's with the same keys, and the ledger read from disk once a run."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import secure_release.curator.runner as runner
from secure_release.curator.config import CuratorConfig
from secure_release.curator.keystore import Keystore
from secure_release.curator.table import load_schema, read_table
from secure_release.mechanism.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.pads import CipherMode
from secure_release.mechanism.protocol import run_release
from secure_release.mechanism.schema import SymbolArray
from secure_release.mechanism.spec import ReleaseSpec

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
        notify="res", grants=(), budget=2.0, data=tmp / f"{name}.csv", schema=tmp / f"{name}.json",
        dataset=f"{name}.csv", keystore=tmp / f"ks-{name}", server="127.0.0.1:1", certs=None,
        listen_host="127.0.0.1", listen_port=0, port_file=str(tmp / f"{name}.port"), insecure=True,
        timeout=20.0, exit_after_keys=True, alignment_key=AKEY,
        test_seed=SEED if name == "alice" else None, test_pad_key=PAD_KEYS[name],
    )  # fmt: skip


def test_two_curators_run_to_the_upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path)
    uploads: dict[str, tuple[ReleaseSpec, SymbolArray]] = {}
    monkeypatch.setattr(
        runner, "upload", lambda config, spec, ct, log: uploads.__setitem__(config.name, (spec, ct))
    )
    reads: list[Path] = []
    load_ledger = Keystore.load_ledger

    def counted(self: Keystore) -> Any:
        reads.append(self.directory)
        return load_ledger(self)

    monkeypatch.setattr(Keystore, "load_ledger", counted)
    alice = _config(tmp_path, "alice")
    codes: dict[str, int] = {}
    leader = threading.Thread(target=lambda: codes.__setitem__("alice", runner.run(alice)))
    leader.start()
    port_file = tmp_path / "alice.port"
    deadline = time.monotonic() + 20
    while not port_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    bob = replace(_config(tmp_path, "bob"), leader_address=f"127.0.0.1:{int(port_file.read_text())}")
    codes["bob"] = runner.run(bob)
    leader.join(20)
    assert codes == {"alice": 0, "bob": 0}
    assert sorted(reads) == sorted([alice.keystore, bob.keystore])  # the ledger read once a run
    assert uploads["alice"][0] == uploads["bob"][0] and uploads["alice"][0].n == 460
    tables = [read_table(tmp_path / f"{n}.csv", load_schema(tmp_path / f"{n}.json")) for n in ("alice", "bob")]
    expected = run_release(tables, 1.0, m=120, release_id="r1", seed=SEED, alignment_key=AKEY,
                           pram_key=PramKey(bytes(32)), pad_keys=list(PAD_KEYS.values()))  # fmt: skip
    for j, name in enumerate(("alice", "bob")):
        assert np.array_equal(uploads[name][1], expected.server_view["ciphertexts"][j])
        assert Keystore(tmp_path / f"ks-{name}").load_ledger().spent(f"{name}.csv") == pytest.approx(1.0)
