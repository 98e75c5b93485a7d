"""Lowerings: how each registry op becomes loop IR (``OpDef.lower``).

An element-wise op lowers to an ``ir.Op`` over its operands' expressions; a reduction
lowers to a ``ReduceSpec`` (the fold and what to do with the folded value per row);
creation ops lower to constants and coordinates; gathers to loads at a checked,
data-dependent index. Ops without a lowering here (matmul, sort, ...) run as extern
steps inside a plan, between fused kernels.

A lowering may refuse by returning None for a particular dtype or attribute, when the
C code would not reproduce the reference bit for bit in meaning (integer division by
zero, float floor division): those nodes then
run as extern steps, and ``BRAZE_DEBUG=1`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .. import dtypes as dt
from .. import ir
from ..dtypes import DType
from .elementwise import BINARY, UNARY
from .registry import REGISTRY

#: ``lower(args, attrs, out_dtype)``: ``args`` are the inputs' expressions in the group's
#: coordinates; ``attrs`` are the node's, plus ``coords`` (the group coordinate of each
#: output dim) and ``in_shapes``, which movement-like ops (cat, pad) need; a value
#: recomputed where it is read (schedule/recompute.py) also gets ``at``: each output dim
#: as an int64 expression of the reader's coordinates.
Lowering = Callable[[list[ir.Expr], dict[str, Any], DType], "ir.Expr | ReduceSpec | None"]


@dataclass(frozen=True)
class ReduceSpec:
    """A reduction as the scheduler needs it: fold ``op`` in ``acc`` dtype, then ``post``."""

    op: str
    acc: DType
    post: str  # "none", "mean", "var", "scan" (a prefix fold: ``ir.Scan``)
    correction: float = 0.0


#: The arg folds: the first position of a row's extreme (NaN the largest), a fold of
#: (value, index) pairs (``ir.Reduce.index``, ``codegen/argfold.py``).
ARG_REDUCTIONS = frozenset({"argmax", "argmin"})
#: The reductions that lower; the scheduler treats their nodes as row folds.
REDUCTIONS = frozenset({"sum", "prod", "mean", "var", "amax", "amin", "any", "all"}) | ARG_REDUCTIONS
#: The scans that lower (``ir.Scan``: a prefix fold along the row, ``post`` "scan").
SCANS = frozenset({"cumsum"})


def _pointwise(name: str) -> Lowering:
    def lower(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
        return ir.Op(name, tuple(args), out)
    return lower


def _int_division(name: str) -> Lowering:
    """``//`` and ``%`` lower for integers only, through helpers that give 0 for a zero
    divisor as the reference does (C leaves it undefined). Float operands stay extern:
    numpy's float floor division has corner cases (1 // 0.1 == 9) a C expression misses."""
    def lower(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
        return ir.Op(name, tuple(args), out) if out.is_integer else None
    return lower


def _cast(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
    # float -> int saturates and maps nan to 0, as the reference defines it (codegen/c.py)
    return ir.Op("cast", tuple(args), out)


def _pow(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
    return ir.Op("pow", tuple(args), out) if out.is_floating_point else None


def _reduce(op: str) -> Lowering:
    def lower(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ReduceSpec | None:
        src = args[0].dtype
        if op in ("sum", "prod"):
            if src is dt.bool_ or src.is_integer:
                return ReduceSpec(op, dt.int64, "none")
            return ReduceSpec(op, dt.float64 if src is dt.float64 else dt.float32, "none")
        if op in ("amax", "amin"):
            return ReduceSpec(op, src if not src.is_half else dt.float32, "none")
        if op == "mean":
            return ReduceSpec("sum", dt.float64 if src is dt.float64 else dt.float32, "mean")
        if op == "var":  # two folds: the mean, then the squares about it (fuse.Scheduler.reduce)
            return ReduceSpec("sum", dt.float64 if src is dt.float64 else dt.float32, "var", attrs["correction"])
        if op in ("any", "all"):
            return ReduceSpec(op, dt.bool_, "none")
        if op in ARG_REDUCTIONS and attrs["in_shapes"][0] and len(attrs["dims"]) == 1:
            return ReduceSpec(op, dt.int64, "none")  # (a 0-d input's is a constant 0: the reference's)
        return None
    return lower


def _cumsum(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ReduceSpec | None:
    """``cumsum`` folds in the reference's accumulator: int64 for integers and bools,
    float64 for float64, float32 for the others (half types, rounded when stored)."""
    if not attrs["in_shapes"][0]:
        return None
    src = args[0].dtype
    acc = dt.int64 if src is dt.bool_ or src.is_integer else dt.float64 if src is dt.float64 else dt.float32
    return ReduceSpec("sum", acc, "scan")


def shifted(e: ir.Expr, shifts: dict[int, int], when: tuple[tuple[int, int, int], ...]) -> ir.Expr:
    """An input seen from the output's coordinates: coordinate ``c`` of the output is
    ``c - shift`` of the input, and each load is valid only inside ``when``. The input
    is a load, or a value recomputed where it is read (``schedule/recompute.py``: ``-x2``
    of rotate_half), whose every load and coordinate moves."""
    def leaf(x: ir.Expr) -> ir.Expr:
        if isinstance(x, ir.Coord) and shifts.get(x.dim):
            return ir.Op("sub", (x, ir.Const(shifts[x.dim], x.dtype)), x.dtype)
        if not isinstance(x, ir.Load):
            assert isinstance(x, (ir.Const, ir.Coord)), x  # nothing else is recomputed
            return x
        a = x.index
        off = a.offset - sum(a.coeffs[c] * k for c, k in shifts.items())
        divs = tuple((c, add - shifts.get(c, 0), d, m) for c, add, d, m in a.divs)
        moved = tuple((c, lo + shifts.get(c, 0), hi + shifts.get(c, 0)) for c, lo, hi in x.when)  # a cat's, under a pad
        return ir.Load(x.arg, ir.Affine(off, a.coeffs, divs), x.dtype, moved + when,
                       tuple((ir.mapped(i, leaf), st) for i, st in x.at))
    return ir.mapped(e, leaf)


def _in_range(coord: int, lo: int, hi: int) -> ir.Expr:
    c = ir.Coord(coord, dt.int64)
    return ir.Op("logical_and", (ir.Op("ge", (c, ir.Const(lo, dt.int64)), dt.bool_),
                                 ir.Op("lt", (c, ir.Const(hi, dt.int64)), dt.bool_)), dt.bool_)


def _cat(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
    """``cat`` as index arithmetic in the consumer: output coordinate ``c`` along ``dim``
    reads input k at ``c - start_k`` where ``start_k <= c < start_k + n_k``. The scheduler
    gives the lowering the group coordinates of the output's dims (``coords``) and the
    inputs' shapes, and reads the inputs through loads in output coordinates."""
    dim, coord = attrs["dim"], attrs["coords"][attrs["dim"]]
    if coord is None:
        return None
    pieces, start = [], 0
    for a, shape in zip(args, attrs["in_shapes"]):
        n = shape[dim]
        if n:  # an empty input contributes nothing (and must never be read)
            pieces.append((start, start + n, shifted(a, {coord: start}, ((coord, start, start + n),))))
        start += n
    if not pieces:  # every input is empty along dim: so is the output (never read)
        return ir.Const(0, out)
    expr = pieces[-1][2]
    for lo, hi, load in reversed(pieces[:-1]):
        expr = ir.Op("where", (ir.Op("lt", (ir.Coord(coord, dt.int64), ir.Const(hi, dt.int64)), dt.bool_),
                               load, expr), out)
    return expr


def _pad(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
    """Constant ``pad`` as a guarded read: inside the input's box, the input at the
    coordinate minus the leading pad; outside it, the fill value. Other modes (reflect,
    replicate, circular) index non-linearly and stay extern steps."""
    if attrs["mode"] != "constant":
        return None
    fill: ir.Expr = ir.Const(attrs["value"], out)
    if 0 in attrs["in_shapes"][0]:
        return fill
    shifts, when = {}, []
    for d, ((lo, _), n) in enumerate(zip(attrs["pads"], attrs["in_shapes"][0])):
        c = attrs["coords"][d]
        if c is None:  # a dim the group does not iterate (size 1 in a row-level space)
            if lo or n != 1:
                return None
            continue
        shifts[c] = lo
        when.append((c, lo, lo + n))
    load = shifted(args[0], shifts, tuple(when))
    cond = None
    for c, lo, hi in when:
        r = _in_range(c, lo, hi)
        cond = r if cond is None else ir.Op("logical_and", (cond, r), dt.bool_)
    return load if cond is None else ir.Op("where", (cond, load, fill), out)


#: Ops that read their first input at a data-dependent index along ``attrs["dim"]``: the
#: scheduler loads that input without the dim's coordinate (``in_strides`` says its
#: stride) and the lowering adds the checked index term (``ir.Load.at``).
GATHERS = frozenset({"gather", "index_select"})


def _gather(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
    """``gather`` and ``index_select``: x at the output's coordinates but along ``dim``,
    where it reads the index tensor's value, bounds-checked in the kernel
    (``ir.checked``). x is a load, or the expression of an element-wise producer in the
    group (``fuse.inlined_source``): every load in it has its term along the gathered
    coordinate (``attrs["gathered"]``) moved to the index, and the coordinate itself
    becomes the index. Where the scheduler left that dim out of x's load (an index of
    another rank than 1), the term is x's stride."""
    x, idx = args
    d, c = attrs["dim"], attrs["gathered"]
    shape = attrs["in_shapes"][0]
    if not shape:
        return None
    i = idx if idx.dtype is dt.int64 else ir.Op("cast", (idx,), dt.int64)
    sel = ir.checked(i, shape[d], attrs["node"], attrs["op"], d)
    if c is None:
        assert isinstance(x, ir.Load)
        return ir.Load(x.arg, x.index, x.dtype, x.when, x.at + ((sel, attrs["in_strides"][0][d]),))

    def leaf(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Load):
            coeffs = list(e.index.coeffs)
            k, coeffs[c] = coeffs[c], 0
            return ir.Load(e.arg, ir.Affine(e.index.offset, tuple(coeffs)), e.dtype, e.when, e.at + ((sel, k),))
        if isinstance(e, ir.Coord) and e.dim == c:
            return sel if e.dtype is dt.int64 else ir.Op("cast", (sel,), e.dtype)
        return e
    return ir.mapped(x, leaf)


def _triangle(keep: str) -> Lowering:
    """``tril``/``triu`` as a guarded read: element (..., i, j) is the input where
    ``j - i <= diagonal`` (tril) or ``j - i >= diagonal`` (triu), else 0, so a mask
    built from ``triu(full(-inf), 1)`` is computed in its consumer."""
    def lower(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
        at = attrs.get("at")
        i, j = at[-2:] if at is not None else (
            ir.Coord(c, dt.int64) if c is not None else ir.Const(0, dt.int64) for c in attrs["coords"][-2:])
        diff = ir.Op("sub", (j, i), dt.int64)
        cond = ir.Op(keep, (diff, ir.Const(attrs["diagonal"], dt.int64)), dt.bool_)
        return ir.Op("where", (cond, args[0], ir.Const(0, out)), out)
    return lower


def _full(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr:
    return ir.Const(attrs["value"], out)


def _arange(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
    c = attrs["coords"][0]
    return None if c is None else arange_value(attrs, out, ir.Coord(c, dt.int64))


def arange_value(attrs: dict[str, Any], out: DType, i: ir.Expr) -> ir.Expr | None:
    """``start + step * i`` computed as the reference does (int64 for integer results,
    float64 for float ones), for an int64 index expression ``i``."""
    if not out.is_integer and out is not dt.float32 and out is not dt.float64:
        return None
    wide = dt.int64 if out.is_integer else dt.float64
    v = ir.Op("add", (ir.Const(attrs["start"], wide),
                      ir.Op("mul", (ir.Const(attrs["step"], wide), ir.Op("cast", (i,), wide)), wide)), wide)
    return ir.Op("cast", (v,), out)


def install() -> None:
    """Fill ``OpDef.lower`` for every op that has a lowering."""
    for name in UNARY:
        REGISTRY[name].lower = _pointwise(name)
    for name in BINARY:
        REGISTRY[name].lower = _pointwise(name)
    REGISTRY["div"].lower = _pointwise("div")
    REGISTRY["floor_divide"].lower = _int_division("floor_divide")
    REGISTRY["remainder"].lower = _int_division("remainder")
    REGISTRY["pow"].lower = _pow
    REGISTRY["where"].lower = _pointwise("where")
    REGISTRY["cast"].lower = _cast
    REGISTRY["copy"].lower = lambda args, attrs, out: args[0]
    for name in REDUCTIONS:
        REGISTRY[name].lower = _reduce(name)
    REGISTRY["cumsum"].lower = _cumsum
    REGISTRY["cat"].lower = _cat
    REGISTRY["pad"].lower = _pad
    for name in GATHERS:
        REGISTRY[name].lower = _gather
    REGISTRY["tril"].lower = _triangle("le")
    REGISTRY["triu"].lower = _triangle("ge")
    REGISTRY["full"].lower = _full
    REGISTRY["arange"].lower = _arange


install()
