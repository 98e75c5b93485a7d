"""Lowerings: how each registry op becomes loop IR (``OpDef.lower``).

An element-wise op lowers to an ``ir.Op`` over its operands' expressions; a reduction
lowers to a ``ReduceSpec`` (the fold and what to do with the folded value per row);
creation ops lower to constants and coordinates. Ops without a lowering here (matmul,
sort, gather, ...) run as extern steps inside a plan, between fused kernels.

A lowering may refuse by returning None for a particular dtype or attribute, when the
C code would not reproduce the reference bit for bit in meaning (float->int casts of
out-of-range values, integer division by zero, float floor division): those nodes then
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

Lowering = Callable[[list[ir.Expr], dict[str, Any], DType], "ir.Expr | ReduceSpec | None"]


@dataclass(frozen=True)
class ReduceSpec:
    """A reduction as the scheduler needs it: fold ``op`` in ``acc`` dtype, then ``post``."""

    op: str
    acc: DType
    post: str  # "none", "mean", "var"
    correction: float = 0.0


#: The reductions that lower; the scheduler treats their nodes as row folds.
REDUCTIONS = frozenset({"sum", "prod", "mean", "amax", "amin", "any", "all"})


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
    src = args[0].dtype
    if out.is_integer and src.is_floating_point:
        return None  # out-of-range float -> int is undefined in C
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
        if op in ("any", "all"):
            return ReduceSpec(op, dt.bool_, "none")
        return None
    return lower


def _full(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr:
    return ir.Const(attrs["value"], out)


def _arange(args: list[ir.Expr], attrs: dict[str, Any], out: DType) -> ir.Expr | None:
    if not out.is_integer and out is not dt.float32 and out is not dt.float64:
        return None
    # start + step * i, computed as the reference does (int64 for ints, float64 for floats)
    wide = dt.int64 if out.is_integer else dt.float64
    i = ir.Op("cast", (ir.Coord(0, dt.int64),), wide)
    v = ir.Op("add", (ir.Const(attrs["start"], wide), ir.Op("mul", (ir.Const(attrs["step"], wide), i), wide)), wide)
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
    REGISTRY["full"].lower = _full
    REGISTRY["arange"].lower = _arange


install()
