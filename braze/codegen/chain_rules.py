"""What the chain renderers (``codegen/chain.py`` for C, ``codegen/triton_chain.py``)
read off a chain kernel's IR (``schedule/chain.py``): its first matmul, the one score
node every fold reads, how a tile whose scores are all a mask's fill is recognised, when
the first level of reductions folds into the scores' GEMM, and which key and value
operands can be read where they lie."""

from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes as dt
from .. import ir
from .loops import passes


def the_dot(k: ir.Kernel) -> ir.Dot:
    dots = {n for s in k.stages for e in ir.stage_exprs(s) for n in ir.walk(e) if isinstance(n, ir.Dot)}
    assert len(dots) == 1, "a chain kernel has one first matmul"
    return dots.pop()


def score_node(k: ir.Kernel, dot: ir.Dot) -> ir.Expr | None:
    """The one expression of the scores every reduction and the weight read (the
    largest part of them built on the Dot without the running values), if there is one."""
    found: set[ir.Expr] = set()

    def visit(e: ir.Expr) -> None:
        nodes = list(ir.walk(e))
        if dot not in nodes:
            return
        if not any(isinstance(n, ir.Acc) for n in nodes):
            found.add(e)
        elif isinstance(e, ir.Op):
            for x in e.args:
                visit(x)
    for st in k.stages:
        for x in ir.stage_exprs(st):
            visit(x)
    return found.pop() if len(found) == 1 else None


@dataclass(frozen=True)
class Skip:
    """How a tile whose every score is a mask's fill is recognised (``skip_rule``)."""

    score: ir.Expr  # the score node every fold reads
    filled: ir.Expr  # per element, bool: this score is the fill
    fill: ir.Expr  # the fill's value, constant along the row
    kept: ir.Expr  # the score where it is not the fill, without an additive mask
    #: an additive mask ``m`` (score = kept + m): the score is the fill (-inf) where m
    #: is, but only for a finite ``dot * factor``, so a tile is skipped only when a bound
    #: on ``|dot * factor|`` proves it is
    bias: ir.Expr | None = None
    factor: ir.Expr | None = None


def skip_rule(k: ir.Kernel, dot: ir.Dot, n_outer: int) -> Skip | None:
    """A tile where every score is the fill can skip its matmuls if the fill is an
    identity for every reduction (checked at run time, per row: a -inf fill is, for max
    and for sums of exp). Two forms, with the mask and the fill free of the Dot:

    - ``where(c, s, fill)`` or ``where(c, fill, s)``, ``fill`` constant along the row
      (``is_causal``, a sliding window, a bool mask);
    - ``dot * f + m`` (or ``m + dot * f``, ``f`` constant along the row): an additive
      mask, whose -inf entries make the score -inf as long as the dot is finite.
    """
    x = score_node(k, dot)
    if not isinstance(x, ir.Op):
        return None
    if x.name == "where":
        c, a, b = x.args
        uses_dot = [dot in set(ir.walk(t)) for t in (c, a, b)]
        if uses_dot[0] or uses_dot[1] == uses_dot[2]:
            return None
        fill, kept = (b, a) if uses_dot[1] else (a, b)
        if ir.uses_inner(fill, n_outer):
            return None
        filled = ir.Op("eq", (c, ir.Const(False, dt.bool_)), dt.bool_) if uses_dot[1] else c
        return Skip(x, filled, fill, kept)
    if x.name == "add" and x.dtype is dt.float32:
        for t, m in (x.args, x.args[::-1]):
            scaled = scaled_dot(t, dot, n_outer)
            if scaled is not None and m.dtype in ir.CHAIN_DTYPES and dot not in set(ir.walk(m)) \
                    and not any(isinstance(a, ir.Acc) for a in ir.walk(m)):
                f, divides = scaled
                if f is not None and divides:
                    f = ir.Op("reciprocal", (f,), dt.float32)
                inf = ir.Const(float("-inf"), dt.float32)
                return Skip(x, ir.Op("eq", (m, inf), dt.bool_), inf, t, m, f)
    return None


def scaled_dot(e: ir.Expr, dot: ir.Dot, n_outer: int) -> tuple[ir.Expr | None, bool] | None:
    """``(f, divides)`` when ``e`` is the Dot (``f`` None), ``dot * f``, ``f * dot`` or
    ``dot / f`` with ``f`` a float constant along the row that reads neither the Dot
    nor a running value: scores ``braze_mm_scaled_max`` can compute while the GEMM's
    block is in registers (a division as the multiplication by ``1 / f`` that the
    renderer makes of it)."""
    if e == dot:
        return None, False
    if not isinstance(e, ir.Op) or e.name not in ("mul", "div") or e.dtype is not dt.float32:
        return None
    a, b = e.args
    if e.name == "mul" and b == dot:
        a, b = b, a
    if a != dot or b.dtype not in ir.CHAIN_DTYPES or ir.uses_inner(b, n_outer) \
            or any(isinstance(x, (ir.Dot, ir.Acc)) for x in ir.walk(b)):
        return None
    return b, e.name == "div"


def fused_max(k: ir.Kernel, dot: ir.Dot, n_outer: int) -> tuple[ir.Expr | None, bool, ir.Load | None] | None:
    """``scaled_dot`` of the scores where a tile has no mask fill, and the additive
    mask (a float32 load contiguous along the row, so its tile rows are pointers), when
    the first level of reductions is only running maxima of the scores and the weights
    read them: then ``braze_mm_scaled_max`` gives that level's fold with the scores tile
    and its loop over the tile is not needed (softmax's max, the weights' ``exp(s -
    max)``). An additive mask's -inf entries need no special case: they are what the
    max passes over and what the weights' exp makes 0."""
    score = score_node(k, dot)
    first = passes(k)[0] if passes(k) else []
    contract = next(s for s in k.stages if isinstance(s, ir.Contract))
    if score is None or not first or not any(isinstance(a, ir.Acc) for a in ir.walk(contract.weight)):
        return None
    for i in first:
        s = k.stages[i]
        if not isinstance(s, ir.Reduce) or s.op != "amax" or s.expr != score or s.dtype is not dt.float32:
            return None
    skip = skip_rule(k, dot, n_outer)
    bias: ir.Load | None = None
    if skip is not None:
        score = skip.kept
        if skip.bias is not None:
            if not isinstance(skip.bias, ir.Load) or skip.bias.dtype is not dt.float32 or skip.bias.when \
                    or skip.bias.index.coeffs[n_outer] != 1:
                return None
            bias = skip.bias
    scaled = scaled_dot(score, dot, n_outer)
    return None if scaled is None else (scaled[0], scaled[1], bias)


def batch_free(e: ir.Expr, n_batch_dims: int) -> bool:
    """Does ``e`` read no coordinate of the first ``n_batch_dims`` outer dims?"""
    for x in ir.walk(e):
        if isinstance(x, ir.Coord) and x.dim < n_batch_dims:
            return False
        if isinstance(x, ir.Load) and (any(x.index.uses(c) for c in range(n_batch_dims))
                                       or any(c < n_batch_dims for c, _, _ in x.when)):
            return False
    return True


def row_stride(v: ir.Load, n_outer: int) -> int | None:
    """The row stride of a key or value operand whose rows are contiguous along the head
    dim, a stride apart: float32 ones are read where they are (``rows_in_place``: no
    packed copy), half-type ones converted a tile's rows at a time (``HALF_ROWS``)."""
    c = v.index.coeffs
    if v.when or v.at or v.index.divs or c[n_outer + 1] != 1:
        return None  # (rows through a block table are packed: they lie in blocks, not a stride apart)
    return c[n_outer]


def rows_in_place(v: ir.Load, n_outer: int) -> int | None:
    """``row_stride`` of float32 rows, which the kernel reads where they are."""
    return row_stride(v, n_outer) if v.dtype is dt.float32 else None


#: the C that converts rows of a half type to float rows (``c_expr.PRELUDE``)
HALF_ROWS = {dt.float16: "braze_h2f_rows", dt.bfloat16: "braze_b2f_rows"}
#: the suffix of the C that multiplies by rows of a half type where they lie (``braze_mm_nt_h``, ``braze_mm_b``)
HALF_MM = {dt.float16: "h", dt.bfloat16: "b"}


def paged_rows(v: ir.Load, n_outer: int) -> tuple[int, int] | None:
    """(row stride, block size) of a key or value operand read through a block table
    whose rows are contiguous along the head dim and a stride apart within a block
    (``kp.view(blocks, bs, h, d)[table]``): a narrow task then reads each block's rows
    where they lie, a GEMM call per block (float32), or a conversion of the block's rows
    into the tile (float16, bfloat16), instead of an element-by-element pack."""
    c = v.index.coeffs
    if v.dtype not in (dt.float32, *HALF_ROWS) or v.when or len(v.at) != 1 or c[n_outer + 1] != 1:
        return None
    divs = list(v.index.divs)
    for n in ir.walk(v.at[0][0]):
        if isinstance(n, ir.Coord) and n.dim == n_outer or isinstance(n, ir.Load) and n.index.coeffs[n_outer]:
            return None
        if isinstance(n, ir.Load):
            divs += n.index.divs
    row = [(add, dv) for cc, add, dv, _ in divs if cc == n_outer]
    if not row or any(cc == n_outer + 1 for cc, _, _, _ in divs):
        return None
    bs = min(dv for _, dv in row)
    return (c[n_outer], bs) if all(add == 0 and dv % bs == 0 for add, dv in row) else None
