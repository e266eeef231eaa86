"""The server an embedded cluster forks its workers from (``curator/cluster/forkserver.py``): forked
from the curator process before it starts anything, it holds no descriptor of the curator's,
serves multiprocessing as the usual server would, and ends with the curator. Each check runs in
a new interpreter (the server belongs to the process that starts it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from secure_release.curator.cluster.forkserver import start_method

pytestmark = pytest.mark.skipif(start_method() != "forkserver", reason="needs multiprocessing's forkserver")

PROBE = textwrap.dedent(
    """
    import json, multiprocessing, os, sys, threading, time
    from multiprocessing import forkserver
    from secure_release.curator.cluster.forkserver import start_forkserver

    def child_pid(queue):
        queue.put(os.getpid())

    if __name__ == "__main__":
        held = os.open(__file__, os.O_RDONLY)  # a descriptor of the curator's (a log, a socket)
        if sys.argv[1] == "busy":  # a thread already running: the server is a new interpreter
            threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
        start_forkserver(in_process=True)
        server = forkserver._forkserver._forkserver_pid
        context = multiprocessing.get_context("forkserver")
        queue = context.Queue()
        process = context.Process(target=child_pid, args=(queue,))
        process.start()
        worker = queue.get(timeout=30)
        process.join(30)
        fds = sorted(int(fd) for fd in os.listdir(f"/proc/{server}/fd"))
        links = [os.readlink(f"/proc/{server}/fd/{fd}") for fd in fds]
        with open(f"/proc/{server}/cmdline", "rb") as f:
            cmdline = f.read().decode().replace("\\0", " ")
        with open(f"/proc/{server}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
        print(json.dumps({
            "server": server, "worker": worker, "exit": process.exitcode, "fds": fds, "links": links,
            "held": os.path.realpath(__file__), "cmdline": cmdline, "parent": parent, "probe": os.getpid(),
        }))
        sys.stdout.flush()
    """
)


def _probe(tmp_path: Path, mode: str) -> dict[str, object]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # exited, not yet reaped by its (gone) parent's reaper
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_curator_with_no_thread_forks_the_server_itself_and_keeps_none_of_its_descriptors(tmp_path: Path) -> None:
    found = _probe(tmp_path, "quiet")
    assert found["exit"] == 0 and found["worker"] not in (found["server"], None)
    assert "probe.py" in str(found["cmdline"])  # a fork of the curator, not a new interpreter
    assert found["parent"] == found["probe"]  # forked by the curator itself
    fds, links = list(found["fds"]), list(found["links"])  # type: ignore[call-overload]
    assert found["held"] not in links  # the curator's own file was closed in the server
    assert fds[:3] == [0, 1, 2]  # beyond the standard streams: its listener, pipes, selector, stdin
    assert all(str(link).startswith(("socket:", "pipe:", "anon_inode:", os.devnull)) for link in links[3:]), links
    assert _gone(int(str(found["server"])))  # it ended with the process that started it


@pytest.mark.slow
def test_a_curator_already_running_a_thread_starts_the_server_as_a_new_interpreter(tmp_path: Path) -> None:
    found = _probe(tmp_path, "busy")
    assert found["exit"] == 0
    assert "multiprocessing.forkserver import main" in str(found["cmdline"])
    assert _gone(int(str(found["server"])))


def test_closing_every_descriptor_but_some_keeps_exactly_those() -> None:
    """Run in a child: ``os.closerange(0, 0)`` closes every descriptor on this Python, so the
    empty ranges between kept descriptors (here 0, 1, 2) must be skipped."""
    code = textwrap.dedent(
        """
        import os
        from secure_release.curator.cluster.forkserver import _close_descriptors_except

        def is_open(fd):
            try:
                os.fstat(fd)
            except OSError:
                return False
            return True

        a, b = os.pipe()
        c, d = os.pipe()
        _close_descriptors_except({0, 1, 2, a, d})
        os.write(1, repr([fd for fd in (0, 1, 2, a, b, c, d) if is_open(fd)] == [0, 1, 2, a, d]).encode())
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "True", done.stderr
