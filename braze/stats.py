"""Counters that tell what braze did: nodes recorded, flushes, kernels, memory.

Tests assert on them (a view allocates nothing; a fused program is one kernel) and
``braze --stats`` prints them. ``live_bytes`` is the memory braze holds now;
``peak_bytes`` its high-water mark since the last reset.
"""

from __future__ import annotations

COUNTERS: dict[str, int] = dict(
    nodes_recorded=0,
    flushes=0,
    kernel_launches=0,
    c_calls=0,  # calls from Python into compiled code (a kernel launch, or one captured step's replay)
    kernels_compiled=0,
    allocations=0,
    pool_hits=0,
    bytes_allocated=0,
    live_bytes=0,
    peak_bytes=0,
    plan_hits=0,
    plan_misses=0,
    unfused_flushes=0,  # flushes the fused executor left to the reference executor (it says why on stderr, once)
    data_reads=0,  # sync points that read a tensor's data into Python (numpy, item, printing, indexing)
    graph_launches=0,  # CUDA graphs replayed (a cuda plan run again over the same buffers: one launch)
    graphs_captured=0,  # CUDA graphs captured (a cuda plan run a second time over the same buffers)
)


def stats() -> dict[str, int]:
    """A snapshot of the counters."""
    return dict(COUNTERS)


def reset_stats() -> None:
    """Zero the counters; ``peak_bytes`` restarts from what is live now."""
    for k in COUNTERS:
        if k != "live_bytes":
            COUNTERS[k] = 0
    COUNTERS["peak_bytes"] = COUNTERS["live_bytes"]
