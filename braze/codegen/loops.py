"""What every renderer of the loop IR decides the same way, whatever it emits (C in
``c.py`` and ``chain.py``, Triton in ``triton.py``): how a kernel's reductions fall
into passes over the row, which folds need a NaN flag beside them, and how a loop
body's expressions are walked (``ExprRenderer``: each distinct subexpression one
temporary, ops through each renderer's rule tables)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, ClassVar, Mapping

from .. import ir
from ..dtypes import DType


def _levels(k: ir.Kernel) -> dict[int, int]:
    """The pass each Reduce and Scan stage is computed in: after the reductions it reads
    (their results are final only once their pass is over), in the pass of the scans it
    reads (a scan's values exist element by element, in the walk that computes it)."""
    level: dict[int, int] = {}
    for i, s in enumerate(k.stages):
        if isinstance(s, (ir.Reduce, ir.Scan)):
            deps = [n.stage for n in ir.walk(s.expr) if isinstance(n, ir.Acc)]
            level[i] = max((level[d] + isinstance(k.stages[d], ir.Reduce) for d in deps), default=0)
    return level


def passes(k: ir.Kernel) -> list[list[int]]:
    """Reduce stages grouped into passes: a reduction that reads another's result runs
    in a later pass; independent reductions (mean and mean of squares) share one; a
    reduction of scanned values runs in a pass that scans (``scans``)."""
    level = {i: lv for i, lv in _levels(k).items() if isinstance(k.stages[i], ir.Reduce)}
    out: list[list[int]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for i, lv in level.items():
        out[lv].append(i)
    return [p for p in out if p]


def scans(k: ir.Kernel, stages: list[int]) -> list[int]:
    """The Scan stages whose values ``stages`` read (directly or through another scan),
    in stage order: what a walk folding them computes again, block by block."""
    need: set[int] = set()
    todo = list(stages)
    while todo:
        s = k.stages[todo.pop()]
        for n in ir.walk(s.expr):  # type: ignore[union-attr]
            if isinstance(n, ir.Acc) and isinstance(k.stages[n.stage], ir.Scan) and n.stage not in need:
                need.add(n.stage)
                todo.append(n.stage)
    return sorted(need)


def is_float_minmax(s: ir.Reduce) -> bool:
    """A float max or min: folded with a select, its NaN kept in a flag on the side (a
    select drops a NaN, and numpy's max of a row holding one is NaN)."""
    return s.op in ("amax", "amin") and s.dtype.is_floating_point


#: comparisons, spelled alike in C and Triton (each renderer's ``BINARY`` holds them)
COMPARISONS: dict[str, Callable[[DType], str]] = {
    "eq": lambda d: "({a} == {b})",
    "ne": lambda d: "({a} != {b})",
    "lt": lambda d: "({a} < {b})",
    "le": lambda d: "({a} <= {b})",
    "gt": lambda d: "({a} > {b})",
    "ge": lambda d: "({a} >= {b})",
}

#: an op's rule in a renderer's table: (renderer, op, its arguments rendered, the dtype
#: of its first argument) -> its text, or None to leave it to the ``UNARY``/``BINARY`` tables
OpRule = Callable[..., str | None]


class ExprRenderer:
    """The walk both renderers take over an expression inside one loop body (C in
    ``c_expr.Renderer``, Triton in ``triton.Renderer``), through the hooks and rule
    tables each fills in. Each distinct subexpression becomes one named temporary
    (expressions are structural values, so equal subtrees share it: an inlined producer
    used five times is computed once per element)."""

    coords: list[str]
    n_outer: int  # coords before this one are constant along the row
    prefix: str
    acc: str  # how an accumulator is spelled (a scalar, a block's slot)
    memo: dict[ir.Expr, str]
    stmts: list[str]
    #: ops rendered by a rule of their own, before (or instead of) the tables
    OPS: ClassVar[Mapping[str, OpRule]]
    #: op name -> (dtype of the operand) -> template over ``{a}`` (and ``{b}``)
    UNARY: ClassVar[Mapping[str, Callable[[DType], str]]]
    BINARY: ClassVar[Mapping[str, Callable[[DType], str]]]

    def expr(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Const):
            return self.const(e)
        if isinstance(e, ir.Coord):
            return self.coord(e)
        name = self.memo.get(e)
        if name is not None:
            return name
        if isinstance(e, ir.Acc):
            return self.acc.format(e.stage)
        name = self.named(e)
        if name is not None:
            return name
        if isinstance(e, ir.Load):
            text = self.load(e)
        elif isinstance(e, ir.Op):
            text = self.op(e)
        else:
            raise self.unrendered(e)
        return self.bind(e, text)

    def op(self, e: ir.Op) -> str:
        args = [self.expr(a) for a in e.args]
        if e.name == "checked":
            return self.checked(e, args)
        src = e.args[0].dtype if e.args else e.dtype
        rule = self.OPS.get(e.name)
        text = rule(self, e, args, src) if rule is not None else None
        if text is None:
            if e.name in self.UNARY:
                text = self.UNARY[e.name](src).format(a=args[0])
            elif e.name in self.BINARY:
                text = self.BINARY[e.name](src).format(a=args[0], b=args[1])
            else:
                raise self.unrendered(e)
        return self.typed(text, e.dtype)

    # what each renderer says its own way
    def const(self, e: ir.Const) -> str:
        raise NotImplementedError

    def coord(self, e: ir.Coord) -> str:
        raise NotImplementedError

    def named(self, e: ir.Expr) -> str | None:
        """A name ``e`` has beyond the body's temporaries (None: it is computed here)."""
        return None

    def load(self, e: ir.Load) -> str:
        raise NotImplementedError

    def checked(self, e: ir.Op, args: list[str]) -> str:
        """A gathered index, checked (``ir.checked``)."""
        raise NotImplementedError

    def typed(self, text: str, d: DType) -> str:
        """An op's ``text`` as a value of its dtype ``d``."""
        raise NotImplementedError

    def unrendered(self, e: ir.Expr) -> Exception:
        """The error for an expression (or an op) this renderer has no text for."""
        raise NotImplementedError

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


def collapsed(k: ir.Kernel) -> ir.Kernel:
    """``k`` over fewer, longer dims: size-1 dims dropped, and two neighbouring dims (both
    outer or both inner; any two in a kernel of element stores only, which has no rows)
    merged where every access walks them as one (the outer one's coefficient is the inner
    one's times its size). A GPU renderer then computes one
    coordinate instead of a division and a remainder per dim per lane. Kernels whose
    expressions name a coordinate, guard a load by one or divide one (``Coord``,
    ``Load.when``, ``Affine.divs``), and chain kernels, are left as they are."""
    if any(not isinstance(s, (ir.Reduce, ir.Scan, ir.Store, ir.StoreRow))
           or (isinstance(s, ir.Reduce) and s.repair is not None) for s in k.stages):
        return k
    affines: list[ir.Affine] = []
    for s in k.stages:
        if isinstance(s, (ir.Store, ir.StoreRow)):
            affines.append(s.index)
        for e in ir.stage_exprs(s):
            for n in ir.walk(e):
                if isinstance(n, (ir.Coord, ir.Var, ir.Dot)) or (isinstance(n, ir.Load) and n.when):
                    return k
                if isinstance(n, ir.Load):
                    affines.append(n.index)
    if any(a.divs for a in affines):
        return k
    sizes = list(k.outer) + list(k.inner)
    # a kernel of element stores only has no rows: its outer and inner dims merge alike
    n_out = 0 if all(isinstance(s, ir.Store) for s in k.stages) else len(k.outer)
    keep = [d for d, n in enumerate(sizes) if n != 1]  # (a size-1 dim's coordinate is always 0)
    groups: list[list[int]] = []  # runs of kept dims merged into one
    for d in keep:
        g = groups[-1] if groups else None
        if g is not None and (g[-1] < n_out) == (d < n_out) \
                and all(a.coeffs[g[-1]] == a.coeffs[d] * sizes[d] for a in affines):
            g.append(d)
        else:
            groups.append([d])
    if len(groups) == len(sizes):
        return k

    def affine(a: ir.Affine) -> ir.Affine:
        return ir.Affine(a.offset, tuple(a.coeffs[g[-1]] for g in groups))

    def leaf(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Load):
            return ir.Load(e.arg, affine(e.index), e.dtype, e.when,
                           tuple((ir.mapped(i, leaf), st) for i, st in e.at))
        return e

    stages: list[ir.Stage] = []
    for s in k.stages:
        if isinstance(s, ir.Store):
            stages.append(ir.Store(s.arg, affine(s.index), ir.mapped(s.expr, leaf),
                                   tuple((ir.mapped(i, leaf), st) for i, st in s.at)))
        elif isinstance(s, ir.StoreRow):
            stages.append(ir.StoreRow(s.arg, affine(s.index), ir.mapped(s.expr, leaf)))
        elif isinstance(s, ir.Reduce):
            stages.append(replace(s, expr=ir.mapped(s.expr, leaf)))
        else:
            assert isinstance(s, ir.Scan)
            stages.append(ir.Scan(s.op, ir.mapped(s.expr, leaf), s.dtype))
    size = [1] * len(groups)
    for i, g in enumerate(groups):
        for d in g:
            size[i] *= sizes[d]
    n_out_new = sum(1 for g in groups if g[0] < n_out)
    return ir.Kernel(tuple(size[:n_out_new]), tuple(size[n_out_new:]), stages, list(k.args), k.checks)
