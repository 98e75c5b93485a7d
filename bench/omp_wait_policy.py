"""Which OpenMP wait policy should braze's CPU kernels run under?

libgomp reads ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` once, when it is loaded, so
every configuration runs in its own child process. Each child loads one kernel (an
element-wise float add with a ``num_threads(nt)`` clause, through braze's own
``compile_c``) and times:

  small  a stream of many small launches: 10k launches over 4096 floats
         (reported as microseconds per launch)
  gap    the same launches with ~20 us of Python work between them, as between the
         kernels of a decode step (microseconds per launch, Python work included)
  big    one launch over 32M floats (milliseconds)

at 1 and 2 threads, on an idle machine and with one competing busy-looping process;
the median of ROUNDS x REPEATS runs, the configurations interleaved round by round
(one child process per configuration per round) so that background load on a shared
machine hits them alike. Run: ``python bench/omp_wait_policy.py [--rounds 5 --repeats 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

POLICIES: dict[str, dict[str, str]] = {
    "default": {},  # libgomp: spin GOMP_SPINCOUNT=300k iterations, then sleep
    "active": {"OMP_WAIT_POLICY": "active"},
    "passive": {"OMP_WAIT_POLICY": "passive"},
    "spin=10k": {"GOMP_SPINCOUNT": "10000"},
}

SOURCE = r"""
#include <stdint.h>
void add(float* restrict out, const float* restrict a, const float* restrict b, int64_t n, int64_t nt) {
  #pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
"""


def child(so: str, nt: int, repeats: int, launches: int) -> dict[str, list[float]]:
    """Runs in a fresh process (so libgomp sees this process's env); loads the kernel
    straight from braze's cache with ctypes, to keep start-up short."""
    import ctypes

    import numpy as np

    fn = ctypes.CDLL(so)["add"]
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2
    fn.restype = None
    n = 4096
    a, b, o = (np.ones(n, np.float32) for _ in range(3))
    pa, pb, po = a.ctypes.data, b.ctypes.data, o.ctypes.data
    work = np.ones(64, np.float32)
    small: list[float] = []
    gap: list[float] = []
    big: list[float] = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(launches):
            fn(po, pa, pb, n, nt)
        small.append((time.perf_counter() - t) / launches * 1e6)
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(launches // 4):
            fn(po, pa, pb, n, nt)
            for _ in range(8):  # ~20 us of interpreter + small numpy work
                work += 1.0
        gap.append((time.perf_counter() - t) / (launches // 4) * 1e6)
    N = 32 << 20
    A, B, O = np.ones(N, np.float32), np.ones(N, np.float32), np.empty(N, np.float32)
    fn(O.ctypes.data, A.ctypes.data, B.ctypes.data, N, nt)  # touch pages
    for _ in range(repeats):
        t = time.perf_counter()
        fn(O.ctypes.data, A.ctypes.data, B.ctypes.data, N, nt)
        big.append((time.perf_counter() - t) * 1e3)
    assert O[0] == 2.0 and o[-1] == 2.0
    return {"small_us": small, "gap_us": gap, "big_ms": big}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (one child per config each)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per child; median over rounds*repeats")
    ap.add_argument("--launches", type=int, default=10_000)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.repeats, args.launches)))
        return
    from braze.runtime.cpu import compile_c

    so = str(compile_c(SOURCE, ["add"]).path)
    base_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    print(f"{args.rounds} interleaved rounds x {args.repeats} runs; loadavg before: "
          f"{open('/proc/loadavg').read().split()[:3]}")
    print(f"{'load':5} {'policy':9} {'nt':>2} {'small us/launch':>16} {'gap us/launch':>14} {'big ms':>8}")
    for load in ("idle", "busy"):
        hog = None
        if load == "busy":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.2)
        results: dict[tuple[str, int], dict[str, list[float]]] = {}
        try:
            # rounds interleave the configurations, so background load hits all alike
            for _ in range(args.rounds):
                for name, extra in POLICIES.items():
                    for nt in (1, 2):
                        out = subprocess.run(
                            [sys.executable, __file__, "--child", so, str(nt), "--repeats", str(args.repeats),
                             "--launches", str(args.launches)],
                            env={**base_env, **extra}, check=True, capture_output=True, text=True)
                        r = results.setdefault((name, nt), {})
                        for k, v in json.loads(out.stdout).items():
                            r.setdefault(k, []).extend(v)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        for (name, nt), r in results.items():
            med = {k: statistics.median(v) for k, v in r.items()}
            print(f"{load:5} {name:9} {nt:2d} {med['small_us']:16.2f} {med['gap_us']:14.2f} {med['big_ms']:8.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
