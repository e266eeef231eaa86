"""``secure-release plan``: the public parameters and predicted utility of one release."""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

from secure_release import display
from secure_release.infra.designfile import write_design
from secure_release.mechanism.analysis.power import PowerPlan, power_plan
from secure_release.mechanism.analysis.suggest import (
    DEFAULT_LIMIT,
    MAX_SUGGESTED_EPSILON,
    Figures,
    PairPowerView,
    SuggestionReport,
    pair_power_view,
    suggest_changes,
    suggest_for_alphabets,
)
from secure_release.mechanism.errors import SecureReleaseError
from secure_release.mechanism.privacy.guarantee import plan_report, privacy_guarantee, utility_check
from secure_release.mechanism.privacy.plan import plan_release
from secure_release.mechanism.schema import CuratorSchema


class PlanFlagsError(SecureReleaseError):
    """Flags of ``secure-release plan`` that do not go together, or a --suggest without what it
    needs (exit 2, naming the flags)."""


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


def _pair(text: str) -> tuple[str, str]:
    names = [part.strip() for part in text.split(",")]
    if len(names) != 2 or not all(names):
        raise argparse.ArgumentTypeError(f"--power takes two attribute names separated by a comma (A,B), got {text!r}")
    return names[0], names[1]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="print the plan of a release: m*, gamma, predicted error, bounds and the guarantee",
        description=textwrap.fill(
            "Compute the release plan. gamma follows from epsilon and the sampling fraction m/n "
            "(Eq. 2: gamma = 1 + (n/m)(e^eps - 1)); m defaults to the paper's m* (Cor. 3.6) "
            "rounded "
            "into [1, n]. predicted_rmse is the exact root-mean-squared l2 error of the A^-1 "
            "estimate, worst case over the data (sum of squared cell shares = 1/K); bound is "
            "Thm 3.4's (c sqrt K + 1)/sqrt m and bound_tight the paper's (c + 1)/sqrt m. --suggest lists "
            "instead what to give up (attributes, bins, categories) when that error is mostly noise. "
            "--question (repeatable) designs instead a release for the researcher's questions: tables of the "
            "attributes the questions need, each from its own disjoint sample m_t with its own gamma_t under the "
            "one epsilon (Eq. T1, docs/privacy.md), printed beside the whole joint with each question's smallest "
            "detectable Cramer's V (and its power at --at-v); --out writes the design file every curator runs. "
            "A question the n records cannot answer exits 2 with the design's advice.",
            78,
        ),
        epilog="Examples:\n  secure-release plan --n 45222 --alphabet 6,4 --epsilon 0.5 --json\n"
        "  secure-release plan --n 300 --schema alice.json --schema bob.json --epsilon 1 --suggest\n"
        "  secure-release plan --n 300 --schema alice.json --schema bob.json --epsilon 1 --suggest --target 0.01\n"
        "  secure-release plan --n 45222 --schema alice.json --schema bob.json --epsilon 0.5 --power education,sex\n"
        '  secure-release plan --n 45222 --schema alice.json --schema bob.json --epsilon 1 \\\n'
        '      --question "salary ~ education | sex" --question "marital ~ sex" --at-v 0.1 --out design.json\n'
        '      # a release designed for two questions: its tables, m_t, gamma_t, each question\'s detectable V\n'
        '  secure-release plan --n 45222 --schema alice.json --schema bob.json --epsilon 1 \\\n'
        '      --question "salary ~ education + sex" --marginals shares.json --json\n'
        '      # shares.json: public expected shares, e.g. {"sex": [0.48, 0.52]}',
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    p.add_argument(
        "--suggest",
        action="store_true",
        help="instead of the plan, list the smallest changes of the --schema files (drop an attribute, merge "
        "adjacent bins, merge categories into a schema's public \"groups\") whose plan meets --target, "
        "sorted by what they keep, and the epsilon that would meet it with the schemas unchanged (with "
        "--alphabet alone: only that epsilon); public inputs only, never the data. Figures at m = m*, as "
        "`plan` prints them on the changed schemas",
    )
    p.add_argument(
        "--target",
        type=float,
        default=None,
        metavar="RMSE",
        help="with --suggest: the per-cell RMSE to meet, a number > 0 such as 0.01 (default: half the typical "
        "cell share, 1/(2K) of each changed K)",
    )
    p.add_argument(
        "--max-suggestions",
        type=int,
        default=None,
        metavar="N",
        help=f"with --suggest: list at most N suggestions (default: {DEFAULT_LIMIT}; the rest are counted)",
    )
    p.add_argument(
        "--power",
        type=_pair,
        default=None,
        metavar="A,B",
        help="also print the power of the researcher's likelihood-ratio test of independence of attributes A and B "
        "(names from the --schema files): the smallest Cramer's V it detects with probability 0.8 at level 0.05, at "
        "m, at the m that maximises it and at m*, assuming uniform marginals; with --suggest, that V for every "
        "suggestion. Public inputs only",
    )
    p.add_argument(
        "--question",
        action="append",
        default=[],
        metavar="Q",
        help="design the release for this question (repeatable): 'A ~ B' (is A associated with B?), "
        "'A ~ B | C + D' (given C and D) or 'Y ~ X1 + X2' (a model), names from the --schema files. Prints the "
        "tables, each table's disjoint sample m_t and gamma_t under the one --epsilon (Eq. T1, docs/privacy.md) and "
        "each question's detectable Cramer's V beside the whole joint's; --out writes the design file every curator "
        "runs with (secure-release-curator run --design FILE)",
    )
    p.add_argument("--marginals", type=Path, default=None, metavar="FILE",
                   help="with --question: public expected shares per attribute, JSON {attribute: [share, ...]} "
                   "(a census, a codebook); the power is then planned for them instead of uniform shares")  # fmt: skip
    p.add_argument("--at-v", type=float, default=None, metavar="V",
                   help="with --question: also print each question's power at this Cramer's V")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, metavar="FILE", help="with --question: write the design here")
    p.set_defaults(func=run)


class QuestionsNeedMoreError(SecureReleaseError):
    """``plan --question``: some question gets no useful power from the n records at this epsilon
    (its detectable Cramer's V is above the design's limit); the design's advice (more epsilon,
    coarser attributes, or dropping the question) is printed, and no design file is written."""


class MarginalsFileError(SecureReleaseError):
    """``plan --marginals FILE`` is not a JSON object of attribute names to lists of shares."""


def read_marginals(path: Path) -> dict[str, list[float]]:
    """``--marginals FILE``: JSON ``{attribute: [share, ...]}``, one share a level in the schema's
    code order (the design checks the names, counts and sums)."""
    from secure_release.infra.fileio import require_file

    try:
        data = json.loads(require_file(path, "--marginals").read_text(encoding="utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise MarginalsFileError(f"--marginals {path}: not JSON ({exc}); give {{attribute: [share, ...]}}") from None
    ok = isinstance(data, dict) and all(
        isinstance(v, list) and v and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
        for v in data.values()
    )
    if not ok:
        raise MarginalsFileError(f"--marginals {path}: give a JSON object {{attribute: [share, ...]}} with one number "
                                 'a level, e.g. {"sex": [0.48, 0.52]}')  # fmt: skip
    return {str(k): [float(x) for x in v] for k, v in data.items()}


def run_design(args: argparse.Namespace, schemas: list[CuratorSchema]) -> int:
    """``plan --question``: the release designed for the questions (``mechanism.analysis.design``):
    printed (or ``--json``), written to ``--out``; a question with no useful power exits 2
    (:class:`QuestionsNeedMoreError`) after the design and its advice are printed."""
    from secure_release.commands.analyst import check_output
    from secure_release.mechanism.analysis.design import design

    if len(schemas) < 2 or args.alphabet or args.suggest or args.m is not None or args.power is not None:
        raise PlanFlagsError("--question takes one --schema FILE per curator (two or more), and no --alphabet, "
                             "--suggest, --power or --m (the design chooses each table's m and plans each "
                             "question's power)")  # fmt: skip
    if args.out is not None:
        check_output(args.out, "--out")
    marginals = None if args.marginals is None else read_marginals(args.marginals)
    d = design(args.n, schemas, args.epsilon, args.question, marginals, at_v=args.at_v)
    weak = [(i, f) for i, f in enumerate(d.release.figures, start=1) if f.advice]
    if args.json:
        print(json.dumps({**d.to_dict(), "digest": d.digest()}, allow_nan=False))
    else:
        print(d)
    if weak:
        named = ", ".join(f"Q{i} {f.question!r}" for i, f in weak)
        raise QuestionsNeedMoreError(
            f"{named} get(s) no useful power from n = {d.n} records at epsilon {d.epsilon:g} (detectable Cramer's V "
            f"above {d.max_useful_v:g} or the table's largest): the design's advice is printed with it (more epsilon, "
            "coarser attributes, or drop the question); no design file written"
        )
    if args.out is not None:
        write_design(d, args.out)
        message = (f"wrote {args.out} (design {d.digest()[:16]}): every curator runs it "
                   f"(secure-release-curator run ... --design {args.out})")  # fmt: skip
        print(message, file=sys.stderr if args.json else sys.stdout)
    return 0


def run(args: argparse.Namespace) -> int:
    from secure_release.curator.table import load_schema
    from secure_release.infra.fileio import require_file

    if not args.suggest and (args.target is not None or args.max_suggestions is not None):
        raise PlanFlagsError("--target and --max-suggestions go with --suggest (without it, plan prints the plan)")
    specs = [load_schema(require_file(path, "--schema")) for path in args.schema]
    schemas = [spec.schema for spec in specs]
    if args.question:
        return run_design(args, schemas)
    if args.marginals is not None or args.at_v is not None or args.out is not None:
        raise PlanFlagsError("--marginals, --at-v and --out go with --question")
    if args.power is not None and (args.alphabet or not schemas):
        raise PlanFlagsError("--power A,B names attributes of the --schema files: give one --schema FILE per curator "
                             f"{'instead of' if args.alphabet else 'with'} --alphabet (alphabet sizes carry no "
                             "attribute names)")  # fmt: skip
    if args.suggest:
        return run_suggest(args, schemas, [spec.id_column for spec in specs])
    alphabet = args.alphabet or [s.alphabet_size for s in schemas]
    if len(alphabet) < 2:
        raise PlanFlagsError("give --alphabet SIZES or one --schema FILE per curator (two or more)")
    preprocessing = [d for s in schemas for d in (a.describe() for a in s.attributes) if d]
    plan = plan_release(args.n, alphabet, args.epsilon, args.m)
    report = plan_report(plan)
    if preprocessing:
        report["guarantee"] = privacy_guarantee(plan, preprocessing)
    utility = utility_check(plan)
    pair = None
    if args.power is not None:
        pair = power_plan(args.n, schemas, args.epsilon, args.power[0], args.power[1], m=args.m)
    if args.json:
        extra = {} if pair is None else {"power": pair.to_dict()}
        print(json.dumps({**report, "utility": utility, **extra}, sort_keys=True))
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
    if pair is not None:
        print("\n" + "\n".join(power_lines(pair)))
    return 0


def _v(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else "none (no table is dependent enough)"


def power_lines(pair: PowerPlan) -> list[str]:
    """The ``plan --power`` block."""
    (a, b), (n_i, n_j) = pair.attributes, pair.levels
    rows = [(f"at m = {pair.m}" + (" (m*)" if pair.m == pair.m_star else "") + f", a = {pair.keep:.3g}",
             pair.min_detectable_cramers_v, pair.method)]  # fmt: skip
    if pair.best_m != pair.m:
        rows.append((f"at best m = {pair.best_m}, a = {pair.best_keep:.3g}", pair.min_detectable_cramers_v_at_best_m,
                     pair.method_at_best_m))  # fmt: skip
    if pair.m_star not in (pair.m, pair.best_m):
        rows.append((f"at m* = {pair.m_star}", pair.min_detectable_cramers_v_at_m_star, pair.method_at_m_star))
    width = max(len(r[0]) for r in rows)
    lines = [
        f"Power: likelihood-ratio test of independence of {a} x {b} ({n_i} x {n_j} levels, df = {pair.df})",
        f"smallest Cramer's V detected with probability {pair.power:g} at level {pair.alpha:g}; assumes "
        f"{pair.assumption}",
        *(f"  {label:<{width}}  V = {_v(v)}  ({how})" for label, v, how in rows),
    ]
    if math.isfinite(pair.ratio_m_star_to_best_m) and pair.best_m != pair.m_star:
        lines.append(f"  V at m* / V at best m = {pair.ratio_m_star_to_best_m:.4f}")
    return lines + textwrap.wrap(pair.note, 100, initial_indent="  ", subsequent_indent="  ")


def run_suggest(args: argparse.Namespace, schemas: list[CuratorSchema], id_columns: list[str]) -> int:
    """``plan --suggest``: :func:`mechanism.analysis.suggest.suggest_changes` on the --schema files."""
    if schemas and args.alphabet:
        raise PlanFlagsError("--suggest takes the --schema files or --alphabet, not both (the schemas give the "
                             "alphabets; --alphabet alone suggests only an epsilon)")  # fmt: skip
    if len(schemas) < 2 and not args.alphabet:
        raise PlanFlagsError(f"--suggest needs one --schema FILE per curator, two or more (got {len(schemas)}): "
                             "it changes their attributes; with --alphabet SIZES alone only an epsilon is "
                             "suggested")  # fmt: skip
    if args.m is not None:
        raise PlanFlagsError("--suggest gives the figures at m = m* (what plan uses by default); drop --m")
    if args.max_suggestions is not None and args.max_suggestions < 1:
        raise PlanFlagsError(f"--max-suggestions must be >= 1, got {args.max_suggestions}")
    if args.alphabet:
        report = suggest_for_alphabets(args.alphabet, args.n, args.epsilon, args.target)
    else:
        limit = DEFAULT_LIMIT if args.max_suggestions is None else args.max_suggestions
        report = suggest_changes(schemas, args.n, args.epsilon, args.target, limit)
    view = None if args.power is None else pair_power_view(schemas, report, args.power[0], args.power[1])
    if args.json:
        out = report.to_dict()
        for suggestion in out["suggestions"]:
            for schema, id_column in zip(suggestion["schemas"], id_columns, strict=True):
                schema["id_column"] = id_column
        if view is not None:
            out["power"] = view.current.to_dict()
            for suggestion, pair in zip(out["suggestions"], view.suggestions, strict=True):
                suggestion["power"] = None if pair is None else pair.to_dict()
        print(json.dumps(out, sort_keys=True))
        return 0
    print("\n".join(suggestion_lines(report, view)))
    return 0


def _figures_text(f: Figures) -> str:
    return (f"alphabets {' x '.join(str(k) for k in f.alphabet_sizes)} (K = {f.K}), m = {f.m} (m*): per-cell RMSE "
            f"{f.predicted_rmse_per_cell:.3g} {'<=' if f.meets_target else '>'} target {f.target:.3g}")  # fmt: skip


def _pair_text(pair: PowerPlan | None, view: PairPowerView) -> str:
    a, b = view.attributes
    if pair is None:
        return f"{a} x {b}: not testable (drops one of them)"
    now = view.current.min_detectable_cramers_v
    change = "" if pair.levels == view.current.levels else f", levels {pair.levels[0]} x {pair.levels[1]}"
    ratio = pair.min_detectable_cramers_v / now if math.isfinite(now) and math.isfinite(pair.min_detectable_cramers_v) \
        else math.nan  # fmt: skip
    versus = f", {ratio:.2f} x now" if math.isfinite(ratio) and pair is not view.current else ""
    same = " (one curator holds both)" if pair.same_curator else ""
    return f"{a} x {b}{same}: detectable Cramer's V {_v(pair.min_detectable_cramers_v)} at m = {pair.m}{change}{versus}"


def suggestion_lines(report: SuggestionReport, view: PairPowerView | None = None) -> list[str]:
    """The text of ``plan --suggest`` (with ``view``: the --power pair's detectable V now and
    after each suggestion)."""
    target = "half the typical share, 1/(2K)" if report.target is None else f"{report.target:g}"
    lines = [
        f"n = {report.n}, epsilon = {report.epsilon:g}; target: per-cell RMSE <= {target}",
        f"now: {_figures_text(report.current)}",
    ]
    if view is not None:
        lines.append(f"     {_pair_text(view.current, view)} (power {view.current.power:g}, level "
                     f"{view.current.alpha:g}, {view.current.assumption})")  # fmt: skip
    if report.current.meets_target:
        return [*lines, "The schemas meet the target as they are: nothing to give up."]
    if report.grid_size == 0:
        lines += ["", "Only alphabet sizes given: give the --schema files to search for attribute drops and merges."]
    elif report.suggestions:
        lines += ["", "Smallest changes that meet the target, most attributes then most cells kept first",
                  "(the figures are those `plan` prints on the changed schemas):"]
    else:
        lines += ["", "No change of the schemas (drops, bin merges, group merges) meets the target."]
    for rank, suggestion in enumerate(report.suggestions, 1):
        lines.append(f"{rank:>2}. {_figures_text(suggestion.figures)}")
        lines.append(f"    keeps {', '.join(suggestion.keeps)}")
        lines += [f"    gives up {item}" for item in suggestion.gives_up]
        if view is not None:
            lines.append(f"    {_pair_text(view.suggestions[rank - 1], view)}")
    if report.omitted:
        lines.append(f"... and {report.omitted} more (--max-suggestions)")
    lines.append("")
    found = report.epsilon_unchanged
    if found is None:
        lines.append(f"Unchanged schemas: no epsilon <= {MAX_SUGGESTED_EPSILON:g} meets the target.")
    else:
        lines.append(f"Unchanged schemas: epsilon = {found.epsilon:g} would meet it, at m = {found.m} (m*): per-cell "
                     f"RMSE {found.predicted_rmse_per_cell:.3g} <= target {found.target:.3g}.")  # fmt: skip
    if report.grid_size == 0:
        return lines
    thinned = f"; bin merges thinned for {', '.join(report.thinned)}" if report.thinned else ""
    lines.append(f"(searched {report.grid_size} combinations: per attribute keep, merge into its groups, merge "
                 f"adjacent bins or drop;")  # fmt: skip
    lines.append(f" every curator keeps an attribute{thinned})")
    return lines
