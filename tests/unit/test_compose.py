"""docker-compose.yml: structure (no docker engine here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_dependencies() -> None:
    c = _compose()
    services = c["services"]
    assert {"pki", "server", "alice", "bob", "researcher", "result"} <= set(services)
    for name, svc in services.items():
        if name == "prometheus":  # the metrics profile's scraper: a stock image and its config file
            continue
        assert svc.get("build") == "." and svc.get("image") == "secure-release:latest", name
        for dep in svc.get("depends_on", {}):
            assert dep in services, (name, dep)
        for vol in svc.get("volumes", []):
            assert vol.split(":")[0] in c["volumes"], (name, vol)
    for name in ("server", "alice", "bob", "researcher"):
        hc = services[name]["healthcheck"]["test"]
        assert hc[:4] == ["CMD", "python", "-m", "secure_release.infra.health"]
    assert services["server"]["depends_on"]["pki"]["condition"] == "service_completed_successfully"
    assert "store:/store" in services["server"]["volumes"]


def test_commands_parse_with_the_real_clis() -> None:
    from secure_release.curator.cli import build_parser as curator_parser
    from secure_release.researcher.cli import build_parser as researcher_parser

    services = _compose()["services"]
    for name in ("alice", "bob"):
        argv = shlex.split(services[name]["command"])
        assert argv[:3] == ["python", "-m", "secure_release.curator"]
        args = curator_parser().parse_args(argv[3:])
        assert args.name == name and args.grant == ["researcher"]
    for name in ("researcher", "result"):
        argv = shlex.split(services[name]["command"])
        args = researcher_parser().parse_args(argv[3:])
        assert dict(x.split("=") for x in args.curator) == {"alice": "alice:7101", "bob": "bob:7102"}


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("FROM python:3.11-slim") and "pip install" in text


def test_each_container_mounts_only_its_own_secrets() -> None:
    """Own key + certificate + CA certificate only; the CA key and the other keys stay in the
    one-shot's "pki" volume; a curator mounts only its own table and keystore."""
    services = _compose()["services"]
    for name, svc in services.items():
        sources = {v.split(":")[0] for v in svc.get("volumes", [])}
        suffix = next((s for s in ("-three", "-cluster") if name.endswith(s)), "")
        base = name.removesuffix(suffix)
        if base == "pki":
            assert f"pki{suffix}" in sources
            continue
        if base == "prometheus":  # the metrics scraper holds no secret at all
            assert sources == {"./metrics/prometheus.yml"}, sources
            continue
        if name in ("alice-scheduler", "alice-worker-1", "alice-worker-2"):  # alice's Dask cluster: its TLS only
            assert sources <= {"certs-alice-dask", "data-alice-cluster"}, name
            assert all(v.endswith(":ro") for v in svc["volumes"]), name
            continue
        if name == "alice-cluster":  # the curator also holds the Dask cluster's client certificate
            assert "certs-alice-dask:/dask-certs:ro" in svc["volumes"]
            sources.discard("certs-alice-dask")
        assert not {s for s in sources if s.startswith("pki")}, name
        party = "researcher" if base == "result" else base
        assert {s for s in sources if s.startswith("certs-")} == {f"certs-{party}{suffix}"}, name
        assert all(v.endswith(":ro") for v in svc["volumes"] if v.startswith("certs-")), name
        own = {f"data-{party}{suffix}", f"keystore-{party}{suffix}"}
        assert {s for s in sources if s.startswith(("data-", "keystore-"))} <= own, name
    servers = ("server", "server-three", "server-cluster")
    stores = {v.split(":")[0] for n, s in services.items() if n not in servers for v in s.get("volumes", [])}
    assert not {s for s in stores if s.startswith("store")}


def test_three_curator_profile_leaves_the_default_services_alone() -> None:
    services = _compose()["services"]
    default = {n for n, s in services.items() if not s.get("profiles")}
    assert default == {"pki", "server", "alice", "bob", "researcher", "result"}
    three = {n for n, s in services.items() if "three" in s.get("profiles", [])}
    assert three == {
        "pki-three", "server-three", "alice-three", "bob-three", "carol", "researcher-three", "result-three"
    }  # fmt: skip
    for name in ("alice-three", "bob-three", "carol"):
        assert "--curators alice,bob,carol" in services[name]["command"]


def test_dockerignore_keeps_secrets_out_of_the_build_context() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for pattern in ("**/*.pem", "**/*.key", "**/keystore*", "**/store", "**/results", "**/*.sqlite3*", "**/data"):
        assert pattern in ignored


def test_image_pins_its_dependencies() -> None:
    assert "-c constraints/docker.txt" in (ROOT / "Dockerfile").read_text()
    pins = dict(
        line.split("==") for line in (ROOT / "constraints" / "docker.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )  # fmt: skip
    for name in ("cryptography", "grpcio", "protobuf", "numpy", "rich", "matplotlib", "pyarrow"):
        assert name in pins, name


def test_the_setup_copies_each_party_only_its_own_directory() -> None:
    """'pki init' writes /pki/<party>/ and /pki/ca/; each certs-<party> volume gets the three
    files of /pki/<party>/ and nothing from /pki/ca/ or another party's directory."""
    services = _compose()["services"]
    for name in ("pki", "pki-three", "pki-cluster"):
        command = services[name]["command"]
        copies = re.findall(r"cp ((?:/pki/\S+ )+)/certs-([\w-]+)", command)
        assert copies, name
        for sources, party in copies:
            assert sources.split() == [f"/pki/{party}/ca.pem", f"/pki/{party}/{party}.pem", f"/pki/{party}/{party}.key"]
        assert "/pki/ca/" not in command
