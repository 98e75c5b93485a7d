"""Which key tiles of a chain kernel's mask are all masked, or not masked at all, found
per block of query rows before the key loop (``triton_chain.py``).

A chain's scores are often ``where(filled, fill, kept)`` (``codegen/chain_rules.skip_rule``)
with ``filled`` built from the loop coordinates: causal attention (``j > i + offset``),
a sliding window (``j > i | i - j >= w``), decoding's ``j >= length``. When ``filled``
is an OR of comparisons each linear in the key coordinate ``j`` (``c * j + R cmp 0``,
``R`` integer and constant along the row: a row coordinate, a scalar argument), each
comparison is, over the program's rows, all-true past one key and all-false before
another (or the reverse); so the keys where every row is filled form two half-lines,
and those where no row is form an interval. From them a program reads its key loop's
bounds (tiles wholly filled are not visited, when the fill adds nothing to any fold:
``fill_is_identity``) and the run of tiles it can compute without evaluating the mask
at all, as FlashAttention's causal kernels do by hand. Everything else (a mask read
from memory, an AND of comparisons) is not a band: every tile is visited and masked.

The bounds are emitted as Triton statements over scalars: ``R``'s least and greatest
value over the rows come from ``tl.min``/``tl.max`` of its per-row vector, so a block
of rows that spans query heads (GQA) or is past the last row stays exact or
conservative, never wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Union

from .. import dtypes as dt
from .. import ir

#: an integer linear form in the key coordinate: (coefficient of j, constant, terms
#: constant along the row with their integer multipliers)
Linear = tuple[int, int, tuple[tuple[int, ir.Expr], ...]]


@dataclass(frozen=True)
class Atom:
    """``coef * j + const + sum(m * term) >= 0``, ``coef`` nonzero."""

    coef: int
    const: int
    terms: tuple[tuple[int, ir.Expr], ...]

    def negated(self) -> "Atom":
        """``x >= 0`` is false exactly where ``-x - 1 >= 0`` (integers)."""
        return Atom(-self.coef, -self.const - 1, tuple((-m, t) for m, t in self.terms))


def _is_int(d: dt.DType) -> bool:
    return d.is_integer and d is not dt.bool_


def linear(e: ir.Expr, j: int) -> Linear | None:
    """``e`` as an integer linear form in coordinate ``j`` (index ``n_outer``), or None."""
    if not _is_int(e.dtype):
        return None
    if isinstance(e, ir.Coord) and e.dim == j:
        return 1, 0, ()
    if isinstance(e, ir.Const):
        return 0, int(e.value), ()
    if isinstance(e, ir.Op):
        if e.name == "cast" and _is_int(e.args[0].dtype):
            return linear(e.args[0], j)
        if e.name in ("add", "sub"):
            a, b = linear(e.args[0], j), linear(e.args[1], j)
            if a is None or b is None:
                return None
            return _plus(a, _times(b, -1) if e.name == "sub" else b)
        if e.name == "neg":
            a = linear(e.args[0], j)
            return None if a is None else _times(a, -1)
        if e.name == "mul":
            x, y = e.args
            if isinstance(x, ir.Const):
                x, y = y, x
            if isinstance(y, ir.Const):
                a = linear(x, j)
                return None if a is None else _times(a, int(y.value))
    return (0, 0, ((1, e),)) if _row_constant(e, j) else None


def _plus(a: Linear, b: Linear) -> Linear:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def _times(a: Linear, m: int) -> Linear:
    return a[0] * m, a[1] * m, tuple((k * m, t) for k, t in a[2])


_CMP = ("lt", "le", "gt", "ge")


def _row_constant(e: ir.Expr, j: int) -> bool:
    return not ir.uses_inner(e, j) and not any(isinstance(n, (ir.Dot, ir.Acc, ir.Var)) for n in ir.walk(e))


def atoms(filled: ir.Expr, j: int, guards: list[ir.Expr], negate: bool = False) -> list[Atom] | None:
    """``filled`` (negated) as an OR of atoms, or None when it is not one. A mask made
    as numbers (``ones(n, n).triu(1) != 0``: ``where(c, 1, 0) != 0``) is ``c`` when the
    branch values compare as they must, which ``guards`` gets (bool expressions constant
    along the row, to hold in every row when the kernel runs)."""
    if isinstance(filled, ir.Const) and filled.dtype is dt.bool_:
        return [] if bool(filled.value) == negate else None
    if not isinstance(filled, ir.Op):
        return None
    name, args = filled.name, filled.args
    if name in ("logical_not", "cast") and args[0].dtype is not dt.bool_:  # a number's truth: x == 0, x != 0
        test = ir.Op("eq" if name == "logical_not" else "ne", (args[0], ir.Const(0, args[0].dtype)), dt.bool_)
        return atoms(test, j, guards, negate)
    if name == "logical_not":
        return atoms(args[0], j, guards, not negate)
    if name == "cast" and filled.dtype is dt.bool_:
        return atoms(args[0], j, guards, negate)
    if name in ("logical_or", "logical_and") and all(a.dtype is dt.bool_ for a in args):
        if (name == "logical_or") == negate:  # an AND of atoms (or a negated OR) is no band
            return None
        left, right = atoms(args[0], j, guards, negate), atoms(args[1], j, guards, negate)
        return None if left is None or right is None else left + right
    if name in ("eq", "ne") and args[0].dtype is dt.bool_:
        x, c = args
        if isinstance(x, ir.Const):
            x, c = c, x
        if not isinstance(c, ir.Const):
            return None
        flip = bool(c.value) != (name == "eq")  # x == False, x != True: not x
        return atoms(x, j, guards, negate != flip)
    if name in ("eq", "ne"):
        w, x = args
        if isinstance(x, ir.Op) and x.name == "where":
            w, x = x, w
        if not (isinstance(w, ir.Op) and w.name == "where") or not all(_row_constant(e, j) for e in (x, *w.args[1:])):
            return None
        # where(c, a, b) cmp x is c where (a cmp x) holds and (b cmp x) does not, not c
        # the other way round: which one, from the values when they are constants (an x
        # that is an argument guessed 0: ``mask != 0``), checked when the kernel runs
        c, a, b = w.args
        guess = x.value if isinstance(x, ir.Const) else 0
        yes = [(v.value == guess) == (name == "eq") if isinstance(v, ir.Const) else None for v in (a, b)]
        if yes[0] is not None and yes[0] == yes[1]:
            return None
        direct = yes[0] is not False and yes[1] is not True
        holds, fails = (a, b) if direct else (b, a)
        guards += [ir.Op(name, (holds, x), dt.bool_), ir.Op("logical_not", (ir.Op(name, (fails, x), dt.bool_),), dt.bool_)]
        return atoms(c, j, guards, negate if direct else not negate)
    if name in _CMP:
        la, lb = linear(args[0], j), linear(args[1], j)
        if la is None or lb is None:
            return None
        coef, const, terms = _plus(la, _times(lb, -1))  # a - b
        if coef == 0:
            return None
        atom = {"ge": Atom(coef, const, terms), "gt": Atom(coef, const - 1, terms),
                "le": Atom(-coef, -const, tuple((-m, t) for m, t in terms)),
                "lt": Atom(-coef, -const - 1, tuple((-m, t) for m, t in terms))}[name]
        return [atom.negated() if negate else atom]
    return None


def band_lines(ats: list[Atom], row_value: Callable[[ir.Expr], str], n: int, ind: str) -> list[str]:
    """Statements defining ``band_jl``, ``band_jh`` (keys outside ``[jl, jh)`` are filled
    in every row) and ``band_nl``, ``band_nh`` (keys inside ``[nl, nh)`` are filled in
    none), clamped to ``[0, n]``. ``row_value(e)`` is the spelling of a term as a vector
    over the block's rows (or a scalar)."""
    out: list[str] = []
    inc_t, inc_f, dec_t, dec_f = [], [], [], []
    for k, a in enumerate(ats):
        rest = " + ".join([str(a.const)] + [f"({row_value(t)}).to(tl.int64) * {m}" for m, t in a.terms])
        out += [f"{ind}band_r{k} = ({rest}) + tl.zeros([BM], tl.int64)",
                f"{ind}band_rlo{k} = tl.min(band_r{k}, axis=0)", f"{ind}band_rhi{k} = tl.max(band_r{k}, axis=0)"]
        c = abs(a.coef)
        if a.coef > 0:  # c j + R >= 0 from j >= ceil(-R / c): true past T (least R), false before F
            out += [f"{ind}band_t{k} = {_ceil_div(f'-band_rlo{k}', c)}", f"{ind}band_f{k} = {_ceil_div(f'-band_rhi{k}', c)}"]
            inc_t.append(f"band_t{k}")
            inc_f.append(f"band_f{k}")
        else:  # true up to floor(R / c): true before T, false from F
            out += [f"{ind}band_t{k} = {_floor_div(f'band_rlo{k}', c)} + 1",
                    f"{ind}band_f{k} = {_floor_div(f'band_rhi{k}', c)} + 1"]
            dec_t.append(f"band_t{k}")
            dec_f.append(f"band_f{k}")

    def fold(fn: str, xs: list[str], default: str) -> str:
        text = default
        for x in xs:
            text = x if text == default else f"tl.{fn}({text}, {x})"
        return text if text != default else f"tl.full([], {default}, tl.int64)"

    for name, fn, xs, default in (("jl", "maximum", dec_t, "0"), ("jh", "minimum", inc_t, str(n)),
                                  ("nl", "maximum", dec_f, "0"), ("nh", "minimum", inc_f, str(n))):
        out.append(f"{ind}band_{name} = tl.minimum(tl.maximum({fold(fn, xs, default)}, 0), {n})")
    return out


def _floor_div(a: str, c: int) -> str:
    return a if c == 1 else f"_braze_fdiv({a}, {c})"


def _ceil_div(a: str, c: int) -> str:
    return a if c == 1 else f"(-_braze_fdiv(-({a}), {c}))"


FDIV = '''

@triton.jit
def _braze_fdiv(a, b):
    # floor division by a positive b (Triton's // truncates toward zero)
    q = a // b
    return q - ((q * b != a) & (a < 0)).to(a.dtype)
'''


# -- does a filled element add nothing to any fold? -----------------------------------

Value = Union[float, str, None]  # a known value, "finite" (some finite float), or unknown
_FINITE = "finite"


def _value(e: ir.Expr, score: ir.Expr) -> Value:
    """``e`` where the score is -inf and every running value some finite float."""
    if e == score:
        return -math.inf
    if isinstance(e, ir.Acc):
        return _FINITE
    if isinstance(e, ir.Const) and e.dtype.is_floating_point:
        return float(e.value)
    if not isinstance(e, ir.Op) or not e.dtype.is_floating_point:
        return None
    xs = [_value(a, score) for a in e.args]
    if any(x is None for x in xs):
        return None
    if e.name == "cast" and e.args[0].dtype.is_floating_point:
        return xs[0]
    if e.name == "neg":
        return _FINITE if xs[0] == _FINITE else -float(xs[0])  # type: ignore[arg-type]
    if e.name == "exp":
        return None if xs[0] == _FINITE else math.exp(float(xs[0]))  # type: ignore[arg-type]
    if e.name in ("add", "sub"):
        a, b = xs
        if e.name == "sub":
            b = _FINITE if b == _FINITE else -float(b)  # type: ignore[arg-type]
        if a == _FINITE and b == _FINITE:
            return _FINITE
        if a == _FINITE or b == _FINITE:
            known = float(b if a == _FINITE else a)  # type: ignore[arg-type]
            return known if math.isinf(known) else _FINITE
        return float(a) + float(b)  # type: ignore[arg-type]
    if e.name in ("mul", "div"):
        a, b = xs
        if a != _FINITE and b != _FINITE:
            x, y = float(a), float(b)  # type: ignore[arg-type]
            return x * y if e.name == "mul" else (x / y if y else None)
        if e.name == "div" and b == _FINITE:  # (it may be 0)
            return None
        other = b if a == _FINITE else a  # a known factor, or a divisor
        if other == _FINITE:
            return _FINITE
        f = float(other)  # type: ignore[arg-type]
        return _FINITE if math.isfinite(f) and (e.name == "mul" or f) else None
    return None


_IDENTITY = {"amax": -math.inf, "amin": math.inf, "sum": 0.0}


def fill_is_identity(k: ir.Kernel, score: ir.Expr) -> bool:
    """Would a score of -inf leave every fold and the contraction as they are, whatever
    the running values (a tile of them can then be skipped)?"""
    for st in k.stages:
        if isinstance(st, ir.Reduce):
            if st.op not in _IDENTITY or _value(st.expr, score) != _IDENTITY[st.op]:
                return False
        elif isinstance(st, ir.Contract) and _value(st.weight, score) != 0.0:
            return False
    return True
