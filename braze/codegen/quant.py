"""The quantized matmul kernel's C: one table entry per GGML type.

``codegen/quant.h`` and the headers beside it (``headers.QUANT_HEADERS``) hold the
kernels, written once for every type: each type brings an unpack function
(``quant_blocks.h``: a block to unsigned 8-bit values with a scale and offset per
chunk) or, for float types, a row converter. This table says which macro instantiates
a type and with what geometry; a new quant type is an unpack function there and an
entry here.
"""

from __future__ import annotations

import re

from .. import ir
from .headers import quant_source

# GGML type -> the instantiation: BRAZE_QLINEAR(name, elements per block, bytes per
# block, elements per scale chunk, mode, how batched rows read W) for the quantized
# types, BRAZE_FLINEAR(name) for the float ones. The mode says how decoding (few x rows) takes its dot products:
# 0 dequantizes W in registers against float x; 1 quantizes x to int8 blocks of 32 and
# takes integer dots (VNNI's vpdpbusd); 2 quantizes x to int16 (vpmaddwd); 3 (int8x2)
# rounds x to 15 bits: one row kept as int16 and dotted by vpmaddwd (and vpdpwssd),
# two and more rows with VNNI as two int8 halves, two vpdpbusd per block (without VNNI
# int16 too: quant_blocks.h's BRAZE_QS16). Batched rows (two or more, in mode 3: a batched step, a prompt's prefill) read W per
# strip of rows: `unpack` unpacks the strip into scratch once, `direct` (types whose
# values are plain nibbles or bytes) reads the blocks in the dot loop itself, one pass
# fewer (quant.h's braze_qx_w, with 512-bit VNNI).
QTYPES: dict[str, str] = {
    "Q4_0": "BRAZE_QLINEAR(q4_0, 32, 18, 32, {mode}, direct)",
    "Q4_1": "BRAZE_QLINEAR(q4_1, 32, 20, 32, {mode}, direct)",
    "Q5_0": "BRAZE_QLINEAR(q5_0, 32, 22, 32, {mode}, unpack)",
    "Q5_1": "BRAZE_QLINEAR(q5_1, 32, 24, 32, {mode}, unpack)",
    "Q8_0": "BRAZE_QLINEAR(q8_0, 32, 34, 32, {mode}, direct)",
    "Q2_K": "BRAZE_QLINEAR(q2_k, 256, 84, 16, {mode}, unpack)",
    "Q3_K": "BRAZE_QLINEAR(q3_k, 256, 110, 16, {mode}, unpack)",
    "Q4_K": "BRAZE_QLINEAR(q4_k, 256, 144, 32, {mode}, unpack)",
    "Q5_K": "BRAZE_QLINEAR(q5_k, 256, 176, 32, {mode}, unpack)",
    "Q6_K": "BRAZE_QLINEAR(q6_k, 256, 210, 16, {mode}, unpack)",
    "F32": "BRAZE_FLINEAR(f32)",
    "F16": "BRAZE_FLINEAR(f16)",
    "BF16": "BRAZE_FLINEAR(bf16)",
}
# Chosen by measurement (bench/RESULTS.md, "Quantized matmul kernels") and fidelity:
# int8 is the fastest dot (1.2-1.8x the float one), but rounding x to 8 bits moved
# SmolLM2's logits by up to 4.6 from Hugging Face's and changed its greedy text; int8x2
# costs 10-15% more than int8, moves them 2-3e-2 (of ~25; the float dot 1e-4, int16
# 1-2e-2) with every greedy token the same, and is 1.3-1.5x faster than int16 and the
# float dot. So every type takes int8x2. Tried and dropped (seventeenth session): int8
# for the blocks whose max|x| is within T times the row's RMS and 15 bits for the rest,
# so the dots could skip the low halves there: at T = 3, 70% of SmolLM2's blocks went
# to 8 bits, perplexity +0.1%, but logits moved 0.15-0.24 from Hugging Face's and the
# chat test's answer lost "Paris"; at T = 2 (46%) they still moved 0.16-0.29.
QUANTIZED = frozenset(q for q, line in QTYPES.items() if "QLINEAR" in line)
MODE: dict[str, int] = {q: 3 for q in QUANTIZED}
# per mode, the integers x is rounded to per block of 32: max|x| maps to LEVELS (0: float)
LEVELS: dict[int, int] = {0: 0, 1: 127, 2: 32767, 3: 16256}

MAX_WEIGHTS = 4  # weights one kernel takes against the same x (quant.h's BRAZE_QMAXW)
FEW = 8  # x rows of decoding: the RMSNorm prologue's reach, and where other modes (and float
# weights) take the GEMM past it (quant.h's BRAZE_QFEW); int8x2 takes the strips at any rows
_CALL = re.compile(r"braze_(?:qlinear|rowf|row)_(\w+)\b")


def supported(qtype: str) -> bool:
    return qtype in QTYPES


def kernel_source(k: ir.QLinear | ir.QRows, name: str, sizes: int = 0) -> str:
    """``void name(void **args, int64_t nthreads)``: x, the weights, then the epilogue's
    arguments (or w, ids, out) from the argument list. A QLinear's epilogue is the
    function ``{name}_ep``, its prologue ``{name}_pro`` (``codegen/c.py`` renders them
    before this); with a prologue, x is not read from argument 0. A generic kernel
    (its rows, ``n0``, given at run time: ``codegen/generic.py``) reads its sizes from
    the argument after those."""
    if isinstance(k, ir.QRows):
        row = f"braze_rowf_{k.qtype.lower()}" if k.qtype in QUANTIZED else f"braze_row_{k.qtype.lower()}"
        sized = "".join(line + "\n" for line in bind_sizes(3, sizes))
        return (f"void {name}(void **args, int64_t nthreads) {{\n    (void)nthreads;\n" + sized +
                f"    braze_qrows({k.n}, args[1], {int(k.ids64)}, (const uint8_t *)args[0], {k.ldw}, {k.rows}, {k.k},\n"
                f"        (float *)args[2], {row});\n}}\n")
    ws = ", ".join(f"(const uint8_t *)args[{1 + i}] + {off}" for i, off in enumerate(k.woff))
    x, pro = ("NULL", f"{name}_pro") if k.prologue else (f"(const float *)args[0] + {k.xoff}", "NULL")
    sized = "".join(line + "\n" for line in bind_sizes(1 + k.weights + len(k.args), sizes))
    return (f"void {name}(void **args, int64_t nthreads) {{\n" + sized +
            f"    const uint8_t *const w[{k.weights}] = {{{ws}}};\n"
            f"    braze_qlinear_{k.qtype.lower()}({k.m}, {k.n}, {k.k}, {x}, {k.lda}, w,"
            f" {k.weights}, {k.ldw},\n        {name}_ep, {pro}, args, nthreads);\n}}\n")


def bind_sizes(arg: int, sizes: int) -> list[str]:
    """A generic kernel's first lines (``codegen/generic.py``): its ``sizes`` named sizes
    ``n0`` ... from the int64 array at ``args[arg]``, after its buffers."""
    if not sizes:
        return []
    return [f"    const int64_t *restrict sz = (const int64_t *)args[{arg}];",
            *(f"    const int64_t n{i} = sz[{i}]; (void)n{i};" for i in range(sizes))]


def instantiations(kernel_sources: list[str], mode: dict[str, int] | None = None) -> str:
    """The quant headers and the instantiation of each type the kernels call, or "" if none does
    (``mode`` overrides ``MODE``: tests build every mode of every type). Generated
    modules link against the types' libraries instead (``codegen/qlib.py``)."""
    used = {m for src in kernel_sources for m in _CALL.findall(src)}
    if not used:
        return ""
    modes = MODE if mode is None else mode
    lines = [QTYPES[q].format(mode=modes.get(q, 0)) for q in QTYPES if q.lower() in used]
    return "\n".join([quant_source(), *lines]) if lines else ""
