"""Alignment cost, PSI against the keyed hash, and the server-sampled variant (a script, not a test).

Run:  PYTHONPATH=. python bench/bench_psi.py [--sizes 10000,100000] [--json]
      PYTHONPATH=. python bench/bench_psi.py --deployed [--curators 2] [--workers 1] [--sizes ...]
      PYTHONPATH=. python bench/bench_psi.py --groups [--count 2000]

``--groups`` (issue 41): CPU microseconds per variable-base scalar multiplication (parse, multiply,
encode) and per hash to the group, in one run, for the group in use (secp256k1 through
libsecp256k1, :mod:`mechanism.alignment.psi_group`) and the candidates that are installed: libsodium's
edwards25519 through PyNaCl (the group before issue 41), ristretto255 through pysodium, X25519
through ``cryptography`` (clamped scalars: no inverses, so not usable for the ring's masks), and
coincurve's public API.

``--deployed``: each curator's side of the ring in its own process, as deployed (the lists pass
between the processes through pipes, standing in for the leader's mailbox). Per curator, in the
same run: the keyed hash of its ids (``id_tags``), then (after a barrier) the PSI wall time from
its start to its tags (``psi_start``, N - 1 hops, ``psi_finish_points`` and its tags, waits
included; the leader also tags its own F in every curator's domain) and the part
spent computing (wall, and the process's CPU seconds, which the machine's load does not
inflate); the leader's matching (``psi_leader_view`` + ``common_tags``) is checked against the
true intersection. Curator j holds the s/2 shared ids and s - s/2 of its own. ``--workers W``: each
curator spreads its per-element calls over W processes (``PsiWorkers``). The load average is
reported before and after.

For each size s: two curators with s ids each, half of them shared. Reported in the same run:
- keyed hash: mechanism.alignment.keyed_hash.id_tags for both curators + common_tags (seconds);
- PSI: mechanism.alignment.psi.run_psi (both curators' ring, in one process: the sum of both curators'
  work) + common_tags; per-curator time is about half (each curator does s hashes and 2 s
  scalar multiplications at N = 2);
- server-sampled (rekeyed path): the one upload's bytes and seconds, and seconds per release
  (sample, gather, re-key, PRAM, decrypt, estimate) at n = s, m = n / 10.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import time
from typing import Any

import numpy as np

from secure_release.mechanism.alignment.keyed_hash import TAG_DTYPE, common_tags, id_tags
from secure_release.mechanism.alignment.psi import (
    PsiKey,
    PsiWorkers,
    psi_finish_points,
    psi_leader_view,
    psi_reblind,
    psi_start,
    psi_tags,
    run_psi,
)
from secure_release.mechanism.primitives.keys import AlignmentKey
from secure_release.mechanism.protocol.architectures import StoredRelease, run_server_sampled_release
from secure_release.mechanism.protocol.in_memory import CuratorTable
from secure_release.mechanism.schema import Attribute, CuratorSchema


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


def _own_ids(size: int, curator: int) -> np.ndarray:
    """Curator ``curator``'s ids: the size // 2 shared ids, then size - size // 2 of its own."""
    shared = [f"person-{i:09d}" for i in range(size // 2)]
    return np.array(shared + [f"c{curator}-person-{i:09d}" for i in range(size - size // 2)])


def _curator(j: int, num: int, size: int, workers: int, akey: bytes, inbox: Any, outbox: Any, start: Any,
             results: Any) -> None:  # fmt: skip
    """One curator's side (a process): keyed hash, then the PSI ring through ``inbox``/``outbox``."""
    ids = _own_ids(size, j)
    t0 = time.perf_counter()
    hashed = id_tags(ids, AlignmentKey(akey))
    t_hash = time.perf_counter() - t0
    key = PsiKey.generate()  # fresh per run
    with PsiWorkers(workers) as pool:
        pool.run(len, [[0], [0]] * (workers > 1))  # start the worker processes before the clock
        start.wait()
        cpu0 = time.process_time()
        t0 = busy = time.perf_counter()
        own = psi_start(ids, key, pool, num)  # N = 2: unmasked (mechanism/alignment/psi.py)
        busy = time.perf_counter() - busy
        outbox.put((j, 1, own.sent))
        for hop in range(1, num):
            owner, got_hop, points = inbox.get()
            assert (owner, got_hop) == ((j - hop) % num, hop)
            t1 = time.perf_counter()
            points = psi_reblind(points, key, pool)
            busy += time.perf_counter() - t1
            outbox.put((owner, hop + 1, points))
        owner, got_hop, points = inbox.get()
        assert (owner, got_hop) == (j, num)
        t1 = time.perf_counter()
        finished = psi_finish_points(own, points, pool)
        tags = psi_tags(finished, j)  # in this curator's own tag domain (issue 23)
        domains = [psi_tags(finished, d).tobytes() for d in range(num)] if j == 0 else []  # the leader: all
        t_end = time.perf_counter()
        cpu = time.process_time() - cpu0
    results.put((j, t_hash, t_end - t0, busy + t_end - t1, tags.tobytes(), hashed.tobytes(), cpu, domains))


def bench_deployed(size: int, num: int = 2, workers: int = 1) -> dict[str, Any]:
    """One ring of ``num`` curator processes with ``size`` ids each (module doc)."""
    ctx = multiprocessing.get_context("spawn")
    inboxes = [ctx.Queue() for _ in range(num)]
    start, results = ctx.Barrier(num), ctx.Queue()
    akey = AlignmentKey.generate().reveal()
    load_before = os.getloadavg()
    procs = [ctx.Process(target=_curator, args=(j, num, size, workers, akey, inboxes[j], inboxes[(j + 1) % num],
                                                start, results)) for j in range(num)]  # fmt: skip
    for p in procs:
        p.start()
    got = sorted(results.get() for _ in range(num))
    for p in procs:
        p.join()
    load_after = os.getloadavg()
    t0 = time.perf_counter()
    leader = [np.frombuffer(d, dtype=TAG_DTYPE) for d in got[0][7]]
    view = psi_leader_view(leader, {g[0]: np.frombuffer(g[4], dtype=TAG_DTYPE) for g in got[1:]})
    psi_common = common_tags([leader[0], *view.values()])
    t_leader = time.perf_counter() - t0
    hash_common = common_tags([np.frombuffer(g[5], dtype=TAG_DTYPE) for g in got])
    assert psi_common.size == hash_common.size == size // 2, (psi_common.size, hash_common.size)
    psi_s = max(g[2] for g in got)
    hash_s = max(g[1] for g in got)
    return {
        "ids_per_curator": size,
        "curators": num,
        "workers_per_curator": workers,
        "psi_per_curator_s": [round(g[2], 3) for g in got],
        "psi_busy_per_curator_s": [round(g[3], 3) for g in got],
        "psi_cpu_per_curator_s": [round(g[6], 3) for g in got],  # this process only (not its workers)
        "psi_us_per_id_per_curator": 1e6 * psi_s / size,
        "keyed_hash_per_curator_s": [round(g[1], 4) for g in got],
        "leader_common_tags_s": t_leader,
        "ratio_psi_to_hash": psi_s / hash_s,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
    }


def _per_op(fn: Any, items: list[Any]) -> float:
    """CPU microseconds per call of ``fn`` over ``items`` (process time: the load does not count)."""
    t0 = time.process_time()
    for item in items:
        fn(item)
    return 1e6 * (time.process_time() - t0) / len(items)


def bench_groups(count: int = 2000) -> dict[str, float]:
    """Per-operation CPU cost of the group in use and of the installed candidates (module doc)."""
    import hashlib

    from secure_release.mechanism.alignment import psi_group as grp

    ids = [b"person-%09d" % i for i in range(count)]
    out: dict[str, float] = {}
    scalar = PsiKey.generate().scalar()
    points = [grp.hash_to_point(b"d", i) for i in ids]
    out["secp256k1 (libsecp256k1 cffi, in use): parse + tweak_mul + encode"] = _per_op(
        lambda p: grp.blind_packed(scalar, p), points)  # fmt: skip
    packed = b"".join(points)
    t0 = time.process_time()
    grp.blind_packed(scalar, packed)
    out["secp256k1 (in use): the same, one packed list"] = 1e6 * (time.process_time() - t0) / count
    t0 = time.process_time()
    grp.hash_packed(b"d", ids)
    out["secp256k1 (in use): hash to group, SHA-512 + SwiftEC, one list"] = 1e6 * (time.process_time() - t0) / count
    try:
        import coincurve

        out["secp256k1 (coincurve public API): PublicKey(p).multiply(k).format()"] = _per_op(
            lambda p: coincurve.PublicKey(p).multiply(scalar).format(), points)  # fmt: skip
    except ImportError:
        pass
    try:
        from nacl import bindings as so

        s25519 = so.crypto_core_ed25519_scalar_reduce(os.urandom(64))
        epoints = [so.crypto_core_ed25519_from_uniform(hashlib.sha512(i).digest()[:32]) for i in ids]
        out["edwards25519 (PyNaCl, before issue 41): crypto_scalarmult_ed25519_noclamp"] = _per_op(
            lambda p: so.crypto_scalarmult_ed25519_noclamp(s25519, p), epoints)  # fmt: skip

        def nacl_hash(i: bytes) -> bytes:
            d = hashlib.sha512(i).digest()
            return bytes(so.crypto_core_ed25519_add(so.crypto_core_ed25519_from_uniform(d[:32]),
                                                    so.crypto_core_ed25519_from_uniform(d[32:])))  # fmt: skip

        out["edwards25519 (PyNaCl, before issue 41): hash, SHA-512 + 2 Elligator 2 + add"] = _per_op(nacl_hash, ids)
    except ImportError:
        pass
    try:
        ps: Any = importlib.import_module("pysodium")  # optional, not a dependency

        rs = ps.crypto_core_ristretto255_scalar_random()
        rpoints = [ps.crypto_core_ristretto255_from_hash(hashlib.sha512(i).digest()) for i in ids]
        out["ristretto255 (pysodium): crypto_scalarmult_ristretto255"] = _per_op(
            lambda p: ps.crypto_scalarmult_ristretto255(rs, p), rpoints)  # fmt: skip
        out["ristretto255 (pysodium): hash, SHA-512 + from_hash"] = _per_op(
            lambda i: ps.crypto_core_ristretto255_from_hash(hashlib.sha512(i).digest()), ids)  # fmt: skip
    except (ImportError, OSError, ValueError):
        pass
    from cryptography.hazmat.primitives.asymmetric import x25519

    xk = x25519.X25519PrivateKey.generate()
    xpub = [x25519.X25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(count)]
    out["X25519 (cryptography, clamped): load + exchange"] = _per_op(
        lambda q: xk.exchange(x25519.X25519PublicKey.from_public_bytes(q)), xpub)  # fmt: skip
    return out


def bench_server_sampled(n: int, releases: int = 3) -> dict[str, Any]:
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
    parser.add_argument("--deployed", action="store_true", help="each curator in its own process (module doc)")
    parser.add_argument("--curators", type=int, default=2, help="--deployed: curators in the ring")
    parser.add_argument("--workers", type=int, default=1, help="--deployed: processes per curator")
    parser.add_argument("--groups", action="store_true", help="per-operation cost of the group candidates")
    parser.add_argument("--count", type=int, default=2000, help="--groups: operations per candidate")
    args = parser.parse_args()
    if args.groups:
        costs = bench_groups(args.count)
        load = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps({"us_cpu_per_op": costs, "load": load}, indent=2) if args.json else "\n".join(
            [*(f"{v:8.1f} us  {k}" for k, v in costs.items()), f"load {load}"]))  # fmt: skip
        return 0
    if args.deployed:
        for s in args.sizes.split(","):
            r = bench_deployed(int(s), args.curators, args.workers)
            print(json.dumps(r) if args.json else
                  f"{r['ids_per_curator']:>8} ids x {r['curators']} curators, {r['workers_per_curator']} worker(s): "
                  f"PSI per curator {r['psi_per_curator_s']} s (computing {r['psi_busy_per_curator_s']}, "
                  f"CPU {r['psi_cpu_per_curator_s']}), "
                  f"{r['psi_us_per_id_per_curator']:.0f} us/id; keyed hash {r['keyed_hash_per_curator_s']} s; "
                  f"ratio {r['ratio_psi_to_hash']:.0f}x; load {r['load_before']} -> {r['load_after']}",
                  flush=True)  # fmt: skip
        return 0
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
