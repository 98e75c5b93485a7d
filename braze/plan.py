"""Plans: a flushed stream, scheduled and compiled once, replayed when it comes again.

The flushed nodes are put in a *relative form* (after Burn's fusion streams): storages
are numbered by first appearance, so two flushes that do the same thing to different
tensors read the same; constants are storages too, so a different scalar value is the
same form. The form, with which of its results Python can still reach, is the key of a
stored ``Plan``: the schedule (fused kernels and extern steps) with every kernel
compiled. A hit runs it with no scheduling and no compiling (``plan_hits``); a miss
schedules, compiles and stores it (``plan_misses``). After ``BRAZE_PLAN_CAP``
different forms (default 512) a stream that never repeats runs on the reference
executor instead of growing the cache, and braze says so once.

Liveness: a result is *live* if something besides the stream refers to its storage
(a Tensor the user holds). Only live results and results read outside their kernel
are ever written to memory; the rest stay in registers. The count uses CPython's
reference counts, which errs only toward "live" (an extra store), never the other way.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .codegen.c import kernel_source, module_source
from .errors import CompileError
from .runtime import cpu, memory
from .runtime import reference
from .schedule import ExternStep, KernelStep, schedule
from .stats import COUNTERS


@dataclass
class CompiledKernel:
    step: KernelStep
    fn: Any


@dataclass
class Plan:
    steps: list[CompiledKernel | ExternStep]
    materialized: set[int]
    #: after step i, these storages (needed only inside the plan) are dead: their
    #: buffers go back to the pool for the steps that follow.
    release: list[list[int]]


_PLAN_FORMAT = 1  # bump when the stored schedule's shape changes
_plans: dict[Any, Plan] = {}
_variants: dict[Any, int] = {}  # how many shapes each shape-free form has been built for

def _shape_variants() -> int:
    """How many shapes one program is compiled for before braze stops specialising it."""
    return int(os.environ.get("BRAZE_SHAPE_VARIANTS", "2"))

_warned: set[str] = set()


def _cap() -> int:
    return int(os.environ.get("BRAZE_PLAN_CAP", "512"))


def _attrs_key(attrs: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, v if not isinstance(v, float) or v == v else "nan") for k, v in attrs.items()))


def relative_form(nodes: Sequence[Any]) -> tuple[tuple[Any, ...], list[Any], dict[int, int], list[int]]:
    """The key of a node list, its storages in first-appearance order, the map from
    storage identity to relative id, and how many operand references each has."""
    storages: list[Any] = []
    key_of: dict[int, int] = {}
    refs: list[int] = []
    form = []

    def rel(st: Any) -> int:
        k = key_of.get(id(st))
        if k is None:
            k = key_of[id(st)] = len(storages)
            storages.append(st)
            refs.append(0)
        refs[k] += 1
        return k

    for node in nodes:
        ins = tuple((rel(o.storage), o.layout, o.storage.dtype.name, o.storage.array is None) for o in node.inputs)
        outs = tuple((rel(o.storage), o.layout, o.storage.dtype.name) for o in node.outputs)
        form.append((node.op.name, _attrs_key(node.attrs), ins, outs))
    return tuple(form), storages, key_of, refs


def _live(storages: list[Any], refs: list[int], produced: set[int]) -> frozenset[int]:
    # While counting, a storage is referenced by the list and by getrefcount's argument;
    # anything beyond those and the stream's operands is a user's tensor (or a harmless
    # extra reference, which only makes braze store a value it could have skipped).
    live = set()
    for k in produced:
        if sys.getrefcount(storages[k]) > 2 + refs[k]:
            live.add(k)
    return frozenset(live)


def _build(nodes: Sequence[Any], key_of: dict[int, int], live: frozenset[int], key: Any) -> Plan:
    """Schedule (or load the stored schedule of) a stream, then compile its kernels."""
    path = _plan_path(key)
    stored = _load(path) if path is not None else None
    if stored is None:
        sched = schedule(nodes, key_of, set(live))
        stored = (sched.steps, sched.materialized, _releases(sched.steps, nodes, key_of, live))
        if path is not None:
            _save(path, stored)
    steps, materialized, release = stored
    return Plan(_compile(steps), materialized, release)


def _compile(sched_steps: Sequence[Any]) -> list[CompiledKernel | ExternStep]:
    kernel_steps = [s for s in sched_steps if isinstance(s, KernelStep)]
    compiled: dict[int, Any] = {}
    if kernel_steps:
        # Identical kernels (every layer of a model computes the same thing on other
        # weights) are compiled once: kernels read their buffers through arguments.
        unique: dict[str, str] = {}
        name_of: dict[int, str] = {}
        for st in kernel_steps:
            body = kernel_source(st.kernel, "KERNEL")
            name_of[id(st)] = unique.setdefault(body, f"braze_k{len(unique)}")
        source = module_source([body.replace("KERNEL", n, 1) for body, n in unique.items()])
        lib = cpu.compile_c(source, list(unique.values()))
        fns = {n: lib.function(n, [ctypes.c_void_p, ctypes.c_int64]) for n in unique.values()}
        for st in kernel_steps:
            compiled[id(st)] = fns[name_of[id(st)]]
    return [CompiledKernel(s, compiled[id(s)]) if isinstance(s, KernelStep) else s for s in sched_steps]


# -- plans on disk: a new process starts with the schedules of earlier ones ----------------

_code_id: str | None = None


def _code_identity() -> str:
    """A hash of the code that decides a schedule, so a stored plan from another braze
    (a new release, or a working tree being edited) is never replayed."""
    global _code_id
    if _code_id is None:
        root = Path(__file__).parent
        h = hashlib.sha256()
        for f in sorted([root / "plan.py", root / "ir.py", root / "ops" / "lowering.py",
                         *(root / "schedule").glob("*.py")]):
            h.update(f.read_bytes())
        _code_id = h.hexdigest()
    return _code_id


def _plan_path(key: Any) -> Path | None:
    try:
        blob = pickle.dumps((key, _PLAN_FORMAT, _code_identity()), protocol=5)
        directory = cpu.cache_dir() / "plans"
        directory.mkdir(mode=0o700, exist_ok=True)
    except Exception:  # unpicklable attributes, unwritable cache: just do not store
        return None
    return directory / (hashlib.sha256(blob).hexdigest() + ".plan")


def _load(path: Path) -> Any:
    """A stored schedule, or None if absent or unreadable (then it is rebuilt)."""
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception:
        path.unlink(missing_ok=True)
        return None


def _save(path: Path, stored: Any) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            pickle.dump(stored, f, protocol=5)
        os.replace(tmp, path)
    except Exception:
        tmp.unlink(missing_ok=True)


def _releases(steps: Sequence[Any], nodes: Sequence[Any], key_of: dict[int, int], live: frozenset[int]) -> list[list[int]]:
    """Liveness inside the plan: the last step that reads each internal buffer."""
    last: dict[int, int] = {}
    produced_here: set[int] = set()
    for i, st in enumerate(steps):
        if isinstance(st, KernelStep):
            reads = st.args
            produced_here.update(st.outputs)
        else:
            node = nodes[st.node]
            reads = [key_of[id(o.storage)] for o in node.inputs]
            if not node.op.inplace:
                produced_here.update(key_of[id(o.storage)] for o in node.outputs)
        for k in reads:
            last[k] = i
    out: list[list[int]] = [[] for _ in steps]
    for k, i in last.items():
        if k in produced_here and k not in live:
            out[i].append(k)
    return out


def _run(plan: Plan, nodes: Sequence[Any], storages: list[Any]) -> None:
    nthreads = cpu.get_num_threads()
    for i, step in enumerate(plan.steps):
        if isinstance(step, ExternStep):
            try:
                reference.run_node(nodes[step.node])
            except Exception:
                _finish_before(nodes, step.node)
                raise
            for k in plan.release[i]:
                storages[k].array = None
            continue
        kstep = step.step
        for k in kstep.outputs:
            st = storages[k]
            if st.array is None:
                st.array = memory.allocate(st.dtype.np, st.numel, "kernel")
        ptrs = (ctypes.c_void_p * len(kstep.args))(*[storages[k].array.ctypes.data for k in kstep.args])
        COUNTERS["kernel_launches"] += 1
        step.fn(ptrs, nthreads)
        for k in plan.release[i]:
            storages[k].array = None


def _finish_before(nodes: Sequence[Any], failed: int) -> None:
    """A data-dependent error in an extern step (an index out of range): compute every
    result recorded before the failing node that a fused kernel had not produced yet,
    so that, as with the reference executor, only what follows the error is lost. Only
    pure nodes can be pending here (writes run in order), so nothing runs twice."""
    for node in nodes[:failed]:
        if not node.op.inplace and any(o.storage.array is None for o in node.outputs):
            reference.run_node(node)


def execute(nodes: "deque[Any]") -> None:
    """The fused executor: find or build the plan of ``nodes`` and run it."""
    form, storages, key_of, refs = relative_form(nodes)
    produced = {key_of[id(o.storage)] for n in nodes if not n.op.inplace for o in n.outputs}
    live = _live(storages, refs, produced)
    key = (form, live)
    plan = _plans.get(key)
    unfused = ""  # why this stream runs on the reference executor instead, if it does
    if plan is None:
        shape_free = tuple((op, attrs, tuple(i[0] for i in ins)) for op, attrs, ins, _ in form)
        seen = _variants[shape_free] = _variants.get(shape_free, 0) + 1
        if seen > _shape_variants():
            unfused = ("the same program keeps arriving with new shapes (decoding with a growing KV cache "
                       "does this); kernels are specialised to shapes, so such a program runs unfused")
        elif len(_plans) >= _cap():
            unfused = f"{len(_plans)} different streams seen without repeats (BRAZE_PLAN_CAP)"
        else:
            COUNTERS["plan_misses"] += 1
            try:
                plan = _build(list(nodes), key_of, live, key)
                _plans[key] = plan
            except CompileError as err:
                # A kernel braze generated does not compile: a bug in braze, not in the
                # user's program. Run this stream unfused (correct, slower).
                unfused = f"a generated kernel failed to compile (please report this: {err})"
    else:
        COUNTERS["plan_hits"] += 1
    if plan is None:
        key_head = unfused.split(" (")[0]
        if key_head not in _warned:
            _warned.add(key_head)
            print(f"braze: {unfused}: running it on the reference executor", file=sys.stderr)
        del storages  # let the reference executor free intermediates as it goes
        reference.run(nodes)
        return
    _run(plan, list(nodes), storages)
    nodes.clear()
    for st in storages:
        if st.producer is not None:
            st.producer = None


def clear() -> None:
    """Forget every stored plan (tests)."""
    _plans.clear()
    _variants.clear()
