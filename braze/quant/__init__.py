"""GGML quantisation formats: type table, reference dequantisers, ``BlockTensor``."""

from braze.quant.dequant import SUPPORTED_DEQUANT, dequantize
from braze.quant.formats import (
    BLOCK_DTYPES,
    DTYPES,
    PLAIN_SIZES,
    QK_K,
    TYPE_SIZES,
    GGMLType,
    block_size,
    ggml_type,
    is_quantized,
    plain_dtype,
    row_nbytes,
    type_size,
)
from braze.quant.tensor import BlockTensor

__all__ = [
    "BLOCK_DTYPES",
    "DTYPES",
    "PLAIN_SIZES",
    "QK_K",
    "SUPPORTED_DEQUANT",
    "TYPE_SIZES",
    "BlockTensor",
    "GGMLType",
    "block_size",
    "dequantize",
    "ggml_type",
    "is_quantized",
    "plain_dtype",
    "row_nbytes",
    "type_size",
]
