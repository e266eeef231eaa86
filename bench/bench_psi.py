"""Alignment cost, PSI against the keyed hash, and the server-sampled variant (a script, not a test).

Run:  PYTHONPATH=. python bench/bench_psi.py [--sizes 10000,100000] [--json]

For each size s: two curators with s ids each, half of them shared. Reported in the same run:
- keyed hash: mechanism.alignment.id_tags for both curators + common_tags (seconds);
- PSI: mechanism.psi.run_psi (both curators' ring, in one process: the sum of both curators'
  work) + common_tags; per-curator time is about half (each curator does s hashes and 2 s
  scalar multiplications);
- server-sampled (rekeyed path): the one upload's bytes and seconds, and seconds per release
  (sample, gather, re-key, PRAM, decrypt, estimate) at n = s, m = n / 10.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from secure_release.mechanism.alignment import common_tags, id_tags
from secure_release.mechanism.keys import AlignmentKey
from secure_release.mechanism.protocol import CuratorTable
from secure_release.mechanism.psi import PsiKey, run_psi
from secure_release.mechanism.schema import Attribute, CuratorSchema
from secure_release.mechanism.variants import StoredRelease, run_server_sampled_release


def _ids(size: int, offset: int) -> np.ndarray:
    return np.array([f"person-{i:09d}" for i in range(offset, offset + size)])


def bench_alignment(size: int) -> dict[str, float]:
    a, b = _ids(size, 0), _ids(size, size // 2)
    key = AlignmentKey.generate()
    t0 = time.perf_counter()
    hashed = common_tags([id_tags(a, key), id_tags(b, key)])
    t_hash = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = run_psi([a, b], [PsiKey.generate(), PsiKey.generate()])
    private = common_tags(run.tags)
    t_psi = time.perf_counter() - t0
    assert hashed.size == private.size == size - size // 2
    return {
        "ids_per_curator": size,
        "keyed_hash_s": t_hash,
        "psi_s": t_psi,
        "psi_per_curator_s": t_psi / 2,
        "psi_us_per_id_per_curator": 1e6 * t_psi / (2 * size),
        "ratio_psi_to_hash": t_psi / t_hash,
    }


def bench_server_sampled(n: int, releases: int = 3) -> dict[str, object]:
    rng = np.random.default_rng(0)
    ids = _ids(n, 0)
    alice = CuratorTable(
        CuratorSchema("alice", (Attribute("a", tuple("abcdef")),)), ids, {"a": rng.choice(list("abcdef"), n)}
    )
    bob = CuratorTable(
        CuratorSchema("bob", (Attribute("b", tuple("wxyz")),)), ids[::-1].copy(), {"b": rng.choice(list("wxyz"), n)}
    )
    rel = [StoredRelease(f"r{i}", 0.3, max(1, n // 10)) for i in range(releases)]
    out = run_server_sampled_release([alice, bob], rel)
    return {
        "n": n,
        "m": max(1, n // 10),
        "upload_bytes": out.upload_bytes,
        "upload_s": out.upload_seconds,
        "release_s": out.release_seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--stored", default="1000000,10000000", help="n of the server-sampled runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [bench_alignment(int(s)) for s in args.sizes.split(",") if s]
    stored = [bench_server_sampled(int(s)) for s in args.stored.split(",") if s]
    if args.json:
        print(json.dumps({"alignment": rows, "server_sampled": stored}, indent=2))
        return 0
    header = ("ids/curator", "keyed hash s", "PSI s", "PSI s/curator", "us/id/curator", "ratio")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (12, 13, 9, 14, 14, 8), strict=True)))
    for r in rows:
        print(
            f"{r['ids_per_curator']:>12} {r['keyed_hash_s']:>13.3f} {r['psi_s']:>9.1f} {r['psi_per_curator_s']:>14.1f}"
            f" {r['psi_us_per_id_per_curator']:>14.0f} {r['ratio_psi_to_hash']:>8.0f}"
        )
    for s in stored:
        print(f"server-sampled n={s['n']} m={s['m']}: upload {s['upload_bytes']} bytes in {s['upload_s']:.3f} s; "
              f"per release {', '.join(f'{t:.3f}' for t in s['release_s'])} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
