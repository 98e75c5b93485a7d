"""Epilogues: element-wise work on a quantized matmul's result done by the matmul
kernel as it stores (``ir.QLinear.epilogue``), so that the result is not written and
read back, and the work is no kernel of its own (a bias, a residual add,
``silu(gate) * up``).

A ``qlinear`` is first emitted as a plain QLinear step (its epilogue stores y) and
noted as *pending*. When an element-wise group closes and reads the y of pending steps
only at the element it computes (its loop's (r, j) is y's [r, j], over y's whole
(m, n)), the group becomes their epilogue: one kernel replaces them all, at the group's
place in the stream. Pending steps on the same x (one storage and layout, one type and
size) become one kernel with several weights: x is quantized once, each block of rows
computes every weight's sums, and the epilogue combines them (``silu(gate) * up``
reads x once). A y that Python can still reach, or that another node reads, is also
stored by the epilogue.

The matmul moves down to the group's place: that is safe when no step in between
writes x or a weight or reads y, which is checked on those steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod
from typing import Any, Callable

from .. import dtypes as dt
from .. import ir
from ..codegen import quant as quant_kernels
from .group import ExternStep, Key, KernelStep

Scheduler = Any  # fuse.Scheduler, which folds epilogues through this module (it imports it)


@dataclass
class Pending:
    """A plain QLinear step whose result no group has read yet."""

    step: KernelStep
    kernel: ir.QLinear  # the step's
    #: what steps must share to be one kernel: x's storage and offset, and the kernel
    #: less its weights and epilogue (type, sizes, strides)
    share: tuple[Any, ...]


def plain(qtype: str, m: int, n: int, k: int, lda: int, ldw: int, xoff: int, woff: int) -> ir.QLinear:
    """``y = x @ w.T``: the epilogue stores weight 0's sums into y (argument 2)."""
    return ir.QLinear(qtype, m, n, k, lda, ldw, (ir.Store(2, y_index(m, n), ir.Acc(0, dt.float32)),),
                      ((dt.float32, True),), xoff=xoff, woff=(woff,))


def y_index(m: int, n: int) -> ir.Affine:
    """Element [r, j] of a contiguous (m, n) result over (r, j) (a coordinate of extent
    1 has coefficient 0, as ``group.affine`` gives it)."""
    return ir.Affine(0, (n if m > 1 else 0, 1 if n > 1 else 0))


def flat_stride(coeffs: tuple[int, ...], sizes: tuple[int, ...]) -> int | None:
    """The stride of the flat index of coordinates of ``sizes`` (row-major) in an index
    with these coefficients, or None where it is not one (0 for no coordinate that moves)."""
    s: int | None = None
    span = 1
    for c, size in reversed(list(zip(coeffs, sizes))):
        if size == 1:
            continue
        if s is None:
            s = c
        elif c != s * span:
            return None
        span *= size
    return 0 if s is None else s


def _onto(shape: tuple[int, ...], m: int, n: int) -> Callable[[ir.Affine], ir.Affine | None] | None:
    """The map of an index over a group's coordinates (``shape``) onto (r, j) of an
    (m, n) result, where the leading coordinates flatten to r and the others to j; None
    where they do not. The map gives None for an index that is not a function of the
    flat r and j (a transposed read)."""
    split = next((p for p in range(len(shape) + 1) if prod(shape[:p]) == m and prod(shape[p:]) == n), None)
    if split is None:
        return None

    def at(a: ir.Affine) -> ir.Affine | None:
        if a.divs:
            return None
        cr, cj = flat_stride(a.coeffs[:split], shape[:split]), flat_stride(a.coeffs[split:], shape[split:])
        return None if cr is None or cj is None else ir.Affine(a.offset, (cr, cj))

    return at


def touches(s: Scheduler, st: KernelStep | ExternStep) -> tuple[set[Key], set[Key]]:
    """The storages a step reads and those it writes."""
    if isinstance(st, ExternStep):
        node = s.nodes[st.node]
        return {s.key(o.storage) for o in node.inputs}, {s.key(o.storage) for o in node.outputs}
    written = set(st.outputs)
    if isinstance(st.kernel, ir.Kernel):  # an in-place copy writes an argument it does not produce
        written |= {key for key, (_, w) in zip(st.args, st.kernel.args) if w}
    return set(st.args), written


def fold(s: Scheduler, step: KernelStep) -> KernelStep | str:
    """The kernel of a closing group's ``step`` with the pending matmuls whose results
    it reads as their epilogue, or why not ("" when it reads none)."""
    k = step.kernel
    assert isinstance(k, ir.Kernel)
    found = [(a, s.pending[key]) for a, key in enumerate(step.args) if key in s.pending]
    if not found:
        return ""
    if not all(isinstance(st, ir.Store) for st in k.stages):
        return "the group reduces (an epilogue is element-wise)"
    if k.checks:
        return "the group gathers (its index checks are its kernel's)"
    share = found[0][1].share
    found = [(a, p) for a, p in found if p.share == share][:quant_kernels.MAX_WEIGHTS]
    q = found[0][1].kernel
    at = _onto(k.outer + k.inner, q.m, q.n)
    if at is None:
        return f"its loop {k.outer + k.inner} is not the matmul's ({q.m}, {q.n})"
    weight = {a: i for i, (a, _) in enumerate(found)}
    kept = [a for a in range(len(step.args)) if a not in weight]
    first = 1 + len(found)
    arg = {a: first + i for i, a in enumerate(kept)}
    y_at = y_index(q.m, q.n)
    why: list[str] = []

    def leaf(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Load) and not e.when:
            index = at(e.index)
            if e.arg in weight and index == y_at:
                return ir.Acc(weight[e.arg], e.dtype)
            if e.arg not in weight and index is not None:
                return ir.Load(arg[e.arg], index, e.dtype)
        if isinstance(e, ir.Const):
            return e
        why.append("it reads a result at another element than [r, j] (a transposed or shifted read)"
                   if isinstance(e, ir.Load) and e.arg in weight else
                   f"it reads a {type(e).__name__} the epilogue has no index for")
        return e

    stores: list[ir.Store] = []
    for st in k.stages:
        assert isinstance(st, ir.Store)
        index = at(st.index)
        if index is None:
            return f"it stores at {st.index}, not a function of the matmul's [r, j]"
        stores.append(ir.Store(arg[st.arg], index, ir.mapped(st.expr, leaf)))
    if why:
        return why[0]
    ys = [step.args[a] for a, _ in found]
    start = min(i for i, st in enumerate(s.steps) if any(st is p.step for _, p in found))
    inputs = {share[0]} | {p.step.args[1] for _, p in found}
    for st in s.steps[start:]:
        if any(st is p.step for _, p in found):
            continue
        reads, writes = touches(s, st)
        if writes & inputs or reads & set(ys):
            return "a step between the matmul and the group writes its x or weight, or reads its result"
    nodes = set(step.nodes) | {p.step.nodes[0] for _, p in found}
    stored = [i for i, y in enumerate(ys) if y in s.live or any(r not in nodes for r in s.readers.get(y, ()))]
    stores += [ir.Store(first + len(kept) + n, y_at, ir.Acc(i, dt.float32)) for n, i in enumerate(stored)]
    kernel = replace(q, epilogue=tuple(stores), weights=len(found), woff=tuple(p.kernel.woff[0] for _, p in found),
                     args=tuple(k.args[a] for a in kept) + ((dt.float32, True),) * len(stored))
    head = found[0][1].step
    s.steps = [st for st in s.steps if not any(st is p.step for _, p in found)]
    for y in ys:
        del s.pending[y]
        s.materialized.discard(y)
    s.materialized.update(ys[i] for i in stored)
    return KernelStep(kernel, [head.args[0], *(p.step.args[1] for _, p in found), *(step.args[a] for a in kept),
                               *(ys[i] for i in stored)],
                      step.outputs + [ys[i] for i in stored], sorted(nodes),
                      [head.refs[0], *(p.step.refs[1] for _, p in found), *(step.refs[a] for a in kept),
                       *(None for _ in stored)])
