"""Reductions over a set of dims, with ``keepdim``; scans (cumsum); sort and top-k.

Attributes: ``dims`` (sorted, normalised) and ``keepdim``. Integer and bool sums and
products give int64, as in PyTorch; half types accumulate in float32.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import dtypes as dt
from ..dtypes import DType
from ..errors import ShapeMismatch
from ..layout import Shape
from .registry import OpDef, register, require, same_dtypes


def reduced_shape(shape: Shape, dims: Sequence[int], keepdim: bool) -> Shape:
    if keepdim:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def _shape(nonempty: bool) -> Any:
    def rule(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
        shape = shapes[0]
        if nonempty and any(shape[d] == 0 for d in attrs["dims"]) or nonempty and not attrs["dims"] and 0 in shape:
            raise ShapeMismatch(op, [shape], f"cannot reduce over an empty dimension (dims {attrs['dims']})")
        return [reduced_shape(shape, attrs["dims"], attrs["keepdim"])]
    return rule


def _dtype(kinds: str, out: str) -> Any:
    def rule(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
        d = same_dtypes(op, dtypes)
        require(op, d, kinds, dtypes)
        if out == "same":
            return [d]
        if out == "acc":
            return [d if d.is_floating_point else dt.int64]
        return [{"bool": dt.bool_, "int64": dt.int64}[out]]
    return rule


def _axis(attrs_dims: Sequence[int]) -> tuple[int, ...]:
    return tuple(attrs_dims)


def _sum(x: np.ndarray, dims: tuple[int, ...], keepdim: bool) -> np.ndarray:
    acc = np.int64 if x.dtype.kind in "iub" else x.dtype
    return np.asarray(np.sum(x, axis=dims, keepdims=keepdim, dtype=acc))


def _prod(x: np.ndarray, dims: tuple[int, ...], keepdim: bool) -> np.ndarray:
    acc = np.int64 if x.dtype.kind in "iub" else x.dtype
    return np.prod(x, axis=dims, keepdims=keepdim, dtype=acc)


def _mean(x: np.ndarray, dims: tuple[int, ...], keepdim: bool) -> np.ndarray:
    n = int(np.prod([x.shape[d] for d in dims])) if dims else 1
    s = np.sum(x, axis=dims, keepdims=keepdim, dtype=x.dtype)
    return s / n if n else np.full_like(s, np.nan)


def _var(x: np.ndarray, dims: tuple[int, ...], keepdim: bool, correction: float) -> np.ndarray:
    n = int(np.prod([x.shape[d] for d in dims])) if dims else 1
    wide = x.astype(np.float64)
    mean = np.mean(wide, axis=dims, keepdims=True) if n else np.zeros([1] * x.ndim)
    ss = np.sum((wide - mean) ** 2, axis=dims, keepdims=keepdim)
    return (ss / max(n - correction, 0)).astype(x.dtype)


def _arg(fn: Any) -> Any:
    def ref(x: np.ndarray, dims: tuple[int, ...], keepdim: bool) -> np.ndarray:
        if len(dims) == x.ndim and x.ndim != 1:
            # Over all dims: index into the flattened tensor, as PyTorch.
            r = fn(x.reshape(-1), axis=0)
            return np.reshape(r, (1,) * x.ndim if keepdim else ())
        if x.ndim == 0:
            return np.zeros((), np.int64)
        return fn(x, axis=dims[0], keepdims=keepdim)
    return ref


def _arg_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    return _shape(True)(op, shapes, attrs)


REDUCTIONS: dict[str, tuple[Any, str, str, bool]] = {
    # name: (reference, accepted kinds, output dtype rule, needs a non-empty dim)
    "sum": (_sum, "float int uint bool", "acc", False),
    "prod": (_prod, "float int uint bool", "acc", False),
    "mean": (_mean, "float", "same", False),
    "amax": (lambda x, dims, keepdim: np.max(x, axis=dims, keepdims=keepdim), "float int uint bool", "same", True),
    "amin": (lambda x, dims, keepdim: np.min(x, axis=dims, keepdims=keepdim), "float int uint bool", "same", True),
    "any": (lambda x, dims, keepdim: np.any(x, axis=dims, keepdims=keepdim), "float int uint bool", "bool", False),
    "all": (lambda x, dims, keepdim: np.all(x, axis=dims, keepdims=keepdim), "float int uint bool", "bool", False),
    "argmax": (_arg(np.argmax), "float int uint bool", "int64", True),
    "argmin": (_arg(np.argmin), "float int uint bool", "int64", True),
}

for _name, (_ref, _kinds, _out, _nonempty) in REDUCTIONS.items():
    register(OpDef(_name, _shape(_nonempty), _dtype(_kinds, _out), _ref))
register(OpDef("var", _shape(False), _dtype("float", "same"), _var, compute="native"))


# -- scans and orderings --------------------------------------------------------------------

def _dim_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    return [shapes[0]]


def _cumsum(x: np.ndarray, dim: int) -> np.ndarray:
    acc = np.int64 if x.dtype.kind in "iub" else x.dtype
    return np.cumsum(x, axis=dim, dtype=acc) if x.ndim else x.astype(acc)


register(OpDef("cumsum", _dim_shape, _dtype("float int uint bool", "acc"), _cumsum))


def _stable_order(x: np.ndarray, dim: int, descending: bool) -> np.ndarray:
    """Stable argsort; descending keeps equal elements in their original order and
    puts NaN first, as PyTorch does (NaN compares larger than everything)."""
    if not descending:
        return np.argsort(x, axis=dim, kind="stable")
    n = x.shape[dim]
    rev = np.flip(x, axis=dim)
    order = np.argsort(rev, axis=dim, kind="stable")
    return n - 1 - np.flip(order, axis=dim)


def _sort(x: np.ndarray, dim: int, descending: bool) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    idx = _stable_order(x, dim, descending)
    return np.take_along_axis(x, idx, axis=dim), idx.astype(np.int64)


def _sort_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    return [dtypes[0], dt.int64]


register(OpDef("sort", lambda op, s, a: [s[0], s[0]], _sort_dtype, _sort))


def _topk_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    shape, dim, k = shapes[0], attrs["dim"], attrs["k"]
    size = shape[dim] if shape else 1
    if not 0 <= k <= size:
        raise ShapeMismatch(op, [shape], f"k={k} is out of range for dimension {dim} of size {size}")
    out = shape[:dim] + (k,) + shape[dim + 1:] if shape else ()
    return [out, out]


def _topk(x: np.ndarray, k: int, dim: int, largest: bool, sorted: bool) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    idx = np.take(_stable_order(x, dim, largest), np.arange(k), axis=dim)
    return np.take_along_axis(x, idx, axis=dim), idx.astype(np.int64)


register(OpDef("topk", _topk_shape, _sort_dtype, _topk))
