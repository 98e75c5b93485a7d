"""Triton renderer: the same loop IR kernels ``c.py`` reads, as Triton source.

One program per row (``tl.program_id(0)`` is the flattened outer coordinate); inside it
the row (the inner coordinates, flattened) is walked in blocks of ``BLOCK`` lanes, one
walk per pass of reductions (``loops.passes``: a reduction that reads another's result
waits for it), each pass folding a vector accumulator that is reduced to the row's
value after the walk, then one walk for the element stores. Row stores (a reduction's
result) are scalar stores once per row. Expressions go through rule tables (``UNARY``,
``BINARY``: op name -> Triton template per kind of dtype), each distinct subexpression
one temporary, as in the C renderer.

Numerics follow the C renderer where Triton can say the same thing: half types are
loaded into float32 and every half result is rounded back to its type (the reference
rounds node by node); float max/min keep a NaN flag beside the fold; a float -> int cast
saturates and maps NaN to 0. Division by a row constant stays a division (the C's
reciprocal is a CPU trick). Functions are the ones Triton's interpreter also runs
(``tl.exp``, ``tl.math.erf``, ...); tanh is spelled through ``exp``, as Triton has no
portable one. Sums fold in another order than numpy's: tests compare within float
tolerance.

Gathers (``Load.at``) check each index as the C does (``checked``): a bad one reads at
0 and is recorded in ``err``, an extra argument of three int64 per check (a flag, the
smallest and the largest bad value), which the runtime reads after the kernel.

A scan (``cumsum``) walks its row in order, each block's ``tl.cumsum`` on top of the
sum of the blocks before it; a pass folding scanned values (top-p's renormalising sum)
scans again in its own walk.

What it does not render yet raises ``NotRendered`` naming it (scatters, the quantized and
top-k library kernels; chain kernels are ``triton_chain.py``'s); the runtime turns that
into a typed error naming the op (``runtime/cuda.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import prod
from typing import Any, Callable, ClassVar, Mapping

from .. import dtypes as dt
from .. import ir
from ..dtypes import DType
from . import argfold
from .loops import COMPARISONS, ExprRenderer, OpRule, collapsed, is_float_minmax, passes, scans

#: lanes of a row walked at once, at most (a power of two, as ``tl.arange`` needs)
MAX_BLOCK = 1024

TL = {
    "float32": "tl.float32", "float64": "tl.float64", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
    "int8": "tl.int8", "uint8": "tl.uint8", "int16": "tl.int16", "int32": "tl.int32", "int64": "tl.int64",
    "bool": "tl.int1",
}


class NotRendered(Exception):
    """A kernel (or a part of one) this renderer does not produce yet; ``what`` says which."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(what)


def vtype(d: DType) -> str:
    """The Triton type a value of dtype ``d`` is computed in."""
    if d.is_block:
        raise NotRendered(f"a {d.name} (block-quantized) operand")
    return "tl.float32" if d.is_half else TL[d.name]


def _f(d: DType, f32: str, f64: str) -> str:
    return f64 if d is dt.float64 else f32


def _tanh(d: DType, a: str) -> str:
    """tanh through exp: sign(x) * (1 - e) / (1 + e), e = exp(-2|x|), which never
    overflows; NaN stays NaN."""
    e = f"tl.exp(-2.0 * tl.abs({a}))"
    return f"tl.where({a} < 0, -1.0, 1.0) * ((1.0 - {e}) / (1.0 + {e}))"


def _round_half_even(a: str) -> str:
    f = f"tl.floor({a})"
    odd = f"(({f}) - 2.0 * tl.floor(({f}) * 0.5)) != 0"
    return (f"tl.where({a} - {f} > 0.5, {f} + 1.0, tl.where({a} - {f} < 0.5, {f}, "
            f"tl.where({odd}, {f} + 1.0, {f})))")


def _sign(d: DType, a: str) -> str:
    t = vtype(d)
    s = f"(({a} > 0).to({t}) - ({a} < 0).to({t}))"
    return f"tl.where({a} != {a}, {a}, {s})" if d.is_floating_point else s


# unary: name -> (dtype of the operand) -> template over {a}
UNARY: dict[str, Callable[[DType], str]] = {
    "neg": lambda d: "(-{a})",
    "abs": lambda d: "tl.abs({a})",
    "exp": lambda d: "tl.exp({a})",
    "log": lambda d: "tl.log({a})",
    "sqrt": lambda d: _f(d, "tl.sqrt_rn({a})", "tl.sqrt({a})"),
    "rsqrt": lambda d: _f(d, "(1.0 / tl.sqrt_rn({a}))", "(1.0 / tl.sqrt({a}))"),
    "reciprocal": lambda d: "(1.0 / {a})",
    "sin": lambda d: "tl.sin({a})",
    "cos": lambda d: "tl.cos({a})",
    "tanh": lambda d: _tanh(d, "{a}"),
    "sigmoid": lambda d: "(1.0 / (1.0 + tl.exp(-{a})))",
    "erf": lambda d: "tl.math.erf({a})",
    "relu": lambda d: "tl.where({a} < 0, 0, {a})",
    "gelu": lambda d: "(0.5 * {a} * (1.0 + tl.math.erf({a} * 0.70710678118654752)))",
    "gelu_tanh": lambda d: "(0.5 * {a} * (1.0 + " + _tanh(d, "(0.79788456080286536 * ({a} + 0.044715 * {a} * {a} * {a}))") + "))",
    "silu": lambda d: "({a} / (1.0 + tl.exp(-{a})))",
    "floor": lambda d: "tl.floor({a})" if d.is_floating_point else "{a}",
    "ceil": lambda d: "tl.ceil({a})" if d.is_floating_point else "{a}",
    "round": lambda d: _round_half_even("{a}") if d.is_floating_point else "{a}",
    "sign": lambda d: _sign(d, "{a}"),
    "logical_not": lambda d: "({a} == 0)",
    "isnan": lambda d: "({a} != {a})",
    "isinf": lambda d: "(tl.abs({a}) == float('inf'))",
    "isfinite": lambda d: "(({a} - {a}) == 0)",
}


#: the divisor Triton's ``//`` and ``%`` are given: 0 read as 1 (a zero divisor's
#: result is chosen by a select around them)
_DIVISOR = "tl.where({b} == 0, 1, {b})"


def _integer_only(d: DType, what: str) -> None:
    if d.is_floating_point:
        raise NotRendered(f"{what} of floats")


def _floordiv(d: DType) -> str:
    """Integer floor division with C's truncating ``//`` underneath (Triton's, on the
    GPU and in its interpreter alike): one less where the signs differ and there is a
    remainder; a zero divisor gives 0, as braze's C does."""
    _integer_only(d, "floor division")
    q = f"({{a}} // {_DIVISOR})"
    fix = f"((({{a}} % {_DIVISOR}) != 0) & (({{a}} < 0) != ({{b}} < 0)))"
    return f"tl.where({{b}} == 0, 0, {q} - {fix}.to({vtype(d)}))"


def _remainder(d: DType) -> str:
    _integer_only(d, "the remainder")
    r = f"({{a}} % {_DIVISOR})"
    fix = f"(({r} != 0) & (({r} < 0) != ({{b}} < 0)))"
    return f"tl.where(({{b}} == 0) | ({{b}} == -1), 0, {r} + tl.where({fix}, {{b}}, 0))"


def _minmax(cmp: str) -> Callable[[DType], str]:
    return lambda d: f"tl.where(({{a}} != {{a}}) | ({{a}} {cmp} {{b}}), {{a}}, {{b}})"


BINARY: dict[str, Callable[[DType], str]] = {
    "add": lambda d: "({a} + {b})",
    "sub": lambda d: "({a} - {b})",
    "mul": lambda d: "({a} * {b})",
    "div": lambda d: "({a} / {b})" if d.is_floating_point else "({a}.to(tl.float64) / {b}.to(tl.float64))",
    "floor_divide": _floordiv,
    "remainder": _remainder,
    "maximum": _minmax(">"),
    "minimum": _minmax("<"),
    **COMPARISONS,
    "logical_and": lambda d: "(({a} != 0) & ({b} != 0))",
    "logical_or": lambda d: "(({a} != 0) | ({b} != 0))",
    "logical_xor": lambda d: "(({a} != 0) != ({b} != 0))",
}


def _pow(a: str, b: str, exponent: Any, d: DType) -> str:
    """``a ** b``: small constant exponents as products (exact, as the reference's pow
    is for them), otherwise exp2(b * log2|a|) with the sign of an odd integer power and
    NaN for a negative base to a fractional power."""
    if d.is_integer:
        raise NotRendered("integer pow")
    if exponent is not None:
        if exponent == 2:
            return f"({a} * {a})"
        if exponent == 1:
            return a
        if exponent == 0.5:
            return f"tl.sqrt({a})" if d is dt.float64 else f"tl.sqrt_rn({a})"
        if exponent == -1:
            return f"(1.0 / {a})"
        if exponent == 3:
            return f"({a} * {a} * {a})"
    mag = f"tl.exp2({b} * tl.log2(tl.abs({a})))"
    whole = f"(tl.floor({b}) == {b})"
    odd = f"(({b}) - 2.0 * tl.floor(({b}) * 0.5) != 0)"
    return (f"tl.where({b} == 0, 1.0, tl.where({a} >= 0, {mag}, tl.where({whole}, "
            f"tl.where({odd}, -{mag}, {mag}), float('nan'))))")


def literal(value: Any, d: DType) -> str:
    """A Python literal of ``value`` as dtype ``d`` (NaN and infinities spelled as floats)."""
    if d.is_floating_point:
        v = float(value)
        text = "float('nan')" if math.isnan(v) else ("float('inf')" if v > 0 else "-float('inf')") \
            if math.isinf(v) else repr(v)
    elif d is dt.bool_:
        text = "1" if value else "0"
    else:
        text = str(int(value))
    return text


def const(value: Any, d: DType) -> str:
    return f"tl.full([], {literal(value, d)}, {vtype(d)})"


def _float_to_int(a: str, d: DType) -> str:
    """float -> int as the reference defines it: NaN 0, truncation toward zero inside the
    range, saturation outside (the conversion itself only sees values inside)."""
    import numpy as np
    info = np.iinfo(d.np)
    lo, hi = float(info.min), float(info.max)  # hi rounds up to the first value outside
    t = TL[d.name]
    safe = f"tl.where(({a} != {a}) | ({a} <= {lo!r}) | ({a} >= {hi!r}), 0.0, {a})"
    return f"tl.where({a} >= {hi!r}, {info.max}, tl.where({a} <= {lo!r}, {info.min}, {safe}.to({t})))"


def _round(text: str, d: DType) -> str:
    """A float32 result rounded to a half type (kept in float32), as the reference stores it."""
    if d is dt.bfloat16:
        return f"_braze_bf16({text})"
    if d.is_half:
        return f"{text}.to({TL[d.name]}).to(tl.float32)"
    return text


def stored(value: str, d: DType) -> str:
    """A computed value as an element of a buffer of ``d`` (a bfloat16 one rounded to
    nearest first: what is left is exact in the type, whatever the conversion does)."""
    if d is dt.bfloat16:
        value = f"_braze_bf16({value})"
    return f"{value}.to({TL[d.name]})"


def _cast(r: Renderer, e: ir.Op, args: list[str], src: DType) -> str:
    if e.dtype is dt.bool_:
        return f"({args[0]} != 0)"
    if src.is_floating_point and e.dtype.is_integer:
        return _float_to_int(args[0], e.dtype)
    return args[0]


def _pow_rule(r: Renderer, e: ir.Op, args: list[str], src: DType) -> str:
    b = e.args[1]
    return _pow(args[0], args[1], b.value if isinstance(b, ir.Const) else None, src)


class Renderer(ExprRenderer):
    """Renders expressions inside one loop body as Triton statements, each distinct
    subexpression one temporary (``loops.ExprRenderer``: the walk; here the Triton of
    its leaves and ops). ``mask`` is the lanes' validity (None for a scalar body: the
    row stores)."""

    OPS: ClassVar[Mapping[str, OpRule]] = {
        "where": lambda r, e, args, src: f"tl.where({args[0]} != 0, {args[1]}, {args[2]})",
        "cast": _cast,
        "pow": _pow_rule,
    }
    UNARY = UNARY
    BINARY = BINARY

    def __init__(self, coords: list[str], n_outer: int, mask: str | None, prefix: str = "v",
                 acc: str = "acc{}") -> None:
        self.coords = coords
        self.n_outer = n_outer
        self.mask = mask
        self.prefix = prefix
        self.acc = acc
        self.memo: dict[ir.Expr, str] = {}
        self.stmts: list[str] = []

    def index(self, a: ir.Affine) -> str:
        terms = [str(int(a.offset))] if a.offset else []
        for c, k in zip(self.coords, a.coeffs):
            if k:
                terms.append(c if k == 1 else f"{c} * {int(k)}")
        for c_, add, d, k in a.divs:
            q = f"(({self.coords[c_]} + {add}) // {d})" if add else f"({self.coords[c_]} // {d})"
            terms.append(q if k == 1 else f"{q} * {int(k)}")
        return " + ".join(terms) or "0"

    def lanes(self, a: ir.Affine, when: tuple[tuple[int, int, int], ...]) -> bool:
        """Does a load at ``a`` (guarded by ``when``) differ from lane to lane?"""
        return any(a.coeffs[self.n_outer:]) or any(d[0] >= self.n_outer for d in a.divs) \
            or any(c >= self.n_outer for c, _, _ in when)

    def load(self, e: ir.Load) -> str:
        # (a gather's load is taken as lane-wide whatever its index: a pointer as wide as its mask)
        lanes = self.mask is not None and (self.lanes(e.index, e.when) or bool(e.at))
        # (a row coordinate in a lane mask is widened to the lanes: Triton's interpreter
        # cannot combine a vector mask with a scalar one)
        at = [self.coords[c] + (" + 0 * j" if lanes and c < self.n_outer else "") for c, _, _ in e.when]
        conds = [f"({x} >= {lo}) & ({x} < {hi})" for x, (_, lo, hi) in zip(at, e.when)]
        if lanes:
            conds.insert(0, str(self.mask))
        ptr = " + ".join([f"a{e.arg} + {self.index(e.index)}"] + [f"{self.expr(i)} * {int(st)}" for i, st in e.at]
                         + (["0 * j"] if lanes and e.at else []))
        text = f"tl.load({ptr}, mask={' & '.join(conds)}, other=0)" if conds else f"tl.load({ptr})"
        return f"{text}.to({vtype(e.dtype)})"

    def const(self, e: ir.Const) -> str:
        return const(e.value, e.dtype)

    def coord(self, e: ir.Coord) -> str:
        return f"{self.coords[e.dim]}.to({vtype(e.dtype)})"

    def unrendered(self, e: ir.Expr) -> Exception:
        if isinstance(e, ir.Op):
            return NotRendered(f"the element-wise op {e.name!r}")
        return NotRendered(f"a {type(e).__name__} (chain kernels: attention as one kernel)")

    def declare(self, name: str, text: str, e: ir.Expr) -> str:
        return f"{name} = {text}"

    def typed(self, text: str, d: DType) -> str:
        return _round(f"({text}).to({vtype(d)})", d)

    def checked(self, e: ir.Op, args: list[str]) -> str:
        """A gathered index ``i`` if inside ``[0, size)``, else 0, the bad value folded
        into ``err`` (per check: a flag, the smallest and the largest bad value; the
        runtime names the one the reference names). In a lane body the index is widened
        to the lanes and masked by them (a masked lane's index is no index)."""
        i, size, check = args[0], args[1], dict(e.attrs)["check"]
        if self.mask is not None:
            i = f"({i} + 0 * j)"
        bad = f"(({i} < 0) | ({i} >= {size}))" + (f" & {self.mask}" if self.mask is not None else "")
        name = f"{self.prefix}bad{len(self.memo)}"
        self.stmts += [f"{name} = {bad}",
                       f"tl.store(err + {3 * check} + 0 * {i}, 1, mask={name})",
                       f"tl.atomic_min(err + {3 * check + 1} + 0 * {i}, {i}, mask={name})",
                       f"tl.atomic_max(err + {3 * check + 2} + 0 * {i}, {i}, mask={name})"]
        return f"tl.where({name}, 0, {i})"


_IDENTITY = {"sum": 0, "prod": 1, "any": 0, "all": 1}


def identity(op: str, d: DType) -> str:
    """The value a fold over no element gives, as a literal of the accumulator's type."""
    if op in _IDENTITY:
        return literal(_IDENTITY[op], d)
    if d.is_floating_point:
        return literal(-math.inf if op == "amax" else math.inf, d)
    if d is dt.bool_:
        return literal(op != "amax", d)
    import numpy as np
    info = np.iinfo(d.np)
    return literal(info.min if op == "amax" else info.max, d)


#: per reduction: the lane-wise fold of the accumulator ``{acc}`` with ``{x}``, and the
#: reduction of the accumulator vector to the row's value
_FOLD = {
    "sum": ("{acc} + {x}", "tl.sum({acc}, axis=0)"),
    "prod": ("{acc} * {x}", "tl.reduce({acc}, 0, _braze_mul)"),
    "any": ("{acc} | ({x} != 0)", "tl.max({acc}.to(tl.int32), axis=0) != 0"),
    "all": ("{acc} & ({x} != 0)", "tl.min({acc}.to(tl.int32), axis=0) != 0"),
    "amax": ("tl.where({x} > {acc}, {x}, {acc})", "tl.max({acc}, axis=0)"),
    "amin": ("tl.where({x} < {acc}, {x}, {acc})", "tl.min({acc}, axis=0)"),
}

#: float32 -> nearest bfloat16 (ties to even), kept in float32, NaN kept NaN: by bits,
#: since Triton's interpreter truncates in .to(tl.bfloat16). A GPU's own conversion
#: rounds to nearest even in one instruction: ``for_gpu`` swaps it in.
BF16_BY_BITS = '''    u = x.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    r = tl.where((u & 0x7FFFFFFF) > 0x7F800000, u | 0x400000, r)
    return r.to(tl.float32, bitcast=True)
'''
BF16_NATIVE = "    return x.to(tl.bfloat16).to(tl.float32)\n"

PRELUDE = '''import triton
import triton.language as tl


@triton.jit
def _braze_mul(a, b):
    return a * b


@triton.jit
def _braze_bf16(x):
''' + BF16_BY_BITS


def for_gpu(source: str) -> str:
    """A rendered module as a GPU compiles it: native bfloat16 rounding."""
    return source.replace(BF16_BY_BITS, BF16_NATIVE)


@dataclass(frozen=True)
class Rendered:
    """A kernel's Triton source (a module defining ``name``), the grid it is launched on
    (an element kernel: one program per row) and its constexpr arguments (an element
    kernel's ``BLOCK``: the lanes of its row blocks)."""

    source: str
    name: str
    grid: tuple[int, ...]
    meta: dict[str, int]


def block_for(n: int) -> int:
    return min(MAX_BLOCK, 1 << max(0, (max(n, 1) - 1).bit_length()))


def kernel_source(k: Any, name: str) -> Rendered:
    """The Triton module of one kernel: ``name(a0, a1, ..., BLOCK)``."""
    if not isinstance(k, ir.Kernel):
        raise NotRendered({"QLinear": "a quantized matmul", "QRows": "a quantized row gather",
                           "TopK": "top-k"}.get(type(k).__name__, type(k).__name__))
    for st in k.stages:
        if isinstance(st, ir.Contract):
            raise NotRendered("a chain kernel (attention as one kernel)")
        if isinstance(st, ir.Scan) and (len(k.inner) != 1 or st.op != "sum"):
            raise NotRendered("a prefix scan over more than the row's one dim")
        if isinstance(st, ir.Store) and st.at:
            raise NotRendered("a scatter at data-dependent rows")
    for d, _ in k.args:
        vtype(d)
    k = collapsed(k)
    if all(isinstance(s, ir.Store) for s in k.stages):
        return _elementwise(k, name)
    if prod(k.inner) <= PERSISTENT_MAX and not any(isinstance(s, ir.Scan) for s in k.stages):
        return _persistent(k, name)
    rows = prod(k.outer)
    length = prod(k.inner)
    block = block_for(length)
    n_out, n_in = len(k.outer), len(k.inner)
    coords = [f"o{i}" for i in range(n_out)] + [f"i{i}" for i in range(n_in)]
    lines = _header(k, name) + ["    row = tl.program_id(0).to(tl.int64)"]
    lines += _coords([f"o{i}" for i in range(n_out)], k.outer, "row", "    ")  # this program's row

    def walk(body: list[str]) -> list[str]:
        """A loop over the row's blocks with ``body`` inside (``j``, ``m`` and the inner
        coordinates in scope); a kernel without inner loops runs its body once, as a vector
        of one lane, so every body is the same shape."""
        out = [f"    for start in range(0, {length}, BLOCK):",
               "        j = start + tl.arange(0, BLOCK).to(tl.int64)",
               f"        m = j < {length}"]
        return out + _coords([f"i{i}" for i in range(n_in)], k.inner, "j", "        ") + ["        " + b for b in body]

    for p in passes(k):
        body: list[str] = []
        r = Renderer(coords, n_out, "m", prefix=f"w{p[0]}_")
        for i in scans(k, p):  # a fold of scanned values: the walk scans again
            carry, scanned = _scan(r, k, i)
            lines.append(carry)
            body += scanned
        for i in p:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            if argfold.is_arg(s):  # lane vectors of (value, index), combined after the walk
                t, ident = _arg_type(s)
                lines += [f"    av{i} = tl.full([BLOCK], {ident}, {t})", f"    ai{i} = tl.zeros([BLOCK], tl.int64)"]
                body += _arg_values(r, s, i) + argfold.triton_update(s, i, f"x{i}", f"idx{i}")
                continue
            acc_t = vtype(s.dtype)
            lines.append(f"    acc{i} = tl.full([BLOCK], {identity(s.op, s.dtype)}, {acc_t})")
            if is_float_minmax(s):
                lines.append(f"    nan{i} = tl.zeros([BLOCK], tl.int32)")
            x = r.expr(s.expr)
            body += r.take()
            xv = f"tl.where(m, ({x}).to({acc_t}), tl.full([], {identity(s.op, s.dtype)}, {acc_t}))"
            body.append(f"x{i} = {xv}")
            body.append(f"acc{i} = " + _FOLD[s.op][0].format(acc=f"acc{i}", x=f"x{i}"))
            if is_float_minmax(s):
                body.append(f"nan{i} = tl.maximum(nan{i}, (x{i} != x{i}).to(tl.int32))")
        lines += walk(body)
        for i in p:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            if argfold.is_arg(s):
                lines += ["    " + t for t in argfold.triton_finish(s, i)]
                continue
            lines.append(f"    acc{i} = " + _FOLD[s.op][1].format(acc=f"acc{i}"))
            if is_float_minmax(s):
                lines.append(f"    acc{i} = tl.where(tl.max(nan{i}, axis=0) != 0, float('nan'), acc{i})")
    lines += _row_stores(k, coords[:n_out])
    elem = Renderer(coords, n_out, "m")
    body = []
    for i, s in enumerate(k.stages):
        if isinstance(s, ir.Scan):
            carry, scanned = _scan(elem, k, i)
            lines.append(carry)
            body += scanned
    body += _element_stores(k, elem)
    if body:
        lines += walk(body)
    return Rendered(PRELUDE + "\n".join(lines) + "\n", name, (rows,), {"BLOCK": block})


def _scan(r: Renderer, k: ir.Kernel, i: int) -> tuple[str, list[str]]:
    """A prefix sum (cumsum) in a walk: the carry's start (before the walk), and the body
    giving the block's values ``acc{i}``, each on top of the blocks' before."""
    s = k.stages[i]
    assert isinstance(s, ir.Scan)
    acc_t = vtype(s.dtype)
    x = r.expr(s.expr)
    return f"    carry{i} = tl.full([], 0, {acc_t})", r.take() + [
        f"x{i} = tl.where(m, ({x}).to({acc_t}), tl.full([], 0, {acc_t}))",
        f"acc{i} = tl.cumsum(x{i}, axis=0) + carry{i}",
        f"carry{i} = carry{i} + tl.sum(x{i}, axis=0)"]


#: lanes per program of an element-wise kernel, and its warps (8 elements a thread: two
#: 16-byte accesses of float32)
FLAT_BLOCK = 1024
FLAT_WARPS = 4


def _coords(names: list[str], sizes: tuple[int, ...], flat: str, indent: str) -> list[str]:
    """Statements splitting the flat index ``flat`` into coordinates ``names`` (row-major
    over ``sizes``); a single dim is the flat index itself."""
    out: list[str] = []
    rest = flat
    for i in range(len(sizes) - 1, -1, -1):
        out.append(f"{indent}{names[i]} = {rest} % {sizes[i]}" if i else f"{indent}{names[i]} = {rest}")
        if i:
            out.append(f"{indent}q_{names[i]} = {rest} // {sizes[i]}")
            rest = f"q_{names[i]}"
    return out


def _elementwise(k: ir.Kernel, name: str) -> Rendered:
    """A kernel of element stores only, over its whole iteration space as one flat range:
    one program per block of ``BLOCK`` elements, so every multiprocessor gets work
    however the space splits into rows."""
    sizes = tuple(k.outer) + tuple(k.inner)
    total = prod(sizes)
    block = min(FLAT_BLOCK, block_for(total))
    coords = [f"i{d}" for d in range(len(sizes))]
    lines = _header(k, name) + ["    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)",
             f"    m = j < {total}"]
    lines += _coords(coords, sizes, "j", "    ")
    elem = Renderer(coords, 0, "m")
    lines += ["    " + t for t in _element_stores(k, elem)]
    meta = {"BLOCK": block, "num_warps": FLAT_WARPS if block >= 128 else 1}
    return Rendered(PRELUDE + "\n".join(lines) + "\n", name, (-(-total // block),), meta)


#: a row this long or shorter is held in registers whole: read once, every pass over it
#: and its stores from the same values (Inductor's persistent reductions); longer rows
#: are walked in blocks, one walk per pass
PERSISTENT_MAX = 8192


def _header(k: ir.Kernel, name: str) -> list[str]:
    args = ", ".join([f"a{i}" for i in range(len(k.args))] + (["err"] if k.checks else []))
    return ["", "", "@triton.jit", f"def {name}({args}{', ' if args else ''}BLOCK: tl.constexpr):"]


def _persistent(k: ir.Kernel, name: str) -> Rendered:
    """A row kernel whose row fits in one block: one program per row, the row's values
    loaded once into registers; each pass of reductions folds them with ``tl.sum`` /
    ``tl.max``..., and the element stores reuse the same loads (one renderer, one memo)."""
    n_out, n_in = len(k.outer), len(k.inner)
    length = prod(k.inner)
    block = block_for(length) if length <= MAX_BLOCK else 1 << (length - 1).bit_length()
    coords = [f"o{i}" for i in range(n_out)] + [f"i{i}" for i in range(n_in)]
    lines = _header(k, name) + ["    row = tl.program_id(0).to(tl.int64)"]
    lines += _coords([f"o{i}" for i in range(n_out)], k.outer, "row", "    ")
    lines += ["    j = tl.arange(0, BLOCK).to(tl.int64)", f"    m = j < {length}"]
    lines += _coords([f"i{i}" for i in range(n_in)], k.inner, "j", "    ")
    r = Renderer(coords, n_out, "m")
    for p in passes(k):
        for i in p:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            if argfold.is_arg(s):  # every lane at once: the lanes are the row
                lines += ["    " + t for t in _arg_values(r, s, i) + [f"av{i} = x{i}", f"ai{i} = idx{i}"]
                          + argfold.triton_finish(s, i)]
                continue
            acc_t = vtype(s.dtype)
            x = r.expr(s.expr)
            lines += ["    " + t for t in r.take()]
            lines.append(f"    x{i} = tl.where(m, ({x}).to({acc_t}), tl.full([], {identity(s.op, s.dtype)}, {acc_t}))")
            lines.append(f"    acc{i} = " + _FOLD[s.op][1].format(acc=f"x{i}"))
            if is_float_minmax(s):
                lines.append(f"    acc{i} = tl.where(tl.max((x{i} != x{i}).to(tl.int32), axis=0) != 0, float('nan'), acc{i})")
    lines += _row_stores(k, coords[:n_out])
    lines += ["    " + t for t in _element_stores(k, r)]
    meta = {"BLOCK": block, "num_warps": min(16, max(4, block // 256))}
    return Rendered(PRELUDE + "\n".join(lines) + "\n", name, (prod(k.outer),), meta)


def _arg_type(s: ir.Reduce) -> tuple[str, str]:
    """An arg fold's value type (bools as int32) and its identity, as Triton spells them."""
    d = s.expr.dtype
    return ("tl.int32" if d is dt.bool_ else vtype(d)), literal(argfold.identity(s.op, d), d)


def _arg_values(r: Renderer, s: ir.Reduce, i: int) -> list[str]:
    """Statements giving an arg fold's lane values ``x{i}`` (the identity in masked
    lanes, which never beats it) and positions ``idx{i}``."""
    assert s.index is not None
    t, ident = _arg_type(s)
    x, idx = r.expr(s.expr), r.expr(s.index)
    return r.take() + [f"x{i} = tl.where(m, ({x}).to({t}), tl.full([], {ident}, {t}))", f"idx{i} = {idx} + 0 * j"]


def _element_stores(k: ir.Kernel, r: Renderer) -> list[str]:
    """The element stores of a body, every value computed (every load done) before the
    first store: a store may write what a later store's value reads (an in-place write)."""
    values = [(s, r.expr(s.expr)) for s in k.stages if isinstance(s, ir.Store)]
    out = r.take()
    for s, value in values:
        # (+ 0 * j: a pointer as wide as the mask where the index does not move along the row)
        lanes = "" if r.lanes(s.index, ()) else " + 0 * j"
        out.append(f"tl.store(a{s.arg} + {r.index(s.index)}{lanes}, {stored(value, k.args[s.arg][0])}, mask=m)")
    return out


def _row_stores(k: ir.Kernel, coords: list[str]) -> list[str]:
    """A row kernel's row stores (a reduction's result), once per row, after its passes."""
    row = Renderer(coords, len(coords), None, prefix="r")
    lines: list[str] = []
    for s in k.stages:
        if isinstance(s, ir.StoreRow):
            value = row.expr(s.expr)
            lines += ["    " + t for t in row.take()]
            lines.append(f"    tl.store(a{s.arg} + {row.index(s.index)}, {stored(value, k.args[s.arg][0])})")
    return lines
