"""Captured steps: a step recorded once, replayed with its position as a value.

A decoding step of a language model records about 750 ops in Python; replaying its
stored plan takes a fraction of that. ``StepCapture`` watches a step function run
normally at three consecutive positions (each run records, flushes and replays its
fused plans as usual), then replays the plans of the first run directly, with no
recording and no per-op Python: what differs from one position to the next is found
by comparing the three runs, and must be affine in the position:

- offsets into tensors that exist before the flush (the rotary table's row, the KV
  cache's write position): each run's operand layouts are compared; a kernel gets its
  pointer from the layout (``KernelStep.refs``);
- scalars (``arange(n) < length``: the mask's length is a 0-d constant): values
  compared; the replay writes them into private copies.

Everything else must be the same object in every run (weights, caches, the step's
input tensors, which the caller writes in place), or an intermediate of the step,
which the replay reuses. A step that does not fit (the plans differ, a value is not
affine in the position, a flush ran on the reference executor) is not captured: the
caller keeps calling the function, and ``reason`` says why.

A replay is one call into compiled code (``braze_replay``, below): it writes the
moving pointers and scalars, then calls every kernel of the step in order, over
argument arrays built once and the plans' arenas held by the capture; so a step whose
plans have an extern step (numpy between kernels) is not captured. The replay returns
the step's output array as a view of the same buffer every time (as a CUDA graph's
static outputs): read it before the next replay. The garbage collector is paused
during a replay, and nothing is allocated.
"""

from __future__ import annotations

import ctypes
import gc
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import plan as planmod
from .layout import Layout
from .runtime import cpu, memory
from .stats import COUNTERS
from .storage import Storage, strided
from .stream import Node
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
    values: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (private array, first value, per position)
    #: per kernel: its function, its argument array (built once) and the arguments that
    #: move ((index, storage address, first offset in bytes, bytes per position))
    steps: list[tuple[Any, Any, list[tuple[int, int, int, int]]]] = field(default_factory=list)
    arena: np.ndarray | None = None  # the plan's arena, held for the capture's life


class StepCapture:
    """Observe ``fn`` at consecutive positions, then replay it: ``observe(pos, fn)``
    until ``ready`` (or ``reason`` says why it never will be), then ``replay(pos)``."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, list[Any], Tensor]] = []
        self.segments: list[_Segment] | None = None
        self.out: tuple[Storage, Layout] | None = None
        self.first = 0
        self.driver: _Driver | None = None
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
            driver = self.driver
            assert driver is not None
            driver.run(t, cpu.get_num_threads())
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
        extern = next((seg.nodes[st.node].op.name for seg in segments for st in seg.plan.steps
                       if isinstance(st, planmod.ExternStep)), None)
        if extern is not None:
            return f"an extern step ({extern}) is not compiled code: the step cannot be one call"
        for seg in segments:
            _prepare(seg)
        try:
            self.driver = _Driver(segments)
        except ValueError as e:
            return str(e)
        self.segments, self.first = segments, p0
        self.out = (out_a._storage, out_a._layout)
        return ""


def _segment(a: Any, b: Any, c: Any, made: list[set[int]]) -> _Segment | str:
    """One flush of the step, from its three observations."""
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
        if va.dtype.kind not in "iuf":
            return f"an input of the step ({sa.dtype.name}) changes with the position and is not a number"
        dv = vb - va
        if va.size > 64 or not np.array_equal(vc - vb, dv):
            return f"an input of the step ({sa.dtype.name} of {va.size}) is not affine in the position"
        copy = va.copy()
        private = Storage(sa.dtype, sa.device, sa.numel, copy)
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
        if moves:
            moving[i] = moves
    return _Segment(a.plan, a.nodes, storages, moving, values)


def _prepare(seg: _Segment) -> None:
    """Bind the plan's buffers once (its arena held by the capture, its outputs
    allocated) and build each kernel's argument array, so that a replay only writes
    the moving pointers and calls. Every step is a kernel (``_build`` refused extern
    steps), so every buffer is bound here, once."""
    plan, storages, nodes = seg.plan, seg.storages, seg.nodes
    if plan.offsets:
        seg.arena = memory.arena(plan.arena_bytes)
        base = seg.arena.ctypes.data
        for k, off in plan.offsets.items():
            st = storages[k]
            st.bind(seg.arena[off:off + st.numel * st.dtype.itemsize].view(st.dtype.np), base + off)
    for step in plan.steps:
        kstep = step.step
        for k in kstep.outputs:
            st = storages[k]
            if st.array is None:
                st.array = memory.allocate(st.dtype.np, st.numel, "kernel")
        ptrs = (ctypes.c_void_p * len(kstep.args))()
        moving = []
        for j, (k, r) in enumerate(zip(kstep.args, kstep.refs)):
            st = storages[k]
            if r is None:
                ptrs[j] = st.address()
                continue
            lay = planmod.operand(nodes[r[0]], r[1]).layout
            out, j_op = r[1] < 0, (-1 - r[1] if r[1] < 0 else r[1])
            move = next((m for m in seg.moving.get(r[0], []) if m.outputs == out and m.operand == j_op), None)
            if move is None:
                ptrs[j] = st.address() + st.dtype.nbytes(lay.offset)
            else:
                moving.append((j, st.address(), st.dtype.nbytes(move.offset), st.dtype.nbytes(move.delta)))
        seg.steps.append((step.fn, ptrs, moving))


# One call runs a captured step: every kernel in order, after writing the pointers and
# scalars that move with the position (t positions past the first observation).
_DRIVER = r"""
#include <stdint.h>
typedef void (*braze_kernel)(void **args, int64_t nthreads);
void braze_replay(int64_t n, braze_kernel *fns, void ***argvs, int64_t nthreads,
                  int64_t nmov, void **slots[], const int64_t *base, const int64_t *delta,
                  int64_t nval, void *const *vals, const int64_t *kind, const double *v0, const double *dv,
                  int64_t t) {
    for (int64_t i = 0; i < nval; i++) {
        double v = v0[i] + dv[i] * (double)t;
        switch (kind[i]) {
            case 0: *(int64_t *)vals[i] = (int64_t)v; break;
            case 1: *(int32_t *)vals[i] = (int32_t)v; break;
            case 2: *(float *)vals[i] = (float)v; break;
            default: *(double *)vals[i] = v; break;
        }
    }
    for (int64_t i = 0; i < nmov; i++) *slots[i] = (void *)(intptr_t)(base[i] + delta[i] * t);
    for (int64_t i = 0; i < n; i++) fns[i](argvs[i], nthreads);
}
"""
_KINDS = {np.dtype(np.int64): 0, np.dtype(np.int32): 1, np.dtype(np.float32): 2, np.dtype(np.float64): 3}


class _Driver:
    """A captured step as the arrays ``braze_replay`` walks: built once."""

    def __init__(self, segments: list[_Segment]) -> None:
        fns, argvs, slots, base, delta = [], [], [], [], []
        vals, kinds, v0, dv = [], [], [], []
        ptr_size = ctypes.sizeof(ctypes.c_void_p)
        self.keep: list[Any] = []  # every array the C side points into
        for seg in segments:
            for arr, first, step in seg.values:
                if arr.size != 1 or arr.dtype not in _KINDS:
                    raise ValueError("a moving scalar must be one int32/int64/float32/float64")
                vals.append(arr.ctypes.data)
                kinds.append(_KINDS[arr.dtype])
                v0.append(float(first.reshape(-1)[0]))
                dv.append(float(step.reshape(-1)[0]))
                self.keep.append(arr)
            for fn, ptrs, moving in seg.steps:
                fns.append(ctypes.cast(fn, ctypes.c_void_p).value)
                argvs.append(ctypes.addressof(ptrs))
                self.keep.append(ptrs)
                for j, address, off, d in moving:
                    slots.append(ctypes.addressof(ptrs) + j * ptr_size)
                    base.append(address + off)
                    delta.append(d)
        self.n = len(fns)
        c_ptrs = ctypes.c_void_p * max(1, len(fns))
        self.fns, self.argvs = c_ptrs(*fns), c_ptrs(*argvs)
        self.slots = (ctypes.c_void_p * max(1, len(slots)))(*slots)
        self.base = (ctypes.c_int64 * max(1, len(base)))(*base)
        self.delta = (ctypes.c_int64 * max(1, len(delta)))(*delta)
        self.nmov = len(slots)
        self.vals = (ctypes.c_void_p * max(1, len(vals)))(*vals)
        self.kinds = (ctypes.c_int64 * max(1, len(kinds)))(*kinds)
        self.v0 = (ctypes.c_double * max(1, len(v0)))(*v0)
        self.dv = (ctypes.c_double * max(1, len(dv)))(*dv)
        self.nval = len(vals)
        self.fn = cpu.compile_c(_DRIVER, ["braze_replay"]).function(
            "braze_replay", ["ptr", "ptr", "ptr", "i64", "i64", "ptr", "ptr", "ptr", "i64", "ptr", "ptr", "ptr",
                             "ptr", "i64"])

    def run(self, t: int, nthreads: int) -> None:
        COUNTERS["kernel_launches"] += self.n
        COUNTERS["c_calls"] += 1
        self.fn(self.n, self.fns, self.argvs, nthreads, self.nmov, self.slots, self.base, self.delta,
                self.nval, self.vals, self.kinds, self.v0, self.dv, t)
