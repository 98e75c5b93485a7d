"""GGML tensor types: their numbering, block geometry and byte layout.

The numbering is the on-disk ``ggml_type`` id used by GGUF files, so it must never
be renumbered.  Every type stores its elements in *blocks*: ``block_size`` elements
packed into ``type_size`` bytes.  Plain types (F32, I8, ...) are blocks of one
element.  The structured dtypes below spell out each quantised block field by field,
so readers and kernels can address ``blocks["d"]`` instead of magic byte offsets.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from .. import dtypes as dt
from ..dtypes import DType

QK_K = 256
"""Elements per super-block of the K-quants."""


class GGMLType(IntEnum):
    """On-disk GGML tensor type ids (``ggml_type``), as written in GGUF tensor infos."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    BF16 = 30


def _packed(*fields: tuple) -> np.dtype:
    """A structured dtype with no padding: GGML blocks are byte-packed C structs."""
    return np.dtype(list(fields), align=False)


# One entry per quantised type, field order and widths exactly as ggml's C structs.
BLOCK_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.Q4_0: _packed(("d", "<f2"), ("qs", "u1", (16,))),
    GGMLType.Q4_1: _packed(("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))),
    GGMLType.Q5_0: _packed(("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))),
    GGMLType.Q5_1: _packed(("d", "<f2"), ("m", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))),
    GGMLType.Q8_0: _packed(("d", "<f2"), ("qs", "i1", (32,))),
    GGMLType.Q8_1: _packed(("d", "<f2"), ("s", "<f2"), ("qs", "i1", (32,))),
    GGMLType.Q2_K: _packed(
        ("scales", "u1", (QK_K // 16,)), ("qs", "u1", (QK_K // 4,)), ("d", "<f2"), ("dmin", "<f2")
    ),
    GGMLType.Q3_K: _packed(
        ("hmask", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 4,)), ("scales", "u1", (12,)), ("d", "<f2")
    ),
    GGMLType.Q4_K: _packed(
        ("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (QK_K // 2,))
    ),
    GGMLType.Q5_K: _packed(
        ("d", "<f2"),
        ("dmin", "<f2"),
        ("scales", "u1", (12,)),
        ("qh", "u1", (QK_K // 8,)),
        ("qs", "u1", (QK_K // 2,)),
    ),
    GGMLType.Q6_K: _packed(
        ("ql", "u1", (QK_K // 2,)), ("qh", "u1", (QK_K // 4,)), ("scales", "i1", (QK_K // 16,)), ("d", "<f2")
    ),
    GGMLType.Q8_K: _packed(("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (QK_K // 16,))),
}

# Plain (one element per block) types and their bytes per element (their braze dtypes
# are DTYPES' below, their numpy types plain_dtype's).
PLAIN_SIZES: dict[GGMLType, int] = {
    GGMLType.F32: 4, GGMLType.F16: 2, GGMLType.BF16: 2, GGMLType.F64: 8,
    GGMLType.I8: 1, GGMLType.I16: 2, GGMLType.I32: 4, GGMLType.I64: 8,
}

_QUANT_BLOCK_SIZE: dict[GGMLType, int] = {
    GGMLType.Q4_0: 32,
    GGMLType.Q4_1: 32,
    GGMLType.Q5_0: 32,
    GGMLType.Q5_1: 32,
    GGMLType.Q8_0: 32,
    GGMLType.Q8_1: 32,
    GGMLType.Q2_K: QK_K,
    GGMLType.Q3_K: QK_K,
    GGMLType.Q4_K: QK_K,
    GGMLType.Q5_K: QK_K,
    GGMLType.Q6_K: QK_K,
    GGMLType.Q8_K: QK_K,
}

# (elements per block, bytes per block) for every known type.
TYPE_SIZES: dict[GGMLType, tuple[int, int]] = {
    **{t: (1, n) for t, n in PLAIN_SIZES.items()},
    **{t: (_QUANT_BLOCK_SIZE[t], BLOCK_DTYPES[t].itemsize) for t in BLOCK_DTYPES},
}


def block_size(qtype: GGMLType) -> int:
    """Elements per block of ``qtype``."""
    return TYPE_SIZES[GGMLType(qtype)][0]


def type_size(qtype: GGMLType) -> int:
    """Bytes per block of ``qtype``."""
    return TYPE_SIZES[GGMLType(qtype)][1]


def is_quantized(qtype: GGMLType) -> bool:
    """True for block-quantised types (those that come out of a reader as ``BlockTensor``)."""
    return GGMLType(qtype) in BLOCK_DTYPES


def row_nbytes(qtype: GGMLType, n_elements: int) -> int:
    """Bytes taken by ``n_elements`` of ``qtype``; ``n_elements`` must fill whole blocks."""
    bs, ts = TYPE_SIZES[GGMLType(qtype)]
    if n_elements % bs:
        raise ValueError(
            f"{n_elements} elements is not a multiple of the {GGMLType(qtype).name} block size {bs}"
        )
    return n_elements // bs * ts


# The braze dtype a tensor of each GGML type has: quantized types stay in their blocks
# (a block dtype named like the type, "q4_k"), plain types are their element type.
DTYPES: dict[GGMLType, DType] = {
    **{t: dt.block_dtype(t.name.lower(), *TYPE_SIZES[t]) for t in BLOCK_DTYPES},
    GGMLType.F32: dt.float32, GGMLType.F16: dt.float16, GGMLType.BF16: dt.bfloat16, GGMLType.F64: dt.float64,
    GGMLType.I8: dt.int8, GGMLType.I16: dt.int16, GGMLType.I32: dt.int32, GGMLType.I64: dt.int64,
}
_BY_DTYPE: dict[str, GGMLType] = {d.name: t for t, d in DTYPES.items() if d.is_block}


def plain_dtype(qtype: GGMLType) -> np.dtype:
    """The numpy type a plain (F32, F16, BF16, ...) tensor's bytes are read as."""
    return DTYPES[GGMLType(qtype)].np


def ggml_type(dtype: DType) -> GGMLType:
    """The GGML type of a block dtype."""
    return _BY_DTYPE[dtype.name]
