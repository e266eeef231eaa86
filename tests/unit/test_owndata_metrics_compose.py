"""The compose file's metrics profile (issue 26, item 10): Prometheus scrapes every service,
whose endpoint stays off unless METRICS_LISTEN is set."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_metrics_profile_scrapes_every_service() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    prom = services["prometheus"]
    assert prom["profiles"] == ["metrics"]
    config_path = prom["volumes"][0].split(":")[0]
    config = yaml.safe_load((ROOT / config_path).read_text())
    targets = config["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["server:9100", "alice:9100", "bob:9100", "researcher:9100"]
    for name in ("server", "alice", "bob", "researcher"):
        assert services[name]["environment"]["SECURE_RELEASE_METRICS_LISTEN"] == "${METRICS_LISTEN:-}"
