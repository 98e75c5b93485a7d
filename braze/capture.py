"""Captured steps: a step recorded once, replayed with its position as a value.

A decoding step of a language model records about 750 ops in Python; replaying its
stored plan takes a fraction of that. ``StepCapture`` watches a step function run
normally at three consecutive positions (each run records, flushes and replays its
fused plans as usual), then replays the plans of the first run directly, with no
recording and no per-op Python: what differs from one position to the next is found
by comparing the three runs (``step_diff.py``), and must be affine in the position:

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

How a replay moves those values is the device's (``Replayer``). On the CPU it is one
call into compiled code (``runtime/cpu_replay.py``): it writes the moving pointers and
scalars, then calls every kernel of the step in order, over argument arrays built once
and the plans' arenas held by the capture; so a step whose plans have an extern step
(numpy between kernels) is not captured. On cuda (``runtime/cuda_replay.py``) they are
written into one device buffer the kernels read, so every step launches the same
kernels over the same arguments: one CUDA graph on a GPU. The replay returns the
step's output array as a view of the same buffer every time (as a CUDA graph's static
outputs; on a GPU, a copy on the host): read it before the next replay. The garbage
collector is paused during a replay, and nothing is allocated.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, Protocol

import numpy as np

from . import plan as planmod
from .layout import Layout
from .runtime import cpu_replay
from .step_diff import Segment, segment
from .storage import Storage, host_view
from .tensor import Tensor

OBSERVATIONS = 3  # positions p, p + 1, p + 2: two differences, so affinity is checked, not assumed
ATTEMPTS = 3  # sets of observations before giving up (the first steps may still flush work left before them)


class Replayer(Protocol):
    """A device's replay of the captured segments: ``run(t)``, t positions past the first."""

    def run(self, t: int) -> None: ...


class StepCapture:
    """Observe ``fn`` at consecutive positions, then replay it: ``observe(pos, fn)``
    until ``ready`` (or ``reason`` says why it never will be), then ``replay(pos)``."""

    def __init__(self, static: bool = False, outputs: dict[Any, np.ndarray] | None = None,
                 arena: cpu_replay.SharedArena | None = None) -> None:
        self.static = static
        # Captures that never run at the same time and whose caller copies what it reads
        # of a replay's output before the next (a server's step buckets) may share one
        # output buffer per dtype and size: pass them one dict. Else each holds its own.
        # Such captures may share one arena too (their plans' internal buffers, dead
        # between runs): pass them one ``SharedArena``.
        self.outputs = outputs
        self.arena = arena
        self.observations = 2 if static else OBSERVATIONS
        self.runs: list[tuple[int, list[Any], Tensor]] = []
        self.segments: list[Segment] | None = None
        self.out: tuple[Storage, Layout] | None = None
        self.first = 0
        self.driver: Replayer | None = None
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
            driver.run(t)
        finally:
            if enabled:
                gc.enable()
        st, lay = self.out
        return host_view(st.data(), lay.shape, lay.strides, lay.offset)

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
            seg = segment(list(ran), made, self.static)
            if isinstance(seg, str):
                return seg
            segments.append(seg)
        st = out_a._storage
        if self.outputs is not None and all(isinstance(seg.plan, planmod.Plan) for seg in segments) \
                and isinstance(st.array, np.ndarray):  # CPU plans: bound to the array below, by address
            shared = self.outputs.setdefault((st.dtype.name, st.numel), st.array)
            if shared is not st.array:
                st.array = shared
        try:
            self.driver = _replayer(segments, self.arena)
        except ValueError as e:
            return str(e)
        self.segments, self.first = segments, p0
        self.out = (out_a._storage, out_a._layout)
        return ""


def _replayer(segments: list[Segment], arena: cpu_replay.SharedArena | None = None) -> Replayer:
    """The replay of ``segments`` on their device (all on one; on the CPU their arenas
    from ``arena`` where given); ``ValueError`` says why they cannot be replayed."""
    if all(isinstance(seg.plan, planmod.Plan) for seg in segments):
        extern = next((seg.nodes[st.node].op.name for seg in segments for st in seg.plan.steps
                       if isinstance(st, planmod.ExternStep)), None)
        if extern is not None:
            raise ValueError(f"an extern step ({extern}) is not compiled code: the step cannot be one call")
        for seg in segments:
            cpu_replay.prepare(seg, arena)
        driver = cpu_replay.Driver(segments)
        # Bound: the replay needs the storages, not the nodes (~800 of them a step, with
        # their operands: 0.75 MiB a capture, 21 of a server's 28 decoding buckets). The
        # driver keeps the few its index checks name; the ops' names stay.
        for seg in segments:
            seg.names = [n.op.name for n in seg.nodes]
            seg.nodes = []
        return driver
    from .runtime import cuda, cuda_replay  # (loaded already: a cuda plan ran)
    if not all(isinstance(seg.plan, cuda.Plan) for seg in segments):
        raise ValueError("the step's flushes run on more than one device")
    return cuda_replay.Replay(segments)
