"""C expressions: dtypes' C types, op rules, the prelude, and the expression renderer.

``UNARY``/``BINARY`` map an op name to a C template per kind of dtype; ``Renderer``
renders an expression tree through them inside one loop body (the walk is
``loops.ExprRenderer``'s, which the Triton renderer takes too). Half types are loaded into
float, and every half result is rounded back to its type, so a fused chain computes
what the reference computes node by node. Transcendental float32 functions are braze's
own (``cmath.h``): vectorisable, exact on inf and nan. float64 uses libm. Shared by
every C renderer (``c.py``'s kernels, ``chain.py``, ``scan.py``, ``scatter.py``,
``topk.py``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping

from .. import dtypes as dt
from .. import ir
from ..dtypes import DType
from . import checks
from .loops import COMPARISONS, ExprRenderer, OpRule


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


def select(d: DType, cond: str, a: str, b: str) -> str:
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
    "relu": lambda d: select(d, "{a} < 0", "0", "{a}"),
    "gelu": lambda d: _f(d, "(0.5f * {a} * (1.0f + braze_erff({a} * 0.70710678118654752f)))",
                         "(0.5 * {a} * (1.0 + erf({a} * 0.70710678118654752)))"),
    "gelu_tanh": lambda d: _f(d, "(0.5f * {a} * (1.0f + braze_tanhf(0.79788456080286536f * ({a} + 0.044715f * {a} * {a} * {a}))))",
                              "(0.5 * {a} * (1.0 + tanh(0.79788456080286536 * ({a} + 0.044715 * {a} * {a} * {a}))))"),
    "silu": lambda d: _f(d, "({a} * braze_sigmoidf({a}))", "({a} / (1.0 + exp(-{a})))"),
    "floor": lambda d: _f(d, "floorf({a})", "floor({a})") if d.is_floating_point else "{a}",
    "ceil": lambda d: _f(d, "ceilf({a})", "ceil({a})") if d.is_floating_point else "{a}",
    "round": lambda d: _f(d, "rintf({a})", "rint({a})") if d.is_floating_point else "{a}",
    "sign": lambda d: (select(d, "{a} != {a}", "{a}", "(({a} > 0) - ({a} < 0))") if d.is_floating_point
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
    "maximum": lambda d: select(d, "({a} != {a}) || {a} > {b}", "{a}", "{b}"),
    "minimum": lambda d: select(d, "({a} != {a}) || {a} < {b}", "{a}", "{b}"),
    **COMPARISONS,
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
/* Every line of rows (ld bytes apart, bytes long) asked for, into L2, before they are read */
static inline void braze_pf_rows(const void *p, int64_t ld, int64_t rows, int64_t bytes) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch((const char *)p + r * ld + b, 0, 2);
}
/* rows of float16 or bfloat16 (ld elements apart) to contiguous float rows: half-type
 * keys and values of a chain kernel, block by block. F16C's conversion where there is
 * one (by gcc's builtin: immintrin.h would add ~0.15 s to every compile), else the bits. */
static inline void braze_h2f_rows(const uint16_t *src, int64_t ld, int64_t rows, int64_t n, float *dst) {
    for (int64_t r = 0; r < rows; r++, src += ld, dst += n) {
        int64_t i = 0;
#if defined(__F16C__)
        typedef short h8 __attribute__((vector_size(16)));
        typedef float f8 __attribute__((vector_size(32)));
        for (; i + 8 <= n; i += 8) {
            h8 v; __builtin_memcpy(&v, src + i, 16);
            const f8 f = __builtin_ia32_vcvtph2ps256(v); __builtin_memcpy(dst + i, &f, 32);
        }
#endif
        for (; i < n; i++) dst[i] = braze_h2f(src[i]);
    }
}
static inline void braze_b2f_rows(const uint16_t *src, int64_t ld, int64_t rows, int64_t n, float *dst) {
    for (int64_t r = 0; r < rows; r++, src += ld, dst += n)
        for (int64_t i = 0; i < n; i++) { const uint32_t u = (uint32_t)src[i] << 16; __builtin_memcpy(dst + i, &u, 4); }
}
/* braze_mm_nt and braze_mm (accumulating) over keys or values of a half type read
 * where they lie, for a chain kernel's narrow tasks (decoding): BRAZE_HROWS rows at a
 * time converted into a buffer that stays in L1 and multiplied from there. A whole
 * tile converted first (96 rows of keys and of values, 48 KiB at d = 64) outgrew L1:
 * its rows were written to L2 and read back. */
#define BRAZE_HROWS 16
#define BRAZE_HALF_MM(T)                                                                                     \
static inline void braze_mm_nt_##T(int64_t m, int64_t n, int64_t k, const float *restrict A, int64_t lda,    \
        const uint16_t *Bt, int64_t ldbt, float *restrict C, int64_t ldc) {                                 \
    float buf[BRAZE_HROWS * k];                                                                              \
    for (int64_t j = 0; j < n; j += BRAZE_HROWS) {                                                           \
        const int64_t nj = n - j < BRAZE_HROWS ? n - j : BRAZE_HROWS;                                        \
        braze_##T##2f_rows(Bt + j * ldbt, ldbt, nj, k, buf);                                                 \
        braze_mm_nt(m, nj, k, A, lda, buf, k, C + j, ldc);                                                   \
    }                                                                                                        \
}                                                                                                            \
static inline void braze_mm_##T(int64_t m, int64_t n, int64_t k, const float *restrict A, int64_t lda,       \
        const uint16_t *B, int64_t ldb, float *restrict C, int64_t ldc) {                                    \
    float buf[BRAZE_HROWS * n];                                                                              \
    for (int64_t p = 0; p < k; p += BRAZE_HROWS) {                                                           \
        const int64_t np = k - p < BRAZE_HROWS ? k - p : BRAZE_HROWS;                                        \
        braze_##T##2f_rows(B + p * ldb, ldb, np, n, buf);                                                    \
        braze_mm(m, n, np, A + p, lda, buf, n, C, ldc, 1);                                                   \
    }                                                                                                        \
}
BRAZE_HALF_MM(h)
BRAZE_HALF_MM(b)
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


def literal(value: Any, d: DType) -> str:
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


def _cast(r: Renderer, e: ir.Op, args: list[str], src: DType) -> str:
    if e.dtype is dt.bool_:
        return f"({args[0]} != 0)"
    return _float_to_int(args[0], src, e.dtype) if src.is_floating_point and e.dtype.is_integer else args[0]


def _fast_exp(r: Renderer, e: ir.Op, args: list[str], src: DType) -> str | None:
    """float32 ``exp`` in a loop that folds its ``braze__exp_k`` (``Renderer.fast``)."""
    if r.fast is None or src is not dt.float32:
        return None
    r.fast.append(args[0])
    return f"braze__exp_normal({args[0]})"


def _div(r: Renderer, e: ir.Op, args: list[str], src: DType) -> str | None:
    """Division by a value constant along the row (a scalar, a row's sum) is a
    multiplication by its reciprocal, computed once per row: one rounding more (<= 1.5
    ulp from the reference's x / c), as Inductor does for constant divisors, and a
    vdivps per element less."""
    if not src.is_floating_point or ir.uses_inner(e.args[1], r.n_outer):
        return None
    one = "1.0" if src is dt.float64 else "1.0f"
    return f"({args[0]} * ({one} / {args[1]}))"


class Renderer(ExprRenderer):
    """Renders expressions inside one loop body, each distinct subexpression one
    ``const`` temporary (``loops.ExprRenderer``: the walk; here the C of its leaves and
    ops)."""

    OPS: ClassVar[Mapping[str, OpRule]] = {
        "where": lambda r, e, args, src: select(e.dtype, args[0], args[1], args[2]),
        "cast": _cast,
        "exp": _fast_exp,
        "div": _div,
    }
    UNARY = UNARY
    BINARY = BINARY

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

    def load(self, e: ir.Load) -> str:
        index = " + ".join([self.index(e.index)] + [f"{self.expr(i)} * {s}" for i, s in e.at])
        raw = f"a{e.arg}[{index}]"
        if e.when:  # read only inside the range (outside, the index may point anywhere)
            cond = " && ".join(f"{self.coords[c]} >= {lo} && {self.coords[c]} < {hi}" for c, lo, hi in e.when)
            raw = f"(({cond}) ? {raw} : 0)"
        if e.dtype is dt.float16:
            return f"braze_h2f({raw})"
        if e.dtype is dt.bfloat16:
            return f"braze_b2f({raw})"
        return f"(({vtype(e.dtype)}){raw})"

    def const(self, e: ir.Const) -> str:
        return f"(({vtype(e.dtype)}){literal(e.value, e.dtype)})"

    def coord(self, e: ir.Coord) -> str:
        return f"(({vtype(e.dtype)}){self.coords[e.dim]})"

    def named(self, e: ir.Expr) -> str | None:
        if isinstance(e, ir.Var):  # a value the caller names (a repair term's)
            return e.name
        return self.hoisted.get(e)

    def unrendered(self, e: ir.Expr) -> Exception:
        if isinstance(e, ir.Op):
            return KeyError(e.name)
        # a Dot is rendered by the chain kernel, which names its tile value
        return AssertionError(f"no C for {type(e).__name__} outside a chain kernel")

    def declare(self, name: str, text: str, e: ir.Expr) -> str:
        return f"const {vtype(e.dtype)} {name} = {text};"

    def checked(self, e: ir.Op, args: list[str]) -> str:
        return self.typed(checks.render(e, args), e.dtype)

    def typed(self, text: str, d: DType) -> str:
        return _round(f"(({vtype(d)}){text})", d)

    def stored(self, e: ir.Expr, d: DType) -> str:
        """The value of ``e`` as stored into a buffer of dtype ``d``."""
        return converted(self.expr(e), e.dtype, d)

    def store(self, arg: int, a: ir.Affine, e: ir.Expr, d: DType, at: tuple[tuple[ir.Expr, int], ...] = ()) -> str:
        index = " + ".join([self.index(a)] + [f"{self.expr(i)} * {s}" for i, s in at])  # a scatter's rows
        return f"a{arg}[{index}] = {self.stored(e, d)};"
