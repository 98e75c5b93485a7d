"""The stream: one queue of recorded nodes per device, flushed at sync points.

An op call appends a ``Node`` (op, input operands, output operands, attributes) and
returns at once. Sync points (``numpy()``, ``item()``, ``tolist()``, printing,
``bool()``, ``realize()``) and a size limit flush the queue to an executor. Today the
executor is the reference executor; the fusion compiler plugs in behind
``BRAZE_FUSION`` (unset or 1: fused, when built; 0: reference). Nodes run in the order
they were recorded, which is what orders a write against the reads around it.
"""

from __future__ import annotations

import os
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .layout import Layout
from .ops.registry import OpDef
from .stats import COUNTERS
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


Executor = Callable[["deque[Node]"], None]


def _default_limit() -> int:
    return int(os.environ.get("BRAZE_STREAM_LIMIT", "1024"))


class Stream:
    """The queue of one device."""

    def __init__(self, executor: Executor, limit: int | None = None) -> None:
        self.nodes: deque[Node] = deque()
        self.executor = executor
        self.limit = limit if limit is not None else _default_limit()

    def record(self, node: Node) -> None:
        """Append a checked node; producers are marked so reads know to flush."""
        for out in node.outputs:
            if node.op.inplace:
                out.storage.dirty = True
            else:
                out.storage.producer = node
        self.nodes.append(node)
        COUNTERS["nodes_recorded"] += 1
        if len(self.nodes) >= self.limit:
            self.flush()

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Record a composite call (a cast then a copy; ``x + y`` then its in-place
        write) as one: if a later check of the call raises, the nodes it already
        recorded are taken back, so an error leaves nothing half-recorded. Nodes that a
        flush inside the call (a sync point, the size limit) already ran stay run."""
        queue, before = self.nodes, len(self.nodes)
        try:
            yield
        except BaseException:
            # A flush swaps in a fresh queue: then all of it was recorded by this call.
            keep = before if self.nodes is queue else 0
            while len(self.nodes) > keep:
                node = self.nodes.pop()
                COUNTERS["nodes_recorded"] -= 1
                for out in node.outputs:
                    if out.storage.producer is node:
                        out.storage.producer = None
            raise

    def flush(self) -> None:
        """Run every queued node. On failure the nodes that did not run are dropped and
        their outputs poisoned with the error, so the stream is left empty and a later
        read of a lost tensor raises the same error instead of returning garbage."""
        if not self.nodes:
            return
        nodes, self.nodes = self.nodes, deque()
        COUNTERS["flushes"] += 1
        written = [o.storage for n in nodes if n.op.inplace for o in n.outputs]
        try:
            self.executor(nodes)
        except BaseException as err:
            for node in nodes:
                for out in node.outputs:
                    if not node.op.inplace and out.storage.array is None:
                        out.storage.error = err
                        out.storage.producer = None
            raise
        finally:
            for st in written:
                st.dirty = False


_streams: dict[str, Stream] = {}


def fusion_enabled() -> bool:
    """``BRAZE_FUSION=0`` selects the reference executor; otherwise braze fuses and
    compiles, unless there is no C compiler (then it says so once and does not)."""
    if os.environ.get("BRAZE_FUSION", "1").strip() == "0":
        return False
    from .runtime.cpu import have_compiler
    return have_compiler()


def _execute(nodes: "deque[Node]") -> None:
    if fusion_enabled():
        from .plan import execute
        execute(nodes)
    else:
        from .runtime.reference import run
        run(nodes)


def stream(device: str = "cpu") -> Stream:
    s = _streams.get(device)
    if s is None:
        s = _streams[device] = Stream(_execute)
    return s


def synchronize() -> None:
    """Flush every device's stream."""
    for s in _streams.values():
        s.flush()
