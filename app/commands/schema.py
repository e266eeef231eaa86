"""``secure-release schema``: draft a curator's schema from its table, check a table against one.

The schema file (docs/own-data.md): ``{"curator": NAME, "id_column": "id", "attributes":
[{"name": ATTRIBUTE, "categories": [CATEGORY, ...]}, ...]}``; the category order fixes the codes.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from secure_release.api import CODEBOOK_WARNING, DRAFT_DEFAULT_BINS, draft_schema
from secure_release.curator.badrows import BadRowsError, bad_rows_to
from secure_release.frames import TableInputError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "schema",
        help="draft a curator's schema from its table, or check a table against a schema",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Examples:\n  secure-release schema draft alice.csv --curator alice --id-column id --out alice.json\n"
            "  secure-release schema check alice.csv alice.json\n\n" + CODEBOOK_WARNING
        ),
    )
    ssub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    d = ssub.add_parser("draft", help="print a DRAFT schema (categories must then come from a public codebook)")
    d.add_argument("data", type=_data_source, help="the curator's table: CSV with a header, or Parquet, or a "
                   "PostgreSQL database postgresql://[USER@]HOST[:PORT]/DB with --query")
    d.add_argument("--curator", required=True, help="the curator's name (its certificate name)")
    d.add_argument("--id-column", default="id", help="the id column (default: id)")
    d.add_argument("--attributes", help="comma-separated attribute columns (default: every other column)")
    d.add_argument("--out", type=Path, help="write the schema here (default: standard output)")
    d.add_argument(
        "--range",
        dest="binning",
        action=_InOrder,
        const="range",
        default=[],
        metavar="COLUMN=LOW:HIGH[:BINS]",
        help="bin a numeric column at equal-width bins of this PUBLIC range (repeat per column; a "
        "numeric column with many distinct values needs one: bins never come from the data); BINS, or "
        "a --bins right after this --range, is its own count of bins",
    )
    d.add_argument(
        "--bins",
        dest="binning",
        action=_InOrder,
        const="bins",
        type=int,
        metavar="N",
        help="a --bins right after a --range is that range's count of bins (--range age=17:42 --bins 5 "
        "--range affairs=0:60 --bins 3); a --bins before any --range is the count of every range "
        f"without its own (default: {DRAFT_DEFAULT_BINS}). Inner edges are the fewest decimals within "
        "1%% of a bin's width of the exact equal-width edges, or one more when that writes them exactly "
        "(0:1 at 3 bins: 0, 0.33, 0.67, 1; 17:42 at 4: 17, 23.25, 29.5, 35.75, 42)",
    )
    d.add_argument(
        "--missing-token",
        action="append",
        default=[],
        metavar="TOKEN",
        help='a cell text meaning "missing" (e.g. NA, ?; repeat): counted with empty cells under the '
        "missing label, never as a category",
    )
    d.add_argument(
        "--codebook",
        type=Path,
        help='a public codebook, JSON {"COLUMN": [CATEGORY, ...]}: its categories, in its order, for the '
        "columns it lists (default: the values in the data, in natural order, with a loud warning); the data "
        "is checked against it, and values outside it are summarised per column (exit 2)",
    )
    d.add_argument("--bad-rows", type=Path, metavar="FILE", help="with --codebook: write every cell outside the "
                   "codebook (line, column, value) to FILE, readable by you only (0600)")
    d.set_defaults(func=run_draft)
    c = ssub.add_parser("check", help="check a table against a schema; print its rows and alphabet")
    c.add_argument("data", type=_data_source, help="the curator's table: CSV or Parquet, or a directory or glob of "
                   "them, or a PostgreSQL database postgresql://[USER@]HOST[:PORT]/DB with --query")
    c.add_argument("schema", type=Path, help="the schema JSON file")
    for parser in (d, c):
        parser.add_argument("--query", help="SQL run on the data as a DuckDB database file or a postgresql:// "
                            "database: its result is the table")
        parser.add_argument("--data-password-file", type=Path, metavar="FILE", help="with a postgresql:// database: "
                            "the file whose first line is the role's password (default: libpq's ~/.pgpass, "
                            "PGPASSFILE, PGPASSWORD or a service file)")
    c.add_argument("--bad-rows", type=Path, metavar="FILE", help="if rows are refused, write every bad cell (file, "
                   "line, column, value, problem) to FILE, readable by you only (0600)")
    c.set_defaults(func=run_check)


def _data_source(text: str) -> Path | str:
    """The data argument: a path, or a ``postgresql://`` URL kept as text (a path folds its ``//``)."""
    from secure_release.curator.postgres import is_database_url

    return text if is_database_url(text) else Path(text)


def _database(args: argparse.Namespace) -> bool:
    """True if the data is a PostgreSQL database (then its URL and ``--query`` are checked and
    ``--data-password-file`` is named to the reader)."""
    from secure_release.curator.partitions import require_data
    from secure_release.curator.postgres import is_database_url, set_password_file

    if not is_database_url(args.data):
        return False
    require_data(args.data, "data", args.query)
    set_password_file(args.data_password_file)
    return True


def read_columns(path: Path) -> dict[str, list[str]] | Any:
    """A CSV file as {column: values} (or a Parquet file as a pyarrow Table)."""
    if path.suffix.lower() in (".parquet", ".pq"):
        from secure_release.frames import require

        return require("pyarrow.parquet").read_table(path)
    with path.open(newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.reader(fh) if r]  # a small table: the draft reads it whole
    if not rows:
        raise TableInputError(f"{path}: empty file; expected a header line")
    header = [h.strip() for h in rows[0]]
    bad = [i + 2 for i, r in enumerate(rows[1:]) if len(r) != len(header)]
    if bad:
        raise TableInputError(f"{path}: line(s) {bad[:10]} do not have {len(header)} fields")
    columns = list(zip(*rows[1:], strict=True)) if len(rows) > 1 else [() for _ in header]
    return {h: list(col) for h, col in zip(header, columns, strict=True)}


class _InOrder(argparse.Action):
    """Appends ``(const, value)`` to one list shared by --range and --bins, so that the order on
    the command line (which --bins follows which --range) survives parsing."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        setattr(namespace, self.dest, [*getattr(namespace, self.dest, []), (self.const, values)])


def _ranges(binning: list[tuple[str, Any]]) -> tuple[dict[str, tuple[float, float, int] | tuple[float, float]], int]:
    """The --range/--bins items, in command-line order, as ``(ranges, default_bins)`` for
    :func:`draft_schema`: ``COLUMN=LOW:HIGH:BINS`` or a --bins right after ``COLUMN=LOW:HIGH``
    gives that range its own count; a --bins before any --range is the default of the others."""
    ranges: dict[str, tuple[float, float, int] | tuple[float, float]] = {}
    default_bins: int | None = None
    last: str | None = None  # the column of the --range just before, while it takes a --bins
    for kind, value in binning:
        if kind == "bins":
            if last is not None:
                ranges[last] = (*ranges[last][:2], value)
            elif ranges:
                raise TableInputError(f"--bins {value}: the --range before it already has its count of bins "
                                      "(a --bins follows the --range it applies to, or comes before every --range)")
            elif default_bins is not None:
                raise TableInputError(f"--bins {value}: a second --bins before any --range (give one default)")
            else:
                default_bins = value
            last = None
            continue
        column, _, span = str(value).partition("=")
        parts = span.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError(span)
            low, high = float(parts[0]), float(parts[1])
            count = int(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise TableInputError(f"--range takes COLUMN=LOW:HIGH or COLUMN=LOW:HIGH:BINS (numbers; BINS a "
                                  f"whole number), got {value!r}") from None  # fmt: skip
        column = column.strip()
        if column in ranges:
            raise TableInputError(f"--range {column}: given twice")
        ranges[column] = (low, high) if count is None else (low, high, count)
        last = column if count is None else None
    if default_bins is not None and not ranges:
        raise TableInputError(f"--bins {default_bins} without any --range: bins are counted over a public range "
                              "(--range COLUMN=LOW:HIGH --bins N)")  # fmt: skip
    return ranges, DRAFT_DEFAULT_BINS if default_bins is None else default_bins


def run_draft(args: argparse.Namespace) -> int:
    from secure_release.infra.fileio import require_file

    attrs = [a.strip() for a in args.attributes.split(",") if a.strip()] if args.attributes else None
    ranges, default_bins = _ranges(args.binning)
    codebook = None
    if args.codebook is not None:
        try:
            codebook = json.loads(require_file(args.codebook, "--codebook").read_text(encoding="utf-8"))
        except ValueError as exc:
            raise TableInputError(f"--codebook {args.codebook}: not JSON {{COLUMN: [CATEGORY, ...]}} ({exc})") from None
        if not isinstance(codebook, dict) or not all(isinstance(v, list) for v in codebook.values()):
            raise TableInputError(f"--codebook {args.codebook}: expected JSON {{COLUMN: [CATEGORY, ...]}}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if _database(args):
            from secure_release.curator.postgres_read import query_table

            columns = query_table(str(args.data), args.query)
        else:
            columns = read_columns(require_file(args.data, "data"))
        schema = draft_schema(columns, args.curator, args.id_column, attrs,
                              warn=False, ranges=ranges, bins=default_bins, codebook=codebook,
                              missing_tokens=args.missing_token)  # fmt: skip
    for warning in caught:
        sys.stderr.write(f"warning: {warning.message}\n")
    if codebook:
        with bad_rows_to(args.bad_rows):
            data = args.data if _database(args) else require_file(args.data, "data")
            check_codebook(data, schema, list(codebook), args.query)
    text = json.dumps(schema, indent=1) + "\n"
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    from secure_release.mechanism.schema import attribute_from_dict

    sizes = " x ".join(str(attribute_from_dict(a).size) for a in schema["attributes"])
    from_data = [a["name"] for a in schema["attributes"] if "categories" in a and a["name"] not in (codebook or {})]
    if from_data:
        sys.stderr.write(f"\nWARNING: {CODEBOOK_WARNING}\n(categories of {from_data} read from {args.data})\n")
    sys.stderr.write(f"(alphabet {sizes})\n")
    return 0


def run_check(args: argparse.Namespace) -> int:
    from secure_release.curator.partitions import require_data
    from secure_release.curator.table import load_schema, read_table
    from secure_release.infra.fileio import require_file

    spec = load_schema(require_file(args.schema, "schema"))
    with bad_rows_to(args.bad_rows):
        data = args.data if _database(args) else require_data(args.data, "data")
        table = read_table(data, spec, query=args.query)
    s = spec.schema
    sizes = " x ".join(str(a.size) for a in s.attributes)
    print(f"{args.data}: {table.num_rows} rows match schema {s.name!r} (alphabet {sizes} = {s.alphabet_size})")
    for attribute in s.attributes:
        note = attribute.describe()
        if note:
            print(f"  {note}")
    return 0


class CodebookMismatchError(BadRowsError):
    """A column the codebook lists holds values outside the codebook's categories."""


def check_codebook(data: Path | str, schema: dict[str, Any], columns: list[str], query: str | None = None) -> None:
    """Read ``data`` as the curator will (the one cell rule) against the drafted ``schema``'s
    codebook ``columns``; :class:`CodebookMismatchError` summarises per column every value
    outside the codebook (ids are not checked here: ``schema check`` does)."""
    from secure_release.curator.table import TableSpec, read_table
    from secure_release.mechanism.schema import CuratorSchema, attribute_from_dict

    listed = [a for a in schema["attributes"] if a["name"] in columns]
    spec = TableSpec(CuratorSchema(schema["curator"], tuple(attribute_from_dict(a) for a in listed)),
                     schema["id_column"])  # fmt: skip
    try:
        read_table(data, spec, query=query, check_repeats=False)
    except BadRowsError as exc:
        cells = [c for c in exc.cells if c.column in columns]
        if not cells:
            return
        lines = sorted({(c.file or "", c.line) for c in cells})
        problems = [(line, f"value(s) outside the codebook in {sorted({c.column for c in cells if c.line == line})}")
                    for _, line in lines]  # fmt: skip
        files = [file for file, _ in lines] if any(file for file, _ in lines) else None
        allowed = {a.name: a.categories for a in spec.schema.attributes}
        raise CodebookMismatchError(str(data), problems, files, cells, allowed) from None
