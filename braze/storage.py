"""Storage: the flat memory behind one or more tensors.

A tensor is a Layout over a Storage. Views share the Storage object, so
``shares_storage`` is an identity test and a write through any view is seen by all.
A Storage is *pending* while the node that produces it waits on the stream, and
*realised* once its flat numpy array exists. A flush that fails poisons the storages
it could not produce, so reading them raises that error instead of garbage.
"""

from __future__ import annotations

import itertools
from math import prod
from typing import Any

import numpy as np

from .device import Device
from .dtypes import DType
from .errors import BrazeError
from .layout import contiguous_strides
from .runtime import cuda_memory
from .runtime.memory import address_of

_ids = itertools.count()


class Storage:
    __slots__ = ("dtype", "device", "numel", "_array", "_address", "producer", "error", "readonly", "owner", "id",
                 "dirty", "__weakref__")

    def __init__(self, dtype: DType, device: Device, numel: int, array: np.ndarray | None = None,
                 *, readonly: bool = False, owner: Any = None) -> None:
        self.dtype = dtype
        self.device = device
        self.numel = numel
        self.array = array
        self.producer: Any = None  # the node that computes it (a stream.Node), while pending
        self.error: BaseException | None = None
        self.readonly = readonly
        self.owner = owner  # keeps what the array points into alive (an mmap, a file)
        self.dirty = False  # a write to it waits on the stream
        self.id = next(_ids)

    @staticmethod
    def next_id() -> int:
        """An id no storage has: every storage made before has a smaller one, every one
        made after a larger one (``jit`` tells what a call made by it)."""
        return next(_ids)

    @property
    def array(self) -> np.ndarray | None:
        return self._array

    @array.setter
    def array(self, array: np.ndarray | None) -> None:
        self._array = array
        self._address = 0

    def bind(self, array: np.ndarray, address: int) -> None:
        """Set the array together with its known address (a view into the arena)."""
        self._array = array
        self._address = address

    def address(self) -> int:
        """The address of the array's first element, for a kernel's argument list: found
        once per array (``memory.address_of``)."""
        if not self._address:
            self._address = address_of(self.data())
        return self._address

    @property
    def realized(self) -> bool:
        return self.array is not None

    def data(self) -> np.ndarray:
        """The flat array; raises the error of the flush that failed to produce it."""
        if self._array is None:
            if self.error is not None:
                raise BrazeError(f"this tensor was not computed because an earlier flush failed: {self.error}")
            raise BrazeError("internal: storage read before it was computed")
        return self._array

    def __repr__(self) -> str:
        state = "realized" if self.array is not None else "pending"
        return f"Storage(#{self.id}, {self.dtype.name}, {self.numel}, {state})"


def placed(device: Device, flat: np.ndarray, op: str) -> Any:
    """``flat`` (a fresh host array braze owns) as the array of a storage on ``device``:
    itself on the CPU and under Triton's interpreter, a copy in device memory on a GPU."""
    if device.type == "cpu" or not cuda_memory.on_gpu():
        return flat
    return cuda_memory.upload(flat, op)


def host_view(array: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> np.ndarray:
    """A read-only host view of a layout over a storage's array; device memory is first
    copied back, only the span the layout covers."""
    if isinstance(array, np.ndarray):
        return strided(array, shape, strides, offset)
    if 0 in shape:
        return np.empty(shape, dtype=array.dtype)
    lo = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + 1
    return strided(cuda_memory.download(array, lo, hi - lo), shape, strides, offset - lo)


def strided(array: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...], offset: int,
            writeable: bool = False) -> np.ndarray:
    """A numpy view of ``array`` (flat) with element strides and offset: zero-copy."""
    if 0 in shape:
        return np.empty(shape, dtype=array.dtype)
    if offset == 0 and strides == contiguous_strides(shape) and array.size == prod(shape) and array.flags.c_contiguous:
        view = array.reshape(shape)  # the whole array in order: a tenth of the general view's cost
    else:
        item = array.itemsize
        view = np.ndarray(shape, array.dtype, buffer=array, offset=(offset * item),
                          strides=tuple(s * item for s in strides))
    if not writeable and view.flags.writeable:
        view.flags.writeable = False
    return view


def block_bytes(array: np.ndarray, dtype: DType, shape: tuple[int, ...], strides: tuple[int, ...],
                offset: int) -> np.ndarray:
    """The bytes of a block-quantized view, shaped ``(*shape[:-1], bytes per row)``:
    rows are whole blocks (the last dim contiguous, offset and row strides at block
    boundaries, which every op that takes such a tensor checks), so each row's bytes
    are a contiguous run and the view is zero-copy."""
    assert dtype.block is not None
    lead = shape[:-1]
    row = dtype.nbytes(shape[-1]) if shape else dtype.block[1]
    if 0 in shape:
        return np.empty(lead + (row,), np.uint8)
    return np.ndarray(lead + (row,), np.uint8, buffer=array, offset=dtype.nbytes(offset),
                      strides=tuple(dtype.nbytes(s) for s in strides[:-1]) + (1,))
