"""The decoding matrix-vector kernel of this tree's quantized matmul headers
(``codegen/quant*.h``) against another revision's, side by side in one process.

    .venv/bin/python -m bench.quant_ab [--against HEAD] [--types Q4_0,Q4_1,Q5_0,Q8_0]

Both kernels are rendered from the same plan (one x row, int8x2, ``bench.quant_kernels``'s
random blocks), differing only in those headers, compiled by braze's compiler and called in
turn: per round the min of ``CALLS`` calls of each, the median of ``ROUNDS`` rounds, 1
thread. Shapes: SmolLM2's FFN up/gate (1536 x 576) and down (576 x 1536), and its output
matrix (49152 x 576, streamed from DRAM). Also prints how far apart the two outputs are.
This tree's headers carry the machine's ``BRAZE_WIDE512`` verdict (``runtime/simd.py``;
``BRAZE_WIDE512=0|1`` overrides it); the revision's get none, so their one-row kernels
take 256 bits: ``--against HEAD`` is the 256-bit kernels against this machine's choice.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import time
from typing import Any

import numpy as np

from bench.quant_kernels import PRELUDE, blocks, cpu, header, kernel_source, plain, qk
from braze.codegen.headers import QUANT_HEADERS, quant_source
from braze.quant import DTYPES, GGMLType

SHAPES = ((1536, 576), (576, 1536), (49152, 576))
CALLS, ROUNDS = 40, 5


def revision_source(rev: str) -> str:
    """The quantized matmul's headers at ``rev``, in this tree's order (a header the
    revision lacks, from before a split, is empty)."""
    def show(name: str) -> str:
        done = subprocess.run(["git", "show", f"{rev}:braze/codegen/{name}"], capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""
    return "\n".join(show(name) for name in QUANT_HEADERS)


def build(qtype: str, n: int, k: int, quant_c: str, tag: str) -> Any:
    ldw = DTYPES[GGMLType[qtype]].nbytes(k)
    body = kernel_source(plain(qtype, 1, n, k, k, ldw, 0, 0), "kq")
    inst = qk.instantiations([body], {qtype: 3})
    src = "\n".join([header("cmath.h"), header("tile.h"), PRELUDE, inst.replace(quant_source(), quant_c), body,
                     f"/* {tag} */"])
    return cpu.compile_c(src, ["kq"]).function("kq", [ctypes.c_void_p, ctypes.c_int64])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", default="HEAD", help="git revision whose quant headers are the baseline")
    ap.add_argument("--types", default="Q4_0,Q4_1,Q5_0,Q8_0")
    args = ap.parse_args(argv)
    old = revision_source(args.against)
    rng = np.random.default_rng(0)
    print(f"| type | n x k | {args.against} us | this tree us | speed | max diff (of max) |\n|---|---|---|---|---|---|")
    for qtype in args.types.split(","):
        for n, k in SHAPES:
            w = blocks(GGMLType[qtype], n, k, rng)
            x = rng.standard_normal((1, k)).astype(np.float32)
            y = np.zeros((1, n), np.float32)
            argv_c = (ctypes.c_void_p * 3)(x.ctypes.data, w.ctypes.data, y.ctypes.data)
            fns = {"old": build(qtype, n, k, old, "old"), "new": build(qtype, n, k, quant_source(), "new")}
            outs: dict[str, np.ndarray] = {}
            for name, fn in fns.items():
                fn(argv_c, 1)
                outs[name] = y.copy()
            best: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(ROUNDS):
                for name, fn in fns.items():
                    ts = []
                    for _ in range(CALLS):
                        t = time.perf_counter()
                        fn(argv_c, 1)
                        ts.append(time.perf_counter() - t)
                    best[name].append(min(ts))
            o, nw = (statistics.median(best[s]) * 1e6 for s in ("old", "new"))
            diff = float(np.abs(outs["old"] - outs["new"]).max())
            print(f"| {qtype} | {n} x {k} | {o:.1f} | {nw:.1f} | {o / nw:.2f}x | {diff:.1e} ({np.abs(outs['old']).max():.1f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
