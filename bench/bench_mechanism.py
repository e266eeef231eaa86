"""Throughput of the mechanism core on 10 M symbols (a script, not a test).

Run:  PYTHONPATH=. python bench/bench_mechanism.py [--json] [--symbols N] [--reps R]

Each figure is the best of R repetitions (default 3), measured in the same process as the raw
ChaCha20 keystream rate (mechanism.primitives.stream.keystream_words), so every rate is also reported as a
ratio to that rate: (symbols per second) / (keystream 8-byte words per second). Targets are
ratios to a same-run reference, so they hold on any machine: pad + encrypt (2 keystream bytes
a symbol) >= 1.0 keystream words/s (0.25 of keystream alone; bench_scale.py adds the memcpy
bound and targets 0.3 of keystream + memcpy), PRAM (8 bytes a row) >= 0.3, sampling 1 M of 10 M
>= 0.3 x (keystream time of its 10 M words) / time. The one-time pad draws 2 bytes a symbol
from the OS CSPRNG instead of the keystream, so its reference is the same-run os.urandom of
those bytes: time(os.urandom(2 N)) / time >= 0.3. The estimate at K = 10^6 uses no randomness
and keeps its absolute target (<= 50 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from secure_release.mechanism.estimation.estimators import estimate_joint, project_to_simplex
from secure_release.mechanism.primitives.keys import PadKey, PramKey, Seed
from secure_release.mechanism.primitives.pads import chacha20_pad, encrypt, otp_pad
from secure_release.mechanism.primitives.pram import PramChannel, perturb
from secure_release.mechanism.primitives.sampling import sample_positions
from secure_release.mechanism.primitives.stream import keystream_words, nonce_for


def best_of(fn: Callable[[], object], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--symbols", type=int, default=10_000_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    N, reps = args.symbols, args.reps
    rng = np.random.default_rng(0)
    k_alice, k_bob = 6, 4
    x_alice = rng.integers(0, k_alice, N, dtype=np.uint32)
    x_bob = rng.integers(0, k_bob, N, dtype=np.uint32)
    pad_key, pram_key, seed = PadKey(bytes(range(32))), PramKey(bytes(32)), Seed(bytes(32))

    raw_bytes = 80_000_000
    words = raw_bytes // 8
    t_ks = best_of(lambda: keystream_words(bytes(range(32)), nonce_for(0), 0, words), reps)
    ks_rate = words / t_ks

    t_pad = best_of(lambda: encrypt(x_alice, chacha20_pad(pad_key, k_alice, 0, N), k_alice), reps)
    t_otp = best_of(lambda: encrypt(x_alice, otp_pad(k_alice, N), k_alice), reps)
    t_os = best_of(lambda: os.urandom(2 * N), reps)  # the bytes otp_pad draws (16-bit words)
    gamma = 21.0
    channel = PramChannel(gamma, k_alice * k_bob)
    t_pram = best_of(lambda: perturb([x_alice, x_bob], (k_alice, k_bob), channel, pram_key), reps)
    m = N // 10
    t_sample = best_of(lambda: sample_positions(seed, N, m, "bench"), reps)
    K = 10**6
    counts = rng.poisson(2.0, K).astype(np.int64)
    est_channel = PramChannel(21.0, K)
    t_est = best_of(lambda: project_to_simplex(estimate_joint(counts, est_channel)), reps)

    def rate(seconds: float, target_ratio: float) -> dict[str, Any]:
        r = N / seconds
        return {
            "seconds": seconds,
            "symbols_per_s": r,
            "ratio_to_keystream": r / ks_rate,
            "target_ratio_to_keystream": target_ratio,
            "pass": r / ks_rate >= target_ratio,
        }

    results: dict[str, Any] = {
        "symbols": N,
        "repetitions": reps,
        "keystream": {
            "bytes": raw_bytes,
            "seconds": t_ks,
            "words_per_s": ks_rate,
            "bytes_per_s": raw_bytes / t_ks,
        },
        "chacha20_pad_encrypt": rate(t_pad, 1.0),
        "otp_pad_encrypt": {
            **rate(t_otp, 0.0),
            "os_random_seconds": t_os,
            "ratio_to_os_random": t_os / t_otp,
            "target_ratio_to_os_random": 0.3,
            "pass": t_os / t_otp >= 0.3,
        },
        "pram_two_columns": {**rate(t_pram, 0.3), "alphabets": [k_alice, k_bob], "gamma": gamma},
        "sampling": {
            "n": N,
            "m": m,
            "seconds": t_sample,
            "positions_per_s": N / t_sample,
            "ratio_to_keystream": (N / t_sample) / ks_rate,
            "target_ratio_to_keystream": 0.3,
            "pass": (N / t_sample) / ks_rate >= 0.3,
        },
        "estimate_K1e6": {"K": K, "seconds": t_est, "target_seconds": 0.05, "pass": t_est <= 0.05},
    }
    checks = [
        "chacha20_pad_encrypt",
        "otp_pad_encrypt",
        "pram_two_columns",
        "sampling",
        "estimate_K1e6",
    ]
    results["all_pass"] = all(results[c]["pass"] for c in checks)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    verdict = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
    print(
        f"ChaCha20 keystream ({raw_bytes / 1e6:.0f} MB): {t_ks:.3f} s = "
        f"{raw_bytes / t_ks / 1e9:.2f} GB/s "
        f"= {ks_rate / 1e6:.1f} M 8-byte words/s  (reference rate)"
    )
    print("ratios below: symbols/s divided by keystream 8-byte words/s")
    for name, label in [
        ("chacha20_pad_encrypt", "chacha20 pad + encrypt"),
        ("pram_two_columns", f"PRAM (2 cols, k=6,4, gamma={gamma:g})"),
    ]:
        r = results[name]
        print(
            f"{label:<34} {r['seconds']:.3f} s  {r['symbols_per_s'] / 1e6:7.1f} M symbols/s  "
            f"ratio {r['ratio_to_keystream']:.2f}  target >= {r['target_ratio_to_keystream']}  {verdict(r['pass'])}"
        )
    o = results["otp_pad_encrypt"]
    print(
        f"{'OTP pad + encrypt':<34} {o['seconds']:.3f} s  {o['symbols_per_s'] / 1e6:7.1f} M symbols/s  "
        f"ratio {o['ratio_to_os_random']:.2f} to os.urandom of its {2 * N / 1e6:.0f} MB  target >= 0.3  "
        f"{verdict(o['pass'])}"
    )
    s = results["sampling"]
    print(
        f"{'sampling 1 M of 10 M':<34} {s['seconds']:.3f} s  "
        f"{s['positions_per_s'] / 1e6:7.1f} M positions/s  "
        f"ratio {s['ratio_to_keystream']:.2f}  target >= 0.3  {verdict(s['pass'])}"
    )
    e = results["estimate_K1e6"]
    print(
        f"{'estimate_joint + projection K=1e6':<34} {e['seconds'] * 1e3:.1f} ms  target <= 50 ms  "
        f"{verdict(e['pass'])}"
    )
    print(f"overall: {verdict(results['all_pass'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
