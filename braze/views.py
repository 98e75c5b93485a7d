"""Movement: the views of a tensor, which record nothing.

Each method here checks its arguments (a typed error naming the op) and returns a new
Layout (``layout.py``) over the same Storage, through the tensor's ``_view``: no node is
recorded and no element moves. ``Tensor`` takes these methods from ``Views``; the ones
that may have to copy (``reshape``, ``repeat``, ``contiguous``) stay in ``tensor.py``,
where recording lives.
"""

from __future__ import annotations

import builtins as _b
import math
from math import prod
from typing import TYPE_CHECKING, Any, Self, Sequence, TypeAlias

import numpy as np

from .errors import DimOutOfRange, IndexOutOfRange, RankMismatch, ShapeMismatch
from .layout import Layout, Shape, normalize_dim, normalize_dims

_int: TypeAlias = int


class Views:
    """The view methods of ``Tensor`` (a mixin: it holds no state of its own)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what Tensor provides
        _layout: Layout

        @property
        def shape(self) -> Shape: ...
        @property
        def ndim(self) -> _int: ...
        def numel(self) -> _int: ...
        def stride(self, dim: _int | None = None) -> Any: ...
        def _view(self, layout: Layout) -> Self: ...
        def reshape(self, *shape: Any) -> Self: ...

    def view(self, *shape: Any) -> Self:
        shape_ = infer_shape("view", self, shape_arg_infer("view", shape))
        lay = self._layout.view(shape_)
        if lay is None:
            raise ShapeMismatch("view", [self.shape, shape_],
                                f"the strides {self.stride()} cannot be viewed as this shape; use reshape() (which copies)")
        return self._view(lay)

    def flatten(self, start_dim: _int = 0, end_dim: _int = -1) -> Self:
        if self.ndim == 0:
            return self.reshape(1)
        s = normalize_dim("flatten", start_dim, self.ndim)
        e = normalize_dim("flatten", end_dim, self.ndim)
        if s > e:
            raise DimOutOfRange("flatten", start_dim, self.ndim, f"start_dim {start_dim} is after end_dim {end_dim}")
        return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def unflatten(self, dim: _int, sizes: Sequence[_int]) -> Self:
        d = normalize_dim("unflatten", dim, self.ndim)
        sizes_ = infer_shape("unflatten", self, tuple(sizes), numel=self.shape[d])
        return self.view(self.shape[:d] + sizes_ + self.shape[d + 1:])

    def permute(self, *dims: Any) -> Self:
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        if len(dims) != self.ndim:
            raise RankMismatch("permute", len(dims), self.shape)
        norm = [normalize_dim("permute", d, self.ndim) for d in dims]
        if sorted(norm) != list(range(self.ndim)):
            raise DimOutOfRange("permute", dims[0], self.ndim, f"dims {dims} are not a permutation")
        return self._view(self._layout.permute(norm))

    def transpose(self, dim0: _int, dim1: _int) -> Self:
        if self.ndim == 0:
            return self
        a = normalize_dim("transpose", dim0, self.ndim)
        b = normalize_dim("transpose", dim1, self.ndim)
        return self._view(self._layout.transpose(a, b))

    def t(self) -> Self:
        if self.ndim > 2:
            raise RankMismatch("t", "<= 2", self.shape)
        return self.transpose(0, 1) if self.ndim == 2 else self

    @property
    def T(self) -> Self:
        return self.permute(list(range(self.ndim))[::-1])

    @property
    def mT(self) -> Self:
        if self.ndim < 2:
            raise RankMismatch("mT", ">= 2", self.shape)
        return self.transpose(-2, -1)

    def squeeze(self, dim: _int | Sequence[_int] | None = None) -> Self:
        dims = normalize_dims("squeeze", dim, self.ndim) if self.ndim else ()
        return self._view(self._layout.squeeze(dims))

    def unsqueeze(self, dim: _int) -> Self:
        d = normalize_dim("unsqueeze", dim, self.ndim, extra=1)
        return self._view(self._layout.unsqueeze(d))

    def expand(self, *shape: Any) -> Self:
        sizes = shape_arg_infer("expand", shape)
        if len(sizes) < self.ndim:
            raise ShapeMismatch("expand", [self.shape, sizes], "the new shape has fewer dims than the tensor")
        lead = len(sizes) - self.ndim
        target = []
        for i, n in enumerate(sizes):
            old = self.shape[i - lead] if i >= lead else None
            if n == -1:
                if old is None:
                    raise ShapeMismatch("expand", [self.shape, sizes], "-1 is not allowed for a new leading dim")
                n = old
            elif old is not None and old != n and old != 1:
                raise ShapeMismatch("expand", [self.shape, sizes], f"dim {i} of size {old} cannot expand to {n}")
            target.append(n)
        return self._view(self._layout.expand(tuple(target)))

    def expand_as(self, other: Self) -> Self:
        return self.expand(other.shape)

    def broadcast_to(self, *shape: Any) -> Self:
        return self.expand(*shape)

    def narrow(self, dim: _int, start: _int, length: _int) -> Self:
        d = normalize_dim("narrow", dim, self.ndim)
        n = self.shape[d]
        if start < 0:
            start += n
        if not (0 <= start <= n and 0 <= length and start + length <= n):
            raise IndexOutOfRange("narrow", start + length if start >= 0 else start, n, d)
        return self._view(self._layout.slice(d, start, start + length, 1))

    def select(self, dim: _int, index: _int) -> Self:
        d = normalize_dim("select", dim, self.ndim)
        n = self.shape[d]
        if not -n <= index < n:
            raise IndexOutOfRange("select", index, n, d)
        return self._view(self._layout.select(d, index % n))

    def split(self, split_size: _int | Sequence[_int], dim: _int = 0) -> tuple[Self, ...]:
        d = normalize_dim("split", dim, self.ndim)
        n = self.shape[d]
        if isinstance(split_size, int):
            if split_size <= 0:
                raise ShapeMismatch("split", [self.shape], f"split_size must be positive, got {split_size}")
            sizes = [_b.min(split_size, n - s) for s in range(0, n, split_size)] or [0]
        else:
            sizes = list(split_size)
            if _b.sum(sizes) != n or _b.any(s < 0 for s in sizes):
                raise ShapeMismatch("split", [self.shape], f"sizes {sizes} must be non-negative and sum to {n} (dim {dim})")
        out, start = [], 0
        for s in sizes:
            out.append(self.narrow(d, start, s))
            start += s
        return tuple(out)

    def chunk(self, chunks: _int, dim: _int = 0) -> tuple[Self, ...]:
        if chunks <= 0:
            raise ShapeMismatch("chunk", [self.shape], f"chunks must be positive, got {chunks}")
        d = normalize_dim("chunk", dim, self.ndim)
        return self.split(_b.max(1, math.ceil(self.shape[d] / chunks)), d)

    def unbind(self, dim: _int = 0) -> tuple[Self, ...]:
        d = normalize_dim("unbind", dim, self.ndim)
        return tuple(self.select(d, i) for i in range(self.shape[d]))


def infer_shape(op: str, x: "Views", shape: Shape, numel: int | None = None) -> Shape:
    """Resolve one -1 in a target shape and check the element count."""
    numel = x.numel() if numel is None else numel
    if list(shape).count(-1) > 1:
        raise ShapeMismatch(op, [x.shape, shape], "only one dimension can be -1")
    if -1 in shape:
        known = prod(n for n in shape if n != -1)
        if known == 0 or numel % known:
            raise ShapeMismatch(op, [x.shape, shape], f"cannot infer -1 for {numel} elements")
        shape = tuple(numel // known if n == -1 else n for n in shape)
    if prod(shape) != numel:
        raise ShapeMismatch(op, [x.shape, shape], f"{numel} elements cannot take shape {shape}")
    return shape


def shape_arg_infer(op: str, shape: tuple[Any, ...]) -> Shape:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = []
    for n in shape:
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < -1:
            raise ShapeMismatch(op, [tuple(shape)], f"bad size {n!r}")
        out.append(int(n))
    return tuple(out)
