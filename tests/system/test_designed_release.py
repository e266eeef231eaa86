"""A release designed for questions, through the four services (server, two curators running
one design file, researcher) over mutual TLS: the researcher's tables equal the in-memory
protocol's exactly with the same keys, the analyst's ``questions`` answers the design's
questions, and an analysis of attributes no table holds is refused with the tables listed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import child_env

import secure_release.mechanism.protocol.in_memory as protocol
from secure_release.cluster import PARTIES, Cluster, get_estimate, launch_release
from secure_release.curator.table import load_schema, read_table
from secure_release.demo_data import write_demo_data
from secure_release.infra.designfile import write_design
from secure_release.infra.pki import init_pki
from secure_release.infra.wire import tables_report_from_pb
from secure_release.mechanism.analysis.design import design
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed

pytestmark = pytest.mark.slow
QUESTIONS = ["salary ~ education | sex", "marital ~ sex"]


def test_a_designed_release_through_the_services_is_the_in_memory_one(tmp_path: Path) -> None:
    root = tmp_path
    write_demo_data(root / "data", rows=6000, seed=7)
    init_pki(root / "certs", list(PARTIES))
    akey = AlignmentKey.generate()
    (root / "align.key").write_text(akey.reveal().hex())
    schemas = [load_schema(root / "data" / f"{c}.json").schema for c in ("alice", "bob")]
    d = design(6000, schemas, 1.0, QUESTIONS)
    assert len(d.release.tables) >= 1
    write_design(d, root / "design.json")
    seed, pram = Seed.generate(), PramKey.generate()
    pad_keys = [PadKey.generate(), PadKey.generate()]
    env = child_env(testing=True)
    cluster = Cluster(root, env=env)
    try:
        design_flag = ["--design", str(root / "design.json")]
        addrs = launch_release(
            cluster, root / "data", root / "certs", "r-design", 1.0, None, "chacha20", root / "align.key",
            alice_extra=[*design_flag, "--insecure-test-seed", seed.reveal().hex(), "--insecure-test-pad-key",
                         pad_keys[0].reveal().hex()],
            bob_extra=[*design_flag, "--insecure-test-pad-key", pad_keys[1].reveal().hex()],
            server_extra=["--insecure-test-pram-key", pram.reveal().hex()],
        )  # fmt: skip
        resp = get_estimate(addrs["researcher"], root / "certs", "r-design", timeout=180)
        conn = ["--researcher", addrs["researcher"], "--certs", str(root / "certs" / "analyst"), "--name", "analyst",
                "--timeout", "60"]  # fmt: skip

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "secure_release", "analyst", *args, *conn],
                                  capture_output=True, text=True, timeout=180, env=env)  # fmt: skip

        answers = cli("questions", "r-design", "--json")
        nowhere = cli("test", "r-design", "--between", "education", "--and", "marital")
    finally:
        cluster.close()
    report = tables_report_from_pb(resp)
    assert report is not None and report.design_digest == d.digest()
    tables = [read_table(root / "data" / f"{c}.csv", load_schema(root / "data" / f"{c}.json"))
              for c in ("alice", "bob")]  # fmt: skip
    planned = d.planned_tables()
    ref = protocol.run_tables_release(
        tables, [a for a, _, _ in planned], [m for _, m, _ in planned], [g for _, _, g in planned], 1.0, d.digest(),
        d.n, "chacha20", "r-design", seed=seed, alignment_key=akey, pram_key=pram, pad_keys=pad_keys,
    )  # fmt: skip
    assert len(report.tables) == len(ref.estimates) == len(planned)
    for got, want, plan in zip(report.tables, ref.estimates, ref.plans, strict=True):
        assert got is not None and want is not None
        assert np.array_equal(got.observed, want.counts)
        assert np.array_equal(got.estimate, want.raw)
        assert (got.plan.m, got.plan.gamma) == (plan.m, plan.gamma)
    assert report.epsilon <= 1.0
    # the analyst's answers to the design's questions, from the deployed researcher
    assert answers.returncode == 0, answers.stderr[-2000:]
    rows = json.loads(answers.stdout)
    text = json.dumps(rows)
    for q in QUESTIONS:
        assert q in text
    # no table holds education and marital together (they are in different tables, or not released)
    assert nowhere.returncode == 2, nowhere.stderr[-2000:]
    assert "table" in nowhere.stderr
    # the researcher's file is the tables' result
    saved = json.loads((root / "results" / "r-design.json").read_text())
    assert saved["format"] == "secure-release/result/2" and saved["design_digest"] == d.digest()
