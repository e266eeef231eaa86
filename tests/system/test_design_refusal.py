"""A curator started with a different design than the leader's is refused at the agreement:
every curator and the researcher exit 3, and the curators' messages name both designs' digests.
Nothing is spent in either ledger (the leader's reservation is refunded)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_faults_kill import CURATORS, EPSILON, ROLES, M, make_world, new_deployment

from secure_release.curator.records.keystore import Keystore
from secure_release.curator.table import load_schema
from secure_release.infra.designfile import write_design
from secure_release.mechanism.analysis.design import design

pytestmark = pytest.mark.slow
WITHIN_S = 60.0


def test_a_follower_with_another_design_is_refused_at_every_party(certs: Path, tmp_path: Path) -> None:
    world = make_world(tmp_path / "world")
    base = Path(str(world["base"]))
    schemas = [load_schema(base / "data" / f"{c}.json").schema for c in CURATORS]
    mine = design(8000, schemas, EPSILON, ["salary ~ education | sex"])
    other = design(8000, schemas, EPSILON, ["marital ~ sex"])
    write_design(mine, tmp_path / "mine.json")
    write_design(other, tmp_path / "other.json")
    assert mine.digest() != other.digest()
    dep = new_deployment(world, certs, "r-design", tmp_path)
    plain = dep.args

    def args(role: str) -> list[str]:  # the design fixes m: no --m; each curator its design file
        out = plain(role)
        if role in CURATORS:
            at = out.index("--m")
            del out[at : at + 2]
            out += ["--design", str(tmp_path / ("mine.json" if role == "alice" else "other.json"))]
        assert str(M) not in out or role not in CURATORS
        return out

    dep.args = args  # type: ignore[method-assign]
    dep.timeout = 90.0
    try:
        t0 = time.monotonic()
        for role in ROLES:
            dep.start(role)
        end = t0 + WITHIN_S + 60
        while time.monotonic() < end and any(dep.procs[r].poll() is None for r in ROLES[1:]):
            time.sleep(0.05)
        codes = {r: dep.procs[r].poll() for r in ROLES[1:]}
        elapsed = time.monotonic() - t0
    finally:
        dep.close()
    logs = {r: dep.log(r).read_text(errors="replace") for r in ROLES}
    assert codes == {"alice": 3, "bob": 3, "researcher": 3}, (codes, {r: logs[r][-1500:] for r in ROLES[1:]})
    assert elapsed < WITHIN_S, f"the refusal took {elapsed:.1f} s, more than {WITHIN_S} s"
    for role in CURATORS:
        last = logs[role].strip().splitlines()[-1]
        assert mine.digest() in last and other.digest() in last, (role, last)
    for c in CURATORS:  # nothing spent: never reserved (the follower), or reserved and refunded (the leader)
        assert Keystore(dep.root / f"ks-{c}").ledger.read().spent(f"{c}.csv") == 0.0, c
