"""Element-wise work on a reshaped view of a group's value: ``F.linear``'s output is
computed over ``(B * S, N)`` and read as ``(B, S, N)`` by the next op (a residual add,
GELU). The two shapes name the same elements; what differs is how the coordinates
are cut. Both are cut into their *common refinement* (``(16, 64)`` and ``(2, 8, 64)``:
``(2, 8, 64)``), where every layout of either is still affine (splitting a dim of
stride ``s`` into ``(a, b)`` gives strides ``(s * b, s)``; merging would need
divisions): the group's coordinates are split (``refine``: only while it is
element-wise, before a reduction fixes its rows) and the node is seen through its
operands split the same way (``seen_as``). Nothing is copied; the C loops are those
of the refined shape, which ``codegen/generic.py`` merges back where every index
walks them as one."""

from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import Any

from .. import ir
from ..layout import Layout, Shape
from ..ops.elementwise import BINARY, UNARY
from .group import Group, Value

#: ops whose element depends only on their inputs' same elements (no coordinates,
#: shapes or shifts): they may run over any cut of their shape
ELEMENTWISE = frozenset(UNARY) | frozenset(BINARY) | {"div", "floor_divide", "remainder", "pow", "where", "cast"}


def _suffixes(shape: Shape) -> set[int]:
    return {prod(shape[d:]) for d in range(len(shape) + 1)}


def common(a: Shape, b: Shape) -> Shape | None:
    """The coarsest shape that cuts both ``a`` and ``b`` (same number of elements, none
    zero) into pieces, built on ``a``'s dims (its dims of size 1 kept): each dim of
    ``a`` replaced by its pieces. None when no such shape exists ((6, 4) and (4, 6))."""
    if prod(a) != prod(b) or prod(a) == 0:
        return None
    cuts = sorted(_suffixes(a) | _suffixes(b))
    if any(hi % lo for lo, hi in zip(cuts, cuts[1:])):
        return None
    out: list[int] = []
    for d, n in enumerate(a):
        if n == 1:
            out.append(1)
            continue
        lo, hi = prod(a[d + 1:]), prod(a[d:])
        inside = [c for c in cuts if lo <= c <= hi]
        out.extend(inside[k + 1] // inside[k] for k in reversed(range(len(inside) - 1)))
    return tuple(out)


def split(layout: Layout, refined: Shape) -> Layout | None:
    """``layout`` as a layout of ``refined`` (a refinement of its shape up to dims of
    size 1), over the same elements; None if ``refined`` does not cut its shape."""
    cut = runs(layout.shape, refined)
    if cut is None:
        return None
    strides = [0] * len(refined)
    for d, rs in enumerate(cut):
        s = layout.strides[d]
        for r in reversed(rs):
            strides[r] = s
            s *= refined[r]
    return Layout(tuple(refined), tuple(strides), layout.offset)


def seen_as(node: Any, refined: Shape) -> Any:
    """An element-wise ``node`` with every operand split to ``refined`` (a stand-in for
    the scheduler: same op, storages and offsets), or None."""
    ops = []
    for o in (*node.inputs, *node.outputs):
        lay = split(o.layout, refined)
        if lay is None:
            return None
        ops.append(replace(o, layout=lay))
    n = len(node.inputs)
    return replace(node, inputs=tuple(ops[:n]), outputs=tuple(ops[n:]))


def reshaped(g: Group, node: Any) -> tuple[Group, Any] | None:
    """An element-wise ``node`` whose shape is not ``g``'s, at their common refinement:
    the group as it would be cut to it (a copy; ``g`` itself when no cut is needed)
    and the node seen at it. None when no such shape exists or ``g`` cannot be cut."""
    shape = node.outputs[0].layout.shape
    if node.op.name not in ELEMENTWISE or shape == g.elem_shape:
        return None
    # the node's own shape where it cuts the group's (its dims of size 1 kept: a
    # reduction over them may follow), else the cut of both built on the group's
    refined = shape if common(shape, g.elem_shape) == shape else common(g.elem_shape, shape)
    if refined is None or refined != g.elem_shape and not refinable(g, refined):
        return None
    seen = seen_as(node, refined)
    if seen is None:
        return None
    if refined != g.elem_shape:
        g = replace(g, values=dict(g.values))
        refine(g, refined)
    return g, seen


def runs(shape: Shape, refined: Shape) -> list[list[int]] | None:
    """For each dim of ``shape``, the dims of ``refined`` it is cut into, in order (a
    dim of size 1 may have none, and a piece of size 1 goes with the dim it precedes:
    ``refined`` may hold dims of size 1 ``shape`` has not, and drop some it has)."""
    out: list[list[int]] = []
    r = 0
    for n in shape:
        run: list[int] = []
        if n == 1:
            if r < len(refined) and refined[r] == 1:
                run, r = [r], r + 1
            out.append(run)
            continue
        left = n
        while left > 1 and r < len(refined) and left % refined[r] == 0:
            run.append(r)
            left //= refined[r]
            r += 1
        if left != 1:
            return None
        out.append(run)
    if any(n != 1 for n in refined[r:]) or not out and r < len(refined):
        return None
    if out:
        out[-1].extend(range(r, len(refined)))  # trailing pieces of size 1
    return out


def _cuts(g: Group, refined: Shape) -> dict[int, list[int]] | None:
    """Group coordinate -> the extents it is cut into (only the coordinates that are)."""
    cut = runs(g.elem_shape, refined)
    if cut is None:
        return None
    return {g.elem_map[d]: [refined[r] for r in rs] for d, rs in enumerate(cut) if len(rs) != 1}


def refinable(g: Group, refined: Shape) -> bool:
    """Can ``g``'s coordinates be cut to ``refined``: an element-wise group whose
    expressions use the coordinates to cut only through plain affine indices (no
    coordinate values, range guards or divisions there)."""
    if not g.reorderable():
        return False
    cuts = _cuts(g, refined)
    if cuts is None:
        return False
    for v in g.values.values():
        for e in ir.walk(v.expr):
            if isinstance(e, ir.Coord) and e.dim in cuts:
                return False
            if isinstance(e, ir.Load) and (any(c in cuts for c, _, _ in e.when)
                                           or not all(_exact(t, cuts) for t in e.index.divs)):
                return False
        if not all(_exact(t, cuts) for t in v.index.divs):
            return False
    return True


def _exact(term: tuple[int, int, int, int], cuts: dict[int, list[int]]) -> bool:
    """Is ``m * ((c + add) // d)`` affine once ``c`` is cut: an uncut coordinate, or a
    divisor that is the extent of the pieces after one (a repeat_interleave's ``j // 2``
    with j cut into (n, 2)): the quotient is then the pieces before it."""
    c, add, d, _ = term
    return c not in cuts or add == 0 and d in _steps(cuts[c])


def _steps(parts: list[int]) -> list[int]:
    """The stride of each piece of a cut coordinate, in the coordinate's units."""
    return [prod(parts[k + 1:]) for k in range(len(parts))]


def refine(g: Group, refined: Shape) -> None:
    """Cut ``g``'s coordinates to ``refined`` (``refinable`` said it can): each cut
    coordinate becomes consecutive ones, every index rewritten over them."""
    if refined == g.elem_shape:
        return
    cuts = _cuts(g, refined)
    assert cuts is not None
    extents = g.outer + g.inner
    new: dict[int, list[int]] = {}  # old coordinate -> its new coordinates
    sizes: list[int] = []
    for c, n in enumerate(extents):
        parts = cuts.get(c, [n])
        new[c] = list(range(len(sizes), len(sizes) + len(parts)))
        sizes.extend(parts)
    ndim = len(sizes)

    def index(a: ir.Affine) -> ir.Affine:
        coeffs = [0] * ndim
        for c, m in enumerate(a.coeffs):
            # (a coordinate cut into nothing has extent 1: its term is 0)
            for k, st in zip(new[c], _steps([sizes[k] for k in new[c]])):
                coeffs[k] += m * st if sizes[k] != 1 else 0  # as ``affine`` spells a dim of size 1
        divs = []
        for c, add, d, m in a.divs:
            if c not in cuts:
                divs.append((new[c][0], add, d, m))
                continue
            for k, st in zip(new[c], _steps(cuts[c])):  # (``_exact``: d is one of the steps)
                if st >= d and sizes[k] != 1:
                    coeffs[k] += m * (st // d)
        return ir.Affine(a.offset, tuple(coeffs), tuple(divs))

    def leaf(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Coord):
            return ir.Coord(new[e.dim][0], e.dtype)  # an uncut coordinate (``refinable``)
        if isinstance(e, ir.Load):
            return ir.Load(e.arg, index(e.index), e.dtype, tuple((new[c][0], lo, hi) for c, lo, hi in e.when),
                           tuple((ir.mapped(i, leaf), st) for i, st in e.at))
        return e

    n_outer = sum(len(new[c]) for c in range(len(g.outer)))
    g.outer, g.inner = tuple(sizes[:n_outer]), tuple(sizes[n_outer:])
    cut = runs(g.elem_shape, refined)
    assert cut is not None
    elem_map: list[int] = [0] * len(refined)
    for d, rs in enumerate(cut):
        for r, c in zip(rs, new[g.elem_map[d]]):
            elem_map[r] = c
    g.elem_shape, g.elem_map = tuple(refined), tuple(elem_map)
    for key, v in g.values.items():
        g.values[key] = Value(ir.mapped(v.expr, leaf), index(v.index), v.row, g.elem_shape, g.elem_map)

