"""The release's own per-row steps with no engine around them, against DuckDB in the same run.

Run:  PYTHONPATH=. python bench/bench_floor.py [--rows 100000000] [--files 64]
          [--data-root /work/bench-data] [--fraction 0.1] [--json]

What ``bench/bench_cluster.py`` times is the whole release: two curators on Dask clusters, the
four services, the agreement. This script asks how much of that is the per-row work any engine
of this protocol has to do at each curator, and how much the engine adds. For the same files
(``bench/cluster_data.write_partitioned``, generated once under ``--data-root``), each curator in
a process of its own, both at once (as the two curators share this machine's cores):

1. **read**: every partition through the curator's reader (``read_partition``: the Parquet decode,
   the cell rule's checks, the attribute codes);
2. **tag**: the ids' AES-256-CMAC tags (``id_tags``), as the words a worker sorts;
3. **split**: each partition's (tag, symbol) rows split by shard (``split_by_shard``), with the
   shard count the engine picks for n (``shard_bits_for``);
4. **sort**: each shard's pieces merged and sorted by tag (``merge_pieces``, the radix order).

5. **the agreement's least**: bob sends every shard's tags, ascending, as the wire carries them
   (16 bytes a tag) over one mutual-TLS socket (``ssl``, certificates of ``init_pki``) to alice,
   who receives each shard and matches it against her own (``intersect_shard``): bob's CPU in
   ``send``, alice's in ``match``.

No Dask, no gRPC, no spool, no row order back, no sample, no encryption, no services: the floor
under the read, the shuffle and the agreement stages, and a lower bound on the release. The
reference is DuckDB in a fresh process, in the same run (``cluster_data.duckdb_reference``: read
both directories, join on the id, keep the m rows of smallest hash, count the cells; 2 threads).
Printed: each curator's CPU seconds per step, the wall time of both curators together (to the
last shard matched; the match's common count is checked against the data's), and that wall time
over DuckDB's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_data import duckdb_reference, write_partitioned

from secure_release.infra.pki import init_pki

STEPS = ("read", "tag", "split", "sort", "send", "match")
SLICE_TAGS = 1 << 20  # tags a send (16 MiB), as the follower's stream slices them


def curator_steps(data: str, schema: str, key: bytes, link: tuple[str, str, Any] | None = None) -> dict[str, Any]:
    """One curator's steps over its partitions: CPU and wall seconds of each, and the rows.
    ``link``: (role, this curator's certificate directory, a queue for the leader's port): the
    leader (``"leader"``) receives and matches the follower's (``"follower"``) tags over TLS."""
    import numpy as np

    from secure_release.curator.columnar import load_schema
    from secure_release.curator.partitions import discover, read_partition
    from secure_release.mechanism.alignment import sharding as sh
    from secure_release.mechanism.alignment.keyed_hash import id_tags
    from secure_release.mechanism.primitives.keys import AlignmentKey

    spec, alignment_key = load_schema(schema), AlignmentKey(key)
    cpu = dict.fromkeys(STEPS, 0.0)
    started = time.perf_counter()
    partitions = discover(data)
    shard_bits = sh.shard_bits_for(sum(p.num_rows or 0 for p in partitions))  # Parquet: from its metadata
    pieces: list[list[Any]] = []
    for partition in partitions:  # a partition at a time, as the engine's read stage runs them
        t0 = time.process_time()
        table = read_partition(partition, spec, check_repeats=False)
        t1 = time.process_time()
        tags = id_tags(table.id_values(), alignment_key).astype(sh.WORK_DTYPE)
        symbols = table.symbols().astype(np.uint8)
        del table
        t2 = time.process_time()
        pieces.append(list(sh.split_by_shard(tags, shard_bits, symbols)))
        cpu["read"] += t1 - t0
        cpu["tag"] += t2 - t1
        cpu["split"] += time.process_time() - t2
    rows = sum(int(p.tags.size) for parts in pieces for p in parts)
    t0 = time.process_time()
    shards = []
    for shard in range(1 << shard_bits):
        shards.append(sh.merge_pieces([p[shard] for p in pieces]))
        for p in pieces:  # each piece freed once merged, as a worker frees it
            p[shard] = None
    cpu["sort"] = time.process_time() - t0
    assert sum(s.size for s in shards) == rows
    common = None
    if link is not None:
        common = _agree(link, shards, cpu)
    return {"rows": rows, "shards": 1 << shard_bits, "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()},
            "seconds": round(time.perf_counter() - started, 2), "common": common}  # fmt: skip


def _tls(certs: str, server: bool) -> Any:
    import ssl

    name = Path(certs).name
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_cert_chain(f"{certs}/{name}.pem", f"{certs}/{name}.key")
    ctx.load_verify_locations(f"{certs}/ca.pem")
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _receive(conn: Any, size: int) -> bytearray:
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = conn.recv_into(view[got:])
        if not n:
            raise ConnectionError(f"the link closed after {got} of the {size} bytes due")
        got += n
    return buf


def _agree(link: tuple[str, str, Any], shards: list[Any], cpu: dict[str, float]) -> int | None:
    """The follower sends each shard's tags (a count, then 16 bytes a tag, ascending); the leader
    receives each and matches it against its own shard. The leader's common count, or None."""
    import socket

    import numpy as np

    from secure_release.mechanism.alignment import sharding as sh
    from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE

    role, certs, queue = link
    if role == "follower":
        port = queue.get(timeout=600)
        t0 = time.process_time()
        with socket.create_connection(("127.0.0.1", port)) as raw, \
                _tls(certs, False).wrap_socket(raw, server_hostname="localhost") as conn:  # fmt: skip
            for shard in shards:
                conn.sendall(shard.size.to_bytes(8, "big"))
                for start in range(0, shard.size, SLICE_TAGS):
                    conn.sendall(shard.tags[start : start + SLICE_TAGS].astype(TAG_DTYPE).tobytes())
            _receive(conn, 1)  # the leader's word that all arrived: closing before it could reset the link
        cpu["send"] = time.process_time() - t0
        return None
    with socket.create_server(("127.0.0.1", 0)) as listener:
        queue.put(listener.getsockname()[1])
        raw, _ = listener.accept()
    t0 = time.process_time()
    common = 0
    with _tls(certs, True).wrap_socket(raw, server_side=True) as conn:
        for shard in shards:
            count = int.from_bytes(_receive(conn, 8), "big")
            tags = np.frombuffer(_receive(conn, 16 * count), dtype=TAG_DTYPE)
            own_rows, _ = sh.intersect_shard(shard, [(tags, np.arange(count, dtype=np.int64))])
            common += int(own_rows.size)
        conn.sendall(b"\x01")
    cpu["match"] = time.process_time() - t0
    return common


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10**8, help="rows a curator (default 10^8)")
    ap.add_argument("--files", type=int, default=64, help="Parquet files a curator (default 64)")
    ap.add_argument("--data-root", default="/work/bench-data", help="where the data is kept between runs")
    ap.add_argument("--fraction", type=float, default=0.1, help="m = fraction * common ids (DuckDB's top-m)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    data = Path(args.data_root) / f"n{args.rows}"
    manifest = data / "manifest.json"
    if not manifest.exists():
        sys.stderr.write(f"generating {args.rows} rows a curator in {args.files} files under {data}\n")
        write_partitioned(data, args.rows, args.files)
    m = max(1, int(json.loads(manifest.read_text())["n_common"] * args.fraction))
    sys.stderr.write(f"n={args.rows}: duckdb (m={m}) ...\n")
    reference = duckdb_reference(data, m)
    sys.stderr.write(f"n={args.rows}: both curators' steps, in parallel ...\n")
    key = secrets.token_bytes(32)
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, context.Manager() as manager:
        init_pki(Path(tmp), [("curator", "alice"), ("curator", "bob")])
        port = manager.Queue()
        roles = {"alice": "leader", "bob": "follower"}
        started = time.perf_counter()
        with context.Pool(2) as pool:
            runs = {c: pool.apply_async(curator_steps, (str(data / c), str(data / f"{c}.json"), key,
                                                        (role, f"{tmp}/{c}", port)))
                    for c, role in roles.items()}  # fmt: skip
            curators = {"bob": runs["bob"].get()}  # the follower's failure first: it explains the leader's
            curators = {"alice": runs["alice"].get(), **curators}
        wall = round(time.perf_counter() - started, 2)
    expected = json.loads(manifest.read_text())["n_common"]
    if curators["alice"]["common"] != expected:
        raise SystemExit(f"the match found {curators['alice']['common']} common ids, the data has {expected}")
    result = {"rows": args.rows, "m": m, "duckdb_seconds": round(reference["seconds"], 2), "floor_seconds": wall,
              "floor_over_duckdb": round(wall / reference["seconds"], 2), "curators": curators}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"n = {args.rows} a curator, both curators at once (spawn to last shard matched): {wall} s; "
          f"DuckDB, same run: {result['duckdb_seconds']} s; floor / DuckDB: {result['floor_over_duckdb']}")  # fmt: skip
    for name, run in curators.items():
        steps = ", ".join(f"{k} {v}" for k, v in run["cpu_seconds"].items())
        print(f"  {name}: {run['rows']} rows, {run['shards']} shards; CPU seconds: {steps}; wall {run['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
