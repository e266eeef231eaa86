"""docker-compose.yml's "cluster" profile: alice reads her table on her own Dask scheduler and two
workers (``--engine dask``), over Dask TLS with a CA of her own, on a network only she joins.

The structure is checked from the parsed YAML; then the profile runs as local processes, as
test_compose_local.py runs the default profile (the real ``dask scheduler`` / ``dask worker``
programs on 127.0.0.1, TLS included), and must give the same kind of joint estimate."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from secure_release.curator.cli import build_parser
from secure_release.curator.cluster.engine import EngineError, check_scheduler_address

pytest.importorskip("yaml")
pytest.importorskip("distributed")
from test_compose_local import ROOT, run_profile, yaml

pytestmark = pytest.mark.slow

SCHEDULER = "tls://alice-scheduler:8786"
CLUSTER = ("alice-scheduler", "alice-worker-1", "alice-worker-2")
TLS = ["--tls-ca-file", "/certs/ca.pem", "--tls-cert", "/certs/alice-dask.pem", "--tls-key", "/certs/alice-dask.key"]


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _networks(svc: dict[str, Any]) -> set[str]:
    return set(svc.get("networks") or ["default"])


def _sources(svc: dict[str, Any]) -> dict[str, str]:
    """volume -> "target[:ro]"."""
    return {v.split(":", 1)[0]: v.split(":", 1)[1] for v in svc.get("volumes", [])}


def test_alice_cluster_is_on_a_network_of_its_own() -> None:
    compose = _compose()
    services = compose["services"]
    profile = {n for n, s in services.items() if "cluster" in s.get("profiles", [])}
    assert profile == {
        "pki-cluster", "server-cluster", *CLUSTER, "alice-cluster", "bob-cluster", "researcher-cluster",
        "result-cluster",
    }  # fmt: skip
    assert compose["networks"]["alice-cluster"] == {"internal": True}
    for name in CLUSTER:
        assert _networks(services[name]) == {"alice-cluster"}, name
    assert _networks(services["alice-cluster"]) == {"default", "alice-cluster"}
    for name, svc in services.items():
        if name not in (*CLUSTER, "alice-cluster"):
            assert "alice-cluster" not in _networks(svc), name


def test_the_workers_read_alices_data_read_only_and_hold_no_release_key() -> None:
    services = _compose()["services"]
    for name in CLUSTER:
        volumes = _sources(services[name])
        assert volumes.get("certs-alice-dask") == "/certs:ro", name
        if name != "alice-scheduler":
            assert volumes["data-alice-cluster"] == "/data:ro", name
        assert set(volumes) <= {"certs-alice-dask", "data-alice-cluster"}, name  # no release certificate
    alice = _sources(services["alice-cluster"])
    assert alice["certs-alice-cluster"] == "/certs:ro" and alice["certs-alice-dask"] == "/dask-certs:ro"
    assert alice["data-alice-cluster"] == "/data:ro"
    holders = {n for n, s in services.items() if "certs-alice-dask" in _sources(s)}
    assert holders == {"pki-cluster", *CLUSTER, "alice-cluster"}


def test_every_link_of_the_cluster_is_tls_with_alices_own_ca() -> None:
    services = _compose()["services"]
    scheduler = shlex.split(services["alice-scheduler"]["command"])
    assert scheduler[:4] == ["dask", "scheduler", "--host", "tls://0.0.0.0:8786"]
    for name in CLUSTER:
        argv = shlex.split(services[name]["command"])
        assert argv[-len(TLS) :] == TLS, name
        if name != "alice-scheduler":
            assert argv[:3] == ["dask", "worker", SCHEDULER]
            assert argv[argv.index("--nthreads") + 1] == "1" and argv[argv.index("--memory-limit") + 1] == "2GiB"
    env = services["alice-cluster"]["environment"]
    assert env["DASK_DISTRIBUTED__COMM__TLS__CA_FILE"] == "/dask-certs/ca.pem"
    assert env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"] == "/dask-certs/alice-dask.pem"
    assert env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"] == "/dask-certs/alice-dask.key"
    # the Dask CA is not the release CA: its own directory, and 'pki init' does not make it
    pki = services["pki-cluster"]["command"]
    assert "pki ca /pki/alice-dask-ca --force" in pki
    assert "--ca /pki/alice-dask-ca --out /pki/alice-dask/alice-dask.pem" in pki
    assert re.search(r"cp /pki/alice-dask/ca.pem /pki/alice-dask/alice-dask.pem /pki/alice-dask/alice-dask.key "
                     r"/certs-alice-dask\b", pki)  # fmt: skip
    # the curator would refuse the plaintext address between containers
    check_scheduler_address(SCHEDULER)
    with pytest.raises(EngineError, match="plaintext"):
        check_scheduler_address(SCHEDULER.replace("tls://", "tcp://"))


def test_the_curator_command_runs_on_the_cluster() -> None:
    services = _compose()["services"]
    argv = shlex.split(services["alice-cluster"]["command"])
    assert argv[:3] == ["python", "-m", "secure_release.curator"]
    args = build_parser().parse_args(argv[3:])
    assert args.engine == "dask" and args.scheduler == SCHEDULER and args.name == "alice" and args.leader
    deps = services["alice-cluster"]["depends_on"]
    assert {"alice-worker-1", "alice-worker-2", "server-cluster"} <= set(deps)
    bob = build_parser().parse_args(shlex.split(services["bob-cluster"]["command"])[3:])
    assert bob.leader_address == "alice-cluster:7101" and bob.engine in (None, "local")


def test_cluster_profile_runs_locally(tmp_path: Path) -> None:
    """The whole profile as local processes: a TLS scheduler and two TLS workers, alice's release
    on them, the joint estimate fetched by the one-shot."""
    # a scheduler and two worker processes start too: a longer deadline than the default profile's
    result, rewrite, _, logs = run_profile(tmp_path, "cluster", "result-cluster", "r1", cells=24, deadline=110)
    assert result["curators"] == ["alice", "bob"]
    alice = (logs / "alice-cluster").read_text() + (logs / "alice-cluster.err").read_text()
    assert "engine_started" in alice and "the curator's cluster at tls://127.0.0.1:" in alice, alice[-2000:]
    scheduler = (logs / "alice-scheduler.err").read_text()
    assert re.search(r"Scheduler at:\s+tls://", scheduler)
    assert len(set(re.findall(r"Register worker.*?name: (alice-worker-\d)", scheduler))) == 2, scheduler[-2000:]
    # the Dask CA is alice's own, not the release CA
    dask_ca = rewrite.mounts["alice-cluster"]["/dask-certs"] / "ca.pem"
    release_ca = rewrite.mounts["alice-cluster"]["/certs"] / "ca.pem"
    assert dask_ca.read_bytes() != release_ca.read_bytes()
