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

A *static* capture (``StepCapture(static=True)``, a prompt's prefill padded to a
length bucket) has no position: two runs at the same cache position must agree in
every offset and value, and what differs between its calls lives in tensors the
caller writes in place (the token ids, the row whose logits it wants).

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

    def __init__(self, static: bool = False) -> None:
        self.static = static
        self.observations = 2 if static else OBSERVATIONS
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
        if self.runs and pos != self.runs[-1][0] + (0 if self.static else 1):
            self.runs.clear()  # not consecutive (or, static, not at the same position): start over
        self.runs.append((pos, seen, out))
        if len(self.runs) == self.observations:
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
        """Compare the runs; set ``segments``, or return why the step cannot be captured."""
        p0, first, out_a = self.runs[0]
        seens = [seen for _, seen, _ in self.runs]
        if not first or any(r is None for seen in seens for r in seen):
            return "a flush of the step ran on the reference executor"
        if any(len(seen) != len(first) or any(x.plan is not y.plan for x, y in zip(first, seen)) for seen in seens):
            return "the step's flushes do not replay the same plans at every position"
        if any(out._layout != out_a._layout for _, _, out in self.runs):
            return "the step's output moves with the position"
        made: list[set[int]] = [set() for _ in self.runs]  # storages each run's step produced so far
        segments = []
        for ran in zip(*seens):
            seg = _segment(list(ran), made, self.static)
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


def _steps(values: list[Any]) -> Any:
    """The step between consecutive observations when it is one and the same (the
    values are affine in the position), else None."""
    d = values[1] - values[0]
    return d if all(np.array_equal(b - a, d) for a, b in zip(values[1:], values[2:])) else None


def _segment(runs: list[Any], made: list[set[int]], static: bool) -> _Segment | str:
    """One flush of the step, from its observations (``static``: all at one position,
    so nothing may differ between them)."""
    a = runs[0]
    values = []
    storages = list(a.storages)
    for k, group in enumerate(zip(*(r.storages for r in runs))):
        sa = group[0]
        if all(s is sa for s in group) or k in a.produced:
            continue
        if all(id(s) in m for s, m in zip(group, made)):
            continue  # an intermediate of the step, made by an earlier flush
        vs = [s.data() for s in group]
        if any(v.shape != vs[0].shape or v.dtype != vs[0].dtype for v in vs):
            return "an input of the step changes type or size with the position"
        if all(np.array_equal(vs[0], v) for v in vs[1:]):
            continue  # made anew each step with the same values
        if static:
            return f"an input of the step ({sa.dtype.name} of {vs[0].size}) differs between runs at one position"
        if vs[0].dtype.kind not in "iuf":
            return f"an input of the step ({sa.dtype.name}) changes with the position and is not a number"
        dv = _steps(vs)
        if vs[0].size > 64 or dv is None:
            return f"an input of the step ({sa.dtype.name} of {vs[0].size}) is not affine in the position"
        copy = vs[0].copy()
        private = Storage(sa.dtype, sa.device, sa.numel, copy)
        storages[k] = private
        values.append((copy, vs[0].copy(), dv))
    for m, r in zip(made, runs):
        m.update(id(r.storages[k]) for k in r.produced)
    moving: dict[int, list[_Moving]] = {}
    for i, ns in enumerate(zip(*(r.nodes for r in runs))):
        moves = []
        for outputs in (False, True):
            for j, ops in enumerate(zip(*(n.outputs if outputs else n.inputs for n in ns))):
                offsets = [o.layout.offset for o in ops]
                if all(off == offsets[0] for off in offsets):
                    continue
                delta = None if static else _steps(offsets)
                if delta is None:
                    return f"{ns[0].op.name}: an operand's offset " + \
                        ("differs between runs at one position" if static else "is not affine in the position")
                moves.append(_Moving(i, outputs, j, offsets[0], int(delta)))
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
        ptrs = (ctypes.c_void_p * (len(kstep.args) + len(step.extra)))(*([None] * len(kstep.args)), *step.extra)
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
int64_t braze_replay(int64_t n, braze_kernel *fns, void ***argvs, int64_t nthreads,
                     int64_t nmov, void **slots[], const int64_t *base, const int64_t *delta,
                     int64_t nval, void *const *vals, const int64_t *kind, const double *v0, const double *dv,
                     int64_t t, int64_t *const *errs, const int64_t *nchecks) {
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
    for (int64_t i = 0; i < n; i++) {
        fns[i](argvs[i], nthreads);
        /* a gather's or scatter's index out of range: stop, the caller raises */
        if (errs[i]) for (int64_t c = 0; c < nchecks[i]; c++) if (errs[i][2 * c]) return i + 1;
    }
    return 0;
}
"""
_KINDS = {np.dtype(np.int64): 0, np.dtype(np.int32): 1, np.dtype(np.float32): 2, np.dtype(np.float64): 3}


class _Driver:
    """A captured step as the arrays ``braze_replay`` walks: built once."""

    def __init__(self, segments: list[_Segment]) -> None:
        fns, argvs, slots, base, delta = [], [], [], [], []
        errs, nchecks = [], []
        self.checked: list[tuple[Any, list[Node]]] = []  # per kernel: its compiled step and its segment's nodes
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
            for (fn, ptrs, moving), step in zip(seg.steps, seg.plan.steps):
                errs.append(None if step.err is None else ctypes.addressof(step.err))
                nchecks.append(0 if step.err is None else len(step.err) // 2)
                self.checked.append((step, seg.nodes))
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
        self.errs = c_ptrs(*errs)
        self.nchecks = (ctypes.c_int64 * max(1, len(nchecks)))(*nchecks)
        self.fn = cpu.compile_c(_DRIVER, ["braze_replay"]).function(
            "braze_replay", ["ptr", "ptr", "ptr", "i64", "i64", "ptr", "ptr", "ptr", "i64", "ptr", "ptr", "ptr",
                             "ptr", "i64", "ptr", "ptr"], ctypes.c_int64)

    def run(self, t: int, nthreads: int) -> None:
        COUNTERS["kernel_launches"] += self.n
        COUNTERS["c_calls"] += 1
        failed = self.fn(self.n, self.fns, self.argvs, nthreads, self.nmov, self.slots, self.base, self.delta,
                         self.nval, self.vals, self.kinds, self.v0, self.dv, t, self.errs, self.nchecks)
        if failed:  # the kernels after it did not run; a scatter that failed stored nothing
            step, nodes = self.checked[failed - 1]
            raise planmod.index_error(step, nodes)[1]
