"""docker-compose.yml run for real, without a docker engine: every service a local process.

The compose file is parsed with PyYAML and each service's ``command`` (with its ``environment``)
runs as a local process, in ``depends_on`` order (pki -> server -> alice -> bob -> researcher ->
result), each gated on its dependency's condition: ``service_completed_successfully`` waits for
the one-shot to exit 0, ``service_healthy`` runs the dependency's own healthcheck ``test``
command locally until it exits 0.

The rewriting done here (and only here; docker-compose.yml is left as written), applied in one
regex pass to every command, environment value and healthcheck argument:

* executables: ``secure-release`` -> ``<sys.executable> -m secure_release`` (the console script
  is not necessarily on PATH here), ``python`` -> ``sys.executable`` and ``dask scheduler|worker``
  -> the venv's ``dask``;
* addresses: ``server|alice|bob|researcher|0.0.0.0:PORT`` -> ``127.0.0.1:<free local port>``,
  one free port per container port, so ``--listen 0.0.0.0:7000`` and ``server:7000`` agree;
* paths: every volume mount point (``/certs``, ``/data``, ``/store``, ``/results``) ->
  ``tmp_path/volumes/<volume>`` (shared by every service that mounts the volume, like a named
  volume); container-local paths (``/keystore``, ``/tmp``) -> ``tmp_path/local/<service>/...``
  (private to the service, like a container's own filesystem).

PYTHONPATH points at the repository so ``-m server`` etc. import this checkout.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: Container host names, the profiles' longest first so "alice-three:7101" is one address.
HOSTS = (
    "server-three", "alice-three", "bob-three", "researcher-three",
    "server-cluster", "alice-cluster", "bob-cluster", "researcher-cluster", "alice-scheduler",
    "server", "alice", "bob", "carol", "researcher",
)  # fmt: skip
#: The ``dask`` console script (the cluster profile's scheduler and workers).
DASK = str(Path(sys.executable).with_name("dask"))
CONTAINER_LOCAL = ("/keystore", "/tmp")
DEADLINE_S = 55.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _order(services: dict[str, Any]) -> list[str]:
    """Topological order of depends_on; ties broken by the order in the file."""
    done: list[str] = []
    pending = list(services)
    while pending:
        for name in pending:
            if all(d in done for d in services[name].get("depends_on", {})):
                done.append(name)
                pending.remove(name)
                break
        else:
            raise AssertionError(f"dependency cycle among {pending}")
    return done


class Rewriter:
    """Container names, ports and paths -> local ones (see the module docstring)."""

    def __init__(self, compose: dict[str, Any], tmp: Path) -> None:
        """Ports, mounts and the interpreter for every service of ``compose``."""
        ports: set[str] = set()
        text = yaml.safe_dump(compose["services"])
        for m in re.finditer(r"\b(?:" + "|".join(HOSTS) + r"|0\.0\.0\.0):(\d+)\b", text):
            ports.add(m.group(1))
        self.ports = {p: _free_port() for p in sorted(ports)}
        self.mounts: dict[str, dict[str, Path]] = {}
        for name, svc in compose["services"].items():
            mounts: dict[str, Path] = {}
            for vol in svc.get("volumes", []):
                source, target = vol.split(":")[:2]
                mounts[target] = tmp / "volumes" / source
            for local in CONTAINER_LOCAL:
                mounts.setdefault(local, tmp / "local" / name / local.strip("/"))
            for p in mounts.values():
                p.mkdir(parents=True, exist_ok=True)
            self.mounts[name] = mounts
        self.exe = shlex.quote(sys.executable)

    def __call__(self, service: str, text: str) -> str:
        mounts = self.mounts[service]
        paths = "|".join(re.escape(t) for t in sorted(mounts, key=len, reverse=True))
        pattern = re.compile(
            r"(?P<exe>(?<![\w./-])(?:secure-release(?:-server|-curator|-researcher)?|python"
            r"|dask(?= (?:scheduler|worker)\b))(?![\w.-]))"
            r"|(?P<addr>\b(?:" + "|".join(HOSTS) + r"|0\.0\.0\.0):(?P<port>\d+)\b)"
            r"|(?P<path>(?<![\w./-])(?:" + paths + r")(?![\w.-]))"
        )

        def sub(m: re.Match[str]) -> str:
            if m.group("exe"):
                exe = m.group("exe")
                if exe == "python":
                    return self.exe
                if exe == "dask":
                    return shlex.quote(DASK)
                return self.exe + " -m " + exe.replace("secure-release", "secure_release").replace("-", ".")
            if m.group("addr"):
                return f"127.0.0.1:{self.ports[m.group('port')]}"
            return str(mounts[m.group("path")])

        return pattern.sub(sub, text)


def _env(svc: dict[str, Any], rewrite: Any, name: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    raw = svc.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, os.environ.get(item, "")) for item in raw)
    env.update({k: rewrite(name, _interpolate(str(v))) for k, v in raw.items()})  # compose interpolates these too
    return env


def _interpolate(text: str) -> str:
    """Compose's interpolation: ``${VAR:-default}`` from the environment, ``$$`` a literal $."""
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1)) or m.group(2), text)
    return text.replace("$$", "$")


def _argv(command: str | list[str], rewrite: Any, name: str) -> list[str]:
    if isinstance(command, list):
        return [rewrite(name, _interpolate(a)) for a in command]
    return shlex.split(rewrite(name, _interpolate(command)))


def _output(logs: Path, name: str) -> str:
    """The last lines a service printed, standard output and then standard error (a service
    refusing its flags or its port says so on standard error only)."""
    return f"{_tail(logs / name)}\n--- stderr ---\n{_tail(logs / f'{name}.err')}"


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def profile_services(compose: dict[str, Any], profile: str | None) -> dict[str, Any]:
    """The services ``docker compose [--profile P] up <its one-shot>`` would start: those without
    ``profiles`` (profile None) or those in profile P."""
    services: dict[str, Any] = compose["services"]
    if profile is None:
        return {k: v for k, v in services.items() if not v.get("profiles")}
    return {k: v for k, v in services.items() if profile in v.get("profiles", [])}


def test_compose_services_run_locally(tmp_path: Path) -> None:
    run_profile(tmp_path, None, "result", expect_release="r1", cells=24)


def run_profile(
    tmp_path: Path, profile: str | None, final: str, expect_release: str, cells: int, deadline: float = DEADLINE_S
) -> tuple[dict[str, Any], Rewriter, dict[str, subprocess.Popen[bytes]], Path]:
    """:func:`run_profile_once`, again in a fresh directory with fresh ports if a service lost
    its port to another program between the pick and its bind (the ports are picked free, then
    released for the services to bind: a test running beside this one may take one meanwhile)."""
    try:
        return run_profile_once(tmp_path / "run-1", profile, final, expect_release, cells, deadline)
    except AssertionError as exc:
        if "in use" not in str(exc):
            raise
        return run_profile_once(tmp_path / "run-2", profile, final, expect_release, cells, deadline)


def run_profile_once(
    tmp_path: Path, profile: str | None, final: str, expect_release: str, cells: int, deadline: float = DEADLINE_S
) -> tuple[dict[str, Any], Rewriter, dict[str, subprocess.Popen[bytes]], Path]:
    """Run one profile's services as local processes until ``final`` (the one-shot fetch) prints
    its JSON, within ``deadline`` seconds; check it is a joint estimate of ``cells`` cells; return
    it with the rewriter, the processes (already stopped) and the log directory."""
    t0 = time.monotonic()
    tmp_path.mkdir(parents=True, exist_ok=True)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = profile_services(compose, profile)
    order = _order(services)
    expected = ["pki", "server", "alice", "bob", "researcher", "result"]
    if profile == "three":
        expected = [f"{s}-three" for s in ("pki", "server", "alice", "bob")]
        expected += ["carol", "researcher-three", "result-three"]
    elif profile == "cluster":
        expected = ["pki-cluster", "server-cluster", "alice-scheduler", "alice-worker-1", "alice-worker-2"]
        expected += [f"{s}-cluster" for s in ("alice", "bob", "researcher", "result")]
    assert order == expected
    rewrite = Rewriter(compose, tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    completed: set[str] = set()
    healthy: set[str] = set()

    def deadline_left() -> float:
        left = deadline - (time.monotonic() - t0)
        assert left > 0, f"compose run exceeded {deadline}s"
        return left

    def wait_healthy(name: str) -> None:
        hc = services[name]["healthcheck"]
        test = hc["test"]
        assert test[0] in ("CMD", "CMD-SHELL"), test
        argv = _argv(test[1:] if test[0] == "CMD" else ["sh", "-c", test[1]], rewrite, name)
        retries = int(hc.get("retries", 3))
        interval = float(str(hc.get("interval", "1s")).rstrip("s"))
        for _ in range(retries):
            deadline_left()
            if procs[name].poll() is not None:
                raise AssertionError(f"{name} exited {procs[name].returncode}:\n{_output(logs, name)}")
            check = subprocess.run(
                argv, env=_env(services[name], rewrite, name), capture_output=True, timeout=15, cwd=tmp_path
            )
            if check.returncode == 0:
                healthy.add(name)
                return
            time.sleep(min(interval, 0.5))
        raise AssertionError(f"{name} never became healthy:\n{_output(logs, name)}")

    def wait_completed(name: str) -> None:
        try:
            rc = procs[name].wait(timeout=deadline_left())
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not finish:\n{_output(logs, name)}") from None
        assert rc == 0, f"{name} exited {rc}:\n{_output(logs, name)}"
        completed.add(name)

    try:
        for name in order:
            svc = services[name]
            for dep, cond in svc.get("depends_on", {}).items():
                condition = cond.get("condition", "service_started") if isinstance(cond, dict) else "service_started"
                if condition == "service_completed_successfully" and dep not in completed:
                    wait_completed(dep)
                elif condition == "service_healthy" and dep not in healthy:
                    wait_healthy(dep)
            argv = _argv(svc["command"], rewrite, name)
            with (logs / name).open("wb") as out, (logs / f"{name}.err").open("wb") as err:
                procs[name] = subprocess.Popen(
                    argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=_env(svc, rewrite, name), cwd=tmp_path
                )
        wait_completed(final)
        stdout = (logs / final).read_text()
        result = json.loads(stdout)
        assert result["release_id"] == expect_release
        assert not result["marginal"]
        assert "epsilon" in stdout and "cells" in stdout
        assert len(result["cells"]) == cells
        assert abs(sum(c["estimate"] for c in result["cells"]) - 1.0) < 1e-6
        eps = result.get("epsilon", result.get("privacy", {}).get("epsilon"))
        assert eps is not None and abs(float(eps) - 0.5) < 1e-9
        # the one-shot also wrote its files under the (rewritten) container-local /tmp/result
        written = rewrite.mounts[final]["/tmp"] / "result" / f"{expect_release}.json"
        assert json.loads(written.read_text())["cells"] == result["cells"]
        # the long-running researcher (notified by the server) wrote to the shared results volume
        researcher = order[-2]
        results_vol = rewrite.mounts[researcher]["/results"] / f"{expect_release}.json"
        for _ in range(50):
            if results_vol.exists():
                break
            time.sleep(0.1)
        assert results_vol.exists(), _tail(logs / f"{researcher}.err")
        for name in order:
            if "restart" not in services[name]:
                assert procs[name].poll() is None, f"{name} died:\n{_tail(logs / f'{name}.err')}"
        assert time.monotonic() - t0 < deadline + 5
        return result, rewrite, procs, logs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 5
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
