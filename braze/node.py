"""A recorded op: ``Node(op, inputs, outputs, attrs)`` over ``Operand``s (a Storage seen
through a Layout). The stream queues them; executors run them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layout import Layout
from .ops.registry import OpDef
from .storage import Storage


@dataclass(slots=True)
class Operand:
    """A tensor as a node sees it: which storage, viewed through which layout."""

    storage: Storage
    layout: Layout


@dataclass(slots=True, eq=False)
class Node:
    op: OpDef
    inputs: tuple[Operand, ...]
    outputs: tuple[Operand, ...]
    attrs: dict[str, Any]

    def __repr__(self) -> str:
        ins = ", ".join(f"#{o.storage.id}{list(o.layout.shape)}" for o in self.inputs)
        outs = ", ".join(f"#{o.storage.id}" for o in self.outputs)
        attrs = "".join(f", {k}={v!r}" for k, v in self.attrs.items())
        return f"{outs} = {self.op.name}({ins}{attrs})"
