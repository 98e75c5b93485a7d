"""Bounds checks of gathered indices in compiled kernels (``ir.checked``).

A kernel that gathers takes one more argument, ``err``: two int64 per check (a flag,
the bad value the reference would name: the most negative, else the largest). An index outside ``[0, size)`` is recorded there (by a cold,
out-of-line function, under an OpenMP critical section) and replaced by 0, so the
kernel never reads outside its source; the runtime raises ``IndexOutOfRange`` after
the kernel (``plan.py``), naming the op, the value and the size. A check whose index
is constant along the row (an embedding's token id) runs once per row, before the
row's loops (``row_checks``), so the loops over the row stay free of calls and
vectorise.
"""

from __future__ import annotations

from typing import Any

from .. import ir

PRELUDE = r"""
/* Records the value the reference names (ops/shape.check_indices): the most negative
 * index if any is negative, else the largest. */
static void __attribute__((cold, noinline)) braze_bad_index(int64_t *err, int64_t check, int64_t v) {
    #pragma omp critical (braze_bad_index)
    {
        int64_t *flag = &err[2 * check], *was = &err[2 * check + 1];
        if (!*flag || (v < 0 ? (*was >= 0 || v < *was) : (*was >= 0 && v > *was))) *was = v;
        *flag = 1;
    }
}
static inline int64_t braze_checked(int64_t v, int64_t n, int64_t *err, int64_t check) {
    if (__builtin_expect((uint64_t)v >= (uint64_t)n, 0)) { braze_bad_index(err, check, v); return 0; }
    return v;
}
"""


def err_pointer(k: ir.Kernel, sizes: int) -> list[str]:
    """The declaration of ``err`` in a kernel with checks: the argument after its
    buffers and, for a generic kernel, its sizes."""
    if not k.checks:
        return []
    return [f"    int64_t *restrict err = (int64_t *)args[{len(k.args) + (1 if sizes else 0)}];"]


def render(e: ir.Op, args: list[str]) -> str:
    """C for a ``checked`` Op whose operands are rendered as ``args``."""
    return f"braze_checked({args[0]}, {args[1]}, err, {dict(e.attrs)['check']})"


def row_checks(k: ir.Kernel, n_outer: int) -> list[ir.Op]:
    """The checks of ``k`` whose index is constant along the row."""
    out: list[ir.Op] = []
    for st in k.stages:
        for x in ir.stage_exprs(st):
            for n in ir.walk(x):
                if isinstance(n, ir.Op) and n.name == "checked" and n not in out and not ir.uses_inner(n, n_outer):
                    out.append(n)
    return out


def hoisted_rows(k: ir.Kernel, renderer: Any, hoisted: dict[ir.Expr, str]) -> tuple[list[str], dict[ir.Expr, str]]:
    """Row-constant checks computed once per row with ``renderer`` (the row's
    statements) and ``hoisted`` with them added, for the row's loops to read."""
    names: dict[ir.Expr, str] = {c: renderer.expr(c) for c in row_checks(k, renderer.n_outer)}
    if not names:
        return [], hoisted
    return renderer.take(), {**hoisted, **names}
