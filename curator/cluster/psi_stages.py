"""The PSI ring's stages on a curator's workers (``--engine dask --alignment psi``, issue 41).

Plain functions of their arguments, like :mod:`~secure_release.curator.cluster.shards`, so they
run in-process or on a Dask worker:

1. :func:`point_partition`: read one partition (the same checks as the keyed hash), blind each id
   into the group, H(id)^r (one hash and one multiplication a row), and split the rows by a
   *private* keyed tag of the id (a key derived from this curator's PSI key, which never leaves
   it). The shuffle then sorts each shard by that tag, so the list the curator sends, shard after
   shard, is in a pseudorandom order that says nothing about its rows, as the in-process ring's
   sort by point does. Each row carries its symbol and its point (:func:`point_rows`).
2. :func:`point_slice`: the points of a run of one shard (one slice of the list sent).
3. :func:`reblind_slice`: a hop on a slice that passes through: every point raised to the scalar.
4. :func:`finish_slice_tags`: the owner's own slice back after N blindings, as F, then its tags in
   the owner's tag domain, split by tag shard with the rows' symbols for a second shuffle. The
   shards that shuffle makes are the keyed-hash engine's shards (tags ascending, symbols beside),
   so the agreement, the leader's spool and the alignment are those of the keyed hash from there.

The scalars reach the workers as arguments (only the curator's own workers, over the cluster's
TLS), sealed (:mod:`~secure_release.curator.cluster.sealed`): a failed task's logged arguments
show none of their bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from secure_release.curator.cluster.sealed import Sealed, opened
from secure_release.curator.cluster.shard_files import PartitionResult, RowProblem
from secure_release.infra.memory import release_free_memory
from secure_release.mechanism.alignment.keyed_hash import id_tags
from secure_release.mechanism.alignment.psi import POINT_BYTES, finish_slice, hash_blind, psi_tags
from secure_release.mechanism.alignment.psi_group import blind_packed
from secure_release.mechanism.alignment.sharding import WORK_DTYPE, Shard, split_by_shard, symbol_dtype
from secure_release.mechanism.primitives.keys import AlignmentKey


def point_rows(alphabet_size: int) -> np.dtype[np.void]:
    """A row of the point table: its symbol and its blinded point (33 bytes)."""
    return np.dtype([("symbol", symbol_dtype(alphabet_size)), ("point", f"V{POINT_BYTES}")])


def point_partition(
    index: int, partition: Any, spec: Any, order_key_bytes: Sealed | bytes, shard_bits: int, alphabet_size: int,
    scalar: Sealed | bytes,
) -> PartitionResult:  # fmt: skip
    """Stage 1 for partition ``index``: bad rows come back as problems; else its rows (symbol
    and H(id)^scalar) split by shard of the private order tag. Repeats are found by the shard
    merge (equal ids have equal order tags)."""
    from secure_release.curator.partitions import read_partition
    from secure_release.curator.table import BadRowsError

    try:
        table = read_partition(partition, spec, check_repeats=False)
    except BadRowsError as exc:
        problems = tuple(RowProblem(str(partition.path), line, message) for line, message in exc.problems)
        return PartitionResult((), 0, problems)
    ids = table.ids
    tags = id_tags(ids, AlignmentKey(opened(order_key_bytes))).astype(WORK_DTYPE)
    rows: Any = np.zeros(tags.size, dtype=point_rows(alphabet_size))  # structured: numpy's stubs type it loosely
    rows["symbol"] = table.symbols()
    rows["point"] = np.frombuffer(hash_blind(ids, opened(scalar)), dtype=f"V{POINT_BYTES}")
    del table, ids
    pieces = split_by_shard(tags, shard_bits, rows)
    del tags, rows
    release_free_memory()
    return PartitionResult(pieces, sum(int(p.tags.size) for p in pieces))


def point_slice(shard: Shard, start: int, stop: int) -> bytes:
    """Points ``start .. stop - 1`` of a point shard, packed (a slice of the own list)."""
    payload: Any = shard.symbols  # structured rows (symbol, point)
    return np.ascontiguousarray(payload["point"][start:stop]).tobytes()


def reblind_slice(scalar: Sealed | bytes, points: bytes) -> bytes:
    """One hop on a slice: every point validated and raised to ``scalar``, same order."""
    return blind_packed(opened(scalar), points)


def finish_slice_tags(
    shard: Shard, start: int, stop: int, returned: bytes | str, unmask: Sealed | bytes, domain: int, shard_bits: int,
    alphabet_size: int,
) -> PartitionResult:  # fmt: skip
    """Step 3-4 for rows ``start .. stop - 1`` of a point shard: ``returned`` (their points after
    N blindings, in the order sent; or the file in the engine's handoff directory that holds
    them) as F, its tags in tag domain ``domain``, and the rows' symbols, split by tag shard
    (:class:`~secure_release.mechanism.alignment.psi_group.InvalidPointError` for a point that is not a
    curve point; a slice of another size is refused)."""
    if isinstance(returned, str):
        returned = Path(returned).read_bytes()
    if len(returned) != (stop - start) * POINT_BYTES:
        from secure_release.infra.streams import PsiStreamError

        got = len(returned) // POINT_BYTES
        raise PsiStreamError(f"a returned PSI slice holds {got} points, {stop - start} were sent")
    tags = psi_tags(finish_slice(returned, opened(unmask)), domain).astype(WORK_DTYPE)
    payload: Any = shard.symbols  # structured rows (symbol, point)
    symbols: npt.NDArray[Any] = np.ascontiguousarray(payload["symbol"][start:stop])
    symbols = symbols.astype(symbol_dtype(alphabet_size), copy=False)
    pieces = split_by_shard(tags, shard_bits, symbols)
    return PartitionResult(pieces, stop - start)
