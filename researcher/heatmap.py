"""The best-effort heat map of a report (needs the optional ``matplotlib``; None without it).

Cells are in joint-code order, whose most significant digit is the first attribute, so the
headline estimates (the projected shares) fold into a grid: one row per category of the first attribute, one column
per combination of the others. Each cell shows its value; a colour bar gives the scale.
"""

from __future__ import annotations

import contextlib
import io
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.estimation.report import ReleaseReport

#: Cells print their values only up to this many cells (beyond it the text is unreadable).
MAX_ANNOTATED_CELLS = 400
DPI = 80


Grid = tuple[npt.NDArray[np.float64], list[str], list[str]]


def _one_column(shares: npt.NDArray[np.float64], labels: npt.NDArray[Any]) -> Grid:
    """Every cell on its own row, labelled with all its attribute labels."""
    return shares.reshape(-1, 1), [" / ".join(map(str, cell)) for cell in labels.tolist()], ["estimate (share)"]


def share_grid(report: ReleaseReport) -> Grid:
    """The headline estimates as a (first attribute) x (the other attributes) grid, with the row
    and column labels; one column of whole-cell labels if the cells do not fold that way."""
    shares = np.asarray(report.headline, dtype=np.float64)
    labels = np.array(report.labels, dtype=object).reshape(shares.size, -1)
    row_names = list(dict.fromkeys(labels[:, 0].tolist()))
    cols = shares.size // len(row_names)
    if labels.shape[1] == 1 or cols * len(row_names) != shares.size:
        return _one_column(shares, labels)
    grid = labels.reshape(len(row_names), cols, -1)
    if not (grid[:, :, 0] == np.array(row_names, dtype=object)[:, None]).all():
        return _one_column(shares, labels)
    col_names = [" / ".join(map(str, cell)) for cell in grid[0, :, 1:].tolist()]
    return shares.reshape(len(row_names), cols), row_names, col_names


def _annotate(ax: Any, values: npt.NDArray[np.float64]) -> None:
    """Write each cell's value on it, dark text on light cells and light on dark."""
    middle = (float(values.min()) + float(values.max())) / 2
    for (r, c), v in np.ndenumerate(values):
        ax.text(c, r, f"{v:.3f}", ha="center", va="center", fontsize=7, color="black" if v > middle else "white")


def prewarm() -> threading.Thread:
    """Import matplotlib in a daemon thread (about 1 s), so a long-running researcher's first
    release does not pay for it after the estimate is ready."""

    def load() -> None:
        with contextlib.suppress(ImportError):
            import matplotlib.figure  # noqa: F401

    thread = threading.Thread(target=load, name="matplotlib-prewarm", daemon=True)
    thread.start()
    return thread


def heatmap_png(report: ReleaseReport) -> bytes | None:
    """The heat map as PNG bytes; None when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    values, row_names, col_names = share_grid(report)
    fig = Figure(figsize=(max(4.0, 1.0 + 0.9 * len(col_names)), max(3.0, 1.5 + 0.4 * len(row_names))))
    ax = fig.subplots()
    image = ax.imshow(values, aspect="auto", cmap="viridis")
    fig.colorbar(image, ax=ax, label="estimate (share)")
    ax.set_yticks(range(len(row_names)), row_names, fontsize=7)
    ax.set_ylabel(report.attributes[0] if len(col_names) > 1 else " / ".join(report.attributes))
    ax.set_xticks(range(len(col_names)), col_names, fontsize=7, rotation=45, ha="right")
    ax.set_xlabel(" / ".join(report.attributes[1:]) if len(col_names) > 1 else "")
    if values.size <= MAX_ANNOTATED_CELLS:
        _annotate(ax, values)
    kind = f"marginal of {', '.join(report.covered)}" if report.marginal else "joint estimate"
    ax.set_title(f"{report.release_id}: {kind}, epsilon = {report.plan.epsilon:.3g}", fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()
