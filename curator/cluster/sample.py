"""The seed's sample taken where the aligned column is: no process holds n keys or m rows.

The rule is :mod:`secure_release.mechanism.primitives.sampling`'s (DESIGN 3.2): the m positions with the
smallest (r_i, i), in that order, r_i the seekable ChaCha20 words of the sampling key. On a
cluster:

1. each run of the aligned column (:class:`~secure_release.curator.cluster.aligned.AlignedPieces`)
   computes the keys of its positions on its worker, keeps those at or below the cut t0 (about
   m + 8 sqrt(m) of n) and splits them, with their symbols, into R equal key ranges
   (:func:`keep_run`); only the R counts come back;
2. the counts say where each key range starts in the m-tuple (the ranges are disjoint and in
   key order) and which ranges hold the first m (:func:`~secure_release.mechanism.primitives.sampling.range_takes`);
3. each such range is merged on one worker from every run's part of it (:func:`merge_range`:
   concatenated in position order, one numeric sort by (key, position)), cut to what it gives;
4. the curator process receives the ranges in order, a window at a time, and writes them to the
   release's sample file (:meth:`~secure_release.curator.records.keystore.Keystore.write_sample`).

The tuple is the same one :func:`~secure_release.mechanism.primitives.sampling.sample_positions` gives,
bit for bit (tests/unit/test_cluster_sample.py): fewer than m keys at or below the cut (odds
below 1e-15) are noticed from the counts, and the keys are then all kept. The workers get the
sampling key (which rows are sampled), never a pad.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.curator.cluster.aligned import AlignedPieces
from secure_release.curator.cluster.sealed import Sealed, opened
from secure_release.curator.cluster.sharded import in_order
from secure_release.infra.logs import EventLog
from secure_release.infra.memory import release_free_memory
from secure_release.mechanism.alignment.sharding import HoldsArrays, owned
from secure_release.mechanism.errors import InvalidSampleSizeError
from secure_release.mechanism.primitives.keys import Seed
from secure_release.mechanism.primitives.sampling import (
    MAX_KEY,
    key_range_width,
    keys_at_positions,
    num_key_ranges,
    order_of_range,
    range_takes,
    sample_cut,
    sampling_key,
    split_kept_keys,
)

U64 = npt.NDArray[np.uint64]
Symbols = npt.NDArray[np.unsignedinteger]


@dataclass(frozen=True)
class KeptRun(HoldsArrays):
    """One run's keys at or below the cut and their symbols, split by key range (each in
    position order)."""

    keys: tuple[U64, ...]
    symbols: tuple[Symbols, ...]


def keep_run(
    runs: Sequence[Symbols], start: int, key: Sealed | bytes, cut: int, width: int, num_ranges: int
) -> KeptRun:
    """Step 1 on a worker: the run's symbols (its parts joined), the keys of its positions
    [start, start + size), the kept ones split by key range."""
    symbols = runs[0] if len(runs) == 1 else np.concatenate(list(runs))
    keys = keys_at_positions(opened(key), start, int(symbols.size))
    parts = split_kept_keys(keys, cut, width, num_ranges)
    kept = KeptRun(tuple(keys[p] for p in parts), tuple(symbols[p] for p in parts))
    del keys, symbols
    release_free_memory()
    return kept


def kept_counts(kept: KeptRun) -> list[int]:
    """What the curator process takes of a kept run: its count in each key range."""
    return [int(k.size) for k in kept.keys]


def kept_part(kept: KeptRun, key_range: int) -> tuple[U64, Symbols]:
    """One key range's part of a kept run (a tiny task where the run is)."""
    return owned(kept.keys[key_range]), owned(kept.symbols[key_range])  # not views into a run read back


def merge_range(parts: Sequence[tuple[U64, Symbols]], take: int) -> Symbols:
    """Step 3 on a worker: one key range from every run (in run order, so in position order),
    its symbols in ascending (key, position), the first ``take``."""
    keys = np.concatenate([p[0] for p in parts])
    symbols = np.concatenate([p[1] for p in parts])
    order = order_of_range(keys)[:take]
    return symbols[order]


def sample_runs(pieces: AlignedPieces, seed: Seed, release_id: str, m: int, log: EventLog | None = None,
                cut: int | None = None) -> Iterator[Symbols]:  # fmt: skip
    """The sampled symbols of ``pieces`` (n = ``pieces.num_rows``), in the m-tuple's order, a
    key range at a time. ``cut``: the key bound (tests force a low one to take the fallback)."""
    engine, n = pieces.engine, pieces.num_rows
    key = sampling_key(seed, release_id)
    cut = sample_cut(n, m) if cut is None else cut
    num_ranges = num_key_ranges(n, m)
    kept, takes = _kept_runs(pieces, key, cut, num_ranges, m)
    if takes is None:  # fewer than m keys at or below the cut: keep every key
        engine.release(kept)
        kept, takes = _kept_runs(pieces, key, MAX_KEY, num_ranges, m)
        if takes is None:
            raise InvalidSampleSizeError(f"m = {m} exceeds the {n} aligned rows")
    if log is not None:
        log("sample_ranges", runs=len(kept), key_ranges=len(takes), m=m, n=n)

    def merge(i: int) -> Any:
        key_range, _, take = takes[i]
        parts = engine.submit_many(kept_part, [(run, key_range) for run in kept])
        return engine.submit(merge_range, parts, take)

    try:
        yield from in_order(engine, merge, len(takes))
    finally:
        engine.release(kept)


def _kept_runs(pieces: AlignedPieces, key: bytes, cut: int, num_ranges: int,
               m: int) -> tuple[list[Any], list[tuple[int, int, int]] | None]:  # fmt: skip
    """Step 1 on every run and step 2: the kept runs' handles and the ranges' takes (None if
    fewer than m keys were kept)."""
    engine, width = pieces.engine, key_range_width(cut, num_ranges)
    runs = zip(pieces.sources, pieces.starts, strict=True)
    sealed = Sealed(key)
    kept = engine.submit_many(keep_run, [(sources, start, sealed, cut, width, num_ranges) for sources, start in runs])
    counts = engine.results(engine.submit_many(kept_counts, [(k,) for k in kept]), "sample")
    totals = np.sum(np.asarray(counts, dtype=np.int64).reshape(len(kept), num_ranges), axis=0)
    try:
        return kept, range_takes(totals, m)
    except InvalidSampleSizeError:
        return kept, None
