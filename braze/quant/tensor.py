"""``BlockTensor``: a quantised tensor left in its packed GGML blocks.

Readers hand quantised weights out in this form, zero-copy over the file's mmap,
so that a model can keep 4-bit weights in 4 bits and only quantised matmul kernels
(or ``dequantize()`` for reference/testing) ever touch the values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from braze.errors import DtypeMismatch, ShapeMismatch
from braze.quant.dequant import dequantize, expected_nbytes
from braze.quant.formats import BLOCK_DTYPES, TYPE_SIZES, GGMLType


@dataclass(frozen=True)
class BlockTensor:
    """Packed blocks of a GGML-typed tensor.

    ``shape`` is row-major (PyTorch order): the last dim is contiguous and is a
    multiple of the block size, so each row is a whole number of blocks.  ``raw`` is
    the 1-D uint8 bytes of all blocks in order (usually a read-only mmap view).
    """

    qtype: GGMLType
    shape: tuple[int, ...]
    raw: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "qtype", GGMLType(self.qtype))
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.raw.dtype != np.uint8 or self.raw.ndim != 1:
            raise DtypeMismatch("BlockTensor", [self.raw.dtype], "raw must be a 1-D uint8 array")
        need = expected_nbytes(self.qtype, self.shape)
        if self.raw.size != need:
            raise ShapeMismatch(
                "BlockTensor",
                [self.shape, self.raw.shape],
                f"{self.qtype.name} needs {need} bytes, got {self.raw.size}",
            )

    @property
    def block_size(self) -> int:
        """Elements per block."""
        return TYPE_SIZES[self.qtype][0]

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return TYPE_SIZES[self.qtype][1]

    @property
    def nbytes(self) -> int:
        """Bytes of packed data (what the tensor costs in memory)."""
        return int(self.raw.size)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def blocks(self) -> np.ndarray:
        """The blocks, zero-copy, shaped ``(*shape[:-1], shape[-1] // block_size)``.

        Quantised types give a structured array whose fields are the C struct's
        (``blocks["d"]``, ``blocks["qs"]``...); plain types a ``(..., n, type_size)``
        uint8 array, one row of bytes per element.
        """
        lead = self.shape[:-1] if self.shape else ()
        n_last = (self.shape[-1] if self.shape else 1) // self.block_size
        if self.qtype in BLOCK_DTYPES:
            return self.raw.view(BLOCK_DTYPES[self.qtype]).reshape(*lead, n_last)
        return self.raw.reshape(*lead, n_last, self.type_size)

    def dequantize(self) -> np.ndarray:
        """Float32 values with ``shape`` (a new array; F32 may come back as a view)."""
        return dequantize(self.raw, self.qtype, self.shape)

    def __repr__(self) -> str:
        return f"BlockTensor({self.qtype.name}, shape={self.shape}, nbytes={self.nbytes})"
