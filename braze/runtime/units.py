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

Two tiers, both -O3 with the same flags
    gcc decides what to inline by the size of the translation unit, so a unit's machine
    code is not its module's (the decoding attention kernel alone: 1455 instructions, in
    its module 1502; in SmolLM2's two-flush modules of before, the quantized matmul was
    inlined into each kernel, in a unit of light kernels it is called). Decoding on
    units measured within noise of the modules (1 thread, CPU time per step, a loaded
    machine: +-3%), but warm code should be what one module compiles to, so units are
    the first tier: a plan whose whole modules are not cached runs on its units at once,
    while ``later`` compiles the whole modules in a background process (gcc at nice 19:
    it takes what the running process leaves; it outlives a process that ends first)
    and then swaps each kernel's function for the whole module's; a captured step
    (``capture.py``) sees the swap (``swaps``) and rebuilds its array of functions
    before its next replay. The next process finds the whole modules cached and never
    uses the units. The tiers compute the same bits (SmolLM2's logits over a prefill
    and 20 steps: equal): the same kernel text and flags, and the matmul hands its sums
    to the epilogue through memory, so inlining it cannot fuse a multiply of one with
    an add of the other. (Since the quantized matmul became a machine-wide library,
    ``libraries.py``, neither tier compiles or inlines it: a unit of light kernels went
    from ~2.1 to ~0.5 s of gcc on SmolLM2's prompt.)

Compiling ahead
    ``ahead`` starts building a flush's units before the flush (``braze/ahead.py``
    records the decoding step before the prompt runs), in threads of their own; the
    flush's ``compile_units`` then waits on each one still compiling (the cache's file
    lock) rather than compiling it again.

    A lower optimisation level for the first tier was measured and not built: -O0, -O1,
    -Og and -O2 -fpeel-loops change results (FMA contraction and inlining differ: logits
    off by up to 0.04); -O2 and -O1 -fexpensive-optimizations matched -O3 on SmolLM2 but
    by no rule, and decode 30x slower while compiling only 1.3-2x faster.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from . import cpu, libraries
from .threads import _allowed_cpus

__all__ = ["HEAVY_CHARS", "LIGHT_SPLIT", "jobs", "partition", "compile_units", "ahead", "later", "swaps", "wait"]

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


def compile_units(modules: Sequence[tuple[str, Sequence[str]]],
                  meanwhile: Callable[[], None] | None = None) -> list[cpu.CompiledLibrary | None]:
    """Each ``(source, kernel names)`` compiled (or loaded from the cache), None for a
    module without kernels. The ones not cached compile concurrently, the biggest
    first, with any machine-wide library they link against that is missing
    (``libraries.py``), which is loaded before them; a unit that fails raises its
    ``CompileError`` once the others are done. ``meanwhile`` runs here once the
    compilers have started (work the caller would otherwise do before or after them:
    storing the plan), so it costs no wall time of its own beside a compile."""
    out: list[cpu.CompiledLibrary | None] = [None] * len(modules)
    todo = [i for i, (src, names) in enumerate(modules) if names]
    qtypes, builds = _builds(modules)
    if builds and (meanwhile is not None or jobs() > 1):
        with ThreadPoolExecutor(max_workers=min(jobs(), len(builds)), thread_name_prefix="braze-cc") as pool:
            futures = [pool.submit(cpu.build, src, names, directory=d) for src, names, d in builds]
            if meanwhile is not None:
                meanwhile()
        for fut in futures:
            fut.result()  # re-raises a unit's CompileError
    elif meanwhile is not None:
        meanwhile()
    libraries.load(qtypes)
    for i in todo:
        out[i] = cpu.compile_c(*modules[i])
    return out


def _builds(modules: Sequence[tuple[str, Sequence[str]]]) -> tuple[list[str], list[tuple[str, Sequence[str], Path | None]]]:
    """The quant types whose libraries ``modules`` link against, and what is not built
    yet of those libraries and of the modules: (source, names, directory), biggest first."""
    sources = [src for src, names in modules if names]
    qtypes = libraries.needed(sources)
    runtime = cpu.runtime_dir()
    builds: list[tuple[str, Sequence[str], Path | None]] = [
        (src, [], runtime) for src in libraries.sources(qtypes) if not cpu.is_cached(src, [], directory=runtime)]
    builds += [(src, names, None) for src, names in modules if names and not cpu.is_cached(src, names)]
    builds.sort(key=lambda b: -len(b[0]))
    return qtypes, builds


def ahead(modules: Sequence[tuple[str, Sequence[str]]]) -> bool:
    """Start compiling ``modules`` (and their libraries) into the cache in the background,
    for a flush that will want them later (``braze/ahead.py``); that flush's
    ``compile_units`` waits on a unit still compiling (the cache's file lock) instead of
    compiling it again. A failure is left for that flush to meet and report. Whether any
    compile started."""
    _, builds = _builds(modules)
    if not builds:
        return False
    global _ahead_pool
    with _pending_lock:
        if _ahead_pool is None:
            _ahead_pool = ThreadPoolExecutor(max_workers=jobs(), thread_name_prefix="braze-cc-ahead")
        pool = _ahead_pool
    for src, names, d in builds:
        pool.submit(cpu.build, src, names, directory=d)
    return True


#: one queue for every compile ahead, first come first served: a flush wanted sooner
#: (the prompt's) is asked for first, and its units do not share the cores with those
#: of a flush wanted later (the decoding step's) until a compiler of its is done
_ahead_pool: ThreadPoolExecutor | None = None


_pending: list[threading.Thread] = []
_pending_lock = threading.Lock()
_swaps = [0]
#: background compiles that failed (a generated module the compiler rejects): the units stay
failures: list[BaseException] = []


def swaps() -> int:
    """How many times kernels have been swapped for their whole module's: a captured
    step built before the last swap rebuilds its functions."""
    return _swaps[0]


def later(modules: Sequence[tuple[str, Sequence[str]]], targets: Sequence[tuple[Any, int, str]]) -> None:
    """Compile ``modules`` in the background, then set each target's ``fn`` (``(kernel,
    module index, name)``, a ``plan.CompiledKernel``) to that module's function ``name``.

    The compiling is a process of its own (``python -m braze.runtime.units FILE``, its
    compilers at nice 19) that outlives this one: a short ``braze generate`` that ends
    before the modules are built neither waits for them nor leaves them half-written;
    they land in the cache for the next process. A thread here waits for it, loads the
    modules from the cache and swaps."""
    todo = [(src, list(names)) for src, names in modules if names]
    # the compiler process starts here, not in the thread: a process that ends at once
    # (a daemon thread dies with it) still leaves its modules compiling
    child = None
    if not all(cpu.is_cached(src, names) for src, names in todo):
        try:
            child = _compile_elsewhere(todo)
        except OSError:  # no process to be had: the thread compiles them itself
            pass

    def run() -> None:
        try:
            if child is not None:
                child.wait()
            libraries.load(libraries.needed([src for src, _ in todo]))
            libs = [cpu.compile_c(src, names) if names else None for src, names in modules]
            for kernel, m, name in targets:
                lib = libs[m]
                assert lib is not None
                kernel.fn = lib.function(name, [ctypes.c_void_p, ctypes.c_int64])
        except Exception as e:  # the units stay: correct, a little slower
            failures.append(e)
        else:
            _swaps[0] += 1
        finally:
            with _pending_lock:
                _pending.remove(thread)

    thread = threading.Thread(target=run, name="braze-cc-later", daemon=True)
    with _pending_lock:
        _pending.append(thread)
    thread.start()


def _compile_elsewhere(todo: list[tuple[str, list[str]]]) -> subprocess.Popen[bytes]:
    """A process of its own compiling ``todo`` into the cache (it outlives this one)."""
    directory = cpu.cache_dir()
    fd, path = tempfile.mkstemp(dir=directory, prefix=".later-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(todo, f)
    root = str(Path(__file__).resolve().parents[2])  # this braze, wherever it was imported from
    env = dict(os.environ, BRAZE_CACHE_DIR=str(directory),
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen([sys.executable, "-m", "braze.runtime.units", path], env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _idle_class() -> None:
    """Run this process and the compilers it starts in the idle scheduling class.

    nice 19 is a small share, not none: on a machine whose cores a 2-thread decoding
    step fills, its gcc still takes a core for a slice now and then, and the step's
    other thread waits for it at the next barrier (a late step, P99). A SCHED_IDLE task
    weighs a fifth of a nice-19 one, never preempts a waking normal task and is
    preempted by one at once, so the compile runs on what the step leaves (its
    threads' sleeps, the time between steps). Inherited by the gcc processes; where it
    is refused (not Linux), nice 19 alone remains."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def _main(path: str) -> None:
    """The background compile ``later`` starts: the modules listed in ``path`` (JSON
    ``[[source, names], ...]``, removed here once they are built: while it is there, a
    compile is running in the cache, which is what ``bench/coldstart.py`` waits on),
    compiled into the cache at nice 19 in the idle scheduling class."""
    _idle_class()
    try:
        with open(path) as f:
            todo = json.load(f)
        for src, names in todo:  # built, not loaded: their libraries need not be loaded here
            cpu.build(src, names, background=True)
    finally:
        os.unlink(path)


def wait(timeout: float | None = None) -> bool:
    """Wait for the background compiles started so far; whether none is left."""
    with _pending_lock:
        threads = list(_pending)
    for t in threads:
        t.join(timeout)
    with _pending_lock:
        return not _pending


if __name__ == "__main__":
    _main(sys.argv[1])
