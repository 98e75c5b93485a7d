"""The cuda device's memory: device buffers on a GPU, host arrays under the interpreter.

On a GPU a cuda storage's array is a ``DeviceArray``: a typed view of a block of device
memory taken with ``cuMemAlloc`` (NVIDIA's ``cuda.bindings``), never touched by numpy.
Blocks are pooled by the host pool's size classes (``memory.size_class``): a freed block
goes back to its class's free list when the last view of it dies, since ``cuMemAlloc``
and ``cuMemFree`` synchronise the device. Every byte is counted by the host's
accounting (``braze.stats()``'s ``live_bytes``/``peak_bytes``, the budget of
``set_memory_limit``); past the budget, or past what the GPU has free, an allocation
raises ``OutOfMemory`` naming the cuda device.

All work goes on one stream of braze's own (``stream()``): kernels (Triton is told to
launch on it), copies and graphs. A block freed while kernels that read it are still
queued is safe to reuse: anything that reuses it is queued after them on the same
stream. Host -> device copies from pageable memory return once the source is staged;
device -> host copies wait for the stream.

Under Triton's interpreter (no GPU) the same functions deal in host arrays from the
host pool, so the rest of braze sees one interface either way.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..errors import BrazeError, OutOfMemory
from ..stats import COUNTERS
from . import memory
from .cuda_probe import interpreting

_driver: Any = None
_stream: int = 0
_free: dict[int, list[int]] = {}
_free_bytes = 0


def check(result: Any) -> Any:
    """The value of a ``cuda.bindings.driver`` call, raising on its error code."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise BrazeError(f"cuda driver call failed: {name}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def driver() -> Any:
    """``cuda.bindings.driver`` with the GPU's primary context current and braze's stream
    made (once per process); Triton shares that context."""
    global _driver, _stream
    if _driver is None:
        from cuda.bindings import driver as d
        check(d.cuInit(0))
        dev = check(d.cuDeviceGet(0))
        ctx = check(d.cuDevicePrimaryCtxRetain(dev))
        check(d.cuCtxSetCurrent(ctx))
        _stream = int(check(d.cuStreamCreate(0)))  # blocking: ordered after the legacy default stream's work
        _driver = d
    return _driver


def stream() -> int:
    """braze's stream on the GPU (its handle), made on first use."""
    driver()
    return _stream


class _Block:
    """One pooled allocation; back on its free list when nothing refers to it."""

    __slots__ = ("ptr", "size", "__weakref__")

    def __init__(self, ptr: int, size: int) -> None:
        self.ptr, self.size = ptr, size


class DeviceArray:
    """A flat typed array in device memory: what a cuda storage holds on a GPU. It has
    numpy's few attributes that braze reads of a storage's array (``dtype``, ``size``,
    ``itemsize``, ``nbytes``) and the device address ``ptr``; its data is reached only
    through kernels and the copies below."""

    __slots__ = ("block", "ptr", "dtype", "size", "itemsize", "nbytes", "__weakref__")

    def __init__(self, block: _Block, dtype: np.dtype, size: int) -> None:
        self.block, self.ptr = block, block.ptr
        self.dtype, self.size = dtype, size
        self.itemsize = dtype.itemsize
        self.nbytes = size * dtype.itemsize

    def __repr__(self) -> str:
        return f"DeviceArray({self.dtype}, {self.size}, 0x{self.ptr:x})"


def _give_back(ptr: int, size: int) -> None:
    global _free_bytes
    _free.setdefault(size, []).append(ptr)
    _free_bytes += size


def _device_free() -> int:
    free, _total = check(driver().cuMemGetInfo())
    return int(free)


def _release_free() -> None:
    """Hand every free pooled block back to the driver (when an allocation fails)."""
    global _free_bytes
    d = driver()
    check(d.cuCtxSynchronize())  # a free block may still be read by a queued kernel
    for ptrs in _free.values():
        for p in ptrs:
            check(d.cuMemFree(p))
    _free.clear()
    _free_bytes = 0


def _block(nbytes: int, op: str | None) -> _Block:
    global _free_bytes
    size = memory.size_class(max(nbytes, 1))
    ptrs = _free.get(size)
    if ptrs:
        ptr = ptrs.pop()
        _free_bytes -= size
        COUNTERS["pool_hits"] += 1
    else:
        d = driver()
        err, ptr = d.cuMemAlloc(size)
        if int(err) != 0:
            _release_free()
            err, ptr = d.cuMemAlloc(size)
            if int(err) != 0:
                raise OutOfMemory(nbytes, _device_free(), "cuda", op=op)
        ptr = int(ptr)
        COUNTERS["allocations"] += 1
        COUNTERS["bytes_allocated"] += size
    block = _Block(ptr, size)
    weakref.finalize(block, _give_back, ptr, size)
    return block


def on_gpu() -> bool:
    """Does the cuda device keep its data in device memory (not the interpreter's host)?"""
    return not interpreting()


def allocate(dtype: Any, numel: int, op: str | None = None) -> Any:
    """An uninitialised cuda buffer of ``numel`` elements: a DeviceArray on a GPU, a host
    array under the interpreter."""
    dtype = np.dtype(dtype)
    if not on_gpu():
        return memory.allocate(dtype, numel, op)
    nbytes = numel * dtype.itemsize
    memory.check(nbytes, op)
    arr = DeviceArray(_block(nbytes, op), dtype, numel)
    memory.track(arr, nbytes)
    return arr


def view(arena: Any, at: int, dtype: Any, numel: int) -> Any:
    """``numel`` elements of ``dtype`` at byte ``at`` of a uint8 cuda buffer; the buffer
    lives as long as any view of it."""
    dtype = np.dtype(dtype)
    if not isinstance(arena, DeviceArray):
        return arena[at:at + numel * dtype.itemsize].view(dtype)
    v = DeviceArray(arena.block, dtype, numel)
    v.ptr = arena.ptr + at
    return v


def upload(host: np.ndarray, op: str | None = None) -> Any:
    """A cuda buffer holding a copy of ``host`` (flattened, C order)."""
    host = np.ascontiguousarray(host).reshape(-1)
    buf = allocate(host.dtype, host.size, op)
    if isinstance(buf, DeviceArray):
        if host.nbytes:
            check(driver().cuMemcpyHtoDAsync(buf.ptr, host.ctypes.data, host.nbytes, _stream))
    else:
        buf[...] = host
    return buf


def fill(dst: Any, host: np.ndarray) -> None:
    """Overwrite a cuda buffer with ``host`` (as many elements), queued on the stream."""
    if not isinstance(dst, DeviceArray):
        dst[:host.size] = host.reshape(-1)
    elif host.nbytes:
        host = np.ascontiguousarray(host)
        check(driver().cuMemcpyHtoDAsync(dst.ptr, host.ctypes.data, host.nbytes, _stream))


def download(buf: Any, start: int = 0, count: int | None = None) -> np.ndarray:
    """Elements ``start .. start + count`` of a cuda buffer, as a fresh host array (waits
    for the stream: the copy is ordered after every kernel queued before it)."""
    count = buf.size - start if count is None else count
    if not isinstance(buf, DeviceArray):
        return np.array(buf[start:start + count])
    out = np.empty(count, buf.dtype)
    if count:
        d = driver()
        check(d.cuMemcpyDtoHAsync(out.ctypes.data, buf.ptr + start * buf.itemsize, out.nbytes, _stream))
        check(d.cuStreamSynchronize(_stream))
    return out


def copy(dst: Any, dst_start: int, src: Any, src_start: int, count: int) -> None:
    """Device -> device copy of ``count`` elements, queued on the stream."""
    if not isinstance(dst, DeviceArray):
        dst[dst_start:dst_start + count] = src[src_start:src_start + count]
        return
    if count:
        check(driver().cuMemcpyDtoDAsync(dst.ptr + dst_start * dst.itemsize, src.ptr + src_start * src.itemsize,
                                       count * dst.itemsize, _stream))


def synchronize() -> None:
    """Wait for everything queued on braze's stream (nothing to wait for without a GPU)."""
    if on_gpu() and _driver is not None:
        check(_driver.cuStreamSynchronize(_stream))


def pool_clear() -> None:
    """Free every pooled device block (tests, and a user who wants the memory back)."""
    if _driver is not None:
        _release_free()


def free_bytes() -> int:
    """Device bytes held by the pool's free lists (``braze.stats()`` reports them)."""
    return _free_bytes
