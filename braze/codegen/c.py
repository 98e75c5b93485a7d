"""C renderer: loop IR to C with OpenMP, as rule tables.

``UNARY``/``BINARY`` map an op name to a C template per kind of dtype; ``render`` walks
an expression tree through them; ``kernel_source`` lays out the loops: an OpenMP
parallel loop over rows, and inside a row one loop per pass (the reductions of a pass
share it; stores follow the last pass), innermost loops marked ``omp simd`` so gcc
vectorises them. Half types are loaded into float, and every half result is rounded
back to its type, so a fused chain computes what the reference computes node by node.
Transcendental float32 functions are braze's own (``cmath.h``): vectorisable, exact
on inf and nan. float64 uses libm.
"""

from __future__ import annotations

import math
from pathlib import Path
from math import prod
from typing import Any, Callable

from .. import dtypes as dt
from .. import ir
from ..dtypes import DType
from . import argfold, checks, qlib, quant
from .loops import Temporaries, is_float_minmax, passes, scans
from .headers import header

CTYPE = {
    "float32": "float", "float64": "double", "float16": "uint16_t", "bfloat16": "uint16_t",
    "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "bool": "uint8_t",
}


def vtype(d: DType) -> str:
    """The C type a value of dtype ``d`` is computed in."""
    if d.is_half:
        return "float"
    if d is dt.bool_:
        return "int"
    return CTYPE[d.name]


def _f(d: DType, f32: str, f64: str) -> str:
    return f64 if d is dt.float64 else f32


def _sel(d: DType, cond: str, a: str, b: str) -> str:
    """``cond ? a : b``. gcc does not vectorise a float ``?:`` without -ffast-math, so
    float selects go through cmath.h's branch-free bit-mask select."""
    if d is dt.float64:
        return f"braze__seld({cond}, {a}, {b})"
    if d.is_floating_point:
        return f"braze__sel({cond}, {a}, {b})"
    return f"(({cond}) ? {a} : {b})"


# unary: name -> template with {a}; float templates pick f32/f64 spellings
UNARY: dict[str, Any] = {
    "neg": lambda d: "(-{a})",
    "abs": lambda d: _f(d, "fabsf({a})", "fabs({a})") if d.is_floating_point else "({a} < 0 ? -{a} : {a})",
    "exp": lambda d: _f(d, "braze_expf({a})", "exp({a})"),
    "log": lambda d: _f(d, "braze_logf({a})", "log({a})"),
    "sqrt": lambda d: _f(d, "sqrtf({a})", "sqrt({a})"),
    "rsqrt": lambda d: _f(d, "(1.0f / sqrtf({a}))", "(1.0 / sqrt({a}))"),
    "reciprocal": lambda d: _f(d, "(1.0f / {a})", "(1.0 / {a})"),
    "sin": lambda d: _f(d, "braze_sinf({a})", "sin({a})"),
    "cos": lambda d: _f(d, "braze_cosf({a})", "cos({a})"),
    "tanh": lambda d: _f(d, "braze_tanhf({a})", "tanh({a})"),
    "sigmoid": lambda d: _f(d, "braze_sigmoidf({a})", "(1.0 / (1.0 + exp(-{a})))"),
    "erf": lambda d: _f(d, "braze_erff({a})", "erf({a})"),
    "relu": lambda d: _sel(d, "{a} < 0", "0", "{a}"),
    "gelu": lambda d: _f(d, "(0.5f * {a} * (1.0f + braze_erff({a} * 0.70710678118654752f)))",
                         "(0.5 * {a} * (1.0 + erf({a} * 0.70710678118654752)))"),
    "gelu_tanh": lambda d: _f(d, "(0.5f * {a} * (1.0f + braze_tanhf(0.79788456080286536f * ({a} + 0.044715f * {a} * {a} * {a}))))",
                              "(0.5 * {a} * (1.0 + tanh(0.79788456080286536 * ({a} + 0.044715 * {a} * {a} * {a}))))"),
    "silu": lambda d: _f(d, "({a} * braze_sigmoidf({a}))", "({a} / (1.0 + exp(-{a})))"),
    "floor": lambda d: _f(d, "floorf({a})", "floor({a})") if d.is_floating_point else "{a}",
    "ceil": lambda d: _f(d, "ceilf({a})", "ceil({a})") if d.is_floating_point else "{a}",
    "round": lambda d: _f(d, "rintf({a})", "rint({a})") if d.is_floating_point else "{a}",
    "sign": lambda d: (_sel(d, "{a} != {a}", "{a}", "(({a} > 0) - ({a} < 0))") if d.is_floating_point
                       else "(({a} > 0) - ({a} < 0))"),
    "logical_not": lambda d: "({a} == 0)",
    "isnan": lambda d: "({a} != {a})",
    "isinf": lambda d: _f(d, "(fabsf({a}) == INFINITY)", "(fabs({a}) == INFINITY)"),
    "isfinite": lambda d: "({a} - {a} == 0)",
}

BINARY: dict[str, Any] = {
    "add": lambda d: "({a} + {b})",
    "sub": lambda d: "({a} - {b})",
    "mul": lambda d: "({a} * {b})",
    "div": lambda d: "({a} / {b})" if d.is_floating_point else "((double){a} / (double){b})",
    "floor_divide": lambda d: "braze_floordiv_i64({a}, {b})",
    "remainder": lambda d: "braze_mod_i64({a}, {b})",
    "pow": lambda d: _f(d, "powf({a}, {b})", "pow({a}, {b})"),
    "maximum": lambda d: _sel(d, "({a} != {a}) || {a} > {b}", "{a}", "{b}"),
    "minimum": lambda d: _sel(d, "({a} != {a}) || {a} < {b}", "{a}", "{b}"),
    "eq": lambda d: "({a} == {b})",
    "ne": lambda d: "({a} != {b})",
    "lt": lambda d: "({a} < {b})",
    "le": lambda d: "({a} <= {b})",
    "gt": lambda d: "({a} > {b})",
    "ge": lambda d: "({a} >= {b})",
    "logical_and": lambda d: "(({a} != 0) && ({b} != 0))",
    "logical_or": lambda d: "(({a} != 0) || ({b} != 0))",
    "logical_xor": lambda d: "(({a} != 0) != ({b} != 0))",
}

PRELUDE = r"""
#include <stdint.h>
#include <math.h>
/* float16 -> float by bits (exact; gcc's _Float16 conversion does not vectorise, this
 * does, 3x faster in a loop): a normal's exponent is rebiased by 112 in place, a
 * subnormal (or zero) is its integer mantissa times 2^-24 (a normal float: exact also
 * under denormals-are-zero, which torch.set_flush_denormal or -ffast-math code may have
 * set), inf and nan keep an all-ones exponent and their payload. */
static inline float braze_h2f(uint16_t h) {
    const uint32_t em = h & 0x7fffu, sign = (uint32_t)(h & 0x8000u) << 16;
    const float sub = (float)(int32_t)em * 0x1p-24f;
    uint32_t u; __builtin_memcpy(&u, &sub, 4);
    /* selects by masks: gcc turns ?: on these into branches, and then does not vectorise */
    const uint32_t is_sub = 0u - (uint32_t)(em < 0x400u), is_special = 0u - (uint32_t)(em >= 0x7c00u);
    uint32_t r = (((em << 13) + 0x38000000u) & ~is_special) | (((em << 13) | 0x7f800000u) & is_special);
    r = (r & ~is_sub) | (u & is_sub);
    r |= sign; float f; __builtin_memcpy(&f, &r, 4); return f;
}
static inline uint16_t braze_f2h(float f) { _Float16 v = (_Float16)f; uint16_t h; __builtin_memcpy(&h, &v, 2); return h; }
static inline float braze_b2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline uint16_t braze_f2b(float f) {
    uint32_t u; __builtin_memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;        /* round to nearest even */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : r);  /* keep nan a nan */
}
static inline int64_t braze_floordiv_i64(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0u - (uint64_t)a);  /* INT64_MIN / -1 traps in C; numpy wraps */
    int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t braze_mod_i64(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;  /* (INT64_MIN % -1 traps in C) */
    int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
/* Copy n bytes to dst with non-temporal stores (around the cache; see _streams). */
static inline void braze_stream(void *dst, const void *src, int64_t n) {
    char *d = (char *)dst; const char *s = (const char *)src;
#if defined(__AVX__)
    typedef float v8u __attribute__((vector_size(32), aligned(1), may_alias));
    while (n > 0 && ((uintptr_t)d & 31)) { *d++ = *s++; n--; }
    for (; n >= 32; n -= 32, d += 32, s += 32) __builtin_ia32_movntps256((float *)d, *(const v8u *)s);
#elif defined(__SSE__)
    typedef float v4u __attribute__((vector_size(16), aligned(1), may_alias));
    while (n > 0 && ((uintptr_t)d & 15)) { *d++ = *s++; n--; }
    for (; n >= 16; n -= 16, d += 16, s += 16) __builtin_ia32_movntps((float *)d, *(const v4u *)s);
#endif
    __builtin_memcpy(d, s, n);
}
static inline void braze_sfence(void) {
#if defined(__SSE__)
    __builtin_ia32_sfence();
#endif
}
"""


def _const(value: Any, d: DType) -> str:
    if isinstance(value, ir.Size):  # a count read at run time (a mean's): exact, as the literal would be
        return f"(({vtype(d)}){value})"
    if d.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        return f"{v!r}" if d is dt.float64 else f"{v!r}f"
    if d is dt.bool_:
        return "1" if value else "0"
    return f"INT64_C({int(value)})" if d is dt.int64 else str(int(value))


def _float_to_int(a: str, src: DType, d: DType) -> str:
    """float -> int as the reference defines it (``ops/elementwise.float_to_int``): nan
    0, truncation toward zero inside the range, saturation outside (C leaves the edges
    undefined). A limit that rounds up in the float type is the first value outside."""
    import numpy as np
    info = np.iinfo(d.np)
    f = vtype(src)
    mn, mx = ("INT64_MIN", "INT64_MAX") if d is dt.int64 else (str(info.min), str(info.max))
    t = CTYPE[d.name]
    return f"(({a} != {a}) ? ({t})0 : {a} <= ({f}){mn} ? ({t}){mn} : {a} >= ({f}){mx} ? ({t}){mx} : ({t}){a})"


def _round(expr: str, d: DType) -> str:
    """Round a float result to a half type, as the reference stores it."""
    if d is dt.float16:
        return f"braze_h2f(braze_f2h({expr}))"
    if d is dt.bfloat16:
        return f"braze_b2f(braze_f2b({expr}))"
    return expr


def converted(value: str, src: DType, d: DType) -> str:
    """C for ``value`` (computed in ``vtype(src)``) as an element of a buffer of ``d``."""
    if d is dt.float16:
        return f"braze_f2h({value})"
    if d is dt.bfloat16:
        return f"braze_f2b({value})"
    if src is not d:
        return f"({CTYPE[d.name]})({value})"
    return value


class Renderer(Temporaries):
    """Renders expressions inside one loop body, each distinct subexpression one
    ``const`` temporary (``loops.Temporaries``)."""

    def __init__(self, coords: list[str], prefix: str = "v", acc: str = "acc{}", n_outer: int = 0,
                 hoisted: dict[ir.Expr, str] | None = None) -> None:
        self.coords = coords
        self.n_outer = n_outer  # coords before this one are constant along the row
        self.prefix = prefix
        self.acc = acc  # how an accumulator is spelled here (a scalar, or a block's slot)
        self.memo: dict[ir.Expr, str] = {}
        self.stmts: list[str] = []
        self.hoisted = hoisted or {}  # loads done once per kernel (see _hoist)
        #: When a list: float32 ``exp`` is rendered as ``braze__exp_normal`` and its
        #: argument appended here, for a loop that folds their ``braze__exp_k``
        #: and is redone with ``braze_expf`` when any k left [-126, 127] (``codegen/chain.py``).
        self.fast: list[str] | None = None

    def index(self, a: ir.Affine) -> str:
        terms = [str(a.offset)] if a.offset else []
        for c, k in zip(self.coords, a.coeffs):
            if k:
                terms.append(c if k == 1 else f"{c} * {k}")
        for c_, add, d, k in a.divs:
            x = self.coords[c_]
            q = f"(({x} + {add}) / {d})" if add else f"({x} / {d})"
            terms.append(q if k == 1 else f"{q} * {k}")
        return " + ".join(terms) or "0"

    def load(self, arg: int, a: ir.Affine, d: DType, when: tuple[tuple[int, int, int], ...] = (),
             at: tuple[tuple[ir.Expr, int], ...] = ()) -> str:
        index = " + ".join([self.index(a)] + [f"{self.expr(i)} * {s}" for i, s in at])
        raw = f"a{arg}[{index}]"
        if when:  # read only inside the range (outside, the index may point anywhere)
            cond = " && ".join(f"{self.coords[c]} >= {lo} && {self.coords[c]} < {hi}" for c, lo, hi in when)
            raw = f"(({cond}) ? {raw} : 0)"
        if d is dt.float16:
            return f"braze_h2f({raw})"
        if d is dt.bfloat16:
            return f"braze_b2f({raw})"
        return f"(({vtype(d)}){raw})"

    def expr(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Const):
            return f"(({vtype(e.dtype)}){_const(e.value, e.dtype)})"
        if isinstance(e, ir.Coord):
            return f"(({vtype(e.dtype)}){self.coords[e.dim]})"
        if isinstance(e, ir.Acc):
            return self.memo.get(e) or self.acc.format(e.stage)  # (a scan's element value: its block buffer)
        if isinstance(e, ir.Var):
            return self.memo.get(e, e.name)
        name = self.memo.get(e) or self.hoisted.get(e)
        if name is not None:
            return name
        if isinstance(e, ir.Load):
            text = self.load(e.arg, e.index, e.dtype, e.when, e.at)
        elif isinstance(e, ir.Op):
            text = self.op(e)
        else:  # a Dot is rendered by the chain kernel, which names its tile value
            raise AssertionError(f"no C for {type(e).__name__} outside a chain kernel")
        return self.bind(e, text)

    def declare(self, name: str, text: str, e: ir.Expr) -> str:
        return f"const {vtype(e.dtype)} {name} = {text};"

    def op(self, e: ir.Op) -> str:
        args = [self.expr(a) for a in e.args]
        src = e.args[0].dtype if e.args else e.dtype
        if e.name == "where":
            text = _sel(e.dtype, args[0], args[1], args[2])
        elif e.name == "checked":
            text = checks.render(e, args)
        elif e.name == "cast":
            text = f"({args[0]} != 0)" if e.dtype is dt.bool_ else \
                _float_to_int(args[0], src, e.dtype) if src.is_floating_point and e.dtype.is_integer else args[0]
        elif e.name == "exp" and self.fast is not None and src is dt.float32:
            self.fast.append(args[0])
            text = f"braze__exp_normal({args[0]})"
        elif e.name in UNARY:
            text = UNARY[e.name](src).format(a=args[0])
        elif e.name == "div" and src.is_floating_point and not ir.uses_inner(e.args[1], self.n_outer):
            # Division by a value constant along the row (a scalar, a row's sum) is a
            # multiplication by its reciprocal, computed once per row: one rounding more
            # (<= 1.5 ulp from the reference's x / c), as Inductor does for constant
            # divisors, and a vdivps per element less.
            one = "1.0" if src is dt.float64 else "1.0f"
            text = f"({args[0]} * ({one} / {args[1]}))"
        else:
            text = BINARY[e.name](src).format(a=args[0], b=args[1])
        return _round(f"(({vtype(e.dtype)}){text})", e.dtype)

    def stored(self, e: ir.Expr, d: DType) -> str:
        """The value of ``e`` as stored into a buffer of dtype ``d``."""
        return converted(self.expr(e), e.dtype, d)

    def store(self, arg: int, a: ir.Affine, e: ir.Expr, d: DType, at: tuple[tuple[ir.Expr, int], ...] = ()) -> str:
        index = " + ".join([self.index(a)] + [f"{self.expr(i)} * {s}" for i, s in at])  # a scatter's rows
        return f"a{arg}[{index}] = {self.stored(e, d)};"



_INIT = {"sum": "0", "prod": "1", "any": "0", "all": "1"}
_OMP = {"sum": "+", "prod": "*", "any": "|", "all": "&", "amax": "max", "amin": "min"}


def _reduce_init(op: str, d: DType) -> str:
    if op in _INIT:
        return _INIT[op]
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


def _reduce_update(op: str, acc: str, x: str, d: DType) -> str:
    return {
        "sum": f"{acc} += {x};",
        "prod": f"{acc} *= {x};",
        "any": f"{acc} |= ({x} != 0);",
        "all": f"{acc} &= ({x} != 0);",
        "amax": f"{acc} = {_sel(d, f'{x} > {acc}', x, acc)};",
        "amin": f"{acc} = {_sel(d, f'{x} < {acc}', x, acc)};",
    }[op]


COLUMN_BLOCK = 256


def _column_reduction(k: ir.Kernel) -> bool:
    """A reduction over an outer (strided) dim, e.g. ``x.sum(0)`` of a row-major
    matrix: one row is one column of memory, so walking a row strides through memory.
    Such a kernel is better run with the loops swapped: for a block of rows, walk the
    reduced dim outside and the rows inside, where the loads are contiguous."""
    if len(k.outer) != 1 or not k.inner or any(isinstance(s, (ir.Store, ir.Scan)) or argfold.is_arg(s) for s in k.stages):
        return False  # (an arg fold walks its row in lanes: codegen/argfold.py)
    reduces = [s for s in k.stages if isinstance(s, ir.Reduce)]
    if not reduces or len(passes(k)) != 1:
        return False
    loads = [n for s in reduces for n in ir.walk(s.expr) if isinstance(n, ir.Load)]
    return bool(loads) and all(n.index.coeffs[0] == 1 and n.index.coeffs[-1] != 1 and not n.index.divs for n in loads)


def _fold(k: ir.Kernel, indices: list[int], r: Renderer, acc: str, nan: str) -> list[str]:
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
        updates.append(_reduce_update(s.op, acc.format(i), x, s.dtype))
    return r.take() + updates


def _column_source(k: ir.Kernel, lines: list[str], hoisted: dict[ir.Expr, str]) -> str:
    n_in = len(k.inner)
    coords = ["o0"] + [f"i{i}" for i in range(n_in)]
    rows = k.outer[0]
    reduces = [i for i, s in enumerate(k.stages) if isinstance(s, ir.Reduce)]
    lines.append(f"    #pragma omp parallel for num_threads(nthreads) schedule(static) if(nthreads > 1 && {rows * prod(k.inner)} > 32768)")
    lines.append(f"    for (int64_t rb = 0; rb < {rows}; rb += {COLUMN_BLOCK}) {{")
    lines.append(f"        const int64_t nb = {rows} - rb < {COLUMN_BLOCK} ? {rows} - rb : {COLUMN_BLOCK};")
    for i in reduces:
        s = k.stages[i]
        assert isinstance(s, ir.Reduce)
        lines.append(f"        {vtype(s.dtype)} acc{i}[{COLUMN_BLOCK}];")
        lines.append(f"        for (int64_t r = 0; r < nb; r++) acc{i}[r] = {_reduce_init(s.op, s.dtype)};")
        if is_float_minmax(s):
            lines.append(f"        int nan{i}[{COLUMN_BLOCK}] = {{0}};")
    ind = "        "
    for j, size in enumerate(k.inner):
        lines.append(f"{ind}for (int64_t i{j} = 0; i{j} < {size}; i{j}++) {{")
        ind += "    "
    lines.append(f"{ind}#pragma omp simd")
    lines.append(f"{ind}for (int64_t r = 0; r < nb; r++) {{")
    lines.append(f"{ind}    const int64_t o0 = rb + r;")
    body = _fold(k, reduces, Renderer(coords, acc="acc{}[r]", hoisted=hoisted), "acc{}[r]", "nan{}[r]")
    lines += [f"{ind}    {b}" for b in body]
    lines.append(f"{ind}}}")
    for _ in range(n_in):
        ind = ind[:-4]
        lines.append(f"{ind}}}")
    lines.append("        for (int64_t r = 0; r < nb; r++) {")
    lines.append("            const int64_t o0 = rb + r;")
    for i in reduces:
        if is_float_minmax(k.stages[i]):  # type: ignore[arg-type]
            lines.append(f"            if (nan{i}[r]) acc{i}[r] = NAN;")
    row = Renderer(coords, acc="acc{}[r]", hoisted=hoisted)
    stores = [row.store(s.arg, s.index, s.expr, k.args[s.arg][0]) for s in k.stages if isinstance(s, ir.StoreRow)]
    lines += [f"            {t}" for t in row.take() + stores]
    lines += ["        }", "    }", "}"]
    return "\n".join(lines)


def _stashes(k: ir.Kernel, passes: list[list[int]]) -> dict[ir.Expr, ir.Store]:
    """Values the last reduction pass computes that the stores need again (softmax's
    ``exp(x - max)``, summed, then divided). The last pass writes each into the output
    it will end up in, and the store pass reads it back instead of recomputing it: the
    row is still in cache, and a load is cheaper than an exp. Only when the output has
    the value's own type, so nothing is rounded on the way, and is not also read (an
    in-place write: the store pass may still need the old values the stash overwrote)."""
    if not passes or any(isinstance(s, ir.Scan) for s in k.stages):
        return {}  # (a walk that scans keeps its values in its block buffers)
    out: dict[ir.Expr, ir.Store] = {}
    read = {n.arg for st in k.stages for e in ir.stage_exprs(st) for n in ir.walk(e) if isinstance(n, ir.Load)}
    stores = [s for s in k.stages if isinstance(s, ir.Store) and s.arg not in read]
    for i in passes[-1]:
        red = k.stages[i]
        assert isinstance(red, ir.Reduce)
        e = red.expr
        if not isinstance(e, ir.Op) or e.dtype.is_half or e.dtype is dt.bool_:
            continue
        for st in stores:
            if st not in out.values() and k.args[st.arg][0] is e.dtype and \
                    any(n == e for n in ir.walk(st.expr)):
                out[e] = st
                break
    return out


def _hoist(k: ir.Kernel, lines: list[str]) -> dict[ir.Expr, str]:
    """Loads at a constant index (a scalar: ``x / 2`` reads a 0-d constant) are read once,
    into locals, before the parallel loop. Inside OpenMP's outlined loop body gcc no
    longer knows the argument pointers are ``restrict``, so it would reload each scalar
    and redo every division by it per element (custom-erf GELU: 63 -> 50 ms)."""
    out: dict[ir.Expr, str] = {}
    r = Renderer([])
    for n in (n for s in k.stages for e in ir.stage_exprs(s) for n in ir.walk(e)):
        if isinstance(n, ir.Load) and not any(n.index.coeffs) and not n.index.divs and not n.when and not n.at \
                and n not in out:
            out[n] = f"s{len(out)}"
            lines.append(f"    const {vtype(n.dtype)} {out[n]} = {r.load(n.arg, n.index, n.dtype)};")
    return out


ROLL_TILE = 1024


def _safe(op: str, name: str) -> str:
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


def _rolling(k: ir.Kernel, passes: list[list[int]], coords: list[str], n_out: int,
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
        out.append(f"{vtype(s.dtype)} acc{i} = {_reduce_init(s.op, s.dtype)}; int nan{i} = 0;")
    for p in producers:
        out.append(f"float ns{p} = {_safe(k.stages[p].op, f'acc{p}')};")  # type: ignore[union-attr]
    out.append(f"for (int64_t j0 = 0; j0 < {n}; j0 += {ROLL_TILE}) {{")
    out.append(f"    const int64_t j1 = j0 + {ROLL_TILE} < {n} ? j0 + {ROLL_TILE} : {n};")
    for p in producers:
        out.append(f"    const float os{p} = ns{p};")
    for level in passes:
        clauses = ""
        for i in level:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            out.append(f"    {vtype(s.dtype)} red{i} = {_reduce_init(s.op, s.dtype)}; int rnan{i} = 0;")
            clauses += f" reduction({_OMP[s.op]}:red{i}) reduction(|:rnan{i})"
        r = Renderer(coords, prefix=f"w{level[0]}_", acc="ns{}", n_outer=n_out, hoisted=hoisted)
        body = _fold(k, level, r, "red{}", "rnan{}")
        out.append(f"    #pragma omp simd{clauses}")
        out.append("    for (int64_t i0 = j0; i0 < j1; i0++) {")
        out += ["        " + b for b in body]
        out.append("    }")
        for i in level:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            rr = Renderer(coords, prefix=f"h{i}_", acc="ns{}", n_outer=n_out, hoisted=hoisted)
            out += ["    " + t for t in repaired_when_moved(rr, s.repair, f"acc{i}", s.dtype, f"old{i}")]
            out.append(f"    {{ {vtype(s.dtype)} u = old{i}; " + _reduce_update(s.op, "u", f"red{i}", s.dtype)
                       + f" acc{i} = u; nan{i} |= rnan{i}; }}")
            if i in producers:
                out.append(f"    ns{i} = {_safe(s.op, f'acc{i}')};")
    out.append("}")
    checks = " || ".join(f"nan{p} || !isfinite(acc{p})" for p in producers) or "0"
    out.append(f"const int redo = {checks};")
    for i in reduces:
        if is_float_minmax(k.stages[i]):  # type: ignore[arg-type]
            out.append(f"if (nan{i}) acc{i} = NAN;")
    return out


STREAM_BLOCK = 256  # elements of the innermost loop computed into a stack buffer, then streamed out


def llc_bytes() -> int:
    """The size of the largest cache Linux lists for cpu0 (the last level), else 32 MiB."""
    global _LLC
    if _LLC is None:
        sizes = []
        for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
            try:
                text = f.read_text().strip().upper()
                sizes.append(int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1))
            except (OSError, ValueError):
                pass
        _LLC = max(sizes, default=32 << 20)
    return _LLC


_LLC: int | None = None


def _footprint(k: ir.Kernel) -> int:
    """Bytes of memory the kernel reads and writes: per distinct load or store, the
    elements its index reaches (the extents of the coords it depends on)."""
    extents = k.outer + k.inner
    seen: set[tuple[int, ir.Affine]] = set()
    total = 0

    def add(arg: int, index: ir.Affine) -> None:
        nonlocal total
        if (arg, index) not in seen:
            seen.add((arg, index))
            total += prod(n for n, c in zip(extents, index.coeffs) if c) * k.args[arg][0].itemsize
    for st in k.stages:
        for e in ir.stage_exprs(st):
            for node in ir.walk(e):
                if isinstance(node, ir.Load):
                    add(node.arg, node.index)
        if isinstance(st, (ir.Store, ir.StoreRow)):
            add(st.arg, st.index)
    return total


def _streams(k: ir.Kernel) -> bool:
    """Write this kernel's element stores around the cache (non-temporal stores)?

    When a kernel's operands together fill the last-level cache, its results are
    evicted before a later kernel could read them from there, and a normal store's read
    of each line it is about to overwrite is wasted bandwidth. Measured on the 2-core
    EPYC (32 MiB L3): an element-wise kernel writing 16 MiB from a 16 MiB input takes
    0.83x the time with streaming stores (0.87-0.92x counting a consumer reading the
    result back), while writing 8 MiB it takes 1.0-1.2x (1.25-1.45x with the consumer).
    Only where every store is contiguous along the innermost loop, and no written
    argument is read: writes are deferred to the end of each block, which must not
    change what a later element of the block reads (an in-place op).
    """
    return _may_stream(k) and _footprint(k) >= llc_bytes()


def _may_stream(k: ir.Kernel) -> bool:
    """Could this kernel's stores stream (every store contiguous along the innermost
    loop, no written argument read)? Whether they should is a matter of size."""
    stores = [s for s in k.stages if isinstance(s, ir.Store)]
    if not stores or not k.inner or any(s.index.coeffs[-1] != 1 or s.at for s in stores) \
            or any(isinstance(s, ir.Scan) for s in k.stages):
        return False
    for st in k.stages:
        for e in ir.stage_exprs(st):
            if any(isinstance(n, ir.Load) and k.args[n.arg][1] for n in ir.walk(e)):
                return False
    return True


#: The renderer of chain kernels (``codegen/chain.py``, which builds on this module and
#: registers itself here when imported: the package imports it, so it always is).
CHAIN_RENDERER: Callable[[ir.Kernel, list[str], dict[ir.Expr, str]], str] | None = None
#: The renderers of top-k kernels (``codegen/topk.py``) and of a row's element loops
#: when it scans (``codegen/scan.py``), registered as chain.py's is.
TOPK_RENDERER: Callable[[ir.TopK, str, int], str] | None = None
SCAN_RENDERER: Callable[[ir.Kernel, list[str], int, dict[ir.Expr, str], list[int],
                          Callable[[Renderer], tuple[list[str], str]]], list[str]] | None = None
#: A scattering kernel's check of every row's index before it stores (``codegen/scatter.py``).
SCATTER_PREPASS: Callable[[ir.Kernel, dict[ir.Expr, str]], list[str]] | None = None


def kernel_source(k: ir.Kernel | ir.QLinear | ir.QRows | ir.TopK, name: str, sizes: int = 0,
                  stream: bool | None = None) -> str:
    """The C source of one kernel: ``void name(void **args, int64_t nthreads)``. A
    generic kernel (``codegen/generic.py``) reads its ``sizes`` named sizes from the
    argument after its buffers, and decides when it runs whether its stores stream
    (``_streams``: two bodies, chosen by its footprint). ``stream`` forces the choice."""
    if isinstance(k, ir.QLinear):
        return (_prologue_source(k, name) if k.prologue else "") + _epilogue_source(k, name) \
            + quant.kernel_source(k, name, sizes)
    if isinstance(k, ir.QRows):
        return quant.kernel_source(k, name, sizes)
    if isinstance(k, ir.TopK):
        assert TOPK_RENDERER is not None, "braze.codegen.topk registers the top-k renderer when imported"
        return TOPK_RENDERER(k, name, sizes)
    sized = quant.bind_sizes(len(k.args), sizes)
    if sizes and stream is None and _may_stream(k) and prod(k.outer) and any(isinstance(s, ir.Store) for s in k.stages):
        bodies = [kernel_source(k, f"{name}_{w}", sizes, w == "s").replace("void ", "static void ", 1) for w in "sp"]
        return "\n".join(bodies + [f"void {name}(void **args, int64_t nthreads) {{", *sized,
                                    f"    if ({_footprint(k)} >= {llc_bytes()}) {name}_s(args, nthreads);",
                                    f"    else {name}_p(args, nthreads);", "}"])
    lines = [f"void {name}(void **args, int64_t nthreads) {{", *_pointers(k.args)]
    lines += sized + checks.err_pointer(k, sizes)
    rows = prod(k.outer)
    row_len = prod(k.inner)
    if rows == 0:  # no row to compute (and a size-0 dim must not reach a % 0)
        return "\n".join(lines + ["    (void)nthreads;", "}"])
    hoisted = _hoist(k, lines) if row_len else {}
    if any(isinstance(s, ir.Contract) for s in k.stages):  # a chain kernel: chain.py's renderer
        assert CHAIN_RENDERER is not None, "braze.codegen.chain registers the chain renderer when imported"
        return CHAIN_RENDERER(k, lines, hoisted)
    if _column_reduction(k):
        return _column_source(k, lines, hoisted)
    assert SCATTER_PREPASS is not None, "braze.codegen.scatter registers its renderer when imported"
    lines += SCATTER_PREPASS(k, hoisted)
    total = rows * max(row_len, 1)
    parallel = f"num_threads(nthreads) if(nthreads > 1 && {total} > 32768)"
    # Not when the last pass stashes values in the output: that wrote its lines into
    # the cache already, and streaming over them gains nothing (softmax: 1.40x slower).
    streamed = (_streams(k) if stream is None else stream and _may_stream(k)) and not _stashes(k, passes(k))
    if streamed:  # each thread fences its streamed stores before the region's barrier
        lines += [f"    #pragma omp parallel {parallel}", "    {", "    #pragma omp for schedule(static) nowait"]
    else:
        lines.append(f"    #pragma omp parallel for {parallel} schedule(static)")
    lines.append(f"    for (int64_t row = 0; row < {rows}; row++) {{")
    lines += _row_source(k, hoisted, "        ", streamed)
    lines.append("    }")
    if streamed:
        lines += ["    braze_sfence();", "    }"]
    lines.append("}")
    return "\n".join(lines)


def _row_source(k: ir.Kernel, hoisted: dict[ir.Expr, str], body_indent: str, streamed: bool) -> list[str]:
    """The body of one row of a kernel (``row`` in scope): its outer coordinates, the
    passes of its reductions, its row and element stores. Shared by the kernel's
    parallel loop and a quantized matmul's prologue (one row of x at a time)."""
    n_out, n_in = len(k.outer), len(k.inner)
    coords = [f"o{i}" for i in range(n_out)] + [f"i{i}" for i in range(n_in)]
    levels = passes(k)
    stash = _stashes(k, levels)
    lines = row_coords(k.outer, body_indent)

    def inner_loop(body: list[str], reduction: str = "") -> list[str]:
        if not k.inner:
            return [body_indent + "{"] + [body_indent + "    " + b for b in body] + [body_indent + "}"]
        out = []
        ind = body_indent
        for j, size in enumerate(k.inner):
            if j == n_in - 1:
                out.append(f"{ind}#pragma omp simd{reduction}")
            out.append(f"{ind}for (int64_t i{j} = 0; i{j} < {size}; i{j}++) {{")
            ind += "    "
        out += [ind + b for b in body]
        for j in range(n_in):
            ind = ind[:-4]
            out.append(f"{ind}}}")
        return out

    # gathers' row-constant index checks, once per row (their loops then vectorise)
    row_checked, hoisted = checks.hoisted_rows(k, Renderer(coords, prefix="g", n_outer=n_out, hoisted=hoisted), hoisted)
    lines += [body_indent + t for t in row_checked]
    rolled = _rolling(k, levels, coords, n_out, hoisted)
    if rolled:
        lines += [body_indent + t for t in rolled]
        lines.append(f"{body_indent}if (redo) {{")
    for p in levels:
        clauses = []
        args = [i for i in p if argfold.is_arg(k.stages[i])]
        for i in p:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            if i in args:  # lanes of (value, index), combined after the loop
                d = s.expr.dtype
                lines += [body_indent + t for t in argfold.c_declare(i, vtype(d), _const(argfold.identity(s.op, d), d))]
                continue
            decl = "" if rolled else f"{vtype(s.dtype)} "
            lines.append(f"{body_indent}{decl}acc{i} = {_reduce_init(s.op, s.dtype)};")
            if is_float_minmax(s):
                lines.append(f"{body_indent}{'' if rolled else 'int '}nan{i} = 0;")
                clauses.append(f" reduction(|:nan{i})")
            clauses.append(f" reduction({_OMP[s.op]}:acc{i})")
        scanned = scans(k, p)
        if scanned:  # a fold of scanned values: in a walk that scans (codegen/scan.py)
            assert SCAN_RENDERER is not None and not args
            lines += [body_indent + t for t in SCAN_RENDERER(
                k, coords, n_out, hoisted, scanned, lambda r: (_fold(k, p, r, "acc{}", "nan{}"), "".join(clauses)))]
            lines += [f"{body_indent}if (nan{i}) acc{i} = NAN;" for i in p if is_float_minmax(k.stages[i])]  # type: ignore[arg-type]
            continue
        fold = Renderer(coords, n_outer=n_out, hoisted=hoisted)
        body = _fold(k, p, fold, "acc{}", "nan{}")
        if p is levels[-1]:
            body += [f"a{st.arg}[{fold.index(st.index)}] = {fold.memo[e]};" for e, st in stash.items()]
        if args:
            assert len(k.inner) == 1  # (an arg fold folds one dim)
            lines += argfold.c_loop(k.inner[0], coords[-1], "".join(clauses), body, body_indent)
            for i in args:
                a = k.stages[i]
                assert isinstance(a, ir.Reduce)
                lines += [body_indent + t for t in argfold.c_finish(a, i, vtype(a.expr.dtype))]
        else:
            lines += inner_loop(body, "".join(clauses))
        for i in p:
            if is_float_minmax(k.stages[i]):  # type: ignore[arg-type]
                lines.append(f"{body_indent}if (nan{i}) acc{i} = NAN;")
    if rolled:
        lines.append(f"{body_indent}}}")
    row = Renderer(coords, prefix="r", n_outer=n_out, hoisted=hoisted)
    row_stores = [row.store(s.arg, s.index, s.expr, k.args[s.arg][0]) for s in k.stages if isinstance(s, ir.StoreRow)]
    lines += [body_indent + t for t in row.take() + row_stores]
    elem = Renderer(coords, n_outer=n_out, hoisted=hoisted)
    for e, st in stash.items():  # read back what the last pass left in the output
        elem.expr(ir.Load(st.arg, st.index, k.args[st.arg][0]))
        elem.memo[e] = elem.memo.pop(ir.Load(st.arg, st.index, k.args[st.arg][0]))
    if streamed:
        return lines + _streamed_loop(k, coords, elem, body_indent)
    if any(isinstance(s, ir.Scan) for s in k.stages):  # a prefix fold: codegen/scan.py
        assert SCAN_RENDERER is not None, "braze.codegen.scan registers the scan renderer when imported"

        def stored(r: Renderer) -> tuple[list[str], str]:
            st = [r.store(s.arg, s.index, s.expr, k.args[s.arg][0]) for s in k.stages if isinstance(s, ir.Store)]
            return r.take() + st, ""
        every = [j for j, s in enumerate(k.stages) if isinstance(s, ir.Scan)]
        return lines + [body_indent + t for t in SCAN_RENDERER(k, coords, n_out, elem.hoisted, every, stored)]
    stores = [elem.store(s.arg, s.index, s.expr, k.args[s.arg][0], s.at) for s in k.stages if isinstance(s, ir.Store)]
    if stores:
        lines += inner_loop(elem.take() + stores)
    return lines


def row_coords(outer: tuple[int, ...], indent: str) -> list[str]:
    """The outer coordinates ``o{i}`` of row ``row``."""
    lines = []
    rest = "row"
    for i in range(len(outer) - 1, -1, -1):
        lines.append(f"{indent}const int64_t o{i} = {rest} % {outer[i]};")
        if i:
            lines.append(f"{indent}const int64_t q{i} = {rest} / {outer[i]};")
            rest = f"q{i}"
    return lines


def _pointers(args: list[tuple[DType, bool]] | tuple[tuple[DType, bool], ...], first: int = 0,
              at: int | None = None) -> list[str]:
    """The typed pointer of each argument, named from ``a{first}``, read from
    ``args[at]`` on (``at`` defaults to ``first``)."""
    lines = []
    for i, (d, written) in enumerate(args):
        const = "" if written else "const "
        lines.append(f"    {const}{CTYPE[d.name]} *restrict a{first + i} = "
                     f"({const}{CTYPE[d.name]} *)args[{(first if at is None else at) + i}];")
    return lines


def _prologue_source(k: ir.QLinear, name: str) -> str:
    """``{name}_pro``, the group computing x (``quant.h``'s ``braze_qpro_fn``): its
    kernel body for row ``row`` alone, argument 0 being the row of x it fills."""
    p = k.prologue
    assert p is not None
    first = 1 + k.weights + _epilogue_args(k)  # its argument 1 in the matmul's list
    lines = [f"static void {name}_pro(void **args, int64_t row, float *restrict xr) {{",
             "    float *restrict a0 = xr;", *_pointers(p.args[1:], 1, first)]
    hoisted = _hoist(p, lines)
    return "\n".join(lines + _row_source(p, hoisted, "    ", False) + ["}"]) + "\n"


def _epilogue_args(k: ir.QLinear) -> int:
    """How many of a quantized matmul's ``args`` are its epilogue's (its prologue's follow)."""
    return len(k.args) - (len(k.prologue.args) - 1 if k.prologue else 0)


def _epilogue_source(k: ir.QLinear, name: str) -> str:
    """``{name}_ep``, what a quantized matmul stores (``quant.h``'s ``braze_qep_fn``):
    the epilogue's stores for every (r, j) of the block it is given, weight i's sum
    read from ``acc[i]`` as ``c{i}``."""
    first = 1 + k.weights
    lines = [f"static void {name}_ep(void **args, int64_t r0, int64_t nr, int64_t j0, int64_t nj, "
             "float *const *acc, int64_t ldc) {", *_pointers(k.args[:_epilogue_args(k)], first)]
    r = Renderer(["r", "j"], acc="c{}", n_outer=1)
    stores = [r.store(s.arg, s.index, s.expr, k.args[s.arg - first][0]) for s in k.epilogue]
    sums = [f"const float c{i} = acc[{i}][(r - r0) * ldc + (j - j0)];" for i in range(k.weights)]
    lines += ["    for (int64_t r = r0; r < r0 + nr; r++) {", "        #pragma omp simd",
              "        for (int64_t j = j0; j < j0 + nj; j++) {", *("            " + t for t in sums + r.take() + stores),
              "        }", "    }", "}"]
    return "\n".join(lines) + "\n"


def _streamed_loop(k: ir.Kernel, coords: list[str], elem: Renderer, ind: str) -> list[str]:
    """The element loops of a kernel whose stores stream (``_streams``): the innermost
    loop runs in blocks of ``STREAM_BLOCK``, each computing its values into a stack
    buffer per store (a vectorised loop, as ever), which ``braze_stream`` then copies
    out with non-temporal stores."""
    n_out, n_in = len(k.outer), len(k.inner)
    stores = [s for s in k.stages if isinstance(s, ir.Store)]
    values = [elem.stored(s.expr, k.args[s.arg][0]) for s in stores]
    temps = elem.take()
    out = []
    for j, size in enumerate(k.inner[:-1]):
        out.append(f"{ind}for (int64_t i{j} = 0; i{j} < {size}; i{j}++) {{")
        ind += "    "
    last, size = f"i{n_in - 1}", k.inner[-1]
    # a generic kernel's row may be any length: its blocks are always full-sized buffers
    block = STREAM_BLOCK if isinstance(size, ir.Size) else min(STREAM_BLOCK, size)
    at = Renderer(coords[:-1] + [f"b{n_in - 1}"], n_outer=n_out)  # a store's index at the block's start
    out.append(f"{ind}for (int64_t b{n_in - 1} = 0; b{n_in - 1} < {size}; b{n_in - 1} += {block}) {{")
    ind += "    "
    out.append(f"{ind}const int64_t e{n_in - 1} = b{n_in - 1} + {block} < {size} ? b{n_in - 1} + {block} : {size};")
    out += [f"{ind}{CTYPE[k.args[s.arg][0].name]} sb{n}[{block}];" for n, s in enumerate(stores)]
    out.append(f"{ind}#pragma omp simd")
    out.append(f"{ind}for (int64_t {last} = b{n_in - 1}; {last} < e{n_in - 1}; {last}++) {{")
    out += [f"{ind}    {t}" for t in temps]
    out += [f"{ind}    sb{n}[{last} - b{n_in - 1}] = {v};" for n, v in enumerate(values)]
    out.append(f"{ind}}}")
    out += [f"{ind}braze_stream(&a{s.arg}[{at.index(s.index)}], sb{n}, (e{n_in - 1} - b{n_in - 1}) * "
            f"(int64_t)sizeof(sb{n}[0]));" for n, s in enumerate(stores)]
    for _ in range(n_in):
        ind = ind[:-4]
        out.append(f"{ind}}}")
    return out


def module_source(kernel_sources: list[str]) -> str:
    """One C translation unit holding the given kernels' sources."""
    return "\n".join([header("cmath.h"), header("tile.h"), PRELUDE, checks.PRELUDE, qlib.declarations(kernel_sources)]
                     + kernel_sources) + "\n"

