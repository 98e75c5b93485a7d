"""The arena of a plan: the buffers only the plan needs (a kernel's result that a later
step reads and Python cannot reach) are placed at build time at offsets in one block,
by their lifetimes inside the plan, so buffers never needed at the same time share
bytes; a run takes one block from the pool for the whole arena (``plan._run``)."""

from __future__ import annotations

from typing import Any, Sequence

from .runtime import memory
from .schedule import KernelStep

__all__ = ["ALIGN", "binds", "lifetimes", "place"]


def lifetimes(steps: Sequence[Any], nodes: Sequence[Any], key_of: dict[int, int],
               live: frozenset[int]) -> tuple[list[list[int]], dict[int, tuple[int, int]]]:
    """Liveness inside the plan. A buffer the plan produces and Python cannot reach is
    needed from the first step that touches it (its writer) to the last (a read, or a
    write into it: a write's target must exist while it is written). Returns, per step,
    the buffers dead after it, and the interval of each such buffer a kernel writes
    (those go in the arena; an extern step's result is whatever its reference returns)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    produced_here: set[int] = set()
    kernel_out: set[int] = set()
    # What a pure node writes is new here; a kernel's other outputs are in-place writes
    # into storages that exist before the plan (an argument written with ``mul_``), which
    # are never the plan's to place or free, whether Python still reaches them or not.
    pure = {key_of[id(o.storage)] for node in nodes if not node.op.inplace for o in node.outputs}
    for i, st in enumerate(steps):
        if isinstance(st, KernelStep):
            touched = list(st.args)  # loads and stores
            produced_here.update(k for k in st.outputs if k in pure)
            kernel_out.update(k for k in st.outputs if k in pure)
        else:
            node = nodes[st.node]
            outs = [key_of[id(o.storage)] for o in node.outputs]
            touched = [key_of[id(o.storage)] for o in node.inputs] + outs
            if not node.op.inplace:
                produced_here.update(outs)
        for k in touched:
            first.setdefault(k, i)
            last[k] = i
    release: list[list[int]] = [[] for _ in steps]
    for k, i in last.items():
        if k in produced_here and k not in live:
            release[i].append(k)
    intervals = {k: (first[k], last[k]) for k in sorted(kernel_out) if k not in live}
    return release, intervals


ALIGN = memory.ARENA_ALIGN


def place(intervals: dict[int, tuple[int, int]], sizes: dict[int, int]) -> tuple[dict[int, int], int]:
    """Offsets in one arena for buffers with lifetimes ``[first step, last step]``:
    biggest first, each at the lowest 64-byte-aligned offset that overlaps no placed
    buffer whose lifetime intersects its own (a step that reads one buffer while it
    writes another needs both, so the intervals are closed). Returns the offsets and
    the arena's size. Greedy by size is the usual heuristic (TFLite, XLA): big buffers
    fragment the arena least when placed first."""
    offsets: dict[int, int] = {}
    placed: list[tuple[int, int, int, int]] = []  # offset, end, first, last
    top = 0
    for k in sorted(intervals, key=lambda k: (-sizes[k], intervals[k][0], k)):
        size = -(-sizes[k] // ALIGN) * ALIGN
        a, b = intervals[k]
        off = 0
        for o, e in sorted((o, e) for o, e, s, t in placed if s <= b and a <= t):
            if off + size <= o:
                break
            off = max(off, e)
        offsets[k] = off
        placed.append((off, off + size, a, b))
        top = max(top, off + size)
    return offsets, top


def binds(steps: Sequence[Any], offsets: dict[int, int]) -> list[list[tuple[int, int]]]:
    bind: list[list[tuple[int, int]]] = [[] for _ in steps]
    seen: set[int] = set()
    for i, st in enumerate(steps):
        if isinstance(st, KernelStep):
            for k in st.outputs:
                if k in offsets and k not in seen:
                    seen.add(k)
                    bind[i].append((k, offsets[k]))
    return bind
