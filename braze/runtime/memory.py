"""Host memory for tensor data, with accounting and an optional budget.

Every array braze allocates for tensor data comes from ``allocate`` or is handed over
with ``adopt``, so ``braze.stats()`` knows allocations, live bytes and the peak. An
allocation past the budget (``braze.set_memory_limit``) or past what the machine has
raises ``OutOfMemory`` with the requested and available bytes.
"""

from __future__ import annotations

import weakref

import numpy as np

from ..errors import OutOfMemory
from ..stats import COUNTERS

_limit: int | None = None


def set_memory_limit(nbytes: int | None) -> None:
    """Cap the bytes of tensor data braze may hold at once (None: no cap)."""
    global _limit
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


def check(nbytes: int, op: str | None = None) -> None:
    """Raise OutOfMemory now if ``nbytes`` cannot fit: used when an op is recorded, so
    an absurd request fails at the user's line rather than at the flush."""
    if _limit is not None and nbytes > available():
        raise OutOfMemory(nbytes, available(), "cpu", op=op)


def _release(nbytes: int) -> None:
    COUNTERS["live_bytes"] -= nbytes


def adopt(array: np.ndarray) -> np.ndarray:
    """Account for a fresh array braze now owns; it is released when freed."""
    n = array.nbytes
    COUNTERS["allocations"] += 1
    COUNTERS["bytes_allocated"] += n
    live = COUNTERS["live_bytes"] = COUNTERS["live_bytes"] + n
    if live > COUNTERS["peak_bytes"]:
        COUNTERS["peak_bytes"] = live
    weakref.finalize(array, _release, n)
    return array


def allocate(dtype: np.dtype, numel: int, op: str | None = None) -> np.ndarray:
    """A fresh flat array of ``numel`` elements, uninitialised."""
    nbytes = numel * np.dtype(dtype).itemsize
    check(nbytes, op)
    try:
        arr = np.empty(numel, dtype=dtype)
    except MemoryError:
        raise OutOfMemory(nbytes, available(), "cpu", op=op) from None
    return adopt(arr)
