"""Reductions in C: an accumulator's identity and update, the loop body that folds a
pass's element values, OpenMP's reduction operators, and the rolling walk that folds
every pass at once with repair terms (``Reduce.repair``). Shared by the kernel
renderer (``c.py``), chain kernels (``chain.py``) and scanning rows (``scan.py``).
"""

from __future__ import annotations

from .. import dtypes as dt
from .. import ir
from ..dtypes import DType
from . import argfold
from .c_expr import Renderer, select, vtype
from .loops import is_float_minmax


INIT = {"sum": "0", "prod": "1", "any": "0", "all": "1"}
OMP_REDUCTION = {"sum": "+", "prod": "*", "any": "|", "all": "&", "amax": "max", "amin": "min"}


def reduce_init(op: str, d: DType) -> str:
    if op in INIT:
        return INIT[op]
    if d.is_floating_point:
        return "(-INFINITY)" if op == "amax" else "INFINITY"
    if d is dt.bool_:
        return "0" if op == "amax" else "1"
    info = "INT64_MIN" if op == "amax" else "INT64_MAX"
    if d is dt.int64:
        return info
    import numpy as np
    lim = np.iinfo(d.np)
    return str(lim.min if op == "amax" else lim.max)


def reduce_update(op: str, acc: str, x: str, d: DType) -> str:
    return {
        "sum": f"{acc} += {x};",
        "prod": f"{acc} *= {x};",
        "any": f"{acc} |= ({x} != 0);",
        "all": f"{acc} &= ({x} != 0);",
        "amax": f"{acc} = {select(d, f'{x} > {acc}', x, acc)};",
        "amin": f"{acc} = {select(d, f'{x} < {acc}', x, acc)};",
    }[op]


def fold_body(k: ir.Kernel, indices: list[int], r: Renderer, acc: str, nan: str) -> list[str]:
    """The loop body folding element values into the accumulators of ``indices``.
    Float max/min fold with a select and keep a NaN flag on the side, so a NaN anywhere
    gives NaN (as numpy), and the select still vectorises."""
    updates = []
    for i in indices:
        s = k.stages[i]
        assert isinstance(s, ir.Reduce)
        x = r.expr(s.expr)
        if argfold.is_arg(s):
            assert s.index is not None
            updates += argfold.c_update(s, i, x, r.expr(s.index))
            continue
        if is_float_minmax(s):
            updates.append(f"{nan.format(i)} |= ({x} != {x});")
        else:
            x = f"(({vtype(s.dtype)}){x})"
        updates.append(reduce_update(s.op, acc.format(i), x, s.dtype))
    return r.take() + updates


ROLL_TILE = 1024


def safe(op: str, name: str) -> str:
    """A running max/min as repair terms see it: 0 while it is still infinite (a
    masked prefix: ``exp(-inf - -inf)`` would be nan); ``h`` is an identity for any
    value used consistently, so this changes nothing once it is finite."""
    if op == "amax":
        return f"({name} == -INFINITY ? 0.0f : {name})"
    if op == "amin":
        return f"({name} == INFINITY ? 0.0f : {name})"
    return name


def repaired(r: Renderer, h: ir.Expr | None, t: str, d: DType) -> tuple[list[str], str]:
    """A partial fold ``t`` after its repair term ``h(t, old, new)`` (``Reduce.repair``,
    ``Contract.repair``): the statements it needs and its value; ``t`` when there is
    none. The old and new running values are the ``Var``s os{p} / ns{p} in scope."""
    if h is None:
        return [], t
    r.memo[ir.Var("t", d)] = t
    value = r.expr(h)
    return r.take(), value


def moved(h: ir.Expr) -> str:
    """C condition: a producer that ``h`` reads changed in this tile (``os{p} != ns{p}``).

    ``h(t, r, r) = t`` (the defining property of a repair term, with ``r' = r``), so a
    tile that left its producers where they were needs no repair: once a row's running
    max has settled, most tiles skip the repair's ``exp`` and, for a contraction, the
    pass over its accumulator row. The result is the same or, without a rounding from
    ``t * exp(0)``, the same exactly."""
    names = sorted({a.name[2:] for a in ir.walk(h) if isinstance(a, ir.Var) and a.name[:2] in ("os", "ns")})
    return " || ".join(f"os{p} != ns{p}" for p in names) or "1"


def repaired_when_moved(r: Renderer, h: ir.Expr | None, t: str, d: DType, name: str) -> list[str]:
    """Declare ``name`` = the partial fold ``t`` after its repair term, computed only when
    a producer moved (``moved``)."""
    stmts, value = repaired(r, h, t, d)
    if h is None:
        return [f"const {vtype(d)} {name} = {t};"]
    return [f"{vtype(d)} {name} = {t};", f"if ({moved(h)}) {{", *["    " + x for x in stmts],
            f"    {name} = {value};", "}"]


def rolling(k: ir.Kernel, passes: list[list[int]], coords: list[str], n_out: int,
             hoisted: dict[ir.Expr, str]) -> list[str]:
    """The reductions of every pass folded in one walk over the row, in tiles, each
    dependent fold combined with its repaired partial (``Reduce.repair``, from
    ``schedule/chain.rolling``). Declares the accumulators and ``redo``: a row whose
    producers end non-finite is redone by the passes that follow, without repairs, so
    it gives the reference's values (nan where it has nan). Empty when not rolling."""
    reduces = [i for p in passes for i in p]
    if len(passes) < 2 or any(k.stages[i].repair is None for i in reduces  # type: ignore[union-attr]
                               if any(isinstance(a, ir.Acc) for a in ir.walk(k.stages[i].expr))):  # type: ignore[union-attr]
        return []
    producers = sorted({a.stage for i in reduces for a in ir.walk(k.stages[i].expr)  # type: ignore[union-attr]
                        if isinstance(a, ir.Acc)})
    n = k.inner[0]
    out = []
    for i in reduces:
        s = k.stages[i]
        assert isinstance(s, ir.Reduce)
        out.append(f"{vtype(s.dtype)} acc{i} = {reduce_init(s.op, s.dtype)}; int nan{i} = 0;")
    for p in producers:
        out.append(f"float ns{p} = {safe(k.stages[p].op, f'acc{p}')};")  # type: ignore[union-attr]
    out.append(f"for (int64_t j0 = 0; j0 < {n}; j0 += {ROLL_TILE}) {{")
    out.append(f"    const int64_t j1 = j0 + {ROLL_TILE} < {n} ? j0 + {ROLL_TILE} : {n};")
    for p in producers:
        out.append(f"    const float os{p} = ns{p};")
    for level in passes:
        clauses = ""
        for i in level:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            out.append(f"    {vtype(s.dtype)} red{i} = {reduce_init(s.op, s.dtype)}; int rnan{i} = 0;")
            clauses += f" reduction({OMP_REDUCTION[s.op]}:red{i}) reduction(|:rnan{i})"
        r = Renderer(coords, prefix=f"w{level[0]}_", acc="ns{}", n_outer=n_out, hoisted=hoisted)
        body = fold_body(k, level, r, "red{}", "rnan{}")
        out.append(f"    #pragma omp simd{clauses}")
        out.append("    for (int64_t i0 = j0; i0 < j1; i0++) {")
        out += ["        " + b for b in body]
        out.append("    }")
        for i in level:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            rr = Renderer(coords, prefix=f"h{i}_", acc="ns{}", n_outer=n_out, hoisted=hoisted)
            out += ["    " + t for t in repaired_when_moved(rr, s.repair, f"acc{i}", s.dtype, f"old{i}")]
            out.append(f"    {{ {vtype(s.dtype)} u = old{i}; " + reduce_update(s.op, "u", f"red{i}", s.dtype)
                       + f" acc{i} = u; nan{i} |= rnan{i}; }}")
            if i in producers:
                out.append(f"    ns{i} = {safe(s.op, f'acc{i}')};")
    out.append("}")
    checks = " || ".join(f"nan{p} || !isfinite(acc{p})" for p in producers) or "0"
    out.append(f"const int redo = {checks};")
    for i in reduces:
        if is_float_minmax(k.stages[i]):  # type: ignore[arg-type]
            out.append(f"if (nan{i}) acc{i} = NAN;")
    return out
