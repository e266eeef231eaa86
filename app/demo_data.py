"""Demo data: a table split over N >= 2 curators (vertical slices under shared ids).

With 2 to 4 curators it is the bundled UCI Adult 24-cell table (education 3, marital 2, sex 2,
salary 2): two curators get alice (education, marital) and bob (sex, salary); three get alice
(education, marital), bob (sex), carol (salary); four get one attribute each. With 5 to 8
curators it is a synthetic table with one attribute of 2 or 3 categories per curator.

Each record of the count table becomes one row at each curator under a synthetic id; each
curator's rows are shuffled independently, and each curator gets a few ids the others lack
(dropped by alignment). ``rows`` scales up synthetically (multinomial with the table's shares).
"""

from __future__ import annotations

import csv
import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.mechanism.errors import TooFewCuratorsError

CURATOR_NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
MAX_CURATORS = len(CURATOR_NAMES)
SPLIT = {"alice": ("education", "marital"), "bob": ("sex", "salary")}
ADULT_SPLITS: dict[int, tuple[tuple[str, ...], ...]] = {
    2: (("education", "marital"), ("sex", "salary")),
    3: (("education", "marital"), ("sex",), ("salary",)),
    4: (("education",), ("marital",), ("sex",), ("salary",)),
}
UNMATCHED = 5


def adult_cells() -> tuple[list[str], list[tuple[str, ...]], np.ndarray]:
    """The bundled Adult count table: attribute names, cell labels and counts."""
    text = resources.files("secure_release").joinpath("data/adult_counts.csv").read_text()
    reader = csv.reader(text.splitlines())
    header = next(reader)
    cells, counts = [], []
    for row in reader:
        if row:
            cells.append(tuple(row[:-1]))
            counts.append(int(row[-1]))
    return header[:-1], cells, np.asarray(counts, dtype=np.int64)


def synthetic_cells(curators: int, seed: int = 2024) -> tuple[list[str], list[tuple[str, ...]], np.ndarray]:
    """A synthetic table with one attribute per curator (2 or 3 categories), 45,222 records."""
    sizes = [3 if j % 3 == 0 else 2 for j in range(curators)]
    attrs = [f"{CURATOR_NAMES[j]}_attr" for j in range(curators)]
    grids = np.indices(sizes).reshape(curators, -1).T
    cells = [tuple(f"v{int(d)}" for d in row) for row in grids]
    weights = np.random.default_rng(seed).dirichlet(np.full(len(cells), 2.0))
    counts = np.random.default_rng(seed + 1).multinomial(45222, weights)
    return attrs, cells, counts.astype(np.int64)


def curator_split(curators: int) -> tuple[list[str], list[tuple[str, ...]], np.ndarray, dict[str, tuple[str, ...]]]:
    """The table for ``curators`` curators and which attributes each holds (joint-code order)."""
    if not 2 <= curators <= MAX_CURATORS:
        raise TooFewCuratorsError(f"the demo takes 2 to {MAX_CURATORS} curators, got {curators}")
    if curators in ADULT_SPLITS:
        attrs, cells, counts = adult_cells()
        groups = ADULT_SPLITS[curators]
    else:
        attrs, cells, counts = synthetic_cells(curators)
        groups = tuple((a,) for a in attrs)
    return attrs, cells, counts, dict(zip(CURATOR_NAMES, groups, strict=False))


def _write_curator(
    out: Path, curator: str, names: tuple[str, ...], attrs: list[str], labels: npt.NDArray[np.str_],
    ids: npt.NDArray[np.str_], categories: dict[str, list[str]], rng: np.random.Generator,
) -> None:  # fmt: skip
    """One curator's CSV (its own row order, a few ids nobody else has) and schema JSON."""
    cols = [attrs.index(a) for a in names]
    order = rng.permutation(ids.size)
    with (out / f"{curator}.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", *names])
        mine = labels[order][:, cols]
        w.writerows(zip(ids[order].tolist(), *(mine[:, j].tolist() for j in range(len(cols))), strict=True))
        for e in range(UNMATCHED):
            w.writerow([f"{curator}-only-{e}", *(categories[a][e % len(categories[a])] for a in names)])
    schema = {
        "curator": curator,
        "id_column": "id",
        "attributes": [{"name": a, "categories": categories[a]} for a in names],
    }
    (out / f"{curator}.json").write_text(json.dumps(schema, indent=1))


def write_demo_data(
    directory: str | Path, rows: int | None = None, seed: int = 2024, curators: int = 2
) -> dict[str, Any]:
    """Write <curator>.csv and <curator>.json for each of ``curators`` curators; return n, the
    attributes (joint-code order), the curators' attribute split and the truth by cell labels."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    attrs, cells, counts, split = curator_split(curators)
    rng = np.random.default_rng(seed)
    if rows is not None:
        counts = rng.multinomial(int(rows), counts / counts.sum())
    cell_of_row = np.repeat(np.arange(len(cells)), counts)
    n = int(cell_of_row.size)
    ids = np.char.add("p", np.char.zfill(np.arange(n).astype(str), 7))
    labels = np.asarray(cells, dtype=str)[cell_of_row]
    categories = {a: list(dict.fromkeys(c[i] for c in cells)) for i, a in enumerate(attrs)}
    for curator, names in split.items():
        _write_curator(out, curator, names, attrs, labels, ids, categories, rng)
    truth = {"|".join(c): int(k) / n for c, k in zip(cells, counts, strict=True)}
    return {
        "n": n,
        "attributes": attrs,
        "curators": list(split),
        "split": {c: list(a) for c, a in split.items()},
        "truth": truth,
        "counts": counts.tolist(),
        "cells": [list(c) for c in cells],
    }
