"""Issue 34, item 3: the release page checked in a real browser.

The page of ``secure-release analyst report`` (``report_page.html_report``) is opened from a file
in Debian's headless Chromium, driven by Selenium through Debian's ``chromedriver``
(``/usr/bin/chromedriver`` given to ``Service``: Selenium Manager never runs, nothing is
downloaded). The test reads the rendered DOM, not the HTML source, and checks:

- every number of the headline summary, the plan, the cells table, the value on each bar and in
  each heat-map cell equals the Result's (at the precision shown);
- each chart has its axis labels (the attribute on x, the share on y; the pair's attributes on a
  heat map), as text in the SVG;
- the page fits 1,200 px without horizontal scrolling, runs no script and fetches nothing;
- it prints on A4 (a PDF from Chromium's print path, with the page's own @page size).

Screenshots go to ``$ARTIFACTS_DIR`` when it is set (CI keeps that directory), else to the test's
``tmp_path``; the path is printed. Without chromium or chromedriver the test FAILS and says how to
install them (``.ci/run`` installs both on a fresh machine): a page nobody looked at is not checked.
"""

from __future__ import annotations

import base64
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from secure_release import api
from secure_release.mechanism.privacy.guarantee import utility_check
from secure_release.report_page import html_report

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver (as root; .ci/run does it)"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")  # fmt: skip
WIDTH = 1200
ATTRIBUTES = ("education", "sex", "salary")


@pytest.fixture(scope="module")
def result() -> api.Result:
    rng = np.random.default_rng(11)
    n = 5000
    ids = np.array([f"p{i:05d}" for i in range(n)])
    edu = rng.choice(["no college", "some college", "post-graduate"], n, p=[0.45, 0.45, 0.1])
    frames = {
        "alice": {"id": ids, "education": edu},
        "bob": {"id": ids, "sex": rng.choice(["male", "female"], n),
                "salary": rng.choice(["<=50K", ">50K"], n, p=[0.75, 0.25])},
    }  # fmt: skip
    schemas = {"alice": {"education": ["no college", "some college", "post-graduate"]},
               "bob": {"sex": ["male", "female"], "salary": ["<=50K", ">50K"]}}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # epsilon 0.1: noisy enough for the utility warning, which the page must show first
        return api.release(frames, schemas, epsilon=0.1, release_id="r-browser", test_keys=5)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"the browser test needs {' and '.join(missing)}: {INSTALL}", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def page(result: api.Result, browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("page") / "r-browser.html"
    path.write_text(html_report(result), encoding="utf-8")
    browser.get(path.as_uri())
    assert browser.execute_script("return document.readyState") == "complete"
    return browser


def _artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ["ARTIFACTS_DIR"]) if os.environ.get("ARTIFACTS_DIR") else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


def _close(shown: str, value: float) -> bool:
    """``shown`` is ``value`` at the precision shown (half a unit of its last digit)."""
    digits = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown.replace(",", "")) - value) <= 0.5 * 10.0**-digits + 1e-12


def test_the_page_fits_1200_px_runs_no_script_and_fetches_nothing(page: Any, tmp_path: Path) -> None:
    sizes = page.execute_script(
        "const d = document.documentElement;"
        "return [window.innerWidth, d.scrollWidth, d.clientWidth, d.scrollHeight, document.body.scrollWidth]"
    )
    inner, scroll, client, height, body = sizes
    assert inner == WIDTH and scroll <= client and body <= client, sizes
    assert page.execute_script("return document.scripts.length") == 0
    assert page.execute_script("return performance.getEntriesByType('resource').length") == 0
    shot = page.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1},
    })  # fmt: skip
    out = _artifacts(tmp_path) / "report_page_1200px.png"
    out.write_bytes(base64.b64decode(shot["data"]))
    print(f"screenshot: {out}")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(out.read_bytes()[16:20], "big") == WIDTH  # the PNG's width


def test_every_table_number_is_the_results(page: Any, result: api.Result) -> None:
    head = page.execute_script("return [...document.querySelectorAll('#cells thead th')].map(e => e.innerText)")
    assert head == [*ATTRIBUTES, "estimate", "raw", "mle", "se", "ci_low", "ci_high", "observed"]
    rows = page.execute_script(
        "return [...document.querySelectorAll('#cells tbody tr')].map(r => [...r.cells].map(c => c.innerText))"
    )
    columns = result.cell_columns()
    assert len(rows) == len(result.report.labels)
    for c, row in enumerate(rows):
        assert tuple(row[: len(ATTRIBUTES)]) == result.report.labels[c]
        for name, shown in zip(head[len(ATTRIBUTES) :], row[len(ATTRIBUTES) :], strict=True):
            assert _close(shown, float(columns[name][c])), (c, name, shown, columns[name][c])
    plan, utility = result.plan, utility_check(result.plan)
    summary = page.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#summary dd')]"
        ".map(e => [e.dataset.key, e.innerText]))"
    )
    expected = {"epsilon": plan.epsilon, "n": plan.n, "m": plan.m, "K": plan.joint_size,
                "rmse": utility["predicted_rmse_per_cell"], "typical": 1.0 / plan.joint_size}  # fmt: skip
    for key, value in expected.items():
        assert _close(summary[key], value), (key, summary[key], value)
    spans = int(np.sum(columns["ci_spans_zero"]))
    assert summary["spans_zero"] == f"{spans} of {len(rows)}"
    shown_plan = page.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#plan tr')]"
        ".map(r => [r.cells[0].innerText, r.cells[1].innerText]))"
    )
    for key, value in {"n": plan.n, "m": plan.m, "K": plan.joint_size, "epsilon spent": plan.epsilon,
                       "gamma": plan.gamma}.items():  # fmt: skip
        assert _close(shown_plan[key], value), (key, shown_plan[key], value)
    # every warning, in the summary at the top (before the charts)
    shown = page.execute_script("return [...document.querySelectorAll('#summary .warning')].map(e => e.innerText)")
    assert result.warnings and all(any(w in s for s in shown) for w in result.warnings), shown


def test_the_associations_section_shows_the_results_tests(page: Any, result: api.Result) -> None:
    """Issue 42: after the charts, every cross-curator pair with its test, the Holm-adjusted p and
    Cramer's V with its interval, as ``Result.association_rows`` gives them, and what the
    adjustment was; the guarantee says the analyses spend no budget."""
    order = page.execute_script("return [...document.querySelectorAll('section')].map(s => s.id)")
    assert order.index("associations") == order.index("charts") + 1
    head = page.execute_script(
        "return [...document.querySelectorAll('#associations-table thead th')].map(e => e.innerText)"
    )
    assert head[:2] == ["a", "b"] and "p (Holm)" in head and "Cramer's V" in head
    shown = page.execute_script(
        "return [...document.querySelectorAll('#associations-table tbody tr')]"
        ".map(r => [...r.cells].map(c => c.innerText))"
    )
    rows = [r.to_dict() for r in result.association_rows()]
    assert {(d["a"], d["b"]) for d in rows} == {("education", "sex"), ("education", "salary")}
    assert len(shown) == len(rows)
    keys = ("statistic", "df", "p_value", "p_holm", "cramers_v", "v_ci_low", "v_ci_high", "mutual_information")
    for row, expected in zip(shown, rows, strict=True):
        assert (row[0], row[1]) == (expected["a"], expected["b"])
        for text, key in zip(row[2:], keys, strict=True):
            assert _close(text, float(expected[key])), (row[:2], key, text, expected[key])
    text = page.execute_script("return document.getElementById('associations').innerText")
    assert "Holm" in text and "spend no privacy budget" in text
    guarantee = page.execute_script("return document.getElementById('guarantee').innerText")
    assert "spend no privacy budget" in guarantee


def _chart_texts(page: Any, chart_id: str) -> dict[str, str]:
    """The text of every SVG group of a chart whose id starts with the chart's id."""
    found: dict[str, str] = page.execute_script(
        "const f = document.getElementById(arguments[0]);"
        "return Object.fromEntries([...f.querySelectorAll('g[id]')].filter(g => g.id.startsWith(arguments[0] + '-'))"
        ".map(g => [g.id.slice(arguments[0].length + 1), g.textContent.trim()]))",
        chart_id,
    )
    return found


def test_each_chart_has_its_axis_labels_and_the_results_values(page: Any, result: api.Result) -> None:
    charts = page.execute_script(
        "return [...document.querySelectorAll('figure.chart')].map(f => [f.id, f.dataset.attributes,"
        " f.querySelector('svg').getBoundingClientRect().width])"
    )
    pairs = [f"{a},{b}" for i, a in enumerate(ATTRIBUTES) for b in ATTRIBUTES[i + 1 :]]
    assert [c[1] for c in charts] == [*ATTRIBUTES, *pairs]
    assert all(0 < c[2] <= WIDTH for c in charts)
    for chart_id, names, _ in charts:
        texts = _chart_texts(page, chart_id)
        attributes = names.split(",")
        if len(attributes) == 1:
            assert texts["xlabel"] == attributes[0] and texts["ylabel"] == "share of records", texts
            t = result.marginal_table(attributes[0])
            values = [texts[f"value-{i}"] for i in range(t.headline.size)]
            assert all(_close(s, v) for s, v in zip(values, t.headline, strict=True)), (values, t.headline)
            ticks = page.execute_script(
                "return [...document.getElementById(arguments[0]).querySelectorAll('g[id^=xtick] text')]"
                ".map(e => e.textContent)", chart_id)  # fmt: skip
            assert ticks == [str(v) for v in t.labels[:, 0]]
            assert "95% interval" in page.execute_script(
                "return document.getElementById(arguments[0]).textContent", chart_id)  # fmt: skip
        else:
            assert texts["ylabel"] == attributes[0] and texts["xlabel"] == attributes[1], texts
            t = result.marginal_table(*attributes)
            rows = list(dict.fromkeys(t.labels[:, 0].tolist()))
            cols = list(dict.fromkeys(t.labels[:, 1].tolist()))
            for k, (r, c) in enumerate(t.labels.tolist()):
                shown = texts[f"value-{rows.index(r)}-{cols.index(c)}"]
                assert _close(shown, float(t.headline[k])), (chart_id, r, c, shown, t.headline[k])


def test_it_prints_on_a4(page: Any, tmp_path: Path) -> None:
    pdf = base64.b64decode(page.execute_cdp_cmd("Page.printToPDF", {"preferCSSPageSize": True})["data"])
    (_artifacts(tmp_path) / "report_page_a4.pdf").write_bytes(pdf)
    assert pdf[:5] == b"%PDF-"
    boxes = {tuple(round(float(v)) for v in m.groups()) for m in re.finditer(
        rb"/MediaBox \[0 0 ([\d.]+) ([\d.]+)\]", pdf)}  # fmt: skip
    assert boxes == {(595, 842)}, boxes  # A4 in points, from the page's own @page rule
