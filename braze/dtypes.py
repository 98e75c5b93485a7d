"""The element types braze knows, each a thin wrapper over a numpy dtype.

numpy has no bfloat16, so braze uses ``ml_dtypes.bfloat16`` (the type JAX uses), imported
the first time bfloat16's numpy type is asked for: the import costs ~8 MiB of a process's
memory (its tables and shared library), as much as a twelfth of what ``braze generate``
holds on top of its model file, for a type most quantized models never use. Half
types (float16, bfloat16) are stored at their width but computed in float32 by the
reference executor, as PyTorch does on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy
import numpy as np

from .errors import Unsupported


@dataclass(frozen=True, eq=False)
class DType:
    """An element type. ``kind`` is "float", "int", "uint" or "bool"."""

    name: str
    np: np.dtype
    kind: str
    short: str
    #: (elements, bytes) per block for the block-quantized types (kind "block"), whose
    #: storage is the raw bytes of their blocks; None for element types
    block: tuple[int, int] | None = None
    #: bytes per element (the numpy type's, given where that type loads late)
    size: int = 0

    def __post_init__(self) -> None:
        if not self.size:
            object.__setattr__(self, "size", self.np.itemsize)

    @property
    def itemsize(self) -> int:
        return self.size

    @property
    def is_floating_point(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_block(self) -> bool:
        """Block-quantized (GGML Q4_0, Q4_K, ...): elements packed in blocks with their scales."""
        return self.block is not None

    def nbytes(self, n: int) -> int:
        """Bytes taken by ``n`` elements (for a block type, ``n`` fills whole blocks)."""
        if self.block is None:
            return n * self.size
        return n // self.block[0] * self.block[1]

    @property
    def is_half(self) -> bool:
        """Stored narrower than float32 and computed in float32."""
        return self in (float16, bfloat16)

    @property
    def compute(self) -> "numpy.dtype[Any]":
        """The numpy dtype the reference executor computes this dtype in."""
        return np.dtype(np.float32) if self.is_half else self.np

    def __repr__(self) -> str:
        return f"braze.{self.name}"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # The singleton by name (stored plans pickle dtypes): ``bool`` is ``bool_`` in
        # this module, so a name lookup of the attribute would fail for it.
        return as_dtype, (self.name,)


float32 = DType("float32", np.dtype(np.float32), "float", "f32")
float64 = DType("float64", np.dtype(np.float64), "float", "f64")
float16 = DType("float16", np.dtype(np.float16), "float", "f16")


class _LateDType(DType):
    """A dtype whose numpy type is imported the first time ``np`` is read (bfloat16's,
    from ml_dtypes: see the module's docstring)."""

    def __getattr__(self, attr: str) -> Any:  # only for attributes not set: ``np`` until loaded
        if attr != "np":
            raise AttributeError(attr)
        import ml_dtypes

        d = np.dtype(getattr(ml_dtypes, self.name))
        object.__setattr__(self, "np", d)
        return d


bfloat16 = _LateDType("bfloat16", cast(Any, None), "float", "bf16", None, 2)
object.__delattr__(bfloat16, "np")
int8 = DType("int8", np.dtype(np.int8), "int", "i8")
uint8 = DType("uint8", np.dtype(np.uint8), "uint", "u8")
int16 = DType("int16", np.dtype(np.int16), "int", "i16")
int32 = DType("int32", np.dtype(np.int32), "int", "i32")
int64 = DType("int64", np.dtype(np.int64), "int", "i64")
bool_ = DType("bool", np.dtype(np.bool_), "bool", "bool")

ALL: tuple[DType, ...] = (float32, float64, float16, bfloat16, int8, uint8, int16, int32, int64, bool_)
FLOATS: tuple[DType, ...] = (float32, float64, float16, bfloat16)
INTS: tuple[DType, ...] = (int8, uint8, int16, int32, int64)

_BY_NAME: dict[str, DType] = {}
for _d in ALL:
    _BY_NAME[_d.name] = _d
    _BY_NAME[_d.short] = _d
_BY_NAME.update(half=float16, float=float32, double=float64, long=int64, int=int32, bool_=bool_)
_BY_NP: dict[np.dtype, DType] = {d.np: d for d in ALL if d is not bfloat16}  # (its type may not be loaded)


def block_dtype(name: str, elements: int, nbytes: int) -> DType:
    """The block-quantized dtype ``name`` (made once; ``quant/formats.py`` makes one per
    GGML type): stored as the raw bytes of its blocks, ``elements`` per ``nbytes``."""
    d = _BY_NAME.get(name)
    if d is None:
        d = _BY_NAME[name] = DType(name, np.dtype(np.uint8), "block", name, (elements, nbytes))
    elif d.block != (elements, nbytes):
        raise Unsupported("block_dtype", f"{name} is already a dtype with another layout")
    return d


def from_numpy_dtype(dt: Any, op: str = "from_numpy") -> DType:
    """The braze dtype of a numpy dtype; raises Unsupported for types braze lacks."""
    t = np.dtype(dt).newbyteorder("=")
    d = bfloat16 if t.name == "bfloat16" and t == bfloat16.np else _BY_NP.get(t)
    if d is None:
        raise Unsupported(op, f"numpy dtype {np.dtype(dt)} has no braze dtype (supported: "
                          f"{', '.join(x.name for x in ALL)})")
    return d


def as_dtype(x: Any, op: str = "dtype") -> DType:
    """Accept a DType, its name ("float32", "f32", "half"), or a numpy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        d = _BY_NAME.get(x.removeprefix("braze.").removeprefix("torch."))
        if d is None:
            raise Unsupported(op, f"unknown dtype {x!r}")
        return d
    if x is bool:
        return bool_
    if x is float:
        return float32
    if x is int:
        return int64
    try:
        return from_numpy_dtype(x, op)
    except TypeError:
        raise Unsupported(op, f"unknown dtype {x!r}") from None
