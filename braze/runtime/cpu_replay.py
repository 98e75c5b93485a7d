"""A captured step on the CPU: every kernel of its plans called by one C function.

``prepare`` binds a segment's buffers once (its plan's arena held by the capture, its
outputs allocated) and builds each kernel's argument array; ``Driver`` is the step as
the arrays ``braze_replay`` (below) walks: it writes the pointers and scalars that move
with the position (``step_diff.py`` found them), then calls every kernel in order.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .. import plan as planmod
from ..stats import COUNTERS
from ..step_diff import Segment
from ..stream import Node
from . import cpu, memory, units


class SharedArena:
    """One arena for the segments of captures that never run at the same time (a
    server's step buckets, run one at a time on its engine thread): a plan's arena holds
    only its internal buffers, written before they are read in every run, so one block
    serves them all. It grows by doubling; the blocks it outgrew stay held by the
    captures bound to them, so all of it is at most twice the largest arena (a server's
    72 buckets: 6.4 MiB in all)."""

    def __init__(self) -> None:
        self.block: np.ndarray | None = None

    def get(self, nbytes: int) -> np.ndarray:
        if self.block is None or self.block.nbytes < nbytes:
            self.block = memory.arena(max(nbytes, 2 * self.block.nbytes if self.block is not None else 0))
        return self.block


def prepare(seg: Segment, shared: SharedArena | None = None) -> None:
    """Bind the plan's buffers once (its arena held by the capture, or ``shared``'s
    block, its outputs allocated) and build each kernel's argument array, so that a
    replay only writes the moving pointers and calls. Every step is a kernel (``_build``
    refused extern steps), so every buffer is bound here, once."""
    plan, storages, nodes = seg.plan, seg.storages, seg.nodes
    if plan.offsets:
        seg.arena = shared.get(plan.arena_bytes) if shared is not None else memory.arena(plan.arena_bytes)
        base = seg.arena.ctypes.data
        for k, off in plan.offsets.items():
            st = storages[k]
            st.bind(seg.arena[off:off + st.numel * st.dtype.itemsize].view(st.dtype.np), base + off)
    for step in plan.steps:
        kstep = step.step
        for k in kstep.outputs:
            st = storages[k]
            if st.array is None:
                st.bind(*memory.allocate_at(st.dtype.np, st.numel, "kernel"))
        ptrs = (ctypes.c_void_p * (len(kstep.args) + len(step.extra)))(*([None] * len(kstep.args)), *step.extra)
        moving = []
        for j, (k, r) in enumerate(zip(kstep.args, kstep.refs)):
            st = storages[k]
            if r is None:
                ptrs[j] = st.address()
                continue
            lay = planmod.operand(nodes[r[0]], r[1]).layout
            move = seg.move(r[0], r[1])
            if move is None:
                ptrs[j] = st.address() + st.dtype.nbytes(lay.offset)
            else:
                moving.append((j, st.address(), st.dtype.nbytes(move.offset), st.dtype.nbytes(move.delta)))
        seg.steps.append((step, ptrs, moving))


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


class Driver:
    """A captured step as the arrays ``braze_replay`` walks: built once."""

    def __init__(self, segments: list[Segment]) -> None:
        fns, argvs, slots, base, delta = [], [], [], [], []
        errs, nchecks = [], []
        # per kernel: its compiled step and the nodes its index checks name (what
        # ``index_error`` reads), not the segment's every node (``Segment.names``)
        self.checked: list[tuple[Any, dict[int, Node]]] = []
        vals, kinds, v0, dv = [], [], [], []
        ptr_size = ctypes.sizeof(ctypes.c_void_p)
        self.keep: list[Any] = []  # every array the C side points into
        self.kernels: list[Any] = []  # each call's plan.CompiledKernel
        self.swaps = units.swaps()
        for seg in segments:
            for v in seg.values:
                if v.array.size != 1 or v.array.dtype not in _KINDS:
                    raise ValueError("a moving scalar must be one int32/int64/float32/float64")
                vals.append(v.array.ctypes.data)
                kinds.append(_KINDS[v.array.dtype])
                v0.append(float(v.first.reshape(-1)[0]))
                dv.append(float(v.delta.reshape(-1)[0]))
                self.keep.append(v.array)
            for (kernel, ptrs, moving), step in zip(seg.steps, seg.plan.steps):
                errs.append(None if step.err is None else ctypes.addressof(step.err))
                nchecks.append(0 if step.err is None else len(step.err) // 2)
                checks = step.step.kernel.checks if step.err is not None else ()
                self.checked.append((step, {c[0]: seg.nodes[c[0]] for c in checks}))
                self.kernels.append(kernel)
                fns.append(ctypes.cast(kernel.fn, ctypes.c_void_p).value)
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

    def run(self, t: int) -> None:
        nthreads = cpu.get_num_threads()
        if self.swaps != units.swaps():  # kernels were swapped for their whole module's
            self.swaps = units.swaps()
            for i, kernel in enumerate(self.kernels):
                self.fns[i] = ctypes.cast(kernel.fn, ctypes.c_void_p).value
        COUNTERS["kernel_launches"] += self.n
        COUNTERS["c_calls"] += 1
        failed = self.fn(self.n, self.fns, self.argvs, nthreads, self.nmov, self.slots, self.base, self.delta,
                         self.nval, self.vals, self.kinds, self.v0, self.dv, t, self.errs, self.nchecks)
        if failed:  # the kernels after it did not run; a scatter that failed stored nothing
            step, nodes = self.checked[failed - 1]
            raise planmod.index_error(step, nodes)[1]
