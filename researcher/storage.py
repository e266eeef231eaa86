"""The researcher's result files, all derived from one :class:`ReleaseReport`:
``<release>.json`` (``to_dict``), ``<release>.csv`` (``cells()``) and the best-effort heat map
``<release>.png``. Each is written atomically with mode 0600 in a directory created 0700;
:func:`load_reports` reads the JSON files back (skipping, and logging, unreadable ones).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from secure_release.infra.fileio import atomic_write, private_dir, read_nofollow
from secure_release.infra.logs import EventLog
from secure_release.mechanism.estimation.report import OUTPUT_COLUMNS, TABLES_FORMAT, ReleaseReport, TablesReport
from secure_release.researcher.heatmap import heatmap_png

#: A result: one table, or a release of several (``TablesReport``).
AnyReport = ReleaseReport | TablesReport
FILE_MODE = 0o600
DIR_MODE = 0o700


def report_json(report: AnyReport) -> bytes:
    """The report as indented JSON (``ReleaseReport.to_dict``, ``TablesReport.to_dict``)."""
    return (json.dumps(report.to_dict(), indent=1) + "\n").encode()


def report_csv(report: ReleaseReport) -> bytes:
    """One CSV row per cell: the attribute labels, then the output columns
    (:data:`OUTPUT_COLUMNS`: estimate = the headline, raw = A^-1, mle, se, ci_low, ci_high, observed)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow([*report.attributes, *OUTPUT_COLUMNS])
    columns = [values.tolist() for values in report.columns().values()]
    writer.writerows([*labels, *values] for labels, *values in zip(report.labels, *columns, strict=True))
    return text.getvalue().encode()


def write_report(out: Path, report: AnyReport) -> list[Path]:
    """Write the JSON, CSV and (if matplotlib is installed) PNG of ``report`` into ``out`` (a
    release of several tables: the JSON and one CSV a table, ``<release>.t<N>.csv``)."""
    out = private_dir(Path(out), fix_mode=False)  # never through a planted link, never another user's
    files = {f"{report.release_id}.json": report_json(report)}
    if isinstance(report, TablesReport):
        for t, table in enumerate(report.tables, start=1):
            if table is not None:
                files[f"{report.release_id}.t{t}.csv"] = report_csv(table)
    else:
        files[f"{report.release_id}.csv"] = report_csv(report)
        png = heatmap_png(report)
        if png is not None:
            files[f"{report.release_id}.png"] = png
    for name, data in files.items():
        atomic_write(out / name, data, FILE_MODE)
    return [out / name for name in files]


def read_report(path: Path) -> AnyReport:
    """The report in a JSON file written by :func:`write_report`."""
    data = json.loads(read_nofollow(Path(path)))
    report: AnyReport
    if isinstance(data, dict) and data.get("format") == TABLES_FORMAT:
        report = TablesReport.from_dict(data)
    else:
        report = ReleaseReport.from_dict(data)
    if report.release_id != Path(path).stem:
        raise ValueError(f"{path.name} holds release {report.release_id!r}")
    return report


def load_reports(out: Path, log: EventLog) -> dict[str, AnyReport]:
    """Every readable report in ``out`` by release id; unreadable files are logged and skipped."""
    reports: dict[str, AnyReport] = {}
    if not Path(out).is_dir():
        return reports
    for path in sorted(Path(out).glob("*.json")):
        try:
            report = read_report(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable_result", file=path.name, error=f"{type(exc).__name__}: {exc}"[:300])
            continue
        reports[report.release_id] = report
    return reports
