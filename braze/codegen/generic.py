"""Kernels generic in their sizes: one compiled kernel for every shape of a program.

A kernel's IR holds its sizes as ints, and its C spelled them as literals, so every new
shape of a program compiled anew (~0.3 s a kernel), and a program past
``BRAZE_SHAPE_VARIANTS`` shapes ran on the reference executor, 10-60x slower.
``symbolize`` turns a kernel's extents, and the strides and counts that are products
of them, into ``ir.Size`` values: ints that the renderer spells as names read from a
sizes argument when the kernel runs (``n0``, ``n1`` ...). The renderer takes every
decision on the values, as before (a size of one, a tensor past the cache); only the
spelling changes. So the rendered text is the kernel of this shape with its sizes
named, and where two shapes of a program render the same text they are the same C
program: the second reuses the first's compiled object with its own sizes (the
compile cache is keyed by the text). Whatever the renderer derives from a size by
other arithmetic stays a literal, so a shape on which it differs renders other text
and compiles anew: a missed reuse, never a wrong kernel.

Each loop's extent has a name of its own; a stride that is the product of the extents
after its loop is spelled as that product; any other stride, offset or range (a
slice's, a transposed view's, a cat's split) is a size of its own, one per place,
never matched to another by value: a coincidence of values at one shape (a head dim
equal to a prompt's length) would make that shape's text differ from its neighbours'.

Before naming, the loop nest is put in a canonical form, so that shapes of one program
render alike whatever their rank and whichever split of rows the scheduler chose for
their size: extents of 1 are dropped, neighbouring loops that every index walks as one
(a contiguous run, or a broadcast over both) are merged, and an element-wise kernel is
split as rows times its last loop. A GELU over (64, 256), (256, 1024) and (32, 512,
2048) is then one kernel of (rows, columns). Whether its stores stream past the cache
is decided when it runs (``codegen/c.py``: two bodies, chosen by the footprint).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .. import ir
from ..ir import Size
from . import quant


def _reindexed(k: ir.Kernel, outer: tuple[int, ...], inner: tuple[int, ...],
               coeffs: dict[ir.Affine, tuple[int, ...]]) -> ir.Kernel:
    """``k`` over a new loop nest, each index's coefficients from ``coeffs``."""
    def affine(a: ir.Affine) -> ir.Affine:
        return ir.Affine(a.offset, coeffs[a])

    def leaf(e: ir.Expr) -> ir.Expr:
        return replace(e, index=affine(e.index)) if isinstance(e, ir.Load) else e

    stages: list[ir.Stage] = []
    for st in k.stages:
        if isinstance(st, (ir.Reduce, ir.Scan)):
            stages.append(replace(st, expr=ir.mapped(st.expr, leaf)))
        else:
            assert isinstance(st, (ir.Store, ir.StoreRow))
            stages.append(replace(st, index=affine(st.index), expr=ir.mapped(st.expr, leaf)))
    return ir.Kernel(outer, inner, stages, k.args, k.checks)


def canonical(k: ir.Kernel) -> ir.Kernel:
    """The same kernel over the fewest loops (see the module's doc); ``k`` itself when
    it reads a coordinate or has repair terms (a rolling reduction), left as it is."""
    if ir.pinned_coords(k) or any(isinstance(st, ir.Reduce) and st.repair is not None for st in k.stages) \
            or any(a.divs for a in ir.kernel_indices(k)) or ir.scans_or_gathers(k):
        return k  # (a division pins the loop it divides)
    indices = list(dict.fromkeys(ir.kernel_indices(k)))
    dims = list(k.outer) + list(k.inner)
    n_out = len(k.outer)
    # loops as (extent, is outer, each index's coefficient)
    loops = [(d, i < n_out, [a.coeffs[i] for a in indices]) for i, d in enumerate(dims) if d != 1]
    if len(loops) > 1 and all(isinstance(st, ir.Store) for st in k.stages):
        # element-wise: any split is the same work, so rows times the last loop
        loops = [(d, j < len(loops) - 1, cs) for j, (d, _, cs) in enumerate(loops)]
    merged: list[tuple[int, bool, list[int]]] = []
    for d, out, cs in loops:
        if merged:
            pd, pout, pcs = merged[-1]
            if pout == out and all(p == c * d for p, c in zip(pcs, cs)):
                merged[-1] = (pd * d, out, cs)
                continue
        merged.append((d, out, cs))
    outer = tuple(d for d, out, _ in merged if out)
    inner = tuple(d for d, out, _ in merged if not out)
    if (outer, inner) == (k.outer, k.inner):
        return k
    coeffs = {a: tuple(cs[j] for _, _, cs in merged) for j, a in enumerate(indices)}
    return _reindexed(k, outer, inner, coeffs)


Generic = tuple[ir.Kernel | ir.QLinear | ir.QRows | ir.TopK, tuple[int, ...]]


def symbolize(k: ir.Kernel | ir.QLinear | ir.QRows | ir.TopK) -> Generic | None:
    """``k`` in canonical form with its sizes as ``ir.Size`` (and their values, in name
    order), or None for a kernel that has none to name (every extent 1). A chain kernel
    (attention) keeps its loops and its head dims, which size its tiles; its rows and
    keys are sizes. A quantized matmul's rows (a prompt's tokens, past the matrix-vector
    path, whose decoding kernels keep theirs) and a row gather's counts are its sizes."""
    if isinstance(k, ir.QLinear):
        return (replace(k, m=Size(k.m, "n0")), (k.m,)) if k.m > quant.FEW and k.prologue is None else None
    if isinstance(k, ir.TopK):  # every extent and stride a size of its own; k sizes its buffer
        given = (*k.outer, *k.xstrides, k.n, k.xstride, *k.ostrides, k.ostride)
        sz = [Size(v, f"n{i}") for i, v in enumerate(given)]
        r = len(k.outer)
        return replace(k, outer=tuple(sz[:r]), xstrides=tuple(sz[r:2 * r]), n=sz[2 * r], xstride=sz[2 * r + 1],
                       ostrides=tuple(sz[2 * r + 2:3 * r + 2]), ostride=sz[-1]), given
    if isinstance(k, ir.QRows):  # its count of ids, and of the table's rows (an intermediate's: a prompt's)
        given = tuple(v for v in (k.n, k.rows) if v > 1)
        n, rows = (Size(v, f"n{sum(u > 1 for u in (k.n, k.rows)[:i])}") if v > 1 else v
                   for i, v in enumerate((k.n, k.rows)))
        return (replace(k, n=n, rows=rows), given) if given else None
    chain = any(isinstance(st, ir.Contract) for st in k.stages)
    if not chain:  # a chain's loops are its renderer's (rows, keys): left as they are
        k = canonical(k)
    dims = list(k.outer) + list(k.inner)
    # each loop's extent has a name of its own, even where two are equal: (512, 512) is
    # then the same text as (256, 1024)
    values = [d for d in dims if d > 1]
    if not values:
        return None
    named = iter(range(1 << 30))
    names: list[int] = [Size(d, f"n{next(named)}") if d > 1 else d for d in dims]
    extras: dict[Any, int] = {}  # each stride or offset made of no extents, by where it is

    def after(i: int) -> int:
        """The product of the extents after loop i: the stride a contiguous layout gives it."""
        p = 1
        for n in names[i + 1:]:
            p = p * n
        return p

    extra: list[int] = []

    def spelled(v: int, where: Any, loop: int | None = None) -> int:
        """``v`` as the product of the extents after ``loop`` where it is that, else as a
        size of its own, one per place (``where``): never by a coincidence of values
        (a head dim equal to a prompt's length), which would make another shape's text
        differ."""
        if type(v) is not int or v in (0, 1):  # a unit stride, no offset: structure, not size
            return v
        if loop is not None and v == after(loop):
            return after(loop)
        if where not in extras:
            extras[where] = Size(v, f"n{next(named)}")
            extra.append(v)
        return extras[where]

    def affine(a: ir.Affine, arg: int) -> ir.Affine:
        divs = tuple((c, spelled(add, (arg, a, j, "add")), spelled(d, (arg, a, j, "div")), spelled(m, (arg, a, j, "m")))
                     for j, (c, add, d, m) in enumerate(a.divs))
        # A chain's matmul operands index one coordinate more than the loops (the head
        # dim), and skip one of them (queries skip the keys' axis): the extents after a
        # loop are not their strides, and matching them would be a coincidence (a row
        # stride of 64 against a 64-token prompt's keys).
        loops = len(a.coeffs) == len(dims)
        return ir.Affine(spelled(a.offset, (arg, a, -1)),
                         tuple(spelled(c, (arg, a, i), i if loops else None) for i, c in enumerate(a.coeffs)), divs)

    def load(e: ir.Load) -> ir.Load:  # a cat's or pad's range too: where its input lies
        # (a value recomputed under a pad of a cat has two guards on one coordinate)
        when = tuple((c, spelled(lo, (e.arg, e.index, c, "lo", j)), spelled(hi, (e.arg, e.index, c, "hi", j)))
                     for j, (c, lo, hi) in enumerate(e.when))
        # a gather's terms: its index (loads, and the checked size) and the stride it picks along
        at = tuple((mapped(i), spelled(st, (e.arg, e.index, "at", j))) for j, (i, st) in enumerate(e.at))
        return replace(e, index=affine(e.index, e.arg), when=when, at=at)

    def expr(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Load):
            return load(e)
        if isinstance(e, ir.Const):  # a mean's count: the product of the inner extents
            return replace(e, value=spelled(e.value, ("const", e), len(k.outer) - 1))
        if isinstance(e, ir.Dot):  # its length (the head dim) stays: the tiles are sized by it
            return replace(e, a=load(e.a), b=load(e.b))
        return e

    def mapped(e: ir.Expr | None) -> Any:
        return None if e is None else ir.mapped(e, expr)

    stages: list[ir.Stage] = []
    for st in k.stages:
        if isinstance(st, ir.Reduce):
            stages.append(replace(st, expr=mapped(st.expr), repair=mapped(st.repair)))
        elif isinstance(st, ir.Scan):
            stages.append(replace(st, expr=mapped(st.expr)))
        elif isinstance(st, ir.Store) and st.at:  # a scatter's rows: as a gather's terms
            at = tuple((mapped(i), spelled(s, (st.arg, st.index, "at", j))) for j, (i, s) in enumerate(st.at))
            stages.append(replace(st, index=affine(st.index, st.arg), expr=mapped(st.expr), at=at))
        elif isinstance(st, (ir.Store, ir.StoreRow)):
            stages.append(replace(st, index=affine(st.index, st.arg), expr=mapped(st.expr)))
        elif isinstance(st, ir.Contract):  # its size (the value rows' width) stays, as the Dot's length
            stages.append(replace(st, index=affine(st.index, st.arg), weight=mapped(st.weight), v=load(st.v),
                                  post=mapped(st.post), repair=mapped(st.repair)))
        else:
            return None
    out = ir.Kernel(tuple(names[:len(k.outer)]), tuple(names[len(k.outer):]), stages, k.args, k.checks)
    return out, tuple(values + extra)
