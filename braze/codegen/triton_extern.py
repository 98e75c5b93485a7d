"""The extern nodes the cuda device runs as Triton kernels of their own: op name ->
renderer of the node (``EXTERN``), as the element ops have their rule tables.

Each renderer takes the node and a kernel name and returns the kernel (``Rendered``),
whose arguments are the node's inputs then its outputs, in order, each at its view's
offset (``runtime/cuda.py``); ``NotRendered`` says what it cannot take yet.
"""

from __future__ import annotations

from math import prod
from typing import Any, Callable

from .triton import NotRendered, Rendered
from .triton_gemm import gemm_source
from .triton_quant import qlinear_source, qrows_source


def _matmul(node: Any, name: str, interpret: bool) -> Rendered:
    a, b = node.inputs
    return gemm_source(a.layout, b.layout, node.outputs[0].storage.dtype, name, interpret)


def _qlinear(node: Any, name: str, interpret: bool) -> Rendered:
    x, w = node.inputs
    return qlinear_source(x.layout, w.layout, node.attrs["qtype"], name, interpret)


def _qembedding(node: Any, name: str, interpret: bool) -> Rendered:
    w, ids = node.inputs
    if ids.layout.strides[0] != 1 and ids.layout.shape[0] > 1:
        raise NotRendered("embedding ids that are not contiguous")
    return qrows_source(w.layout, node.attrs["qtype"], ids.layout.shape[0], name, ids=True, interpret=interpret)


def _dequantize(node: Any, name: str, interpret: bool) -> Rendered:
    w = node.inputs[0].layout
    return qrows_source(w, node.attrs["qtype"], prod(w.shape[:-1]), name, ids=False, interpret=interpret)


EXTERN: dict[str, Callable[[Any, str, bool], Rendered]] = {
    "matmul": _matmul,
    "qlinear": _qlinear,
    "qembedding": _qembedding,
    "dequantize": _dequantize,
}
