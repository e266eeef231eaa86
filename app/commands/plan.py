"""``secure-release plan``: the public parameters and predicted utility of one release."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from secure_release import display
from secure_release.mechanism.guarantee import plan_report, privacy_guarantee, utility_check
from secure_release.mechanism.plan import plan_release


def _alphabet(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--alphabet takes comma-separated integers >= 1 (one per curator), got {text!r}"
        ) from exc
    if len(sizes) < 2 or any(k < 1 for k in sizes):
        raise argparse.ArgumentTypeError(
            f"--alphabet needs at least two sizes >= 1 (one per curator), got {text!r}"
        )
    return sizes


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="print the plan of a release: m*, gamma, predicted error, bounds and the guarantee",
        description=(
            "Compute the release plan. gamma follows from epsilon and the sampling fraction m/n "
            "(Eq. 2: gamma = 1 + (n/m)(e^eps - 1)); m defaults to the paper's m* (Cor. 3.6) "
            "rounded "
            "into [1, n]. predicted_rmse is the exact root-mean-squared l2 error of the A^-1 "
            "estimate, worst case over the data (sum of squared cell shares = 1/K); bound is "
            "Thm 3.4's (c sqrt K + 1)/sqrt m and bound_tight the paper's (c + 1)/sqrt m."
        ),
        epilog="Example: secure-release plan --n 45222 --alphabet 6,4 --epsilon 0.5 --json",
    )
    p.add_argument("--n", type=int, required=True, help="number of aligned records (n >= 1)")
    p.add_argument(
        "--alphabet",
        type=_alphabet,
        help="alphabet size of each curator, comma separated (e.g. 6,4 gives K = 24; "
        "default: from the --schema files)",
    )
    p.add_argument(
        "--schema",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="a curator's schema JSON, once per curator in release order: gives the alphabet and "
        "states each attribute's bins, clamping and missing label in the guarantee",
    )
    p.add_argument("--epsilon", type=float, required=True, help="privacy level epsilon > 0")
    p.add_argument("--m", type=int, default=None, help="number of samples in [1, n] (default: m*)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from secure_release.curator.table import load_schema
    from secure_release.infra.fileio import require_file

    schemas = [load_schema(require_file(path, "--schema")).schema for path in args.schema]
    alphabet = args.alphabet or [s.alphabet_size for s in schemas]
    if len(alphabet) < 2:
        raise SystemExit("secure-release plan: give --alphabet SIZES or one --schema FILE per curator (two or more)")
    preprocessing = [d for s in schemas for d in (a.describe() for a in s.attributes) if d]
    plan = plan_release(args.n, alphabet, args.epsilon, args.m)
    report = plan_report(plan)
    if preprocessing:
        report["guarantee"] = privacy_guarantee(plan, preprocessing)
    utility = utility_check(plan)
    if args.json:
        print(json.dumps({**report, "utility": utility}, sort_keys=True))
        return 0
    rows = [
        ("records n", f"{plan.n}"),
        (
            "alphabets",
            " x ".join(str(k) for k in plan.alphabet_sizes) + f"  (K = {plan.joint_size})",
        ),
        ("epsilon", f"{plan.epsilon:g}"),
        ("samples m", f"{plan.m}" + ("  (m* rounded)" if args.m is None else "")),
        ("m* (Cor. 3.6)", f"{report['m_star']:.1f}"),
        ("m minimizing exact error", f"{report['m_min_error']}"),
        ("gamma (Eq. 2)", f"{plan.gamma:.6g}"),
        ("keep probability a", f"{report['keep_probability']:.6g}"),
        ("predicted RMSE (exact, worst case)", f"{report['predicted_rmse']:.4f}"),
        ("bound (Thm 3.4)", f"{report['bound']:.4f}"),
        ("bound, tightened (c+1)/sqrt m", f"{report['bound_tight']:.4f}"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("\nGuarantee:")
    print("\n".join(display.guarantee_lines(plan, preprocessing)))
    for line in display.warning_lines(plan):
        print("\n" + line)
    return 0
