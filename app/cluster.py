"""A whole deployment on this machine: every party a child process on 127.0.0.1.

The helpers ``secure-release demo``, the notebook API, the tests and the benchmarks share:
:class:`Cluster` (child processes and their logs), :func:`launch_release` (server, curators and
researcher of one release on fresh ports), :func:`set_budgets`, :func:`get_estimate`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARTIES = (
    ("server", "server"),
    ("curator", "alice"),
    ("curator", "bob"),
    ("researcher", "researcher"),
    ("analyst", "analyst"),
)


def progress(msg: str) -> None:
    """One progress line on stderr (the demo's own voice, not a log record)."""
    sys.stderr.write(f"[demo] {msg}\n")
    sys.stderr.flush()


@dataclass
class Cluster:
    """Child processes of one local deployment; :meth:`close` terminates them all."""

    root: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def start(self, name: str, args: Sequence[str], port_file: bool = True, timeout: float = 60.0) -> int | None:
        """Start ``name`` and (``port_file``) wait until it reports the port it listens on."""
        self.spawn(name, args, port_file)
        return self.wait_port(name, timeout) if port_file else None

    def spawn(self, name: str, args: Sequence[str], port_file: bool = True) -> None:
        """Start ``name`` without waiting (its log is ``<root>/<name>.log``)."""
        pf = self.root / f"{name}.port"
        if pf.exists():
            pf.unlink()
        cmd = [sys.executable, *args] + (["--port-file", str(pf)] if port_file else [])
        log = self.root / f"{name}.log"
        self.logs[name] = log
        with log.open("wb") as fh:
            self.procs[name] = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env, stdin=subprocess.DEVNULL
            )

    def wait_port(self, name: str, timeout: float = 60.0) -> int:
        """The port ``name`` reported; RuntimeError (with its log's tail) if it exits first or
        reports none within ``timeout`` seconds (a process only binds and reports: it reads
        its table after listening, so this wait does not grow with the data)."""
        pf = self.root / f"{name}.port"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pf.exists() and pf.read_text().strip():
                return int(pf.read_text())
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited with {self.procs[name].returncode}:\n{self.tail(name)}")
            time.sleep(0.02)
        raise RuntimeError(f"{name} did not report its port within {timeout}s:\n{self.tail(name)}")

    def stop(self, names: Sequence[str]) -> None:
        """Terminate ``names`` (and forget them)."""
        for name in names:
            proc = self.procs.pop(name, None)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

    def tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join(self.logs[name].read_text(errors="replace").splitlines()[-lines:])
        except (KeyError, OSError):
            return ""

    def tails(self, lines: int = 30) -> str:
        """The last ``lines`` of every process's log, each under a ``--- name ---`` line (what a
        failed run prints to say where it failed)."""
        return "".join(f"--- {name} ---\n{self.tail(name, lines)}\n" for name in self.procs)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def set_budget(cluster: Cluster, keystore: Path, table: Path, epsilon: float) -> None:
    """The curator's budget for its demo table (a curator runs no release without one)."""
    set_budgets(cluster, {keystore: table}, epsilon)


def set_budgets(cluster: Cluster, tables: Mapping[Path, Path], epsilon: float, certs: Path | None = None) -> None:
    """Every curator's budget for its demo table (keystore -> table), set concurrently (each
    hashes its whole table file); with ``certs`` (a PKI root: ``certs/NAME`` per party) the ledger
    head is signed with the curator's key (``keystore-NAME``: NAME)."""
    def budget_set(keystore: Path, table: Path) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "secure_release.curator", "budget", "set", "--keystore", str(keystore),
               "--data", str(table), "--epsilon", repr(epsilon)]  # fmt: skip
        if certs is not None:
            name = keystore.name.removeprefix("keystore-")
            cmd += ["--certs", str(certs / name), "--name", name]
        return subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = {table: budget_set(keystore, table) for keystore, table in tables.items()}
    for table, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"setting the budget of {table.name} failed: {err.strip()[-500:]}")


def free_port() -> int:
    """A port the OS just gave out on 127.0.0.1 and took back (a later bind may still lose a
    race for it: :func:`launch_release` then starts again with other ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


PORT_TRIES = 3


def launch_release(
    cluster: Cluster,
    data: Path,
    certs: Path,
    release_id: str,
    epsilon: float,
    m: int | None,
    cipher: str,
    align_key_file: Path,
    alphabet_sizes: str | None = None,
    grants: dict[str, list[str]] | None = None,
    alice_extra: Sequence[str] = (),
    bob_extra: Sequence[str] = (),
    server_extra: Sequence[str] = (),
    researcher: str = "researcher",
    curators: Sequence[str] = ("alice", "bob"),
    curator_extra: Mapping[str, Sequence[str]] | None = None,
    sampling: str = "seed",
    alignment: str = "hash",
    budgets: bool = True,
    researcher_extra: Sequence[str] = (),
) -> dict[str, str]:
    """Start the server, the curators (the first one leads; each reads ``data/<name>.csv`` and
    ``.json``) and the researcher; return their addresses. ``alice_extra``/``bob_extra`` are
    shorthands for ``curator_extra``; ``sampling`` (seed|indices) and ``alignment`` (hash|psi)
    go to every curator; ``researcher_extra`` to the researcher. ``certs`` is a PKI root as
    ``init_pki`` writes it: each process gets only ``certs/NAME``."""
    root = cluster.root
    grants = grants or {c: [researcher] for c in curators}
    extras = {"alice": list(alice_extra), "bob": list(bob_extra)}
    extras.update({k: list(v) for k, v in (curator_extra or {}).items()})
    if budgets:  # (a benchmark sets them beforehand: a budget is set once per data set, not per release)
        set_budgets(cluster, {root / f"keystore-{c}": data / f"{c}.csv" for c in curators}, max(1.0, epsilon), certs)
    names = ["server", *curators, "researcher"]
    for attempt in range(1, PORT_TRIES + 1):
        # every address is fixed up front, so all processes start at once and the curators read
        # their tables concurrently; a process that loses its port to another program fails to bind
        addrs = {name: f"127.0.0.1:{free_port()}" for name in names}
        commands = _commands(
            addrs, data, certs, root, release_id, epsilon, m, cipher, align_key_file,
            alphabet_sizes, grants, extras, server_extra, researcher, curators, sampling, alignment, researcher_extra,
        )  # fmt: skip
        for name in names:
            cluster.spawn(name, commands[name])
        try:
            for name in names:
                cluster.wait_port(name)
                progress(f"{name} listening on {addrs[name]}")
            return addrs
        except RuntimeError as exc:
            lost_port = "in use" in str(exc)
            cluster.stop(names)
            if not lost_port or attempt == PORT_TRIES:
                raise
            progress(f"a port was taken meanwhile; starting again ({attempt}/{PORT_TRIES})")
    raise AssertionError("unreachable")  # pragma: no cover


def _commands(
    addrs: Mapping[str, str], data: Path, certs: Path, root: Path, release_id: str, epsilon: float, m: int | None,
    cipher: str, align_key_file: Path, alphabet_sizes: str | None, grants: Mapping[str, list[str]],
    extras: Mapping[str, list[str]], server_extra: Sequence[str], researcher: str, curators: Sequence[str],
    sampling: str, alignment: str, researcher_extra: Sequence[str] = (),
) -> dict[str, list[str]]:  # fmt: skip
    """The command line of every process of one release (each listens on ``addrs[name]``; each
    gets only its own certificate directory ``certs/NAME``, as ``init_pki`` writes them)."""
    commands = {
        "server": ["-m", "secure_release.server", "--listen", addrs["server"], "--store", str(root / "store"),
                   "--certs", str(certs / "server"), "--name", "server", *server_extra],
    }  # fmt: skip
    common = [
        "--release-id", release_id, "--epsilon", repr(epsilon), "--cipher", cipher, "--server", addrs["server"],
        "--curators", ",".join(curators), "--alignment-key-file", str(align_key_file),
        "--researcher", researcher, "--sampling", sampling, "--alignment", alignment,
    ] + (["--m", str(m)] if m is not None else [])  # fmt: skip
    for i, name in enumerate(curators):
        role = (
            ["--leader", *(["--alphabet-sizes", alphabet_sizes] if alphabet_sizes else [])]
            if i == 0
            else ["--leader-address", addrs[curators[0]]]
        )
        g = [x for r in grants.get(name, []) for x in ("--grant", r)]
        commands[name] = [
            "-m", "secure_release.curator", "run", "--data", str(data / f"{name}.csv"),
            "--schema", str(data / f"{name}.json"), "--name", name, "--keystore", str(root / f"keystore-{name}"),
            "--certs", str(certs / name),
            "--listen", addrs[name], *common, *g, *role, *extras.get(name, []),
        ]  # fmt: skip
    commands["researcher"] = [
        "-m", "secure_release.researcher", "serve", "--listen", addrs["researcher"], "--certs", str(certs / researcher),
        "--name", researcher, "--server", addrs["server"],
        *(x for c in curators for x in ("--curator", f"{c}={addrs[c]}")),
        "--out", str(root / "results"), "--analyst", "analyst", "--allow-partial", *researcher_extra,
    ]  # fmt: skip
    return commands


def get_estimate(address: str, certs: Path, release_id: str, name: str = "analyst", timeout: float = 240.0) -> Any:
    """The analyst ``name``'s estimate of a release (with ``certs/NAME``, an ``init_pki`` root)."""
    from secure_release.infra.tls import secure_channel
    from secure_release.protos.securerelease.v1 import securerelease_pb2 as pb
    from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc

    with secure_channel(address, certs / name, name, peer_role="researcher") as ch:
        return pb_grpc.ResearcherStub(ch).GetEstimate(
            pb.EstimateRequest(release_id=release_id, wait=True), timeout=timeout
        )


def wait_exit(cluster: Cluster, names: Sequence[str], timeout: float = 600.0) -> None:
    for name in names:
        try:
            code = cluster.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{name} did not finish within {timeout:g} s:\n{cluster.tail(name)}") from None
        if code != 0:
            raise RuntimeError(f"{name} exited with {code}:\n{cluster.tail(name)}")


def parties(curators: Sequence[str]) -> list[tuple[str, str]]:
    """The certificates a demo with these curators needs."""
    named = [("curator", c) for c in curators]
    return [("server", "server"), *named, ("researcher", "researcher"), ("analyst", "analyst")]
