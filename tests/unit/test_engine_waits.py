"""How a curator waits on its Dask cluster (issue 47, item 3): the first failed task ends the
wait at once, a task whose workers kept dying is a named :class:`WorkerLostError` (exit 1) that
says the stage, the workers' memory and what to change, a wait past ``--timeout`` is a
:class:`WaitTimeoutError` naming the stage, and a stage that makes no progress says so once a
minute. A fake client and fake futures: exact, no cluster."""

from __future__ import annotations

import time
from typing import Any

import pytest
from distributed.scheduler import KilledWorker

from secure_release.curator.cluster import engine as eng
from secure_release.curator.cluster.engine import DaskEngine, WorkerLostError, stage_of
from secure_release.curator.errors import WaitTimeoutError
from secure_release.infra.exitcodes import FAILURE, exit_code_for


class FakeFuture:
    def __init__(self, key: str, value: Any = None, error: BaseException | None = None, done: bool = True) -> None:
        self.key, self.value, self.error, self._done = key, value, error, done

    def done(self) -> bool:
        return self._done

    @property
    def status(self) -> str:
        return "error" if self.error is not None and self._done else "finished" if self._done else "pending"

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value

    def release(self) -> None:
        return None


class FakeClient:
    def __init__(self) -> None:
        self.cancelled: list[Any] = []

    def cancel(self, futures: list[Any]) -> None:
        self.cancelled += futures

    def gather(self, futures: list[Any]) -> list[Any]:
        return [f.result() for f in futures]


def _engine(log: Any = None) -> DaskEngine:
    e = DaskEngine(FakeClient(), None, log, "fake")
    e.worker_memory = "300MiB"
    return e


def test_a_task_whose_workers_kept_dying_ends_the_wait_at_once_named_with_what_to_change() -> None:
    lost = FakeFuture("hash_partition-abc-3", error=KilledWorker("hash_partition-abc-3", None, 3))
    waiting = [FakeFuture(f"hash_partition-abc-{i}", done=False) for i in range(4)]  # would never finish
    e = _engine()
    t0 = time.monotonic()
    with pytest.raises(WorkerLostError) as info:
        e.results([*waiting, lost], "read")
    assert time.monotonic() - t0 < 1.0  # not a wait on tasks a wedged cluster will not run
    text = str(info.value)
    assert "the read stage cannot finish" in text and "hash_partition-abc-3" in text and "4 workers died" in text
    assert "300MiB" in text and "--worker-memory" in text and "smaller files" in text and "--shards" in text
    assert set(e.client.cancelled) == set(waiting)  # the rest of the stage is cancelled
    assert exit_code_for(info.value) == FAILURE  # a runtime failure: rerun once changed


def test_a_failed_stage_task_passes_its_own_error_through() -> None:
    bad = FakeFuture("merge_shard-x-0", error=ValueError("a stage's own error"))
    with pytest.raises(ValueError, match="a stage's own error"):
        _engine().results([FakeFuture("merge_shard-x-1", done=False), bad], "shuffle")


def test_a_wait_past_the_timeout_names_the_stage_and_its_progress() -> None:
    e = _engine()
    e.timeout_s, e.deadline = 0.2, time.monotonic() + 0.2
    handles = [FakeFuture("keep_run-a-0", 1), FakeFuture("keep_run-a-1", done=False)]
    t0 = time.monotonic()
    with pytest.raises(WaitTimeoutError) as info:
        e.results(handles, "sample")
    assert 0.2 <= time.monotonic() - t0 < 2.0
    assert "gave up after 0.2 s (--timeout) waiting for the sample stage on the cluster (1 of 2 tasks done" in str(
        info.value
    )
    assert e.client.cancelled == [handles[1]]
    with pytest.raises(WaitTimeoutError, match="the match stage"):  # one task's wait too (the matcher's)
        e.result(FakeFuture("match_rows-b-7", done=False))


class Recorder:
    """What the engine logs (an EventLog's two call styles), kept in a list: not the logging
    tree, which another test may have configured not to propagate."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def test_a_stage_without_progress_says_what_it_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eng, "STALL_LOG_S", 0.1)
    log = Recorder()
    e = _engine(log)
    e.timeout_s, e.deadline = 0.45, time.monotonic() + 0.45
    with pytest.raises(WaitTimeoutError):
        e.results([FakeFuture("merge_shard-c-0", done=False)], "shuffle")
    said = [fields for event, fields in log.lines if event == "stage_waiting"]
    assert 2 <= len(said) <= 5, len(said)  # about one a STALL_LOG_S, none while tasks complete
    assert "still waiting for the shuffle stage on the cluster (0 of 1 tasks done)" in said[0]["note"]


def test_every_task_function_names_its_stage() -> None:
    assert stage_of(FakeFuture("hash_partition-1f2e-0")) == "read"
    assert stage_of(FakeFuture("match_spooled-9a-12")) == "match"
    assert stage_of(FakeFuture("symbols_from-9a-1")) == "sample"
    assert stage_of(FakeFuture("something_else-1")) == "a"
    from secure_release.curator.cluster import psi_stages, sample, shard_files, shards

    modules = (shards, shard_files, psi_stages, sample)
    for fn in eng.TASK_STAGES:  # no stale name: each is a task function of the engine's stages
        assert any(callable(getattr(m, fn, None)) for m in modules) or fn == "gather_symbols", fn
