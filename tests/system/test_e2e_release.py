"""A release over real gRPC with mutual TLS between separate processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import child_env

import secure_release.mechanism.protocol.in_memory as protocol
from secure_release.cluster import PARTIES, Cluster, get_estimate, launch_release
from secure_release.curator.table import load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.infra.pki import init_pki
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return child_env(testing=True)


@pytest.fixture()
def setup(tmp_path: Path) -> dict[str, object]:
    write_demo_data(tmp_path / "data", rows=6000, seed=7)
    init_pki(tmp_path / "certs", [*PARTIES, ("researcher", "intruder")])
    akey = AlignmentKey.generate()
    (tmp_path / "align.key").write_text(akey.reveal().hex())
    return {"root": tmp_path, "akey": akey}


def test_release_matches_in_memory_protocol_exactly(setup: dict[str, object]) -> None:
    root = setup["root"]
    assert isinstance(root, Path)
    seed, pram = Seed.generate(), PramKey.generate()
    pad_keys = [PadKey.generate(), PadKey.generate()]
    cluster = Cluster(root, env=_env())
    try:
        addrs = launch_release(
            cluster, root / "data", root / "certs", "r-exact", 0.5, None, "chacha20", root / "align.key",
            alphabet_sizes="6,4",  # the optional cross-check; r-marg runs without it
            alice_extra=["--insecure-test-seed", seed.reveal().hex(), "--insecure-test-pad-key",
                         pad_keys[0].reveal().hex()],
            bob_extra=["--insecure-test-pad-key", pad_keys[1].reveal().hex()],
            server_extra=["--insecure-test-pram-key", pram.reveal().hex()])
        resp = get_estimate(addrs["researcher"], root / "certs", "r-exact", timeout=120)
        analyses = _analyses(addrs["researcher"], root / "certs", "r-exact")
    finally:
        cluster.close()
    tables = [read_table(root / "data" / f"{c}.csv", load_schema(root / "data" / f"{c}.json"))
              for c in ("alice", "bob")]
    ref = protocol.run_release(tables, 0.5, None, "chacha20", "r-exact", seed=seed,
                               alignment_key=setup["akey"], pram_key=pram, pad_keys=pad_keys)  # type: ignore[arg-type]
    assert not resp.marginal
    assert resp.privacy.n == ref.plan.n and resp.privacy.m == ref.plan.m
    assert resp.privacy.gamma == ref.plan.gamma
    got = np.array([c.estimate for c in resp.cells])
    assert np.array_equal(got, ref.estimate.raw)
    assert np.array_equal(np.array([c.observed for c in resp.cells]), ref.estimate.counts)
    assert np.array_equal(np.array([c.projected for c in resp.cells]), ref.estimate.projected)
    assert list(resp.cells[0].labels) == ["no college", "married", "male", "<=50K"]
    # outputs written by the researcher
    out = json.loads((root / "results" / "r-exact.json").read_text())
    assert out["cells"][3]["raw"] == ref.estimate.raw[3] and out["cells"][3]["estimate"] == ref.estimate.projected[3]
    assert (root / "results" / "r-exact.csv").read_text().startswith("education,marital,sex,salary")
    # the analyst's questions, asked of the deployed researcher over mutual TLS
    test = analyses["test"]
    assert test["test"]["a"] == ["education"] and test["test"]["b"] == ["salary"] and test["test"]["given"] == ["sex"]
    assert test["test"]["df"] == 2 * 1 * 2 and 0.0 <= test["test"]["p_value"] <= 1.0
    # with --given the effect is the conditional Cramer's V, whose interval excludes 0 exactly when
    # the conditional test printed beside it rejects at the interval's level (docs/analysis.md)
    effect = test["association"]["effects"]["conditional_cramers_v"]
    assert (effect["ci_low"] > 0) == (test["test"]["p_value"] <= 0.05)
    pairs = {(r["a"], r["b"]) for r in analyses["associations"]["rows"]}
    assert pairs == {(a, b) for a in ("education", "marital") for b in ("sex", "salary")}
    assert analyses["unknown"] == 2 and "the release has" in analyses["unknown_err"]
    # the curators' logs never carry key or seed bytes
    for name in ("alice", "bob"):
        text = (root / f"{name}.log").read_text()
        assert seed.reveal().hex() not in text and pad_keys[0].reveal().hex() not in text


def _analyses(address: str, certs: Path, release_id: str) -> dict[str, Any]:
    """``analyst test`` and ``analyst associations`` (JSON) and a test of an unknown attribute,
    each a child process with the analyst's certificate."""
    conn = ["--researcher", address, "--certs", str(certs / "analyst"), "--name", "analyst", "--timeout", "60"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "secure_release", "analyst", *args, *conn],
                              capture_output=True, text=True, timeout=120, env=_env())  # fmt: skip

    test = cli("test", release_id, "--between", "education", "--and", "salary", "--given", "sex", "--json")
    assert test.returncode == 0, test.stderr[-2000:]
    assoc = cli("associations", release_id, "--json")
    assert assoc.returncode == 0, assoc.stderr[-2000:]
    unknown = cli("test", release_id, "--between", "educ", "--and", "salary")
    return {"test": json.loads(test.stdout), "associations": json.loads(assoc.stdout),
            "unknown": unknown.returncode, "unknown_err": unknown.stderr}  # fmt: skip


def test_researcher_without_grant_gets_marginal(setup: dict[str, object]) -> None:
    root = setup["root"]
    assert isinstance(root, Path)
    cluster = Cluster(root, env=_env())
    try:
        addrs = launch_release(cluster, root / "data", root / "certs", "r-marg", 1.0, 300, "otp",
                               root / "align.key", grants={"alice": ["researcher"], "bob": ["intruder"]})
        resp = get_estimate(addrs["researcher"], root / "certs", "r-marg", timeout=120)
    finally:
        cluster.close()
    assert resp.marginal
    assert list(resp.curators) == ["alice"]
    assert list(resp.attributes) == ["education", "marital"]
    assert len(resp.cells) == 6
    assert resp.privacy.m == 300
    assert abs(sum(c.estimate for c in resp.cells) - 1.0) < 1e-9
    out = json.loads((root / "results" / "r-marg.json").read_text())
    assert "MARGINAL ONLY" in out["note"] and "bob" in out["refused"]
    assert '"key_refused"' in (root / "bob.log").read_text()


def test_demo_json_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "secure_release", "demo", "--json", "--rows", "5000",
                           "--epsilon", "1.0"], capture_output=True, text=True, timeout=120, env=_env(),
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    for key in ("epsilon", "gamma", "n", "m", "K", "l2_error", "predicted_rmse", "cells"):
        assert key in data
    assert data["K"] == 24 and len(data["cells"]) == 24 and data["epsilon"] == 1.0
    assert data["n"] == 5000
    # the paper's question, answered by the demo (issue 42)
    assert data["association"]["test"]["a"] == ["education"] and data["association"]["test"]["b"] == ["salary"]
    assert set(data["association"]["effects"]["effects"]) >= {"cramers_v", "mutual_information"}
