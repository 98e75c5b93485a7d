"""Repair terms: fuse a reduction with an earlier reduction it depends on (Neptune).

Softmax's denominator ``l = sum_j exp(x_j - m)`` needs ``m = max_j x_j`` first, so done
naively it takes two passes over the row. Neptune (Zhao et al., "reduction fusion with
repair terms") computes both in one pass: the target accumulator ``t`` is folded with
the *running* value ``r`` of the producer, and whenever the producer moves from ``r``
to ``r'`` the partial ``t`` is repaired by a term ``h(t, r, r')`` satisfying
``h(g(r, c), r, r') = g(r', c)`` for the element function ``g`` (here
``h = t * exp(m - m')``, the online-softmax rescale). That is only sound if ``h``
also distributes over the reducer (``h(a + b) = h(a) + h(b)`` for sum, ``h`` monotone
for max/min), so that repairing a partial sum repairs each of its terms; every
candidate is proven symbolically with sympy before it is returned.

Two derivations: *separation* (``g = a(r) * b(c)`` gives ``h = t * a(r') / a(r)``; it
handles any number of constants, e.g. attention's ``exp(s - m) * v``) and *inversion*
(Neptune Theorem 4.3: solve ``t = g(r, c)`` for ``c``, uniquely, and substitute into
``g(r', c)``; e.g. ``h = t + m - m'`` for ``max(x - m)``). A ``g`` without the
producers needs no repair (``h = t``). Anything else is refused with a reason string,
which the scheduler prints under ``BRAZE_DEBUG=1``.

Domain. ``h`` is an identity of real expressions wherever ``g`` is defined. With the
fused loop ``g`` is evaluated at running producer values the unfused program never
used, so: ``h`` may divide only by quantities that ``g`` itself divides by or that are
provably nonzero (``sum(x * r)`` would give ``t * r'/r`` with ``r`` = 0 at the start of a
running sum: refused), and ``g`` may not apply log/sqrt/fractional powers to producers.
Dividing by a producer (``/ l``) is accepted; the scheduler must only fuse such a ``g``
when the running value cannot be 0 (a running sum of exps, after its first element).
A running max starts at -inf: while it is still -inf (a masked prefix), ``exp(s - m')`` is
``exp(-inf + inf)`` = nan in ``g`` and in ``h``; the kernel must evaluate both with a
finite stand-in for a -inf running max (``where(m == -inf, 0, m)``), as flash attention does.

sympy costs ~0.4 s to import, so it is imported inside the functions that use it.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .. import dtypes as dt
from .. import ir

if TYPE_CHECKING:
    import sympy

REDUCERS = ("sum", "amax", "amin", "prod")


class _Refuse(Exception):
    """A derivation step that cannot go on; the message is the reason."""


@dataclass(frozen=True)
class Repair:
    """``h`` in terms of ``t``, the old producer values ``r`` and the new ones ``r_new``."""

    h: sympy.Expr
    t: sympy.Symbol
    r: tuple[sympy.Symbol, ...]
    r_new: tuple[sympy.Symbol, ...]
    method: str  # "inversion" | "separation" | "identity"

    def apply(self, t: ir.Expr, old: Sequence[ir.Expr], new: Sequence[ir.Expr]) -> ir.Expr:
        """The IR of ``h`` with ``t``, ``old`` and ``new`` substituted, in ``t``'s
        float dtype (float32 unless the accumulator is float64)."""
        env: dict[Any, ir.Expr] = {self.t: t, **dict(zip(self.r, old)), **dict(zip(self.r_new, new))}
        return _emit(self.h, env, t.dtype if t.dtype in (dt.float32, dt.float64) else dt.float32)


def derive(g: sympy.Expr, r: Sequence[sympy.Symbol], reducer: str) -> Repair | str:
    """Derive and prove a repair for ``reduce_j g(r, c_j)``; a string says why not.
    Memoised on ``(g, r, reducer)`` (sympy expressions hash structurally)."""
    return _derive(g, tuple(r), reducer)


def cache_info() -> Any:
    """``functools.lru_cache`` statistics of ``derive`` (misses = derivations run)."""
    return _derive.cache_info()


@functools.lru_cache(maxsize=512)
def _derive(g: sympy.Expr, r: tuple[sympy.Symbol, ...], reducer: str) -> Repair | str:
    import sympy

    if reducer not in REDUCERS:
        return f"no repair terms for reducer {reducer}"
    t = sympy.Dummy("T", real=True)
    r_new = tuple(sympy.Dummy(f"{s.name}'", **s.assumptions0) for s in r)
    if not g.free_symbols & set(r):
        return Repair(t, t, r, r_new, "identity")
    for node in sympy.preorder_traversal(g):
        partial = isinstance(node, sympy.log) or (isinstance(node, sympy.Pow) and not node.exp.is_integer)
        if partial and node.args[0].free_symbols & set(r):
            return f"g applies {node.func.__name__} to {node.args[0]}, whose running value may leave its domain"
    reasons = []
    for method, find in (("separation", _separate), ("inversion", _invert)):
        try:
            h = find(g, r, r_new, t)
            _prove(h, g, r, r_new, t, reducer)
            return Repair(h, t, r, r_new, method)
        except _Refuse as e:
            reasons.append(f"{method}: {e}")
    return f"no single-term repair for {reducer}: " + "; ".join(reasons)


def _separate(g: sympy.Expr, r: tuple[sympy.Symbol, ...], r_new: tuple[sympy.Symbol, ...],
              t: sympy.Symbol) -> sympy.Expr:
    """``g = a(r) * b(c)`` (``exp(c - r)`` split as ``exp(c) * exp(-r)``): ``h = t * a(r')/a(r)``."""
    import sympy

    a = sympy.Integer(1)
    for f in sympy.Mul.make_args(sympy.separatevars(sympy.expand_power_exp(g))):
        if f.free_symbols & set(r):
            if f.free_symbols - set(r):
                raise _Refuse(f"g is not a product a(r) * b(c): factor {f} mixes both")
            a = a * f
    return _simplify(t * a.subs(dict(zip(r, r_new)), simultaneous=True) / a)


def _invert(g: sympy.Expr, r: tuple[sympy.Symbol, ...], r_new: tuple[sympy.Symbol, ...],
            t: sympy.Symbol) -> sympy.Expr:
    """Solve ``t = g(r, c)`` for one constant ``c`` (uniquely, or all solutions giving the
    same ``h``) and return ``g(r', c_solved)``; with several constants, the first ``c`` whose
    ``h`` no longer mentions any constant."""
    import sympy

    consts = sorted(g.free_symbols - set(r) - {t}, key=str)
    if not consts:
        raise _Refuse("g has no constant argument")
    why = ""
    for c in consts:
        try:
            sols = sympy.solve(sympy.Eq(t, g), c)
        except NotImplementedError:
            why = f"sympy cannot solve t = g for {c}"
            continue
        hs = {_simplify(g.subs({**dict(zip(r, r_new)), c: s}, simultaneous=True)) for s in sols}
        if len(hs) != 1:
            why = f"g is not invertible in its constant argument: {len(sols)} solutions"
            continue
        h = hs.pop()
        if not h.free_symbols & set(consts):
            return h
        why = f"solving for {c} leaves h depending on the other constants"
    raise _Refuse(why)


def _prove(h: sympy.Expr, g: sympy.Expr, r: tuple[sympy.Symbol, ...], r_new: tuple[sympy.Symbol, ...],
           t: sympy.Symbol, reducer: str) -> None:
    """Raise unless ``h`` is a correct, distributive, emittable repair of ``g``."""
    import sympy

    if h.free_symbols - {t, *r, *r_new}:
        raise _Refuse(f"h = {h} depends on the constants")
    g_new = g.subs(dict(zip(r, r_new)), simultaneous=True)
    if _simplify(h.subs(t, g) - g_new) != 0:
        raise _Refuse(f"h = {h} does not map g(r, c) to g(r', c)")
    a, b = sympy.Dummy("a", real=True), sympy.Dummy("b", real=True)
    if reducer in ("sum", "prod"):
        op = sympy.Add if reducer == "sum" else sympy.Mul
        gap = _simplify(h.subs(t, op(a, b)) - op(h.subs(t, a), h.subs(t, b)))
        if gap != 0:
            sym = "+" if reducer == "sum" else "*"
            raise _Refuse(f"h does not distribute over {reducer}: h(a{sym}b) - (h(a){sym}h(b)) = {gap}")
    else:  # a positive-slope affine map commutes with max and min
        slope = _simplify(sympy.diff(h, t))
        if t in slope.free_symbols:
            raise _Refuse(f"h does not commute with {reducer[1:]}: h = {h} is not affine in t")
        if not slope.is_positive:
            raise _Refuse(f"h does not commute with {reducer[1:]}: its slope {slope} is not provably positive")
    allowed = {_base(f) for x in (g, g_new) for f in sympy.Mul.make_args(sympy.denom(sympy.together(x)))}
    for f in sympy.Mul.make_args(sympy.denom(sympy.together(h))):
        if not f.is_nonzero and _base(f) not in allowed:
            raise _Refuse(f"h = {h} divides by {f}, which may be 0 where g is defined")
    _emit(h, {s: ir.Const(0.0, dt.float32) for s in (t, *r, *r_new)}, dt.float32)


def _simplify(e: sympy.Expr) -> sympy.Expr:
    """``simplify``, then gather exponentials (``exp(m) * exp(-m')`` -> ``exp(m - m')``)."""
    import sympy

    return sympy.powsimp(sympy.simplify(e))


def _base(f: sympy.Expr) -> sympy.Expr:
    return f.as_base_exp()[0]


# -- IR <-> sympy -----------------------------------------------------------------------

def derive_ir(reduce_expr: ir.Expr, producers: Sequence[int], reducer: str) -> Repair | str:
    """``derive`` for the element expression of an ``ir.Reduce`` stage reading the results
    of the earlier Reduce stages ``producers`` (as ``ir.Acc``). ``Repair.r[i]`` stands for
    ``producers[i]``. Every maximal subtree without a producer is an opaque real constant
    (equal subtrees share one symbol); a finite ``Const`` stays a number."""
    r = {p: _symbol(f"acc{p}") for p in producers}
    try:
        g = _to_sympy(reduce_expr, r, {})
    except _Refuse as e:
        return str(e)
    return derive(g, tuple(r.values()), reducer)


def _symbol(name: str) -> sympy.Symbol:
    import sympy

    return sympy.Symbol(name, real=True)


_SYMPY_OPS: dict[str, Any] = {
    "add": lambda s, a, b: a + b, "sub": lambda s, a, b: a - b, "mul": lambda s, a, b: a * b,
    "div": lambda s, a, b: a / b, "neg": lambda s, a: -a, "exp": lambda s, a: s.exp(a),
    "log": lambda s, a: s.log(a), "sqrt": lambda s, a: s.sqrt(a), "rsqrt": lambda s, a: 1 / s.sqrt(a),
    "reciprocal": lambda s, a: 1 / a, "maximum": lambda s, a, b: s.Max(a, b),
    "minimum": lambda s, a, b: s.Min(a, b), "pow": lambda s, a, b: a ** b,
}


def _to_sympy(e: ir.Expr, r: dict[int, sympy.Symbol], consts: dict[Any, sympy.Symbol]) -> sympy.Expr:
    import sympy

    if not any(isinstance(n, ir.Acc) and n.stage in r for n in ir.walk(e)):
        if isinstance(e, ir.Const) and isinstance(e.value, numbers.Real) and math.isfinite(e.value):
            v = float(e.value)
            return sympy.Integer(int(v)) if v.is_integer() else sympy.Rational(v)
        try:
            key: Any = (e, hash(e))
        except TypeError:
            key = repr(e)
        return consts.setdefault(key, _symbol(f"c{len(consts)}"))
    if isinstance(e, ir.Acc):
        return r[e.stage]
    assert isinstance(e, ir.Op)  # Load, Const and Coord never contain a producer
    if e.name == "cast":
        if e.dtype in (dt.float32, dt.float64) and e.args[0].dtype.is_floating_point:
            return _to_sympy(e.args[0], r, consts)
        raise _Refuse(f"cast to {e.dtype.name} of a producer value")
    if e.name not in _SYMPY_OPS:
        raise _Refuse(f"op {e.name} applied to a producer value has no repair")
    return _SYMPY_OPS[e.name](sympy, *(_to_sympy(a, r, consts) for a in e.args))


def _emit(e: sympy.Expr, env: dict[Any, ir.Expr], d: dt.DType) -> ir.Expr:
    """The IR of ``e``: Add as add/sub, Mul as products over a product of denominators,
    powers as sqrt/rsqrt/reciprocal/repeated mul/pow; exp, log, Max, Min."""
    import sympy

    def op(name: str, *args: ir.Expr) -> ir.Expr:
        return ir.Op(name, args, d)

    def chain(name: str, xs: list[ir.Expr]) -> ir.Expr:
        return functools.reduce(lambda a, b: op(name, a, b), xs)

    if e in env:
        return env[e]
    if e.is_Number:
        return ir.Const(float(e), d)
    if isinstance(e, (sympy.exp, sympy.log)):
        return op(e.func.__name__, _emit(e.args[0], env, d))
    if isinstance(e, (sympy.Max, sympy.Min)):
        return chain("maximum" if isinstance(e, sympy.Max) else "minimum", [_emit(a, env, d) for a in e.args])
    if e.is_Add:
        terms = sorted(e.args, key=lambda a: a.could_extract_minus_sign())  # a positive term first
        out = _emit(terms[0], env, d)
        for a in terms[1:]:
            neg = a.could_extract_minus_sign()
            out = op("sub" if neg else "add", out, _emit(-a if neg else a, env, d))
        return out
    if e.is_Mul:
        if e.could_extract_minus_sign():
            return op("neg", _emit(-e, env, d))
        num = [f for f in sympy.Mul.make_args(e) if not (f.is_Pow and f.exp.is_negative)]
        den = [1 / f for f in sympy.Mul.make_args(e) if f.is_Pow and f.exp.is_negative]
        top = chain("mul", [_emit(f, env, d) for f in num]) if num else ir.Const(1.0, d)
        return op("div", top, chain("mul", [_emit(f, env, d) for f in den])) if den else top
    if e.is_Pow:
        base, n = e.args
        b = _emit(base, env, d)
        if n == sympy.Rational(1, 2) or n == -sympy.Rational(1, 2):
            return op("sqrt" if n > 0 else "rsqrt", b)
        if n == -1:
            return op("reciprocal", b)
        if n.is_Integer and 1 < n <= 4:
            return chain("mul", [b] * int(n))
        return op("pow", b, ir.Const(float(n), d)) if n.is_Number else op("pow", b, _emit(n, env, d))
    raise _Refuse(f"braze cannot emit {e.func.__name__} in h = {e}")
