"""docs/own-data.md runs as written (issue 26, item 4): its command block, in order, on tables
this test makes (a numeric column binned from a public range, a text column with empty cells and
a missing token, 90% of the ids shared, rows shuffled). It ends with the analyst's estimate and
both curators exited 0 on their own while the server and the researcher keep serving."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import child_env

from secure_release.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PORTS = {"127.0.0.1:7000": "server", "127.0.0.1:7101": "alice", "127.0.0.1:7102": "bob", "127.0.0.1:7200": "res"}


def walkthrough() -> list[tuple[bool, str]]:
    """(runs in its own terminal, command line) for every command of the page's block."""
    page = (ROOT / "docs" / "own-data.md").read_text(encoding="utf-8")
    block = page.split("## The commands, one per party", 1)[1].split("```", 2)[1]
    out, terminal = [], False
    for line in block.strip().splitlines():
        if line.startswith("#"):
            terminal = line.startswith("# terminal")
            continue
        out.append((terminal, line.strip()))
        terminal = False
    return out


def make_tables(root: Path) -> None:
    rng = np.random.default_rng(2026)
    ids = np.char.add("penguin-", np.arange(360).astype(str))
    alice_ids = rng.permutation(ids[:330])  # ids 0..299 are shared: 300 of each curator's 330
    bob_ids = rng.permutation(np.concatenate([ids[:300], ids[330:]]))
    species = rng.choice(["Adelie", "Chinstrap", "Gentoo"], 330).astype(object)
    species[::17] = ""  # empty cells
    species[5::41] = "NA"  # a missing token
    island = rng.choice(["Biscoe", "Dream", "Torgersen"], 330)
    with (root / "alice.csv").open("w") as fh:
        fh.write("id,species,island\n" + "".join(f"{i},{s},{c}\n" for i, s, c in zip(alice_ids, species, island,
                                                                                        strict=True)))  # fmt: skip
    mass = rng.uniform(2700, 6300, 330).round(1)
    year = rng.choice(["2007", "2008", "2009"], 330)
    with (root / "bob.csv").open("w") as fh:
        fh.write("id,mass_g,year\n" + "".join(f"{i},{m},{y}\n" for i, m, y in zip(bob_ids, mass, year, strict=True)))
    (root / "codebook-alice.json").write_text(json.dumps(
        {"species": ["Adelie", "Chinstrap", "Gentoo"], "island": ["Biscoe", "Dream", "Torgersen"]}))
    (root / "codebook-bob.json").write_text(json.dumps({"year": ["2007", "2008", "2009"]}))


def _env() -> dict[str, str]:
    env = child_env()
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    return env


def test_the_page_runs_as_written(tmp_path: Path) -> None:
    make_tables(tmp_path)
    ports = {address: f"127.0.0.1:{free_port()}" for address in PORTS}
    steps = walkthrough()
    assert len(steps) >= 16 and sum(t for t, _ in steps) == 4
    services: dict[str, subprocess.Popen[bytes]] = {}
    outputs: dict[str, str] = {}
    try:
        for terminal, line in steps:
            for fixed, free in ports.items():
                line = line.replace(fixed, free)
            argv = shlex.split(line)
            argv[0] = str(BIN / argv[0])
            if terminal:
                name = argv[argv.index("--name") + 1]
                log = (tmp_path / f"{name}.log").open("wb")
                services[name] = subprocess.Popen(argv, cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT)
                continue
            proc = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
            outputs[" ".join(argv[1:3])] = proc.stdout + proc.stderr
        codes = {name: services[name].wait(timeout=30) for name in ("alice", "bob")}
        assert codes == {"alice": 0, "bob": 0}, {n: (tmp_path / f"{n}.log").read_text()[-2000:] for n in codes}
        assert services["server"].poll() is None and services["researcher"].poll() is None  # still serving
    finally:
        for proc in services.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
    assert "rows match schema 'bob'" in outputs["schema check"] and "binned at public edges" in outputs["schema check"]
    assert "preprocessing: mass_g binned" in outputs["plan --n"]
    assert "Release r1" in outputs["analyst show"]
    assert "H0: species independent of mass_g" in outputs["analyst test"] and "Cramer's V" in outputs["analyst test"]
    assert "[2500, 3500)" in outputs["analyst marginal"] and "[5500, 6500]" in outputs["analyst marginal"]
    assert (tmp_path / "r1.parquet").stat().st_size > 0 and (tmp_path / "results" / "r1.json").exists()
    assert "[2500, 3500)" in (tmp_path / "r1.html").read_text()
    schema = json.loads((tmp_path / "alice.json").read_text())
    assert schema["attributes"][0] == {"name": "species", "categories": ["Adelie", "Chinstrap", "Gentoo"],
                                       "missing": "missing", "missing_tokens": ["NA"]}  # fmt: skip
    result = json.loads((tmp_path / "results" / "r1.json").read_text())
    assert "truth" not in result
    alice_log = (tmp_path / "alice.log").read_text()
    assert '"event": "released"' in alice_log and '"event": "keys_acknowledged"' in alice_log


@pytest.mark.parametrize("needle", ["budget set --keystore keystore-alice", "--keystore keystore-bob",
                                    "--range mass_g=2500:6500", "--codebook codebook-alice.json"])  # fmt: skip
def test_the_page_names_every_step_a_user_needs(needle: str) -> None:
    assert any(needle in line for _, line in walkthrough())
