"""The quantized matmul kernel per GGML type and decoding mode, alone.

For each type: random blocks (finite float16 scales) of a (1536, 576) matrix (SmolLM2's
FFN up/gate: 0.3-1 MB, in the L2/L3 caches; (576, 1536), its ffn_down, for the K types
with their 256-element blocks) and of a (49152, 576) one (its output matrix: 15-60 MB,
streamed from DRAM; (18432, 1536) for the K types); x of 1 row (decoding) in each of the kernel's
four dots (``codegen/quant.py``'s ``MODE``: 0 float in registers, 1 int8 VNNI, 2
int16, 3 int8x2), and of 128 rows (prefill: the strips in int8x2). Each kernel is rendered from
the quant headers (``codegen/quant*.h``) exactly as a plan renders it, compiled by braze's compiler, and
called through ctypes; median of 15 calls after 3 warm-up calls, 1 thread.

    .venv/bin/python -m bench.quant_kernels [--types Q4_1,Q8_0] [--big]
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import statistics
import time
from typing import Any

import numpy as np

from braze.codegen import quant as qk
from braze.codegen.c import kernel_source
from braze.codegen.c_expr import PRELUDE
from braze.codegen.headers import header
from braze.quant import BLOCK_DTYPES, DTYPES, GGMLType
from braze.runtime import cpu
from braze.schedule.epilogue import plain


def blocks(qtype: GGMLType, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    if qtype.name in ("F32", "F16", "BF16"):  # float rows: normal values, as bytes
        x = rng.standard_normal((n, k)).astype(np.float32) * 0.05
        return (x if qtype.name == "F32" else x.astype(np.float16) if qtype.name == "F16"
                else (x.view(np.uint32) >> 16).astype(np.uint16)).view(np.uint8).reshape(-1)
    bdt = BLOCK_DTYPES[qtype]
    nb = n * k // DTYPES[qtype].block[0]  # type: ignore[index]
    raw = rng.integers(0, 256, nb * bdt.itemsize, dtype=np.uint8)
    view = raw.view(bdt)
    for f in ("d", "m", "dmin"):
        if f in (bdt.names or ()):
            view[f] = rng.uniform(-0.05, 0.05, nb).astype(np.float16)
    return raw


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def kernel(qtype: str, m: int, n: int, k: int, mode: int) -> Any:
    ldw = DTYPES[GGMLType[qtype]].nbytes(k)
    body = kernel_source(plain(qtype, m, n, k, k, ldw, 0, 0), "kq")
    src = "\n".join([header("cmath.h"), header("tile.h"), PRELUDE, qk.instantiations([body], {qtype: mode}), body])
    return cpu.compile_c(src, ["kq"]).function("kq", [ctypes.c_void_p, ctypes.c_int64])


def timed(fn: Any, args: Any, reps: int = 15) -> float:
    for _ in range(3):
        fn(args, 1)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(args, 1)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default=",".join(qk.QTYPES))
    ap.add_argument("--big", action="store_true", help="also the (49152, 576) matrix streamed from DRAM")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"CPU: {cpu_name()}; 1 thread; median of 15 calls")
    print("| type | rows x k | MB | float us | int8 us | int16 us | int8x2 us | mode used | GB/s (used) | prefill m=128 GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for q in args.types.split(","):
        qtype = GGMLType[q]
        # rows of 576 (SmolLM2's width) for the 32-element types, of 1536 (its ffn_down,
        # where the files keep their K quants) for the 256-element ones
        k = 1536 if (DTYPES[qtype].block or (32,))[0] == 256 else 576
        sizes = [1536 * 576 // k] + ([49152 * 576 // k] if args.big else [])
        for n in sizes:
            raw = blocks(qtype, n, k, rng)
            x = rng.standard_normal((128, k)).astype(np.float32)
            y = np.zeros((128, n), np.float32)
            argv_ = (ctypes.c_void_p * 3)(x.ctypes.data, raw.ctypes.data, y.ctypes.data)
            us = [timed(kernel(q, 1, n, k, mode), argv_) * 1e6 for mode in (0, 1, 2, 3)]
            used = qk.MODE.get(q, 0)
            gemm = timed(kernel(q, 128, n, k, used), argv_, reps=3 if n > 10000 else 7)
            print(f"| {q} | {n} x {k} | {raw.size / 1e6:.2f} | {us[0]:.1f} | {us[1]:.1f} | {us[2]:.1f} | {us[3]:.1f} | "
                  f"{['float', 'int8', 'int16', 'int8x2'][used]} | {raw.size / us[used] / 1e3:.1f} | "
                  f"{2 * 128 * n * k / gemm / 1e9:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
