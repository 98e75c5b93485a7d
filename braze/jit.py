"""``@braze.jit``: run a function's Python once per signature, replay what it recorded.

Recording is cheap per op, but not free: a decoding step of attention records eight
ops, and their shape rules, tensors, nodes and relative form cost more than the kernel
they become. ``jit`` removes that work for a function called again and again with
tensors of the same shapes (PyTorch 2's guards and replay, at the level of braze's
stream):

- **Signature (the guard).** Each call is keyed by its arguments: for a tensor its
  dtype, device, layout (shape, strides, offset), whether it is still pending or
  read-only (a write into it must be refused again), and which other arguments share
  its storage; any other argument by type and value
  (it must be hashable). Tuples and lists are keyed element by element.
- **Trace (a miss).** The function runs as usual and its nodes are recorded on the
  stream. They are kept as a template: each operand is an argument's storage, a
  storage one of these nodes produces, or a storage captured from outside (a weight,
  a scalar constant), kept alive by the template. What the function returns is kept
  the same way.
- **Replay (a hit).** No Python of the function runs: fresh storages for what the
  nodes produce, the nodes rebuilt over the call's storages, appended to the stream.
  When the stream is empty, as it is after a sync point, the stream's relative form
  (``plan.Form``) is restored from a copy instead of numbered node by node, so the
  flush finds its plan at once.

The contract is ``jax.jit``'s: the function's tensors must depend only on its
arguments, and what it captures must not be rebound between calls (a captured tensor
written in place is fine: the replay reads it as the function would). Random numbers
drawn inside are drawn once. A function that syncs while traced (``.item()``,
``.numpy()``: its Python may branch on data) or returns something other than
tensors, tuples, lists and scalars is not replayed; braze says why once on stderr and
calls it as it is.
"""

from __future__ import annotations

import functools
import itertools
import sys
from typing import Any, Callable, Generic, ParamSpec, TypeVar

from .device import CPU
from .layout import Layout
from .runtime import memory
from .stats import COUNTERS
from .storage import Storage
from .stream import Node, Operand, Stream, stream_of
from .tensor import Tensor

P = ParamSpec("P")
R = TypeVar("R")

MAX_SIGNATURES = 256  # per function: past this, new signatures run without replay


class _Unkeyable(Exception):
    """An argument jit cannot key a call by (not hashable, or a container it does not walk)."""


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], list[Storage]]:
    """The call's key and its tensors' storages, in order of first appearance."""
    storages: list[Storage] = []
    index: dict[int, int] = {}
    parts = [_key(a, storages, index) for a in args]
    if kwargs:
        parts.append(tuple((k, _key(kwargs[k], storages, index)) for k in sorted(kwargs)))
    return tuple(parts), storages


def _key(x: Any, storages: list[Storage], index: dict[int, int]) -> Any:
    """One argument's part of the key (a module-level function: a closure calling itself
    would be a reference cycle that keeps the call's storages alive until the next
    garbage collection, and the plan cache counts references)."""
    if isinstance(x, Tensor):
        st = x._storage
        i = index.get(id(st))
        if i is None:
            i = index[id(st)] = len(storages)
            storages.append(st)
        return (Tensor, i, st.dtype, st.device, x._layout, st.array is None, st.readonly)
    if isinstance(x, (tuple, list)):
        return (type(x), *[_key(y, storages, index) for y in x])
    if isinstance(x, float):
        return (float, x.hex())  # -0.0 apart from 0.0, and a nan equal to a nan
    try:
        hash(x)
    except TypeError:
        raise _Unkeyable(type(x).__name__) from None
    return (type(x), x)


class _Recording:
    """One traced call: its nodes as templates over a pool of storages.

    A replay's pool is ``[argument storages] + [fresh storages] + [captured storages]``;
    an operand is ``(pool index, layout)``. Node templates keep no storage the function
    produced: a template of a big intermediate costs its shape, not its memory."""

    __slots__ = ("n_args", "fresh", "captured", "pending", "nodes", "result", "budget", "form_copy")

    def __init__(self, n_args: int, fresh: list[tuple[Any, Any, int]], captured: list[Storage],
                 nodes: list[tuple[Any, tuple[tuple[int, Layout], ...], tuple[tuple[int, Layout], ...], dict[str, Any]]],
                 result: Any, budget: tuple[int, str]) -> None:
        self.n_args = n_args
        self.fresh = fresh  # (dtype, device, numel) of each storage the nodes produce
        self.captured = captured
        self.pending = [st.array is None for st in captured]  # as traced: part of the form
        self.nodes = nodes
        self.result = result
        self.budget = budget  # the largest bytes one node asks for, and its op (memory.check)
        self.form_copy: Any = None  # plan.FormCopy once the form of these nodes from an empty stream is known

    def replay(self, storages: list[Storage], stream: Stream) -> Any:
        if memory.limited():
            memory.check(*self.budget)
        pool = storages + [Storage(d, dev, n) for d, dev, n in self.fresh] + self.captured
        nodes = [Node(op, tuple([Operand(pool[i], lay) for i, lay in ins]),
                      tuple([Operand(pool[i], lay) for i, lay in outs]), attrs)
                 for op, ins, outs, attrs in self.nodes]
        fill = None
        copy = self.form_copy
        if copy is not None and [st.array is None for st in self.captured] == self.pending:
            def fill(form: Any) -> bool:
                return bool(form.restore(copy, pool))
        empty = not stream.nodes
        stream.record_all(nodes, fill)
        if empty and copy is None:
            self.keep_form(stream, pool)
        return _rebuild(self.result, pool)

    def keep_form(self, stream: Stream, pool: list[Storage]) -> None:
        """Copy the stream's form of these nodes, recorded from an empty stream, once the
        plan cache knows them (the form is numbered only while it walks stored plans)."""
        queue = stream.nodes
        form: Any = queue.form  # plan.Form: jit does not import the executor
        if form is not None and len(queue) == len(self.nodes):
            self.form_copy = form.copy_of(pool)


def _rebuild(spec: Any, pool: list[Storage]) -> Any:
    kind, body = spec
    if kind == "tensor":
        i, lay = body
        return Tensor(pool[i], lay)
    if kind == "seq":
        typ, items = body
        values = [_rebuild(x, pool) for x in items]
        return typ._make(values) if hasattr(typ, "_make") else typ(values)
    return body


class _NotReplayable(Exception):
    """Why a traced call cannot be kept for replay."""


class Jitted(Generic[P, R]):
    """A function with its recordings, one per signature (``braze.jit``)."""

    def __init__(self, fn: Callable[P, R]) -> None:
        self.fn = fn
        self.recordings: dict[tuple[Any, ...], _Recording | None] = {}  # None: traced, not replayable
        self._warned: set[str] = set()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            key, storages = _signature(args, kwargs)
        except _Unkeyable as err:
            self._say(f"an argument of type {err} cannot key a call (it is not hashable)")
            return self.fn(*args, **kwargs)
        if key not in self.recordings:
            return self._trace(key, storages, args, kwargs)
        rec = self.recordings[key]
        if rec is None:
            return self.fn(*args, **kwargs)
        dev = storages[0].device if storages else CPU
        return rec.replay(storages, stream_of(dev))

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        """As a method: ``self`` is the first argument (so it is part of the key)."""
        return self if obj is None else functools.partial(self, obj)

    def _trace(self, key: tuple[Any, ...], storages: list[Storage], args: Any, kwargs: Any) -> R:
        stream = stream_of(storages[0].device if storages else CPU)
        queue, start = stream.nodes, len(stream.nodes)
        flushes, recorded = COUNTERS["flushes"], COUNTERS["nodes_recorded"]
        out = self.fn(*args, **kwargs)
        if len(self.recordings) >= MAX_SIGNATURES:
            self._say(f"more than {MAX_SIGNATURES} signatures (new shapes on every call?); new ones run as they are")
            return out
        try:
            if COUNTERS["flushes"] != flushes or stream.nodes is not queue:
                raise _NotReplayable("it synchronised while traced (.item(), .numpy(), printing, or the stream's "
                                     "size limit), so its Python may depend on data")
            nodes = list(itertools.islice(queue, start, None))
            if COUNTERS["nodes_recorded"] - recorded != len(nodes):
                raise _NotReplayable("it recorded on another device's stream")
            rec = _template(storages, nodes, out)
        except _NotReplayable as err:
            self.recordings[key] = None
            self._say(str(err))
            return out
        self.recordings[key] = rec
        if start == 0:
            pool = storages + _fresh_storages(nodes) + rec.captured
            rec.keep_form(stream, pool)
        return out

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
    produce, then anything else they read (captured), by first appearance."""

    def __init__(self, storages: list[Storage], fresh: list[Storage]) -> None:
        self.index = {id(st): i for i, st in enumerate(storages)}
        for j, st in enumerate(fresh):
            self.index.setdefault(id(st), len(storages) + j)
        self.base = len(storages) + len(fresh)
        self.captured: list[Storage] = []

    def at(self, st: Storage) -> int:
        i = self.index.get(id(st))
        if i is None:
            i = self.index[id(st)] = self.base + len(self.captured)
            self.captured.append(st)
        return i

    def spec(self, x: Any) -> Any:
        """What the function returned, over pool indices (``_rebuild`` inverts it)."""
        if isinstance(x, Tensor):
            return ("tensor", (self.at(x._storage), x._layout))
        if isinstance(x, (tuple, list)):
            return ("seq", (type(x), [self.spec(y) for y in x]))
        if x is None or isinstance(x, (bool, int, float, str)):
            return ("value", x)
        raise _NotReplayable(f"it returned a {type(x).__name__}, not tensors, tuples, lists or scalars")


def _template(storages: list[Storage], nodes: list[Node], out: Any) -> _Recording:
    fresh = _fresh_storages(nodes)
    pool = _Pool(storages, fresh)
    budget = (0, "")
    templates = []
    for node in nodes:
        ins = tuple((pool.at(o.storage), o.layout) for o in node.inputs)
        outs = tuple((pool.at(o.storage), o.layout) for o in node.outputs)
        templates.append((node.op, ins, outs, node.attrs))
        if not node.op.inplace:
            nbytes = sum(o.storage.numel * o.storage.dtype.itemsize for o in node.outputs)
            if nbytes > budget[0]:  # the first node that asks for the most: where a call fails
                budget = (nbytes, node.op.name)
    result = pool.spec(out)
    return _Recording(len(storages), [(st.dtype, st.device, st.numel) for st in fresh], pool.captured, templates,
                      result, budget)


def jit(fn: Callable[P, R]) -> Jitted[P, R]:
    """Trace ``fn`` once per signature of its arguments and replay its recorded ops after:
    the same ops, fused and run as before, without running ``fn``'s Python. See the
    module docstring for what a signature is and what ``fn`` may do."""
    return Jitted(fn)
