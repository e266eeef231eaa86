"""A report an analyst can send (issue 26, item 11): ``secure-release analyst report ID --out
r.html`` writes one self-contained HTML file whose numbers are the JSON result's, exactly."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from secure_release import api
from secure_release.cli import main
from secure_release.infra.logs import EventLog
from secure_release.infra.tls import bind, make_grpc_server
from secure_release.mechanism.estimation.report import OUTPUT_COLUMNS
from secure_release.protos.securerelease.v1 import securerelease_pb2_grpc as pb_grpc
from secure_release.researcher.service import ReleaseTracker, ResearcherService

LOG = EventLog("researcher", "test")


@pytest.fixture(scope="module")
def result() -> api.Result:
    ids = [f"p{i}" for i in range(400)]
    frames = {"alice": {"id": ids, "mass": [str(2600 + 9 * i) for i in range(400)]},
              "bob": {"id": ids[::-1], "y": ["p", "q", "r", "p"] * 100}}  # fmt: skip
    schemas = {"alice": {"curator": "alice", "attributes": [{"name": "mass", "bins": [2500, 4500, 6500]}]},
               "bob": {"y": ["p", "q", "r"]}}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return api.release(frames, schemas, 1.0, release_id="r1", test_keys=3)  # type: ignore[arg-type]


@contextlib.contextmanager
def researcher(result: api.Result) -> Iterator[str]:
    tracker = ReleaseTracker(lambda rid, d: result.report, LOG, {"r1": result.report})
    server = make_grpc_server(max_workers=4, insecure=True)
    pb_grpc.add_ResearcherServicer_to_server(ResearcherService(tracker, LOG, 5.0, frozenset({"analyst/analyst"})),
                                             server)  # fmt: skip
    port = bind(server, "127.0.0.1", 0, None, "researcher", insecure=True)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


class Page(HTMLParser):
    """The numbers of the cells table (data-value, full precision), the value printed on each bar
    of each chart (SVG text in group ``barsN-value-I``) and anything that would fetch."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[float] = []
        self.bars: dict[str, list[str]] = {}
        self.external: list[str] = []
        self._table = self._chart = self._value = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self._table = a.get("id", self._table) if tag == "table" else self._table
        if tag == "td" and "data-value" in a and self._table == "cells":
            self.values.append(float(a["data-value"]))
        if tag == "figure":
            self._chart = a["data-attributes"]
            self.bars[self._chart] = []
        if tag == "g" and "-value-" in a.get("id", ""):
            self._value = a["id"]
        if tag in ("script", "link", "img", "iframe", "object") or "src" in a:
            self.external.append(tag)

    def handle_data(self, data: str) -> None:
        if self._value and data.strip():
            self.bars[self._chart].append(data.strip())
            self._value = ""


def test_the_report_holds_the_json_results_numbers(result: api.Result, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "r.html"
    with researcher(result) as address:
        args = ["--researcher", address, "--insecure", "--name", "analyst", "--timeout", "5"]
        assert main(["analyst", "report", "r1", "--out", str(out), *args]) == 0
        assert main(["analyst", "show", "r1", "--json", *args]) == 0
    shown = json.loads(capsys.readouterr().out.splitlines()[-1])
    page = Page()
    text = out.read_text()
    page.feed(text)
    assert page.external == []  # self-contained: no script, stylesheet or image to fetch
    names = list(OUTPUT_COLUMNS)
    cells = [page.values[i : i + len(names)] for i in range(0, len(page.values), len(names))]
    assert len(cells) == len(shown["cells"]) == 6
    for row, cell in zip(cells, shown["cells"], strict=True):
        assert row == [cell[name] for name in names]
    for attribute in ("mass", "y"):
        t = result.marginal_table(attribute)
        assert page.bars[attribute] == [f"{v:.3f}" for v in t.projected]  # the headline on each bar
    assert page.bars["mass,y"]  # the heat map of the pair
    assert "[2500, 4500)" in text and f'data-value="{result.plan.epsilon!r}">{result.plan.epsilon:g}<' in text
    assert "-DP" in text and "truth" not in text
    for warning in result.warnings:
        assert warning.split(":")[0] in text
