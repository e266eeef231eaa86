"""Reading a curator's table from PostgreSQL (``--data postgresql://... --query``) against the
database's own floor, measured in the same run on a throwaway server (Debian's ``postgresql``,
started as the system tests start it: tests/system/postgres_server.py).

Run:  .venv/bin/python bench/bench_postgres.py [--rows 10000000] [--small 1000000] [--repeat 2]

Figures (each a ratio to a reference of the same run):

* read: the curator's whole read (``read_table``: the rows streamed in Arrow batches, the one
  cell rule, the codes, the ids kept, the rows' fingerprint) of ``--rows`` rows, over the floor
  ``COPY (query) TO STDOUT (FORMAT binary)`` into /dev/null (psql); target <= 1.3. Beside it the
  same rows read from a Parquet file (``read_table`` of the file) and that ratio.
* memory: the growth of the reading process's peak RSS per row between ``--small`` and
  ``--rows`` rows, each read in a fresh process: the curator's read (it keeps the ids, the codes
  and the joint symbols: the table the release needs) and the fingerprint-only stream a cluster's
  coordinator runs (``query_fingerprint``: nothing kept per row); target <= 3 bytes a row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "system"))

from postgres_server import postgres_server  # noqa: E402  (the system tests' throwaway server)

SCHEMA = {"curator": "alice", "id_column": "id", "attributes": [
    {"name": "education", "categories": ["no college", "some college", "post-graduate"]},
    {"name": "age", "bins": [0, 30, 45, 60, 120]},
]}  # fmt: skip
CHILD = """
import json, resource, sys, time
from secure_release.curator.postgres import set_password_file
from secure_release.curator.table import load_schema, read_table
mode, data, query, schema, password = sys.argv[1:6]
set_password_file(password)
spec = load_schema(schema)
start = time.perf_counter()
if mode == "fingerprint":
    from secure_release.curator.postgres_read import query_fingerprint
    query_fingerprint(data, query)
    rows = None
else:
    rows = read_table(data, spec, query=query if mode == "table" else None).num_rows
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rows": rows, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def child(mode: str, data: str, query: str, schema: Path, password: Path) -> dict[str, float]:
    """One read in a fresh process: its seconds and peak RSS."""
    done = subprocess.run([sys.executable, "-c", CHILD, mode, data, query, str(schema), str(password)],
                          capture_output=True, text=True, check=True, timeout=3600)  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def copy_floor(port: int, password: str, query: str) -> float:
    """Seconds of ``COPY (query) TO STDOUT (FORMAT binary)`` into /dev/null (psql, one process)."""
    env = {**os.environ, "PGPASSWORD": password}
    start = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "office", "-d", "postgres", "-X", "-q",
                        "-c", f"COPY ({query}) TO STDOUT (FORMAT binary)"],
                       stdout=sink, env=env, check=True, timeout=3600)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-postgres-"))
    schema = work / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    with postgres_server() as pg:
        pg.execute(
            "CREATE TABLE people AS SELECT 'p' || lpad(g::text, 10, '0') AS id, "
            "(ARRAY['no college', 'some college', 'post-graduate'])[1 + g % 3] AS education, "
            f"(17 + (g::bigint * 7919) % 78)::int AS age FROM generate_series(1, {args.rows}) AS g",
            "ANALYZE people",
        )
        password = pg.role("office", ["people"])
        secret = work / "office.pw"
        secret.write_text(password + "\n")
        url = pg.url("office")
        whole, small = "SELECT id, education, age FROM people", f"SELECT id, education, age FROM people WHERE " \
                                                                f"id <= 'p{args.small:010d}'"
        parquet = work / "people.parquet"
        _write_parquet(pg, parquet)
        floor = min(copy_floor(pg.port, password, whole) for _ in range(args.repeat))
        read = min(child("table", url, whole, schema, secret)["seconds"] for _ in range(args.repeat))
        from_file = min(child("file", str(parquet), "", schema, secret)["seconds"] for _ in range(args.repeat))
        print(f"rows: {args.rows:,}")
        print(f"COPY (query) TO STDOUT (FORMAT binary) > /dev/null: {floor:.2f} s (the floor)")
        print(f"curator read from PostgreSQL: {read:.2f} s = {read / floor:.2f} x the floor (target <= 1.3)")
        print(f"curator read from Parquet:    {from_file:.2f} s; PostgreSQL / Parquet = {read / from_file:.2f}")
        for mode in ("table", "fingerprint"):
            low = child(mode, url, small, schema, secret)["peak_kib"]
            high = child(mode, url, whole, schema, secret)["peak_kib"]
            per_row = (high - low) * 1024 / (args.rows - args.small)
            what = "read_table (ids, codes, symbols kept)" if mode == "table" else "fingerprint stream (coordinator)"
            print(f"peak RSS {what}: {low / 1024:.0f} MiB at {args.small:,} rows, {high / 1024:.0f} MiB at "
                  f"{args.rows:,}: {per_row:.1f} bytes a row (target <= 3)")


def _write_parquet(pg: object, path: Path) -> None:
    """The table's rows as a Parquet file, streamed (the reference read)."""
    import pyarrow.parquet as pq

    with pg.connection() as conn:  # type: ignore[attr-defined]
        cursor = conn.cursor()
        cursor.execute("SELECT id, education, age FROM people")
        reader = cursor.fetch_record_batch()
        with pq.ParquetWriter(path, reader.schema.remove_metadata()) as writer:
            for batch in reader:
                writer.write_batch(batch.replace_schema_metadata(None))
        cursor.close()


if __name__ == "__main__":
    main()
