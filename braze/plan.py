"""Plans: a flushed stream, scheduled and compiled once, replayed when it comes again.

The recorded nodes are put in a *relative form* (after Burn's fusion streams): storages
are numbered by first appearance, so two flushes that do the same thing to different
tensors read the same; constants are storages too, so a different scalar value is the
same form. The form is kept node by node while the stream records (``Form``, one entry
per node), and a cursor walks a trie of stored plans as it grows: every trie node is
one entry further into some stream braze has planned, and the node where a flushed
stream ended holds its plans keyed by which results Python can still reach. So at a
flush the plan is one dictionary look-up away, whatever the stream's length; a stream
whose cursor fell off the trie is a new program, which is scheduled, compiled and
inserted (``plan_misses``; a hit is ``plan_hits``). At most ``BRAZE_PLAN_CAP`` programs
(default 512; a program is its ops and dtypes, so its new shapes, which replay generic
kernels, do not count) keep plans: a new one past the cap evicts the program used least
recently (its plans, and the trie nodes no other plan needs), which, if it comes back,
is planned again from the schedule and the compiled objects on disk.

Liveness: a result is *live* if something besides the stream refers to its storage
(a Tensor the user holds). Only live results and results read outside their kernel
are ever written to memory; the rest stay in registers. The count uses CPython's
reference counts, which errs only toward "live" (an extra store), never the other way.

Memory: a buffer that only the plan needs (a kernel's result read by a later step) is
placed at build time at an offset in one arena, by its lifetime inside the plan, so
buffers that are never needed at the same time share bytes; a run takes one block from
the pool for the whole arena.

The trie and the form are ``plan_trie.py``; this module builds, stores, evicts and runs
plans.
"""

from __future__ import annotations

import array
import ctypes
import functools
import io
import itertools
import os
import pickle
import re
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .codegen.generic import symbolize
from .codegen.c import kernel_source, module_source
from .codegen.c_stream import llc_bytes
from .codegen.headers import quant_source
from . import ir, plan_store, plan_trie
from .arena import binds, lifetimes, place
from .plan_trie import Form, forget, insert  # (the executor's: runtime/cuda.py stores its plans through plan.insert)
from .errors import CompileError, IndexOutOfRange
from .runtime import cpu, memory, units
from .runtime import reference
from .schedule import ExternStep, KernelStep, schedule
from .stats import COUNTERS
from .stream import NodeQueue, set_fused_executor


@dataclass
class CompiledKernel:
    step: KernelStep
    fn: Any
    #: a generic kernel's sizes (``codegen/generic.py``), held here, and their address:
    #: the argument after the step's buffers
    sizes: Any = None
    extra: tuple[int, ...] = ()
    #: a gathering kernel's bounds checks (``codegen/checks.py``): two int64 per check,
    #: the argument after the sizes; nonzero flags after a run raise ``IndexOutOfRange``
    err: Any = None


@dataclass
class Plan:
    steps: list[CompiledKernel | ExternStep]
    materialized: set[int]
    #: after step i, these storages (needed only inside the plan) are dead: their
    #: buffers are dropped (arena views, or extern results back to the pool).
    release: list[list[int]]
    #: byte offset in the arena of each buffer only the plan needs that a kernel writes
    offsets: dict[int, int] = field(default_factory=dict)
    #: bytes of the arena: at most the sum of those buffers, less where lifetimes do not overlap
    arena_bytes: int = 0
    #: before step i, these (storage, offset) get their arena view: at the first write,
    #: not earlier, so a buffer not yet computed still reads as pending if a step fails
    bind: list[list[tuple[int, int]]] = field(default_factory=list)
    compiled: bool = False  # building it compiled new kernels (what BRAZE_SHAPE_VARIANTS counts)
    program: Any = None  # its ops and dtypes: the unit the cap counts and evicts
    #: the rel ids its steps touch where ``run_stored`` may run it (``stored``), empty where it
    #: may not; None until asked
    direct: frozenset[int] | None = None


# bump when the stored schedule's shape changes (2: arena, 3: refs, 4: rendered C, 5: epilogues, 6: prologues,
# 7: generic kernels, 8: checksummed JSON, plan_store.py, 9: compile units, runtime/units.py)
_PLAN_FORMAT = 9
_variants: dict[Any, int] = {}  # how many builds of each shape-free form compiled new kernels
_shapes: dict[Any, int] = {}  # how many shapes of each program (its ops and dtypes) were built, least recent first
#: where each program's plans are: (trie entries, liveness, shape-free form) per plan, for eviction
_homes: dict[Any, list[tuple[tuple[Any, ...], frozenset[int], Any]]] = {}
_program_key: dict[Any, Any] = {}  # each program in ``_shapes`` to its key there (one object)


class _Program(tuple[Any, ...]):
    """A program's ops and dtypes (``_refusal``) as the key of ``_shapes`` and ``_homes``,
    its hash taken once: every flush and every direct replay moves its program to the
    back of ``_shapes``, and a tuple of a stream's ops is hashed anew at each lookup
    (~0.7 us for a GELU's 25 ops). Equal to, and hashed as, the plain tuple."""

    hash: int

    def __new__(cls, ops: tuple[Any, ...]) -> "_Program":
        self = super().__new__(cls, ops)
        self.hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self.hash

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Program, (tuple(self),))  # hashed anew where unpickled (str hashes differ per process)


def _touch(program: Any) -> None:
    """A plan of ``program`` ran: it is now the most recently used (a dict keeps
    insertion order; popping first is one lookup fewer than asking first)."""
    n = _shapes.pop(program, None)
    if n is not None:
        _shapes[program] = n


def _shape_variants() -> int:
    """How many shapes one program compiles kernels for before its new shapes run on the
    reference executor (a shape whose kernels are all compiled already, as generic ones
    are, costs only its scheduling, and is never refused)."""
    return int(os.environ.get("BRAZE_SHAPE_VARIANTS", "4"))


_warned: set[str] = set()


def _cap() -> int:
    return int(os.environ.get("BRAZE_PLAN_CAP", "512"))


def _evict(program: Any) -> None:
    """Forget a program's plans: each one's trie entry, the trie nodes no other plan
    needs (marked dead: a form or a jit copy holding one walks anew), its shape counts."""
    for entries, live, shape_free in _homes.pop(program, ()):
        path = [plan_trie.root]
        for entry in entries:
            child = path[-1].children.get(entry)
            if child is None:
                break
            path.append(child)
        else:
            leaf = path[-1]
            if leaf.plans is not None:
                leaf.plans.pop(live, None)
                if not leaf.plans:
                    leaf.plans = None
            for depth in range(len(entries), 0, -1):
                node = path[depth]
                if node.plans or node.children:
                    break
                del path[depth - 1].children[entries[depth - 1]]
                node.dead = True
        if shape_free is not None:
            _variants.pop(shape_free, None)
    _shapes.pop(program, None)
    _program_key.pop(program, None)


def stored_plans() -> Iterator[Plan]:
    """Every CPU plan in the trie (tests, debugging)."""
    todo = [plan_trie.root]
    while todo:
        node = todo.pop()
        yield from (p for p in (node.plans or {}).values() if isinstance(p, Plan))
        todo.extend(node.children.values())


# -- building a plan ---------------------------------------------------------------------

def _build(nodes: Sequence[Any], form: Form, live: frozenset[int], key: Any, compile_new: bool = True,
           generic: bool = False) -> Plan | None:
    """Schedule (or load the stored schedule of) a stream, then compile its kernels.
    The stored schedule carries its rendered C too, so a new process neither schedules
    nor renders: it finds the compiled object by the source's hash and loads it. None,
    without ``compile_new``, when a module of its kernels is not compiled yet. With
    ``generic`` the kernels that can be are generic in their sizes."""
    (steps, materialized, release, offsets, arena_bytes, rendered), store = _scheduled(nodes, form, live, key, generic)
    fresh = not any(all(cpu.is_cached(source, names) for source, names in mods if names)
                    for mods in (rendered[0], rendered[3]) if mods)
    if fresh and not compile_new:
        store()
        return None
    _say_slow_steps(steps, nodes)
    return Plan(_compile(steps, rendered, store), materialized, release, offsets, arena_bytes, binds(steps, offsets),
                compiled=fresh)


_slow_said: set[str] = set()
#: schedules ``modules_ahead`` made or read for a flush still to come, by path: that
#: flush takes its own instead of reading it back (a few, the most recent)
_ahead: dict[Path, tuple[Any, ...]] = {}
_AHEAD_KEPT = 4


def _nothing() -> None:
    pass


def _scheduled(nodes: Sequence[Any], form: Form, live: frozenset[int], key: Any, generic: bool,
               keep: bool = False) -> tuple[tuple[Any, ...], Callable[[], None]]:
    """The stored schedule of a stream (steps, materialized, release, offsets, arena
    bytes, rendered C), scheduled and rendered now if it was not, and what stores it
    (writing it costs a third of scheduling it: the caller runs that beside the compiles
    it starts). ``keep``: also kept here for the flush that will want it."""
    path = _plan_path((key, generic))
    stored = _ahead.pop(path, None) if path is not None else None
    if stored is None and path is not None:
        stored = plan_store.load(path)
    store = _nothing
    if not (isinstance(stored, tuple) and len(stored) == 6):
        sched = schedule(nodes, form.key_of, set(live))
        release, intervals = lifetimes(sched.steps, nodes, form.key_of, live)
        offsets, arena_bytes = place(intervals, {k: form.storages[k].numel * form.storages[k].dtype.itemsize
                                                 for k in intervals})
        stored = (sched.steps, sched.materialized, release, offsets, arena_bytes, _render(sched.steps, generic))
        if path is not None:
            store = functools.partial(plan_store.save, path, stored)
    if keep and path is not None:
        _ahead[path] = stored
        while len(_ahead) > _AHEAD_KEPT:
            del _ahead[next(iter(_ahead))]
    return stored, store


def modules_ahead(nodes: "deque[Any]") -> tuple[Modules, Callable[[], None]]:
    """The C modules a flush of ``nodes`` (a queue being recorded) would compile first
    (its units, where it has them), scheduled and rendered now as that flush would,
    without running or planning anything: ``ahead.py`` compiles them while other work
    runs. Empty when the flush would find a plan, or run on the reference. Then what
    stores the schedule (to be called once the compiles have started); the flush finds
    it kept in memory meanwhile."""
    form = getattr(nodes, "form", None)
    if not isinstance(form, Form) or not cpu.compiler_available():
        return [], _nothing
    entries = form.complete(nodes)
    live = form.live()
    at = form.cursor()
    if at is not None and at.plans is not None and live in at.plans:
        return [], _nothing
    unfused, _, ops = _refusal(entries)
    if unfused:
        return [], _nothing
    try:
        stored, store = _scheduled(list(nodes), form, live, (tuple(entries), live), _shapes.get(ops, 0) > 0, keep=True)
    except CompileError:
        return [], _nothing
    rendered = stored[5]
    return list(rendered[3] or rendered[0]), store


def _say_slow_steps(steps: Sequence[Any], nodes: Sequence[Any]) -> None:
    """A quantized matmul left to the reference (a type without a kernel, operands the
    kernel cannot read in place) dequantizes its weight at every call: said once on
    stderr, whether the plan was scheduled now or found stored."""
    for st in steps:
        node = nodes[st.node] if isinstance(st, ExternStep) else None
        if node is not None and node.op.name == "qlinear":
            what = f"{node.attrs['qtype']} {tuple(node.inputs[1].layout.shape)}"
            if what not in _slow_said:
                _slow_said.add(what)
                print(f"braze: qlinear over a {what} weight runs on the reference executor (numpy, dequantizing "
                      "the weight at every call): no quantized matmul kernel reads it (BRAZE_DEBUG=1 says why)",
                      file=sys.stderr)


#: the C modules (source, kernel names) and each kernel step's (module, name); its sizes;
#: and the same kernels as compile units with each step's (unit, name), or no units
#: where each module is one (``runtime/units.py``)
Modules = list[tuple[str, list[str]]]
Rendered = tuple[Modules, list[tuple[int, str]], list[tuple[int, ...]], Modules, list[tuple[int, str]]]


def _render(sched_steps: Sequence[Any], generic: bool = False) -> Rendered:
    """The C of a schedule's kernels, in two modules: the generic kernels (with
    ``generic``; ``codegen/generic.py``), whose text, and so compiled object, is the same
    at every shape of the program that renders them alike, and the others; and, where
    they split, the same kernels as compile units (``runtime/units.py``: a plan whose
    modules are not compiled yet runs on its units, compiled in parallel, until its
    modules are). Identical kernels (every layer of a model computes the same thing on
    other weights) are rendered, and compiled, once: kernels read their buffers (and
    sizes) through arguments."""
    unique: list[dict[str, None]] = [{}, {}]  # generic, specialised: their bodies, in order
    step_bodies: list[tuple[int, str]] = []
    step_sizes: list[tuple[int, ...]] = []
    for st in sched_steps:
        if isinstance(st, KernelStep):
            g = symbolize(st.kernel) if generic else None
            if g:
                which, body = 0, kernel_source(g[0], "KERNEL", len(g[1]))
            else:
                which, body = 1, kernel_source(st.kernel, "KERNEL")
            unique[which].setdefault(body)
            step_bodies.append((which, body))
            step_sizes.append(g[1] if g else ())
    bodies = [list(u) for u in unique]
    modules, step_names = _modules([[b] for b in bodies], step_bodies)
    parts = [[[b[i] for i in unit] for unit in units.partition(b)] for b in bodies]
    if all(len(p) <= 1 for p in parts):
        return modules, step_names, step_sizes, [], []
    return (modules, step_names, step_sizes, *_modules(parts, step_bodies))


def _modules(parts: list[list[list[str]]], step_bodies: list[tuple[int, str]]) -> tuple[Modules, list[tuple[int, str]]]:
    """C modules of the kernels ``parts[generic or specialised][module]`` (their bodies,
    named KERNEL), and each kernel step's (module, name). A group without kernels is an
    empty module, so a plan's first module is always its generic one."""
    modules: Modules = []
    where: dict[tuple[int, str], tuple[int, str]] = {}
    for which, group in enumerate(parts):
        for bodies in group:
            names = [f"braze_{'gk'[which]}{j}" for j in range(len(bodies))]
            # every use of the name: a quantized matmul's epilogue and prologue are functions of
            # their own (KERNEL_ep, KERNEL_pro), so are a generic kernel's two bodies (KERNEL_s, KERNEL_p)
            modules.append((module_source([re.sub(r"\bKERNEL(?=(_ep|_pro|_s|_p)?\b)", n, b)
                                           for b, n in zip(bodies, names)]) if bodies else "", names))
            where.update({(which, b): (len(modules) - 1, n) for b, n in zip(bodies, names)})
    return modules, [where[sb] for sb in step_bodies]


def _compile(sched_steps: Sequence[Any], rendered: Rendered,
             meanwhile: Callable[[], None] = _nothing) -> list[CompiledKernel | ExternStep]:
    """The plan's steps with their kernels' functions: from its modules where they are
    compiled, else from its units (compiled now, in parallel, ``meanwhile`` run beside
    them), while the modules compile in the background and are swapped in when ready
    (``units.later``)."""
    modules, step_names, step_sizes, unit_modules, unit_names = rendered
    tiered = bool(unit_modules) and not all(cpu.is_cached(src, names) for src, names in modules if names)
    use, use_names = (unit_modules, unit_names) if tiered else (modules, step_names)
    fns: list[dict[str, Any]] = []
    for (source, names), lib in zip(use, units.compile_units(use, meanwhile)):
        fns.append({n: lib.function(n, [ctypes.c_void_p, ctypes.c_int64]) for n in names} if lib else {})
    named = iter(zip(use_names, step_sizes))
    out: list[CompiledKernel | ExternStep] = []
    for s in sched_steps:
        if not isinstance(s, KernelStep):
            out.append(s)
            continue
        (which, name), sizes = next(named)
        held = (ctypes.c_int64 * len(sizes))(*sizes) if sizes else None
        checks = s.kernel.checks if isinstance(s.kernel, ir.Kernel) else ()
        err = (ctypes.c_int64 * (2 * len(checks)))() if checks else None
        extra = tuple(ctypes.addressof(a) for a in (held, err) if a is not None)
        out.append(CompiledKernel(s, fns[which][name], held, extra, err))
    if tiered:
        kernels = [k for k in out if isinstance(k, CompiledKernel)]
        units.later(modules, [(k, m, name) for k, (m, name) in zip(kernels, step_names)])
    return out


# -- plans on disk: a new process starts with the schedules of earlier ones ----------------

_code_id: str | None = None


def _code_identity() -> str:
    """A hash of the code that decides a schedule and renders its C, so a stored plan
    from another braze (a new release, or a working tree being edited) is never
    replayed; and of what the renderer read off this machine: the cache size it chose
    its stores by (``c_stream.streams``), and the quantized matmul's C as this machine
    has it (``headers.quant_source``, with what ``runtime/simd.py`` measured), whose
    libraries a stored module names by its hash."""
    global _code_id
    if _code_id is None:
        root = Path(__file__).parent
        h = cpu.sha256(str(llc_bytes()).encode())
        h.update(quant_source().encode())
        for f in sorted([root / "plan.py", root / "arena.py", root / "ir.py", root / "ops" / "lowering.py",
                         *(root / "schedule").glob("*.py"), *(root / "codegen").glob("*.py"),
                         *(root / "codegen").glob("*.h")]):
            h.update(f.read_bytes())
        _code_id = h.hexdigest()
    return _code_id


def _plan_path(key: Any) -> Path | None:
    try:
        # pickle only *writes* here, to hash the key: stored plans are JSON (plan_store).
        # Without its memo (fast mode): equal keys give equal bytes whichever of their
        # tuples are one object (a layout memoised in one run, made anew in the next).
        buf = io.BytesIO()
        pickler = pickle.Pickler(buf, protocol=5)
        pickler.fast = True
        pickler.dump((key, _PLAN_FORMAT, _code_identity()))
        blob = buf.getvalue()
        directory = cpu.cache_dir() / "plans"
        directory.mkdir(mode=0o700, exist_ok=True)
    except Exception:  # unpicklable attributes, unwritable cache: just do not store
        return None
    return directory / (cpu.sha256(blob).hexdigest() + ".json")


# -- running a plan ----------------------------------------------------------------------

_NO_ARENA = np.empty(0, np.uint8)


def _run(plan: Plan, nodes: Sequence[Any], storages: list[Any], launched: Sequence[Launch | None] = ()) -> None:
    nthreads = cpu.get_num_threads()
    arena, base = memory.arena_at(plan.arena_bytes) if plan.offsets else (_NO_ARENA, 0)
    try:
        for i, step in enumerate(plan.steps):
            if isinstance(step, ExternStep):
                try:
                    reference.run_node(nodes[step.node])
                except Exception:
                    _finish_before(nodes, step.node)
                    raise
            else:
                kstep = step.step
                for k, off in plan.bind[i]:
                    st = storages[k]
                    st.bind(arena[off:off + st.numel * st.dtype.itemsize].view(st.dtype.np), base + off)
                for k in kstep.outputs:
                    st = storages[k]
                    if st._array is None:
                        st.bind(*memory.allocate_at(st.dtype.np, st.numel, "kernel"))
                # the kernel's argument array (array.array: a third of a ctypes array's cost to fill)
                launch = launched[i] if launched else None
                if launch is not None:
                    ptrs = launch.fixed[:]
                    for at, k, shift in launch.moving:
                        ptrs[at] = storages[k].address() + shift
                else:
                    ptrs = array.array("Q", [storages[k].address() if r is None else storages[k].address()
                                             + storages[k].dtype.nbytes(operand(nodes[r[0]], r[1]).layout.offset)
                                             for k, r in zip(kstep.args, kstep.refs)])
                    if step.extra:
                        ptrs.extend(step.extra)
                COUNTERS["kernel_launches"] += 1
                COUNTERS["c_calls"] += 1
                step.fn(ptrs.buffer_info()[0], nthreads)
                if step.err is not None and any(step.err[0::2]):
                    _index_error(step, nodes)
            for k in plan.release[i]:
                storages[k].array = None
    except BaseException:
        # No storage may keep a view into the arena: the block goes back to the pool,
        # and a later plan writes over it. These storages are unreachable from Python
        # (that is why they are in the arena), so nothing can miss them.
        for k in plan.offsets:
            storages[k].array = None
        arena = _NO_ARENA  # nor this frame, which the traceback keeps
        raise


def _index_error(step: CompiledKernel, nodes: Sequence[Any]) -> None:
    """A kernel's gather met an index outside its dim (and read at 0 instead): as the
    reference would have, raise at the first such node, having computed what was
    recorded before it; what the kernel stored for it and the nodes after is lost."""
    node, error = index_error(step, nodes)
    for n in step.step.nodes:
        if n >= node and not nodes[n].op.inplace:  # (a scatter's target: its kernel stored nothing)
            for o in nodes[n].outputs:
                o.storage.array = None
    _finish_before(nodes, node)
    raise error


def index_error(step: CompiledKernel, nodes: Sequence[Any] | Mapping[int, Any]) -> tuple[int, IndexOutOfRange]:
    """The first node whose index check failed in ``step`` (its ``err`` slots, which
    are cleared) and the error the reference raises there."""
    k = step.step.kernel
    assert isinstance(k, ir.Kernel) and step.err is not None
    bad = [(node, op, dim, int(step.err[2 * c + 1])) for c, (node, op, dim) in enumerate(k.checks) if step.err[2 * c]]
    ctypes.memset(step.err, 0, ctypes.sizeof(step.err))
    node, op, dim, value = min(bad)
    return node, IndexOutOfRange(op, value, nodes[node].inputs[0].layout.shape[dim], dim)


def operand(node: Any, j: int) -> Any:
    """A kernel ref's operand: input ``j``, or for -1 the node's output."""
    return node.inputs[j] if j >= 0 else node.outputs[-1 - j]


@dataclass
class Ran:
    """One flush as a fused plan ran it (what ``capture`` observes)."""

    plan: Plan
    nodes: list[Any]
    storages: list[Any]  # by relative id
    produced: frozenset[int]  # rel ids the stream's nodes produced


#: lists that record every fused flush while a capture observes (``capture.py``)
observers: list[list[Ran | None]] = []


def _finish_before(nodes: Sequence[Any], failed: int) -> None:
    """A data-dependent error in an extern step (an index out of range): compute every
    result recorded before the failing node that a fused kernel had not produced yet,
    so that, as with the reference executor, only what follows the error is lost. Only
    pure nodes can be pending here (writes run in order), so nothing runs twice."""
    for node in nodes[:failed]:
        if not node.op.inplace and any(o.storage.array is None for o in node.outputs):
            reference.run_node(node)


_NEW_SHAPES = ("the same program keeps arriving with new shapes whose kernels must be compiled for each "
               "(BRAZE_SHAPE_VARIANTS bounds how many)")


def _refusal(entries: Sequence[tuple[Any, ...]]) -> tuple[str, Any, Any]:
    """Why a stream with no stored plan should run on the reference executor rather than
    be planned, or "" to plan it, or ``_NEW_SHAPES`` to plan it only if that compiles
    nothing new; and the program's shape-free form and its ops (see ``execute``)."""
    # The program without its shapes: ops, attributes, which storage each input is and
    # its dtype (the same program in another dtype is another program, not a new shape).
    shape_free = tuple((e[0], e[1], tuple((i[0], i[4]) for i in e[2])) for e in entries)
    ops = tuple((e[0], tuple(i[4] for i in e[2])) for e in entries)
    try:
        compiled = _variants.get(shape_free, 0)
    except TypeError:
        return "an op attribute is not hashable (such a stream cannot be stored)", None, ops
    return (_NEW_SHAPES if compiled >= _shape_variants() else ""), shape_free, ops


def execute(nodes: "deque[Any]") -> None:
    """The fused executor: find or build the plan of ``nodes`` and run it."""
    form = getattr(nodes, "form", None)
    if isinstance(nodes, NodeQueue):
        nodes.form = None  # this flush's now: nothing else may keep its storages alive
    if not isinstance(form, Form):
        form = Form.of(nodes)  # recorded while fusion was off
    entries = form.complete(nodes)
    live = form.live()
    at = form.cursor()
    plan = at.plans.get(live) if at is not None and at.plans is not None else None
    unfused = ""  # why this stream runs on the reference executor instead, if it does
    if plan is None and not cpu.have_compiler():  # it has said so, once
        if observers:
            observers[-1].append(None)
        del form
        reference.run(nodes)
        return
    if plan is None:
        unfused, shape_free, ops = _refusal(entries)
        if unfused in ("", _NEW_SHAPES):
            compile_new, unfused = not unfused, ""
            # A program's first shape gets kernels specialised to it (a few percent
            # faster: constant trip counts); from its second on, generic ones, which
            # every later shape replays without compiling (``codegen/generic.py``).
            # The program here is its ops and dtypes alone: attributes carry sizes too (a
            # reshape's, an arange's), and a program of other constants is as good a
            # reason to want kernels that compile once.
            generic = _shapes.get(ops, 0) > 0
            COUNTERS["plan_misses"] += 1
            try:
                plan = _build(list(nodes), form, live, (tuple(entries), live), compile_new, generic)
            except CompileError as err:
                # A kernel braze generated does not compile: a bug in braze, not in the
                # user's program. Run this stream unfused (correct, slower).
                unfused = f"a generated kernel failed to compile (please report this: {err})"
            else:
                if plan is None:
                    unfused = _NEW_SHAPES
                else:
                    # A program's shapes share one key (a server's 28 step buckets are one
                    # program: each kept its own copy, ~0.2 MiB), and a plan keeps its
                    # shape-free form only where it counts in ``_variants`` (0.4 MiB each).
                    known = _program_key.get(ops)
                    if known is None:
                        known = _program_key[ops] = _Program(ops)
                    ops = known
                    _shapes[ops] = _shapes.pop(ops, 0) + 1  # the most recent
                    if plan.compiled:
                        _variants[shape_free] = _variants.get(shape_free, 0) + 1
                    plan.program = ops
                    insert(entries, live, plan)
                    _homes.setdefault(ops, []).append((tuple(entries), live, shape_free if plan.compiled else None))
                    # the cap counts programs, not their shapes (shapes replay generic kernels)
                    while len(_shapes) > max(1, _cap()):
                        _evict(next(iter(_shapes)))
    else:
        COUNTERS["plan_hits"] += 1
        _touch(plan.program)
    if plan is None:
        if observers:
            observers[-1].append(None)  # a capture cannot replay what the reference executor ran
        COUNTERS["unfused_flushes"] += 1
        key_head = unfused.split(" (")[0]
        if key_head not in _warned:
            _warned.add(key_head)
            print(f"braze: {unfused}: running it on the reference executor", file=sys.stderr)
        del form  # let the reference executor free intermediates as it goes
        reference.run(nodes)
        return
    storages = form.storages
    ran = list(nodes)
    _run(plan, ran, storages)
    if observers:
        observers[-1].append(Ran(plan, ran, list(storages), frozenset(form.produced)))
    nodes.clear()
    for st in storages:
        if st.producer is not None:
            st.producer = None


def stored(copy: plan_trie.FormCopy, live: frozenset[int]) -> tuple[Plan, frozenset[int]] | None:
    """The plan stored for the form ``copy`` with the produced storages ``live`` (rel
    ids) kept, and the rel ids its steps touch, where ``run_stored`` can run it:
    ``jit``'s direct replay of a call that would have been flushed alone. None where no
    such plan is stored, or it has an extern step or an index check (those report
    through real nodes), or a capture is watching the flushes."""
    last = copy.path[-1]
    if observers or copy.root is not plan_trie.root or last is None or last.dead or last.plans is None:
        return None
    plan = last.plans.get(live)
    if plan is None:
        return None
    if plan.direct is None:
        used: set[int] = set()
        if not any(isinstance(s, ExternStep) or s.err is not None for s in plan.steps):
            used = {k for s in plan.steps if isinstance(s, CompiledKernel) for k in (*s.step.args, *s.step.outputs)}
            used.update(k for ks in plan.release for k in ks)
            used.update(k for bs in plan.bind for k, _ in bs)
        plan.direct = frozenset(used)
    return (plan, plan.direct) if plan.direct else None


@dataclass
class Launch:
    """One kernel step's argument array where most storages stay from run to run (a jit
    recording's captured tensors): their addresses, and the trailing sizes, filled in
    once (``fixed``); the others' places in it, rel ids and byte shifts (``moving``),
    filled at each run. A direct replay of a small shape pays for every argument it
    computes: twelve captured constants cost more than its kernel."""

    fixed: array.array
    moving: tuple[tuple[int, int, int], ...]


def launches(plan: Plan, nodes: Sequence[Any], storages: list[Any], moving: frozenset[int]) -> list[Launch | None]:
    """Per step (an extern step: None) its ``Launch`` over ``storages`` by rel id, each
    argument at its storage's address plus the byte offset ``nodes``' layouts place it
    at; the rel ids ``moving`` are left to fill. A recording's layouts are fixed, and so
    are these while the storages not ``moving`` keep their arrays."""
    out: list[Launch | None] = []
    for s in plan.steps:
        if not isinstance(s, CompiledKernel):
            out.append(None)
            continue
        shifts = [0 if r is None else storages[k].dtype.nbytes(operand(nodes[r[0]], r[1]).layout.offset)
                  for k, r in zip(s.step.args, s.step.refs)]
        fixed = array.array("Q", [0 if k in moving else storages[k].address() + sh
                                  for k, sh in zip(s.step.args, shifts)])
        fixed.extend(s.extra)
        out.append(Launch(fixed, tuple((at, k, sh) for at, (k, sh) in enumerate(zip(s.step.args, shifts))
                                       if k in moving)))
    return out


def run_stored(plan: Plan, launched: list[Launch | None], storages: list[Any]) -> None:
    """Run a plan ``stored`` gave, now, over its storages by rel id (None where its steps
    touch none), through its ``launches``."""
    COUNTERS["flushes"] += 1
    COUNTERS["plan_hits"] += 1
    _touch(plan.program)
    _run(plan, (), storages, launched)


def clear() -> None:
    """Forget every stored plan (tests)."""
    plan_trie.reset()
    _variants.clear()
    _shapes.clear()
    _homes.clear()
    _program_key.clear()
    _ahead.clear()


set_fused_executor(sys.modules[__name__])  # the stream flushes through this module
