"""What the scheduler builds a kernel from: a group of nodes, the values it computes,
and the affine index of a layout in the group's coordinates; the steps it emits.
Shared by the fusing scheduler (``fuse.py``), the chain builder (``chain.py``) and
the epilogue folder (``epilogue.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from .. import ir
from ..layout import Layout, Shape

Key = int  # a storage's relative id within the flushed stream


@dataclass
class KernelStep:
    kernel: ir.Kernel | ir.QLinear | ir.QRows | ir.TopK
    args: list[Key]  # storage of each kernel argument
    outputs: list[Key]  # storages this kernel produces (to allocate)
    nodes: list[int]
    #: per argument, the (node, input) whose layout offset is added to its pointer at run
    #: time (tensors that exist before the flush), or None; input -1 is the node's
    #: output (an in-place write's target)
    refs: list[tuple[int, int] | None] = field(default_factory=list)


@dataclass
class ExternStep:
    node: int


@dataclass
class Value:
    """A node's output as its group computes it."""

    expr: ir.Expr
    index: ir.Affine  # where its contiguous output would live, in group coordinates
    row: bool  # constant along the row (a reduction result or a function of one)
    shape: Shape
    dims: tuple[int | None, ...] = ()  # the value's dims -> group coordinates


@dataclass
class Group:
    gid: int
    outer: Shape
    inner: Shape
    elem_shape: Shape  # the element-level node shape, in its own dim order
    elem_map: tuple[int, ...]  # elem dim -> coordinate
    row_shapes: dict[Shape, tuple[int | None, ...]] = field(default_factory=dict)  # row-level shape -> dim map
    stages: list[ir.Stage] = field(default_factory=list)
    values: dict[Key, Value] = field(default_factory=dict)
    members: list[int] = field(default_factory=list)
    #: kernel argument of each storage read from memory: keyed by the storage, or, for a
    #: tensor that exists before the flush, by (storage, offset): the offset (a slice
    #: bound) is then a placeholder, added to the argument's pointer at run time
    loads: dict[Any, int] = field(default_factory=dict)
    loaded: set[Key] = field(default_factory=set)  # storages read from memory
    recomputed: set[Key] = field(default_factory=set)  # values recomputed where read (schedule/recompute.py)
    #: (storage, node) readers a chain's read-through dropped (restored if the chain is abandoned)
    read_through: list[tuple[Key, int]] = field(default_factory=list)
    refs: dict[int, tuple[int, int]] = field(default_factory=dict)  # argument -> (node, input)
    deps: set[int] = field(default_factory=set)
    slices: list[tuple[Key, ir.Affine, ir.Expr]] = field(default_factory=list)  # cat: writes into slices
    contract: tuple[Key, ir.Contract] | None = None  # a chain kernel's second matmul
    #: in-place writes the group stores (``inplace.py``): target -> (its argument's key
    #: in ``loads``, the offset its pointer carries, the writing node)
    writes: dict[Key, tuple[Any, int, int]] = field(default_factory=dict)

    @property
    def ndim(self) -> int:
        return len(self.outer) + len(self.inner)

    def reorderable(self) -> bool:
        """Only element-wise work so far: its loop order is free (no row is fixed yet)."""
        return not (self.stages or self.row_shapes or self.slices or self.contract is not None)

    def reorder(self, order: Sequence[int]) -> None:
        """Renumber the coordinates of an element-wise group so that coordinate
        ``order[k]`` becomes ``k``: what a reduction over a middle dim needs (its kept
        dims outer, its folded dims inner). The values are the same element for element."""
        assert self.reorderable()
        new = {c: k for k, c in enumerate(order)}
        extents = self.outer + self.inner
        moved = tuple(extents[c] for c in order)
        split = len(self.outer)  # the reduction sets its own split; until then, the same number of rows
        self.outer, self.inner = moved[:split], moved[split:]
        self.elem_map = tuple(new[c] for c in self.elem_map)
        for key, v in self.values.items():
            self.values[key] = Value(ir.mapped(v.expr, lambda e: recoordinated(e, new)), reindexed(v.index, new),
                                     v.row, v.shape, tuple(None if c is None else new[c] for c in v.dims))


def affine(layout: Layout, dim_map: Sequence[int | None], ndim: int) -> ir.Affine:
    """A node operand's layout as an affine index over group coordinates."""
    coeffs = [0] * ndim
    for size, stride, c in zip(layout.shape, layout.strides, dim_map):
        if size != 1 and c is not None:
            coeffs[c] += stride
    return ir.Affine(layout.offset, tuple(coeffs))


def onto(layout: Layout, v: Value) -> tuple[int | None, ...] | None:
    """The group coordinate of each dim of ``layout`` where it is ``v``'s contiguous
    layout up to dims of size 1 (a stack's ``unsqueeze``), else None."""
    def squeezed(lay: Layout) -> tuple[tuple[int, int], ...]:
        return tuple((n, st) for n, st in zip(lay.shape, lay.strides) if n != 1)
    if squeezed(layout) != squeezed(Layout.contiguous(v.shape)) or layout.offset:
        return None
    coords = iter(c for n, c in zip(v.shape, v.dims) if n != 1)
    return tuple(next(coords) if n != 1 else None for n in layout.shape)


def reindexed(a: ir.Affine, new: dict[int, int]) -> ir.Affine:
    """``a`` over coordinates renumbered by ``new`` (old -> new)."""
    coeffs = [0] * len(a.coeffs)
    for c, m in enumerate(a.coeffs):
        coeffs[new[c]] = m
    return ir.Affine(a.offset, tuple(coeffs), tuple((new[c], add, d, m) for c, add, d, m in a.divs))


def recoordinated(e: ir.Expr, new: dict[int, int]) -> ir.Expr:
    """A leaf of an expression over coordinates renumbered by ``new``."""
    if isinstance(e, ir.Coord):
        return ir.Coord(new[e.dim], e.dtype)
    if isinstance(e, ir.Load):
        return ir.Load(e.arg, reindexed(e.index, new), e.dtype, tuple((new[c], lo, hi) for c, lo, hi in e.when),
                       tuple((ir.mapped(i, lambda x: recoordinated(x, new)), st) for i, st in e.at))
    assert not isinstance(e, ir.Dot)  # only chains (never reordered) compute dots
    return e
