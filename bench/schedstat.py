"""Why a timed step was slow: how long this process's threads waited for a CPU.

Linux keeps, per thread, the time it ran and the time it sat runnable on a run queue
waiting for a CPU (``/proc/self/task/<tid>/schedstat``: run ns, wait ns, slices). A
decoding step at N threads is N threads meeting at barriers: when another process
takes a core from one of them, the others wait at the next barrier, and the step is
late by about the time that thread waited. So the wait summed over the process's
threads, sampled before and after each step, tells a step that braze made slow
(nobody waited) from one the machine made slow (a thread waited as long as the step
was late). ``bench/llm.py`` records it per step beside the step's time.
"""

from __future__ import annotations

import os

import numpy as np

TASKS = "/proc/self/task"
#: a step whose threads waited for a CPU more than this share of the median step is
#: "descheduled": its lateness is the machine's, not the step's
DESCHEDULED = 0.05


def runqueue_wait_ns() -> int | None:
    """Nanoseconds this process's threads have waited runnable for a CPU, summed over
    the threads alive now (None where the kernel does not say: not Linux, or no
    schedstats)."""
    total = 0
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return None
    seen = False
    for tid in tids:
        try:
            with open(f"{TASKS}/{tid}/schedstat") as f:
                fields = f.read().split()
        except OSError:  # the thread ended meanwhile
            continue
        if len(fields) >= 2:
            total += int(fields[1])
            seen = True
    return total if seen else None


def split(step_ms: np.ndarray, wait_ms: np.ndarray) -> dict[str, float | int | None]:
    """The steps' P99/P50 over the steps no thread was descheduled in, and how many
    were (``wait_ms``: each step's run-queue wait, as ``step_ms``)."""
    p50 = float(np.percentile(step_ms, 50))
    calm = step_ms[wait_ms <= DESCHEDULED * p50]
    ratio = float(np.percentile(calm, 99) / np.percentile(calm, 50)) if len(calm) else None
    return {"descheduled_steps": int(len(step_ms) - len(calm)), "p99_over_p50_not_descheduled": ratio,
            "runqueue_wait_ms_total": float(wait_ms.sum())}
