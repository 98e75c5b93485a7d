"""Ops that build a new layout of data and cannot be a view: cat, pad, tril/triu,
gather and index_select, one_hot, matmul, and the creation ops (full, arange).

Views (slice, permute, expand, reshape of a contiguous tensor) are not ops at all:
they are Layout arithmetic in ``layout.py``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import dtypes as dt
from ..dtypes import DType
from ..errors import IndexOutOfRange
from ..layout import Shape
from .registry import OpDef, dtype_keep, register, same_dtypes, require


def _cat_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    dim = attrs["dim"]
    first = shapes[0]
    return [first[:dim] + (sum(s[dim] for s in shapes),) + first[dim + 1:]]


register(OpDef("cat", _cat_shape, dtype_keep(), lambda *xs, dim: np.concatenate(xs, axis=dim), compute="native"))


def _pad_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    return [tuple(n + lo + hi for n, (lo, hi) in zip(shapes[0], attrs["pads"]))]


def _pad(x: np.ndarray, pads: tuple[tuple[int, int], ...], mode: str, value: Any) -> np.ndarray:
    if mode == "constant":
        return np.pad(x, pads, mode="constant", constant_values=np.asarray(value).astype(x.dtype))
    numpy_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    return np.pad(x, pads, mode=numpy_mode)  # type: ignore[call-overload]


register(OpDef("pad", _pad_shape, dtype_keep(), _pad, compute="native"))


def _tri(fn: Any) -> Any:
    def ref(x: np.ndarray, diagonal: int) -> np.ndarray:
        return fn(x, k=diagonal)
    return ref


register(OpDef("tril", lambda op, s, a: [s[0]], dtype_keep(), _tri(np.tril), compute="native"))
register(OpDef("triu", lambda op, s, a: [s[0]], dtype_keep(), _tri(np.triu), compute="native"))


# -- indexing by tensors ---------------------------------------------------------------------

def check_indices(op: str, idx: np.ndarray, size: int, dim: int) -> None:
    """Data-dependent bounds check, run when the indices are known."""
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= size:
            raise IndexOutOfRange(op, lo if lo < 0 else hi, size, dim)


def _index_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    from ..errors import DtypeMismatch
    if dtypes[1] not in (dt.int64, dt.int32):
        raise DtypeMismatch(op, dtypes, f"indices must be int64 or int32, got {dtypes[1].name}")
    return [dtypes[0]]


def _gather(x: np.ndarray, idx: np.ndarray, dim: int) -> np.ndarray:
    check_indices("gather", idx, x.shape[dim] if x.ndim else 1, dim)
    if x.ndim == 0:
        return x.copy()
    # Index may be smaller than x in dims other than dim (PyTorch semantics).
    sub = x[tuple(slice(0, n) if i != dim else slice(None) for i, n in enumerate(idx.shape))]
    return np.take_along_axis(sub, idx.astype(np.int64), axis=dim)


register(OpDef("gather", lambda op, s, a: [s[1]], _index_dtype, _gather, compute="native"))


def _index_select_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    x, idx, dim = shapes[0], shapes[1], attrs["dim"]
    return [x[:dim] + idx + x[dim + 1:]] if x else [()]


def _index_select(x: np.ndarray, idx: np.ndarray, dim: int) -> np.ndarray:
    check_indices("index_select", idx, x.shape[dim] if x.ndim else 1, dim)
    if x.ndim == 0:
        return x.copy()
    return np.take(x, idx.astype(np.int64), axis=dim)


register(OpDef("index_select", _index_select_shape, _index_dtype, _index_select, compute="native"))


def _index_copy_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    _index_dtype(op, dtypes[:2], attrs)
    return [same_dtypes(op, [dtypes[0], dtypes[2]])]


def _index_copy(x: np.ndarray, idx: np.ndarray, src: np.ndarray, dim: int) -> np.ndarray:
    """The target ``x`` with its rows along ``dim`` at ``idx`` replaced by ``src``'s (the
    last of equal indices wins; PyTorch leaves which unspecified)."""
    check_indices("index_copy", idx, x.shape[dim], dim)
    out = x.copy()
    out[(slice(None),) * dim + (idx.astype(np.int64),)] = src
    return out


#: ``x.index_copy_(dim, index, source)`` (and ``x[index] = v``): a write into x's storage,
#: its inputs the target (as read: the reference returns it whole), the 1-d index and
#: the source; compiled as a scatter (``schedule/fuse.py``: stores at checked rows).
register(OpDef("index_copy", lambda op, s, a: [s[0]], _index_copy_dtype, _index_copy, compute="native", inplace=True))


def _one_hot_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    return [shapes[0] + (attrs["num_classes"],)]


def _one_hot_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    require(op, dtypes[0], "int uint", dtypes)
    return [dt.int64]


def _one_hot(x: np.ndarray, num_classes: int) -> np.ndarray:
    check_indices("one_hot", x, num_classes, -1)
    return (x[..., None] == np.arange(num_classes)).astype(np.int64)


register(OpDef("one_hot", _one_hot_shape, _one_hot_dtype, _one_hot, compute="native"))


# -- matmul: the extern kernel (BLAS through numpy) -------------------------------------------

def _matmul_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    a, b = shapes
    return [a[:-1] + b[-1:]]


def _matmul_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    d = same_dtypes(op, dtypes)
    require(op, d, "float int uint", dtypes)
    return [d]


register(OpDef("matmul", _matmul_shape, _matmul_dtype, np.matmul))


# -- creation: no inputs ---------------------------------------------------------------------

def _out_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    return [attrs["shape"]]


def _out_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    return [attrs["dtype"]]


def _full(shape: Shape, dtype: DType, value: Any) -> np.ndarray:
    return np.full(shape, value, dtype=dtype.np)


def _arange(shape: Shape, dtype: DType, start: float, step: float) -> np.ndarray:
    n = shape[0]
    if dtype.is_integer:
        return (int(start) + int(step) * np.arange(n, dtype=np.int64)).astype(dtype.np)
    return (start + step * np.arange(n, dtype=np.float64)).astype(dtype.np)


def _linspace(shape: Shape, dtype: DType, start: float, end: float) -> np.ndarray:
    return np.linspace(start, end, shape[0], dtype=np.float64).astype(dtype.np)


register(OpDef("full", _out_shape, _out_dtype, _full, compute="native"))
register(OpDef("arange", _out_shape, _out_dtype, _arange, compute="native"))
register(OpDef("linspace", _out_shape, _out_dtype, _linspace, compute="native"))
