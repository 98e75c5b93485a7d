"""Creation: tensors from data, from numpy, filled, ranges.

Each records one node (or wraps an array without copying); sizes are checked here,
before anything is recorded."""

from __future__ import annotations

import builtins as _b
import math
from math import prod
from typing import Any, Sequence

import numpy as np

from . import dtypes as dt
from .device import CPU, as_device
from .dtypes import DType, as_dtype
from .errors import DtypeMismatch, ShapeMismatch, Unsupported
from .layout import Layout
from .runtime import cuda_memory, memory
from .storage import Storage, placed
from .tensor import Scalar, Tensor, _record, _record_on, _scalar_value, _shape_arg, from_numpy

# -- creation ------------------------------------------------------------------------------

def _creation_dtype(dtype: Any, default: DType) -> DType:
    return default if dtype is None else as_dtype(dtype, "dtype")



def from_dlpack(obj: Any) -> Tensor:
    """Import any DLPack producer (a numpy array, a torch CPU tensor, ...) without copying."""
    return from_numpy(np.from_dlpack(obj))


def _infer_dtype(data: Any) -> DType:
    flat = np.asarray(data)
    if flat.dtype.kind == "b":
        return dt.bool_
    if flat.dtype.kind in "iu":
        return dt.int64
    if flat.dtype.kind == "f":
        return dt.float32
    raise Unsupported("tensor", f"cannot make a tensor from {type(data).__name__} ({flat.dtype})")


def tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested lists, scalars, numpy arrays,
    tensors). Python floats default to float32 and ints to int64, as in PyTorch; a
    numpy array keeps its dtype."""
    dev = as_device(device, "tensor")
    if isinstance(data, Tensor):
        data = data.numpy()
    if isinstance(data, np.ndarray):
        d = _creation_dtype(dtype, dt.from_numpy_dtype(data.dtype, "tensor"))
        arr = np.array(data, dtype=d.np, copy=True)
    else:
        try:
            d = _creation_dtype(dtype, _infer_dtype(data))
            arr = np.array(data, dtype=d.np if not d.is_half else np.float64).astype(d.np)
        except (ValueError, TypeError) as e:
            raise Unsupported("tensor", f"cannot make a tensor from this data: {e}") from None
    # Not np.ascontiguousarray: it turns a 0-d array into shape (1,), and
    # ``braze.tensor(3.5)`` must be 0-d, as in PyTorch.
    arr = np.require(arr, requirements="C")
    memory.check(arr.nbytes, "tensor")
    memory.adopt(arr)
    return Tensor(Storage(d, dev, arr.size, placed(dev, arr.reshape(-1), "tensor")), Layout.contiguous(arr.shape))


def full(size: Any, fill_value: Scalar, *, dtype: Any = None, device: Any = None) -> Tensor:
    dev = as_device(device, "full")
    shape = _shape_arg("full", (size,) if not isinstance(size, (tuple, list)) else tuple(size))
    if dtype is None:
        dtype = dt.bool_ if isinstance(fill_value, bool) else dt.int64 if isinstance(fill_value, int) else dt.float32
    d = as_dtype(dtype, "full")
    return _record_on(dev, "full", [], dict(shape=shape, dtype=d, value=_scalar_value("full", fill_value, d)))


def zeros(*size: Any, dtype: Any = None, device: Any = None) -> Tensor:
    return full(_shape_arg("zeros", size), 0, dtype=_creation_dtype(dtype, dt.float32), device=device)


def ones(*size: Any, dtype: Any = None, device: Any = None) -> Tensor:
    return full(_shape_arg("ones", size), 1, dtype=_creation_dtype(dtype, dt.float32), device=device)


def empty(*size: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """Uninitialised memory, allocated now (its contents are whatever was there)."""
    dev = as_device(device, "empty")
    shape = _shape_arg("empty", size)
    d = _creation_dtype(dtype, dt.float32)
    alloc = memory.allocate if dev.type == "cpu" else cuda_memory.allocate
    arr = alloc(d.np, prod(shape), "empty")
    return Tensor(Storage(d, dev, prod(shape), arr), Layout.contiguous(shape))


def zeros_now(*size: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """``zeros`` allocated and filled at once on the CPU, recording nothing: for buffers
    made once and then written in place (KV caches), whose recorded fill would be the
    first thing a cold process compiles and waits on. On another device, ``zeros``."""
    dev = as_device(device, "zeros")
    if dev.type != "cpu":
        return zeros(*size, dtype=dtype, device=dev)
    t = empty(*size, dtype=dtype, device=dev)
    arr = t._storage.array
    assert arr is not None  # empty allocates now
    arr.fill(0)
    return t


def zeros_untouched(*size: Any, dtype: Any = None) -> Tensor:
    """Zeros on the CPU, recording nothing, whose pages stay out of memory until written
    (``memory.zeroed``): for a big buffer of which only what is in use is written (a
    paged KV pool), where ``zeros_now`` would make all of it resident at once."""
    shape = _shape_arg("zeros", size)
    d = _creation_dtype(dtype, dt.float32)
    return Tensor(Storage(d, CPU, prod(shape), memory.zeroed(d.np, prod(shape), "zeros")), Layout.contiguous(shape))


def zeros_like(x: Tensor, *, dtype: Any = None) -> Tensor:
    return zeros(x.shape, dtype=dtype or x.dtype)


def ones_like(x: Tensor, *, dtype: Any = None) -> Tensor:
    return ones(x.shape, dtype=dtype or x.dtype)


def full_like(x: Tensor, fill_value: Scalar, *, dtype: Any = None) -> Tensor:
    return full(x.shape, fill_value, dtype=dtype or x.dtype)


def empty_like(x: Tensor, *, dtype: Any = None) -> Tensor:
    return empty(x.shape, dtype=dtype or x.dtype)


def arange(start: Scalar, end: Scalar | None = None, step: Scalar = 1, *, dtype: Any = None,
           device: Any = None) -> Tensor:
    dev = as_device(device, "arange")
    if end is None:
        start, end = 0, start
    if step == 0:
        raise Unsupported("arange", "step must be non-zero")
    all_int = _b.all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    d = _creation_dtype(dtype, dt.int64 if all_int else dt.float32)
    span = (end - start) / step
    if not math.isfinite(span):
        raise Unsupported("arange", f"start, end and step must be finite, got {start}, {end}, {step}")
    n = _b.max(0, math.ceil(span))
    return _record_on(dev, "arange", [], dict(shape=(n,), dtype=d, start=start, step=step))


def linspace(start: float, end: float, steps: int, *, dtype: Any = None, device: Any = None) -> Tensor:
    dev = as_device(device, "linspace")
    if steps < 0:
        raise ShapeMismatch("linspace", [(steps,)], "steps must be non-negative")
    d = _creation_dtype(dtype, dt.float32)
    out = _record_on(CPU, "linspace", [], dict(shape=(int(steps),), dtype=d, start=float(start), end=float(end)))
    # linspace has no kernel (an extern op): made on the host and copied, as a random draw is
    return out if dev == CPU else out.to(dev)


def from_blocks(raw: np.ndarray, dtype: DType, shape: Sequence[int], owner: Any = None) -> Tensor:
    """A block-quantized tensor over ``raw`` (the uint8 bytes of its blocks, in order),
    without copying: quantized weights stay in the file's memory map."""
    shape = tuple(int(n) for n in shape)
    if not dtype.is_block:
        raise DtypeMismatch("from_blocks", [dtype], "expects a block-quantized dtype")
    if not shape or shape[-1] % dtype.block[0]:  # type: ignore[index]
        raise ShapeMismatch("from_blocks", [shape], f"the last dim must be a multiple of {dtype.block[0]}")  # type: ignore[index]
    need = dtype.nbytes(prod(shape))
    if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size != need:
        raise ShapeMismatch("from_blocks", [shape, raw.shape], f"{dtype.name} {shape} needs {need} bytes as 1-d uint8")
    return Tensor(Storage(dtype, CPU, need, raw, readonly=not raw.flags.writeable, owner=owner),
                  Layout.contiguous(shape))


__all__ = ["from_numpy", "from_dlpack", "tensor", "full", "zeros", "zeros_now", "ones", "empty", "zeros_like",
           "ones_like", "full_like", "empty_like", "arange", "linspace"]
