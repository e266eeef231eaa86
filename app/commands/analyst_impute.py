"""``secure-release analyst impute`` and ``analyst fit``: multiply-imputed records of a release.

``impute ID --m M --out FILE`` writes the long format R's ``mice`` and Stata's ``mi`` read
(``.imp``, the attributes, ``count``; ``--rows``: ``.imp``, ``.id`` and the attributes, one row a
record); ``fit ID "y ~ x1 + x2" --family binomial`` fits the formula on every imputation with
statsmodels and prints the table pooled by Rubin's rules. ID is a result file or a release id at
``--researcher``. Post-processing of released counts: no privacy budget is spent.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

IMPUTE_FORMATS = {".csv": "csv", ".parquet": "parquet"}
_CONN = "--researcher 127.0.0.1:7200 --certs certs/analyst"
IMPUTE_EPILOG = (
    "Examples:\n"
    f"  secure-release analyst impute r1 --m 20 --out r1-imputed.csv {_CONN}\n"
    "  secure-release analyst impute result.json --m 20 --model 'y*x1 + y*x2 + x1*x2' --out imp.parquet\n"
    "  secure-release analyst impute result.json --m 5 --rows --out records.csv\n"
    "\nIn R (docs/analysis.md, 'In R and in Stata'; levels in the schema's order):\n"
    "  imp <- read.csv('imp.csv', colClasses = c(x1 = 'character', x2 = 'character', y = 'character'))\n"
    "  for (v in c('x1', 'x2', 'y')) imp[[v]] <- factor(imp[[v]], levels = c('0', '1'))\n"
    "  fits <- lapply(split(imp, imp$.imp), function(d) glm(y ~ x1 + x2, family = binomial, data = d,\n"
    "    weights = count, control = glm.control(epsilon = 1e-12, maxit = 100)))\n"
    "  m <- sum(imp$count[imp$.imp == 1]); summary(mice::pool(mice::as.mira(fits), dfcom = m - 3), conf.int = TRUE)"
)
FIT_EPILOG = (
    "Examples:\n"
    f"  secure-release analyst fit r1 'salary ~ education + sex' --family binomial {_CONN}\n"
    "  secure-release analyst fit result.json 'count ~ a*b + c' --family poisson --model 'a*b + c'\n"
    "  secure-release analyst fit result.json 'grade ~ x1 + x2' --family ordinal --m 40 --json"
)


def _common(p: argparse.ArgumentParser) -> None:
    from secure_release.imputation import DEFAULT_IMPUTATIONS

    p.add_argument("release_id", metavar="ID", help="a result file (api Result.save) or a release id at --researcher")
    p.add_argument("--m", dest="num_imputations", type=int, default=DEFAULT_IMPUTATIONS, metavar="M",
                   help=f"the number of imputations (default {DEFAULT_IMPUTATIONS}; at least 2)")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0: the same imputations each run)")
    p.add_argument("--model", default=None, metavar="TERMS",
                   help="impute under this log-linear model, e.g. 'y*x1 + y*x2 + x1*x2' (default: the saturated "
                        "joint, valid for every analysis but wider); choose one that contains your analysis")
    p.add_argument("--table", type=int, default=None, help="a designed release's table number (default: the one "
                   "holding the formula's attributes; impute: needed when there are several)")  # fmt: skip


def register(asub: Any, connection: Any, load: Any, check_output: Any) -> None:
    """Adds ``impute`` and ``fit`` to the ``analyst`` subparsers (``analyst.register`` passes its
    own helpers, so this module imports no other command): ``connection`` adds the
    researcher-connection flags (optional here: ID may be a file), ``load(args)`` gives the Result
    ID names, ``check_output(path, flag, suffixes)`` checks an output path before any work."""
    from secure_release.imputed_fits import FAMILIES

    imp = asub.add_parser("impute", help="M multiply-imputed copies of the released records, for R, Stata or Python",
                          epilog=IMPUTE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _common(imp)
    imp.add_argument("--out", type=Path, required=True, help="the file to write (.csv or .parquet)")
    imp.add_argument("--rows", action="store_true", help="one row a record (.imp, .id, attributes) instead of one row "
                     "a cell with its count")  # fmt: skip
    connection(imp, required=False)
    imp.set_defaults(func=run_impute, load=load, check_output=check_output)

    fit = asub.add_parser("fit", help="fit a statsmodels formula on every imputation, pooled by Rubin's rules",
                          epilog=FIT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _common(fit)
    fit.add_argument("formula", help="a statsmodels (patsy) formula over the table's attributes, e.g. 'y ~ x1 + x2'")
    fit.add_argument("--family", choices=FAMILIES, default="binomial", help="the model (default binomial: a logistic "
                     "model of a two-level outcome; poisson: a log-linear model of 'count'; ordinal: ordered logit)")
    fit.add_argument("--level", type=float, default=0.95, help="the intervals' level (default 0.95)")
    fit.add_argument("--drop-degenerate", action="store_true", help="pool without the imputations whose fit diverged "
                     "(named in the output) instead of refusing")  # fmt: skip
    fit.add_argument("--json", action="store_true", help="print the pooled table as JSON")
    connection(fit, required=False)
    fit.set_defaults(func=run_fit, load=load)


def _imputations(args: argparse.Namespace) -> Any:
    return args.load(args).impute(args.num_imputations, seed=args.seed, model=args.model)


def run_impute(args: argparse.Namespace) -> int:
    from secure_release.infra.fileio import atomic_write

    kind = IMPUTE_FORMATS[args.check_output(args.out, "--out", tuple(IMPUTE_FORMATS)).suffix.lower()]
    imputations = _imputations(args)
    frame = imputations.to_frame(table=args.table, rows=args.rows)
    if kind == "csv":
        atomic_write(args.out, frame.to_csv(index=False).encode("utf-8"), 0o644)
    else:
        import io

        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        atomic_write(args.out, buffer.getvalue(), 0o644)
    print(imputations)
    sys.stderr.write(f"wrote {args.out} ({len(frame)} rows: M = {args.num_imputations} imputations)\n")
    return 0


def run_fit(args: argparse.Namespace) -> int:
    pooled = _imputations(args).fit(args.formula, args.family, table=args.table, level=args.level,
                                    on_degenerate="drop" if args.drop_degenerate else "refuse")  # fmt: skip
    print(json.dumps(pooled.to_dict(), allow_nan=False) if args.json else pooled)
    return 0
