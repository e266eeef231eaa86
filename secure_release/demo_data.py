"""Demo data: the bundled Adult 24-cell table split between two curators.

Alice holds (education, marital), Bob holds (sex, salary). Each record of the count table
becomes one row at each curator under a synthetic id; each curator's rows are shuffled
independently, and each curator gets a few ids the other lacks (dropped by alignment).
``rows`` scales up synthetically (multinomial with the Adult shares).
"""

from __future__ import annotations

import csv
import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

SPLIT = {"alice": ("education", "marital"), "bob": ("sex", "salary")}
UNMATCHED = 5


def adult_cells() -> tuple[list[str], list[tuple[str, ...]], np.ndarray]:
    text = resources.files("secure_release").joinpath("data/adult_counts.csv").read_text()
    reader = csv.reader(text.splitlines())
    header = next(reader)
    cells, counts = [], []
    for row in reader:
        if row:
            cells.append(tuple(row[:-1]))
            counts.append(int(row[-1]))
    return header[:-1], cells, np.asarray(counts, dtype=np.int64)


def write_demo_data(directory: str | Path, rows: int | None = None, seed: int = 2024) -> dict[str, Any]:
    """Write alice.csv, bob.csv, alice.json, bob.json; return the truth by cell labels."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    attrs, cells, counts = adult_cells()
    rng = np.random.default_rng(seed)
    if rows is not None:
        counts = rng.multinomial(int(rows), counts / counts.sum())
    cell_of_row = np.repeat(np.arange(len(cells)), counts)
    n = int(cell_of_row.size)
    ids = np.strings.add("p", np.strings.zfill(np.arange(n).astype(str), 7))
    cell_labels = np.asarray(cells, dtype=str)
    categories = {a: list(dict.fromkeys(c[i] for c in cells)) for i, a in enumerate(attrs)}
    for curator, names in SPLIT.items():
        cols = [attrs.index(a) for a in names]
        order = rng.permutation(n)
        path = out / f"{curator}.csv"
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["id", *names])
            labels = cell_labels[cell_of_row[order]][:, cols]
            w.writerows(zip(ids[order].tolist(), *(labels[:, j].tolist() for j in range(len(cols))), strict=True))
            for e in range(UNMATCHED):
                w.writerow([f"{curator}-only-{e}", *(categories[a][e % len(categories[a])] for a in names)])
        schema = {
            "curator": curator,
            "id_column": "id",
            "attributes": [{"name": a, "categories": categories[a]} for a in names],
        }
        (out / f"{curator}.json").write_text(json.dumps(schema, indent=1))
    truth = {"|".join(c): int(k) / n for c, k in zip(cells, counts, strict=True)}
    return {
        "n": n,
        "attributes": attrs,
        "truth": truth,
        "counts": counts.tolist(),
        "cells": [list(c) for c in cells],
    }
