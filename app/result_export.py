"""A released estimate written out: its JSON (``api.Result.to_dict``, ``save``; ``load_result``
reads it back) and its cells as Parquet (``to_parquet``). The truth of an in-memory release is the
private data the release protects: it is written only when the caller asks (``include_truth``,
simulations and demos), and never to Parquet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from secure_release.mechanism.errors import MultiTableResultError
from secure_release.result_base import counted
from secure_release.result_views import ResultViews


class ResultExport(ResultViews):
    """The exports of a :class:`~secure_release.api.Result`."""

    def to_dict(self, include_truth: bool = False) -> dict[str, Any]:
        """The report's JSON with ``guarantee`` and ``warnings`` (and, with ``include_truth`` for
        a simulation or demo, ``truth`` if known: it is the private data the release protects). A
        release of several tables: its :class:`TablesReport`'s (format ``secure-release/result/2``,
        every table's report and the design) with the whole release's guarantee, the warnings and
        (``include_truth``) one truth a table (None where unknown)."""
        if self.tables_report is not None:
            out = {**self.tables_report.to_dict(), "guarantee": self.guarantee, "warnings": list(self.warnings)}
            if include_truth and any(p is not None and p.truth is not None for p in self.parts):
                out["truth"] = [None if p is None or p.truth is None else p.truth.tolist() for p in self.parts]
            return out
        d = {**self.report.to_dict(), "guarantee": self.guarantee, "warnings": list(self.warnings)}
        if include_truth and self.truth is not None:
            d["truth"] = self.truth.tolist()
        return d

    def save(self, path: str | Path, include_truth: bool = False) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` (mode 0600; no truth unless ``include_truth``);
        :func:`load_result` reads it back."""
        from secure_release.infra.fileio import atomic_write

        target = Path(path)
        atomic_write(target, json.dumps(self.to_dict(include_truth), indent=1).encode("utf-8"))
        return target

    def to_parquet(self, path: str | Path) -> Path:
        """Write :meth:`cell_columns` (never the truth) as Parquet to ``path``; the guarantee and
        what each column holds (``mechanism.estimation.report.COLUMN_MEANINGS``) go in the file's metadata
        under ``secure_release`` (``analyst export R r.parquet``). A release of several tables
        has no one table of cells: write each table's (``part(t).to_parquet``) or :meth:`save`."""
        if self.parts:
            tables = counted(len(self.parts), "table")
            raise MultiTableResultError(
                f"release {self.report.release_id!r} has {tables}: write one table's cells with part(t).to_parquet"
                "(path) (tables() lists them), or the whole release as JSON with save(path)"
            )
        import pyarrow as pa
        import pyarrow.parquet as pq

        from secure_release.infra.fileio import atomic_write
        from secure_release.mechanism.estimation.estimators import DEFAULT_ESTIMATOR
        from secure_release.mechanism.estimation.report import COLUMN_MEANINGS

        table = pa.table(self.cell_columns())
        about = {"guarantee": self.guarantee, "headline": DEFAULT_ESTIMATOR, "columns": COLUMN_MEANINGS}
        buf = pa.BufferOutputStream()
        pq.write_table(table.replace_schema_metadata({b"secure_release": json.dumps(about).encode()}), buf)
        target = Path(path)
        atomic_write(target, buf.getvalue().to_pybytes(), 0o644)
        return target

