"""In-place writes as stores of the group that computes what they write.

``x.add_(y)``, ``x[mask] = v``, ``x.masked_fill_(m, v)`` and ``x.copy_(e)`` record an
``assign`` node whose source is a value computed element by element (``x + y``,
``where(m, v, x)``). When an open group computes that value, the write becomes one
more store of the group, into the target's storage at the target's index, instead of a
copy kernel of its own after every group closes (or, for a target made in this flush,
an extern step). The target's new value is then the group's value for that storage,
so a read recorded after the write, through the view written, inlines it; any other
read of the storage waits for the group (it is the storage's producer now).

The ordering the recorded program promises holds because:

- every read of the target in the group is of the element being written, in the same
  iteration (loads come before stores in a kernel's loop body): a read recorded before
  the write sees the old value, a later one inlines the new value; a read elsewhere in
  the storage refuses the write (a parallel kernel would race with it);
- other open groups that read the target close first (for a tensor that exists before
  the flush, every other open group: storages from outside may share memory), so their
  kernels run before this one;
- a write through a view that is not the whole contiguous value (a slice) closes the
  group at once, so every later read goes through memory;
- a gather never recomputes the group's values at other elements (``inlined_source``);
- a group that writes in place is never moved up as a quantized matmul's epilogue.

Otherwise the write stays what it was: a copy kernel after every open group closes
(``own_steps.assign``), or an extern step.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import Any

from .. import ir
from .group import Group, Key, Value, affine, onto

Scheduler = Any  # fuse.Scheduler, which calls this module (it imports it)


def fuse(s: Scheduler, i: int, node: Any) -> str | None:
    """Make the write ``node`` (an ``assign``) a store of the open group computing its
    source (None); otherwise change nothing and say why ("" where no open group
    computes the source: the usual copy)."""
    found = _where(s, i, node)
    if isinstance(found, str):
        return found
    g, v, index = found
    (dst,) = node.outputs
    kd = s.key(dst.storage)
    realised = dst.storage.array is not None
    for h in list(s.open):
        if h is not g and (realised or _touches(h, kd)):
            s.close(h)
    g.members.append(i)
    s.producer[kd] = g
    s.materialized.add(kd)
    old = g.values.get(kd)
    if old is not None:  # the group computes the target itself: its value is rewritten
        g.values[kd] = replace(old, expr=v.expr)
        return None
    off = dst.layout.offset if realised else 0
    key: Any = (kd, off) if realised else kd
    if realised:  # the target's offset is given at run time, as its loads' are
        g.refs.setdefault(g.loads.setdefault(key, len(g.loads)), (i, -1))
    g.writes[kd] = (key, off, i)
    g.values[kd] = Value(v.expr, index, v.row, v.shape, v.dims)
    if onto(dst.layout, v) is None:
        s.close(g)  # a slice of the storage: later reads are not of the value's own index
    return None


def _where(s: Scheduler, i: int, node: Any) -> tuple[Group, Value, ir.Affine] | str:
    """The group, the source's value and the target's index in its coordinates, or why
    not ("" where no open group computes the source: the usual copy)."""
    (src,), (dst,) = node.inputs, node.outputs
    ks, kd = s.key(src.storage), s.key(dst.storage)
    g = s.producer.get(ks)
    v = g.values.get(ks) if g is not None and g in s.open else None
    shape = dst.layout.shape
    if g is None or v is None or ks == kd or src.layout.shape != shape or not prod(shape) \
            or src.storage.dtype is not dst.storage.dtype or dst.storage.dtype.is_block:
        return ""
    if kd in s.pending or any(n > i for n in s.claimed):
        return "the target is a pending quantized matmul's result, or a chain is being built"
    dims = onto(src.layout, v)
    if dims is None:
        return "the source is not the group's value element for element"
    if g.contract is not None or any(k == kd for k, _, _ in g.slices):
        return "the group is a chain kernel, or writes slices of the target"
    index = affine(dst.layout, dims, g.ndim)
    old = g.values.get(kd)
    if old is not None and (old.index != index or old.row != v.row):
        return "the group computes the target at another index"
    realised = dst.storage.array is not None
    key: Any = (kd, dst.layout.offset) if realised else kd
    if any(k != key and (k if isinstance(k, int) else k[0]) == kd for k in g.loads):
        return "the group reads the target through another offset"
    arg = g.loads.get(key)
    if arg is None:
        return (g, v, index)
    if v.row and g.inner:
        return "a row value written into a target the group reads (row stores come before element loads)"
    rel = replace(index, offset=index.offset - (dst.layout.offset if realised else 0))
    for e in _exprs(g):
        for n in ir.walk(e):
            if isinstance(n, ir.Load) and n.arg == arg and (n.index != rel or n.when or n.at):
                return "the group reads the target at other elements than it writes"
    return (g, v, index)


def _exprs(g: Group) -> list[ir.Expr]:
    out = [v.expr for v in g.values.values()] + [e for _, _, e in g.slices]
    for st in g.stages:
        out += ir.stage_exprs(st)
        if isinstance(st, ir.Reduce) and st.repair is not None:
            out.append(st.repair)
    return out


def _touches(g: Group, k: Key) -> bool:
    return k in g.loaded or k in g.values or k in g.recomputed or any(t == k for t, _, _ in g.slices)


def stores(s: Scheduler, g: Group, args: dict[Any, int], stages: list[ir.Stage]) -> set[Key]:
    """The closing group's in-place stores, appended to ``stages`` (arguments added to
    ``args``); returns the storages written (not produced: nothing is allocated). A
    target from before the flush is always written; one made in it only where Python
    holds it or a step after the write reads it."""
    written = set()
    for kd, (key, off, i) in g.writes.items():
        if isinstance(key, int) and kd not in s.live and \
                not any(r > i and r not in g.members for r in s.readers.get(kd, ())):
            continue
        v = g.values[kd]
        arg = args.setdefault(key, len(args))
        index = replace(v.index, offset=v.index.offset - off)
        stages.append(ir.StoreRow(arg, index, v.expr) if v.row and g.inner else ir.Store(arg, index, v.expr))
        written.add(kd)
    return written
