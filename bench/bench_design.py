"""A release designed for the researcher's questions against the whole joint at the same total
epsilon (mechanism/analysis/design.py): planned power, simulated power, and the design's speed.

Run:  .venv/bin/python bench/bench_design.py [--releases 400] [--quick] [--repeat 3] [--json out.json]

1. Planned. For each setting: the bundled Adult table (n = 45,222, K = 24: alice holds education x
   marital, bob sex x salary; app/demo_data.py) with "salary ~ education | sex" alone and with
   other questions, and synthetic schemas of two curators with K from 16 to 10^4 (n = 45,222), the
   design's tables (K_t and m_t) and its worst detectable Cramer's V (power 0.8, level 0.05,
   uniform marginals) beside the whole joint's (one table of every attribute, its power-best m),
   and their ratio.

2. Simulated. The rejection rate at level 0.05 of the researcher's test
   (mechanism.analysis.association.independence_test, chi-square p) of the first question, in
   ``--releases`` count-level releases (numpy seed 20261127; a simulation, never a release): the
   question's cells hold power.dependent_table at a true V in every stratum (uniform strata, the
   table's other attributes uniform), o ~ Multinomial(m_t, a_t p + (1 - a_t)/K_t) summed onto the
   question's cells, at the design's m_t and a_t and at the whole joint's; the true V at 0.5, 1
   and 2 times the design's detectable V (where a table reaches it). For Adult also the table's
   own shares (true V "adult"): its real association, through each release's channel.

3. Speed. design() for 10 attributes (5 a curator) and 5 questions, the best of ``--repeat``
   runs, each with power.py's cache cleared (a cold plan: the small-m simulations included);
   target at most 5 s. The reference, measured in the same run the same way: one
   power.power_plan call for a pair of the same schemas; the ratio says how many single-pair
   plans one design costs.

4. Calibration with public marginals (``--calibration-releases``, default 4,000 a point): the
   issue's table shape (n = 5,226, K = 128, epsilon 2, question "a0 ~ b0" of two binary
   attributes) planned with uniform shares and with 25/75 and 17/83 and 10/90 and 10/90; the
   type-I error under independence and the power at the planned detectable V (planned 0.8), each
   against its Monte Carlo SE (the suite's bounded version: tests/unit/test_design_calibration.py).

5. The release's run time: a designed release of the bundled Adult records (n = 45,222, the
   design for "salary ~ education | sex", two curators) in memory
   (mechanism.protocol.in_memory.run_tables_release) against the whole joint's release of the
   same records and n (run_release at the joint's m* ... and at the same total m), best of
   ``--repeat``; the ratio is the target (within 10%).

``--figure PATH`` draws the worst detectable V against epsilon on the bundled table, design
against whole joint (docs/figures/design_vs_joint.png).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release import demo_data
from secure_release.mechanism.analysis import power as pw
from secure_release.mechanism.analysis.association import independence_test
from secure_release.mechanism.analysis.design import Design, design
from secure_release.mechanism.analysis.questions import parse_question
from secure_release.mechanism.printing import table_lines
from secure_release.mechanism.schema import Attribute, CuratorSchema

SEED = 20261127
N = 45222


def att(name: str, k: int) -> Attribute:
    return Attribute(name, tuple(f"v{i}" for i in range(k)))


def two_curators(a: tuple[int, ...], b: tuple[int, ...]) -> list[CuratorSchema]:
    return [CuratorSchema("alice", tuple(att(f"a{i}", k) for i, k in enumerate(a))),
            CuratorSchema("bob", tuple(att(f"b{i}", k) for i, k in enumerate(b)))]  # fmt: skip


def adult() -> tuple[list[CuratorSchema], npt.NDArray[np.float64], list[str]]:
    """The bundled Adult table's schemas (two curators, as the demo splits it), its shares as an
    array over the attributes in file order, and those attributes' names."""
    names, cells, counts = demo_data.adult_cells()
    levels = [list(dict.fromkeys(c[j] for c in cells)) for j in range(len(names))]
    shares = np.zeros([len(x) for x in levels])
    for cell, count in zip(cells, counts, strict=True):
        shares[tuple(levels[j].index(v) for j, v in enumerate(cell))] += count
    by_name = {n: Attribute(n, tuple(x)) for n, x in zip(names, levels, strict=True)}
    curators = [CuratorSchema(c, tuple(by_name[a] for a in attrs))
                for c, attrs in zip(demo_data.CURATOR_NAMES, demo_data.ADULT_SPLITS[2], strict=False)]  # fmt: skip
    return curators, shares / shares.sum(), names


SETTINGS: list[tuple[str, Any, float, list[str]]] = [
    ("adult", None, 0.1, ["salary ~ education | sex"]),
    ("adult", None, 1.0, ["salary ~ education | sex"]),
    ("adult, 3 q", None, 1.0, ["salary ~ education | sex", "marital ~ sex", "salary ~ education + marital"]),
    ("K=16", ((2, 2), (2, 2)), 1.0, ["a0 ~ b0", "a1 ~ b1"]),
    ("K=128", ((2, 4, 2), (2, 2, 2)), 2.0, ["a0 ~ b0 | a2 + b1"]),
    ("K=216", ((3, 3, 3), (2, 2, 2)), 1.0, ["a0 ~ b0", "a1 ~ b1", "a2 ~ b2"]),
    ("K=1000", ((5, 5, 2), (5, 2, 2)), 1.0, ["a2 ~ b1", "a0 ~ b0 | b2"]),
    ("K=10^4", ((5, 5, 4), (5, 5, 4)), 1.0, ["a2 ~ b2", "a0 ~ b0 | a2"]),
]


def rejection_rate(
    d: Design, joint: bool, truth: npt.NDArray[np.float64] | float, releases: int, rng: np.random.Generator,
    adult_shares: tuple[npt.NDArray[np.float64], list[str]] | None = None,
) -> float:  # fmt: skip
    """The first question's rejection rate at 0.05 in ``releases`` count-level releases of its
    table (module text): ``truth`` a true V, or the Adult shares (then ``adult_shares``)."""
    release = d.whole_joint if joint else d.release
    figure = release.figures[0]
    table = release.tables[figure.table]
    a, b, given = parse_question(figure.question).tested
    levels = {x.name: x.size for s in d.schemas for x in s.attributes}
    shape = (levels[a], levels[b], math.prod(levels[g] for g in given))
    if adult_shares is None:
        cells = np.stack([pw.dependent_table(shape[0], shape[1], float(truth))] * shape[2], axis=-1) / shape[2]
    else:
        shares, names = adult_shares
        order = [names.index(x) for x in (a, b, *given)]
        rest = tuple(j for j in range(len(names)) if j not in order)
        cells = np.transpose(shares.sum(axis=rest) if rest else shares, np.argsort(np.argsort(order))).reshape(shape)
    rest_cells = table.joint_size // cells.size  # the table's other attributes: uniform, summed out below
    q = table.keep * np.repeat(cells.ravel() / rest_cells, rest_cells) + (1 - table.keep) / table.joint_size
    counts = rng.multinomial(table.m, q / q.sum(), size=releases).reshape(releases, cells.size, rest_cells).sum(axis=2)
    hits = [independence_test(o.reshape(shape), table.keep, method="chi2").p_value <= 0.05 for o in counts]
    return float(np.mean(hits))


def planned_and_simulated(releases: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(SEED)
    adult_schemas, adult_shares, adult_names = adult()
    for name, sizes, eps, questions in SETTINGS[::3] if quick else SETTINGS:
        s = adult_schemas if sizes is None else two_curators(*sizes)
        n = N
        d = design(n, s, eps, questions)
        v = d.release.figures[0].detectable_v
        row: dict[str, Any] = {
            "setting": name, "n": n, "epsilon": eps, "questions": questions,
            "K": d.whole_joint.tables[0].joint_size, "tables": [(t.joint_size, t.m) for t in d.release.tables],
            "joint_m": d.whole_joint.tables[0].m, "worst_v": d.release.worst_v, "joint_worst_v": d.whole_joint.worst_v,
            "epsilon_t1": d.release.epsilon, "epsilon_sequential": d.release.sequential_epsilon, "simulated": {},
        }  # fmt: skip
        figure = d.release.figures[0]
        a, b, _ = parse_question(figure.question).tested
        levels = {x.name: x.size for c in s for x in c.attributes}
        top = pw.max_uniform_cramers_v(levels[a], levels[b])
        for factor in (0.5, 1.0, 2.0):
            truth = factor * v
            if not math.isfinite(truth) or truth > top:
                continue
            row["simulated"][f"{factor:g}xV={truth:.3f}"] = (rejection_rate(d, False, truth, releases, rng),
                                                            rejection_rate(d, True, truth, releases, rng))  # fmt: skip
        if sizes is None:
            row["simulated"]["adult"] = tuple(rejection_rate(d, joint, 0.0, releases, rng, (adult_shares, adult_names))
                                              for joint in (False, True))  # fmt: skip
        rows.append(row)
    return rows


def speed(repeat: int) -> dict[str, float]:
    sizes = (2, 3, 4, 2, 3), (2, 5, 2, 3, 4)
    s = two_curators(*sizes)
    questions = ["a0 ~ b0", "a1 ~ b1 | a0", "a2 ~ b2 + b3", "a3 ~ b4", "a4 ~ b0 | a3"]

    def cold(fn: Any) -> float:
        best = math.inf
        for _ in range(repeat):
            pw.planned_min_detectable_cramers_v.cache_clear()
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        return best

    took = cold(lambda: design(20000, s, 1.0, questions))
    reference = cold(lambda: pw.power_plan(20000, s, 1.0, "a0", "b0"))
    return {"design_s": took, "power_plan_s": reference, "ratio": took / reference}


def calibration(releases: int) -> list[dict[str, Any]]:
    """Section 4: level and power of the first question's test with marginals (module text)."""
    rng = np.random.default_rng(SEED + 1)
    schemas = two_curators((2, 4, 4), (2, 2))
    out = []
    for name, marginals in (("uniform", None), ("25/75, 17/83", {"a0": [0.25, 0.75], "b0": [0.17, 0.83]}),
                            ("10/90, 10/90", {"a0": [0.1, 0.9], "b0": [0.1, 0.9]})):  # fmt: skip
        d = design(5226, schemas, 2.0, ["a0 ~ b0"], marginals=marginals)
        figure = d.release.figures[0]
        table = d.release.tables[figure.table]
        rows = np.array(marginals["a0"] if marginals else [0.5, 0.5])
        cols = np.array(marginals["b0"] if marginals else [0.5, 0.5])
        rates = []
        for v in (0.0, figure.detectable_v):
            delta = v * math.sqrt(rows.prod() * cols.prod())
            p = np.outer(rows, cols) + np.array([[delta, -delta], [-delta, delta]])
            other = table.joint_size // 4
            q = table.keep * np.repeat(p.ravel() / other, other) + (1 - table.keep) / table.joint_size
            counts = rng.multinomial(table.m, q / q.sum(), size=releases).reshape(releases, 4, other).sum(axis=2)
            rates.append(float(np.mean([independence_test(o.reshape(2, 2), table.keep, method="chi2").p_value <= 0.05
                                        for o in counts])))  # fmt: skip
        out.append({"marginals": name, "m": table.m, "keep": table.keep, "detectable_v": figure.detectable_v,
                    "level": rates[0], "level_se": math.sqrt(0.05 * 0.95 / releases), "power": rates[1],
                    "power_se": math.sqrt(rates[1] * (1 - rates[1]) / releases)})  # fmt: skip
    return out


def adult_records() -> tuple[list[Any], list[CuratorSchema]]:
    """The bundled Adult records as two in-memory curator tables (ids 0..n-1, as the demo)."""
    from secure_release.mechanism.protocol.in_memory import CuratorTable

    names, cells, counts = demo_data.adult_cells()
    rows = np.repeat(np.arange(len(cells)), counts)
    schemas, _, _ = adult()
    ids = np.array([f"r{i}" for i in range(rows.size)])
    tables = []
    for s in schemas:
        cols = {a.name: np.array([c[names.index(a.name)] for c in cells])[rows] for a in s.attributes}
        tables.append(CuratorTable(s, ids, cols))
    return tables, schemas


def run_time(repeat: int) -> dict[str, float]:
    """Section 5: a designed release against the whole joint's, same records, in memory."""
    from secure_release.mechanism.primitives.keys import AlignmentKey
    from secure_release.mechanism.protocol.in_memory import run_release, run_tables_release

    tables, schemas = adult_records()
    n = tables[0].num_rows
    d = design(n, schemas, 1.0, ["salary ~ education | sex"])
    planned = d.planned_tables()
    total = sum(m for _, m, _ in planned)
    key = AlignmentKey.generate()

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    designed = best(lambda: run_tables_release(tables, [a for a, _, _ in planned], [m for _, m, _ in planned],
                                               [g for _, _, g in planned], 1.0, d.digest(), d.n,
                                               alignment_key=key))  # fmt: skip
    joint = best(lambda: run_release(tables, 1.0, total, alignment_key=key))
    return {"n": n, "m": total, "designed_s": designed, "whole_joint_s": joint, "ratio": designed / joint}


def figure(path: str) -> list[dict[str, Any]]:
    """Worst detectable V against epsilon, design and whole joint: on the bundled table, and on
    the K = 128 shape of section 4 (n = 5,226)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schemas, _, _ = adult()
    cases = [("Adult, n = 45,222 (K = 24): salary ~ education | sex", N, schemas, "salary ~ education | sex"),
             ("n = 5,226, K = 128: a0 ~ b0", 5226, two_curators((2, 4, 4), (2, 2)), "a0 ~ b0")]  # fmt: skip
    epsilons = [0.1, 0.2, 0.5, 1.0, 2.0, 4.0]
    points: list[dict[str, Any]] = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (title, n, s, question) in zip(axes, cases, strict=True):
        mine = []
        for eps in epsilons:
            d = design(n, s, eps, [question])
            mine.append({"case": title, "epsilon": eps, "design": d.release.worst_v,
                         "whole_joint": d.whole_joint.worst_v})  # fmt: skip
        points += mine
        top = pw.max_uniform_cramers_v(2, 2)
        ax.plot(epsilons, [min(p["whole_joint"], top) for p in mine], "o-", label="whole joint")
        ax.plot(epsilons, [p["design"] for p in mine], "s-", label="designed: the question's table")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("epsilon (total)")
        ax.set_ylabel("detectable Cramer's V (power 0.8, level 0.05; 1: none)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return points


def finite(x: Any) -> Any:
    """``x`` with every non-finite float as None (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


def v_text(v: float) -> str:
    return f"{v:.3f}" if math.isfinite(v) else "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", type=int, default=400, help="simulated releases per point (default 400)")
    parser.add_argument("--quick", action="store_true", help="every third setting only")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many cold design() runs (default 3)")
    parser.add_argument("--json", help="write every figure as JSON here")
    parser.add_argument("--calibration-releases", type=int, default=4000,
                        help="simulated releases a point in section 4 (default 4000)")
    parser.add_argument("--figure", help="draw detectable V against epsilon on the bundled table here (PNG)")
    args = parser.parse_args()
    rows = planned_and_simulated(args.releases, args.quick)
    head = ("setting", "eps", "questions", "design tables (K_t: m_t)", "joint K: m", "V design", "V joint", "gain")
    body = [(r["setting"], f"{r['epsilon']:g}", "; ".join(r["questions"]),
             ", ".join(f"{k}: {m}" for k, m in r["tables"]), f"{r['K']}: {r['joint_m']}", v_text(r["worst_v"]),
             v_text(r["joint_worst_v"]),
             f"{r['joint_worst_v'] / r['worst_v']:.1f}x" if math.isfinite(r["joint_worst_v"]) else "joint: none")
            for r in rows]  # fmt: skip
    print("1. Planned: the worst question's detectable Cramer's V (power 0.8, level 0.05, uniform marginals)")
    print("\n".join(table_lines(head, body, "llllrrrr")))
    print(f"\n2. Simulated: rejection rate at 0.05 of the first question's test ({args.releases} releases a point; "
          f"binomial sd <= {0.5 / math.sqrt(args.releases):.3f})")  # fmt: skip
    body = [(r["setting"], f"{r['epsilon']:g}", r["questions"][0], point, f"{sim[0]:.3f}", f"{sim[1]:.3f}")
            for r in rows for point, sim in r["simulated"].items()]  # fmt: skip
    print("\n".join(table_lines(("setting", "eps", "question", "true V", "design", "joint"), body, "lllrrr")))
    timing = speed(args.repeat)
    flag = "" if timing["design_s"] <= 5.0 else "  <-- over the 5 s target"
    print(f"\n3. Speed: design() for 10 attributes and 5 questions: {timing['design_s']:.2f} s (target 5 s){flag}; "
          f"one power_plan call {timing['power_plan_s']:.3f} s; ratio {timing['ratio']:.1f}")  # fmt: skip
    cal = calibration(args.calibration_releases)
    print(f"\n4. Calibration with public marginals ({args.calibration_releases} releases a point): "
          "n = 5,226, K = 128, epsilon 2, a0 ~ b0")  # fmt: skip
    body = [(c["marginals"], str(c["m"]), f"{c['keep']:.3f}", f"{c['detectable_v']:.3f}",
             f"{c['level']:.4f} (SE {c['level_se']:.4f})", f"{c['power']:.3f} (SE {c['power_se']:.3f})",
             f"{c['power'] - 0.8:+.3f}") for c in cal]  # fmt: skip
    print("\n".join(table_lines(("marginals", "m_t", "keep", "planned V", "type-I at 0.05", "power at V (plan 0.8)",
                                  "power - plan"), body, "lrrrrrr")))  # fmt: skip
    took = run_time(args.repeat)
    print(f"\n5. Run time, in memory, Adult n = {took['n']}: designed release {took['designed_s']:.2f} s, whole "
          f"joint at the same m = {took['m']} {took['whole_joint_s']:.2f} s; ratio {took['ratio']:.2f} "
          "(target <= 1.10)")  # fmt: skip
    points = figure(args.figure) if args.figure else []
    if points:
        print(f"\nfigure: {args.figure}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(finite({"planned_and_simulated": rows, "speed": timing, "calibration": cal, "run_time": took,
                              "figure": points}), fh, indent=1, allow_nan=False)  # fmt: skip


if __name__ == "__main__":
    main()
