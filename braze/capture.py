"""Captured steps: a step recorded once, replayed with its position as a value.

A decoding step of a language model records about 750 ops in Python; replaying its
stored plan takes a fraction of that. ``StepCapture`` watches a step function run
normally at three consecutive positions (each run records, flushes and replays its
fused plans as usual), then replays the plans of the first run directly, with no
recording and no per-op Python: what differs from one position to the next is found
by comparing the three runs, and must be affine in the position:

- offsets into tensors that exist before the flush (the rotary table's row, the KV
  cache's write position): each run's operand layouts are compared; a kernel gets its
  pointer from the layout (``KernelStep.refs``) and an extern step reads through it;
- scalars (``arange(n) < length``: the mask's length is a 0-d constant): values
  compared; the replay writes them into private copies.

Everything else must be the same object in every run (weights, caches, the step's
input tensors, which the caller writes in place), or an intermediate of the step,
which the replay reuses. A step that does not fit (the plans differ, a value is not
affine in the position, a flush ran on the reference executor) is not captured: the
caller keeps calling the function, and ``reason`` says why.

The replay returns the step's output array as a view of the same buffer every time
(as a CUDA graph's static outputs): read it before the next replay. The garbage
collector is paused during a replay, and after the first nothing is allocated.
"""

from __future__ import annotations

import ctypes
import gc
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import plan as planmod
from .runtime import cpu, memory, reference
from .stats import COUNTERS
from .layout import Layout
from .storage import Storage, strided
from .stream import Node, Operand
from .tensor import Tensor

OBSERVATIONS = 3  # positions p, p + 1, p + 2: two differences, so affinity is checked, not assumed
ATTEMPTS = 3  # sets of observations before giving up (the first steps may still flush work left before them)


@dataclass
class _Moving:
    node: int  # index in the segment's nodes
    outputs: bool
    operand: int
    offset: int  # at the first observed position
    delta: int  # per position


@dataclass
class _Segment:
    plan: Any
    nodes: list[Node]
    storages: list[Any]
    moving: dict[int, list[_Moving]]  # node index -> its operands that move
    swap: dict[int, Storage]  # id(observed storage) -> private copy
    values: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (private array, first value, per position)
    #: per plan step: a kernel's function, its argument array (built once) and the
    #: arguments that move ((index, storage address, first offset in bytes, bytes per
    #: position); an address -1 - k: storage k's, made by an extern step each run); or
    #: an extern step's node index
    steps: list[tuple[Any, Any, list[tuple[int, int, int, int]]] | int] = field(default_factory=list)
    arena: np.ndarray | None = None  # the plan's arena, held for the capture's life


class StepCapture:
    """Observe ``fn`` at consecutive positions, then replay it: ``observe(pos, fn)``
    until ``ready`` (or ``reason`` says why it never will be), then ``replay(pos)``."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, list[Any], Tensor]] = []
        self.segments: list[_Segment] | None = None
        self.out: tuple[Storage, Layout] | None = None
        self.first = 0
        self.reason = ""
        self.attempts = 0

    @property
    def ready(self) -> bool:
        return self.segments is not None

    def observe(self, pos: int, fn: Callable[[], Tensor]) -> np.ndarray:
        """Run ``fn`` (one step at ``pos``, returning its output tensor) and watch it."""
        seen: list[Any] = []
        planmod.observers.append(seen)
        try:
            out = fn()
            arr = out.numpy()
        finally:
            planmod.observers.pop()
        if self.reason:
            return arr
        if self.runs and pos != self.runs[-1][0] + 1:
            self.runs.clear()  # not consecutive: start over
        self.runs.append((pos, seen, out))
        if len(self.runs) == OBSERVATIONS:
            why = self._build()
            self.runs.clear()
            self.attempts += 1
            if why and self.attempts >= ATTEMPTS:
                self.reason = why
        return arr

    def replay(self, pos: int) -> np.ndarray:
        """The step at ``pos``: its plans run over the first observation's storages."""
        assert self.segments is not None and self.out is not None
        t = pos - self.first
        enabled = gc.isenabled()
        gc.disable()
        try:
            nthreads = cpu.get_num_threads()
            for seg in self.segments:
                for arr, v0, dv in seg.values:
                    arr[...] = v0 + dv * t
                for step in seg.steps:
                    if isinstance(step, int):  # an extern step: its node, moved
                        node = seg.nodes[step]
                        moves = seg.moving.get(step)
                        reference.run_node(node if moves is None else _moved(node, moves, t, seg.swap))
                        continue
                    fn, ptrs, moving = step
                    for j, address, off, delta in moving:
                        if address < 0:  # an extern step's result, made this run
                            address = seg.storages[-1 - address].address()
                        ptrs[j] = address + off + delta * t
                    COUNTERS["kernel_launches"] += 1
                    fn(ptrs, nthreads)
        finally:
            if enabled:
                gc.enable()
        st, lay = self.out
        return strided(st.data(), lay.shape, lay.strides, lay.offset)

    # -- building -------------------------------------------------------------------------
    def _build(self) -> str:
        """Compare the three runs; set ``segments``, or return why the step cannot be captured."""
        (p0, a, out_a), (_, b, out_b), (_, c, out_c) = self.runs
        if not a or any(r is None for r in a + b + c):
            return "a flush of the step ran on the reference executor"
        if not (len(a) == len(b) == len(c)) or any(x.plan is not y.plan or x.plan is not z.plan
                                                   for x, y, z in zip(a, b, c)):
            return "the step's flushes do not replay the same plans at every position"
        if out_a._layout != out_b._layout or out_a._layout != out_c._layout:
            return "the step's output moves with the position"
        made: list[set[int]] = [set(), set(), set()]  # storages each run's step produced so far
        segments = []
        for ra, rb, rc in zip(a, b, c):
            seg = _segment(ra, rb, rc, made)
            if isinstance(seg, str):
                return seg
            segments.append(seg)
        for seg in segments:
            _prepare(seg)
        self.segments, self.first = segments, p0
        self.out = (out_a._storage, out_a._layout)
        return ""


def _segment(a: Any, b: Any, c: Any, made: list[set[int]]) -> _Segment | str:
    """One flush of the step, from its three observations."""
    swap: dict[int, Storage] = {}
    values = []
    storages = list(a.storages)
    for k, (sa, sb, sc) in enumerate(zip(a.storages, b.storages, c.storages)):
        if sa is sb is sc or k in a.produced:
            continue
        if id(sa) in made[0] and id(sb) in made[1] and id(sc) in made[2]:
            continue  # an intermediate of the step, made by an earlier flush
        va, vb, vc = sa.data(), sb.data(), sc.data()
        if va.shape != vb.shape or va.dtype != vb.dtype:
            return "an input of the step changes type or size with the position"
        if np.array_equal(va, vb) and np.array_equal(vb, vc):
            continue  # made anew each step with the same values
        dv = vb - va
        if va.size > 64 or not np.array_equal(vc - vb, dv):
            return f"an input of the step ({sa.dtype.name} of {va.size}) is not affine in the position"
        copy = va.copy()
        private = Storage(sa.dtype, sa.device, sa.numel, copy)
        swap[id(sa)] = private
        storages[k] = private
        values.append((copy, va.copy(), dv))
    for run, s in zip(made, (a, b, c)):
        run.update(id(s.storages[k]) for k in s.produced)
    moving: dict[int, list[_Moving]] = {}
    for i, (na, nb, nc) in enumerate(zip(a.nodes, b.nodes, c.nodes)):
        moves = []
        for outputs, ops in ((False, zip(na.inputs, nb.inputs, nc.inputs)), (True, zip(na.outputs, nb.outputs, nc.outputs))):
            for j, (oa, ob, oc) in enumerate(ops):
                la, lb, lc = oa.layout, ob.layout, oc.layout
                if la.offset == lb.offset == lc.offset:
                    continue
                if lb.offset - la.offset != lc.offset - lb.offset:
                    return f"{na.op.name}: an operand's offset is not affine in the position"
                moves.append(_Moving(i, outputs, j, la.offset, lb.offset - la.offset))
        swapped = any(id(o.storage) in swap for o in (*na.inputs, *na.outputs))
        if moves or swapped:
            moving[i] = moves
    return _Segment(a.plan, a.nodes, storages, moving, swap, values)


def _moved(node: Node, moves: list[_Moving], t: int, swap: dict[int, Storage]) -> Node:
    """``node`` at ``t`` positions past the first observation: moving operands shifted,
    swapped storages replaced by their private copies."""
    ins = [Operand(swap.get(id(o.storage), o.storage), o.layout) for o in node.inputs]
    outs = [Operand(swap.get(id(o.storage), o.storage), o.layout) for o in node.outputs]
    for m in moves:
        ops = outs if m.outputs else ins
        lay = ops[m.operand].layout
        ops[m.operand] = Operand(ops[m.operand].storage, Layout(lay.shape, lay.strides, m.offset + m.delta * t))
    return Node(node.op, tuple(ins), tuple(outs), node.attrs)


def _prepare(seg: _Segment) -> None:
    """Bind the plan's buffers once (its arena held by the capture, its outputs
    allocated) and build each kernel's argument array, so that a replay only writes
    the moving pointers and calls. Extern steps run their node through the reference
    executor, as in ``plan.run``."""
    plan, storages, nodes = seg.plan, seg.storages, seg.nodes
    if plan.offsets:
        seg.arena = memory.arena(plan.arena_bytes)
        base = seg.arena.ctypes.data
        for k, off in plan.offsets.items():
            st = storages[k]
            st.bind(seg.arena[off:off + st.numel * st.dtype.itemsize].view(st.dtype.np), base + off)
    for i, step in enumerate(plan.steps):
        if isinstance(step, planmod.ExternStep):
            seg.steps.append(step.node)
            continue
        kstep = step.step
        for k in kstep.outputs:
            st = storages[k]
            if st.array is None:
                st.array = memory.allocate(st.dtype.np, st.numel, "kernel")
        ptrs = (ctypes.c_void_p * len(kstep.args))()
        moving = []
        for j, (k, r) in enumerate(zip(kstep.args, kstep.refs)):
            st = storages[k]
            if st.array is None:  # an extern step's result: a new array every run
                moving.append((j, -1 - k, 0, 0))
                continue
            if r is None:
                ptrs[j] = st.address()
                continue
            lay = nodes[r[0]].inputs[r[1]].layout
            move = next((m for m in seg.moving.get(r[0], []) if not m.outputs and m.operand == r[1]), None)
            if move is None:
                ptrs[j] = st.address() + st.dtype.nbytes(lay.offset)
            else:
                moving.append((j, st.address(), st.dtype.nbytes(move.offset), st.dtype.nbytes(move.delta)))
        seg.steps.append((step.fn, ptrs, moving))
