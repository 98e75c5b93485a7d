"""The reference executor: runs a flushed stream node by node with numpy.

It is the oracle every fused plan is tested against and the ``BRAZE_FUSION=0``
baseline, so it favours being exact over being fast: half types are computed in
float32, composite functions in float64, and each node's result is checked against
its meta function's shape. Nodes are consumed as they run, so an intermediate is freed
as soon as its last reader has run, as in eager execution.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..errors import BrazeError
from ..node import Node, Operand
from ..stats import COUNTERS
from ..storage import block_bytes, strided
from . import memory


def operand_array(operand: "Operand", writeable: bool = False) -> np.ndarray:
    """A zero-copy numpy view of an operand (of a block-quantized one: its rows' bytes)."""
    lay = operand.layout
    if operand.storage.dtype.is_block:
        return block_bytes(operand.storage.data(), operand.storage.dtype, lay.shape, lay.strides, lay.offset)
    return strided(operand.storage.data(), lay.shape, lay.strides, lay.offset, writeable)


def _inputs(node: "Node") -> list[np.ndarray]:
    args = [operand_array(o) for o in node.inputs]
    mode = node.op.compute
    if mode == "native":
        return args
    out = []
    for a, o in zip(args, node.inputs):
        if mode == "precise" and o.storage.dtype.is_floating_point:
            a = a.astype(np.float64)
        elif o.storage.dtype.is_half:
            a = a.astype(np.float32)
        out.append(a)
    return out


def _store(node: "Node", operand: "Operand", value: np.ndarray, args: list[np.ndarray]) -> None:
    lay = operand.layout
    storage = operand.storage
    value = np.asarray(value)
    if node.op.inplace:  # through the target's view (a block tensor's: its rows' bytes)
        target = operand_array(operand, writeable=True)
        if value.shape != target.shape:
            raise BrazeError(f"internal: {node.op.name} produced shape {value.shape}, expected {target.shape}")
        np.copyto(target, value, casting="unsafe")
        return
    if value.shape != lay.shape:
        raise BrazeError(f"internal: {node.op.name} produced shape {value.shape}, expected {lay.shape}")
    want = storage.dtype.np
    if value.dtype == want and value.flags.c_contiguous and value.base is None and value.size == storage.numel \
            and not any(value is a for a in args):
        storage.array = memory.adopt(value.reshape(-1))
    else:
        arr = memory.allocate(want, storage.numel, node.op.name)
        np.copyto(arr.reshape(lay.shape), value, casting="unsafe")
        storage.array = arr
    storage.producer = None


def run_node(node: "Node") -> None:
    """Execute one node (also how a fused plan runs its extern steps)."""
    args = _inputs(node)
    with np.errstate(all="ignore"):  # IEEE semantics, quietly: overflow to inf is a result
        result = node.op.reference(*args, **node.attrs)
        results = result if isinstance(result, tuple) else (result,)
        for operand, value in zip(node.outputs, results):
            _store(node, operand, value, args)
    COUNTERS["kernel_launches"] += 1


def run(nodes: "deque[Node]") -> None:
    """Execute and consume ``nodes`` in order."""
    while nodes:
        run_node(nodes[0])
        nodes.popleft()
