"""The stream: one queue of recorded nodes per device, flushed at sync points.

An op call appends a ``Node`` (op, input operands, output operands, attributes) and
returns at once. Sync points (``numpy()``, ``item()``, ``tolist()``, printing,
``bool()``, ``realize()``) and a size limit flush the queue to an executor. Today the
executor is the reference executor; the fusion compiler plugs in behind
``BRAZE_FUSION`` (unset or 1: fused, when built; 0: reference). Nodes run in the order
they were recorded, which is what orders a write against the reads around it.

For the fused executor the stream also keeps the *relative form* of its nodes as they
are recorded (``plan.Form``), walking the trie of stored plans node by node, so a flush
finds its plan without hashing the whole stream again. The reference executor needs no
form, and with ``BRAZE_FUSION=0`` none is kept.
"""

from __future__ import annotations

import os
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol, Sequence

from .node import Node, Operand
from .stats import COUNTERS


class Tracker(Protocol):
    """What a stream keeps beside its nodes for its executor (``plan.Form``)."""

    def add(self, node: Node) -> None: ...

    def truncate(self, n: int) -> None: ...


class NodeQueue(deque[Node]):
    """A stream's queued nodes, and the form its executor keeps of them. The form
    travels with the queue: a flush hands both to the executor, and a fresh queue
    starts a fresh form."""

    __slots__ = ("form", "watch")

    def __init__(self) -> None:
        super().__init__()
        self.form: Tracker | None = None
        #: told how many nodes the queue holds when it is flushed (``jit``: was a
        #: replay flushed alone, or did later work join it?)
        self.watch: Callable[[int], None] | None = None


Executor = Callable[["deque[Node]"], None]


def _mark(node: Node) -> None:
    """Mark what ``node`` writes: its outputs' producer, or dirty for an in-place write."""
    for out in node.outputs:
        if node.op.inplace:
            out.storage.dirty = True
        else:
            out.storage.producer = node


def _default_limit() -> int:
    return int(os.environ.get("BRAZE_STREAM_LIMIT", "4096"))


class Stream:
    """The queue of one device."""

    def __init__(self, executor: Executor, limit: int | None = None,
                 tracker: Callable[[], Tracker | None] | None = None) -> None:
        self.nodes = NodeQueue()
        self.executor = executor
        self.limit = limit if limit is not None else _default_limit()
        #: makes the form of a new queue, or None when the executor wants none; asked
        #: at the first node of each queue, so a change of executor takes effect there
        self.tracker = tracker

    def record(self, node: Node) -> None:
        """Append a checked node; producers are marked so reads know to flush."""
        _mark(node)
        nodes = self.nodes
        if not nodes and self.tracker is not None:
            nodes.form = self.tracker()
        if nodes.form is not None:
            nodes.form.add(node)
        nodes.append(node)
        COUNTERS["nodes_recorded"] += 1
        if len(self.nodes) >= self.limit:
            self.flush()

    def record_all(self, nodes: Sequence[Node], fill: Callable[[Any], bool]) -> bool:
        """Append checked nodes to an empty stream at once, the new queue's form set by
        ``fill`` (``jit``'s replay restores a copy of the form of the same nodes) instead
        of built node by node. False, with nothing appended, when the stream is not
        empty, the nodes would reach the size limit, or ``fill`` cannot."""
        queue = self.nodes
        if queue or len(nodes) >= self.limit:
            return False
        form = self.tracker() if self.tracker is not None else None
        if form is not None and not fill(form):
            return False
        queue.form = form
        for node in nodes:
            _mark(node)
        queue.extend(nodes)
        COUNTERS["nodes_recorded"] += len(nodes)
        return True

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
            nodes = self.nodes
            while len(nodes) > keep:
                node = nodes.pop()
                COUNTERS["nodes_recorded"] -= 1
                for out in node.outputs:
                    if out.storage.producer is node:
                        out.storage.producer = None
            if nodes.form is not None:
                nodes.form.truncate(keep)  # the form and its trie cursor roll back too
            raise

    def flush(self) -> None:
        """Run every queued node. On failure the nodes that did not run are dropped and
        their outputs poisoned with the error, so the stream is left empty and a later
        read of a lost tensor raises the same error instead of returning garbage."""
        if not self.nodes:
            return
        nodes, self.nodes = self.nodes, NodeQueue()
        COUNTERS["flushes"] += 1
        if nodes.watch is not None:
            nodes.watch(len(nodes))
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
    compiles, unless there is no C compiler (then it says so once and does not): the
    fused executor asks for one where it would build a plan, not on every flush."""
    return os.environ.get("BRAZE_FUSION", "1").strip() != "0"


_plan: Any = None  # the fused executor (braze.plan): it imports this module, and registers itself


def set_fused_executor(module: Any) -> None:
    """``braze.plan`` registers itself (``execute``, ``Form``) when imported; the
    package imports it, so it always is before a flush."""
    global _plan
    _plan = module


def _plan_module() -> Any:
    if _plan is None:
        raise RuntimeError("internal: braze.plan was not imported (import braze, not its modules alone)")
    return _plan


def _execute(nodes: "deque[Node]") -> None:
    if fusion_enabled():
        _plan_module().execute(nodes)
    else:
        _reference(nodes)


def _reference(nodes: "deque[Node]") -> None:
    if isinstance(nodes, NodeQueue):
        nodes.form = None  # kept while fusion was on: it would keep intermediates alive
    from .runtime.reference import run
    run(nodes)


_cuda: Executor | None = None  # the cuda device's executor (braze.runtime.cuda registers itself)
_cuda_reference: Executor | None = None  # and its reference executor (device memory staged through the host)


def set_cuda_executor(executor: Executor, reference: Executor) -> None:
    global _cuda, _cuda_reference
    _cuda, _cuda_reference = executor, reference


def _execute_cuda(nodes: "deque[Node]") -> None:
    """The cuda stream: Triton kernels (``runtime/cuda.py``); with ``BRAZE_FUSION=0`` the
    reference executor over the same data (the oracle the cuda kernels are tested
    against)."""
    if _cuda is None or _cuda_reference is None:
        raise RuntimeError("internal: braze.runtime.cuda was not imported (import braze, not its modules alone)")
    (_cuda if fusion_enabled() else _cuda_reference)(nodes)


def _form() -> Tracker | None:
    """The fused executor's form of a new queue; none for the reference executor, so
    ``BRAZE_FUSION=0`` pays nothing per recorded node for plan matching."""
    if not fusion_enabled():
        return None
    return _plan_module().Form()


#: where the cuda device's plans are in the plan trie: a branch of their own (a program's
#: entries do not name a device, and a CPU plan is no cuda plan)
CUDA_HEAD: tuple[Any, ...] = (("device", "cuda"),)


def _cuda_form() -> Tracker | None:
    if not fusion_enabled():
        return None
    return _plan_module().Form(CUDA_HEAD)


def stream(device: str = "cpu") -> Stream:
    s = _streams.get(device)
    if s is None:
        s = _streams[device] = (Stream(_execute, tracker=_form) if device == "cpu"
                                else Stream(_execute_cuda, tracker=_cuda_form))
    return s


_by_device: dict[Any, Stream] = {}


def stream_of(device: Any) -> Stream:
    """``stream(str(device))`` for a Device, without spelling its name on every op."""
    s = _by_device.get(device)
    if s is None:
        s = _by_device[device] = stream(str(device))
    return s


def synchronize() -> None:
    """Flush every device's stream."""
    for s in _streams.values():
        s.flush()
