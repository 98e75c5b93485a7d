"""Loop splitting: a row coordinate that indices read divided is split in two.

A view that merges dims no stride can (``repeat_kv``'s ``expand`` and ``reshape``:
query head ``h`` reads KV head ``h // groups``) reaches a kernel as an index with a
floor division (``ir.Affine.divs``). When the divisor divides the coordinate's extent,
the coordinate is two loops instead, ``h = hk * groups + g``: every index is affine
again (``h // groups`` is ``hk``), no division is left in the generated code, and the
chain renderer sees that the keys do not depend on ``g`` (query heads sharing a KV
head share its packed key tiles, as ``enable_gqa`` does).
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir


def split_divisions(k: ir.Kernel) -> ir.Kernel:
    """``k`` with every row coordinate that can be split so split (see the module doc)."""
    while True:
        c = _splittable(k)
        if c is None:
            return k
        k = _split(k, *c)


def _splittable(k: ir.Kernel) -> tuple[int, int] | None:
    """(coordinate, divisor) of the first row coordinate worth splitting."""
    if ir.scans_or_gathers(k):
        return None
    pinned = ir.pinned_coords(k)
    indices = ir.kernel_indices(k)
    for c, extent in enumerate(k.outer):
        divs = [(add, d) for a in indices for cc, add, d, _ in a.divs if cc == c]
        if not divs or c in pinned:
            continue
        d = min(dv for _, dv in divs)
        if all(add == 0 and dv % d == 0 for add, dv in divs) and extent % d == 0 and 1 < d < extent:
            return c, d
    return None


def _split(k: ir.Kernel, c: int, d: int) -> ir.Kernel:
    """``k`` with coordinate ``c`` as ``(c // d, c % d)``, later coordinates one further."""
    def index(a: ir.Affine) -> ir.Affine:
        coeffs = list(a.coeffs[:c]) + [a.coeffs[c] * d, a.coeffs[c]] + list(a.coeffs[c + 1:])
        divs = []
        for cc, add, dv, m in a.divs:
            if cc != c:
                divs.append((cc + (cc > c), add, dv, m))
            elif dv == d:
                coeffs[c] += m
            else:
                divs.append((c, 0, dv // d, m))
        return ir.Affine(a.offset, tuple(coeffs), tuple(divs))

    def expr(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Op):
            return ir.Op(e.name, tuple(expr(x) for x in e.args), e.dtype, e.attrs)
        if isinstance(e, ir.Dot):
            return replace(e, a=load(e.a), b=load(e.b))
        if isinstance(e, ir.Load):
            return load(e)
        if isinstance(e, ir.Coord) and e.dim > c:
            return replace(e, dim=e.dim + 1)
        return e

    def load(e: ir.Load) -> ir.Load:
        return replace(e, index=index(e.index), when=tuple((cc + (cc > c), lo, hi) for cc, lo, hi in e.when))

    def opt(e: ir.Expr | None) -> ir.Expr | None:
        return None if e is None else expr(e)

    stages: list[ir.Stage] = []
    for st in k.stages:
        if isinstance(st, ir.Reduce):
            # (an arg fold's position is a coordinate too: one after c moves with the rest)
            stages.append(replace(st, expr=expr(st.expr), repair=opt(st.repair), index=opt(st.index)))
        elif isinstance(st, ir.Contract):
            stages.append(replace(st, index=index(st.index), weight=expr(st.weight), v=load(st.v),
                                  post=expr(st.post), repair=opt(st.repair)))
        else:
            assert isinstance(st, (ir.Store, ir.StoreRow))
            stages.append(replace(st, index=index(st.index), expr=expr(st.expr)))
    outer = k.outer[:c] + (k.outer[c] // d, d) + k.outer[c + 1:]
    return ir.Kernel(outer, k.inner, stages, k.args, k.checks)
