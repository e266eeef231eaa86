"""Per-stage throughput at scale, each as a ratio to a limit measured in the same run (a script,
not a test).

Run:  PYTHONPATH=. python bench/bench_scale.py [--sizes 100000 1000000] [--big] [--reps 3] [--json]

Stages (n rows per curator) and their same-run limits. A limit is a primitive the stage has to
run at least once, so limit time <= stage time can only be missed by doing less work:
  csv_ingest      curator.table.read_table(CSV)        pyarrow.csv.read_csv of the same file (the
                                                       parse every reader of that file does)
  parquet_ingest  curator.table.read_table(Parquet)    pyarrow.parquet.read_table of the same file
  id_hash         alignment.id_tags(Arrow ids, as the   AES-ECB over the same number of blocks
                  curator hashes them)                 + one memcpy of those blocks: the AES call
                                                       (cryptography's update_into) takes one
                                                       contiguous buffer of all blocks, so the
                                                       stage must write 16 bytes a block before
                                                       encrypting them (a copy of 16 B a block is
                                                       the cheapest such write) and encrypt them
  alignment       protocol.agree_alignment, 2 curators  np.sort of both tag high-word arrays
                  (common tags and both row orders,     (int64): the canonical order is ascending
                  each list sorted once)               tag, so each list is sorted once at least
  align_curator   alignment.align(own, agreed), what    np.sort of its own tag high words
                  one curator process runs
  sampling_m=n    sample_positions(n, n)               ChaCha20 keystream of the n words it uses
  sampling_m=n/sort  the same                          keystream 8n B + np.sort of n int64: the
                                                       rule orders n 64-bit keys (shown because
                                                       the keystream limit alone leaves out that
                                                       sort; no exact sampler here does less)
                  From n >= sampling.PARALLEL_MIN (2^18) on 2+ cores the stage splits its
                  keystream and sort over two threads, so both sampling rows set its wall time
                  against single-thread limits; a /sort ratio above 1 means the second core.
  pad_encrypt     ReleasePad(chacha20).encrypt         keystream (2 B/symbol) + memcpy in/out
  pram            perturb, 2 curators                  keystream of its words + memcpy in/out
plus the cost of a 2-row release (pad, encrypt, decrypt) with ChaCha20 vs one-time pads.
Ratio = limit time / stage time (1.0 = at the limit). Peak RSS is the process high-water mark
after the stage. --big adds n = 10^7.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secure_release.curator.table import TableSpec, read_table
from secure_release.mechanism.alignment.keyed_hash import align, common_tags, id_tags
from secure_release.mechanism.primitives.keys import AlignmentKey, PadKey, PramKey, Seed
from secure_release.mechanism.primitives.pads import CipherMode, new_release_pad
from secure_release.mechanism.primitives.pram import PramChannel, perturb
from secure_release.mechanism.primitives.sampling import sample_positions
from secure_release.mechanism.primitives.stream import keystream_words, nonce_for
from secure_release.mechanism.protocol.in_memory import agree_alignment
from secure_release.mechanism.schema import Attribute, CuratorSchema

SPEC = TableSpec(
    CuratorSchema("alice", (Attribute("edu", ("none", "school", "college")), Attribute("mar", ("m", "s")))),
    "id",
)


def best_of(fn: Callable[[], object], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def keystream_seconds(num_bytes: int, reps: int) -> float:
    return best_of(lambda: keystream_words(bytes(32), nonce_for(0), 0, max(1, num_bytes // 8)), reps)


def memcpy_seconds(num_bytes: int, reps: int) -> float:
    src = np.ones(num_bytes, dtype=np.uint8)
    return best_of(lambda: src.copy(), reps)


def write_files(n: int, folder: Path, offset: int = 0) -> tuple[Path, Path]:
    rng = np.random.default_rng(n + offset)
    ids = np.char.add("id", np.arange(offset, offset + n).astype(str))
    edu = np.asarray(SPEC.schema.attributes[0].categories)[rng.integers(0, 3, n)]
    mar = np.asarray(SPEC.schema.attributes[1].categories)[rng.integers(0, 2, n)]
    table = pa.table({"id": ids, "edu": edu, "mar": mar})
    csv_path, pq_path = folder / f"t{offset}.csv", folder / f"t{offset}.parquet"
    pacsv.write_csv(table, csv_path, pacsv.WriteOptions(quoting_style="none"))
    pq.write_table(table, pq_path)
    return csv_path, pq_path


def stage(name: str, seconds: float, limit: float, limit_name: str, n: int) -> dict[str, Any]:
    return {"stage": name, "n": n, "seconds": seconds, "limit_seconds": limit, "limit": limit_name,
            "ratio": limit / seconds, "rows_per_s": n / seconds, "peak_rss_mb": peak_rss_mb()}


def ingest_and_hash(n: int, reps: int, folder: Path) -> tuple[list[dict[str, Any]], Any]:
    csv_path, pq_path = write_files(n, folder)
    out = [
        stage("csv_ingest", best_of(lambda: read_table(csv_path, SPEC), reps),
              best_of(lambda: pacsv.read_csv(csv_path), reps), "pyarrow.csv.read_csv", n),
        stage("parquet_ingest", best_of(lambda: read_table(pq_path, SPEC), reps),
              best_of(lambda: pq.read_table(pq_path), reps), "pyarrow.parquet.read_table", n),
    ]
    ids = read_table(csv_path, SPEC).id_values()  # the Arrow id column, as the curator hashes it
    key = AlignmentKey(bytes(32))
    longest = int(pc.max(pc.binary_length(ids)).as_py())
    blocks = np.zeros(16 * n * max(1, -(-longest // 16)), dtype=np.uint8)
    sink = np.empty(blocks.size + 16, dtype=np.uint8)
    aes = lambda: Cipher(algorithms.AES(bytes(32)), modes.ECB()).encryptor().update_into(blocks.data, sink.data)  # noqa: E731
    limit = best_of(aes, reps) + memcpy_seconds(blocks.size, reps)
    out.append(stage("id_hash", best_of(lambda: id_tags(ids, key), reps), limit, "AES-ECB + memcpy same blocks", n))
    return out, ids


def alignment_stages(n: int, reps: int, ids: Any) -> list[dict[str, Any]]:
    key = AlignmentKey(bytes(32))
    other = pa.array(np.char.add("id", np.arange(n // 2, n + n // 2).astype(str)))
    ta, tb = id_tags(ids, key), id_tags(other, key)
    agreed = common_tags([ta, tb])

    def limit() -> None:
        np.sort(ta["hi"].astype(np.int64))
        np.sort(tb["hi"].astype(np.int64))

    return [
        stage("alignment", best_of(lambda: agree_alignment([ta, tb]), reps), best_of(limit, reps),
              "np.sort of both tag words", n),
        stage("align_curator", best_of(lambda: align(ta, agreed), reps),
              best_of(lambda: np.sort(ta["hi"].astype(np.int64)), reps), "np.sort of its tag words", n),
    ]


def crypto_stages(n: int, reps: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 6, n, dtype=np.uint32), rng.integers(0, 4, n, dtype=np.uint32)
    sampling = best_of(lambda: sample_positions(Seed(bytes(32)), n, n, "bench"), reps)
    keys = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    sort_bound = keystream_seconds(8 * n, reps) + best_of(lambda: np.sort(keys), reps)
    pad_time = best_of(lambda: new_release_pad(CipherMode.CHACHA20, 6, n, PadKey(bytes(32))).encrypt(x), reps)
    channel = PramChannel(21.0, 24)
    pram_time = best_of(lambda: perturb([x, y], (6, 4), channel, PramKey(bytes(32))), reps)
    replaced = 1.0 - channel.keep
    pram_bytes = int(n * (8 + 2 * 2 * replaced))
    return [
        stage("sampling_m=n", sampling, keystream_seconds(8 * n, reps), "keystream 8n bytes", n),
        stage("sampling_m=n/sort", sampling, sort_bound, "keystream 8n B + np.sort n int64", n),
        stage("pad_encrypt", pad_time, keystream_seconds(2 * n, reps) + memcpy_seconds(8 * n, reps),
              "keystream 2n B + memcpy 8n B", n),
        stage("pram", pram_time, keystream_seconds(pram_bytes, reps) + memcpy_seconds(16 * n, reps),
              "keystream of its words + memcpy 16n B", n),
    ]


def tiny_release_ratio(reps: int = 2000) -> dict[str, Any]:
    """Median cost of a 2-row release's pad work (new pad, encrypt, decrypt) per cipher."""
    x = np.array([1, 5], dtype=np.uint32)

    def once(mode: CipherMode) -> float:
        t0 = time.perf_counter()
        pad = new_release_pad(mode, 6, 2)
        pad.decrypt(pad.encrypt(x))
        return time.perf_counter() - t0

    # interleaved, so a load spike on this shared machine hits both ciphers alike
    pairs = [(once(CipherMode.CHACHA20), once(CipherMode.OTP)) for _ in range(reps)]
    chacha = float(np.median([c for c, _ in pairs]))
    otp = float(np.median([o for _, o in pairs]))
    return {"chacha20_seconds": chacha, "otp_seconds": otp, "ratio_chacha20_over_otp": chacha / otp}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--big", action="store_true", help="also n = 10^7")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [*args.sizes, *([10_000_000] if args.big else [])]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            ingest, ids = ingest_and_hash(n, args.reps, Path(tmp))
            rows += [*ingest, *alignment_stages(n, args.reps, ids), *crypto_stages(n, args.reps)]
    tiny = tiny_release_ratio()
    if args.json:
        print(json.dumps({"stages": rows, "two_row_release": tiny}, indent=2))
        return 0
    print(f"{'stage':<18}{'n':>10}{'time s':>10}{'limit s':>10}{'ratio':>8}{'M rows/s':>10}{'RSS MB':>8}  limit")
    for r in rows:
        print(f"{r['stage']:<18}{r['n']:>10}{r['seconds']:>10.4f}{r['limit_seconds']:>10.4f}{r['ratio']:>8.2f}"
              f"{r['rows_per_s'] / 1e6:>10.1f}{r['peak_rss_mb']:>8.0f}  {r['limit']}")
    print(f"2-row release: chacha20 {tiny['chacha20_seconds'] * 1e3:.3f} ms, otp {tiny['otp_seconds'] * 1e3:.3f} ms, "
          f"ratio {tiny['ratio_chacha20_over_otp']:.2f} (target <= 2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
