"""No secret a stage task carries can reach a log (issue 41's review).

Dask logs a failed task's arguments at the worker, as the repr of its task (``Compute Failed ...
Task: <Task 'key' reblind_slice(b'...', ...)>``), and an embedded cluster's workers write to the
curator's own log. Every key and scalar a task carries is therefore :class:`Sealed`. Exact
checks: the repr Dask would log shows no byte of a sealed secret, and across a whole ring on the
cluster path (and the keyed hash's read and the sample) no task receives a raw secret."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dask._task_spec import Task
from support import split_parquet

from secure_release.curator.cluster import ring as rg
from secure_release.curator.cluster.aligned import AlignedPieces
from secure_release.curator.cluster.engine import InlineEngine
from secure_release.curator.cluster.sample import sample_runs
from secure_release.curator.cluster.sealed import Sealed, opened
from secure_release.curator.cluster.sharded import load_sharded
from secure_release.curator.leader import LeaderState
from secure_release.curator.table import load_schema
from secure_release.demo_data import write_demo_data
from secure_release.infra.logs import EventLog
from secure_release.mechanism.alignment.psi import PsiKey, unmask_scalar
from secure_release.mechanism.primitives.keys import AlignmentKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode
from secure_release.mechanism.primitives.sampling import sampling_key
from secure_release.mechanism.protocol.architectures import AlignmentMode

LOG = EventLog("curator", "test")


class Recording(InlineEngine):
    """The in-process engine, remembering every argument of every task."""

    def __init__(self) -> None:
        super().__init__(2)
        self.args: list[Any] = []

    def submit(self, fn: Any, *args: Any) -> Any:
        self.args.extend(args)
        return super().submit(fn, *args)


def _raw(secrets: list[bytes], args: list[Any]) -> list[bytes]:
    """The secrets that some argument carries as plain bytes."""
    plain = {bytes(a) for a in args if isinstance(a, bytes | bytearray)}
    return [s for s in secrets if s in plain]


def test_the_repr_dask_logs_of_a_failed_task_shows_no_byte_of_a_sealed_secret() -> None:
    secret = bytes(range(200, 232))
    logged = repr(Task("k", rg.ps.reblind_slice, Sealed(secret), b"\x02" * 33))
    assert "<sealed secret>" in logged and repr(secret)[2:20] not in logged and secret.hex() not in logged
    assert repr(secret)[2:20] in repr(Task("k", rg.ps.reblind_slice, secret, b""))  # what it would show raw
    assert opened(Sealed(secret)) == secret == opened(secret) and str(Sealed(secret)) == "<sealed secret>"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sealed")
    write_demo_data(root, rows=400, seed=4)
    return root


def test_no_task_of_the_ring_the_keyed_hash_or_the_sample_gets_a_raw_secret(world: Path, tmp_path: Path) -> None:
    keys = {"alice": PsiKey(bytes([7]) * 32), "bob": PsiKey(bytes([8]) * 32)}
    engine = Recording()
    state = LeaderState("r1", ("alice", "bob"), None, 1.0, None, CipherMode.CHACHA20, ("researcher",),
                        alignment=AlignmentMode.PSI, psi_dir=tmp_path / "box")  # fmt: skip

    def transport(me: str) -> rg.Transport:
        def send(owner: str, hop: int, shape: Any, points: bytes, proof: bytes, public: bytes) -> None:
            state.psi_put_slice(me, owner, hop, shape, points, proof, public)

        def receive(owner: str, hop: int, index: int) -> Any:
            return state.psi_get_slice(me, owner, hop, index, 30.0)

        return rg.Transport(send, receive)

    try:
        tables = {
            c: rg.load_points(engine, str(split_parquet(world / f"{c}.csv", tmp_path / c, 2)),
                              load_schema(world / f"{c}.json"), keys[c], 2, LOG, shard_bits=1)
            for c in keys
        }  # fmt: skip
        out: dict[str, Any] = {}
        threads = [threading.Thread(target=lambda c=c: out.update({c: rg.cluster_ring(
            c, ("alice", "bob"), tables[c], keys[c], transport(c), LOG, 2, 50)})) for c in keys]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert set(out) == {"alice", "bob"} and out["bob"].num_rows > 0
        alignment_key = AlignmentKey(bytes([9]) * 32)
        load_sharded(engine, str(world / "alice.csv"), load_schema(world / "alice.json"), alignment_key, LOG, 1)
        sizes = out["bob"].sizes
        pieces = AlignedPieces(engine, [[engine.put(f.result().symbols)] for f in out["bob"].shards], list(sizes),
                               "uint8")  # fmt: skip
        seed = Seed(bytes([3]) * 32)
        list(sample_runs(pieces, seed, "r1", min(10, int(np.sum(sizes)))))
    finally:
        engine.close()
    secrets = [k.scalar() for k in keys.values()] + [k.mask() for k in keys.values()]
    secrets += [rg.order_key(k).reveal() for k in keys.values()] + [unmask_scalar(keys["alice"], 3)]
    secrets += [alignment_key.reveal(), sampling_key(seed, "r1")]
    assert _raw(secrets, engine.args) == []
    sealed = [opened(a) for a in engine.args if isinstance(a, Sealed)]
    assert keys["bob"].scalar() in sealed and alignment_key.reveal() in sealed and sampling_key(seed, "r1") in sealed
