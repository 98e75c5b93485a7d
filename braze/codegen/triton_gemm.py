"""A matmul node as a Triton GEMM (the one extern step the cuda device runs itself).

``(..., m, k) @ (..., k, n)`` with the batch dims the node's operands carry (broadcast
ones have stride 0): one program per (block of m x block of n, batch element), float32
accumulation through ``tl.dot`` (float32 inputs at IEEE precision: TF32 would be a
silent loss of 13 mantissa bits against the reference), the result rounded once to the
output's type. Specialised to the operands' shapes and strides, as the element kernels
are; offsets come with the pointers.
"""

from __future__ import annotations

from math import prod

from .. import dtypes as dt
from ..layout import Layout
from .triton import PRELUDE, TL, NotRendered, Rendered

def tiles(m: int, n: int, k: int, d: dt.DType) -> dict[str, int]:
    """Block sizes, warps and pipeline depth for a GEMM of these sizes: large tiles for
    many rows (tensor cores want 128 x 128 in half types), 16-row tiles for a few
    (decoding: the weight read dominates), smaller ones for IEEE float32 and float64,
    which run on the FMA units. Never wider than the problem needs."""
    def fit(b: int, size: int, least: int = 16) -> int:
        return max(least, min(b, 1 << max(0, (size - 1).bit_length())))
    if d is dt.float64:
        bm, bn, bk, warps, stages = 32, 32, 16, 4, 2
    elif d is dt.float32:
        bm, bn, bk, warps, stages = (16, 64, 64, 4, 3) if m <= 16 else (64, 64, 32, 4, 3)
    elif m <= 16:
        bm, bn, bk, warps, stages = 16, 128, 128, 4, 3
    elif m <= 64:
        bm, bn, bk, warps, stages = 64, 128, 64, 4, 3
    else:
        bm, bn, bk, warps, stages = 128, 128, 64, 8, 3
    return {"BM": fit(bm, m), "BN": fit(bn, n), "BK": fit(bk, k), "num_warps": warps, "num_stages": stages}


def gemm_source(a: Layout, b: Layout, d: dt.DType, name: str, interpret: bool = False) -> Rendered:
    """The Triton module of ``a @ b`` (dtype ``d``) into a contiguous output. Under
    Triton's interpreter bfloat16 tiles go into the dot as float32 (its ``tl.dot``
    multiplies bfloat16 as their raw 16-bit integers); a GPU takes them as they are."""
    if d not in (dt.float32, dt.float16, dt.bfloat16, dt.float64):
        raise NotRendered(f"a {d.name} matmul")
    *batch, m, k = a.shape
    n = b.shape[-1]
    sa, sb = a.strides, b.strides
    acc = "tl.float64" if d is dt.float64 else "tl.float32"
    widen = interpret and d is dt.bfloat16
    precision = ', input_precision="ieee"' if d in (dt.float32, dt.float64) or widen else ""
    meta = tiles(m, n, k, d)
    nb = -(-n // meta["BN"])
    lines = ["", "", "@triton.jit", f"def {name}(a, b, c, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):",
             "    pid = tl.program_id(0).to(tl.int64)",
             "    z = tl.program_id(1).to(tl.int64)",
             f"    pm = pid // {nb}", f"    pn = pid % {nb}",
             "    ao = z * 0", "    bo = z * 0", "    co = z * 0"]
    rest = "z"
    for i in range(len(batch) - 1, -1, -1):  # the batch coordinates of program z
        lines.append(f"    t{i} = {rest} % {batch[i]}")
        lines.append(f"    ao += t{i} * {sa[i]}")
        lines.append(f"    bo += t{i} * {sb[i]}")
        lines.append(f"    co += t{i} * {m * n * prod(batch[i + 1:])}")
        rest = f"({rest} // {batch[i]})"
    lines += [
        "    rm = pm * BM + tl.arange(0, BM).to(tl.int64)",
        "    rn = pn * BN + tl.arange(0, BN).to(tl.int64)",
        "    rk = tl.arange(0, BK).to(tl.int64)",
        f"    acc = tl.zeros([BM, BN], {acc})",
        f"    for k0 in range(0, {k}, BK):",
        "        ka = k0 + rk",
        f"        x = tl.load(a + ao + rm[:, None] * {sa[-2]} + ka[None, :] * {sa[-1]}, "
        f"mask=(rm[:, None] < {m}) & (ka[None, :] < {k}), other=0.0)",
        f"        y = tl.load(b + bo + ka[:, None] * {sb[-2]} + rn[None, :] * {sb[-1]}, "
        f"mask=(ka[:, None] < {k}) & (rn[None, :] < {n}), other=0.0)",
        *(["        x = x.to(tl.float32)", "        y = y.to(tl.float32)"] if widen else []),
        f"        acc += tl.dot(x, y, out_dtype={acc}{precision})",
        f"    tl.store(c + co + rm[:, None] * {n} + rn[None, :], acc.to({TL[d.name]}), "
        f"mask=(rm[:, None] < {m}) & (rn[None, :] < {n}))",
    ]
    return Rendered(PRELUDE + "\n".join(lines) + "\n", name, (-(-m // meta["BM"]) * nb, prod(batch)), meta)
