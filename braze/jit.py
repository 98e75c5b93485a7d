"""``@braze.jit``: run a function's Python once per signature, replay what it recorded.

Recording is cheap per op, but not free: a decoding step of attention records eight
ops, and their shape rules, tensors, nodes and relative form cost more than the kernel
they become. ``jit`` removes that work for a function called again and again with
tensors of the same shapes (PyTorch 2's guards and replay, at the level of braze's
stream):

- **Signature (the guard).** Each call is keyed by its arguments: for a tensor its
  dtype, device, layout (shape, strides, offset), whether it is still pending or
  read-only (a write into it must be refused again), and which other arguments share
  its storage; a number, string, dtype or device by type and value (floats by their
  bits: -0.0 is not 0.0, and a nan matches a nan); tuples and lists element by
  element; any other object (a module, a function) by identity, and its recordings are
  dropped when it is.
- **Trace (a miss).** The function runs as usual and its nodes are recorded on the
  stream. They are kept as a template: each operand is an argument's storage, a
  storage one of these nodes produces, a tensor the function made from data (copied
  afresh for every call: ``braze.tensor``, ``empty``, ``randn``), or a storage captured
  from outside (a weight, a scalar constant), kept alive by the template. What the
  function returns is kept the same way; an argument returned as it is comes back as
  the same object.
- **Replay (a hit).** No Python of the function runs: fresh storages for what the
  nodes produce, the nodes rebuilt over the call's storages, appended to the stream.
  When the stream is empty, as it is after a sync point, the stream's relative form
  (``plan.Form``) is restored from a copy instead of numbered node by node, so the
  flush finds its plan at once.
- **Direct replay.** Where the last replay from an empty stream was flushed with nothing
  after it (the caller read the result at once, as most do), the next one records no
  nodes: it runs the plan stored for them now, with storages only for what the plan
  touches, and returns realised tensors, as a compiled PyTorch function does. A small
  shape's call then costs its kernel and a few microseconds of Python instead of its
  nodes rebuilt and flushed. The ``REPROBE``-th such call records instead, so a
  caller that starts adding work after the call gets it fused with the call's nodes
  again; each such probe that finds the call still alone doubles the interval (up to
  ``REPROBE_MAX``), one that finds work joined starts it again.
- **Fast lane.** A call whose arguments are tensors and plain values (numbers,
  strings, dtypes) alone, which runs the same direct replay as the call before it, is
  checked against that replay's signature field by field (``_Fast``) instead of
  building its key, and runs with its storages filled from a list made once. The same
  checks and run are done in C where they can be (``runtime/lane.c``: the guards held
  as data, "not mine" for anything else), a small shape's call then ~5 us of Python
  around its kernel instead of ~9.

The contract is ``jax.jit``'s: the function's tensors must depend only on its
arguments, what it captures must not be rebound between calls (a captured tensor
written in place is fine: the replay reads it as the function would), and an argument
must not be a tensor the function also captures (traced with ``f(w)`` for a function
that reads ``w``, the replay could not tell the two apart; a replay whose argument is a
captured tensor runs the function instead). Random numbers drawn inside are drawn once.
A function that reads tensor data while traced (``.item()``, ``.numpy()``, printing,
indexing with a tensor: its Python may depend on data) or returns something other
than tensors, tuples, lists and scalars is not replayed; braze says why once on
stderr and calls it as it is. A trace that the stream's size limit flushed half-way is
not kept, and the next call traces again.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import operator
import sys
import weakref
from typing import Any, Callable, Generic, ParamSpec, Sequence, TypeVar, overload

import numpy as np

from . import plan as planmod
from . import plan_trie
from .device import CPU, Device
from .dtypes import DType
from .layout import Layout
from .runtime import lane, memory, threads
from .stats import COUNTERS
from .storage import Storage
from .stream import Node, Operand, Stream, stream_of
from .tensor import Tensor, is_constant

P = ParamSpec("P")
R = TypeVar("R")

MAX_SIGNATURES = 256  # per function: past this, new signatures run without replay
#: after this many direct replays one is recorded to learn whether later work joins it; each
#: such probe that finds it still alone doubles the interval, up to REPROBE_MAX (a probe
#: records and flushes the nodes: ~60 us for a GELU, ~1 us a call at every 64th)
REPROBE = 64
REPROBE_MAX = 1024
_ARRAY = operator.attrgetter("_array")  # a storage's array, None while pending (Storage.array without the property)
_NONES = itertools.repeat(None)
_MISS: Any = object()  # not a fast lane's call
_UNTRACED: Any = object()  # a signature not seen yet (None: traced, not replayable)

#: Keyed by value; any other object by identity.
_VALUES = (int, float, complex, str, bytes, type(None), np.generic, DType, Device, range, type(Ellipsis))


class _Unkeyable(Exception):
    """An argument jit cannot key a call by (not hashable, or a container it does not walk)."""


class _Call:
    """A call's key, and its tensors and their storages in order of first appearance."""

    __slots__ = ("key", "tensors", "storages", "index", "objects")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.tensors: list[Tensor] = []
        self.storages: list[Storage] = []
        self.index: dict[int, int] = {}
        self.objects: list[Any] = []  # keyed by identity: their recordings go with them
        parts = [self._key(a) for a in args]
        if kwargs:
            parts.append(tuple((k, self._key(kwargs[k])) for k in sorted(kwargs)))
        self.key = tuple(parts)

    def stream(self) -> Stream:
        """The stream of the call's device (its first tensor's; the CPU's without one)."""
        return stream_of(self.storages[0].device if self.storages else CPU)

    def _key(self, x: Any) -> Any:
        if isinstance(x, Tensor):
            self.tensors.append(x)
            st = x._storage
            i = self.index.get(id(st))
            if i is None:
                i = self.index[id(st)] = len(self.storages)
                self.storages.append(st)
            lay = x._layout
            return (Tensor, i, st.dtype, st.device, lay.shape, lay.strides, lay.offset, st._array is None, st.readonly)
        if isinstance(x, (tuple, list)):
            return (type(x), *[self._key(y) for y in x])
        if isinstance(x, slice):  # not hashable before Python 3.12
            return (slice, self._key(x.start), self._key(x.stop), self._key(x.step))
        value = _value_key(x)
        if value is not None:
            return value
        try:
            weakref.ref(x)
        except TypeError:  # no weak reference: keyed by value, kept alive by the key
            try:
                hash(x)
            except TypeError:
                raise _Unkeyable(type(x).__name__) from None
            return (type(x), x)
        self.objects.append(x)
        return ("id", id(x))


def _value_key(x: Any) -> tuple[Any, ...] | None:
    """A number's, string's, dtype's or device's part of a call's key (None for anything
    else): by type and value, floats by their bits."""
    if isinstance(x, float):
        return (type(x), x.hex())  # -0.0 apart from 0.0, and a nan equal to a nan
    if isinstance(x, (np.generic, complex)):
        return (type(x), np.asarray(x).tobytes())
    if isinstance(x, _VALUES):
        return (type(x), x)
    return None


class _Recording:
    """One traced call: its nodes as templates over a pool of storages.

    A replay's pool is ``[argument storages] + [fresh storages] + [made storages] +
    [captured storages]``; an operand is ``(pool index, layout)``. Fresh storages are
    what the nodes produce; made ones are tensors the function created from data, each
    replay getting a copy of their data as traced. Node templates keep no storage the
    function produced: a template of a big intermediate costs its shape, not its memory."""

    __slots__ = ("fresh", "made", "captured", "captured_ids", "pending", "nodes", "result", "budget", "form_copy",
                 "alone", "direct_runs", "probe_every", "probing", "direct", "layouts", "results", "live")

    def __init__(self, fresh: list[tuple[Any, Any, int]], made: list[Storage], captured: list[Storage],
                 nodes: list[tuple[Any, tuple[tuple[int, Layout], ...], tuple[tuple[int, Layout], ...], dict[str, Any]]],
                 result: Any, budget: list[tuple[int, str]]) -> None:
        self.fresh = fresh  # (dtype, device, numel) of each storage the nodes produce
        self.made = [(st.dtype, st.device, st.numel, st.data().copy()) for st in made]
        self.captured = captured
        self.captured_ids = frozenset(id(st) for st in captured)  # held by the recording: ids stay theirs
        self.pending = [st.array is None for st in captured]  # part of the form
        self.nodes = nodes
        self.result = result
        #: in node order, each request that is larger than every one before it: memory.check
        #: fails at the first that does not fit, as the nodes' own checks would
        self.budget = budget
        self.form_copy: Any = None  # plan_trie.FormCopy once the form of these nodes from an empty stream is known
        #: the last replay from an empty stream was flushed with nothing after it: run the next
        #: one's plan at once (``_direct``)
        self.alone = False
        self.direct_runs = 0
        self.probe_every = REPROBE  # a power of two: the probes fall at its multiples of direct_runs
        self.probing = False  # the last direct run's turn was a probe, not yet flushed
        self.direct: _DirectRun | None = None
        self.layouts: list[_Layouts] | None = None  # the nodes' operand layouts, as plan.run_stored reads them
        self.results = _result_indices(result)  # the pool indices of the tensors it returns
        self.live: frozenset[int] = frozenset()  # the form copy's rel ids of the results it produces

    def replay(self, call: _Call, stream: Stream) -> Any:
        if memory.limited():
            for nbytes, op in self.budget:
                memory.check(nbytes, op)
        copy = self.form_copy
        held = False  # the direct run's launches hold (and so the captured storages' pending ones are as kept)
        fresh_form = self.restorable(stream)
        if fresh_form:
            last = self.direct
            held = last is not None and last.holds(self.pending)
            fresh_form = held or list(map(operator.is_, map(_ARRAY, self.captured), _NONES)) == self.pending
        if fresh_form and self.alone:
            run = self._direct(copy, stream, len(call.storages))
            if run is not None:
                some = self._pool(call, run.wanted)
                storages = run.base.copy()
                for k, i in run.moving:
                    storages[k] = some[i]
                if not held or run is not last:
                    run.launch(self._layouts(), storages, self.captured, self.pending)
                planmod.run_stored(run.plan, run.launched, storages)
                return _rebuild(self.result, some, call.tensors)
        pool = self._pool(call)
        nodes = [Node(op, tuple([Operand(pool[i], lay) for i, lay in ins]),
                      tuple([Operand(pool[i], lay) for i, lay in outs]), attrs)
                 for op, ins, outs, attrs in self.nodes]
        result = _rebuild(self.result, pool, call.tensors)
        if copy is not None and not stream.nodes and len(nodes) < stream.limit:
            if fresh_form:
                # Nothing flushes while the nodes are appended at once: the pool's
                # references are gone before any flush counts them (Form.live).
                if stream.record_all(nodes, lambda form: bool(form.restore(copy, pool))):
                    self._watch(stream, len(nodes))
                    return result
            self.form_copy = None  # stale (the trie was cleared, a capture was computed): taken anew
        start = len(call.storages) + len(self.fresh)
        made = pool[start:start + len(self.made)]  # realised, never a plan's intermediate: harmless to hold
        del pool  # node by node the size limit may flush: only the nodes may hold their storages then
        empty = not stream.nodes
        for node in nodes:
            stream.record(node)
        if empty:
            self.keep_form(stream, call.storages, nodes, made)
        return result

    def restorable(self, stream: Stream) -> bool:
        """Can a replay start ``stream`` with the kept form (it is empty, the form is
        known, the nodes fit), captured storages' pending pattern aside?"""
        return self.form_copy is not None and not stream.nodes and len(self.nodes) < stream.limit

    def _direct(self, copy: Any, stream: Stream, n_args: int) -> _DirectRun | None:
        """The plan to run now instead of recording (``plan.stored``), with what running
        it takes: the plan of these nodes run as their flush would have run it had
        nothing joined them (what PyTorch's compiled functions do, and what a small
        shape needs: its nodes cost more to rebuild than its kernel takes). Only where
        the last replay from an empty stream was flushed alone; every ``probe_every``-th
        such call records instead, to see whether later work joins it now (then it
        stays recorded, and fused with that work)."""
        self.direct_runs += 1
        if self.direct_runs % self.probe_every == 0:
            self.probing = True
            return None
        if stream is not stream_of(CPU):
            return None
        found = planmod.stored(copy, self.live)
        if found is None:
            return None
        if self.direct is None or self.direct.plan is not found[0]:
            first_captured = n_args + len(self.fresh) + len(self.made)  # (the pool's order: see _pool)
            self.direct = _DirectRun(found[0], found[1], copy.order, self.results, first_captured, self.captured)
        return self.direct

    @overload
    def _pool(self, call: _Call) -> list[Storage]: ...

    @overload
    def _pool(self, call: _Call, wanted: list[int]) -> dict[int, Storage]: ...

    def _pool(self, call: _Call, wanted: list[int] | None = None) -> list[Storage] | dict[int, Storage]:
        """A call's pool: ``[arguments] + [fresh] + [copies of made] + [captured]``, all
        of it, or (a direct replay) only the indices ``wanted``, by index."""
        n_args, n_fresh, n_made = len(call.storages), len(self.fresh), len(self.made)
        if wanted is None:
            return (call.storages + [Storage(d, dev, n) for d, dev, n in self.fresh]
                    + [Storage(d, dev, n, data.copy()) for d, dev, n, data in self.made] + self.captured)
        pool: dict[int, Storage] = {}
        for i in wanted:
            if i < n_args:
                pool[i] = call.storages[i]
            elif i < n_args + n_fresh:
                pool[i] = Storage(*self.fresh[i - n_args])
            elif i < n_args + n_fresh + n_made:
                d, dev, n, data = self.made[i - n_args - n_fresh]
                pool[i] = Storage(d, dev, n, data.copy())
            else:
                pool[i] = self.captured[i - n_args - n_fresh - n_made]
        return pool

    def _layouts(self) -> list[_Layouts]:
        if self.layouts is None:
            self.layouts = [_Layouts(tuple(lay for _, lay in ins), tuple(lay for _, lay in outs))
                            for _, ins, outs, _ in self.nodes]
        return self.layouts

    def _watch(self, stream: Stream, n: int) -> None:
        """Learn at the flush of the queue these ``n`` nodes began whether it held only them."""
        def flushed(count: int) -> None:
            self.alone = count == n
            if self.probing:  # still alone: the next probe twice as far; joined: back to the first interval
                self.probing = False
                self.probe_every = min(2 * self.probe_every, REPROBE_MAX) if self.alone else REPROBE
        stream.nodes.watch = flushed

    def keep_form(self, stream: Stream, storages: list[Storage], nodes: list[Node], made: list[Storage]) -> None:
        """Copy the stream's form of these nodes, recorded from an empty stream, once the
        plan cache knows them (the form is numbered only while it walks stored plans)."""
        queue = stream.nodes
        form: Any = queue.form  # plan.Form: jit does not import the executor
        if form is None or len(queue) != len(nodes):
            return
        copy = self.form_copy = form.copy_of(storages + _fresh_storages(nodes) + made + self.captured)
        self.pending = [st.array is None for st in self.captured]
        if copy is not None:
            self.live = frozenset(k for k in copy.produced if copy.order[k] in self.results)
        self._watch(stream, len(nodes))


class _DirectRun:
    """What a direct replay of one stored plan takes, found once: the storages by rel id
    with the captured ones (the same every call) in place (``base``), the slots a call
    fills and from which pool index (``moving``), the pool indices a call makes (those
    and the results', ``wanted``), and its kernels' argument arrays (``plan.launches``, at
    its first run)."""

    __slots__ = ("plan", "base", "moving", "wanted", "launched", "watched", "arrays", "pending")

    def __init__(self, plan: Any, used: frozenset[int], order: tuple[int, ...], results: set[int],
                 first_captured: int, captured: list[Storage]) -> None:
        self.plan = plan
        self.base: list[Storage | None] = [None] * len(order)
        self.moving: list[tuple[int, int]] = []
        for k in sorted(used):
            i = order[k]
            if i >= first_captured:
                self.base[k] = captured[i - first_captured]
            else:
                self.moving.append((k, i))
        self.wanted = sorted({i for _, i in self.moving} | results)
        self.launched: list[Any] = []  # plan.launches, at the first run
        self.watched: list[Storage] = []  # the captured storages but scalar constants (which keep their arrays)
        #: weak references to their arrays when the launches were made (None: pending), so
        #: that an array a storage let go of is freed
        self.arrays: list[weakref.ref[Any] | None] = []
        self.pending: list[bool] | None = None  # the recording's pending pattern then (the very list)

    def holds(self, pending: list[bool]) -> bool:
        """Do the launches still hold: every captured storage (but the scalar constants)
        has the array (or the None) it had when they were made, under the pattern the
        recording still keeps? (Then the addresses in them are right, and the pattern is
        unchanged: one scan of the captured storages for both.)"""
        if pending is not self.pending:
            return False
        for st, r in zip(self.watched, self.arrays):
            a = st._array
            if (a is not None) if r is None else (a is None or r() is not a):
                return False
        return True

    def launch(self, layouts: list[_Layouts], storages: list[Storage | None], captured: list[Storage],
               pending: list[bool]) -> None:
        self.launched = planmod.launches(self.plan, layouts, storages, frozenset(k for k, _ in self.moving))
        self.watched = [st for st in captured if not is_constant(st)]
        self.arrays = [None if a is None else weakref.ref(a) for a in map(_ARRAY, self.watched)]
        self.pending = pending


class _Fast:
    """The last direct replay again, for a call of tensors and plain values (numbers,
    strings, dtypes) alone: each tensor checked against the signature it was recorded
    with, field by field, and each value by its key, where ``_Call`` builds and hashes
    a whole key; the storages filled from a list made once, where ``_pool`` walks the
    pool. Every other condition of a direct replay is asked as ``replay`` asks it;
    anything that differs (``run`` returns ``_MISS``) takes the usual way, which sees the
    same state and decides as it always does (a reprobe among them)."""

    __slots__ = ("rec", "direct", "expect", "tensors", "from_args", "fresh", "result", "values", "native",
                 "native_for")

    def __init__(self, rec: _Recording, direct: _DirectRun, expect: list[tuple[Any, ...]], tensors: int,
                 from_args: list[tuple[int, int]], fresh: list[tuple[int, tuple[Any, Any, int]]], result: Any,
                 values: list[Any]) -> None:
        self.rec, self.direct = rec, direct
        #: per argument: a tensor's (Tensor, dtype, device, layout, pending, read-only), or a value's key
        self.expect = expect
        self.tensors = tensors  # how many arguments are tensors (each its own storage)
        self.from_args = from_args  # (rel id, argument)
        self.fresh = fresh  # (rel id, storage spec)
        self.result = result  # the recording's result spec, its tensors by rel id and its arguments by position
        self.values = values  # the arguments that are values, as the lane was made from (None for tensors)
        self.native: Any = None  # the same checks and run in C (runtime/lane.py), where it can take them
        self.native_for: Any = None  # the direct run's launches it was armed for

    @staticmethod
    def of(rec: _Recording, direct: _DirectRun, call: _Call, args: tuple[Any, ...]) -> _Fast | None:
        """The lane of ``rec``'s direct run for calls like ``call`` of ``args`` (tensors,
        each its own storage, and plain values); None where made tensors, a container or
        an object among the arguments, or the result's form ask for the usual way."""
        if rec.made or len(call.storages) != len(call.tensors):
            return None
        at_arg: list[int] = []  # the argument of each storage (and tensor) of the call, in order
        expect: list[tuple[Any, ...]] = []
        for j, (a, part) in enumerate(zip(args, call.key)):
            if type(a) is Tensor:
                _, _, d, dev, shape, strides, offset, pending, ro = part
                expect.append((Tensor, d, dev, Layout(shape, strides, offset), pending, ro))
                at_arg.append(j)
            elif _value_key(a) == part:
                expect.append(part)
            else:
                return None
        n = len(at_arg)
        moved = {i: k for k, i in direct.moving}

        def place(spec: Any) -> Any:
            """``spec`` (``_Pool.spec``'s form) over the run's storages by rel id and the
            call's arguments, as ``_rebuild`` reads it."""
            kind, body = spec
            if kind == "tensor":
                if body[0] not in moved:  # (a view of an argument no kernel touches)
                    raise _NotReplayable()
                return ("tensor", (moved[body[0]], body[1]))
            if kind == "argument":
                return ("argument", at_arg[body])
            if kind == "seq":
                return ("seq", (body[0], [place(x) for x in body[1]]))
            return spec
        try:
            result = place(rec.result)
        except _NotReplayable:
            return None
        from_args = [(k, at_arg[i]) for k, i in direct.moving if i < n]
        fresh = [(k, rec.fresh[i - n]) for k, i in direct.moving if i >= n]
        fast = _Fast(rec, direct, expect, n, from_args, fresh, result,
                     [None if type(a) is Tensor else a for a in args])
        fast.arm()
        return fast

    def run(self, args: tuple[Any, ...], missed: bool = False) -> Any:
        """The call's result, or ``_MISS`` where it is not this lane's (``missed``: the C
        lane was asked first, and said so)."""
        expect = self.expect
        if len(args) != len(expect):
            return _MISS
        rec = self.rec
        for a, want in zip(args, expect):
            if type(a) is Tensor:
                if want[0] is not Tensor:
                    return _MISS
                _, d, dev, lay, pending, ro = want
                st, at = a._storage, a._layout
                if st.dtype is not d or st.device != dev or (at is not lay and at != lay) \
                        or (st._array is None) != pending or st.readonly != ro or id(st) in rec.captured_ids:
                    return _MISS
            elif want[0] is Tensor or _value_key(a) != want:
                return _MISS
        if self.tensors > 1 and len({id(a._storage) for a in args if type(a) is Tensor}) != self.tensors:
            return _MISS
        run = self.direct
        if not rec.restorable(stream_of(CPU)) or not rec.alone or memory.limited() \
                or rec.direct is not run or not run.holds(rec.pending) or (rec.direct_runs + 1) % rec.probe_every == 0:
            return _MISS
        found = planmod.stored(rec.form_copy, rec.live)
        if found is None or found[0] is not run.plan:
            return _MISS
        rec.direct_runs += 1
        storages = run.base.copy()
        for k, i in self.from_args:
            storages[k] = args[i]._storage
        for k, spec in self.fresh:
            storages[k] = Storage(*spec)
        planmod.run_stored(run.plan, run.launched, storages)
        if missed or self.native_for is not run.launched:
            self.arm()  # the C lane missed a call this one took (a kernel swapped), or the launches are new
        return _rebuild(self.result, storages, args)

    def arm(self) -> None:
        """Make the C lane (``runtime/lane.py``) of this lane's direct run as it stands:
        the same checks, each argument's and each attribute of braze's objects that the
        Python lane reads (``lane_guards``), and the same run, where the plan is one the C
        lane can run alone (its kernels, no arena, no extern step, no pending captured
        tensor) and the values are of types it compares."""
        run, rec = self.direct, self.rec
        self.native, self.native_for = None, run.launched
        plan = run.plan
        copy = rec.form_copy
        if not run.launched or copy is None or copy.path[-1] is None or rec.direct is not run \
                or plan.offsets or any(plan.release) or any(plan.bind) or not lane.available():
            return
        if any(not isinstance(s, planmod.CompiledKernel) or s.err is not None for s in plan.steps) \
                or any(r is None for r in run.arrays) or any(spec[1] != CPU for _, spec in self.fresh):
            return
        expect: list[tuple[Any, ...]] = []
        for want, value in zip(self.expect, self.values):
            if want[0] is Tensor:
                if want[4]:  # a pending argument
                    return
                expect.append((True, *want[1:]))
            elif type(value) in _NATIVE_VALUES:
                expect.append((False, value))
            else:
                return
        arg_slots = [-1] * len(self.expect)
        for k, i in self.from_args:
            if arg_slots[i] != -1:
                return
            arg_slots[i] = k
        kind, body = self.result
        steps = tuple((ctypes.cast(s.fn, ctypes.c_void_p).value, l.fixed.tobytes(), l.moving)
                      for s, l in zip(plan.steps, run.launched))  # (every step a kernel: each has its launch)
        stream = stream_of(CPU)
        self.native = lane.make((
            _MISS, Tensor, rec.captured_ids, rec, COUNTERS, planmod._shapes, plan.program,
            threads, Storage, memory.allocate_at, _rebuild, self.result,
            body[0] if kind == "tensor" else -1, body[1] if kind == "tensor" else None,
            tuple(expect), lane_guards(rec, run, stream, copy), len(run.base), tuple(arg_slots),
            tuple((k, spec, (spec[0].np, spec[2], "kernel")) for k, spec in self.fresh), steps))


def lane_guards(rec: _Recording, run: _DirectRun, stream: Stream, copy: Any) -> tuple[tuple[Any, ...], ...]:
    """What ``_Fast.run`` asks of braze's state, as the C lane's guards: attributes that
    must still be what they are now. The stream empty and the same, the recording
    flushed alone, its kept form, pending pattern and direct run unchanged, no
    memory budget, the launches and every captured array (by weak reference) the ones
    the launches were made with, the plan still the stored one (``plan.stored``: no
    capture watching, the trie not reset, its node not evicted), each kernel not swapped."""
    last = copy.path[-1]
    # (not asked: ``stream_of(CPU)`` is the same stream for the process's life, and the
    # form copy's liveness is set with it)
    guards: list[tuple[Any, ...]] = [
        (lane.G_FALSY, stream, "nodes", None, None),
        (lane.G_GT, stream, "limit", len(rec.nodes), None),
        (lane.G_IS, rec, "form_copy", copy, None),
        (lane.G_IS, rec, "alone", True, None),
        (lane.G_IS, rec, "direct", run, None),
        (lane.G_IS, rec, "pending", run.pending, None),
        (lane.G_IS, memory, "_limit", None, None),
        (lane.G_IS, run, "launched", run.launched, None),
        (lane.G_FALSY, planmod, "observers", None, None),
        (lane.G_IS, plan_trie, "root", copy.root, None),
        (lane.G_FALSY, last, "dead", None, None),
        (lane.G_ITEM, last, "plans", run.plan, rec.live),
    ]
    guards += [(lane.G_WEAK, st, "_array", r, None) for st, r in zip(run.watched, run.arrays)]
    guards += [(lane.G_IS, s, "fn", s.fn, None) for s in run.plan.steps]
    return tuple(guards)


#: the value types the C lane compares (by exact type and ==, floats by their bits)
_NATIVE_VALUES = frozenset({int, float, bool, str, type(None), DType, Device})


class _Operand:
    """An operand's layout alone: what a direct replay's kernels take offsets from."""

    __slots__ = ("layout",)

    def __init__(self, layout: Layout) -> None:
        self.layout = layout


class _Layouts:
    """A node template's operand layouts, shaped as a node (``plan.operand`` reads them)."""

    __slots__ = ("inputs", "outputs")

    def __init__(self, inputs: tuple[Layout, ...], outputs: tuple[Layout, ...]) -> None:
        self.inputs = tuple(_Operand(lay) for lay in inputs)
        self.outputs = tuple(_Operand(lay) for lay in outputs)


def _result_indices(spec: Any) -> set[int]:
    """The pool indices of the tensors a template returns (``_Pool.spec``'s form)."""
    kind, body = spec
    if kind == "tensor":
        return {body[0]}
    if kind == "seq":
        return set().union(*[_result_indices(x) for x in body[1]])
    return set()


def _rebuild(spec: Any, pool: Sequence[Storage | None] | dict[int, Storage], tensors: Sequence[Any]) -> Any:
    kind, body = spec
    if kind == "tensor":
        i, lay = body
        return Tensor(pool[i], lay)
    if kind == "argument":
        return tensors[body]
    if kind == "seq":
        typ, items = body
        values = [_rebuild(x, pool, tensors) for x in items]
        return typ._make(values) if hasattr(typ, "_make") else typ(values)
    return body


class _NotReplayable(Exception):
    """Why a traced call cannot be kept for replay."""


class _Retry(Exception):
    """A trace that cannot be kept this time, but may be the next."""


class Jitted(Generic[P, R]):
    """A function with its recordings, one per signature (``braze.jit``)."""

    def __init__(self, fn: Callable[P, R]) -> None:
        self.fn = fn
        self.recordings: dict[tuple[Any, ...], _Recording | None] = {}  # None: traced, not replayable
        self.fast: _Fast | None = None  # the last direct replay's lane
        self._warned: set[str] = set()
        functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        """As a method: ``self`` is the first argument (so it is part of the key)."""
        return self if obj is None else functools.partial(self, obj)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        fast = self.fast
        if fast is not None and not kwargs:
            native = fast.native  # (its C lane first, without the Python lane's frame)
            if native is not None:
                out = native(args)
                if out is not _MISS:
                    return out
            out = fast.run(args, native is not None)
            if out is not _MISS:
                return out
        try:
            call = _Call(args, kwargs)
        except _Unkeyable as err:
            self._say(f"an argument of type {err} cannot key a call (it is not hashable)")
            return self.fn(*args, **kwargs)
        rec = self.recordings.get(call.key, _UNTRACED)  # one lookup: a key's hash is not cached
        if rec is _UNTRACED:
            return self._trace(call, args, kwargs)
        if rec is None or not rec.captured_ids.isdisjoint(map(id, call.storages)):
            return self.fn(*args, **kwargs)  # not replayable, or an argument is a captured tensor
        direct = rec.direct_runs
        out = rec.replay(call, call.stream())
        if rec.direct_runs != direct and rec.direct is not None and (fast is None or fast.direct is not rec.direct) \
                and not kwargs:
            self.fast = _Fast.of(rec, rec.direct, call, args)
        return out

    def _trace(self, call: _Call, args: Any, kwargs: Any) -> R:
        stream = call.stream()
        queue, start = stream.nodes, len(stream.nodes)
        flushes, recorded, reads = COUNTERS["flushes"], COUNTERS["nodes_recorded"], COUNTERS["data_reads"]
        born = Storage.next_id()  # storages made by the call have larger ids
        out = self.fn(*args, **kwargs)
        if len(self.recordings) >= MAX_SIGNATURES:
            self._say(f"more than {MAX_SIGNATURES} signatures (new shapes on every call?); new ones run as they are")
            return out
        try:
            if COUNTERS["data_reads"] != reads:
                raise _NotReplayable("it read tensor data while traced (.item(), .numpy(), printing, indexing "
                                     "with a tensor), so its Python may depend on data")
            if COUNTERS["flushes"] != flushes or stream.nodes is not queue:
                raise _Retry()  # the stream's size limit ran part of it: trace again next time
            nodes = list(itertools.islice(queue, start, None))
            if COUNTERS["nodes_recorded"] - recorded != len(nodes):
                raise _NotReplayable("it recorded on another device's stream")
            rec, made = _template(call, nodes, out, born)
        except _Retry:
            return out
        except _NotReplayable as err:
            self.recordings[call.key] = None
            self._say(str(err))
            return out
        self._remember(call, rec)
        if start == 0:
            rec.keep_form(stream, call.storages, nodes, made)
        return out

    def _remember(self, call: _Call, rec: _Recording) -> None:
        key = call.key
        self.recordings[key] = rec
        for obj in call.objects:  # the recording goes when an object it is keyed by does
            weakref.finalize(obj, self.recordings.pop, key, None)  # (a fast lane takes tensors alone: not these)

    def _say(self, why: str) -> None:
        if why not in self._warned:
            self._warned.add(why)
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            print(f"braze.jit: {name}: {why}; it runs without replay", file=sys.stderr)


def _fresh_storages(nodes: list[Node]) -> list[Storage]:
    """The storages ``nodes`` produce, in the order ``_template`` numbers them."""
    return [o.storage for n in nodes if not n.op.inplace for o in n.outputs]


class _Pool:
    """Numbers a traced call's storages for its template: arguments, then what its nodes
    produce, then tensors made from data during the call, then anything else they read
    (captured), by first appearance."""

    def __init__(self, call: _Call, fresh: list[Storage], nodes: list[Node], out: Any, born: int) -> None:
        self.index = {id(st): i for i, st in enumerate(call.storages)}
        for j, st in enumerate(fresh):
            self.index.setdefault(id(st), len(call.storages) + j)
        self.tensors = {id(t): k for k, t in enumerate(call.tensors)}
        self.made: list[Storage] = []
        self.captured: list[Storage] = []
        base = len(call.storages) + len(fresh)
        # Made during the call from data (not read-only constants, which are shared):
        # each replay gets a copy, as each call of the function makes its own.
        for st in [o.storage for n in nodes for o in (*n.inputs, *n.outputs)] + _result_storages(out):
            if id(st) not in self.index and st.id > born and not st.readonly and st.array is not None:
                self.index[id(st)] = base + len(self.made)
                self.made.append(st)
        self.base = base + len(self.made)

    def at(self, st: Storage) -> int:
        i = self.index.get(id(st))
        if i is None:
            i = self.index[id(st)] = self.base + len(self.captured)
            self.captured.append(st)
        return i

    def spec(self, x: Any) -> Any:
        """What the function returned, over pool indices (``_rebuild`` inverts it)."""
        if isinstance(x, Tensor):
            k = self.tensors.get(id(x))
            if k is not None:
                return ("argument", k)
            return ("tensor", (self.at(x._storage), x._layout))
        if isinstance(x, (tuple, list)):
            return ("seq", (type(x), [self.spec(y) for y in x]))
        if x is None or isinstance(x, (bool, int, float, str)):
            return ("value", x)
        raise _NotReplayable(f"it returned a {type(x).__name__}, not tensors, tuples, lists or scalars")


def _result_storages(x: Any) -> list[Storage]:
    if isinstance(x, Tensor):
        return [x._storage]
    if isinstance(x, (tuple, list)):
        return [st for y in x for st in _result_storages(y)]
    return []


def _template(call: _Call, nodes: list[Node], out: Any, born: int) -> tuple[_Recording, list[Storage]]:
    """The recording of a traced call, and the storages it made from data (its pool's)."""
    fresh = _fresh_storages(nodes)
    pool = _Pool(call, fresh, nodes, out, born)
    budget: list[tuple[int, str]] = []
    templates = []
    for node in nodes:
        ins = tuple((pool.at(o.storage), o.layout) for o in node.inputs)
        outs = tuple((pool.at(o.storage), o.layout) for o in node.outputs)
        templates.append((node.op, ins, outs, node.attrs))
        if not node.op.inplace:
            nbytes = sum(o.storage.numel * o.storage.dtype.itemsize for o in node.outputs)
            if not budget or nbytes > budget[-1][0]:
                budget.append((nbytes, node.op.name))
    result = pool.spec(out)
    rec = _Recording([(st.dtype, st.device, st.numel) for st in fresh], pool.made, pool.captured, templates,
                     result, budget)
    return rec, pool.made


def jit(fn: Callable[P, R]) -> Jitted[P, R]:
    """Trace ``fn`` once per signature of its arguments and replay its recorded ops after:
    the same ops, fused and run as before, without running ``fn``'s Python. See the
    module docstring for what a signature is and what ``fn`` may do."""
    return Jitted(fn)
