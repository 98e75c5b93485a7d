"""What every renderer of the loop IR decides the same way, whatever it emits (C in
``c.py`` and ``chain.py``, Triton in ``triton.py``): how a kernel's reductions fall
into passes over the row, which folds need a NaN flag beside them, and how a loop
body's subexpressions become temporaries."""

from __future__ import annotations

from .. import ir


def passes(k: ir.Kernel) -> list[list[int]]:
    """Reduce stages grouped into passes: a reduction that reads another's result runs
    in a later pass; independent reductions (mean and mean of squares) share one."""
    level: dict[int, int] = {}
    for i, s in enumerate(k.stages):
        if isinstance(s, ir.Reduce):
            deps = [n.stage for n in ir.walk(s.expr) if isinstance(n, ir.Acc)]
            level[i] = 1 + max((level[d] for d in deps), default=-1)
    out: list[list[int]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for i, lv in level.items():
        out[lv].append(i)
    return out


def is_float_minmax(s: ir.Reduce) -> bool:
    """A float max or min: folded with a select, its NaN kept in a flag on the side (a
    select drops a NaN, and numpy's max of a row holding one is NaN)."""
    return s.op in ("amax", "amin") and s.dtype.is_floating_point


class Temporaries:
    """Each distinct subexpression of a loop body becomes one named temporary
    (expressions are structural values, so equal subtrees share it: an inlined producer
    used five times is computed once per element). A renderer says how one is declared."""

    prefix: str
    memo: dict[ir.Expr, str]
    stmts: list[str]

    def declare(self, name: str, text: str, e: ir.Expr) -> str:
        raise NotImplementedError

    def bind(self, e: ir.Expr, text: str) -> str:
        """Name ``text``, the value of ``e``, as the body's next temporary."""
        name = f"{self.prefix}{len(self.memo)}"
        self.memo[e] = name
        self.stmts.append(self.declare(name, text, e))
        return name

    def take(self) -> list[str]:
        """The temporaries defined so far (to emit before the statements using them)."""
        out, self.stmts = self.stmts, []
        return out
