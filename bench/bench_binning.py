"""What binning a numeric column at public edges costs the curator's read-and-check (a script,
not a test; issue 26: at most +10% at 10^7 rows).

Run:  .venv/bin/python bench/bench_binning.py [--n 10000000] [--reps 2] [--json]

Two CSV files of n rows with the same information, written once:
  reference  id, edu (3 categories), mass as the labels of its 4 bins ("[2500, 3500)", ...): what a
             data owner had to do before bins existed (bin by hand, declare the labels as categories)
  binned     id, edu, mass as numbers ("4213.57"), declared {"bins": [2500, ..., 6500]}
Each is read by ``curator.table.read_table`` (parse, id checks, look-ups or binning, symbols);
best of --reps. Ratio = binned time / reference time (1.10 = 10% slower). A third row reads the
binned file with a missing label and a missing token declared (the text path: the column is read
as bytes, its missing cells found, the rest cast to numbers in Arrow).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from secure_release.curator.table import TableSpec, read_table
from secure_release.mechanism.schema import Attribute, CuratorSchema

EDGES = (2500.0, 3500.0, 4500.0, 5500.0, 6500.0)
EDU = ("none", "school", "college")


def write_files(n: int, folder: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(26)
    ids = pa.array(np.char.add("id", np.arange(n).astype(str)))
    edu = pa.array(np.asarray(EDU)[rng.integers(0, 3, n)])
    mass = rng.uniform(EDGES[0], EDGES[-1], n).round(2)
    labels = np.asarray(Attribute.binned("mass", EDGES).categories)[np.minimum(np.digitize(mass, EDGES) - 1, 3)]
    reference, binned = folder / "reference.csv", folder / "binned.csv"
    pacsv.write_csv(pa.table({"id": ids, "edu": edu, "mass": pa.array(labels)}), reference)
    pacsv.write_csv(pa.table({"id": ids, "edu": edu, "mass": pa.array(mass)}), binned)
    return reference, binned


def best(path: Path, spec: TableSpec, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        read_table(path, spec)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    edu = Attribute("edu", EDU)
    labels = Attribute.binned("mass", EDGES).categories
    spec_ref = TableSpec(CuratorSchema("alice", (edu, Attribute("mass", labels))), "id")
    spec_bin = TableSpec(CuratorSchema("alice", (edu, Attribute.binned("mass", EDGES))), "id")
    spec_text = TableSpec(
        CuratorSchema("alice", (edu, Attribute.binned("mass", EDGES, missing="unknown", missing_tokens=("?",)))), "id"
    )
    with tempfile.TemporaryDirectory() as tmp:
        reference, binned = write_files(args.n, Path(tmp))
        assert np.array_equal(read_table(reference, spec_ref).symbols(), read_table(binned, spec_bin).symbols())
        t_ref = best(reference, spec_ref, args.reps)
        t_bin = best(binned, spec_bin, args.reps)
        t_text = best(binned, spec_text, args.reps)
    out = {
        "n": args.n,
        "reference_s": round(t_ref, 3),
        "binned_s": round(t_bin, 3),
        "binned_with_missing_s": round(t_text, 3),
        "ratio": round(t_bin / t_ref, 3),
        "ratio_with_missing": round(t_text / t_ref, 3),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:<24} {value}")


if __name__ == "__main__":
    main()
