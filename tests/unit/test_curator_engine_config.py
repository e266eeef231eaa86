"""The cluster engine's settings: what ``--engine dask`` runs, what it refuses and why, and the
scheduler addresses a curator may send its alignment key to."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from secure_release.curator.cli import build_parser
from secure_release.curator.cluster.engine import DaskEngine, EngineError, check_scheduler_address, open_engine
from secure_release.curator.config import CuratorConfig, config_from_args
from secure_release.curator.errors import StoppedError
from secure_release.infra.config import ConfigError, apply_env_and_config, subcommand_parser
from secure_release.infra.logs import EventLog


@pytest.fixture()
def base(tmp_path: Path) -> list[str]:
    (tmp_path / "align.key").write_text("ab" * 32)
    (tmp_path / "alice.csv").write_text("")
    (tmp_path / "alice.json").write_text("")
    return [
        "--data", str(tmp_path / "alice.csv"), "--schema", str(tmp_path / "alice.json"), "--release-id", "r1",
        "--epsilon", "0.5", "--server", "127.0.0.1:7000", "--name", "alice", "--curators", "alice,bob", "--leader",
        "--insecure", "--alignment-key-file", str(tmp_path / "align.key"), "--keystore", str(tmp_path / "ks"),
    ]  # fmt: skip


def _config(argv: list[str]) -> CuratorConfig:
    parser = build_parser()
    apply_env_and_config(subcommand_parser(parser, "run"), argv)
    return config_from_args(parser.parse_args(["run", *argv]))


def test_the_default_engine_is_local_and_dask_takes_its_cluster_flags(base: list[str]) -> None:
    assert _config(base).engine == "local"
    config = _config([*base, "--engine", "dask", "--workers", "3", "--worker-memory", "3GiB", "--shards", "64"])
    assert (config.engine, config.workers, config.worker_memory, config.shard_bits) == ("dask", 3, "3GiB", 6)
    assert _config([*base, "--engine", "dask", "--scheduler", "tls://10.1.2.3:8786"]).scheduler == "tls://10.1.2.3:8786"


def test_psi_runs_on_the_cluster_with_one_follower_and_for_any_follower(base: list[str]) -> None:
    """Issue 41: a leader with one follower, and a follower among any number of curators, run the
    PSI ring on their clusters (only a cluster leader of three or more is refused, below)."""
    config = _config([*base, "--engine", "dask", "--alignment", "psi", "--psi-slice-points", "4096"])
    assert (config.engine, config.alignment.value, config.psi_slice_points) == ("dask", "psi", 4096)
    follower = [a for a in base if a != "--leader"] + ["--leader-address", "127.0.0.1:7101"]
    follower[follower.index("alice,bob")] = "carol,alice,bob"
    assert _config([*follower, "--engine", "dask", "--alignment", "psi"]).psi_slice_points is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--engine", "dask", "--sampling", "indices"], r"refuses --sampling indices .* 34 MB at m = 10\^7"),
        (["--engine", "dask", "--alignment", "psi", "--curators", "alice,bob,carol"],
         r"refuses --alignment psi with three or more curators at a leader .* lead with --engine local"),
        (["--engine", "dask", "--alignment", "psi", "--psi-slice-points", "0"], r"from 1 to 1048576"),
        (["--scheduler", "tcp://127.0.0.1:8786"], "need --engine dask"),
        (["--engine", "dask", "--scheduler", "a:1", "--scheduler-file", "f.json"], "exclude each other"),
        (["--engine", "dask", "--shards", "48"], "power of two"),
        (["--engine", "dask", "--workers", "0"], "from 1 to 256"),
        (["--engine", "dask", "--worker-memory", "lots"], "size such as 2GiB"),
        (["--engine", "dask", "--query", "SELECT 1"], "export the query's result to Parquet"),
    ],
)
def test_what_the_cluster_engine_refuses_says_why(base: list[str], extra: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config([*base, *extra])


@pytest.mark.parametrize(
    "address", ["tcp://127.0.0.1:8786", "localhost:8786", "tcp://[::1]:8786", "tls://10.0.0.5:8786"]
)
def test_tls_anywhere_or_plaintext_on_this_host_is_accepted(address: str) -> None:
    assert check_scheduler_address(address) == address


@pytest.mark.parametrize("address", ["tcp://10.0.0.5:8786", "10.0.0.5:8786", "ws://scheduler.example:8786"])
def test_a_plaintext_scheduler_on_another_host_is_refused(address: str) -> None:
    with pytest.raises(EngineError, match=r"plaintext .* alignment key"):
        check_scheduler_address(address)


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(EngineError, match="unknown engine 'spark'; choose one of local, dask"):
        open_engine("spark")


def test_without_dask_the_engine_says_what_to_install_and_no_forkserver_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing.forkserver as forkserver

    from secure_release.curator.cluster.forkserver import start_forkserver

    for name in [m for m in sys.modules if m == "distributed" or m.startswith("distributed.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the cluster extra were not installed
    before = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    start_forkserver(in_process=True)
    assert forkserver._forkserver._forkserver_pid == before  # type: ignore[attr-defined]
    with pytest.raises(EngineError, match=r"needs dask.distributed: pip install 'secure-release\[cluster\]'"):
        open_engine("dask")


class _Pending:
    """A future that never completes (the engine polls ``done()``; it never asks for a result)."""

    def done(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> Any:
        raise AssertionError("a pending future's result was asked for")


def test_sigterm_stops_a_cluster_stage_within_a_second() -> None:
    cancelled: list[Any] = []

    class FakeClient:
        def cancel(self, fs: list[Any]) -> None:
            cancelled.extend(fs)

    stop = threading.Event()
    engine = DaskEngine(FakeClient(), None, None, "fake", stop)
    handles = [_Pending(), _Pending()]
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(StoppedError, match="during the shuffle stage"):
        engine.results(handles, "shuffle")
    assert time.monotonic() - started < 1.0  # polled every POLL_S, not a second's wait
    assert sorted(map(id, cancelled)) == sorted(map(id, handles))
    cancelled.clear()
    with pytest.raises(StoppedError, match="while waiting for the cluster"):
        engine.result(handles[0])
    assert cancelled == [handles[0]]


def test_the_runs_stop_event_reaches_the_engine(base: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's SIGTERM event is the engine's stop event (before, the run never handed it over:
    a SIGTERM during the read stage waited for the whole shuffle)."""
    import secure_release.curator.cluster.engine as engine_module
    from secure_release.curator.release import aligning

    given: dict[str, Any] = {}
    monkeypatch.setattr(engine_module, "open_engine", lambda engine, **kw: given.update(kw) or "an engine")
    stop = threading.Event()
    config = _config([*base, "--engine", "dask"])
    assert aligning.start_engine(config, EventLog("curator", "t"), stop) == "an engine"
    assert given["stop"] is stop
    assert given["spill_dir"] == str(config.keystore / "dask-spill")  # under the keystore, never the cwd


def test_a_leader_on_a_cluster_takes_a_billion_tags_by_default(base: list[str]) -> None:
    assert _config(base).max_rows == 1 << 24  # in memory: 256 MiB of tags
    assert _config([*base, "--engine", "dask"]).max_rows == 1 << 30  # spooled to disk
    assert _config([*base, "--engine", "dask", "--max-rows", "5"]).max_rows == 5
    with pytest.raises(ConfigError, match="2\\^32 - 1"):
        _config([*base, "--max-rows", str(1 << 32)])
