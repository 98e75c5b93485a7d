"""The cuda device's executor: the same scheduler, kernels rendered as Triton, launched.

A flush of the cuda stream is scheduled by ``schedule/fuse.py`` as on the CPU, with
braze's C library kernels (quantized matmuls, top-k) left out: their nodes stay nodes.
Each kernel is rendered by ``codegen/triton.py``, each attention chain by
``codegen/triton_chain.py``, each matmul node by ``codegen/triton_gemm.py``; anything else (another extern op, a kernel part the
renderer does not have yet) is refused before anything runs, with ``Unsupported``
naming the op: never a silent host round trip. A plan is kept per stream form and
liveness, as ``plan.py`` keeps the C ones (in this process; the sources are cached on
disk by their hash, and Triton caches what it compiles from them).

Memory: under Triton's interpreter (the only mode built: ``cuda_probe.py``) a cuda
storage is a host array from the same pool as the CPU's (``memory.allocate``), so
``braze.stats()``, ``set_memory_limit`` and ``OutOfMemory`` count it as they count any
buffer; kernels get it through ``DeviceArg``, the few methods of a torch tensor that
Triton's launcher and interpreter call (braze has no torch).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .. import plan as fused
from ..codegen import triton as render
from ..codegen import triton_chain
from ..codegen.triton_extern import EXTERN
from .. import dtypes as dt
from .. import ir
from ..errors import IndexOutOfRange, Unsupported
from ..schedule import ExternStep, KernelStep, schedule
from ..schedule.debug import refuse
from ..storage import Storage
from ..stats import COUNTERS
from ..stream import CUDA_HEAD, NodeQueue, set_cuda_executor
from . import cpu, cuda_memory
from .cuda_graph import Graphs
from .cuda_probe import interpreting, unavailable


class _HostStorage:
    """``untyped_storage()`` of a DeviceArg: the host array itself. The interpreter
    "copies" it to the host and back; both are the same memory, so both are no-ops."""

    def __init__(self, base: np.ndarray) -> None:
        self.base = base

    def data_ptr(self) -> int:
        return int(self.base.ctypes.data)

    def cpu(self) -> "_HostStorage":
        return self

    def copy_(self, other: Any) -> None:
        pass


class DeviceArg:
    """A kernel argument over a flat host array at an element offset (under the
    interpreter), with what Triton reads of a torch tensor: ``data_ptr()`` and ``dtype``
    (its name: "float32", "bool" ...) to launch, and the storage methods its interpreter
    uses to move arguments to the host and back (``untyped_storage``, ``new_empty``,
    ``set_``, ``copy_``...)."""

    def __init__(self, base: np.ndarray, dtype: str, offset: int = 0) -> None:
        self.base = base
        self.dtype = dtype
        self.offset = offset

    def data_ptr(self) -> int:
        return int(self.base.ctypes.data) + self.offset * self.base.itemsize

    def untyped_storage(self) -> _HostStorage:
        return _HostStorage(self.base)

    def new_empty(self, *args: Any, **kwargs: Any) -> "DeviceArg":
        return DeviceArg(self.base, self.dtype)

    def set_(self, storage: _HostStorage, offset: int, size: Any, stride: Any) -> "DeviceArg":
        self.base, self.offset = storage.base, int(offset)
        return self

    def storage_offset(self) -> int:
        return self.offset

    def size(self) -> tuple[int, ...]:
        return (self.base.size - self.offset,)

    def stride(self) -> tuple[int, ...]:
        return (1,)

    def copy_(self, other: Any) -> "DeviceArg":
        return self


class Pointer:
    """A kernel argument in device memory, on a GPU: all Triton's launcher reads of it
    is its address and its element type's name."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype: str) -> None:
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


#: device copies of braze's scalar constants (CPU storages that go with any device), made
#: once each: a kernel on a GPU cannot read host memory
_mirrors: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def arg(storage: Any, offset: int = 0) -> Any:
    """A storage's buffer as a kernel argument, ``offset`` elements in (a block-quantized
    storage: its bytes, ``offset`` bytes in)."""
    data = storage.data()
    if isinstance(data, np.ndarray) and storage.device.type == "cpu" and cuda_memory.on_gpu():
        data = _mirrors.get(storage)
        if data is None:
            data = _mirrors[storage] = cuda_memory.upload(storage.data(), "constant")
    return array_arg(data, "uint8" if storage.dtype.is_block else storage.dtype.name, offset)


def array_arg(data: Any, name: str, offset: int = 0) -> Any:
    """A cuda buffer (a host array under the interpreter) as a kernel argument of
    element type ``name``, ``offset`` elements in."""
    if isinstance(data, np.ndarray):
        return DeviceArg(data, name, offset)
    return Pointer(data.ptr + offset * data.itemsize, name)


_fns: dict[str, Any] = {}


def compile_kernel(r: render.Rendered) -> Any:
    """The launchable Triton function of ``r``: its module is written under the cache
    directory by the source's hash (Triton reads a kernel's source from its file) and
    imported once per process."""
    gpu = cuda_memory.on_gpu()
    if gpu:
        r = render.Rendered(render.for_gpu(r.source), r.name, r.grid, r.meta)
    key = cpu.sha256(r.source.encode()).hexdigest()
    fn = _fns.get(key + "gpu" * gpu)  # (Triton picks the interpreter when a kernel is decorated)
    if os.environ.get("BRAZE_DEBUG", "0").strip() == "2":
        print(r.source, file=sys.stderr)
    if fn is None:
        directory = cpu.cache_dir() / "triton"
        directory.mkdir(mode=0o700, exist_ok=True)
        path = directory / f"k{key[:32]}.py"
        if not path.exists() or path.read_text() != r.source:
            tmp = directory / f".{key[:32]}.{os.getpid()}.tmp"
            tmp.write_text(r.source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(f"braze_triton_{key[:16]}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        interpret = os.environ.pop("TRITON_INTERPRET", None) if gpu else None
        try:
            spec.loader.exec_module(module)
        finally:
            if interpret is not None:
                os.environ["TRITON_INTERPRET"] = interpret
        fn = _fns[key + "gpu" * gpu] = getattr(module, r.name)
        COUNTERS["kernels_compiled"] += 1
        if gpu:
            _launch_on_braze_stream()
    return fn


_on_stream = False


def _launch_on_braze_stream() -> None:
    """Point Triton's launcher at braze's stream (it asks its driver for "the current
    stream", which is torch's when torch is loaded and the device's default one
    otherwise): braze's copies, kernels and graph captures then share one order."""
    global _on_stream
    if not _on_stream:
        from triton.runtime.driver import driver
        handle = cuda_memory.stream()
        driver.active.get_current_stream = lambda device=None: handle
        _on_stream = True


@dataclass
class Launch:
    """One step of a cuda plan: a rendered kernel over the storages ``args`` (offsets
    from ``refs`` as the C plan's), or the GEMM of matmul node ``node``."""

    fn: Any
    grid: tuple[int, ...]
    meta: dict[str, int]
    args: list[int]
    outputs: list[int]
    refs: list[tuple[int, int] | None]
    node: int = -1
    #: a gathering kernel's bounds checks: per check, the (node, op, dim) a bad index names
    checks: tuple[tuple[int, str, int], ...] = ()
    #: buffers of the plan's own, passed after the arguments (split-K's partial results)
    scratch: tuple[Storage, ...] = ()
    #: on a GPU, the kernel Triton compiled for this launch, by its pointers' 16-byte
    #: alignment (what Triton specialises them on): launched without Triton's per-call
    #: argument binding and cache lookup
    compiled: dict[tuple[bool, ...], Any] = field(default_factory=dict)
    #: the kernel's source (a captured step renders it again, its moving pointers offset)
    rendered: render.Rendered | None = None

    def launch(self, args: list[Any]) -> None:
        """Launch over ``args``: through Triton's launcher the first time per alignment,
        then straight through the compiled kernel (its parameters in order, the
        constexprs after the buffers, as Triton passes them)."""
        global _direct
        if not _direct:
            self.fn[self.grid](*args, **self.meta)
            return
        key = tuple(a.data_ptr() % 16 == 0 for a in args)
        kernel = self.compiled.get(key)
        if kernel is None:
            self.compiled[key] = self.fn[self.grid](*args, **self.meta)
            return
        try:  # (a compiled kernel's runner takes a 3-d grid)
            kernel[self.grid + (1,) * (3 - len(self.grid))](
                *args, *(self.meta[p.name] for p in self.fn.params if p.is_constexpr))
        except Exception:  # another Triton's calling convention: its launcher, always
            _direct = False
            self.fn[self.grid](*args, **self.meta)


#: launch compiled kernels directly (off once a Triton's convention differs from the one assumed)
_direct = True


@dataclass
class Plan:
    """The launches of one flush's form, their CUDA graphs (on a GPU), and where its
    intermediates (results nothing outside the flush holds) lie in its arena: one
    buffer a run, so they come back at the same addresses run after run (a graph's
    key) for one pool allocation."""

    steps: list[Launch]
    graphs: Graphs
    arena: list[tuple[int, int]]  # (storage key, byte offset)
    arena_bytes: int


#: intermediates start at multiples of this in a plan's arena (a 128-byte line, and any
#: vector access)
ARENA_ALIGN = 256


def _arena(steps: Sequence[Launch], storages: Sequence[Any], live: frozenset[int]) -> tuple[list[tuple[int, int]], int]:
    at, out = 0, []
    for st in steps:
        for k in st.outputs:
            if k not in live and storages[k].array is None:
                out.append((k, at))
                at += -(-storages[k].numel * storages[k].dtype.itemsize // ARENA_ALIGN) * ARENA_ALIGN
    return out, at


def _refuse(ops: Sequence[str], what: str) -> Unsupported:
    return Unsupported(", ".join(dict.fromkeys(ops)), f"not built for device 'cuda' yet ({what}); "
                                                      "run it on the CPU (.to('cpu'))")


def build(nodes: Sequence[Any], key_of: dict[int, int], live: frozenset[int], chains: bool = True) -> list[Launch]:
    """Schedule a flush and render and compile each of its steps; ``Unsupported``
    naming the op for a step the backend cannot run yet, before anything runs. A chain
    kernel the Triton renderer lacks a part of has the flush scheduled again without
    chains (its matmuls as GEMMs; ``BRAZE_DEBUG=1`` says why), every launch counted."""
    sched = schedule(nodes, key_of, set(live), library=False, chains=chains)
    out: list[Launch] = []
    for n, st in enumerate(sched.steps):
        if isinstance(st, KernelStep) and triton_chain.is_chain(st.kernel):
            try:
                ck = triton_chain.chain_kernels(st.kernel, "braze_a")
            except render.NotRendered as e:
                refuse(nodes[st.nodes[0]], f"not a chain kernel on cuda: {e.what}")
                return build(nodes, key_of, live, chains=False)
            scratch = (Storage(dt.float32, nodes[st.nodes[0]].outputs[0].storage.device, ck.scratch),) \
                if ck.scratch else ()
            for r in (ck.main, ck.combine):
                if r is not None:
                    out.append(Launch(compile_kernel(r), r.grid, r.meta, st.args, st.outputs, st.refs, scratch=scratch,
                                      rendered=r))
            continue
        if isinstance(st, KernelStep):
            try:
                r = render.kernel_source(st.kernel, "braze_t")
            except render.NotRendered as e:
                raise _refuse([nodes[i].op.name for i in st.nodes], e.what) from None
            checks = st.kernel.checks if isinstance(st.kernel, ir.Kernel) else ()
            out.append(Launch(compile_kernel(r), r.grid, r.meta, st.args, st.outputs, st.refs, checks=checks, rendered=r))
            continue
        assert isinstance(st, ExternStep)
        node = nodes[st.node]
        if node.op.name == "assign" and node.inputs[0] == node.outputs[0]:
            continue  # x[i] = x[i] (what ``x[i] += 1`` ends with, after the in-place add): nothing to do
        extern = EXTERN.get(node.op.name)
        if extern is None:
            raise _refuse([node.op.name], "it has no Triton kernel")
        try:
            r = extern(node, "braze_x", interpreting())
        except render.NotRendered as e:
            raise _refuse([node.op.name], e.what) from None
        out.append(Launch(compile_kernel(r), r.grid, r.meta, [], [key_of[id(node.outputs[0].storage)]], [], st.node,
                          rendered=r))
    return out


def operands(step: Launch, nodes: Sequence[Any], storages: Sequence[Any]) -> list[tuple[Any, int, Any]]:
    """The buffers ``step`` is launched over, its outputs and scratch allocated: per
    argument its storage, its offset (elements; a block-quantized storage's: bytes) and
    the (node, operand) that offset is from (``plan.operand``'s; None: the start)."""
    for k in step.outputs:
        st = storages[k]
        if st.array is None:
            st.array = cuda_memory.allocate(st.dtype.np, st.numel, "kernel")
    if step.node >= 0:  # an extern node's kernel: its inputs, then its outputs
        node = nodes[step.node]
        refs = [(step.node, j) for j in range(len(node.inputs))] + [(step.node, -1 - j) for j in range(len(node.outputs))]
        found = [(fused.operand(node, r[1]), r) for r in refs]
        return [(o.storage, elements(o.storage, o.layout.offset), r) for o, r in found]
    for sc in step.scratch:  # the plan's own buffers: allocated once, at the same address every run
        if sc.array is None:
            sc.array = cuda_memory.allocate(sc.dtype.np, sc.numel, "kernel")
    return [(storages[k], 0 if r is None else elements(storages[k], fused.operand(nodes[r[0]], r[1]).layout.offset), r)
            for k, r in zip(step.args, step.refs)] + [(sc, 0, None) for sc in step.scratch]


def elements(storage: Any, offset: int) -> int:
    """An element offset as a kernel adds it to the storage's pointer (a block-quantized
    storage's pointer is to bytes)."""
    return storage.dtype.nbytes(offset) if storage.dtype.is_block else offset


def _arguments(step: Launch, nodes: Sequence[Any], storages: Sequence[Any]) -> list[Any]:
    return [arg(st, off) for st, off, _ in operands(step, nodes, storages)]


def run(plan: Plan, nodes: Sequence[Any], storages: Sequence[Any]) -> None:
    """Allocate the plan's outputs and launch its kernels: one by one, or (on a GPU, a
    form run again over the same buffers) as one CUDA graph. Gathers' index checks are
    read back once, after the last launch."""
    if plan.arena_bytes:
        arena = cuda_memory.allocate(np.uint8, plan.arena_bytes, "arena")
        for k, at in plan.arena:
            st = storages[k]
            if st.array is None:
                st.array = cuda_memory.view(arena, at, st.dtype.np, st.numel)
    steps = [st for st in plan.steps if 0 not in st.grid]
    for st in plan.steps:
        if 0 in st.grid:  # (an empty kernel: its outputs exist all the same)
            _arguments(st, nodes, storages)
    args = [_arguments(st, nodes, storages) for st in steps]
    checked = [st for st in steps if st.checks]
    err = _error_slots(plan, sum(len(st.checks) for st in checked))
    if err is not None:
        at = 0
        for st, a in zip(steps, args):
            if st.checks:
                a.append(array_arg(err, "int64", 3 * at))
                at += len(st.checks)

    launch_all(plan.graphs, list(zip(steps, args)))
    if err is not None:
        slots = cuda_memory.download(err)
        if slots[0::3].any():
            error = index_error(checked, slots, nodes)
            for n in nodes:  # every result of the flush is dropped (see ``index_error``)
                if not n.op.inplace:
                    for o in n.outputs:
                        o.storage.array = None
            raise error


def launch_all(graphs: Graphs, calls: list[tuple[Launch, list[Any]]], key: tuple[int, ...] | None = None) -> None:
    """Launch ``calls`` (each a launch and its arguments) in order: one by one, or on a
    GPU, over buffers seen before, as one CUDA graph (``cuda_graph.py``; ``key``: the
    calls' addresses, when the caller knows them)."""
    gpu = cuda_memory.on_gpu()

    def launch(count: bool) -> None:
        for st, a in calls:
            COUNTERS["kernel_launches"] += count
            launch_one(st, a, gpu)

    with np.errstate(all="ignore"):  # the interpreter computes in numpy: IEEE results, quietly
        if gpu:
            graphs.run(key or addresses(calls), launch, len(calls))
        else:
            launch(True)


def addresses(calls: list[tuple[Launch, list[Any]]]) -> tuple[int, ...]:
    """Every address ``calls`` are launched over (what a CUDA graph bakes in)."""
    return tuple(x.data_ptr() for _, a in calls for x in a)


def launch_one(st: Launch, args: list[Any], gpu: bool) -> None:
    """One kernel launch (what a graph captures on a GPU)."""
    if gpu:
        st.launch(args)
    else:
        st.fn[st.grid](*args, **st.meta)


def _error_slots(plan: Plan, checks: int) -> Any:
    """Three int64 per bounds check (a flag, the smallest and the largest bad index),
    set to their start values on the device before the plan's kernels run."""
    if not checks:
        return None
    start = np.tile(np.array([0, _I64.max, _I64.min], np.int64), checks)
    if not cuda_memory.on_gpu():
        return start
    if plan.graphs.errors is None:  # one buffer per plan: a graph's captured address stays valid
        plan.graphs.errors = cuda_memory.allocate(np.int64, start.size, "checks")
    cuda_memory.fill(plan.graphs.errors, start)
    return plan.graphs.errors


_I64 = np.iinfo(np.int64)


def index_error(checked: Sequence[Launch], err: np.ndarray, nodes: Sequence[Any]) -> IndexOutOfRange:
    """A gather met an index outside its dim (and read at 0 instead): what the
    reference raises at the first such node, naming the value it names (the most
    negative bad index, else the largest). ``run`` drops every result of the flush,
    so the stream marks them all failed: stricter than the reference, which keeps what
    came before the bad node, but never a wrong value."""
    checks = [c for st in checked for c in st.checks]
    bad = [(node, op, dim, int(err[3 * c + 1]) if err[3 * c + 1] < 0 else int(err[3 * c + 2]))
           for c, (node, op, dim) in enumerate(checks) if err[3 * c]]
    node, op, dim, value = min(bad)
    return IndexOutOfRange(op, value, nodes[node].inputs[0].layout.shape[dim], dim)


def execute(nodes: Any) -> None:
    """The cuda stream's executor: find or build the plan of ``nodes`` and run it."""
    why = unavailable()
    if why is not None:  # (a stream only gets nodes on a device that was available)
        raise Unsupported("cuda", why)
    form = getattr(nodes, "form", None)
    if isinstance(nodes, NodeQueue):
        nodes.form = None
    if not isinstance(form, fused.Form):
        form = fused.Form.of(nodes, CUDA_HEAD)
    entries = form.complete(nodes)
    live = form.live()
    # Plans live in the CPU's plan trie, on a branch of their own (``CUDA_HEAD``): a
    # repeated program is found as the stream records it, and ``braze.jit`` restores
    # its form instead of numbering it node by node.
    at = form.cursor()
    plan: Any = at.plans.get(live) if at is not None and at.plans is not None else None
    if not isinstance(plan, Plan):
        COUNTERS["plan_misses"] += 1
        steps = build(list(nodes), form.key_of, live)
        plan = Plan(steps, Graphs(), *_arena(steps, form.storages, live))
        global _stored
        if _stored >= PLAN_CAP:  # as the interpreter's cache was: past the cap, start afresh
            clear()
        try:
            fused.insert((*CUDA_HEAD, *entries), live, plan)
            _stored += 1
        except TypeError:  # an attribute that cannot be hashed: planned every time
            pass
    else:
        COUNTERS["plan_hits"] += 1
    ran = list(nodes)
    run(plan, ran, form.storages)
    if fused.observers:  # a step capture watches (``capture.py``)
        fused.observers[-1].append(fused.Ran(plan, ran, list(form.storages), frozenset(form.produced)))
    nodes.clear()
    for st in form.storages:
        st.producer = None


#: cuda plans stored in the trie, and how many may be before they are all dropped (each
#: may hold CUDA graphs)
_stored = 0
PLAN_CAP = 512


def clear() -> None:
    """Forget every cuda plan (tests, and past ``PLAN_CAP``)."""
    global _stored
    fused.forget(CUDA_HEAD)
    _stored = 0


def execute_reference(nodes: Any) -> None:
    """``BRAZE_FUSION=0`` on the cuda device: the reference executor, the oracle. Under
    the interpreter it reads the same host memory; on a GPU the flush's cuda storages
    are copied to the host, computed there and copied back (slow, by design)."""
    from .reference import run as reference
    if fused.observers:
        fused.observers[-1].append(None)  # a capture cannot replay what the reference executor ran
    if isinstance(nodes, NodeQueue):
        nodes.form = None
    if not cuda_memory.on_gpu():
        reference(nodes)
        return
    staged = {id(t.storage): t.storage for n in nodes for t in (*n.inputs, *n.outputs)
              if t.storage.device.type != "cpu"}
    for st in staged.values():
        if isinstance(st.array, cuda_memory.DeviceArray):
            st.array = cuda_memory.download(st.array)
    try:
        reference(nodes)
    finally:
        for st in staged.values():
            if isinstance(st.array, np.ndarray):
                st.array = cuda_memory.upload(st.array)


set_cuda_executor(sys.modules[__name__].execute, sys.modules[__name__].execute_reference)
