"""The loop IR: what a fused kernel computes, per element, before it becomes C.

A kernel iterates over ``outer`` (independent rows, run in parallel) times ``inner``
(the elements of one row). Its body is a list of stages run in order for each row:

- ``Reduce``: fold an element expression over the row into a per-row accumulator
  (sum, max, min, prod, any, all); later stages read it as ``Acc``.
- ``Store``: write an element expression for every element of the row.
- ``StoreRow``: write a row expression once per row (a reduction's result).
- ``Contract``: a second matmul over the row into a vector per row (attention's
  ``softmax(..) @ v``); a kernel with one is a *chain* kernel, whose element values
  start from a ``Dot`` (the first matmul), see ``schedule/chain.py``.

Expressions are small trees: ``Load`` (a kernel argument read at an affine index of
the loop coordinates, derived from a Layout: every view is index arithmetic here),
``Const``, ``Coord`` (a loop coordinate, for arange and masks), ``Acc`` and ``Op``
(an element-wise op by registry name). A pure element-wise kernel is the special case
with no Reduce stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Union

from .dtypes import DType, bfloat16, float16, float32


#: The matmuls a chain starts and ends at. Half inputs are converted to float32 as the
#: tiles are loaded, and everything between the matmuls is computed in float32 (see
#: ``in_float32``): the result differs from the reference's node-by-node half rounding
#: by about one half-precision rounding, as a FlashAttention kernel's does.
CHAIN_DTYPES = (float32, float16, bfloat16)


class Size(int):
    """A size that a generic kernel reads when it runs (``codegen/generic.py``): an int,
    the value at the shape being rendered, on which every decision of the renderer is
    taken, that is spelled as a C expression (``n0``, ``(n0 * n1)``). Sums, differences,
    products, negations, quotients and remainders of non-negative values, and ceilings
    (``-(-x // b)``) stay Sizes; anything else the renderer derives from one is a plain
    int, rendered as a literal."""

    expr: str
    negated: "Size | None"  # what this is the negation of (a ceiling's -(-x // b) is spelled for C)

    def __new__(cls, value: int, expr: str) -> "Size":
        self = super().__new__(cls, value)
        self.expr = expr
        self.negated = None
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (Size, (int(self), self.expr))

    def __str__(self) -> str:
        return self.expr

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return self.expr if not spec else format(int(self), spec)

    def _with(self, other: Any, value: int, sym: str, swap: bool = False) -> Any:
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        a, b = (other, self) if swap else (self, other)
        return Size(value, f"({a} {sym} {b})")

    def __add__(self, other: Any) -> Any:
        if other == 0 and not isinstance(other, Size):
            return self
        return self._with(other, int(self) + int(other), "+")

    def __radd__(self, other: Any) -> Any:
        if other == 0 and not isinstance(other, Size):
            return self
        return self._with(other, int(other) + int(self), "+", True)

    def __sub__(self, other: Any) -> Any:
        return self._with(other, int(self) - int(other), "-")

    def __rsub__(self, other: Any) -> Any:
        return self._with(other, int(other) - int(self), "-", True)

    def __mul__(self, other: Any) -> Any:
        if other == 1 and not isinstance(other, Size):
            return self
        return self._with(other, int(self) * int(other), "*")

    def __rmul__(self, other: Any) -> Any:
        if other == 1 and not isinstance(other, Size):
            return self
        return self._with(other, int(other) * int(self), "*", True)

    def __neg__(self) -> "Size":
        out = Size(-int(self), f"(-{self.expr})")
        out.negated = self
        return out

    def __floordiv__(self, other: Any) -> Any:  # C's / and % agree with Python's on non-negative values
        if isinstance(other, int) and int(self) >= 0 and int(other) > 0:
            return self._with(other, int(self) // int(other), "/")
        x = self.negated
        if x is not None and isinstance(other, int) and not isinstance(other, Size) and other > 0 and int(x) >= 0:
            # -x // b, a ceiling's inner half (-(-x // b)): C's / truncates, so spelled -((x + b - 1) / b)
            return Size(int(self) // other, f"(-(({x} + {other - 1}) / {other}))")
        return int(self) // other

    def __mod__(self, other: Any) -> Any:
        if isinstance(other, int) and int(self) >= 0 and int(other) > 0:
            return self._with(other, int(self) % int(other), "%")
        return int(self) % other

    __hash__ = int.__hash__


@dataclass(frozen=True)
class Affine:
    """``offset + sum(coeffs[k] * coord[k])`` over the kernel's outer then inner coords,
    plus ``sum(m * ((coord[c] + add) // d) for c, add, d, m in divs)``: a view that
    merges dims a stride cannot (``repeat_kv``'s expand and reshape: head ``h`` reads
    KV head ``h // groups``). Coordinates are non-negative, so C's ``/`` is the floor."""

    offset: int
    coeffs: tuple[int, ...]
    divs: tuple[tuple[int, int, int, int], ...] = ()

    def uses(self, c: int) -> bool:
        """Does the index move with coordinate ``c``?"""
        return bool(self.coeffs[c]) or any(d[0] == c for d in self.divs)


@dataclass(frozen=True)
class Load:
    arg: int
    index: Affine
    dtype: DType
    #: ``(coord, lo, hi)``: the load is valid only where ``lo <= coord < hi`` and reads 0
    #: elsewhere (cat and pad read each input only inside its own range of the output).
    when: tuple[tuple[int, int, int], ...] = ()
    #: ``(i, stride)``: data-dependent terms added to the index (a gather's), each ``i``
    #: an int64 ``checked`` Op (``checked``), so it never points outside the dim it picks in
    at: tuple[tuple["Expr", int], ...] = ()


@dataclass(frozen=True)
class Const:
    value: Any
    dtype: DType


@dataclass(frozen=True)
class Coord:
    dim: int  # position in outer + inner
    dtype: DType


@dataclass(frozen=True)
class Acc:
    stage: int  # index of the Reduce stage whose result this is (a QLinear's epilogue: of the weight)
    dtype: DType


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple["Expr", ...]
    dtype: DType
    attrs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Dot:
    """``sum_d a[.., d] * b[.., d]`` over ``length``: a matmul's element. The loads'
    Affine indices have one coordinate more than the kernel, the contracted ``d``."""

    a: Load
    b: Load
    length: int
    dtype: DType


@dataclass(frozen=True)
class Var:
    """A named value of the generated code (a repair term's running accumulators)."""

    name: str
    dtype: DType


Expr = Union[Load, Const, Coord, Acc, Op, Dot, Var]


@dataclass(frozen=True)
class Reduce:
    op: str  # sum, max, min, prod, any, all; argmax, argmin (``codegen/argfold.py``)
    expr: Expr
    dtype: DType  # accumulator dtype (an arg fold's: int64, the index it gives)
    #: in a rolling kernel, ``h(t, old, new)`` (``Var`` t, old{p} and new{p} for each
    #: earlier stage p) that repairs the partial fold when its producers move
    repair: Expr | None = None
    #: an arg fold's position of the element along the row (an int64 ``Coord``): what
    #: the fold keeps beside the extreme ``expr``, and what it gives
    index: Expr | None = None


@dataclass(frozen=True)
class Scan:
    """An inclusive prefix fold along the row (``cumsum``): element j's value, read as
    ``Acc`` of this stage by the stores, is the fold of ``expr`` over elements 0..j. A
    kernel with one walks its row once, in order, its stores in the same loop."""

    op: str  # sum
    expr: Expr
    dtype: DType  # accumulator dtype


@dataclass(frozen=True)
class Contract:
    """A second matmul over the row: ``out[.., e] = post(sum_j weight_j * v[.., j, e])``
    for ``e < size``. ``v``'s and ``index``'s Affines have one coordinate more than the
    kernel (``e``); ``index`` does not use the row's own coordinate. ``post`` reads the
    sum as ``Var("c")`` (factors constant along the row, such as softmax's ``1 / sum``,
    are applied once here instead of per element)."""

    arg: int
    index: Affine
    weight: Expr
    v: Load
    size: int
    post: Expr
    repair: Expr | None = None
    #: the second matmul's own dtype: float16 or bfloat16 where the user's chain multiplies
    #: half weights by half values (the weights round to it going in), float32 where
    #: half values were cast to float32 first (a float16 KV cache read through its cast)
    dtype: DType = float32


@dataclass(frozen=True)
class Store:
    arg: int
    index: Affine
    expr: Expr
    #: ``(i, stride)``: data-dependent terms added to the index (a scatter's: ``index_copy_``,
    #: ``x[idx] = v``), as ``Load.at``'s; each ``i`` a ``checked`` Op. Where an index is
    #: outside its dim the element is not stored (the kernel checks every row's index before
    #: it stores anything, so a bad one stores nothing: ``codegen/scatter.py``)
    at: tuple[tuple["Expr", int], ...] = ()


@dataclass(frozen=True)
class StoreRow:
    arg: int
    index: Affine  # over outer coords only (inner coeffs are 0)
    expr: Expr


Stage = Union[Reduce, Scan, Store, StoreRow, Contract]


@dataclass
class Kernel:
    outer: tuple[int, ...]
    inner: tuple[int, ...]
    stages: list[Stage] = field(default_factory=list)
    args: list[tuple[DType, bool]] = field(default_factory=list)  # (dtype, written)
    #: the bounds checks of its gathers (``checked`` Ops, numbered in this order): per
    #: check, the (node, op, dim) an index outside names (``numbered_checks``)
    checks: tuple[tuple[int, str, int], ...] = ()

    @property
    def ndim(self) -> int:
        return len(self.outer) + len(self.inner)


def walk(e: Expr) -> Any:
    """Every node of an expression, children first (a gather's index terms too)."""
    if isinstance(e, Op):
        for a in e.args:
            yield from walk(a)
    elif isinstance(e, Load):
        for i, _ in e.at:
            yield from walk(i)
    elif isinstance(e, Dot):
        yield from walk(e.a)
        yield from walk(e.b)
    yield e


def mapped(e: Expr, leaf: Callable[[Expr], Expr]) -> Expr:
    """``e`` with every leaf (a node other than an Op) replaced by ``leaf(node)``."""
    if isinstance(e, Op):
        return Op(e.name, tuple(mapped(a, leaf) for a in e.args), e.dtype, e.attrs)
    return leaf(e)


def checked(i: Expr, size: int, node: int, op: str, dim: int) -> Op:
    """Index ``i`` (int64) if ``0 <= i < size``; otherwise the kernel records the check
    failed (the runtime raises ``IndexOutOfRange`` naming ``op``, the value and the
    size after the kernel) and reads at 0: never outside the dim. ``node`` is renumbered
    to the kernel's check ordinal when its group closes (``numbered_checks``)."""
    return Op("checked", (i, Const(size, i.dtype)), i.dtype, (("node", node), ("op", op), ("dim", dim)))


def numbered_checks(stages: list[Stage]) -> tuple[list[Stage], tuple[tuple[int, str, int], ...]]:
    """``stages`` with each ``checked`` Op's node replaced by its ordinal in the kernel
    (so identical kernels at other nodes render alike), and the table of what each names."""
    table: list[tuple[int, str, int]] = []

    def op(e: Expr) -> Expr:
        if isinstance(e, Op):
            args = tuple(op(a) for a in e.args)
            attrs = dict(e.attrs)
            if e.name == "checked" and "node" in attrs:
                entry = (attrs.pop("node"), attrs["op"], attrs["dim"])
                if entry not in table:
                    table.append(entry)
                attrs["check"] = table.index(entry)
            return Op(e.name, args, e.dtype, tuple(attrs.items()))
        if isinstance(e, Load) and e.at:
            return load(e)
        if isinstance(e, Dot) and (e.a.at or e.b.at):  # a chain's keys read through a block table
            return replace(e, a=load(e.a), b=load(e.b))
        return e

    def load(e: Load) -> Load:
        return Load(e.arg, e.index, e.dtype, e.when, tuple((op(i), s) for i, s in e.at))

    def stage(st: Stage) -> Stage:
        if isinstance(st, Store) and st.at:
            return replace(st, expr=op(st.expr), at=tuple((op(i), s) for i, s in st.at))
        if isinstance(st, Contract):
            return replace(st, weight=op(st.weight), v=load(st.v))
        return replace(st, expr=op(st.expr)) if isinstance(st, (Reduce, Scan, Store, StoreRow)) else st

    if not any(isinstance(n, Op) and n.name == "checked" for st in stages for x in stage_exprs(st) for n in walk(x)):
        return stages, ()
    return [stage(st) for st in stages], tuple(table)


def stage_exprs(s: Stage) -> list[Expr]:
    """The expressions a stage evaluates (for walks over a whole kernel)."""
    if isinstance(s, Contract):
        return [s.weight, s.v, s.post]
    if isinstance(s, Store) and s.at:
        return [s.expr, *(i for i, _ in s.at)]
    if isinstance(s, Reduce) and s.index is not None:
        return [s.expr, s.index]
    return [s.expr]


def kernel_indices(k: "Kernel") -> list[Affine]:
    """Every index of a kernel: its stores' and its loads'."""
    out = []
    for st in k.stages:
        if isinstance(st, (Store, StoreRow, Contract)):
            out.append(st.index)
        for e in stage_exprs(st):
            out += [n.index for n in walk(e) if isinstance(n, Load)]
    return out


def pinned_coords(k: "Kernel") -> set[int]:
    """Loops whose coordinate the kernel reads as a value or a range (``Coord``, a
    cat's or pad's guard): loop transformations leave them in place."""
    pinned = set()
    for st in k.stages:
        for e in stage_exprs(st):
            for n in walk(e):
                if isinstance(n, Coord):
                    pinned.add(n.dim)
                elif isinstance(n, Load):
                    pinned.update(c for c, _, _ in n.when)
    return pinned


def scans_or_gathers(k: "Kernel") -> bool:
    """Does the kernel scan a row, or gather or scatter at data-dependent indices? (Its
    loops are then left as they are: a scan keeps its row, even of one element; a
    gather's or scatter's index terms are not rewritten.)"""
    return any(isinstance(st, Scan) or isinstance(st, Store) and st.at for st in k.stages) \
        or any(isinstance(n, Load) and n.at for st in k.stages for e in stage_exprs(st) for n in walk(e))


def load_uses(x: Load, c: int) -> bool:
    """Does the load's position move with coordinate ``c`` (through its index, or its
    data-dependent terms: a gather's index read at ``c``)?"""
    return x.index.uses(c) or any(isinstance(n, Coord) and n.dim == c or isinstance(n, Load) and n.index.uses(c)
                                  for i, _ in x.at for n in walk(i))


def uses_inner(e: Expr, n_outer: int) -> bool:
    """Does the expression vary along the row (so it cannot be computed once per row)?"""
    for node in walk(e):
        if isinstance(node, Load) and (any(node.index.coeffs[n_outer:])
                                       or any(d[0] >= n_outer for d in node.index.divs)):
            return True
        if isinstance(node, Coord) and node.dim >= n_outer:
            return True
    return False


@dataclass(frozen=True)
class QLinear:
    """A quantized matmul kernel: the sums ``x @ w.T`` of x (m, k) float32 (rows ``lda``
    floats apart) with each of ``weights`` matrices w (n, k) of one GGML type (``qtype``:
    "Q4_K", "F16" ...; rows ``ldw`` bytes apart), x read (and quantized) once for all.
    What is stored is the ``epilogue``: Store stages over the coordinates (r, j) of the
    (m, n) result, whose expressions read weight i's sum at (r, j) as ``Acc(i)``; the
    plain matmul stores ``Acc(0)`` into y, fused element-wise work (a bias, a residual,
    ``silu(gate) * up``) stores what its group stored. Arguments: x, the weights, then
    the epilogue's and the prologue's (``args``: dtype and written, from argument
    ``1 + weights`` on). Rendered from ``codegen/quant.h``, the epilogue and prologue by
    ``codegen/c.py``.

    The ``prologue``, when there is one, is the group that computed x (a row-local
    kernel: an RMSNorm, a LayerNorm, with whatever element-wise work it fused), done by
    this kernel instead of a kernel of its own (``schedule/prologue.py``): a Kernel over
    the group's coordinates, whose ``outer`` coordinates flatten to x's row r (``m``
    rows) and whose ``inner`` ones to x's column (``k``), run once per row of x before x
    is quantized. Its argument 0 is the row of x being computed (its Store to argument 0
    writes element j of the row at inner index j); its arguments 1.. are the last
    ``len(prologue.args) - 1`` of ``args``. Its other stores (the residual sum an
    RMSNorm fused) are done as the group did them. x is then never stored: argument 0 of
    the kernel is unused (the step passes weight 0 there). Only at few rows (decoding,
    m <= ``codegen/quant.FEW``): a prompt's matmuls read x from memory, their kernels
    generic in their rows (``schedule/prologue.py``)."""

    qtype: str
    m: int
    n: int
    k: int
    lda: int
    ldw: int
    epilogue: tuple[Store, ...]
    args: tuple[tuple[DType, bool], ...]
    weights: int = 1
    xoff: int = 0  # elements into x's argument (an intermediate's offset; 0 for a tensor given at run time)
    woff: tuple[int, ...] = (0,)  # bytes into each weight's argument
    prologue: Kernel | None = None  # the group computing x, row by row (see above)


@dataclass(frozen=True)
class QRows:
    """Rows of a table kept in its file's type at token ids, as float32: ``out[i, :] =
    w[ids[i], :]`` for ``n`` ids (int64 or int32: ``ids64``), rows ``ldw`` bytes apart,
    ``rows`` of them (an id outside gives a row of nan, never a read outside the table;
    the recording and the reference check ids first). Arguments: w, ids, out."""

    qtype: str
    n: int
    k: int
    ldw: int
    rows: int
    ids64: bool


@dataclass(frozen=True)
class TopK:
    """The ``k`` largest (or smallest) elements of each row of x and their indices, in
    order, ties and nans as the reference orders them (a stable sort: the earlier
    element first; nan the largest), kept in a sorted buffer of ``k`` while the row is
    walked once (``codegen/topk.py``; small k only). x is read through its strides
    (``xstrides`` along the ``outer`` dims, ``xstride`` along the row of ``n``); values
    and indices are written at ``ostrides`` / ``ostride`` (along k). Arguments: x,
    values, indices (int64)."""

    k: int
    largest: bool
    dtype: DType
    outer: tuple[int, ...]
    xstrides: tuple[int, ...]
    n: int
    xstride: int
    ostrides: tuple[int, ...]
    ostride: int
