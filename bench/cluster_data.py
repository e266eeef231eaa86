"""Data and the DuckDB reference for the cluster benchmark (``bench/bench_cluster.py``).

Run:  PYTHONPATH=. python bench/cluster_data.py --rows N --files F OUT_DIR [--json]
          [--overlap 0.9] [--seed 2024] [--rows-per-group 1048576]
          [--duckdb M[,M...]] [--query codes|labels] [--reps R] [--threads 2] [--no-write]

Data (``write_partitioned``): two curators' Parquet directories, ``OUT_DIR/alice/part-00000.parquet``
... and ``OUT_DIR/bob/...``, with the schemas ``OUT_DIR/alice.json`` and ``OUT_DIR/bob.json`` (the
format of ``secure-release demo``) and ``OUT_DIR/manifest.json`` (the summary below, with the exact
cell counts of the common ids). Each curator has N rows; ``round(overlap * N)`` ids are common to
both, the others are at one curator only. Ids are fixed-width strings of 12 bytes (``p`` + 11
digits of a bijective scramble of a record number, so common and one-curator ids are interleaved;
12 bytes is the longest string DuckDB keeps inline). The attributes are the demo's two-curator
Adult split (``curator_split(2)``: alice education and marital, bob sex and salary), each record's
cell drawn from the demo table's shares by a hash of its record number, so a common id has the same
cell at both curators. Each curator's rows are in its
own order: position p holds record (a * p + b) mod N (a curator-specific a coprime to N, about 0.62
N for alice and 0.41 N for bob), then each row group is shuffled; so no file of alice's lines up
with a file of bob's. Generation runs one row group (``rows_per_group`` rows) at a time with numpy
and pyarrow: peak RSS does not grow with N. Measured: wall seconds of the whole write and the
generator's peak RSS (``ru_maxrss`` of this process, printed by the CLI).

Reference (``duckdb_reference``): a fresh interpreter running DuckDB (``threads`` threads,
memory_limit 16GB (``DUCKDB_MEMORY_LIMIT``), preserve_insertion_order off, spill to
``OUT_DIR/.duckdb_tmp``; a failure, such as running out of memory, is raised with DuckDB's
reason, and bench_cluster.py reports it and measures the release all the same) reads both directories, joins them on id,
keeps the m joined rows with the smallest ``hash(id)`` (``ORDER BY hash(id) LIMIT m``, a top-n) and
counts their joint cells (``GROUP BY ALL``; the result is fetched). By default (``--query codes``)
each side's attributes are turned into one small integer cell code as the Parquet is read, so the
join and the top-n carry (id, code) rather than label strings (``--query labels``: the strings, about
twice the memory in DuckDB 2.0). ``seconds`` is measured inside
that process from just before the query to the fetched result (interpreter start, ``import duckdb``
and the settings excluded; ``process_seconds`` is spawn to exit). ``peak_rss_mib`` is that
process's VmHWM read right after the query; ``n_common`` is counted by a second, untimed query
after that reading. With ``--reps R`` the CLI runs R fresh processes per m and reports the
fastest (and every run's figures in ``--json``).

Also: ``tree_vm_hwm`` / ``peak_rss_tree`` (VmHWM of a process and all its descendants, e.g. a
curator and its Dask workers) and ``RssTreePoller``, a thread that samples them every 50 ms.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from secure_release.demo_data import curator_split  # noqa: E402

CURATORS = ("alice", "bob")
ID_DIGITS = 11  # "p" + 11 digits = 12 bytes: DuckDB (and Arrow string views) keep strings <= 12 bytes inline
ID_BITS = 36  # 2^36 < 10^11: every scrambled record number fits in 11 digits
_ID_MASK = np.uint64((1 << ID_BITS) - 1)
# multipliers of the position -> record permutation (golden ratio and sqrt(2) - 1 of N)
_STRIDE = {"alice": 0.6180339887498949, "bob": 0.41421356237309503}
U64 = npt.NDArray[np.uint64]


# --- data -----------------------------------------------------------------------------------


def _splitmix64(x: U64) -> U64:
    """A 64-bit mix of each word (SplitMix64's finaliser; uint64 arithmetic wraps)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _scramble_ids(k: U64, seed: int) -> U64:
    """A bijection of [0, 2^36) (odd multiplications and xor-shifts modulo 2^36, then a seeded xor)."""
    x = (k * np.uint64(0x5DEECE66D)) & _ID_MASK
    x ^= x >> np.uint64(17)
    x = (x * np.uint64(0x2545F4914F6CDD1D)) & _ID_MASK
    x ^= x >> np.uint64(19)
    x ^= np.uint64((seed * 0x9E3779B97F4A7C15) & ((1 << ID_BITS) - 1))
    return x


def id_strings(k: U64, seed: int) -> pa.StringArray:
    """Fixed-width ids ``p`` + 11 digits of the scrambled record numbers ``k`` (built as one
    byte buffer: no Python string per row)."""
    v = _scramble_ids(k, seed)
    width = 1 + ID_DIGITS
    buf = np.empty((v.size, width), dtype=np.uint8)
    buf[:, 0] = ord("p")
    for j in range(ID_DIGITS, 0, -1):
        buf[:, j] = (v % np.uint64(10)).astype(np.uint8) + ord("0")
        v = v // np.uint64(10)
    offsets = np.arange(0, (v.size + 1) * width, width, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(v.size, pa.py_buffer(offsets), pa.py_buffer(buf)).cast(pa.string())


def _cells_of(k: U64, seed: int, cdf: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The cell of each record number: a uniform from a hash of (record, seed) through the cdf."""
    u = (_splitmix64(k ^ np.uint64((seed * 0xD1B54A32D192ED03) & (2**64 - 1))) >> np.uint64(11)).astype(np.float64)
    u *= 2.0**-53
    return np.minimum(np.searchsorted(cdf, u, side="right"), cdf.size - 1)


def _stride(n: int, curator: str, seed: int) -> tuple[int, int]:
    """(a, b) of the curator's position -> record permutation p -> (a p + b) mod n, gcd(a, n) = 1."""
    rng = np.random.default_rng([seed, CURATORS.index(curator), 7])
    a = max(1, int(n * _STRIDE[curator]) + int(rng.integers(0, 1000)))
    while math.gcd(a, n) != 1:
        a += 1
    return a % n or 1, int(rng.integers(0, n))


def _schema(curator: str, names: tuple[str, ...], categories: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "curator": curator,
        "id_column": "id",
        "attributes": [{"name": a, "categories": categories[a]} for a in names],
    }


def write_partitioned(
    root: Path, n: int, files: int, overlap: float = 0.9, seed: int = 2024, rows_per_group: int = 1 << 20,
    compression: str = "zstd",
) -> dict[str, Any]:
    """Write ``root/{alice,bob}/part-NNNNN.parquet`` (``files`` each, n rows per curator, one row
    group per at most ``rows_per_group`` rows, ``compression`` as Parquet names it: zstd takes
    6.1 bytes a row here, snappy 10.6, which decides whether 10^9 rows fit on this disk),
    ``root/{alice,bob}.json`` and ``root/manifest.json``.

    Returns n, n_common (exact), n_only (per curator), files_written, rows_per_group, bytes,
    seconds (wall, the whole write) and the joint cell counts of the common ids (``cells``,
    ``common_counts``: what a full join counts). Deterministic for a seed."""
    if not 1 <= n < 2**32:
        raise ValueError(f"n must be in [1, 2^32), got {n}")
    if 2 * n - round(overlap * n) > 1 << ID_BITS:
        raise ValueError(f"n = {n} needs more than 2^{ID_BITS} distinct ids")
    if not 1 <= files <= n:
        raise ValueError(f"files must be in [1, n], got {files}")
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    t0 = time.perf_counter()
    root = Path(root)
    common = round(overlap * n)
    attrs, cells, counts, split = curator_split(2)
    probs = counts / counts.sum()
    cdf = np.cumsum(probs)
    categories = {a: list(dict.fromkeys(c[i] for c in cells)) for i, a in enumerate(attrs)}
    codes = {a: np.asarray([categories[a].index(c[i]) for c in cells], dtype=np.int8) for i, a in enumerate(attrs)}
    dictionaries = {a: pa.array(categories[a], type=pa.string()) for a in attrs}
    common_counts = np.zeros(len(cells), dtype=np.int64)
    nbytes = 0
    written = 0
    for curator in CURATORS:
        names = split[curator]
        out = root / curator
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        a, b = _stride(n, curator, seed)
        # alice's records are [0, n); bob's are [0, common) and then [n, 2n - common)
        shift = 0 if curator == "alice" else n - common
        schema = pa.schema([("id", pa.string())] + [(c, pa.dictionary(pa.int8(), pa.string())) for c in names])
        for f in range(files):
            lo, hi = f * n // files, (f + 1) * n // files
            path = out / f"part-{f:05d}.parquet"
            with pq.ParquetWriter(path, schema, compression=compression, use_dictionary=list(names)) as writer:
                for g, start in enumerate(range(lo, hi, rows_per_group)):
                    rng = np.random.default_rng([seed, CURATORS.index(curator), f, g])
                    pos = rng.permutation(np.arange(start, min(start + rows_per_group, hi), dtype=np.uint64))
                    rec = (pos * np.uint64(a) + np.uint64(b)) % np.uint64(n)
                    if shift:
                        rec = np.where(rec < common, rec, rec + np.uint64(shift))
                    cell = _cells_of(rec, seed, cdf)
                    if curator == "alice":
                        common_counts += np.bincount(cell[rec < common], minlength=len(cells))
                    cols = [id_strings(rec, seed)] + [
                        pa.DictionaryArray.from_arrays(pa.array(codes[c][cell], type=pa.int8()), dictionaries[c])
                        for c in names
                    ]
                    writer.write_table(pa.Table.from_arrays(cols, schema=schema), row_group_size=rows_per_group)
            nbytes += path.stat().st_size
            written += 1
        (root / f"{curator}.json").write_text(json.dumps(_schema(curator, names, categories), indent=1))
    info: dict[str, Any] = {
        "root": str(root),
        "n": n,
        "n_common": common,
        "n_only": n - common,
        "overlap": overlap,
        "seed": seed,
        "files_per_curator": files,
        "files_written": written,
        "rows_per_group": rows_per_group,
        "compression": compression,
        "bytes": nbytes,
        "attributes": list(attrs),
        "split": {c: list(v) for c, v in split.items()},
        "cells": [list(c) for c in cells],
        "common_counts": common_counts.tolist(),
        "seconds": time.perf_counter() - t0,
    }
    assert int(common_counts.sum()) == common
    (root / "manifest.json").write_text(json.dumps(info, indent=1))
    return info


# --- DuckDB reference -----------------------------------------------------------------------

#: DuckDB's memory limit in the reference (this machine: 24 GiB, nothing else running then).
DUCKDB_MEMORY_LIMIT = "16GB"
_DUCKDB_CHILD = r"""
import json, sys, time
MEMORY_LIMIT = sys.argv[5]
t_start = time.perf_counter()
import duckdb
threads, temp, sql, count_sql = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

def hwm():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")

con = duckdb.connect()
con.execute(f"PRAGMA threads={threads}")
con.execute(f"SET memory_limit='{MEMORY_LIMIT}'")
con.execute("SET preserve_insertion_order=false")  # DuckDB's advice for joins past memory
con.execute("SET enable_progress_bar=false")
con.execute(f"SET temp_directory='{temp}'")
t_ready = time.perf_counter()
rows = con.execute(sql).fetchall()
t_done = time.perf_counter()
peak = hwm()
n_common = con.execute(count_sql).fetchone()[0]
print(json.dumps({
    "seconds": t_done - t_ready, "startup_seconds": t_ready - t_start, "peak_rss_mib": peak,
    "n_common": n_common, "rows": rows, "duckdb": duckdb.__version__,
}))
"""
DUCKDB_QUERIES = ("codes", "labels")


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _code_expr(alias: str, attributes: list[dict[str, Any]]) -> str:
    """One curator's cell as a mixed-radix integer (its last attribute fastest), in SQL."""
    terms, radix = [], 1
    for attr in reversed(attributes):
        cats = "[" + ", ".join(_literal(c) for c in attr["categories"]) + "]"
        terms.append(f"(list_position({cats}, {alias}.{_ident(attr['name'])}) - 1) * {radix}")
        radix *= len(attr["categories"])
    return "(" + " + ".join(reversed(terms)) + ")::INTEGER"


def _decode(code: int, attributes: list[dict[str, Any]]) -> list[str]:
    labels = []
    for attr in reversed(attributes):
        code, j = divmod(code, len(attr["categories"]))
        labels.append(attr["categories"][j])
    return labels[::-1]


def duckdb_sql(root: Path, m: int, query: str = "codes") -> tuple[str, str]:
    """The reference query and the n_common count for the data under ``root``.

    ``codes`` (the default): each side's attributes become one small integer cell code as they
    are read (what a curator's encoded table holds), the join carries (id, code) and the top-m
    carries (code, code) ordered by hash(id). ``labels``: the join and the top-m carry the
    attribute strings themselves (DuckDB 2.0.1 then needs about twice the memory: its top-n keeps
    the string payload, 13-byte labels such as 'post-graduate' are not inline)."""
    root = Path(root)
    schemas = {c: json.loads((root / f"{c}.json").read_text()) for c in CURATORS}
    src = {c: f"read_parquet({_literal(str(root / c / '*.parquet'))})" for c in CURATORS}
    count_sql = f"SELECT count(*) FROM {src['alice']} a JOIN {src['bob']} b ON a.id = b.id"
    if query == "codes":
        sql = (
            f"WITH a AS (SELECT id, {_code_expr('x', schemas['alice']['attributes'])} AS ca FROM {src['alice']} x), "
            f"b AS (SELECT id, {_code_expr('y', schemas['bob']['attributes'])} AS cb FROM {src['bob']} y), "
            f"s AS (SELECT ca, cb FROM a JOIN b ON a.id = b.id ORDER BY hash(a.id) LIMIT {m}) "
            "SELECT ca, cb, count(*) AS k FROM s GROUP BY ALL"
        )
    elif query == "labels":
        left = [_ident(a["name"]) for a in schemas["alice"]["attributes"]]
        right = [_ident(a["name"]) for a in schemas["bob"]["attributes"]]
        cols = ", ".join([f"a.{c}" for c in left] + [f"b.{c}" for c in right])
        attrs = ", ".join(left + right)
        sql = (
            f"WITH j AS (SELECT a.id AS id, {cols} FROM {src['alice']} a JOIN {src['bob']} b ON a.id = b.id), "
            f"s AS (SELECT {attrs} FROM j ORDER BY hash(id) LIMIT {m}) "
            f"SELECT {attrs}, count(*) AS k FROM s GROUP BY ALL"
        )
    else:
        raise ValueError(f"query must be one of {DUCKDB_QUERIES}, got {query!r}")
    return sql, count_sql


def duckdb_reference(root: Path, m: int, threads: int = 2, query: str = "codes") -> dict[str, Any]:
    """The DuckDB reference in a fresh interpreter: join alice and bob on id, keep the m rows of
    smallest hash(id), count their joint cells (``duckdb_sql``). Returns seconds (query to fetched
    result, inside the process), startup_seconds (interpreter start to the query, in the process),
    process_seconds (spawn to exit, as seen here: includes both and the n_common count),
    peak_rss_mib (VmHWM of that process right after the query), maxrss_mib (its ru_maxrss from
    wait4: includes the untimed n_common count), n_common, m, sampled (= min(m, n_common)) and the
    counts by cell labels ("label|label|...")."""
    root = Path(root)
    schemas = {c: json.loads((root / f"{c}.json").read_text()) for c in CURATORS}
    sql, count_sql = duckdb_sql(root, m, query)
    temp = root / ".duckdb_tmp"
    shutil.rmtree(temp, ignore_errors=True)  # what a killed run left (36 GB once, at 10^9)
    temp.mkdir()
    cmd = [sys.executable, "-c", _DUCKDB_CHILD, str(threads), str(temp), sql, count_sql, DUCKDB_MEMORY_LIMIT]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        why = [line for line in errors.read().splitlines() if "Error" in line or "Exception" in line]
    wall = time.perf_counter() - t0
    shutil.rmtree(temp, ignore_errors=True)
    if proc.returncode:
        reason = why[-1] if why else f"exit {proc.returncode}"
        raise RuntimeError(f"the DuckDB reference failed after {wall:.0f} s at memory_limit {DUCKDB_MEMORY_LIMIT}: "
                           f"{reason}")  # fmt: skip
    res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])  # the last line is the child's summary
    rows = res.pop("rows")
    if query == "codes":
        att = {c: schemas[c]["attributes"] for c in CURATORS}
        cells = {"|".join(_decode(ca, att["alice"]) + _decode(cb, att["bob"])): k for ca, cb, k in rows}
    else:
        cells = {"|".join(map(str, r[:-1])): r[-1] for r in rows}
    res.update(
        m=m,
        threads=threads,
        query=query,
        sql=sql,
        sampled=sum(cells.values()),
        cells=cells,
        process_seconds=wall,
        maxrss_mib=usage.ru_maxrss / 1024.0,
    )
    return res


# --- peak RSS of a process tree -------------------------------------------------------------


def vm_hwm_mib(pid: int, field: str = "VmHWM") -> float | None:
    """``field`` (VmHWM: the peak resident set; VmRSS: the current one) of a live process in MiB."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        return None
    return None


def child_map() -> dict[int, list[int]]:
    """Every live process's direct children, from one scan of /proc/*/stat (psutil's
    ``children()`` scans all of /proc once a call: polling a tree of 15 processes every 50 ms
    that way took a fifth of a core here, CPU the measured release lost and DuckDB did not)."""
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def children(pid: int) -> list[int]:
    """The live direct children of ``pid``."""
    return child_map().get(pid, [])


def descendants(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and every live process below it (children, their children, ...); ``kids``: a
    :func:`child_map` to use (one scan for many trees)."""
    kids = child_map() if kids is None else kids
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo.extend(kids.get(p, []))
    return seen


def tree_vm_hwm(pid: int) -> dict[int, float]:
    """VmHWM in MiB of ``pid`` and each live descendant (the ones that already exited are gone:
    poll with ``RssTreePoller`` to keep them)."""
    out = {}
    for p in descendants(pid):
        v = vm_hwm_mib(p)
        if v is not None:
            out[p] = v
    return out


def peak_rss_tree(pid: int) -> float:
    """The sum of the per-process peaks (VmHWM, MiB) of ``pid`` and its live descendants: an upper
    bound of the tree's simultaneous peak (the processes need not peak at the same moment)."""
    return sum(tree_vm_hwm(pid).values())


class IntervalPoller(threading.Thread):
    """A daemon thread that calls ``sample()`` every ``interval`` seconds until ``stop()`` (also
    a context manager): the shape of the bench's pollers (:class:`RssTreePoller`,
    ``disk_profile.DiskPoller``), each of which adds its own ``sample``."""

    def __init__(self, interval: float, name: str | None = None) -> None:
        super().__init__(daemon=True, name=name)
        self.interval = interval
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> Any:
        raise NotImplementedError

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()

    def __enter__(self) -> IntervalPoller:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RssTreePoller(IntervalPoller):
    """Samples a process and its descendants every ``interval`` seconds until ``stop()``.

    ``peak`` maps pid -> highest VmHWM seen (a process that exits keeps its last reading, at
    most ``interval`` old); ``names`` pid -> command line; ``sum_of_peaks`` their sum; and
    ``simultaneous_peak`` the highest sum of VmRSS over the tree at one sample (a lower bound of
    the true simultaneous peak; it misses spikes between samples). Call ``sample()`` once more
    while the processes are still alive for exact final peaks."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(interval)
        self.pid = pid
        self.peak: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.simultaneous_peak = 0.0

    def sample(self) -> None:
        total = 0.0
        for p in descendants(self.pid):
            hwm, rss = vm_hwm_mib(p), vm_hwm_mib(p, "VmRSS")
            if hwm is None:
                continue
            with self._lock:
                self.peak[p] = max(self.peak.get(p, 0.0), hwm)
                if p not in self.names:
                    try:
                        self.names[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                    except OSError:
                        self.names[p] = "?"
            total += rss or 0.0
        with self._lock:
            self.simultaneous_peak = max(self.simultaneous_peak, total)

    @property
    def sum_of_peaks(self) -> float:
        with self._lock:
            return sum(self.peak.values())


# --- CLI ------------------------------------------------------------------------------------


def self_peak_rss_mib() -> float:
    """This process's peak RSS (ru_maxrss, KiB on Linux) in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path, help="where alice/, bob/, alice.json, bob.json and manifest.json go")
    p.add_argument("--rows", type=int, help="rows per curator (n)")
    p.add_argument("--files", type=int, default=8, help="Parquet files per curator")
    p.add_argument("--overlap", type=float, default=0.9, help="share of ids common to both curators")
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--rows-per-group", type=int, default=1 << 20, help="rows per row group (generation unit)")
    p.add_argument("--duckdb", default="", help="comma-separated m: run the DuckDB reference for each")
    p.add_argument("--threads", type=int, default=2, help="DuckDB threads")
    p.add_argument("--query", choices=DUCKDB_QUERIES, default="codes", help="the reference's query (duckdb_sql)")
    p.add_argument("--reps", type=int, default=1, help="fresh DuckDB processes per m (the fastest is reported)")
    p.add_argument("--no-write", action="store_true", help="use the data already in OUT_DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.no_write:
        info = json.loads((args.out_dir / "manifest.json").read_text())
    else:
        if args.rows is None:
            p.error("--rows is required unless --no-write")
        info = write_partitioned(args.out_dir, args.rows, args.files, args.overlap, args.seed, args.rows_per_group)
        info["generator_peak_rss_mib"] = round(self_peak_rss_mib(), 1)
    refs = []
    for m in (int(x) for x in args.duckdb.split(",") if x):
        runs = [duckdb_reference(args.out_dir, m, args.threads, args.query) for _ in range(max(1, args.reps))]
        ref = dict(min(runs, key=lambda r: r["seconds"]))
        ref["runs"] = [{k: round(r[k], 3) for k in ("seconds", "process_seconds", "peak_rss_mib")} for r in runs]
        if ref["n_common"] != info["n_common"] or ref["sampled"] != min(m, info["n_common"]):
            raise SystemExit(f"DuckDB counted {ref['n_common']} common ids and {ref['sampled']} sampled rows")
        if m >= info["n_common"]:  # the full join: DuckDB's cells must be the manifest's
            want = {"|".join(c): k for c, k in zip(info["cells"], info["common_counts"], strict=True) if k}
            if ref["cells"] != want:
                raise SystemExit("DuckDB's cell counts of the full join differ from the manifest's")
        refs.append(ref)
    if args.json:
        out = {k: v for k, v in info.items() if k not in ("cells", "common_counts")}
        out["duckdb"] = [{k: v for k, v in r.items() if k not in ("cells", "sql")} for r in refs]
        print(json.dumps(out, indent=1))
        return 0
    if not args.no_write:
        print(
            f"wrote {info['files_written']} files ({info['bytes'] / 2**20:.0f} MiB) to {info['root']}: "
            f"n = {info['n']} rows per curator, {info['n_common']} common ids, {info['n_only']} at one "
            f"curator only; {info['seconds']:.1f} s, generator peak RSS {info['generator_peak_rss_mib']:.0f} MiB"
        )
    for r in refs:
        print(
            f"DuckDB {r['duckdb']} ({r['threads']} threads, {r['query']}) m = {r['m']}: query {r['seconds']:.2f} s "
            f"(process {r['process_seconds']:.2f} s incl. start-up and the n_common count), peak RSS "
            f"{r['peak_rss_mib']:.0f} MiB, n_common {r['n_common']}, sampled {r['sampled']}"
            + (
                f"; {len(r['runs'])} runs (query s / peak MiB): "
                + ", ".join(f"{x['seconds']:.2f} s / {x['peak_rss_mib']:.0f} MiB" for x in r["runs"])
                if len(r["runs"]) > 1
                else ""
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
