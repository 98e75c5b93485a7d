"""Whether an array a file reader returned is read in place from the mapped file (the
io tests' check that ``braze.io`` copies nothing)."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np


def backed_by_mmap(a: np.ndarray) -> bool:
    """True when ``a`` is a view whose base chain ends in an mmap (no copy was made)."""
    base: Any = a
    while isinstance(base, np.ndarray):
        if base.flags.owndata:
            return False
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)
