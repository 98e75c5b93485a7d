"""What moves between runs of a step: the part of a step capture both devices share.

A step observed at consecutive positions (``capture.StepCapture``) ran the same fused
plans each time; comparing the runs' flushes, one by one, finds what differs, which
must be affine in the position:

- offsets of operands into tensors that exist before the flush (the rotary table's row,
  the KV cache's write position), from the nodes' layouts (``Moving``);
- scalars (``arange(n) < length``: the mask's length is a 0-d constant), from their
  values (``MovingValue``), which a replay writes into a private copy.

Everything else must be the same object in every run, an intermediate of the step, or
made anew with the same values. How a replay then moves them is the device's: the CPU
writes pointers into its kernels' argument arrays (``capture.py``), cuda writes one
small device buffer its kernels read (``runtime/cuda_replay.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .runtime import cuda_memory
from .storage import Storage
from .stream import Node


@dataclass
class Moving:
    """An operand whose offset moves: input (or output) ``operand`` of node ``node``."""

    node: int  # index in the segment's nodes
    outputs: bool
    operand: int
    offset: int  # elements, at the first observed position
    delta: int  # per position


@dataclass
class MovingValue:
    """A scalar input that moves: storage ``key`` of the segment (``observed``, in the
    first observation), replaced by a private one over ``array``."""

    key: int
    observed: Storage
    array: np.ndarray
    first: np.ndarray
    delta: np.ndarray

    def at(self, t: int) -> np.ndarray:
        """Its value ``t`` positions past the first observation (computed in float64,
        then cast, as ``braze_replay`` does)."""
        return (self.first.astype(np.float64) + self.delta.astype(np.float64) * t).astype(self.array.dtype)


@dataclass
class Segment:
    """One flush of the step: its plan, the first observation's nodes and storages,
    and what moves; ``steps`` and ``arena`` are what the device's replay binds once."""

    plan: Any
    nodes: list[Node]
    storages: list[Any]
    moving: dict[int, list[Moving]]  # node index -> its operands that move
    values: list[MovingValue]
    steps: list[Any] = field(default_factory=list)
    arena: Any = None  # the plan's arena, held for the capture's life
    names: list[str] = field(default_factory=list)  # each node's op, once ``nodes`` is dropped (a CPU replay)

    def move(self, node: int, j: int) -> Moving | None:
        """How operand ``j`` of ``node`` moves (``j < 0``: output ``-1 - j``, as a
        kernel's refs say), or None if it stays."""
        out, op = j < 0, (-1 - j if j < 0 else j)
        return next((m for m in self.moving.get(node, []) if m.outputs == out and m.operand == op), None)


def affine_step(values: list[Any]) -> Any:
    """The step between consecutive observations when it is one and the same (the
    values are affine in the position), else None."""
    d = values[1] - values[0]
    return d if all(np.array_equal(b - a, d) for a, b in zip(values[1:], values[2:])) else None


def _host(st: Storage) -> np.ndarray:
    """A storage's array on the host (device memory is copied back)."""
    data = st.data()
    return data if isinstance(data, np.ndarray) else cuda_memory.download(data)


def segment(runs: list[Any], made: list[set[int]], static: bool) -> Segment | str:
    """One flush of the step, from its observations (``plan.Ran`` each; ``static``: all
    at one position, so nothing may differ between them), or why it cannot be replayed."""
    a = runs[0]
    values = []
    storages = list(a.storages)
    for k, group in enumerate(zip(*(r.storages for r in runs))):
        sa = group[0]
        if all(s is sa for s in group) or k in a.produced:
            continue
        if all(id(s) in m for s, m in zip(group, made)):
            continue  # an intermediate of the step, made by an earlier flush
        vs = [_host(s) for s in group]
        if any(v.shape != vs[0].shape or v.dtype != vs[0].dtype for v in vs):
            return "an input of the step changes type or size with the position"
        if all(np.array_equal(vs[0], v) for v in vs[1:]):
            continue  # made anew each step with the same values
        if static:
            return f"an input of the step ({sa.dtype.name} of {vs[0].size}) differs between runs at one position"
        if vs[0].dtype.kind not in "iuf":
            return f"an input of the step ({sa.dtype.name}) changes with the position and is not a number"
        dv = affine_step(vs)
        if vs[0].size > 64 or dv is None:
            return f"an input of the step ({sa.dtype.name} of {vs[0].size}) is not affine in the position"
        copy = vs[0].copy()
        storages[k] = Storage(sa.dtype, sa.device, sa.numel, copy)
        values.append(MovingValue(k, sa, copy, vs[0].copy(), dv))
    for m, r in zip(made, runs):
        m.update(id(r.storages[k]) for k in r.produced)
    moving: dict[int, list[Moving]] = {}
    for i, ns in enumerate(zip(*(r.nodes for r in runs))):
        moves = []
        for outputs in (False, True):
            for j, ops in enumerate(zip(*(n.outputs if outputs else n.inputs for n in ns))):
                offsets = [o.layout.offset for o in ops]
                if all(off == offsets[0] for off in offsets):
                    continue
                delta = None if static else affine_step(offsets)
                if delta is None:
                    return f"{ns[0].op.name}: an operand's offset " + \
                        ("differs between runs at one position" if static else "is not affine in the position")
                moves.append(Moving(i, outputs, j, offsets[0], int(delta)))
        if moves:
            moving[i] = moves
    return Segment(a.plan, a.nodes, storages, moving, values)
