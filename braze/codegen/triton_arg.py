"""``argmax`` / ``argmin`` on the cuda device (greedy sampling's op): one program per
result element walks its row in blocks, keeping the best value and the first index
that holds it, as numpy's reference does (ties: the earliest; NaN counts as the
extreme, so the first NaN wins). Over all dims of a tensor the index is into the
flattened tensor, as PyTorch's (a contiguous one only).
"""

from __future__ import annotations

from math import prod

from .. import dtypes as dt
from ..layout import Layout
from .triton import PRELUDE, NotRendered, Rendered, block_for, identity, vtype


def arg_source(op: str, x: Layout, d: dt.DType, dims: tuple[int, ...], name: str) -> Rendered:
    """Arguments x, out (int64, contiguous, the reduced shape)."""
    if x.ndim == 0:
        raise NotRendered(f"{op} of a 0-d tensor")
    if len(dims) == x.ndim and x.ndim > 1:
        if x.strides != Layout.contiguous(x.shape).strides:
            raise NotRendered(f"{op} over every dim of a strided view")
        outer: list[tuple[int, int]] = []
        n, step = prod(x.shape), 1
    else:
        (r,) = dims
        outer = [(s, st) for i, (s, st) in enumerate(zip(x.shape, x.strides)) if i != r]
        n, step = x.shape[r], x.strides[r]
    largest = op == "argmax"
    t = "tl.int32" if d is dt.bool_ else vtype(d)
    worst = identity("amax" if largest else "amin", d)  # what every value beats or ties
    better = ">" if largest else "<"
    block = block_for(n)
    lines = ["", "", "@triton.jit", f"def {name}(x, out, BLOCK: tl.constexpr):",
             "    row = tl.program_id(0).to(tl.int64)", "    base = row * 0", "    rest = row"]
    for size, stride in reversed(outer):  # the row's start, from its outer coordinates
        lines += [f"    base += (rest % {size}) * {stride}", f"    rest = rest // {size}"]
    lines += [f"    best = tl.full([], {worst}, {t})",
              "    at = tl.full([], 0, tl.int64)",
              f"    nan = tl.full([], {n}, tl.int64)",
              f"    for start in range(0, {n}, BLOCK):",
              "        j = start + tl.arange(0, BLOCK).to(tl.int64)",
              f"        m = j < {n}",
              f"        v = tl.load(x + base + j * {step}, mask=m, other=0).to({t})",
              "        isnan = (v != v) & m",
              f"        nan = tl.minimum(nan, tl.min(tl.where(isnan, j, {n}), axis=0))",
              f"        v = tl.where(m & (v == v), v, {worst})",
              f"        top = tl.{'max' if largest else 'min'}(v, axis=0)",
              f"        first = tl.min(tl.where(m & (v == top), j, {n}), axis=0)",
              f"        take = top {better} best",
              "        at = tl.where(take, first, at)",
              "        best = tl.where(take, top, best)",
              f"    tl.store(out + row, tl.where(nan < {n}, nan, at))"]
    return Rendered(PRELUDE + "\n".join(lines) + "\n", name, (prod(s for s, _ in outer),), {"BLOCK": block})
