"""Random tensors from seeded generators (numpy's PCG64), as ``torch.manual_seed``.

Random data is drawn when the op is called, not when the stream flushes, so a seeded
program gives the same numbers however its flushes fall.
"""

from __future__ import annotations

from math import prod
from typing import Any, Callable

import numpy as np

from . import dtypes as dt
from .device import CPU, Device, as_device
from .dtypes import as_dtype
from .errors import DtypeMismatch, InvalidArgument, OutOfMemory
from .layout import Layout
from .runtime import memory
from .storage import Storage, placed
from .tensor import Tensor, _shape_arg


class Generator:
    """A seeded source of random numbers; ``manual_seed`` resets it. numpy's generator
    is made on first use: importing numpy.random maps OpenSSL's libcrypto (through
    ``secrets``), 5 MiB of resident memory a program that draws nothing need not pay."""

    def __init__(self, seed: int | None = None) -> None:
        self._seed = seed
        self._rng: np.random.Generator | None = None

    def manual_seed(self, seed: int) -> "Generator":
        self._seed, self._rng = seed, None
        return self

    def initial_seed(self) -> int | None:
        return self._seed

    @property
    def numpy(self) -> np.random.Generator:
        if self._rng is None:
            import numpy.random  # noqa: F401  (numpy loads the submodule on first attribute use too)
            self._rng = np.random.Generator(np.random.PCG64(self._seed))
        return self._rng


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed the default generator (what ``rand``/``randn`` use without ``generator=``)."""
    return default_generator.manual_seed(seed)


def _draw(op: str, nbytes: int, make: Callable[[], np.ndarray]) -> np.ndarray:
    """numpy's draw, its size checked against the budget first and its MemoryError
    (a size the machine cannot give) typed."""
    memory.check(nbytes, op)
    try:
        return make()
    except MemoryError:
        raise OutOfMemory(nbytes, memory.available(), "cpu", op=op) from None


def _wrap(arr: np.ndarray, dtype: dt.DType, device: Device = CPU) -> Tensor:
    """The draw as a tensor on ``device`` (drawn on the host, as PyTorch's CPU generator is)."""
    arr = np.asarray(arr.astype(dtype.np), order="C")  # (ascontiguousarray would make 0-d 1-d)
    memory.adopt(arr)
    return Tensor(Storage(dtype, device, arr.size, placed(device, arr.reshape(-1), "random")), Layout.contiguous(arr.shape))


def _float_dtype(op: str, dtype: Any) -> dt.DType:
    d = as_dtype(dtype, op) if dtype is not None else dt.float32
    if not d.is_floating_point:
        raise DtypeMismatch(op, [d], "expects a floating dtype")
    return d


def rand(*size: Any, generator: Generator | None = None, dtype: Any = None, device: Any = None) -> Tensor:
    """Uniform on [0, 1)."""
    dev = as_device(device, "rand")
    d = _float_dtype("rand", dtype)
    shape = _shape_arg("rand", size)
    rng = (generator or default_generator).numpy
    u = _draw("rand", prod(shape) * d.itemsize, lambda: rng.random(shape, dtype=np.float64 if d is dt.float64 else np.float32))
    if d.is_half:
        # Rounding a float32 draw to a half type can give 1.0; draw on the type's grid
        # instead (k / 2**bits, bits = significand width), as PyTorch does.
        bits = 11 if d is dt.float16 else 8
        u = np.floor(u * np.float32(2 ** bits)) / np.float32(2 ** bits)
    return _wrap(u, d, dev)


def randn(*size: Any, generator: Generator | None = None, dtype: Any = None, device: Any = None) -> Tensor:
    """Standard normal."""
    dev = as_device(device, "randn")
    d = _float_dtype("randn", dtype)
    shape = _shape_arg("randn", size)
    rng = (generator or default_generator).numpy
    return _wrap(_draw("randn", prod(shape) * d.itemsize, lambda: rng.standard_normal(
        shape, dtype=np.float64 if d is dt.float64 else np.float32)), d, dev)


def randint(low: int, high: int | None = None, size: Any = (), *, generator: Generator | None = None,
            dtype: Any = None, device: Any = None) -> Tensor:
    """Integers uniform on [low, high)."""
    dev = as_device(device, "randint")
    if high is None:
        low, high = 0, low
    d = as_dtype(dtype, "randint") if dtype is not None else dt.int64
    shape = _shape_arg("randint", (size,) if not isinstance(size, (tuple, list)) else tuple(size))
    rng = (generator or default_generator).numpy
    if not (isinstance(low, (int, np.integer)) and isinstance(high, (int, np.integer))) or low >= high:
        raise InvalidArgument("randint", f"needs integers low < high, got low={low!r}, high={high!r}")
    return _wrap(_draw("randint", prod(shape) * d.itemsize, lambda: rng.integers(low, high, shape)), d, dev)


def rand_like(x: Tensor, *, generator: Generator | None = None, dtype: Any = None) -> Tensor:
    return rand(x.shape, generator=generator, dtype=dtype or x.dtype)


def randn_like(x: Tensor, *, generator: Generator | None = None, dtype: Any = None) -> Tensor:
    return randn(x.shape, generator=generator, dtype=dtype or x.dtype)


__all__ = ["Generator", "manual_seed", "rand", "randn", "randint", "rand_like", "randn_like", "default_generator"]
