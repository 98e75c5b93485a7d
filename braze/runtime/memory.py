"""Host memory for tensor data, with accounting and an optional budget.

Every array braze allocates for tensor data comes from ``allocate`` or is handed over
with ``adopt``, so ``braze.stats()`` knows allocations, live bytes and the peak. An
allocation past the budget (``braze.set_memory_limit``) or past what the machine has
raises ``OutOfMemory`` with the requested and available bytes.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from typing import Any

import numpy as np

from ..errors import InvalidArgument, OutOfMemory
from ..stats import COUNTERS

_limit: int | None = None


def set_memory_limit(nbytes: int | None) -> None:
    """Cap the bytes of tensor data braze may hold at once (None: no cap)."""
    global _limit
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer))):
        raise InvalidArgument("set_memory_limit", f"expected a number of bytes (int) or None, got {nbytes!r}")
    if nbytes is not None and nbytes < 0:
        raise InvalidArgument("set_memory_limit", f"a limit of {nbytes} bytes is negative")
    _limit = None if nbytes is None else int(nbytes)


def memory_limit() -> int | None:
    return _limit


def _system_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def available() -> int:
    """Bytes that may still be allocated under the budget (or by the machine)."""
    if _limit is not None:
        return max(0, _limit - COUNTERS["live_bytes"])
    return _system_available()


def limited() -> bool:
    """Is there a budget to check requests against (``braze.set_memory_limit``)?"""
    return _limit is not None


_machine: int | None = None


def machine_bytes() -> int:
    """RAM and swap together: no request larger can ever be met, budget or not (read
    once; 2**63 when /proc says nothing)."""
    global _machine
    if _machine is None:
        total = 0
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith(("MemTotal:", "SwapTotal:")):
                        total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        _machine = total or 2**63
    return _machine


def check(nbytes: int, op: str | None = None) -> None:
    """Raise OutOfMemory now if ``nbytes`` cannot fit: used when an op is recorded, so
    an absurd request (or a shape whose size overflows) fails at the user's line rather
    than as numpy's MemoryError or ValueError at the flush."""
    if nbytes > machine_bytes() or (_limit is not None and nbytes > available()):
        raise OutOfMemory(nbytes, available(), "cpu", op=op)


#: each tracked array's weak reference (kept alive here, so its callback runs) and bytes,
#: by the reference's id: a tenth of ``weakref.finalize``'s cost, paid per allocation
_tracked: dict[int, tuple[weakref.ref[Any], int]] = {}


def _release(ref: weakref.ref[Any]) -> None:
    COUNTERS["live_bytes"] -= _tracked.pop(id(ref))[1]


def address_of(array: np.ndarray) -> int:
    """The address of an array's first element: through a ctypes view of its buffer (0.2
    us, against ~1 us for numpy's ``.ctypes.data``), numpy's own where the buffer is
    read-only, not contiguous or empty."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))  # type: ignore[arg-type]  # (numpy arrays are buffers)
    except (TypeError, ValueError, BufferError):
        return int(array.ctypes.data)


def adopt(array: np.ndarray) -> np.ndarray:
    """Account for a fresh array braze now owns; it is released when freed."""
    n = array.nbytes
    COUNTERS["allocations"] += 1
    COUNTERS["bytes_allocated"] += n
    track(array, n)
    return array


# -- the size-class pool --------------------------------------------------------------
# Freed buffers are kept, by size class, instead of going back to the OS: a page fault
# costs ~2 us per 4 KiB here, so a loop that allocates the same shapes every step would
# otherwise pay for fresh pages each time. A block is free when nothing but the pool
# refers to it (no storage, and no numpy view a user took of one): its reference count
# says so exactly, so a block a user still sees is never handed out again.

_POOL_MIN = 1 << 16  # smaller buffers come from numpy's own small-block allocator
_pool: dict[int, list[np.ndarray]] = {}
_pooled_bytes = 0
#: each pool block's address, by id (numpy's ``.ctypes.data`` costs ~1.5 us, and a
#: kernel's output asks for its block's every time); set when a block is made, so an
#: id a freed block had is given its new block's address
_address: dict[int, int] = {}


def _pool_cap() -> int:
    import os
    return int(os.environ.get("BRAZE_POOL_BYTES", str(2 << 30)))


def size_class(nbytes: int) -> int:
    """Round up to a multiple of an eighth of the next power of two: at most 25% slack."""
    size = _classes.get(nbytes)
    if size is None:
        top = 1 << (nbytes - 1).bit_length()
        quarter = top // 8
        size = -(-nbytes // quarter) * quarter if quarter else top
        if len(_classes) < 4096:  # (the sizes a program allocates recur: a few dozen)
            _classes[nbytes] = size
    return size


_classes: dict[int, int] = {}


def _take(size: int) -> np.ndarray | None:
    for block in _pool.get(size, ()):
        if sys.getrefcount(block) == 3:  # the list, the loop variable, the argument
            return block
    return None


def _trim(need: int) -> None:
    """Release free blocks to the OS until the pool plus ``need`` fits its cap."""
    global _pooled_bytes
    for size in sorted(_pool, reverse=True):
        blocks = _pool[size]
        for i in range(len(blocks) - 1, -1, -1):
            if _pooled_bytes + need <= _pool_cap():
                return
            if sys.getrefcount(blocks[i]) == 2:
                _address.pop(id(blocks[i]), None)
                del blocks[i]
                _pooled_bytes -= size


def pool_clear() -> None:
    """Forget every free block (tests; blocks in use stay with their users)."""
    global _pooled_bytes
    _pool.clear()
    _address.clear()
    _pooled_bytes = 0


def allocate(dtype: np.dtype, numel: int, op: str | None = None) -> np.ndarray:
    """A flat array of ``numel`` elements, uninitialised: from the pool when a free
    block of its size class exists (``pool_hits``), else fresh (``allocations``)."""
    return allocate_at(dtype, numel, op)[0]


def allocate_at(dtype: np.dtype, numel: int, op: str | None = None) -> tuple[np.ndarray, int]:
    """``allocate``'s array and the address of its first element (0 where not known
    without asking numpy: a small array), for ``Storage.bind``. Every kernel output of
    every flush comes through here: each step is spelled out, ~1 us in all."""
    if type(dtype) is not np.dtype:
        dtype = np.dtype(dtype)
    nbytes = numel * dtype.itemsize
    if _limit is not None or nbytes > (_machine or machine_bytes()):
        check(nbytes, op)
    if nbytes < _POOL_MIN:
        try:
            array = np.empty(numel, dtype=dtype)
        except MemoryError:
            raise OutOfMemory(nbytes, available(), "cpu", op=op) from None
        COUNTERS["allocations"] += 1
        COUNTERS["bytes_allocated"] += nbytes
        track(array, nbytes)
        return array, 0
    view, address = _aligned(_block(nbytes, op), nbytes)
    view = view.view(dtype)
    track(view, nbytes)
    return view, address


def zeroed(dtype: np.dtype, numel: int, op: str | None = None) -> np.ndarray:
    """A flat array of ``numel`` zeros in an anonymous mapping of its own, never from the
    pool: the OS supplies each page, zeroed, when it is first written, so the bytes
    nobody writes never become resident. For a big buffer written a part at a time (the
    server's paged KV pool, 257 MiB for SmolLM2, of which a few blocks are in use):
    filled up front, or taken from the pool, all of it was resident from the start.
    Page-aligned; unmapped when the array and every view of it are gone."""
    import mmap
    dtype = np.dtype(dtype)
    nbytes = numel * dtype.itemsize
    check(nbytes, op)
    try:
        buf = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE)  # (shared: counted as shmem, kept by a fork)
    except OSError:
        raise OutOfMemory(nbytes, available(), "cpu", op=op) from None
    return adopt(np.frombuffer(buf, dtype=np.uint8, count=nbytes).view(dtype))


#: the planner places a plan's buffers in its arena at multiples of this: a cache
#: line, and the widest vector load (streaming stores need 32-byte alignment)
ARENA_ALIGN = 64

#: pooled buffers (an arena among them) start on a page. Not merely on a cache line:
#: a kernel whose output starts a little past its input in the page (64 against
#: numpy's 16) has each load falsely wait on an earlier store to the same address
#: modulo 4 KiB (softmax over 4096 x 4096: 6-8% slower, measured); on a page, an
#: output is at or below any input's offset in it.
BLOCK_ALIGN = 4096


def _aligned(block: np.ndarray, nbytes: int, align: int = BLOCK_ALIGN) -> tuple[np.ndarray, int]:
    """The first ``nbytes`` of ``block`` from its first ``align`` boundary, and their
    address (a pool block's kept when it was made). Slicing gives a view whose base is
    the block itself (numpy collapses view chains), so the pool's reference count sees
    every view of it."""
    base = _address.get(id(block)) or address_of(block)
    shift = -base % align
    return block[shift:shift + nbytes], base + shift


def arena(nbytes: int) -> np.ndarray:
    """The bytes of one plan run's arena (``arena_at``'s array)."""
    return arena_at(nbytes)[0]


def arena_at(nbytes: int) -> tuple[np.ndarray, int]:
    """The bytes of one plan run's arena (its internal buffers at planned offsets): one
    block, from the pool like any buffer, aligned to ``BLOCK_ALIGN`` (a small one, fresh
    from numpy each run, to ``ARENA_ALIGN``: a page of slack per flush would cost more
    than it saves), and its address. The block goes back to the pool when the returned
    array and every view of it are gone."""
    check(nbytes, "arena")
    if nbytes < _POOL_MIN:
        try:
            base = np.empty(nbytes + ARENA_ALIGN, dtype=np.uint8)
        except MemoryError:
            raise OutOfMemory(nbytes, available(), "cpu", op="arena") from None
        COUNTERS["allocations"] += 1
        COUNTERS["bytes_allocated"] += base.nbytes
        view, address = _aligned(base, nbytes, ARENA_ALIGN)
    else:
        view, address = _aligned(_block(nbytes, "arena"), nbytes)
    # accounted for as long as the run holds the arena
    track(view, nbytes)
    return view, address


def _block(nbytes: int, op: str | None) -> np.ndarray:
    """A free pool block for ``nbytes`` (``pool_hits``), else a fresh one (``allocations``):
    its size class and ``BLOCK_ALIGN`` bytes more, to start a view on a boundary."""
    global _pooled_bytes
    size = size_class(nbytes)
    block = _take(size)
    if block is None:
        _trim(size)
        try:
            block = np.empty(size + BLOCK_ALIGN, dtype=np.uint8)
        except MemoryError:
            raise OutOfMemory(nbytes, available(), "cpu", op=op) from None
        COUNTERS["allocations"] += 1
        COUNTERS["bytes_allocated"] += size
        _address[id(block)] = address_of(block)
        _pool.setdefault(size, []).append(block)
        _pooled_bytes += size
    else:
        COUNTERS["pool_hits"] += 1
    return block


def track(array: object, nbytes: int) -> None:
    """Count ``nbytes`` live until ``array`` (a host array, or a device buffer) is freed."""
    live = COUNTERS["live_bytes"] = COUNTERS["live_bytes"] + nbytes
    if live > COUNTERS["peak_bytes"]:
        COUNTERS["peak_bytes"] = live
    ref = weakref.ref(array, _release)
    _tracked[id(ref)] = (ref, nbytes)
