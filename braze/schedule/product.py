"""A matmul whose contracted dim has size 1 is an outer product: ``out[.., m, n] =
a[.., m, 0] * b[.., 0, n]``, one rounding as the matmul's (no sum), so the reference's
``mul`` gives the same bits. HF's rotary tables are one (``inv_freq[None, :, None] @
position_ids[:, None, :]``): as a ``mul`` over broadcast views it fuses with what makes
its operands and what reads its result, and is recomputed where it is read when they
are values of the index (``recompute.py``), where an extern step would need both
operands stored and its result read back."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..layout import Layout
from ..ops.registry import REGISTRY


def as_product(node: Any) -> Any:
    """``node`` as an element-wise ``mul`` (a stand-in over the same storages and
    offsets) when it is a matmul of a contracted size 1 between operands of the
    output's batch dims; otherwise None."""
    if node.op.name != "matmul":
        return None
    (a, b), out = node.inputs, node.outputs[0]
    sa, sb, so = a.layout.shape, b.layout.shape, out.layout.shape
    if len(sa) < 2 or len(sb) != len(sa) or sa[-1] != 1 or sb[-2] != 1 or sa[:-2] != sb[:-2] \
            or so != sa[:-1] + sb[-1:]:
        return None
    la = Layout(so, a.layout.strides[:-1] + (0,), a.layout.offset)
    lb = Layout(so, b.layout.strides[:-2] + (0, b.layout.strides[-1]), b.layout.offset)
    return replace(node, op=REGISTRY["mul"], inputs=(replace(a, layout=la), replace(b, layout=lb)), attrs={})
