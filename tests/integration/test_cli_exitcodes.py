"""Every ``secure-release`` subcommand follows the exit-code convention: 0 ok, 1 runtime failure,
2 usage (bad flags, settings or input), 3 refused; and the analyst/schema/keygen commands work."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from secure_release import api
from secure_release.cli import main
from secure_release.demo_data import write_demo_data
from secure_release.infra.exitcodes import exit_code_for as exit_code
from secure_release.infra.logs import EventLog
from secure_release.infra.tls import bind, make_grpc_server
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.service import ReleaseTracker, ResearcherService

#: The output vocabulary, in order (tests/unit/test_output_vocabulary.py).
VOCABULARY = ["estimate", "raw", "mle", "se", "ci_low", "ci_high", "observed"]

LOG = EventLog("researcher", "test")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def result() -> api.Result:
    frames = {"alice": {"id": ["a", "b", "c", "d"] * 50, "x": ["0", "1"] * 100},
              "bob": {"id": ["a", "b", "c", "d"] * 50, "y": ["p", "q", "r", "p"] * 50}}  # fmt: skip
    frames = {k: {c: [f"{v}{i}" if c == "id" else v for i, v in enumerate(col)] for c, col in f.items()}
              for k, f in frames.items()}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(frames, {"alice": {"x": ["0", "1"]}, "bob": {"y": ["p", "q", "r"]}}, 2.0,
                           release_id="r1", test_keys=5)  # fmt: skip


@contextlib.contextmanager
def researcher(result: api.Result, readers: frozenset[str]) -> Iterator[str]:
    """A researcher service (insecure test mode, access table on) holding ``result``."""
    tracker = ReleaseTracker(lambda rid, d: result.report, LOG, {"r1": result.report})
    server = make_grpc_server(max_workers=4, insecure=True)
    pb_grpc.add_ResearcherServicer_to_server(ResearcherService(tracker, LOG, 5.0, readers), server)
    port = bind(server, "127.0.0.1", 0, None, "researcher", insecure=True)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def _analyst(address: str, *args: str) -> list[str]:
    return [*args, "--researcher", address, "--insecure", "--name", "analyst", "--timeout", "5"]


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--n", "100", "--alphabet", "2,2", "--epsilon", "-1"]) == 2
    assert "InvalidEpsilonError" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--n", "x"])
    assert exc.value.code == 2
    assert main([]) == 2
    assert main(["demo", "--curators", "1"]) == 2
    assert main(["schema", "check", str(tmp_path / "absent.csv"), str(tmp_path / "absent.json")]) == 2


def test_help_exits_0_and_shows_the_own_data_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "Exit codes: 0 ok, 1 runtime failure, 2 usage" in out
    assert "secure-release keygen alignment align.key" in out and "--listen 127.0.0.1:7102" in out


def test_keygen_writes_0600_and_refuses_to_overwrite(tmp_path: Path) -> None:
    key = tmp_path / "align.key"
    assert main(["keygen", "alignment", str(key)]) == 0
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    text = key.read_text()
    assert len(text.strip()) == 64 and int(text, 16) >= 0
    assert main(["keygen", "alignment", str(key)]) == 3  # refused: the curators share this one
    assert key.read_text() == text
    assert main(["keygen", "alignment", str(key), "--force"]) == 0 and key.read_text() != text


def test_schema_draft_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_demo_data(tmp_path, rows=200)
    out = tmp_path / "draft.json"
    assert main(["schema", "draft", str(tmp_path / "alice.csv"), "--curator", "alice", "--out", str(out)]) == 0
    assert "public codebook" in capsys.readouterr().err
    draft = json.loads(out.read_text())
    assert [a["name"] for a in draft["attributes"]] == ["education", "marital"]
    assert main(["schema", "check", str(tmp_path / "alice.csv"), str(out)]) == 0
    assert "rows match schema 'alice'" in capsys.readouterr().out
    draft["attributes"][0]["categories"] = draft["attributes"][0]["categories"][:-1]
    out.write_text(json.dumps(draft))
    assert main(["schema", "check", str(tmp_path / "alice.csv"), str(out)]) == 2
    assert "BadRowsError" in capsys.readouterr().err


def test_analyst_reads_lists_and_exports(
    result: api.Result, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with researcher(result, frozenset({"analyst/analyst"})) as address:
        assert main(_analyst(address, "analyst", "list")) == 0
        assert capsys.readouterr().out.split() == ["r1"]
        assert main(_analyst(address, "analyst", "show", "r1", "--json")) == 0
        shown = json.loads(capsys.readouterr().out)
        assert [c["estimate"] for c in shown["cells"]] == result.report.projected.tolist()  # the headline
        assert [c["raw"] for c in shown["cells"]] == result.report.estimate.tolist()
        assert list(shown["cells"][0]) == ["labels", *VOCABULARY]  # tests/unit/test_output_vocabulary.py
        assert shown["guarantee"]["delta"] == 0.0
        assert main(_analyst(address, "analyst", "marginal", "r1", "y", "--json")) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        np.testing.assert_allclose([r["estimate"] for r in rows], result.marginal_table("y").projected)
        np.testing.assert_allclose([r["raw"] for r in rows], result.marginal_table("y").estimate)
        assert list(rows[0]) == ["y", *VOCABULARY]
        assert main(_analyst(address, "analyst", "conditional", "r1", "--target", "y", "--given", "x")) == 0
        assert "P(y | x)" in capsys.readouterr().out
        assert main(_analyst(address, "analyst", "conditional", "r1", "--target", "y", "--given", "x", "--json")) == 0
        conditional = json.loads(capsys.readouterr().out)["rows"]
        assert list(conditional[0]) == ["x", "y", "estimate", "mle", "ci_low", "ci_high"]
        for suffix in ("csv", "json", "parquet"):
            assert main(_analyst(address, "analyst", "export", "r1", str(tmp_path / f"r1.{suffix}"))) == 0
        assert main(_analyst(address, "analyst", "export", "r1", str(tmp_path / "r1.xlsx"))) == 2
        assert main(_analyst(address, "analyst", "marginal", "r1", "nope")) == 2
    import pandas as pd

    frame = pd.read_parquet(tmp_path / "r1.parquet")
    np.testing.assert_array_equal(frame["estimate"].to_numpy(), result.report.projected)
    np.testing.assert_array_equal(frame["raw"].to_numpy(), result.report.estimate)
    assert list(frame.columns) == [*result.attributes, *VOCABULARY, "ci_spans_zero"]
    assert list(pd.read_csv(tmp_path / "r1.csv").columns) == [*result.attributes, *VOCABULARY]
    exported = json.loads((tmp_path / "r1.json").read_text())
    assert list(exported["cells"][0]) == ["labels", *VOCABULARY]
    assert len(pd.read_csv(tmp_path / "r1.csv")) == 6


def test_analyst_test_and_associations(result: api.Result, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: the test and every cross-curator pair over the wire; bad names exit 2 by name."""
    with researcher(result, frozenset({"analyst/analyst"})) as address:
        assert main(_analyst(address, "analyst", "test", "r1", "--between", "x", "--and", "y", "--draws", "99")) == 0
        text = capsys.readouterr().out
        assert "H0: x independent of y" in text and "Cramer's V" in text and "spends no privacy budget" in text
        assert main(_analyst(address, "analyst", "test", "r1", "--between", "x", "--and", "y", "--json")) == 0
        shown = json.loads(capsys.readouterr().out)
        direct = result.test_independence("x", "y")
        assert shown["test"]["p_value"] == direct.p_value and shown["test"]["df"] == 2
        assert main(_analyst(address, "analyst", "associations", "r1", "--json")) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        assert [(r["a"], r["b"]) for r in rows] == [("x", "y")]
        assert main(_analyst(address, "analyst", "associations", "r1")) == 0
        assert "p (Holm)" in capsys.readouterr().out
        for bad, says in ((["--between", "z", "--and", "y"], "UnknownAttributeError"),
                          (["--between", "x", "--and", "x"], "RepeatedAttributeError"),
                          (["--between", "x", "--and", "y", "--given", "y"], "RepeatedAttributeError")):  # fmt: skip
            assert main(_analyst(address, "analyst", "test", "r1", *bad)) == 2
            assert says in capsys.readouterr().err


def test_analyst_refused_exits_3_and_unreachable_exits_1(result: api.Result) -> None:
    with researcher(result, frozenset({"analyst/someone-else"})) as address:
        assert main(_analyst(address, "analyst", "show", "r1")) == 3
    assert main(_analyst(f"127.0.0.1:{_free_port()}", "analyst", "list")) == 1


def test_exit_code_maps_grpc_statuses() -> None:
    class Fake(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode) -> None:
            self._code = code

        def code(self) -> grpc.StatusCode:
            return self._code

    Fake.__module__ = "grpc._channel"
    assert exit_code(Fake(grpc.StatusCode.PERMISSION_DENIED)) == 3
    assert exit_code(Fake(grpc.StatusCode.INVALID_ARGUMENT)) == 2
    assert exit_code(Fake(grpc.StatusCode.UNAVAILABLE)) == 1
    assert exit_code(FileNotFoundError("x")) == 2
    assert exit_code(KeyboardInterrupt()) == 130
