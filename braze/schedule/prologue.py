"""Prologues: the group that computes a quantized matmul's x (an RMSNorm, a LayerNorm,
with the residual add it fused) done by the matmul kernel, row by row, just before it
quantizes x (``ir.QLinear.prologue``), so that x is neither stored nor read back and
the norm is no kernel of its own: ``rms_norm(x) @ W`` is one kernel.

Folded once the schedule is complete (every epilogue folded, every step at its
place): a group's kernel step whose result x only quantized matmuls read, each all of
x, at few rows (m <= ``quant.FEW``: decoding), moves into those matmuls. A prompt's
matmuls keep the norm a kernel of its own: their kernels are generic in their rows
(``codegen/generic.py``, one compile for every prompt length), which a prologue's
body, specialised to its group, is not. Every row of the group is a row of x (its outer
coordinates flatten to x's rows, its inner ones to x's columns), so the group's body
for row r is row r of x. Its other stores (the residual sum) are done by the first of
the matmuls; the others (q, k and v are three kernels) compute x again from the
group's inputs, a row of k elements. Moving the group down to the matmuls is safe when
no step in between writes the group's inputs nor, up to the first matmul, reads or
writes its other results: checked on those steps.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import Any

from .. import dtypes as dt
from .. import ir
from ..codegen import quant as quant_kernels
from .epilogue import flat_stride, touches
from .group import Key, KernelStep

Scheduler = Any  # fuse.Scheduler, which folds prologues through this module (it imports it)


def fold(s: Scheduler) -> list[tuple[int, str]]:
    """Fold every group that can be into the matmuls that read its result; for the
    others whose result a matmul reads, (the group's first node, why not)."""
    refused = []
    readers: dict[Key, list[KernelStep]] = {}  # x -> the matmuls that quantize it (a fold touches only its own)
    for st in s.steps:
        if isinstance(st, KernelStep) and isinstance(st.kernel, ir.QLinear):
            readers.setdefault(st.args[0], []).append(st)
    for step in [st for st in s.steps if isinstance(st, KernelStep) and isinstance(st.kernel, ir.Kernel)]:
        for y in step.outputs:
            if y not in readers:
                continue
            why = _fold(s, step, y, readers[y])
            if not why:
                break  # the group is gone
            refused.append((step.nodes[0], why))
    return refused


def _fold(s: Scheduler, step: KernelStep, y: Key, users: list[KernelStep]) -> str:
    """Move ``step``'s group into the matmuls ``users`` that read its result ``y`` as
    x, or say why not (and change nothing)."""
    k = step.kernel
    assert isinstance(k, ir.Kernel)
    q = users[0].kernel
    assert isinstance(q, ir.QLinear)
    if q.m > quant_kernels.FEW:
        return f"x has {q.m} rows (more than {quant_kernels.FEW}: a prompt's, whose matmuls are generic in their rows)"
    if any(isinstance(st, ir.Contract) for st in k.stages):
        return "a chain kernel"
    if k.checks:
        return "it gathers (its index checks are its kernel's)"
    if y in s.live:
        return "Python holds x"
    nodes = {n for u in users for n in u.nodes} | set(step.nodes)  # the group's own reads are in registers
    if any(r not in nodes for r in s.readers.get(y, ())) or any(y in u.args[1:] for u in users):
        return "x is read by more than the matmuls' quantizing"
    a = step.args.index(y)
    stores = [st for st in k.stages if isinstance(st, (ir.Store, ir.StoreRow)) and st.arg == a]
    loaded = {n.arg for st in k.stages for e in _exprs(st) for n in ir.walk(e) if isinstance(n, ir.Load)}
    if len(stores) != 1 or not isinstance(stores[0], ir.Store) or k.args[a][0] is not dt.float32:
        return "the group does not store x as one float32 element store"
    if any(k.args[b][1] for b in loaded):
        return "the group reads what it writes"
    n_out = len(k.outer)
    xs = stores[0]
    if prod(k.outer) != q.m or prod(k.inner) != q.k:
        return f"the group's rows {k.outer} x {k.inner} are not x's ({q.m}, {q.k})"
    rows, cols = flat_stride(xs.index.coeffs[:n_out], k.outer), flat_stride(xs.index.coeffs[n_out:], k.inner)
    for u in users:
        uq = u.kernel
        assert isinstance(uq, ir.QLinear)
        if (uq.m, uq.k) != (q.m, q.k) or cols != (1 if q.k > 1 else 0) or rows != (uq.lda if q.m > 1 else 0) \
                or xs.index.offset != uq.xoff:
            return "a matmul reads x through another view than the group stores it in"
    at = {id(st): i for i, st in enumerate(s.steps)}
    users = sorted(users, key=lambda u: at[id(u)])
    if at[id(users[0])] < at[id(step)]:
        return "a matmul runs before the group"  # it cannot: it reads the group's result; never moved up
    inputs = {step.args[b] for b in loaded}
    others = {key for b, key in enumerate(step.args) if k.args[b][1] and b != a}
    for n, u in enumerate(users):
        for st in s.steps[at[id(step)] + 1:at[id(u)]]:
            reads, writes = touches(s, st)
            if writes & inputs:
                return "a step between the group and a matmul writes the group's inputs"
            if n == 0 and (reads | writes) & others:
                return "a step between the group and the matmul reads or writes the group's other results"
    last_reduce = max((i for i, st in enumerate(k.stages) if isinstance(st, ir.Reduce)), default=-1)
    if len(users) > 1 and any(isinstance(st, (ir.Store, ir.StoreRow)) and st.arg != a
                              for st in k.stages[:last_reduce]):
        return "a store before a reduction (its stage numbers would move)"
    for n, u in enumerate(users):
        s.steps[at[id(u)]] = _with_prologue(step, a, u, stored=n == 0)
    s.steps = [st for st in s.steps if st is not step]
    s.materialized.discard(y)
    return ""


def _exprs(st: ir.Stage) -> list[ir.Expr]:
    """A stage's expressions, its repair term too."""
    out = ir.stage_exprs(st)
    if isinstance(st, ir.Reduce) and st.repair is not None:
        out.append(st.repair)
    return out


def _with_prologue(step: KernelStep, a: int, u: KernelStep, stored: bool) -> KernelStep:
    """Matmul step ``u`` computing its x (argument ``a`` of the group ``step``) by the
    group's body row by row; the group's other stores too when ``stored``."""
    k, q = step.kernel, u.kernel
    assert isinstance(k, ir.Kernel) and isinstance(q, ir.QLinear)
    n_out = len(k.outer)
    stages = [st for st in k.stages if stored or not isinstance(st, (ir.Store, ir.StoreRow)) or st.arg == a]
    used = sorted({n.arg for st in stages for e in _exprs(st) for n in ir.walk(e) if isinstance(n, ir.Load)}
                  | {st.arg for st in stages if isinstance(st, (ir.Store, ir.StoreRow))} - {a})
    arg = {a: 0, **{b: 1 + i for i, b in enumerate(used)}}

    def leaf(e: ir.Expr) -> ir.Expr:
        return replace(e, arg=arg[e.arg]) if isinstance(e, ir.Load) else e

    def moved(st: ir.Stage) -> ir.Stage:
        if isinstance(st, ir.Reduce):
            return replace(st, expr=ir.mapped(st.expr, leaf),
                           repair=None if st.repair is None else ir.mapped(st.repair, leaf))
        assert isinstance(st, (ir.Store, ir.StoreRow))
        # x's element j of the row: its inner coordinates only (the row is a buffer of k)
        index = ir.Affine(0, (0,) * n_out + st.index.coeffs[n_out:]) if st.arg == a else st.index
        return replace(st, arg=arg[st.arg], index=index, expr=ir.mapped(st.expr, leaf))

    pro = ir.Kernel(k.outer, k.inner, [moved(st) for st in stages], [(dt.float32, True), *(k.args[b] for b in used)])
    kernel = replace(q, prologue=pro, args=q.args + tuple(k.args[b] for b in used))
    # (an in-place write's target is written, not produced: not to be allocated)
    written = [step.args[b] for b in used if k.args[b][1] and step.args[b] in step.outputs]
    # argument 0 (x) is unused now: weight 0 stands in, a storage that exists
    return KernelStep(kernel, [u.args[1], *u.args[1:], *(step.args[b] for b in used)], u.outputs + written,
                      sorted(set(u.nodes) | set(step.nodes)), [u.refs[1], *u.refs[1:], *(step.refs[b] for b in used)])
