"""How long should numpy's OpenBLAS workers spin after a call, in a process that also
runs braze's kernels?

OpenBLAS's worker threads spin for ``2 ** OPENBLAS_THREAD_TIMEOUT`` cycles (default
2^28, a tenth of a second or so) after each call before they sleep. On a 2-core
machine a spinning worker takes the second core from the OpenMP team of a braze kernel
launched right after a numpy matmul (a user's, or braze's own extern matmul step).
OpenBLAS reads the variable once, when numpy loads it, so every setting runs in its own
child process, and each child times:

  mixed    braze's fused attention, B=1, H=8, N=1024, D=64, 2 threads, each call right
           after a numpy 1024 x 1024 matmul on 2 threads (ms; the matmul not timed)
  alone    the same attention with no numpy call before it (ms)
  gemv     back-to-back numpy (576 x 576) @ (576,) products on 2 threads, as a small
           model's decoding makes them (us per call)
  generate the default model's ``braze generate`` of 64 tokens (tokens per second)

The settings are interleaved round by round (one child per setting per round) so that
background load on the shared machine hits them alike; medians over the rounds.
Run: ``python -m bench.blas_wait [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

SETTINGS: dict[str, dict[str, str]] = {
    "default (28)": {},
    "4": {"OPENBLAS_THREAD_TIMEOUT": "4"},
    "12": {"OPENBLAS_THREAD_TIMEOUT": "12"},
    "16": {"OPENBLAS_THREAD_TIMEOUT": "16"},
    "18": {"OPENBLAS_THREAD_TIMEOUT": "18"},
    "20": {"OPENBLAS_THREAD_TIMEOUT": "20"},
}

ROOT = Path(__file__).resolve().parent.parent


def child() -> dict[str, float]:
    """Runs in a fresh process whose environment holds the setting under test."""
    import time

    import numpy as np

    import braze
    from braze.nn import functional as F

    from .harness import blas_set_num_threads

    braze.set_num_threads(2)
    blas_set_num_threads(2)
    rng = np.random.default_rng(0)
    q, k, v = (braze.from_numpy(rng.standard_normal((1, 8, 1024, 64), dtype=np.float32)) for _ in range(3))
    x = rng.standard_normal((1024, 1024), dtype=np.float32)

    def attend() -> None:
        F.scaled_dot_product_attention(q, k, v).realize()

    attend()
    attend()
    mixed, alone = [], []
    for _ in range(7):
        x @ x
        t0 = time.perf_counter()
        attend()
        mixed.append(time.perf_counter() - t0)
        time.sleep(0.3)  # past any spin: the workers sleep
        t0 = time.perf_counter()
        attend()
        alone.append(time.perf_counter() - t0)
    w = rng.standard_normal((576, 576), dtype=np.float32)
    h = rng.standard_normal(576, dtype=np.float32)
    for _ in range(100):
        w @ h
    t0 = time.perf_counter()
    for _ in range(2000):
        w @ h
    gemv = (time.perf_counter() - t0) / 2000
    return {"mixed": statistics.median(mixed) * 1e3, "alone": statistics.median(alone) * 1e3, "gemv": gemv * 1e6}


def generate(env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, "-m", "braze.cli", "generate", "The capital of France is",
                          "--max-tokens", "64", "--stats"], capture_output=True, text=True, env=env, check=True)
    m = re.search(r"generated \d+ tokens, ([\d.]+) tok/s", out.stdout + out.stderr)
    if m is None:
        raise RuntimeError(f"no tokens/s in the output of braze generate: {out.stdout[-500:]} {out.stderr[-500:]}")
    return float(m.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.blas_wait", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child()))
        return 0
    results: dict[str, dict[str, list[float]]] = {name: {} for name in SETTINGS}
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    base["BRAZE_NUM_THREADS"] = "2"
    for r in range(args.rounds):
        for name, extra in SETTINGS.items():
            env = {**base, **extra}
            out = subprocess.run([sys.executable, "-m", "bench.blas_wait", "--child"], capture_output=True, text=True,
                                 env=env, cwd=ROOT, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["generate"] = generate(env)
            for key, value in row.items():
                results[name].setdefault(key, []).append(value)
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), file=sys.stderr)
    print(f"`python -m bench.blas_wait --rounds {args.rounds}`, 2 threads (braze and numpy's OpenBLAS), "
          f"medians of {args.rounds} rounds:\n")
    print("| OPENBLAS_THREAD_TIMEOUT | mixed (ms) | alone (ms) | gemv (us) | generate (tok/s) |")
    print("|---|---|---|---|---|")
    for name, cols in results.items():
        print(f"| {name} | " + " | ".join(f"{statistics.median(cols[k]):.2f}"
                                          for k in ("mixed", "alone", "gemv", "generate")) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
