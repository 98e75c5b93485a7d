"""Ops on weights that stay in their GGML blocks (block dtypes such as q4_k).

- ``qlinear(x, w)``: ``x @ w.T`` for x (M, K) float32 and w (N, K) in a block dtype, or
  float16/bfloat16 (weights kept in their file's type beside float32 activations).
  Compiled as a quantized matmul kernel (``codegen/quant.h``); its reference here
  dequantizes w with the numpy dequantizers and multiplies in float32.
- ``qembedding(w, ids)``: rows of a block-quantized (half, or float32) table at ids, as float32.
- ``dequantize(w)``: the whole tensor as float32 (``Tensor.to(float32)``).

A block tensor's rows are whole blocks; the functions that record these ops
(``tensor.qlinear`` ...) check that a view keeps them so (``check_block_rows``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import dtypes as dt
from ..dtypes import DType
from ..errors import DtypeMismatch, ShapeMismatch
from ..layout import Layout, Shape
from ..quant.dequant import dequantize as _dequantize_raw
from ..quant.formats import GGMLType, ggml_type
from .registry import OpDef, register
from .shape import check_indices

# float weights a quantized-matmul kernel reads beside float32 activations
FLOAT_WEIGHTS = {dt.float16.name: GGMLType.F16, dt.bfloat16.name: GGMLType.BF16, dt.float32.name: GGMLType.F32}


def weight_type(op: str, d: DType) -> GGMLType:
    """The GGML type of a weight operand, or a DtypeMismatch naming the op."""
    if d.is_block:
        return ggml_type(d)
    if d.name in FLOAT_WEIGHTS:
        return FLOAT_WEIGHTS[d.name]
    raise DtypeMismatch(op, [d], "the weight must be a block-quantized dtype (q4_0 ... q6_k) or a float type")


def check_block_rows(op: str, d: DType, layout: Layout) -> None:
    """A block tensor's view must keep whole blocks in contiguous rows: the last dim
    contiguous, a multiple of the block size, and every row starting on a block."""
    if d.block is None:
        return
    bs = d.block[0]
    lay = layout
    ok = lay.shape and lay.shape[-1] % bs == 0 and (lay.strides[-1] == 1 or lay.shape[-1] == 1) \
        and lay.offset % bs == 0 and all(s % bs == 0 for s, n in zip(lay.strides[:-1], lay.shape[:-1]) if n > 1)
    if not ok:
        raise ShapeMismatch(op, [lay.shape], f"a {d.name} view must keep whole blocks of {bs} in contiguous rows "
                                             f"(strides {lay.strides}, offset {lay.offset})")


def dequantize_rows(raw: np.ndarray, qtype: GGMLType, k: int) -> np.ndarray:
    """Float32 rows of width ``k`` from the bytes of block rows ``(..., bytes per row)``."""
    lead = raw.shape[:-1]
    return _dequantize_raw(np.ascontiguousarray(raw).reshape(-1), qtype, (*lead, k))


# -- qlinear -------------------------------------------------------------------------------

def _qlinear_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    x, w = shapes
    if len(x) != 2 or len(w) != 2 or x[1] != w[1]:
        raise ShapeMismatch(op, [x, w], "x (M, K) and w (N, K) must agree in K")
    return [(x[0], w[0])]


def _qlinear_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    if dtypes[0] is not dt.float32:
        raise DtypeMismatch(op, dtypes, "activations must be float32")
    weight_type(op, dtypes[1])
    return [dt.float32]


def _qlinear(x: np.ndarray, w: np.ndarray, qtype: str) -> np.ndarray:
    t = GGMLType[qtype]
    wf = dequantize_rows(w, t, x.shape[1]) if w.dtype == np.uint8 else w.astype(np.float32)
    return np.matmul(x, wf.T)


register(OpDef("qlinear", _qlinear_shape, _qlinear_dtype, _qlinear, compute="native"))


# -- qembedding ----------------------------------------------------------------------------

def _qembedding_shape(op: str, shapes: Sequence[Shape], attrs: dict[str, Any]) -> list[Shape]:
    w, ids = shapes
    if len(w) != 2 or len(ids) != 1:
        raise ShapeMismatch(op, [w, ids], "a (rows, dim) table and 1-d ids")
    return [(ids[0], w[1])]


def _qembedding_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    if not (dtypes[0].is_block or dtypes[0].is_half or dtypes[0] is dt.float32):
        raise DtypeMismatch(op, dtypes, "the table must be block-quantized, float16, bfloat16 or float32")
    if dtypes[1] not in (dt.int64, dt.int32):
        raise DtypeMismatch(op, dtypes, f"indices must be int64 or int32, got {dtypes[1].name}")
    return [dt.float32]


def _qembedding(w: np.ndarray, ids: np.ndarray, qtype: str, k: int) -> np.ndarray:
    check_indices("embedding", ids, w.shape[0], 0)
    rows = w[ids.astype(np.int64)]
    return dequantize_rows(rows, GGMLType[qtype], k) if w.dtype == np.uint8 else rows.astype(np.float32)


register(OpDef("qembedding", _qembedding_shape, _qembedding_dtype, _qembedding, compute="native"))


# -- dequantize ----------------------------------------------------------------------------

def _dequantize_dtype(op: str, dtypes: Sequence[DType], attrs: dict[str, Any]) -> list[DType]:
    if not dtypes[0].is_block:
        raise DtypeMismatch(op, dtypes, "expects a block-quantized tensor")
    return [dt.float32]


def _dequantize(w: np.ndarray, qtype: str, k: int) -> np.ndarray:
    return dequantize_rows(w, GGMLType[qtype], k)


register(OpDef("dequantize", lambda op, s, a: [s[0]], _dequantize_dtype, _dequantize, compute="native"))
