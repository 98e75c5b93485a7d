"""A stand-in for ``cuda.bindings.driver`` over host memory, for the device-memory
runtime's bookkeeping on machines without a GPU: allocations are ctypes buffers at
their own addresses, copies are memmoves, and every call returns ``(error, value)`` as
the real bindings do. Kernels cannot run on it (Triton needs a real device), so tests
that use it exercise what braze does around kernels: pooling, accounting, host <->
device copies, views, the staged reference executor."""

from __future__ import annotations

import ctypes
from typing import Any


class FakeDriver:
    def __init__(self, capacity: int = 1 << 30) -> None:
        self.buffers: dict[int, Any] = {}
        self.capacity = capacity
        self.calls: list[str] = []

    def _used(self) -> int:
        return sum(ctypes.sizeof(b) for b in self.buffers.values())

    def cuInit(self, flags: int) -> tuple[int]:
        return (0,)

    def cuDeviceGet(self, i: int) -> tuple[int, int]:
        return 0, i

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple[int, int]:
        return 0, 1

    def cuCtxSetCurrent(self, ctx: int) -> tuple[int]:
        return (0,)

    def cuStreamCreate(self, flags: int) -> tuple[int, int]:
        return 0, 7

    def cuMemAlloc(self, n: int) -> tuple[int, int]:
        self.calls.append("alloc")
        if self._used() + n > self.capacity:
            return 2, 0  # CUDA_ERROR_OUT_OF_MEMORY
        buf = ctypes.create_string_buffer(n)
        self.buffers[ctypes.addressof(buf)] = buf
        return 0, ctypes.addressof(buf)

    def cuMemFree(self, ptr: int) -> tuple[int]:
        self.calls.append("free")
        del self.buffers[int(ptr)]
        return (0,)

    def _inside(self, ptr: int, n: int) -> None:
        assert any(a <= ptr and ptr + n <= a + ctypes.sizeof(b) for a, b in self.buffers.items()), \
            f"device access out of any allocation: 0x{ptr:x} + {n}"

    def cuMemcpyHtoDAsync(self, dst: int, src: int, n: int, stream: int) -> tuple[int]:
        self._inside(dst, n)
        ctypes.memmove(dst, src, n)
        return (0,)

    def cuMemcpyDtoHAsync(self, dst: int, src: int, n: int, stream: int) -> tuple[int]:
        self._inside(src, n)
        ctypes.memmove(dst, src, n)
        return (0,)

    def cuMemcpyDtoDAsync(self, dst: int, src: int, n: int, stream: int) -> tuple[int]:
        self._inside(src, n)
        self._inside(dst, n)
        ctypes.memmove(dst, src, n)
        return (0,)

    def cuStreamSynchronize(self, stream: int) -> tuple[int]:
        return (0,)

    def cuCtxSynchronize(self) -> tuple[int]:
        return (0,)

    def cuMemGetInfo(self) -> tuple[int, int, int]:
        return 0, self.capacity - self._used(), self.capacity
