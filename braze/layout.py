"""Layouts: shape, strides (in elements) and offset over a flat storage.

Every movement op (permute, slice, select, expand, squeeze, unsqueeze, view) is
defined here once, as arithmetic on a Layout; none of them touches data. The element
at index ``(i0, .., in)`` lives at ``offset + sum(ik * strides[k])`` in the storage;
the loop IR of the fusion compiler reads that same formula, so a view costs nothing
anywhere. Arguments here are already validated (dims normalised, sizes checked) by
``tensor.py``, which raises the user-facing errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import Sequence

from .errors import DimOutOfRange, ShapeMismatch

Shape = tuple[int, ...]


@lru_cache(maxsize=4096)
def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return tuple(strides)


def normalize_dim(op: str, dim: int, ndim: int, *, extra: int = 0) -> int:
    """Map a possibly negative dim into ``[0, ndim + extra)`` or raise DimOutOfRange.

    ``extra`` is 1 for ops that insert a dim (unsqueeze, stack). A 0-d tensor accepts
    dims 0 and -1, as in PyTorch.
    """
    n = ndim + extra
    lim = max(n, 1)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise DimOutOfRange(op, dim, ndim, "dim must be an int")
    if not -lim <= dim < lim:
        raise DimOutOfRange(op, dim, n)
    return dim % lim


def normalize_dims(op: str, dims: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """Dims of a reduction: None means all; duplicates are an error."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    out = tuple(normalize_dim(op, d, ndim) for d in dims)
    if len(set(out)) != len(out):
        raise DimOutOfRange(op, dims[0], ndim, f"dim {tuple(dims)} appears more than once")
    return tuple(sorted(out)) if ndim else ()


def broadcast_shapes(op: str, *shapes: Shape) -> Shape:
    """NumPy/PyTorch broadcasting: align right, sizes equal or 1."""
    first = shapes[0] if shapes else ()
    if all(s == first for s in shapes):  # the common case, on every recorded op
        return tuple(first)
    # The next most common: the same broadcast on every step of a loop (a bias, a
    # rotary table). Only results are remembered; a mismatch raises every time.
    key = shapes if all(type(s) is tuple for s in shapes) else tuple(tuple(s) for s in shapes)
    out = _BROADCASTS.get(key)
    if out is None:
        out = _broadcast(op, shapes)
        if len(_BROADCASTS) > 4096:
            _BROADCASTS.clear()
        _BROADCASTS[key] = out
    return out


_BROADCASTS: dict[tuple[Shape, ...], Shape] = {}


def _broadcast(op: str, shapes: tuple[Shape, ...]) -> Shape:
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(-ndim, 0):
        size = 1
        for s in shapes:
            d = s[i] if -i <= len(s) else 1
            if d != 1:
                if size != 1 and d != size:
                    raise ShapeMismatch(op, shapes, f"cannot broadcast at dim {i}")
                size = d
        out.append(size)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Layout:
    shape: Shape
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def contiguous(shape: Sequence[int], offset: int = 0) -> "Layout":
        shape = tuple(shape)
        return Layout(shape, contiguous_strides(shape), offset)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    def is_contiguous(self) -> bool:
        """Row-major dense: size-1 dims may have any stride, and a layout with no
        elements is contiguous whatever its strides, as in PyTorch."""
        if 0 in self.shape:
            return True
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1:
                if stride != expected:
                    return False
                expected *= size
        return True

    def span(self) -> tuple[int, int]:
        """Lowest and one-past-highest storage index touched (empty layouts touch nothing)."""
        if self.numel == 0:
            return self.offset, self.offset
        hi = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        return self.offset, hi + 1

    def index(self, idx: Sequence[int]) -> int:
        """Storage position of one element: the formula every backend uses."""
        return self.offset + sum(i * s for i, s in zip(idx, self.strides))

    # -- movement ops: pure index transforms ------------------------------------------

    def permute(self, dims: Sequence[int]) -> "Layout":
        return Layout(tuple(self.shape[d] for d in dims), tuple(self.strides[d] for d in dims), self.offset)

    def transpose(self, a: int, b: int) -> "Layout":
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def expand(self, shape: Sequence[int]) -> "Layout":
        """Broadcast to ``shape`` (already checked): new and size-1 dims get stride 0."""
        lead = len(shape) - self.ndim
        strides = [0] * lead
        for i, (old, stride) in enumerate(zip(self.shape, self.strides)):
            strides.append(stride if old == shape[lead + i] else 0)
        return Layout(tuple(shape), tuple(strides), self.offset)

    def slice(self, dim: int, start: int, stop: int, step: int) -> "Layout":
        """Elements start, start+step, ... < stop along ``dim`` (bounds already clamped)."""
        n = max(0, (stop - start + step - 1) // step)
        shape = self.shape[:dim] + (n,) + self.shape[dim + 1:]
        strides = self.strides[:dim] + (self.strides[dim] * step,) + self.strides[dim + 1:]
        return Layout(shape, strides, self.offset + (start * self.strides[dim] if n else 0))

    def select(self, dim: int, index: int) -> "Layout":
        """Index one position along ``dim`` and drop the dim."""
        return Layout(self.shape[:dim] + self.shape[dim + 1:], self.strides[:dim] + self.strides[dim + 1:],
                      self.offset + index * self.strides[dim])

    def unsqueeze(self, dim: int) -> "Layout":
        stride = self.strides[dim] * self.shape[dim] if dim < self.ndim else 1
        return Layout(self.shape[:dim] + (1,) + self.shape[dim:], self.strides[:dim] + (stride,) + self.strides[dim:],
                      self.offset)

    def squeeze(self, dims: Sequence[int]) -> "Layout":
        keep = [i for i in range(self.ndim) if not (i in dims and self.shape[i] == 1)]
        return Layout(tuple(self.shape[i] for i in keep), tuple(self.strides[i] for i in keep), self.offset)

    def view(self, shape: Sequence[int]) -> "Layout | None":
        """The same elements in row-major order with a new shape, or None when the
        strides cannot express it without a copy (e.g. flattening a transpose).

        Dims are grouped into runs that are contiguous with one another; each group of
        the new shape must fill exactly one such run, as in PyTorch's ``view``.
        """
        shape = tuple(shape)
        if self.is_contiguous():
            return Layout.contiguous(shape, self.offset)
        if prod(shape) == 0:
            return Layout.contiguous(shape, self.offset)
        old = [(n, s) for n, s in zip(self.shape, self.strides) if n != 1]
        new_strides = [0] * len(shape)
        oi, ni = 0, 0
        while ni < len(shape) or oi < len(old):
            if ni < len(shape) and shape[ni] == 1:
                new_strides[ni] = 1
                ni += 1
                continue
            if oi >= len(old) or ni >= len(shape):
                return None
            # Take old dims until their product matches new dims' product, checking
            # that the old dims in the group are mutually contiguous.
            o_prod, n_prod = old[oi][0], shape[ni]
            o_group = [oi]
            n_group = [ni]
            while o_prod != n_prod:
                if o_prod < n_prod:
                    oi += 1
                    if oi >= len(old):
                        return None
                    o_prod *= old[oi][0]
                    o_group.append(oi)
                else:
                    ni += 1
                    while ni < len(shape) and shape[ni] == 1:
                        new_strides[ni] = 1
                        ni += 1
                    if ni >= len(shape):
                        return None
                    n_prod *= shape[ni]
                    n_group.append(ni)
            for a, b in zip(o_group, o_group[1:]):
                if old[a][1] != old[b][1] * old[b][0]:
                    return None
            stride = old[o_group[-1]][1]
            for j in reversed(n_group):
                new_strides[j] = stride
                stride *= shape[j]
            oi += 1
            ni += 1
        return Layout(shape, tuple(new_strides), self.offset)
