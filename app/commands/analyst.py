"""``secure-release analyst``: read estimates from a researcher service with an analyst certificate.

The researcher serves them only to analysts it names (``--analyst NAME`` on
``secure-release-researcher serve``); the client only talks to a peer with a researcher
certificate from the project CA.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from secure_release import display
from secure_release.api import Result, _result, result_from_tables
from secure_release.frames import TableInputError
from secure_release.mechanism.errors import MultiTableResultError, SecureReleaseError
from secure_release.mechanism.estimation.report import COLUMN_MEANINGS, TablesReport

_CONN = "--researcher 127.0.0.1:7200 --certs certs/analyst --name analyst"
EPILOG = (
    "Examples:\n"
    f"  secure-release analyst list {_CONN}\n"
    f"  secure-release analyst show r1 {_CONN}\n"
    f"  secure-release analyst marginal r1 education --plot education.png {_CONN}\n"
    f"  secure-release analyst conditional r1 --target salary --given education {_CONN}\n"
    f"  secure-release analyst export r1 r1.parquet {_CONN}\n"
    f"  secure-release analyst test r1 --between education --and salary --given sex {_CONN}\n"
    f"  secure-release analyst associations r1 {_CONN}\n"
    f"  secure-release analyst report r1 --out r1.html {_CONN}\n"
    f"  secure-release analyst questions r1 {_CONN}   # a release designed for questions\n"
    "  secure-release analyst questions results/r1.json --json   # a result file the researcher wrote\n"
)


#: What ``analyst export`` writes, by the file's suffix.
EXPORT_FORMATS = {".csv": "csv", ".json": "json", ".parquet": "parquet", ".pq": "parquet"}
_COLUMNS_HELP = "Columns of each cell, after its attribute labels:\n" + "".join(
    textwrap.fill(text, 96, initial_indent=f"  {name:<9} ", subsequent_indent=" " * 12) + "\n"
    for name, text in COLUMN_MEANINGS.items()
)
REPORT_HELP = (
    "Write one self-contained HTML page of a release, to open offline or send: the headline\n"
    "summary and every warning, a bar chart per attribute (the estimate with its 95% interval) and a\n"
    "heat map per pair of attributes, the guarantee, the plan, then the cells. No script, nothing\n"
    "fetched; prints on A4. Needs matplotlib (pip install 'secure-release[plot]').\n\n"
    "The page goes to --out exactly (its directory must exist; an old file is replaced whole).\n\n" + _COLUMNS_HELP
)
EXPORT_HELP = (
    "Write the release's cells to FILE, one row per cell, in the format its suffix names:\n"
    "  .csv              the labels and the columns below\n"
    "  .json             the whole result: cells, plan, guarantee, warnings, what each column means\n"
    "  .parquet (.pq)    the columns below and ci_spans_zero; the guarantee in the file's metadata\n"
    "FILE is written where it names (its directory must exist; an old file is replaced whole).\n\n" + _COLUMNS_HELP
)


TEST_HELP = (
    "Test whether attributes A and B are associated in the population the release sampled, within\n"
    "every level of C if --given names it. A, B and C may come from any curators. The test is a\n"
    "likelihood-ratio test of the perturbed counts (the PRAM channel and the sample size are in the\n"
    "model), its null fitted by EM; at small m, where the chi-square approximation fails, the p-value\n"
    "comes from a seeded parametric bootstrap, and the output says which. Then the effect sizes of A\n"
    "and B with 95% intervals: Cramer's V, the mutual information, and for two binary attributes the\n"
    "odds ratio and the risk difference, for two binned numbers Kendall's tau-b.\n\n"
    "A chi-square test on the estimate or on the observed counts ignores the noise: do not use one.\n"
    "This reads only the released counts: it spends no privacy budget. docs/analysis.md has the\n"
    "methods and their calibration."
)
QUESTIONS_HELP = (
    "Answer every question of a release designed for them (secure-release plan --question; every curator\n"
    "ran the design with --design FILE), each from the table of the release that holds its attributes:\n"
    "  A ~ B, A ~ B | C + D   the likelihood-ratio test of independence (within every level of C, D) and\n"
    "                        Cramer's V of A and B with its 95% interval\n"
    "  Y ~ X1 + X2           a binary Y: the logistic deviance test of X1 given X2 and the coefficients;\n"
    "                        more levels: the planned test of independence of Y and X1 given X2 (said so)\n"
    "beside what the design planned: the smallest Cramer's V each test detects and its power at the\n"
    "design's V. R is a result file or the release's id at --researcher. A release of the whole joint\n"
    "has no design: exit 2 (ask it with `analyst test`). Spends no privacy budget."
)
ASSOCIATIONS_HELP = (
    "Test every pair of attributes held by different curators, as `analyst test` does, with raw and\n"
    "Holm-adjusted p-values (the family-wise error over all pairs stays under alpha) and Cramer's V\n"
    "with its 95% interval, sorted by the adjusted p-value. Spends no privacy budget."
)


class OutputPathError(SecureReleaseError):
    """The file to write cannot be written as named: its directory is missing, it is a directory,
    or its suffix names no format (usage: exit 2, checked before anything is fetched)."""


def check_output(path: Path, flag: str, suffixes: tuple[str, ...] = ()) -> Path:
    """``path`` if a file can be written there (and, with ``suffixes``, ends in one of them);
    else :class:`OutputPathError` naming ``flag`` and the path as typed."""
    if suffixes and path.suffix.lower() not in suffixes:
        raise OutputPathError(f"{flag} {path}: the suffix names the format; use one of {', '.join(suffixes)}")
    if path.is_dir():
        raise OutputPathError(f"{flag} {path}: is a directory; name the file to write")
    parent = path.parent
    if not parent.is_dir():
        problem = "is not a directory" if parent.exists() else "does not exist"
        raise OutputPathError(f"{flag} {path}: the directory {parent} {problem}; create it first")
    return path


def _connection(p: argparse.ArgumentParser, required: bool = True) -> None:
    where = "" if required else " (not needed when R is a result file)"
    p.add_argument("--researcher", required=required, help=f"HOST:PORT of the researcher service{where}")
    p.add_argument("--certs", type=Path, help="directory with ca.pem, NAME.pem, NAME.key")
    p.add_argument("--name", default="analyst", help="this analyst's certificate name (default: analyst)")
    p.add_argument("--insecure", action="store_true", help="plaintext gRPC (test deployments only)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the estimate")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "analyst", help="list releases, show an estimate, marginal or conditional tables, test associations, export",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    asub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    lst = asub.add_parser("list", help="the releases the researcher has estimated", epilog=EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _connection(lst)
    lst.set_defaults(func=run_list)
    show = asub.add_parser("show", help="the estimate with SEs, CIs, parameters and guarantee")
    show.add_argument("release_id")
    show.add_argument("--json", action="store_true", help="print the result as JSON")
    _connection(show)
    show.set_defaults(func=run_show)
    marg = asub.add_parser("marginal", help="the marginal of some attributes, with SEs and CIs")
    marg.add_argument("release_id")
    marg.add_argument("attributes", nargs="+", help="attribute names")
    marg.add_argument("--json", action="store_true", help="print JSON rows")
    marg.add_argument("--plot", type=Path, help="write a bar chart with 95%% CIs (PNG; one attribute; matplotlib)")
    _connection(marg)
    marg.set_defaults(func=run_marginal)
    cond = asub.add_parser("conditional", help="P(target | given) from the headline estimate, with 95% intervals")
    cond.add_argument("release_id")
    cond.add_argument("--target", required=True, help="comma-separated target attributes")
    cond.add_argument("--given", required=True, help="comma-separated conditioning attributes")
    cond.add_argument("--json", action="store_true", help="print JSON rows")
    _connection(cond)
    cond.set_defaults(func=run_conditional)
    tst = asub.add_parser(
        "test", help="is A associated with B (given C)? a calibrated test on the perturbed counts",
        description=TEST_HELP, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    tst.add_argument("release_id", help="the release's id (secure-release analyst list shows them)")
    tst.add_argument("--between", required=True, metavar="A", help="comma-separated attributes of one side")
    tst.add_argument("--and", dest="and_", required=True, metavar="B",
                     help="comma-separated attributes of the other side")  # fmt: skip
    tst.add_argument("--given", default="", metavar="C", help="comma-separated attributes to stratify by (optional)")
    tst.add_argument("--method", choices=("auto", "bootstrap", "chi2"), default="auto",
                     help="how the p-value is made (default auto: a parametric bootstrap unless the "
                     "chi-square approximation is trustworthy)")  # fmt: skip
    tst.add_argument("--draws", type=int, default=999, help="bootstrap draws (default 999)")
    tst.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0: the same p each run)")
    tst.add_argument("--json", action="store_true", help="print the test and the effect sizes as JSON")
    _connection(tst)
    tst.set_defaults(func=run_test)
    assoc = asub.add_parser(
        "associations", help="test every pair of attributes held by different curators (Holm-adjusted)",
        description=ASSOCIATIONS_HELP, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    assoc.add_argument("release_id", help="the release's id (secure-release analyst list shows them)")
    assoc.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    assoc.add_argument("--json", action="store_true", help="print JSON rows")
    _connection(assoc)
    assoc.set_defaults(func=run_associations)
    rep = asub.add_parser(
        "report", help="write one self-contained HTML page to send (--out r.html; the plot extra)",
        description=REPORT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    rep.add_argument("release_id", help="the release's id (secure-release analyst list shows them)")
    rep.add_argument("--out", type=Path, required=True, help="the HTML file to write, e.g. r1.html")
    _connection(rep)
    rep.set_defaults(func=run_report)
    que = asub.add_parser(
        "questions", help="answer every question of a release designed for them (plan --question; --design)",
        description=QUESTIONS_HELP, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    que.add_argument("release_id", metavar="R",
                     help="a result file (the researcher's results/<release>.json, or Result.save's), or the "
                     "release's id to fetch from --researcher (secure-release analyst list shows them)")  # fmt: skip
    que.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0: the same p each run)")
    que.add_argument("--draws", type=int, default=999, help="bootstrap draws at most (default 999)")
    que.add_argument("--json", action="store_true", help="print the answers as JSON")
    _connection(que, required=False)
    que.set_defaults(func=run_questions)
    exp = asub.add_parser(
        "export", help="write the cells to FILE: .csv, .json or .parquet",
        description=EXPORT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    exp.add_argument("release_id", help="the release's id (secure-release analyst list shows them)")
    exp.add_argument("file", type=Path, help="the file to write; its suffix (.csv, .json, .parquet) names the format")
    _connection(exp)
    exp.set_defaults(func=run_export)

    from secure_release.commands.analyst_impute import register as register_impute

    register_impute(asub, _connection, load_or_fetch, check_output)


def fetch(args: argparse.Namespace) -> Result:
    """The release's estimate as an API :class:`Result`."""
    from secure_release.analyst import fetch_report

    report = fetch_report(args.researcher, args.certs, args.name, args.release_id, True, args.timeout, args.insecure)
    return result_from_tables(report) if isinstance(report, TablesReport) else _result(report)


def run_report(args: argparse.Namespace) -> int:
    """``analyst report ID --out r.html``: the headline and warnings, a chart per attribute and
    per pair, the guarantee, the plan and the cells in one self-contained HTML file (the data of
    ``show``; ``report_page``). Needs matplotlib (the ``plot`` extra) for the charts."""
    from secure_release import analysis
    from secure_release.infra.fileio import atomic_write
    from secure_release.report_page import html_report

    check_output(args.out, "--out")
    result = fetch(args)
    atomic_write(args.out, html_report(result).encode("utf-8"), 0o644)
    if result.designed:
        d = result.design
        asked = f"{analysis.counted(len(d.questions), 'question')} answered, " if d is not None else ""
        print(f"wrote {args.out} (release {args.release_id}: {asked}{analysis.counted(len(result.parts), 'table')})")
        return 0
    print(f"wrote {args.out} (release {args.release_id}: {len(result.report.labels)} cells, "
          f"{len(result.attributes)} marginal charts)")  # fmt: skip
    return 0


def run_questions(args: argparse.Namespace) -> int:
    """``analyst questions R``: the design's questions answered, each from its table (a release
    designed for questions only: a release of the whole joint exits 2, ``NoDesignError``)."""
    answers = load_or_fetch(args).questions(seed=args.seed, draws=args.draws)
    print(json.dumps(answers.to_dict(), allow_nan=False) if args.json else answers)
    return 0


class ResultSourceError(SecureReleaseError):
    """``analyst questions R``: R is no result file, and no --researcher was given to fetch a
    release of that id from."""


def load_or_fetch(args: argparse.Namespace) -> Result:
    """The Result ``args.release_id`` names: a result file (``api.load_result``: one table or a
    release of several) when one is there, else the release of that id from --researcher."""
    from secure_release.api import load_result

    path = Path(args.release_id)
    if path.is_file():
        return load_result(path)
    if args.researcher is None:
        raise ResultSourceError(f"{args.release_id!r} is no result file here, and no --researcher HOST:PORT was given "
                                "to fetch a release of that id from; give a file or --researcher")  # fmt: skip
    return fetch(args)


def run_list(args: argparse.Namespace) -> int:
    from secure_release.analyst import list_releases

    for rid in list_releases(args.researcher, args.certs, args.name, min(args.timeout, 60.0), args.insecure):
        print(rid)
    return 0


def run_show(args: argparse.Namespace) -> int:
    result = fetch(args)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(display.explain_tables(result) if result.designed else display.explain(result.report))
    return 0


def run_marginal(args: argparse.Namespace) -> int:
    result = fetch(args)
    t = result.marginal_table(*args.attributes)
    if args.json:
        rows = json_rows(result.marginal_columns(*args.attributes))
        print(json.dumps({"release_id": args.release_id, "attributes": list(t.attributes), "rows": rows}))
    else:
        print("\n".join(display.marginal_lines(t)))
    if args.plot is not None:
        _plot(result, args.attributes, args.plot)
    return 0


def _plot(result: Result, attributes: list[str], path: Path) -> None:
    if len(attributes) != 1:
        raise TableInputError(f"--plot draws one attribute's marginal; got {attributes}")
    from secure_release.frames import require

    plt = require("matplotlib")
    plt.use("Agg")
    ax = result.plot_marginal(attributes[0])
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=120)
    sys.stderr.write(f"wrote {path}\n")


def json_rows(columns: dict[str, Any]) -> list[dict[str, Any]]:
    """Columns of numpy arrays as JSON rows (keys in column order)."""
    values = [np.asarray(v).tolist() for v in columns.values()]
    return [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)]


def run_conditional(args: argparse.Namespace) -> int:
    result = fetch(args)
    target = [a.strip() for a in args.target.split(",") if a.strip()]
    given = [a.strip() for a in args.given.split(",") if a.strip()]
    cols = result.conditional_columns(target, given)
    if args.json:
        print(json.dumps({"release_id": args.release_id, "target": target, "given": given, "rows": json_rows(cols)}))
        return 0
    print(display.conditional_lines(cols, [*given, *target], f"P({','.join(target)} | {','.join(given)})"))
    return 0


def run_export(args: argparse.Namespace) -> int:
    """``analyst export ID FILE``: the cells in the format FILE's suffix names (EXPORT_HELP),
    written whole or not at all; the path is checked before anything is fetched."""
    from secure_release import analysis
    from secure_release.infra.fileio import atomic_write
    from secure_release.researcher.storage import report_csv

    kind = EXPORT_FORMATS[check_output(args.file, "FILE", tuple(EXPORT_FORMATS)).suffix.lower()]
    result = fetch(args)
    if result.designed and kind != "json":
        raise MultiTableResultError(
            f"release {args.release_id} is {analysis.counted(len(result.parts), 'table')} with different cells: "
            "export it as .json (every table, the design and the guarantee); a .csv or .parquet holds one table's cells"
        )
    if kind == "json":
        atomic_write(args.file, (json.dumps(result.to_dict(), indent=1) + "\n").encode("utf-8"), 0o644)
    elif kind == "csv":
        atomic_write(args.file, report_csv(result.report), 0o644)
    else:
        result.to_parquet(args.file)
    sys.stderr.write(f"wrote {args.file}\n")
    return 0


def _list(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]


def run_test(args: argparse.Namespace) -> int:
    """``analyst test ID --between A --and B [--given C]``: the test, then the effect sizes of A and B."""
    from secure_release import analysis

    result = fetch(args)
    a, b, given = _list(args.between), _list(args.and_), _list(args.given)
    test = result.test_independence(a, b, given or None, method=args.method, draws=args.draws, seed=args.seed)
    lines, effect = analysis.test_effect(result._route(a, b, given).report, a, b, given, method=args.method,
                                         draws=args.draws, seed=args.seed)  # fmt: skip
    if args.json:
        print(json.dumps({"release_id": args.release_id, "test": test.to_dict(), "association": effect}))
        return 0
    print("\n".join([*analysis.test_lines(test), "", *lines]))
    return 0


def run_associations(args: argparse.Namespace) -> int:
    """``analyst associations ID``: every cross-curator pair, sorted by the Holm-adjusted p."""
    from secure_release import analysis

    result = fetch(args)
    rows = result.association_rows(seed=args.seed)
    if args.json:
        print(json.dumps({"release_id": args.release_id, "adjustment": analysis.ADJUSTMENT,
                          "rows": [r.to_dict() for r in rows]}))  # fmt: skip
        return 0
    print("\n".join(analysis.associations_lines(rows)))
    return 0
