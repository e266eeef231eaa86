"""A designed release (``run --design FILE``) with the curators as real processes: its tables are
the in-memory protocol's exactly with the same keys (``run_tables_release``) when a curator is
killed after it prepared and again after it committed (it resumes from its record, pad segments
and design included, and serves the design with its key), and when both curators run on their
Dask cluster (the sample file holds each table's projected symbols). Each ledger is charged the
design's epsilon once."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from test_faults_kill import CURATORS, EPSILON, PADS, PRAM, ROLES, SEED, Deployment, make_world, new_deployment

from secure_release.curator.records.keystore import Keystore
from secure_release.curator.table import load_schema
from secure_release.infra.designfile import write_design
from secure_release.mechanism.analysis.design import Design, design
from secure_release.mechanism.estimation.report import TablesReport
from secure_release.mechanism.primitives.keys import AlignmentKey
from secure_release.mechanism.protocol.in_memory import CuratorTable, run_tables_release

pytestmark = pytest.mark.slow
QUESTIONS = ["salary ~ education | sex", "marital ~ sex"]
BUDGET_S = 60.0


@dataclass
class DesignedDeployment(Deployment):
    """The faults test's deployment, each curator with ``--design`` (and no ``--m``) and ``flags``."""

    design_file: Path = Path("design.json")
    flags: tuple[str, ...] = ()

    def args(self, role: str) -> list[str]:
        out = super().args(role)
        if role in CURATORS:
            dropped = ("--m", "--insecure-test-pad-key") if "otp" in self.flags else ("--m",)  # otp: OS pads
            for flag in dropped:
                at = out.index(flag)
                del out[at : at + 2]
            out += ["--design", str(self.design_file), *self.flags]
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    return make_world(tmp_path_factory.mktemp("design-world"))


@pytest.fixture(scope="module")
def the_design(world: dict[str, object]) -> Design:
    base = Path(str(world["base"]))
    return design(8000, [load_schema(base / "data" / f"{c}.json").schema for c in CURATORS], EPSILON, QUESTIONS)


def _deployment(
    world: dict[str, object], certs: Path, tmp: Path, release_id: str, d: Design, flags: tuple[str, ...] = ()
) -> DesignedDeployment:
    root = new_deployment(world, certs, release_id, tmp).root  # data, key and budgets
    write_design(d, root / "design.json")
    return DesignedDeployment(root, certs, release_id, timeout=BUDGET_S, design_file=root / "design.json",
                              flags=flags)  # fmt: skip


def _wait(dep: Deployment, role: str, event: str) -> None:
    end = time.monotonic() + BUDGET_S
    while not dep.seen(role, event) and time.monotonic() < end and dep.procs["researcher"].poll() is None:
        time.sleep(0.02)
    assert dep.seen(role, event), dep.log(role).read_text(errors="replace")[-2000:]


def _finish(dep: Deployment) -> dict[str, int | None]:
    end = time.monotonic() + BUDGET_S
    while time.monotonic() < end and any(dep.procs[r].poll() is None for r in ROLES[1:]):
        time.sleep(0.05)
    return {r: dep.procs[r].poll() for r in ROLES[1:]}


def _check(
    world: dict[str, object], dep: Deployment, d: Design, codes: dict[str, int | None], exact: bool = True
) -> None:
    """Every party exited 0; the researcher's tables are the in-memory protocol's: their layouts,
    and (``exact``: the same keys) counts and raw estimates exactly; each ledger spent the design's
    epsilon once."""
    tails = {r: dep.log(r).read_text(errors="replace")[-1500:] for r in ROLES}
    assert codes == {"alice": 0, "bob": 0, "researcher": 0}, (codes, tails)
    tables = world["tables"]
    assert isinstance(tables, list) and all(isinstance(t, CuratorTable) for t in tables)
    akey = world["akey"]
    assert isinstance(akey, AlignmentKey)
    planned = d.planned_tables()
    ref = run_tables_release(
        tables, [a for a, _, _ in planned], [m for _, m, _ in planned], [g for _, _, g in planned], d.epsilon,
        d.digest(), d.n, "chacha20", dep.release_id, seed=SEED, alignment_key=akey, pram_key=PRAM,
        pad_keys=[PADS[c] for c in CURATORS],
    )  # fmt: skip
    report = TablesReport.from_dict(json.loads((dep.root / "results" / f"{dep.release_id}.json").read_text()))
    assert report.design_digest == d.digest() and len(report.tables) == len(ref.estimates) == len(planned)
    for got, want, plan in zip(report.tables, ref.estimates, ref.plans, strict=True):
        assert got is not None and want is not None
        assert got.plan == plan and int(np.sum(got.observed)) == plan.m  # the table's m_t rows, counted once
        if exact:
            assert np.array_equal(got.observed, want.counts) and np.array_equal(got.estimate, want.raw)
    for c in CURATORS:
        ledger = Keystore(dep.root / f"ks-{c}").ledger.read()
        assert ledger.spent(f"{c}.csv") == EPSILON == d.epsilon, c
        assert ledger.releases()[dep.release_id].state.value == "commit", c


def test_a_designed_release_resumes_after_kills(
    world: dict[str, object], the_design: Design, certs: Path, tmp_path: Path
) -> None:
    dep = _deployment(world, certs, tmp_path, "r-design-kills", the_design)
    try:
        for role in ROLES:
            dep.start(role)
        _wait(dep, "bob", '"registered"')  # prepared: its record (pad segments, sample, design) is on disk
        dep.kill("bob")
        dep.start("bob")
        _wait(dep, "alice", '"committed"')
        dep.kill("alice")  # the leader: it resumes its record and hands the stored agreement on
        dep.start("alice")
        _wait(dep, "bob", '"committed"')
        dep.kill("bob")  # once more: the restarted bob serves its key (and the design) from the record
        dep.start("bob")
        codes = _finish(dep)
    finally:
        dep.close()
    assert dep.starts == {"server": 1, "alice": 2, "bob": 3, "researcher": 1}
    assert all('"resumed"' in dep.log(c).read_text() for c in CURATORS)
    _check(world, dep, the_design, codes)


def test_a_designed_release_on_the_cluster_engine_is_the_in_memory_one(
    world: dict[str, object], the_design: Design, certs: Path, tmp_path: Path
) -> None:
    flags = ("--engine", "dask", "--workers", "1", "--shards", "4")
    dep = _deployment(world, certs, tmp_path, "r-design-dask", the_design, flags)
    try:
        for role in ROLES:
            dep.start(role)
        codes = _finish(dep)
    finally:
        dep.close()
    for c in CURATORS:
        log = dep.log(c).read_text(errors="replace")
        assert "engine_started" in log and "sample_ranges" in log, (c, log[-2000:])  # sampled on the cluster
    _check(world, dep, the_design, codes)


def test_a_designed_release_by_psi_index_sampling_and_otp(
    world: dict[str, object], the_design: Design, certs: Path, tmp_path: Path
) -> None:
    """The other variants: PSI alignment (the same common ids, so the same n and tables), the
    leader's OS-drawn index tuple and one-time pads (random: the counts are compared in sum)."""
    flags = ("--alignment", "psi", "--sampling", "indices", "--cipher", "otp")
    dep = _deployment(world, certs, tmp_path, "r-design-psi", the_design, flags)
    try:
        for role in ROLES:
            dep.start(role)
        codes = _finish(dep)
    finally:
        dep.close()
    assert all('"alignment": "psi"' in dep.log(c).read_text() for c in CURATORS)
    _check(world, dep, the_design, codes, exact=False)
