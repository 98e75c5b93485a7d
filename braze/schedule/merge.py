"""Two open groups over the same rows, one kernel: a node that reads both (cosine
similarity's ``dot / (|a| * |b|)``, a penalty's ``where(seen, x / p, x * p)`` over two
rows' folds) would otherwise join one and make the other store its value and close.
The groups share no input (a fusion score of 0 kept them apart) and neither reads the
other (a group reading another's value closes it first), so their stages can run one
after the other in the same walk over the rows: ``merged`` renumbers the second's
kernel arguments and accumulators after the first's, and stores both groups' in-place
writes (neither may write what the other reads or writes: the walk would then order
them by row, not as recorded). An element-wise group takes the
other's loop order and row split (its own is free), and two element-wise groups of
different shapes meet at their common refinement (``reshape.py``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .. import ir
from . import reshape
from .group import Group


def _aligned(a: Group, b: Group) -> tuple[Group, Group] | None:
    """Copies of ``a`` and ``b`` over the same coordinates (``b``, element-wise, cut and
    renumbered to ``a``'s), or None."""
    a, b = replace(a, values=dict(a.values)), replace(b, values=dict(b.values))
    if a.elem_shape != b.elem_shape:
        if not (a.reorderable() and b.reorderable()):
            return None
        refined = reshape.common(a.elem_shape, b.elem_shape)
        if refined is None or not (reshape.refinable(a, refined) and reshape.refinable(b, refined)):
            return None
        reshape.refine(a, refined)
        reshape.refine(b, refined)
    if a.elem_map != b.elem_map or (a.outer, a.inner) != (b.outer, b.inner):
        if not b.reorderable():
            a, b = b, a
        if not b.reorderable():
            return None
        if a.elem_map != b.elem_map:
            at = {c: d for d, c in enumerate(a.elem_map)}  # a's coordinate -> elem dim
            b.reorder([b.elem_map[at[k]] for k in range(a.ndim)])
        b.outer, b.inner = a.outer, a.inner  # the same extents, cut as a's
    return a, b


def merged(a: Group, b: Group) -> Group | None:
    """One group computing what ``a`` and ``b`` compute (``a``'s gid), or None where
    they cannot share a kernel: other rows, a scan, a chain's contraction, row shapes
    that name other coordinates."""
    gid = a.gid
    if any(g.contract is not None or g.slices or any(isinstance(s, ir.Scan) for s in g.stages) for g in (a, b)):
        return None
    if any(set(x.writes) & (y.loaded | set(y.writes)) for x, y in ((a, b), (b, a))):
        return None  # (never met: a write closes the other groups that touch its target)
    pair = _aligned(a, b)
    if pair is None:
        return None
    a, b = pair
    if a.elem_shape != b.elem_shape or any(a.row_shapes.get(s, m) != m for s, m in b.row_shapes.items()):
        return None
    loads = dict(a.loads)
    args = {arg: loads.setdefault(key, len(loads)) for key, arg in b.loads.items()}
    shift = len(a.stages)

    def leaf(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Load):
            return replace(e, arg=args[e.arg], at=tuple((ir.mapped(i, leaf), st) for i, st in e.at))
        if isinstance(e, ir.Acc):
            return ir.Acc(e.stage + shift, e.dtype)
        return e

    def moved(s: Any) -> Any:
        assert getattr(s, "repair", None) is None  # repair terms come at close (``chain.rolling``)
        return replace(s, expr=ir.mapped(s.expr, leaf))

    refs = dict(a.refs)
    for arg, ref in b.refs.items():
        refs.setdefault(args[arg], ref)
    values = dict(a.values)
    values.update({k: replace(v, expr=ir.mapped(v.expr, leaf)) for k, v in b.values.items()})
    return replace(a, gid=gid, row_shapes={**a.row_shapes, **b.row_shapes}, stages=a.stages + [moved(s) for s in b.stages],
                  values=values, members=a.members + b.members, loads=loads, loaded=a.loaded | b.loaded,
                  recomputed=a.recomputed | b.recomputed, refs=refs, deps=a.deps | b.deps,
                  writes={**a.writes, **b.writes})
