"""What one core can do against what numpy's BLAS and braze's GEMM tile reach, 1 thread.

    .venv/bin/python -m bench.peak
    .venv/bin/python -m bench.peak --smoke    # tiny counts, 1 rep: does it still work

- ``fma8`` / ``fma16``: twelve independent chains of fused multiply-adds on 8-float
  and 16-float GCC vectors (gcc -O3 -march=native): the core's FMA peak at each
  width. Where the core has 512-bit FMA units, ``fma16`` is twice ``fma8``; with
  AVX2 only, gcc splits 16-float vectors and the two agree.
- ``numpy_sgemm``: float32 ``a @ a`` at 1024 x 1024, and ``qk``: the attention
  benchmark's ``q @ k^T`` shape, (8, 1024, 64) @ (8, 64, 1024), through numpy's BLAS
  at one thread. OpenBLAS's core name says which kernels it picked for this CPU.
- ``braze_tile``: ``braze_mm_scaled_max`` on a 48 x 96 x 64 scores tile and
  ``braze_mm`` accumulating a 48 x 64 x 96 values tile, as a chain kernel calls them
  (``braze/codegen/tile.h``), in L1, compiled with braze's flags.

Median of 10 timed runs after warm-up, GFLOP/s. Why it matters: the dense-attention
ratios in ``bench/attention.py`` compare braze's tiles with numpy's BLAS; whether
either is at the core's peak is a property of the machine, measured here.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .harness import _blas_fn, blas_set_num_threads, machine

HDR = Path(__file__).resolve().parent.parent / "braze" / "codegen"

DRIVER = r"""
#include <math.h>
#include "cmath.h"
#include "tile.h"
typedef float v8 __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));
#define CHAINS(V, name)                                                        \
double name(long n) {                                                          \
    V a[12], b, c;                                                             \
    for (int i = 0; i < 12; i++) a[i] = (V){0} + (float)i;                     \
    b = (V){0} + 0.999999f; c = (V){0} + 1e-7f;                                \
    for (long k = 0; k < n; k++)                                               \
        for (int i = 0; i < 12; i++) a[i] = a[i] * b + c;                      \
    double s = 0;                                                              \
    for (int i = 0; i < 12; i++) for (unsigned l = 0; l < sizeof(V) / 4; l++) s += a[i][l]; \
    return s;                                                                  \
}
CHAINS(v8, fma8)
CHAINS(v16, fma16)
static float A[48 * 64], B[64 * 96], C[48 * 96], W[48 * 96], V[96 * 64], O[48 * 64], S[48], MX[48];
static int NF[48];
void tiles(long reps) {
    for (int i = 0; i < 48 * 64; i++) A[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < 64 * 96; i++) B[i] = (float)(i % 5) * 0.1f;
    for (int i = 0; i < 48 * 96; i++) W[i] = (float)(i % 3) * 0.1f;
    for (int i = 0; i < 96 * 64; i++) V[i] = (float)(i % 11) * 0.1f;
    for (int i = 0; i < 48; i++) S[i] = 0.125f;
    for (long r = 0; r < reps; r++) {
        braze_mm_scaled_max(48, 96, 64, A, 64, B, 96, C, 96, S, 0, 96, MX, NF);
        braze_mm(48, 64, 96, W, 96, V, 64, O, 64, 1);
        __asm__ volatile("" ::"r"(C), "r"(O) : "memory");
    }
}
"""


def _build(tmp: Path) -> ctypes.CDLL:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        sys.exit("bench.peak needs a C compiler (gcc or cc)")
    (tmp / "peak.c").write_text(DRIVER)
    so = tmp / "peak.so"
    proc = subprocess.run([cc, "-O3", "-march=native", "-ffp-contract=fast", "-fPIC", "-shared", "-std=gnu11",
                           f"-I{HDR}", str(tmp / "peak.c"), "-o", str(so)], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr)
    lib = ctypes.CDLL(str(so))
    for f in (lib.fma8, lib.fma16):
        f.restype, f.argtypes = ctypes.c_double, [ctypes.c_long]
    lib.tiles.restype, lib.tiles.argtypes = None, [ctypes.c_long]
    return lib


def _gflops(flops: float, fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return flops / statistics.median(times) / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.peak", description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny counts, 1 rep")
    args = ap.parse_args(argv)
    reps, scale = (1, 1000) if args.smoke else (10, 1)
    blas_set_num_threads(1)
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        lib = _build(Path(d))
        n = 20_000_000 // scale
        rows.append(("fma8 (12 chains of 8-float FMAs)", _gflops(n * 12 * 8 * 2, lambda: lib.fma8(n), reps)))
        rows.append(("fma16 (12 chains of 16-float FMAs)", _gflops(n * 12 * 16 * 2, lambda: lib.fma16(n), reps)))
        t = 20_000 // scale
        rows.append(("braze_tile (48x96x64 scores + 48x64x96 values, L1)",
                     _gflops(t * 2 * 2 * 48 * 96 * 64, lambda: lib.tiles(t), reps)))
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    rows.append(("numpy_sgemm 1024^3", _gflops(2 * 1024 ** 3, lambda: a @ a, reps)))
    q = np.random.default_rng(1).standard_normal((8, 1024, 64), dtype=np.float32)
    kt = np.random.default_rng(2).standard_normal((8, 64, 1024), dtype=np.float32)
    rows.append(("numpy qk (8,1024,64)@(8,64,1024)", _gflops(2 * 8 * 1024 * 1024 * 64, lambda: q @ kt, reps)))
    core = _blas_fn("corename")
    name = "unknown"
    if core is not None:
        core.restype = ctypes.c_char_p
        name = core().decode()
    m = machine()
    print(f"machine: {m.get('cpu')}, {m.get('cc')}, numpy {np.__version__}, OpenBLAS core: {name}; "
          f"1 thread, median of {reps} after warm-up\n")
    print("| what | GFLOP/s |\n|---|---|")
    for what, g in rows:
        print(f"| {what} | {g:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
