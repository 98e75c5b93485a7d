"""A captured step on the cuda device: the same launches at every position, one graph.

A decoding step's recording differs from one position to the next only in what
``step_diff.py`` finds (the KV cache's write offset, the rotary table's row, the mask's
length), and so do the addresses and scalars its kernels get: no CUDA graph could
replay it. Here every such value lives in one small device buffer of the capture, the
*moving buffer* (int64 slots):

- an operand whose offset moves is passed at its storage's start, and its kernel,
  rendered again with ``codegen/triton_moving.py``, adds the offset it reads from its
  slots on entry (slots of a launch are consecutive; it gets a pointer to its first);
- a moving scalar's private storage is a slot of the buffer, which its kernels read
  as they read any 0-d tensor.

So every launch of every step has the same kernel, grid and argument values; a replay
writes the buffer (one host-to-device copy, queued on braze's stream before the
launches, outside any graph), then launches the step: on a GPU its second replay
captures a CUDA graph (``cuda_graph.Graphs``), later ones replay it with one launch;
under Triton's interpreter, kernel by kernel. The plans' intermediates lie in arenas
the capture holds, its outputs and scratch buffers are allocated once: nothing is
recorded or allocated per step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..codegen.triton import NotRendered
from ..codegen.triton_moving import moving
from ..step_diff import Segment
from ..storage import Storage
from . import cuda_memory
from .cuda import Launch, addresses, arg, array_arg, compile_kernel, elements, index_error, launch_all, operands
from .cuda_graph import Graphs

_START = np.array([0, np.iinfo(np.int64).max, np.iinfo(np.int64).min], np.int64)  # a bounds check's slots


class Replay:
    """The segments of a captured step, bound once: ``run(t)`` is the step ``t``
    positions past the first observation. ``calls`` is the launch list (each launch
    with its arguments), the same at every position; ``slots`` the moving buffer and
    ``what`` what each slot holds ("<op> input|output <j>", or "scalar <dtype>")."""

    def __init__(self, segments: list[Segment]) -> None:
        #: per segment, per launch: the launch, its operands, and the moving ones' indices
        plans: list[tuple[Segment, list[tuple[Launch, list[tuple[Any, int, Any]], tuple[int, ...]]]]] = []
        self.what: list[str] = []
        base: list[int] = []
        delta: list[int] = []
        for seg in segments:
            _bind_arena(seg)
            for st in seg.plan.steps:
                if 0 in st.grid:  # (an empty kernel: its outputs exist all the same)
                    operands(st, seg.nodes, seg.storages)
            launches = []
            for st in seg.plan.steps:
                if 0 in st.grid:
                    continue
                ops = operands(st, seg.nodes, seg.storages)
                moves = [(j, storage, m) for j, (storage, _, ref) in enumerate(ops)
                         if ref is not None and (m := seg.move(*ref)) is not None]
                for _, storage, m in moves:
                    self.what.append(f"{seg.nodes[m.node].op.name} {'output' if m.outputs else 'input'} {m.operand}")
                    base.append(elements(storage, m.offset))
                    delta.append(elements(storage, m.delta))
                launches.append((st, ops, tuple(j for j, _, _ in moves)))
            plans.append((seg, launches))
        self.offsets = len(base)
        self.base, self.delta = np.array(base, np.int64), np.array(delta, np.int64)
        self.values = [v for seg in segments for v in seg.values]
        for v in self.values:
            if v.array.size != 1 or v.array.itemsize > 8:
                raise ValueError("a moving scalar must be one number of at most 8 bytes")
            self.what.append(f"scalar {v.array.dtype}")
        n = max(1, len(self.what))
        self.buffer = cuda_memory.allocate(np.uint8, 8 * n, "capture")
        self.slots = cuda_memory.view(self.buffer, 0, np.int64, n)
        self.host = np.zeros(n, np.int64)
        private = self._scalars_in_buffer(segments)
        self.calls: list[tuple[Launch, list[Any]]] = []
        #: per segment with bounds checks: its error slots, checked launches and nodes
        self.checks: list[tuple[Any, list[Launch], list[Any]]] = []
        at = 0
        for seg, launches in plans:
            checked = [st for st, _, _ in launches if st.checks]
            err = cuda_memory.allocate(np.int64, 3 * sum(len(st.checks) for st in checked), "checks") if checked else None
            if err is not None:
                self.checks.append((err, checked, seg.nodes))
            c = 0
            for st, ops, movers in launches:
                args = [arg(private.get(id(storage), storage), 0 if j in movers else off)
                        for j, (storage, off, _) in enumerate(ops)]
                if st.checks:
                    args.append(array_arg(err, "int64", 3 * c))
                    c += len(st.checks)
                if movers:
                    st = replace(st, fn=_moving_kernel(st, movers), compiled={})
                    args.append(array_arg(self.slots, "int64", at))
                    at += len(movers)
                self.calls.append((st, args))
        self.key = addresses(self.calls)
        self.graphs = Graphs()

    def _scalars_in_buffer(self, segments: list[Segment]) -> dict[int, Storage]:
        """Each moving scalar's storage becomes its slot of the buffer (after the offsets'
        slots), on the device its kernels run on: by the id of the storage it replaces
        (the observed one, read by extern kernels, and its private copy)."""
        slot, private = self.offsets, {}
        for seg in segments:
            device = next(st.device for st in seg.storages if st.device.type == "cuda")
            for v in seg.values:
                dtype = v.observed.dtype
                st = Storage(dtype, device, 1, cuda_memory.view(self.buffer, 8 * slot, dtype.np, 1))
                private[id(v.observed)] = private[id(seg.storages[v.key])] = seg.storages[v.key] = st
                slot += 1
        return private

    def write(self, t: int) -> None:
        """The moving buffer at ``t`` positions past the first observation, queued on
        braze's stream (before the launches that read it)."""
        h = self.host
        h[:self.offsets] = self.base + self.delta * t
        raw = h.view(np.uint8)
        for i, v in enumerate(self.values):
            at = 8 * (self.offsets + i)
            raw[at:at + 8] = 0
            value = v.at(t).reshape(-1).view(np.uint8)
            raw[at:at + value.size] = value
        cuda_memory.fill(self.slots, h)

    def run(self, t: int) -> None:
        self.write(t)
        for err, _, _ in self.checks:
            cuda_memory.fill(err, np.tile(_START, err.size // 3))
        launch_all(self.graphs, self.calls, self.key)
        for err, checked, nodes in self.checks:
            slots = cuda_memory.download(err)
            if slots[0::3].any():
                raise index_error(checked, slots, nodes)


def _moving_kernel(st: Launch, movers: tuple[int, ...]) -> Any:
    """``st``'s kernel adding the moving buffer's slots to its arguments ``movers``."""
    assert st.rendered is not None
    try:
        return compile_kernel(moving(st.rendered, movers))
    except NotRendered as e:
        raise ValueError(f"a kernel of the step cannot read moving offsets ({e.what})") from None


def _bind_arena(seg: Segment) -> None:
    """The plan's intermediates in an arena of the capture's own, held for its life."""
    plan = seg.plan
    if plan.arena_bytes:
        seg.arena = cuda_memory.allocate(np.uint8, plan.arena_bytes, "arena")
        for k, at in plan.arena:
            st = seg.storages[k]
            st.array = cuda_memory.view(seg.arena, at, st.dtype.np, st.numel)

