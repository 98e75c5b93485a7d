"""Values of the index alone, recomputed where they are read instead of stored.

``arange``, ``full``, and element-wise work on them and on tensors that exist before
the flush (``arange(kv)[None, :] <= arange(q)[:, None] + off``: a causal mask; ``slope *
(j - i)``: an ALiBi bias) cost a few integer operations per element to recompute, but a
buffer, a kernel and a read to store. The scheduler asks ``find`` which storages of a
flushed stream are such values; a consumer reading one through any view computes it at
the index it reads instead (``Scheduler.operand``), so a mask over (queries x keys)
never exists in memory.

A value is recomputable when nothing in the flush writes its storage in place, and its
node is ``arange``/``full``, or element-wise with every input recomputable or a storage that exists before the flush and that nothing in the
flush writes (a later write would change what a late recompute reads). Expressions
stay small (``MAX_OPS``): recomputing a long chain at every use would cost more than
the load it saves.
"""

from __future__ import annotations

from math import prod
from typing import Any, Callable, Sequence

from .. import dtypes as dt
from .. import ir
from ..layout import Layout
from ..ops.lowering import REDUCTIONS, arange_value

Key = int
LoadAt = Callable[[Any, ir.Affine, tuple[int, int]], ir.Load]  # (storage, index, (node, input)) -> a load
Recompute = Callable[[ir.Affine, Sequence[int], LoadAt], "ir.Expr | None"]
MAX_OPS = 24
_NOT_POINTWISE = REDUCTIONS | {"cat", "pad"}


def dims_at(shape: Sequence[int], index: ir.Affine, extents: Sequence[int]) -> list[ir.Expr] | None:
    """The coordinates, per dim, of element ``index`` of a contiguous array of ``shape``,
    as int64 expressions of the group's coordinates (``extents``: each one's trip
    count); None when the index is not a view's: each coefficient a multiple of one
    dim's stride, and every coordinate's whole range within that dim (a row of 8 read
    from a (4, 2) value, ``a[:, :, None].expand(3, 4, 2).reshape(3, 8)``, walks two dims
    with one coordinate)."""
    strides = Layout.contiguous(tuple(shape)).strides
    starts, off = [], index.offset
    for n, st in zip(shape, strides):
        q, off = divmod(off, st) if n > 1 else (0, off)
        if q >= max(n, 1):
            return None
        starts.append(q)
    terms: list[list[tuple[int, int]]] = [[] for _ in shape]
    for c, coeff in enumerate(index.coeffs):
        if not coeff:
            continue
        dims = [d for d, (n, st) in enumerate(zip(shape, strides)) if n > 1 and coeff % st == 0 and coeff < st * n]
        if not dims:
            return None
        d = max(dims, key=lambda d: strides[d])
        terms[d].append((c, coeff // strides[d]))
    for start, ts, n in zip(starts, terms, shape):
        if start + sum(m * (extents[c] - 1) for c, m in ts) >= max(n, 1):
            return None
    out: list[ir.Expr] = []
    for start, ts in zip(starts, terms):
        e: ir.Expr | None = ir.Const(start, dt.int64) if start or not ts else None
        for c, m in ts:
            x: ir.Expr = ir.Coord(c, dt.int64)
            if m != 1:
                x = ir.Op("mul", (ir.Const(m, dt.int64), x), dt.int64)
            e = x if e is None else ir.Op("add", (e, x), dt.int64)
        assert e is not None
        out.append(e)
    return out


def _compose(layout: Layout, dims: list[ir.Expr], ndim: int) -> ir.Affine | None:
    """The flat index an operand layout reads at the node-output coordinates ``dims``."""
    offset, coeffs = layout.offset, [0] * ndim
    for stride, size, e in zip(layout.strides, layout.shape, dims):
        if size == 1 or stride == 0:
            continue
        lin = _linear(e)
        if lin is None:
            return None
        k0, cs = lin
        offset += stride * k0
        for c, m in cs.items():
            coeffs[c] += stride * m
    return ir.Affine(offset, tuple(coeffs))


def _linear(e: ir.Expr) -> tuple[int, dict[int, int]] | None:
    """``e`` (built by ``dims_at``) as constant + sum m * coord."""
    if isinstance(e, ir.Const):
        return int(e.value), {}
    if isinstance(e, ir.Coord):
        return 0, {e.dim: 1}
    if isinstance(e, ir.Op) and e.name == "mul" and isinstance(e.args[0], ir.Const) and isinstance(e.args[1], ir.Coord):
        return 0, {e.args[1].dim: int(e.args[0].value)}
    if isinstance(e, ir.Op) and e.name == "add":
        a, b = _linear(e.args[0]), _linear(e.args[1])
        if a is None or b is None:
            return None
        cs = dict(a[1])
        for c, m in b[1].items():
            cs[c] = cs.get(c, 0) + m
        return a[0] + b[0], cs
    return None


def find(nodes: Sequence[Any], key: Callable[[Any], Key]) -> dict[Key, Recompute]:
    """The recomputable storages of a flushed stream, each with how to recompute it."""
    written = {key(o.storage) for n in nodes if n.op.inplace for o in n.outputs}
    out: dict[Key, Recompute] = {}
    size: dict[Key, int] = {}
    for n, node in enumerate(nodes):
        if node.op.inplace or len(node.outputs) != 1:
            continue
        o = node.outputs[0]
        k = key(o.storage)
        if k in written:  # recomputed after the write, it would not see the write
            continue
        shape, dtype = o.layout.shape, o.storage.dtype
        if node.op.name == "full":
            out[k], size[k] = _full(node.attrs["value"], dtype), 1
        elif node.op.name == "arange":
            out[k], size[k] = _arange(node.attrs, dtype), 3
        elif node.op.lower is not None and node.op.name not in _NOT_POINTWISE and node.inputs:
            ins = [key(i.storage) for i in node.inputs]
            if not all(i in out or (i not in written and s.storage.array is not None)
                       for i, s in zip(ins, node.inputs)):
                continue
            n_ops = 1 + sum(size.get(i, 0) for i in ins)
            if n_ops > MAX_OPS:
                continue
            out[k], size[k] = _pointwise(n, node, shape, dtype, [out.get(i) for i in ins]), n_ops
    return out


def _full(value: Any, dtype: dt.DType) -> Recompute:
    return lambda index, extents, load_at: ir.Const(value, dtype)


def _arange(attrs: dict[str, Any], dtype: dt.DType) -> Recompute:
    def value(index: ir.Affine, extents: Sequence[int], load_at: LoadAt) -> ir.Expr | None:
        dims = dims_at((attrs["shape"][0],), index, extents)
        return None if dims is None else arange_value(attrs, dtype, dims[0])
    return value


def _pointwise(n: int, node: Any, shape: tuple[int, ...], dtype: dt.DType, inputs: list[Recompute | None]) -> Recompute:
    def value(index: ir.Affine, extents: Sequence[int], load_at: LoadAt) -> ir.Expr | None:
        dims = dims_at(shape, index, extents) if prod(shape) else None
        if dims is None:
            return None
        args: list[ir.Expr] = []
        for j, (o, rec) in enumerate(zip(node.inputs, inputs)):
            at = _compose(o.layout, dims, len(index.coeffs))
            if at is None:
                return None
            arg = rec(at, extents, load_at) if rec is not None else load_at(o.storage, at, (n, j))
            if arg is None:
                return None
            args.append(arg)
        res = node.op.lower(args, {**node.attrs, "coords": tuple(range(len(shape))), "at": dims, "in_shapes": []}, dtype)
        return res if isinstance(res, (ir.Load, ir.Const, ir.Coord, ir.Op)) else None
    return value
