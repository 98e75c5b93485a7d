"""argmax / argmin as a fold of (value, index) pairs over the row: the rules both
renderers follow (C in ``c.py``, Triton in ``triton.py``).

An arg fold is an ``ir.Reduce`` of op ``argmax`` or ``argmin`` whose ``index`` is the
element's position along the row; its ``Acc`` is that position (int64). The answer is
the reference's (numpy's, PyTorch's): the first position of the row's extreme, where a
NaN counts as beyond every number (the first NaN wins), and a row whose every element
is the fold's identity (all -inf for argmax) gives 0.

The fold is lane-wise, so it vectorises: each lane keeps the extreme of the elements it
saw and the first position of it, and replaces them only on an element that *beats*
them (strictly beyond, or the first NaN), so a lane's position is its first occurrence.
At the row's end the lanes are combined: the best value, and among lanes holding it the
smallest position. A lane that never took an element holds the identity at position 0,
which is right when no lane took one (every element was the identity: the first is 0)
and loses or ties harmlessly otherwise (no element equal to the identity is ever taken).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes as dt
from .. import ir
from ..dtypes import DType

#: lanes of a C arg fold: the row is walked in blocks of this many elements, element
#: ``b + l`` folded into lane ``l`` (stack arrays, in L1; gcc vectorises the block loop)
LANES = 64


def is_arg(s: ir.Stage) -> bool:
    """Is this stage an arg fold?"""
    return isinstance(s, ir.Reduce) and s.index is not None


def identity(op: str, d: DType) -> Any:
    """The value every element of dtype ``d`` beats or ties (a lane's start)."""
    largest = op == "argmax"
    if d.is_floating_point:
        return -math.inf if largest else math.inf
    if d is dt.bool_:
        return 0 if largest else 1
    info = np.iinfo(d.np)
    return int(info.min if largest else info.max)


def _cmp(op: str) -> str:
    return ">" if op == "argmax" else "<"


def _beats(op: str, x: str, v: str, d: DType) -> str:
    """Does ``x`` replace the running extreme ``v``? (NaN: only the first one.) The
    same text in C and in Triton (``|`` and ``&`` of comparisons)."""
    if d.is_floating_point:
        return f"(({x} {_cmp(op)} {v}) | (({x} != {x}) & ({v} == {v})))"
    return f"({x} {_cmp(op)} {v})"


# -- C ---------------------------------------------------------------------------------


def _c_same(x: str, v: str, d: DType) -> str:
    return f"(({x} == {v}) | (({x} != {x}) & ({v} != {v})))" if d.is_floating_point else f"({x} == {v})"


def c_declare(i: int, vt: str, init: str) -> list[str]:
    """The lanes of stage ``i`` (values of C type ``vt``, starting at ``init``), per row."""
    return [f"{vt} av{i}[{LANES}]; int64_t ai{i}[{LANES}];",
            f"for (int l = 0; l < {LANES}; l++) {{ av{i}[l] = {init}; ai{i}[l] = 0; }}"]


def c_update(s: ir.Reduce, i: int, x: str, index: str) -> list[str]:
    """Fold element value ``x`` at position ``index`` into lane ``l`` (in scope)."""
    d = s.expr.dtype
    sel = "braze__seld" if d is dt.float64 else "braze__sel" if d.is_floating_point else None
    t = f"t{i}"
    value = f"{sel}({t}, {x}, av{i}[l])" if sel else f"({t} ? {x} : av{i}[l])"
    return [f"const int {t} = {_beats(s.op, x, f'av{i}[l]', d)};",
            f"av{i}[l] = {value};",
            f"ai{i}[l] = {t} ? {index} : ai{i}[l];"]


def c_finish(s: ir.Reduce, i: int, vt: str) -> list[str]:
    """The lanes combined into ``acc{i}``, the row's answer."""
    d = s.expr.dtype
    bv = f"bv{i}"
    better = _beats(s.op, "x", bv, d)
    return [f"{vt} {bv} = av{i}[0]; int64_t acc{i} = ai{i}[0];",
            f"for (int l = 1; l < {LANES}; l++) {{",
            f"    const {vt} x = av{i}[l]; const int64_t j = ai{i}[l];",
            f"    if ({better} || ({_c_same('x', bv, d)} && j < acc{i})) {{ {bv} = x; acc{i} = j; }}",
            "}"]


def c_loop(n: Any, i: str, clauses: str, body: list[str], ind: str) -> list[str]:
    """The row's loop over ``i`` < ``n`` in blocks of ``LANES`` (``l``: the lane)."""
    return [f"{ind}for (int64_t b = 0; b < {n}; b += {LANES}) {{",
            f"{ind}    const int64_t e = b + {LANES} < {n} ? b + {LANES} : {n};",
            f"{ind}    #pragma omp simd{clauses}",
            f"{ind}    for (int64_t {i} = b; {i} < e; {i}++) {{",
            f"{ind}        const int64_t l = {i} - b;",
            *[f"{ind}        {t}" for t in body],
            f"{ind}    }}", f"{ind}}}"]


# -- Triton ----------------------------------------------------------------------------


def triton_update(s: ir.Reduce, i: int, x: str, index: str) -> list[str]:
    """Fold the block's values ``x`` (masked lanes: the identity, never taken) at
    positions ``index`` into the lane vectors ``av{i}`` / ``ai{i}``."""
    t = f"t{i}"
    return [f"{t} = {_beats(s.op, x, f'av{i}', s.expr.dtype)}",
            f"av{i} = tl.where({t}, {x}, av{i})",
            f"ai{i} = tl.where({t}, {index}, ai{i})"]


def triton_finish(s: ir.Reduce, i: int) -> list[str]:
    """The lane vectors combined into the scalar ``acc{i}``: the first NaN's position if
    any lane holds one, else the smallest position among the lanes at the extreme."""
    big = "9223372036854775807"
    lines = [f"best{i} = tl.{'max' if s.op == 'argmax' else 'min'}(av{i}, axis=0)",
             f"acc{i} = tl.min(tl.where(av{i} == best{i}, ai{i}, {big}), axis=0)"]
    if s.expr.dtype.is_floating_point:
        lines += [f"isnan{i} = av{i} != av{i}",
                  f"acc{i} = tl.where(tl.max(isnan{i}.to(tl.int32), axis=0) != 0, "
                  f"tl.min(tl.where(isnan{i}, ai{i}, {big}), axis=0), acc{i})"]
    return lines
