"""Results laid out for reading: numbers rounded for the eye, fixed-width tables and small HTML
tables, as plain strings (no I/O).

The printed forms of every analysis result (``print(test)``, ``print(model)``, a notebook's
``_repr_html_``) are built here, so a test, an effect, a model, a power plan and a suggestion read
alike: a test in the layout of R's ``print.htest`` (a title, ``data:``, the statistic with its df
and p-value, the hypotheses in words, the method), a model in that of statsmodels' ``summary()``
(a header block, then a coefficient table). The figures are rounded only here; the objects keep
their full values.

Number formats:

* a p-value as R's ``format.pval``: below :data:`P_FLOOR` (double precision's epsilon) as
  ``< 2.2e-16``, otherwise to 4 significant digits (``0.01553``, ``3.2e-05``);
* a statistic, a df or any figure of mixed size: 4 significant digits (:func:`sig`);
* an estimate, a standard error or an interval end: 4 decimals (:func:`fixed`), in scientific
  notation from 1e5 on (a standard error of 1.2e+12 stays readable);
* not a number: ``NaN``, ``Inf``, ``-Inf`` (as R prints them).
"""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field

from secure_release.mechanism.errors import ShapeMismatchError

#: R's ``format.pval`` floor (``.Machine$double.eps``): smaller p-values print as "< 2.2e-16".
P_FLOOR = 2.220446049250313e-16
#: The width text layouts wrap to (statsmodels' summary is 78 wide).
WIDTH = 78
#: Estimates at or beyond this magnitude print in scientific notation.
SCIENTIFIC_FROM = 1e5
#: How the text and the pages name each effect size.
EFFECT_NAMES = {
    "cramers_v": "Cramer's V",
    "mutual_information": "mutual information (nats)",
    "odds_ratio": "odds ratio",
    "risk_difference": "risk difference",
    "kendall_tau_b": "Kendall's tau-b",
}
#: What a flagged coefficient's row says (models).
NOT_ESTIMATED = "not estimated"


def _special(x: float) -> str | None:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Inf" if x > 0 else "-Inf"
    return None


def p_value(p: float, digits: int = 4) -> str:
    """A p-value as R's ``format.pval``: ``< 2.2e-16`` below :data:`P_FLOOR`, else ``digits``
    significant digits (``0.01553``, ``1``, ``3.2e-05``); ``NaN`` when not a number."""
    special = _special(float(p))
    if special is not None:
        return special
    if p < P_FLOOR:
        return f"< {P_FLOOR:.2g}"
    return f"{p:.{digits}g}"


def sig(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits (``7.532``, ``1235``, ``1.2e-05``)."""
    special = _special(float(x))
    return special if special is not None else f"{x:.{digits}g}"


def fixed(x: float, decimals: int = 4) -> str:
    """An estimate to ``decimals`` decimals (``-0.6820``); in scientific notation with
    ``decimals`` significant digits when ``|x| >= 1e5`` (``1.195e+12``)."""
    special = _special(float(x))
    if special is not None:
        return special
    return f"{x:.{decimals}g}" if abs(x) >= SCIENTIFIC_FROM else f"{x:.{decimals}f}"


def interval(low: float, high: float, decimals: int = 4) -> str:
    """``[low, high]`` with :func:`fixed` ends."""
    return f"[{fixed(low, decimals)}, {fixed(high, decimals)}]"


def level_text(level: float) -> str:
    """A confidence level as a percentage: 0.95 -> ``95%``."""
    return f"{100 * level:g}%"


def interval_columns(level: float) -> tuple[str, str]:
    """statsmodels' interval column names at ``level``: 0.95 -> ``[0.025``, ``0.975]``."""
    tail = (1.0 - level) / 2.0
    return f"[{tail:.4g}", f"{1.0 - tail:.4g}]"


def effect_name(name: str) -> str:
    """The reading name of an effect size (:data:`EFFECT_NAMES`), else the name itself."""
    return EFFECT_NAMES.get(name, name)


def wald_p_value(z: float) -> float:
    """Two-sided normal tail 2 P(Z > |z|) = erfc(|z| / sqrt 2) (the P>|z| of a Wald z)."""
    return math.erfc(abs(z) / math.sqrt(2.0)) if math.isfinite(z) else math.nan


def wrap(text: str, width: int = WIDTH, indent: str = "", hang: str = "    ") -> list[str]:
    """One statement as lines of at most ``width`` characters, continuation lines indented by
    ``hang`` (after ``indent``); words longer than the width are not broken."""
    return textwrap.wrap(
        text, width, initial_indent=indent, subsequent_indent=indent + hang, break_long_words=False,
        break_on_hyphens=False,
    ) or [indent.rstrip()]  # fmt: skip


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    """A fixed-width table: each column as wide as its widest cell, two spaces between columns;
    ``align`` one letter per column, ``l`` or ``r`` (default: the first column left, the others
    right). Returns the header line, a rule of dashes and one line per row (trailing blanks cut)."""
    count = len(header)
    for row in rows:
        if len(row) != count:
            raise ShapeMismatchError(f"a row of {len(row)} cells in a table of {count} columns")
    sides = align or "l" + "r" * (count - 1)
    widths = [max([len(header[j]), *(len(r[j]) for r in rows)]) for j in range(count)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.ljust(w) if s == "l" else c.rjust(w) for c, w, s in zip(cells, widths, sides, strict=True)]
        return "  ".join(parts).rstrip()

    head = line(header)
    return [head, "-" * max(len(head), sum(widths) + 2 * (count - 1)), *(line(r) for r in rows)]


def pair_lines(pairs: Sequence[tuple[str, str]], width: int = WIDTH) -> list[str]:
    """statsmodels' header block: ``key: value`` pairs two to a line, each in half the width
    (key left, value right); a pair too wide for half the width gets a line of its own."""
    half = (width - 3) // 2
    cells = [f"{key}:{value.rjust(max(half - len(key) - 1, 1))}" if len(key) + len(value) + 2 <= half
             else f"{key}: {value}" for key, value in pairs]  # fmt: skip
    out: list[str] = []
    row: list[str] = []
    for cell in cells:
        if len(cell) > half:
            if row:
                out.append(row[0])
                row = []
            out.append(cell)
            continue
        row.append(cell)
        if len(row) == 2:
            out.append(f"{row[0]}   {row[1]}")
            row = []
    if row:
        out.append(row[0])
    return out


def short_repr(kind: str, text: str) -> str:
    """A one-line repr: ``<Kind text>``."""
    return f"<{kind} {text}>"


def not_estimated_flag(names: Sequence[str]) -> str:
    """``, not estimated: a, b, c and 2 more`` for a repr, or empty when every coefficient is estimated."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f", not estimated: {', '.join(names[:3])}{more}" if names else ""


def esc(text: object) -> str:
    """``html.escape`` of a value's text (quotes too)."""
    return html.escape(str(text), quote=True)


@dataclass(frozen=True)
class Block:
    """A result laid out for reading, as text (:meth:`text`) or an HTML fragment (:meth:`html`).

    ``title``; ``lines``: statements, one each (``data: ...``, the statistic, the hypotheses),
    wrapped; ``pairs``: a header block of (key, value); ``header`` and ``rows``: a table (with
    ``align``, see :func:`table_lines`); ``notes``: statements after the table (warnings, the
    method), wrapped. ``ruled``: statsmodels' layout (the title centred over rules of ``=``)
    instead of R's (the title, a blank line, the statements).
    """

    title: str
    lines: Sequence[str] = ()
    pairs: Sequence[tuple[str, str]] = ()
    header: Sequence[str] = ()
    rows: Sequence[Sequence[str]] = ()
    align: str = ""
    notes: Sequence[str] = ()
    ruled: bool = False
    width: int = WIDTH
    table_notes: Sequence[str] = field(default=())

    def text(self) -> str:
        """The plain-text layout (no trailing newline)."""
        table = table_lines(self.header, self.rows, self.align) if self.header else []
        width = max([self.width, *(len(t) for t in table)])
        out: list[str] = []
        if self.ruled:
            out += [self.title.center(width).rstrip(), "=" * width]
        else:
            out += [self.title, ""]
        for statement in self.lines:
            out += wrap(statement, width)
        if self.pairs:
            out += pair_lines(self.pairs, width)
        if table:
            if self.ruled:
                out.append("=" * width)
                table[1] = "-" * width
            elif self.lines or self.pairs:
                out.append("")
            out += table
            if self.ruled:
                out.append("=" * width)
        for note in self.table_notes:
            out += wrap(note, width)
        if self.notes and table and not self.ruled:
            out.append("")
        for note in self.notes:
            out += wrap(note, width)
        return "\n".join(out)

    def html(self) -> str:
        """A small HTML fragment: the title, the statements, the header block and the table as
        ``<table>`` elements, the notes; every string escaped (:func:`esc`), no script, no style
        sheet."""
        out = ['<div class="secure-release-result">', f"<p><strong>{esc(self.title)}</strong></p>"]
        statements = [_split_statement(s) for s in self.lines]
        if statements or self.pairs:
            out.append("<table>")
            for key, value in (*statements, *self.pairs):
                out.append(f"<tr><th style=\"text-align:left\">{esc(key)}</th><td>{esc(value)}</td></tr>" if key
                           else f"<tr><td colspan=\"2\">{esc(value)}</td></tr>")  # fmt: skip
            out.append("</table>")
        if self.header:
            sides = self.align or "l" + "r" * (len(self.header) - 1)
            style = ['style="text-align:left"' if s == "l" else 'style="text-align:right"' for s in sides]
            out.append("<table>")
            out.append("<thead><tr>" + "".join(f"<th {st}>{esc(h)}</th>" for h, st in zip(self.header, style,
                                                                                      strict=True)) + "</tr></thead>")
            out.append("<tbody>")
            out += ["<tr>" + "".join(f"<td {st}>{esc(c)}</td>" for c, st in zip(row, style, strict=True)) + "</tr>"
                    for row in self.rows]  # fmt: skip
            out.append("</tbody></table>")
        out += [f"<p>{esc(s)}</p>" for s in (*self.table_notes, *self.notes)]
        out.append("</div>")
        return "\n".join(out)


def _split_statement(statement: str) -> tuple[str, str]:
    """("data", "education and salary") from "data:  education and salary"; ("", statement) when
    it has no short key before a colon."""
    key, sep, value = statement.partition(": ")
    return (key, value.strip()) if sep and len(key) <= 30 else ("", statement)


def htest_block(
    title: str, data: str, statistic: float, df: int, p: float, *, statistic_name: str = "G",
    null: str = "", alternative: str = "", effects: Sequence[str] = (), method: str = "",
    extra: Sequence[str] = (),
) -> Block:  # fmt: skip
    """R's ``print.htest`` layout: the title, ``data:  ...``, ``G = 7.532, df = 2, p-value =
    0.01553``, the null and alternative hypotheses in words, the effects (one line each, with
    their intervals), the method (one wrapped statement), then ``extra`` lines (m, keep, ...)."""
    lines = [
        f"data:  {data}",
        f"{statistic_name} = {sig(statistic)}, df = {df}, p-value = {p_value(p)}",
    ]
    if null:
        lines.append(f"null hypothesis: {null}")
    if alternative:
        lines.append(f"alternative hypothesis: {alternative}")
    lines += list(effects)
    if method:
        lines.append(f"method: {method}")
    return Block(title, lines=(*lines, *extra))


def coefficient_block(
    title: str, pairs: Sequence[tuple[str, str]], names: Sequence[str], coef: Sequence[float],
    standard_error: Sequence[float], z: Sequence[float], p: Sequence[float], low: Sequence[float],
    high: Sequence[float], level: float, flagged: Sequence[bool], notes: Sequence[str] = (),
) -> Block:  # fmt: skip
    """statsmodels' ``summary()`` layout: the title over a header block of ``pairs``, then the
    coefficient table (name, coef, std err, z, P>|z| (3 significant digits), the interval at
    ``level``). A flagged row
    (a coefficient the likelihood does not determine) keeps its coef and std err and reads
    ``not estimated`` instead of z, P>|z| and the interval."""
    lo_name, hi_name = interval_columns(level)
    header = ["", "coef", "std err", "z", "P>|z|", lo_name, hi_name]
    any_flag = any(flagged)
    if any_flag:
        header.append("")
    rows: list[list[str]] = []
    for name, c, s, zz, pp, lo, hi, flag in zip(names, coef, standard_error, z, p, low, high, flagged, strict=True):
        if flag:
            row = [name, fixed(c), fixed(s), "", "", "", "", NOT_ESTIMATED]
        else:
            row = [name, fixed(c), fixed(s), f"{zz:.3f}" if math.isfinite(zz) else sig(zz), p_value(pp, 3),
                   fixed(lo), fixed(hi)] + ([""] if any_flag else [])  # fmt: skip
        rows.append(row)
    align = "l" + "r" * 6 + ("l" if any_flag else "")
    return Block(title, pairs=tuple(pairs), header=tuple(header), rows=tuple(tuple(r) for r in rows), align=align,
                 table_notes=tuple(notes), ruled=True)  # fmt: skip
