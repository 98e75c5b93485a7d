"""CUDA graphs for cuda plans run again over the same buffers: one launch instead of one
per kernel, as PyTorch 2's CUDA graphs do.

A graph bakes in every address its kernels read and write, so a plan's graphs are kept
by the tuple of its launches' addresses: the first run over a set of buffers launches
the kernels one by one (which also compiles and loads them), the second captures them
into a graph on braze's stream and launches it, later ones replay it. A captured
decoding step (``cuda_replay.py``), whose launches are the same at every position, runs
as one graph launch. ``BRAZE_CUDA_GRAPHS=0`` turns graphs off. On a GPU only: the interpreter
launches one by one.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Callable

from ..stats import COUNTERS
from . import cuda_memory

#: graphs kept per plan (by address set), least recently used dropped first
PER_PLAN = 8


def enabled() -> bool:
    return os.environ.get("BRAZE_CUDA_GRAPHS", "1").strip() != "0"


class Graphs:
    """One plan's graphs by the addresses they were captured over, and the plan's
    bounds-check buffer (one per plan, so a captured address stays valid)."""

    def __init__(self) -> None:
        self.seen: OrderedDict[tuple[int, ...], Any] = OrderedDict()  # addresses -> None (seen once) or exec
        self.errors: Any = None

    def run(self, key: tuple[int, ...], launch: Callable[[bool], None], kernels: int) -> None:
        """Launch the plan's kernels over the buffers whose addresses are ``key``:
        ``launch(count)`` launches them one by one, on braze's stream."""
        if kernels < 2 or not enabled():
            launch(True)
            return
        if key not in self.seen:
            self.seen[key] = None
            self._trim()
            launch(True)
            return
        self.seen.move_to_end(key)
        graph = self.seen[key]
        if graph is None:
            graph = self.seen[key] = _capture(lambda: launch(False))
            COUNTERS["graphs_captured"] += 1
        d, stream = cuda_memory.driver(), cuda_memory.stream()
        cuda_memory.check(d.cuGraphLaunch(graph, stream))
        COUNTERS["graph_launches"] += 1

    def _trim(self) -> None:
        while len(self.seen) > PER_PLAN:
            _key, graph = self.seen.popitem(last=False)
            if graph is not None:
                cuda_memory.check(cuda_memory.driver().cuGraphExecDestroy(graph))

    def __del__(self) -> None:
        try:
            for graph in self.seen.values():
                if graph is not None:
                    cuda_memory.driver().cuGraphExecDestroy(graph)
        except Exception:  # at interpreter exit the driver may be gone: nothing to free then
            pass


def _capture(launch: Callable[[], None]) -> Any:
    """The executable graph of what ``launch`` queues on braze's stream."""
    d, stream = cuda_memory.driver(), cuda_memory.stream()
    cuda_memory.check(d.cuStreamBeginCapture(stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
    try:
        launch()
    finally:
        graph = cuda_memory.check(d.cuStreamEndCapture(stream))
    exe = cuda_memory.check(d.cuGraphInstantiate(graph, 0))
    cuda_memory.check(d.cuGraphDestroy(graph))
    return exe
