"""What this machine's vector units do that ``-march=native`` does not say.

``-march=native`` tells the compiler which instructions exist, not how fast they run.
AMD's Zen 4 executes a 512-bit integer instruction as two 256-bit halves; Zen 5 and
Intel's server cores run it whole. The quantized matmul's one-row kernels dot two
blocks per 512-bit instruction where that halves their instructions, and one block per
256-bit one where it would not (``codegen/quant_rows.h``, ``BRAZE_WIDE512``; measured
in bench/RESULTS.md, twentieth and twenty-first sessions).

``wide_512()`` measures it once per machine: the same independent multiply-adds
(``vpmaddwd`` and ``vpaddd``, the kernels' own) in 512-bit and in 256-bit registers,
alternated, best of several rounds. 512-bit ones run whole when they take less than
``SPLIT_RATIO`` times as long as the same count of 256-bit ones (a split one takes 2x,
and two blocks an instruction then gain nothing). The verdict is kept in the runtime directory under the CPU's identity, so a
machine is measured once (at ``make install``, whose libraries include these kernels),
and ``BRAZE_WIDE512=0`` or ``1`` overrides it.
"""

from __future__ import annotations

import ctypes
import os
import threading

from ..errors import CompileError
from .cpu import _cpu_identity, compile_c, runtime_dir, sha256

SPLIT_RATIO = 1.75  # split: 2 (Zen 4); whole: 1 (Zen 5), up to 1.5 (Intel: 512-bit adds on two ports, not three)
ROUNDS = 5

_PROBE = r"""
#include <stdint.h>
#include <time.h>
#include <immintrin.h>
static double braze_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
/* n iterations of 8 independent multiply-add-accumulates in vectors of W bits */
#define BRAZE_PROBE(W, V, S)                                                                                \
    {                                                                                                    \
        V x[8], a[8];                                                                                    \
        const V one = _mm##S##_set1_epi16(1), w = _mm##S##_set1_epi16((short)seed);                       \
        for (int j = 0; j < 8; j++) { x[j] = _mm##S##_set1_epi16((short)(seed + j)); a[j] = _mm##S##_set1_epi32(0); } \
        for (int64_t i = 0; i < n; i++)                                                                  \
            for (int j = 0; j < 8; j++) {                                                                \
                x[j] = _mm##S##_add_epi16(x[j], one);                                                    \
                a[j] = _mm##S##_add_epi32(a[j], _mm##S##_madd_epi16(x[j], w));                           \
            }                                                                                            \
        for (int j = 0; j < 8; j++) out += _mm_cvtsi128_si32(_mm##S##_castsi##W##_si128(a[j]));           \
    }
/* seconds for n iterations, 512-bit (wide) or 256-bit; -1 where the compiler has no AVX-512BW */
double braze_simd_probe(int wide, int64_t n) {
#if defined(__AVX512BW__)
    volatile int seed = 1;
    int32_t out = 0;
    const double t0 = braze_now();
    if (wide) BRAZE_PROBE(512, __m512i, 512)
    else BRAZE_PROBE(256, __m256i, 256)
    seed = out;
    return braze_now() - t0;
#else
    (void)wide; (void)n;
    return -1.0;
#endif
}
"""

_lock = threading.Lock()
_verdict: bool | None = None


def measure_split_ratio(iterations: int = 200_000) -> float | None:
    """How many times longer 512-bit multiply-adds take than as many 256-bit ones
    (best of ``ROUNDS`` alternated rounds); None without AVX-512BW."""
    # built beside the machine-wide libraries, not in the kernel cache: a process's first
    # quantized matmul may ask from any thread, while the kernel cache is another's
    lib = compile_c(_PROBE, ["braze_simd_probe"], directory=runtime_dir())
    fn = lib.function("braze_simd_probe", [ctypes.c_int, ctypes.c_int64], restype=ctypes.c_double)
    if fn(1, 1) < 0:
        return None
    best = {0: float("inf"), 1: float("inf")}
    for _ in range(ROUNDS):
        for wide in (1, 0):
            best[wide] = min(best[wide], fn(wide, iterations))
    return best[1] / best[0]


def _verdict_file() -> str:
    return str(runtime_dir() / f"simd-{sha256(_cpu_identity().encode()).hexdigest()[:16]}")


def wide_512() -> bool:
    """Whether 512-bit integer instructions run whole on this machine (see the module)."""
    global _verdict
    env = os.environ.get("BRAZE_WIDE512", "").strip()
    if env in ("0", "1"):
        return env == "1"
    with _lock:
        if _verdict is None:
            _verdict = _stored_or_measured()
        return _verdict


def _stored_or_measured() -> bool:
    path = _verdict_file()
    try:
        with open(path) as f:
            kept = f.read().split()[:1]
        if kept in (["0"], ["1"]):
            return kept == ["1"]
    except OSError:
        pass  # (a missing or unreadable verdict, or one that is neither: measured again)
    try:
        ratio = measure_split_ratio()
    except CompileError:  # no compiler: no kernels either
        return False
    verdict = ratio is not None and ratio < SPLIT_RATIO
    tmp = f"{path}.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(f"{int(verdict)} 512-bit/256-bit time {ratio if ratio is None else round(ratio, 3)}\n")
        os.replace(tmp, path)
    except OSError:
        pass  # measured again next process
    return verdict
