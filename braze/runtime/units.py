"""Compile units: a plan's kernels split into C translation units compiled in parallel.

A plan's kernels used to be one C module (two: generic and specialised kernels), compiled
by one compiler process. On the first prompt of SmolLM2 that was ~150 KB of C and ~2 s of
gcc at -O3 per module, one after the other, on a machine whose other cores sat idle; and
most of it was one kernel: the attention chain (~43 KB of C, 1.2 s of gcc at -O3, against
~0.05 s for a quantized matmul's epilogue and prologue, measured kernel by kernel). So:

- ``partition`` splits a module's kernels into units: each *heavy* kernel (``HEAVY_CHARS``
  of C or more) alone, the light ones in as many balanced groups as there are cores left
  over. A module small enough to gain nothing (no heavy kernel and fewer than
  ``LIGHT_SPLIT`` kernels) stays one unit, whose text is exactly the module it was, so
  its cached object is the one compiled before units existed. A unit names its kernels
  by their position in the unit, so a heavy kernel's unit is the same text wherever it
  comes from (the attention of another flush of the same model): one compile, one object.
- ``compile_units`` compiles the units not in the cache concurrently, each in its own
  compiler process (threads only wait on them), the biggest first, at most ``jobs()``
  at a time: the cores this process may run on, or ``$BRAZE_COMPILE_JOBS``.

Units change nothing a kernel computes: each is the same kernel text with the same
headers and flags (a quantized matmul's unit instantiates the same quant.h code). What
was tried and not kept (the measurements are in the report of issue 15's item 6):
compiling first at a lower optimisation level and swapping the -O3 object in later.
-O0, -O1, -Og and -O2 -fpeel-loops give other results (FMA contraction and inlining
differ: logits off by up to 0.04), -O1 -fexpensive-optimizations and -O2 matched on one
model but run decoding 30x slower than -O3 and compile only 1.3-2x faster.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from . import cpu
from .threads import _allowed_cpus

__all__ = ["HEAVY_CHARS", "LIGHT_SPLIT", "jobs", "partition", "compile_units"]

#: a kernel of at least this much C is compiled alone (attention chains: 30-45 KB; the
#: next biggest kernels of an LLM step are ~2 KB)
HEAVY_CHARS = 8000
#: a module of light kernels only is split from this many kernels on (each unit pays
#: ~0.15 s to parse the headers: a few kernels are not worth a second process)
LIGHT_SPLIT = 8


def jobs() -> int:
    """Compiler processes run at once: ``$BRAZE_COMPILE_JOBS``, else the CPUs this
    process may run on."""
    raw = os.environ.get("BRAZE_COMPILE_JOBS", "").strip()
    if raw:
        try:
            return max(1, int(raw))
        except ValueError:
            pass
    return max(1, len(_allowed_cpus()))


def partition(bodies: Sequence[str], n_jobs: int | None = None) -> list[list[int]]:
    """The units of a module whose kernels have these sources: lists of indices into
    ``bodies``, each in their order. One unit holding every kernel where splitting
    gains nothing; else every heavy kernel alone, then the light ones in up to
    ``n_jobs - heavy`` groups (at least one) balanced by size, biggest first."""
    n_jobs = jobs() if n_jobs is None else n_jobs
    heavy = [i for i, b in enumerate(bodies) if len(b) >= HEAVY_CHARS]
    light = [i for i, b in enumerate(bodies) if len(b) < HEAVY_CHARS]
    if len(bodies) < 2 or n_jobs < 2 or (not heavy and len(light) < LIGHT_SPLIT):
        return [list(range(len(bodies)))] if bodies else []
    groups: list[list[int]] = [[] for _ in range(min(len(light), max(1, n_jobs - len(heavy))))]
    load = [0] * len(groups)
    for i in sorted(light, key=lambda i: (-len(bodies[i]), i)):
        g = load.index(min(load))
        groups[g].append(i)
        load[g] += len(bodies[i])
    return [[i] for i in heavy] + [sorted(g) for g in groups if g]


def compile_units(modules: Sequence[tuple[str, Sequence[str]]]) -> list[cpu.CompiledLibrary | None]:
    """Each ``(source, kernel names)`` compiled (or loaded from the cache), None for a
    module without kernels. The ones not cached compile concurrently, the biggest
    first; a unit that fails raises its ``CompileError`` once the others are done."""
    out: list[cpu.CompiledLibrary | None] = [None] * len(modules)
    todo = [i for i, (src, names) in enumerate(modules) if names]
    fresh = [i for i in todo if not cpu.is_cached(*modules[i])]
    n_jobs = min(jobs(), len(fresh))
    if n_jobs > 1:
        fresh.sort(key=lambda i: -len(modules[i][0]))
        with ThreadPoolExecutor(max_workers=n_jobs, thread_name_prefix="braze-cc") as pool:
            futures = {i: pool.submit(cpu.compile_c, *modules[i]) for i in fresh}
        for i, fut in futures.items():
            out[i] = fut.result()  # re-raises a unit's CompileError
    for i in todo:
        if out[i] is None:
            out[i] = cpu.compile_c(*modules[i])
    return out
