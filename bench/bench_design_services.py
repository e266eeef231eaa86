"""A designed release through the four services against the whole joint's release of the same
records and the same total m, same run (a script).

Run:  .venv/bin/python bench/bench_design_services.py [--rows 1000000] [--epsilon 1] [--rounds 3] [--json]

One synthetic Adult-shaped table of ``--rows`` rows (split between alice and bob as in
``secure-release demo``) is written once, with a project CA and each curator's budget. Then, in
``--rounds`` alternating rounds: (a) a release designed for "salary ~ education | sex" (every
curator runs the design file: ``--design``), (b) the whole joint at m = the design's total m, both
started exactly as ``secure-release demo`` starts them (secure_release.cluster.launch_release) and
timed from the first process started to the analyst's estimate received. The figure is the
median designed time over the median whole-joint time (target: at most 1.10); the machine is
shared and noisy, so only the same-run ratio means anything.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from secure_release.cluster import PARTIES, Cluster, get_estimate, launch_release, set_budgets  # noqa: E402
from secure_release.curator.table import load_schema  # noqa: E402
from secure_release.demo_data import write_demo_data  # noqa: E402
from secure_release.infra.designfile import write_design  # noqa: E402
from secure_release.infra.pki import init_pki  # noqa: E402
from secure_release.mechanism.analysis.design import design  # noqa: E402

QUESTION = "salary ~ education | sex"
CURATORS = ("alice", "bob")


def one_release(root: Path, tag: str, epsilon: float, m: int | None, extra: list[str]) -> float:
    """Seconds from the first process started to the estimate received."""
    work = root / tag
    work.mkdir()
    cluster = Cluster(work)
    set_budgets(cluster, {work / f"keystore-{c}": root / "data" / f"{c}.csv" for c in CURATORS}, 100.0,
                root / "certs")  # fmt: skip
    try:
        start = time.perf_counter()
        addrs = launch_release(cluster, root / "data", root / "certs", tag, epsilon, m, "chacha20",
                               root / "align.key", budgets=False,
                               curator_extra={c: extra for c in CURATORS})  # fmt: skip
        get_estimate(addrs["researcher"], root / "certs", tag, timeout=1800)
        return time.perf_counter() - start
    except Exception:
        sys.stderr.write(cluster.tails(15))
        raise
    finally:
        cluster.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the table (default 1,000,000)")
    p.add_argument("--epsilon", type=float, default=1.0, help="total epsilon (default 1)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-design-services-") as tmp:
        root = Path(tmp)
        info = write_demo_data(root / "data", args.rows)
        init_pki(root / "certs", PARTIES, force=True)
        (root / "align.key").write_text(secrets.token_hex(32))
        (root / "align.key").chmod(0o600)
        schemas = [load_schema(root / "data" / f"{c}.json").schema for c in CURATORS]
        d = design(int(info["n"]), schemas, args.epsilon, [QUESTION])
        write_design(d, root / "design.json")
        total = sum(t.m for t in d.release.tables)
        times: dict[str, list[float]] = {"designed": [], "whole_joint": []}
        for r in range(args.rounds):
            times["designed"].append(one_release(root, f"designed-{r}", args.epsilon, None,
                                                 ["--design", str(root / "design.json")]))  # fmt: skip
            times["whole_joint"].append(one_release(root, f"joint-{r}", args.epsilon, total, []))
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict[str, Any] = {"rows": args.rows, "epsilon": args.epsilon, "question": QUESTION, "m": total,
                           "tables": [(list(t.attributes), t.m) for t in d.release.tables], "seconds": times,
                           "median_s": med, "ratio": med["designed"] / med["whole_joint"], "target": 1.10}  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"n = {args.rows}, epsilon {args.epsilon:g}, design for {QUESTION!r}: tables {out['tables']}, m = {total}")
    for k, v in times.items():
        print(f"  {k:12} " + "  ".join(f"{x:6.2f}" for x in v) + f"   median {med[k]:.2f} s")
    print(f"ratio designed / whole joint (medians): {out['ratio']:.3f} (target <= 1.10)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
