"""Refused rows as a data owner can act on them: one summary per column, and every bad cell in a
file for the owner alone.

:func:`summary` turns the bad cells of a table (each one :class:`BadCell`: line, column, value,
what is wrong, a hint) into at most about 20 lines whatever their number: per column and kind
of problem, how many rows, the first few lines, the most frequent values with their counts and
a hint where one fits (a case or white-space difference, a non-integer among integer codes, a
date that is not ISO). :func:`write_bad_rows` writes every cell to a CSV file created 0600.

The values shown are the owner's data: the summary goes to the owner's terminal (the error a
command prints on stderr), never into a log record that leaves the machine, never over gRPC
(an abort reason says only how many rows were refused: :attr:`BadRowsError.public_message`,
which ``infra.exitcodes.refusal_reason`` sends instead of the message).
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from secure_release.mechanism.errors import SecureReleaseError

#: Groups (column and kind of problem) shown before "and N more".
MAX_GROUPS = 6
#: Line numbers and values shown per group.
MAX_LINES, MAX_VALUES = 5, 3
#: Longest value shown in the summary (longer ones are cut with an ellipsis; the file has all).
MAX_SHOWN = 40


@dataclass(frozen=True)
class BadCell:
    """One refused cell: ``line`` in ``file`` (None: the table's only file), the ``column`` (a
    record-level problem such as a wrong field count has ``column`` "(record)"), the ``value``
    as read (after trimming; "" for missing cells and id problems), ``kind`` (what is wrong, in
    a few words) and ``hint`` (why it may have been meant otherwise, or None)."""

    line: int
    column: str
    value: str
    kind: str
    hint: str | None = None
    file: str | None = None


def _shown(value: str) -> str:
    text = value if len(value) <= MAX_SHOWN else value[: MAX_SHOWN - 1] + "…"
    return repr(text)


def _where(cell: BadCell) -> str:
    return str(cell.line) if cell.file is None else f"{cell.file}:{cell.line}"


def summary(
    source: str, rows: int, cells: Sequence[BadCell], allowed: Mapping[str, Sequence[str]] | None = None
) -> str:
    """The refusal of ``rows`` bad rows of ``source`` as a few lines: one group per (column,
    kind), largest first; ``allowed`` (column -> categories) adds what a column allows."""
    groups: dict[tuple[str, str], list[BadCell]] = {}
    for cell in cells:
        groups.setdefault((cell.column, cell.kind), []).append(cell)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    lines = [f"{source}: {rows} bad row(s) refused; nothing was read (every bad cell: --bad-rows FILE):"]
    for (column, kind), group in ordered[:MAX_GROUPS]:
        where = ", ".join(_where(c) for c in sorted(group, key=lambda c: (c.file or "", c.line))[:MAX_LINES])
        more = ", ..." if len(group) > MAX_LINES else ""
        head = f"  {column}: {len(group)} row(s) {kind}, line(s) {where}{more}"
        counts = Counter(c.value for c in group if c.value)
        if counts:
            top = ", ".join(f"{_shown(v)} ({n})" for v, n in counts.most_common(MAX_VALUES))
            others = len(counts) - MAX_VALUES
            head += f"; values: {top}" + (f" and {others} other value(s)" if others > 0 else "")
        lines.append(head)
        hints = {c.value: c.hint for c in group if c.hint}
        if hints:
            value, text = next(iter(sorted(hints.items(), key=lambda item: -counts[item[0]])))
            if value:
                lines.append(f"    hint: {_shown(value)} {text}")
            elif kind.startswith("missing"):
                lines.append(f"    hint: {text}")
            else:
                first = next(c for c in group if c.hint)
                lines.append(f"    e.g. line {_where(first)}: {first.kind} {first.hint}")
        if allowed and column in allowed and kind.startswith("not a category"):
            cats = list(allowed[column])
            lines.append(f"    allowed: {cats[:12]}" + (f" and {len(cats) - 12} more" if len(cats) > 12 else ""))
    if len(ordered) > MAX_GROUPS:
        rest = sum(len(g) for _, g in ordered[MAX_GROUPS:])
        lines.append(f"  and {len(ordered) - MAX_GROUPS} more column problem(s) in {rest} cell(s)")
    return "\n".join(lines)


def public_reason(rows: int) -> str:
    """What may leave the owner's machine about a refused table: only how many rows."""
    return f"the curator's table has {rows} bad row(s) (the details stay with the curator)"


def write_bad_rows(path: str | Path, cells: Sequence[BadCell]) -> Path:
    """Every bad cell as CSV (file, line, column, value, problem, hint) in a new file readable
    by its owner only (0600, created so: never world-readable, not even for a moment); an
    existing file is replaced."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)  # 0600, O_EXCL: no one else's file
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["file", "line", "column", "value", "problem", "hint"])
            for cell in sorted(cells, key=lambda c: (c.file or "", c.line, c.column)):
                writer.writerow([cell.file or "", cell.line, cell.column, cell.value, cell.kind, cell.hint or ""])
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # nothing half-written is left beside the target
        raise
    return target


class BadRowsError(SecureReleaseError):
    """Some rows hold values outside the schema (or a missing, over-long or duplicate id, or
    bytes that are not UTF-8)."""

    def __init__(
        self, path: str, problems: list[tuple[int, str]], files: list[str] | None = None,
        cells: Sequence[BadCell] | None = None, allowed: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """``path``: the data as given (a file, a directory or a glob); ``problems``: (line,
        message) of every bad row; ``files``: the file of each problem, when the data is several
        files (None: every line is a line of ``path``); ``cells``: every bad cell (default: one
        record-level cell per problem); ``allowed``: each categorical column's categories. The
        message is :func:`curator.badrows.summary` (about 20 lines at most)."""
        self.path = path
        self.problems = problems
        self.files = files
        if cells is None:
            at = files if files is not None else [None] * len(problems)
            cells = [BadCell(line, "(record)", "", message, None, file)
                     for (line, message), file in zip(problems, at, strict=True)]
        self.cells = list(cells)
        #: What another party may learn (an abort reason): the count only, never a value.
        self.public_message = public_reason(len(problems))
        super().__init__(summary(path, len(problems), self.cells, allowed))


@contextmanager
def bad_rows_to(path: str | Path | None) -> Iterator[None]:
    """Run a block that reads a table; if it refuses rows (:class:`BadRowsError`) and ``path``
    is given, every bad cell goes to ``path`` (:func:`write_bad_rows`, 0600) and the error
    says where, then propagates."""
    try:
        yield
    except BadRowsError as exc:
        if path is not None:
            try:
                written = write_bad_rows(path, exc.cells)
                where = f"every bad cell ({len(exc.cells)}): {written} (readable by you only)"
            except OSError as failure:  # the summary above still stands; say why the file is missing
                where = f"--bad-rows {path}: not written ({failure.strerror or type(failure).__name__})"
            exc.args = (f"{exc}\n  {where}",)
        raise
