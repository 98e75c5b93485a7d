"""The scheduler: group a flushed stream's nodes into fused kernels and extern steps.

Every node is visited once, in recorded order. A node with a lowering joins an open
*group* (a kernel being built) when it can (``can_fuse``), choosing the group whose
fusion saves the most memory traffic (``score``: bytes of the node's inputs that it
would read from registers instead of memory); otherwise it starts a new group. A node
without a lowering (matmul, sort, gather, an in-place write ...) is an extern step: it
first closes the groups whose results it needs (and, for a write, every open group, so
reads recorded before the write run before it), then runs in order.

A group is a kernel over ``outer`` (rows, parallel) x ``inner`` (one row). Each value a
member computes is kept as an IR expression over those coordinates with the Affine
index at which its contiguous output would be stored. A consumer inlines a producer's
expression when it reads the producer's output at exactly that index (same element
for element; broadcasting a row value along the row also matches, since a row value's
index does not move along the row). Reading it any other way (a transpose, a slice, a
reshape that is not a view in these coordinates) refuses the fusion, with a reason.

When a group closes, a value is stored (materialised) only if Python can still reach
its tensor or a node outside the group reads it; everything else stays in registers.
A closing element-wise group that reads quantized matmuls' results element for element
becomes their epilogue instead of a kernel of its own (``epilogue.py``); a group
whose result only quantized matmuls read, at decoding's few rows, becomes their
prologue (``prologue.py``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from math import prod
from typing import Any, Sequence

from .. import dtypes as dt
from .. import ir
from ..layout import Layout, Shape
from ..ops.lowering import ARG_REDUCTIONS, GATHERS, REDUCTIONS, SCANS, ReduceSpec
from . import dce
from . import recompute
from . import chain
from . import epilogue
from . import prologue
from . import merge
from . import product
from . import reshape
from . import split
from . import inplace
from .group import ExternStep, Group, Key, KernelStep, Value, affine, onto as _onto
from ..codegen import quant as quant_kernels
from ..codegen import topk as topk_kernels

ROW_MIN = 1024
#: a reduction of an input of fewer dims than a large group's joins it only if the group
#: repeats its fold at most this many times over (index_copy's matches over (L, n) in a
#: group over (B, H, L, n, D) at B * H * D = 1024 repeats: 1.5x slower than its own kernel)
FOLD_REPEAT = 8


def _debug() -> int:
    try:
        return int(os.environ.get("BRAZE_DEBUG", "0"))
    except ValueError:
        return 0


def refuse(node: Any, reason: str) -> None:
    """Say why a fusion did not happen (``BRAZE_DEBUG=1``)."""
    if _debug() >= 1:
        print(f"braze: not fused: {node.op.name}: {reason}", file=sys.stderr)


@dataclass
class Schedule:
    steps: list[KernelStep | ExternStep]
    materialized: set[Key]


class Scheduler:
    def __init__(self, nodes: Sequence[Any], key_of: dict[int, Key], live: set[Key], library: bool = True,
                 chains: bool | None = None) -> None:
        # a node placed at another cut of its shape is replaced (``reshape``), and an outer
        # product written as a matmul is a mul (``product``)
        self.nodes = [product.as_product(n) or n for n in nodes]
        #: the target renders braze's library kernels (quantized matmuls and row gathers,
        #: top-k): the C backend does; the Triton one does not yet, so there those nodes
        #: stay nodes of their own (extern steps)
        self.library = library
        #: the target renders chain kernels (attention from user code): the C backend and
        #: the Triton one (``codegen/triton_chain.py``); by default as ``library``
        self.chains = library if chains is None else chains
        self.key_of = key_of  # id(storage) -> relative key
        self.live = live
        self.groups: list[Group] = []
        self.open: list[Group] = []
        self.producer: dict[Key, Group] = {}
        self.steps: list[KernelStep | ExternStep] = []
        self.materialized: set[Key] = set()
        self.readers: dict[Key, set[int]] = {}
        self.dtypes: dict[Key, dt.DType] = {}
        self.claimed: dict[int, chain.Chain] = {}  # node -> the chain that absorbs it
        self.pending: dict[Key, epilogue.Pending] = {}  # a plain QLinear step's result -> the step
        self.dead = dce.dead_nodes(self.nodes, self.key, live)  # never scheduled, nor counted as readers
        for i, node in enumerate(self.nodes):
            if i in self.dead:
                continue
            # A write's target counts as read: the write needs the storage to exist.
            for o in list(node.inputs) + (list(node.outputs) if node.op.inplace else []):
                self.readers.setdefault(self.key(o.storage), set()).add(i)
            for o in list(node.inputs) + list(node.outputs):
                self.dtypes[self.key(o.storage)] = o.storage.dtype

        self.created = recompute.find(self.nodes, self.key)
        self.gathers = recompute.gathers(self.nodes, self.key)  # read through by chains only

    def key(self, storage: Any) -> Key:
        return self.key_of[id(storage)]

    # -- the main loop ---------------------------------------------------------------
    def run(self) -> Schedule:
        for i, node in enumerate(self.nodes):
            lower = node.op.lower
            if i in self.dead:
                continue
            if i in self.claimed:
                if self.claimed[i].last == i:
                    self.chain_end(self.claimed[i])
                continue
            if node.op.name == "matmul" and self.chains and self.chain_start(i, node):
                continue
            if node.op.name == "cat" and self.cat(i, node):
                continue
            if node.op.name == "qlinear" and self.library and self.qlinear(i, node):
                continue
            if node.op.name == "assign" and self.write(i, node):
                continue
            if node.op.name == "index_copy" and self.scatter(i, node):
                continue
            if node.op.name == "qembedding" and self.library and self.qrows(i, node):
                continue
            if node.op.name == "topk" and self.library and self.topk(i, node):
                continue
            if node.op.inplace or lower is None:
                if lower is None and not node.op.inplace:
                    refuse(node, "no lowering to the loop IR: runs as an extern step")
                self.extern(i, node)
                continue
            if not self.place(i, node):
                self.extern(i, node)
        for g in list(self.open):
            self.close(g)
        for n, why in prologue.fold(self):
            refuse(self.nodes[n], f"not a quantized matmul's prologue: {why}")
        return Schedule(self.steps, self.materialized)

    def cat(self, i: int, node: Any) -> bool:
        """``cat`` as writes into slices of one output: each input that an open group
        computes element by element is stored by that group straight into its slice,
        and never exists on its own (rotary embedding's two halves, for one). Otherwise
        cat is placed like an element-wise node whose lowering reads each input under a
        range guard (index arithmetic in the consumer). The writing groups close at once:
        the output is then complete for whatever reads it next."""
        dim = node.attrs["dim"]
        out = node.outputs[0]
        if all(self.key(o.storage) in self.created or self.producer.get(self.key(o.storage)) not in self.open
               for o in node.inputs):
            # views, and values recomputed where they are read (a causal mask and zeros:
            # hstack; rotate_half's -x2 of a given x): read in the cat's consumer, nothing stored
            return False
        computed: list[tuple[Group, Value] | None] = []
        for o in node.inputs:
            g = self.producer.get(self.key(o.storage))
            v = g.values.get(self.key(o.storage)) if g is not None and g in self.open else None
            if g in self.open and (v is None or v.row or _onto(o.layout, v) is None):
                refuse(node, "an input is computed by an open group, but not element by element: "
                             "cat becomes guarded reads in its consumer instead of stores into slices")
                return False
            computed.append(None if g is None or v is None else (g, v))
        # An input no open group computes (a view of a given tensor, a value of the index
        # alone: partial rotary's pass-through half) is stored into its slice by a group that
        # computes an input of its shape, which reads it there; only for a result Python
        # holds (one a consumer reads is better read there, under guards: nothing stored).
        groups: list[tuple[Group, Value]] = []
        for o, gv in zip(node.inputs, computed):
            if gv is None and self.key(out.storage) in self.live:
                gv = next((c for c in computed if c is not None and _onto(Layout.contiguous(o.layout.shape), c[1])), None)
            if gv is None:
                refuse(node, "an input is not computed element by element by an open group, nor of the shape of one "
                             "that is: cat becomes guarded reads in its consumer instead of stores into slices")
                return False
            groups.append(gv)
        k_out = self.key(out.storage)
        start = 0
        for j, ((g, v), o, gv) in enumerate(zip(groups, node.inputs, computed)):
            n = o.layout.shape[dim]
            target = out.layout.slice(dim, start, start + n, 1)
            dims = _onto(Layout.contiguous(o.layout.shape), v)
            assert dims is not None
            expr = v.expr if gv is not None else self.operand(g, o, dims, (i, j))
            g.slices.append((k_out, affine(target, dims, g.ndim), expr))
            start += n
        self.materialized.add(k_out)
        for g, _ in groups:
            if i not in g.members:
                g.members.append(i)  # its reads of the halves are inside the group
        for g, _ in groups:
            if g in self.open:
                self.close(g)
        return True

    def chain_start(self, i: int, node: Any) -> bool:
        """A matmul whose result only feeds row work and a second matmul: claim the
        nodes in between; the kernel is built at the second matmul (``chain.py``)."""
        found = chain.find(self, i)
        if isinstance(found, str):
            refuse(node, f"not a fused chain: {found}")
            return False
        for n in [found.first, *found.members, found.last]:
            self.claimed[n] = found
        return True

    def chain_end(self, c: "chain.Chain") -> None:
        reason = chain.build(self, c)
        if not reason:
            return
        refuse(self.nodes[c.first], f"not a fused chain: {reason}")
        # Schedule the claimed nodes as usual, in order, now that all their inputs exist.
        for n in [c.first, *c.members, c.last]:
            del self.claimed[n]
            node = self.nodes[n]
            if node.op.lower is None or not self.place(n, node):
                self.extern(n, node)

    def extern(self, i: int, node: Any) -> None:
        self.settle(node)
        self.steps.append(ExternStep(i))

    def settle(self, node: Any) -> None:
        """Before a step of its own (extern or a library kernel): close the groups whose
        results it reads (every open group for a write, so reads recorded before it run
        first) and store its inputs."""
        if node.op.inplace:
            for g in list(self.open):
                self.close(g)
        for o in node.inputs:
            src = self.producer.get(self.key(o.storage))
            if src is not None and src in self.open:
                self.close(src)
            self.materialized.add(self.key(o.storage))

    def qlinear(self, i: int, node: Any) -> bool:
        """A quantized matmul: a kernel step (``ir.QLinear``) after the groups that
        produce its inputs, pending until a group that reads its result closes and may
        take it as its epilogue (``epilogue.py``); False (an extern step) where the
        kernel cannot read the operands in place."""
        (x, w), y = node.inputs, node.outputs[0]
        qtype = node.attrs["qtype"]
        xl, wl = x.layout, w.layout
        m, k = xl.shape
        n = wl.shape[0]
        why = ""
        if not quant_kernels.supported(qtype):
            why = f"no quantized matmul kernel for {qtype}"
        elif k > 1 and xl.strides[1] != 1 or k > 1 and wl.strides[1] != 1:
            why = "x and w need contiguous rows"
        elif m * n == 0 or k == 0:
            why = "an empty product"
        if why:
            refuse(node, why + ": runs as an extern step")  # plan.py says so on stderr, once
            return False
        self.settle(node)
        wd = w.storage.dtype
        ref = [None if o.storage.array is None else (i, j) for j, o in enumerate(node.inputs)]
        kernel = epilogue.plain(qtype, m, n, k, lda=xl.strides[0] if m > 1 else k, ldw=wd.nbytes(wl.strides[0]),
                                xoff=0 if ref[0] else xl.offset, woff=0 if ref[1] else wd.nbytes(wl.offset))
        ky = self.key(y.storage)
        self.materialized.add(ky)
        step = KernelStep(kernel, [self.key(x.storage), self.key(w.storage), ky], [ky], [i], ref + [None])
        self.steps.append(step)
        self.pending[ky] = epilogue.Pending(step, kernel, (self.key(x.storage), xl.offset,
                                                           replace(kernel, epilogue=(), args=(), woff=())))
        return True

    def qrows(self, i: int, node: Any) -> bool:
        """Embedding rows of a table in its file's type: a kernel step, when the ids
        exist before the flush (so the recording has checked them)."""
        (w, ids), out = node.inputs, node.outputs[0]
        if ids.storage.array is None or not quant_kernels.supported(node.attrs["qtype"]) \
                or ids.layout.shape[0] > 1 and ids.layout.strides[0] != 1 \
                or w.layout.shape[1] > 1 and w.layout.strides[1] != 1:
            return False  # the kernel reads ids and each table row contiguously
        self.settle(node)
        wd = w.storage.dtype
        kernel = ir.QRows(node.attrs["qtype"], ids.layout.shape[0], w.layout.shape[1], wd.nbytes(w.layout.strides[0]),
                          w.layout.shape[0], ids.storage.dtype.itemsize == 8)
        ko = self.key(out.storage)
        self.materialized.add(ko)
        self.steps.append(KernelStep(kernel, [self.key(w.storage), self.key(ids.storage), ko], [ko], [i],
                                     [(i, 0), (i, 1), None]))
        return True

    def topk(self, i: int, node: Any) -> bool:
        """``topk`` of small k: a kernel step of its own (``ir.TopK``) after the group
        that computes x; False (an extern step, numpy's sort) for a large k."""
        (x,), (vals, idx) = node.inputs, node.outputs
        k, d = node.attrs["k"], node.attrs["dim"]
        shape = x.layout.shape
        if not shape or not 0 < k <= topk_kernels.MAX_K or vals.layout.strides != idx.layout.strides:
            refuse(node, f"top-{k}: runs as an extern step (kernels take 1 <= k <= {topk_kernels.MAX_K})")
            return False
        self.settle(node)
        rest = [a for a in range(len(shape)) if a != d]
        kernel = ir.TopK(k, node.attrs["largest"], x.storage.dtype, tuple(shape[a] for a in rest),
                         tuple(x.layout.strides[a] for a in rest), shape[d], x.layout.strides[d],
                         tuple(vals.layout.strides[a] for a in rest), vals.layout.strides[d])
        kv, ki = self.key(vals.storage), self.key(idx.storage)
        self.materialized.update((kv, ki))
        self.steps.append(KernelStep(kernel, [self.key(x.storage), kv, ki], [kv, ki], [i], [(i, 0), None, None]))
        return True

    def write(self, i: int, node: Any) -> bool:
        """An in-place write: a store of the open group computing its source where it
        can be (``inplace.py``), else a copy kernel (``assign``) or an extern step."""
        why = inplace.fuse(self, i, node)
        if why is None:
            return True
        if why:
            refuse(node, f"an in-place write not stored by its source's group: {why}")
        return self.assign(i, node)

    def assign(self, i: int, node: Any) -> bool:
        """An in-place copy (``x[i] = v``, a KV cache write) into another storage of
        the same dtype: a copy kernel of its own, after every open group closes (as an
        extern write does). The target's offset is given at run time (``refs`` names
        the output operand as -1), so a write at a moving position replays one plan."""
        (src,), (dst,) = node.inputs, node.outputs
        shape = dst.layout.shape
        if (src.storage is dst.storage or src.layout.shape != shape or not shape or prod(shape) == 0
                or src.storage.dtype is not dst.storage.dtype or (dst.storage.array is None and self.library)
                or dst.storage.dtype.is_block):
            # A block tensor's bytes are copied by the reference (numpy). A target made in
            # this flush is too on the CPU; the Triton target has no reference to fall back
            # on, and writes it as any other (its producer stores it: the write reads it).
            return False
        self.settle(node)  # a write: closes every open group first
        nd = len(shape)
        dims = tuple(range(nd))
        si = affine(src.layout, dims, nd)
        di = affine(dst.layout, dims, nd)
        src_ref = None if src.storage.array is None else (i, 0)
        if src_ref is not None:
            si = ir.Affine(0, si.coeffs)
        di = ir.Affine(0, di.coeffs)
        d = dst.storage.dtype
        kernel = ir.Kernel(shape[:-1], shape[-1:], [ir.Store(1, di, ir.Load(0, si, d))], [(d, False), (d, True)])
        self.steps.append(KernelStep(kernel, [self.key(src.storage), self.key(dst.storage)], [], [i],
                                     [src_ref, (i, -1)]))
        return True

    def scatter(self, i: int, node: Any) -> bool:
        """``x.index_copy_(dim, index, source)`` (``x[index] = v``): a kernel over the
        source's elements, each stored at its row ``index[r]`` of x along ``dim``
        (``ir.Store.at``, the index checked: ``codegen/scatter.py``), after every open
        group closes (a write). O(source), where the reference rewrites x whole. x's
        offset, the index's and (when it exists before the flush) the source's are given
        at run time, so new slots and a moving target replay one plan."""
        (dst, idx, src), d = node.inputs, node.attrs["dim"]
        shape = src.layout.shape
        if (dst.storage.array is None or dst.storage.dtype.is_block or not shape or prod(shape) == 0
                or dst.layout.shape[d] == 0 or src.storage is dst.storage or idx.storage is dst.storage):
            return False  # a pending or block target, nothing to store, or an aliased source: the reference
        self.settle(node)
        # the row's dims (after d), merged where both source and target walk them as one
        inner: list[tuple[int, int, int]] = []  # (extent, source stride, target stride)
        for n, ss, ds in zip(shape[d + 1:], src.layout.strides[d + 1:], dst.layout.strides[d + 1:]):
            if inner and inner[-1][1] == ss * n and inner[-1][2] == ds * n:
                inner[-1] = (inner[-1][0] * n, ss, ds)
            elif n != 1:
                inner.append((n, ss, ds))
        outer = shape[:d + 1]
        nd = d + 1 + len(inner)
        refs = [None if o.storage.array is None else (i, j) for j, o in ((1, idx), (2, src))]
        ii = affine(idx.layout, (d,), nd)
        si = ir.Affine(src.layout.offset, affine(src.layout, range(d + 1), nd).coeffs[:d + 1] + tuple(t[1] for t in inner))
        ii, si = (ir.Affine(0, a.coeffs) if r else a for a, r in zip((ii, si), refs))
        coeffs = list(affine(dst.layout, range(d + 1), nd).coeffs[:d + 1]) + [t[2] for t in inner]
        coeffs[d] = 0
        row = ir.Load(1, ii, idx.storage.dtype)
        row64 = row if row.dtype is dt.int64 else ir.Op("cast", (row,), dt.int64)
        at = ((ir.checked(row64, dst.layout.shape[d], i, "index_copy", d), dst.layout.strides[d]),)
        dt_ = dst.storage.dtype
        store = ir.Store(2, ir.Affine(0, tuple(coeffs)), ir.Load(0, si, dt_), at)
        stages, checks = ir.numbered_checks([store])
        kernel = ir.Kernel(outer, tuple(t[0] for t in inner), stages,
                           [(dt_, False), (idx.storage.dtype, False), (dt_, True)], checks)
        self.steps.append(KernelStep(kernel, [self.key(o.storage) for o in (src, idx, dst)], [], [i],
                                     [refs[1], refs[0], (i, -1)]))
        return True

    # -- placing a lowerable node ------------------------------------------------------
    def place(self, i: int, node: Any) -> bool:
        if node.op.name in SCANS and not node.inputs[0].layout.shape:
            return False  # a 0-d scan is a copy: left to the reference
        producers = []
        for o in node.inputs:
            g = self.producer.get(self.key(o.storage))
            if g is not None and g in self.open and g not in producers:
                producers.append(g)
        # A group of values of the index alone (and element-wise work on given tensors) is
        # read by recomputing them: it takes a node only when no other group does.
        virtual = [g for g in producers if all(self.key(self.nodes[m].outputs[0].storage) in self.created
                                               for m in g.members)]
        best = self.best(node, [g for g in producers if g not in virtual])
        if best is not None:
            best = best[0], self.merge(node, best[1], [g for g in producers if g not in virtual])
        if best is None:
            # Siblings: an open group that already loads (or recomputes) one of this node's
            # inputs can read it once for both (mean and mean of squares of the same x), also
            # when the groups that compute its other inputs refuse it (x * cos + cat((-x2,
            # x1)) * sin: the group computing -x2 has another shape, the one computing x * cos
            # loads x too; a mask's sum beside the masked sum in mean pooling).
            best = self.best(node, [g for g in self.open if g not in producers and any(
                self.key(o.storage) in g.loaded or self.key(o.storage) in g.recomputed for o in node.inputs)])
        if best is None and (best := self.best(node, virtual)) is not None:
            best = best[0], self.merge(node, best[1], virtual)
        if best is not None:
            return self.add(best[1], i, node)
        g = self.new_group(node, reduce=node.op.name in REDUCTIONS or node.op.name in SCANS)
        if g is None:
            return False
        return self.add(g, i, node)

    def merge(self, node: Any, g: Group, others: list[Group]) -> Group:
        """``g`` with every other open group that computes an input of ``node`` merged
        into it where one kernel can compute both and still take the node
        (``merge.merged``): the node would otherwise make the other store its value."""
        for p in others:
            if p is g or not any(p is o for o in self.open):
                continue
            m = merge.merged(g, p)
            if m is None:
                refuse(node, f"groups {g.gid} and {p.gid}: other rows, or a scan or contraction: not merged")
                continue
            why = self.can_fuse(m, node)
            if why:
                refuse(node, f"groups {g.gid} and {p.gid} merged: {why}")
                continue
            self.open = [m if o is g else o for o in self.open if o is not p]
            for k in m.values:
                self.producer[k] = m
            g = m
        return g

    def best(self, node: Any, candidates: list[Group]) -> tuple[int, Group] | None:
        """The candidate group that saves the most traffic and accepts the node."""
        best: tuple[int, Group] | None = None
        for g in candidates:
            reason = self.can_fuse(g, node)
            if reason:
                refuse(node, f"group {g.gid}: {reason}")
                continue
            s = self.score(g, node)
            if best is None or s > best[0]:
                best = (s, g)
        return best

    @staticmethod
    def folded(node: Any, lead: int = 0) -> tuple[int, ...]:
        """The dims a reduction or a scan folds over (counted after ``lead`` more dims)."""
        return tuple(d + lead for d in node.attrs["dims"]) if node.op.name in REDUCTIONS else (node.attrs["dim"],)

    @staticmethod
    def lead(g: Group, node: Any) -> int:
        """The dims a reduction's input lacks before the group's (broadcast along them,
        as numpy aligns trailing dims); 0 for other nodes."""
        return max(0, len(g.elem_shape) - len(node.inputs[0].layout.shape)) if node.op.name in REDUCTIONS else 0

    def space(self, g: Group, node: Any) -> tuple[str, tuple[int | None, ...]] | None:
        """How the node's dims map onto the group's coordinates, or None."""
        if node.op.name in REDUCTIONS or node.op.name in SCANS:
            lead = self.lead(g, node)
            src = (1,) * lead + node.inputs[0].layout.shape
            dims = self.folded(node, lead)
            kept = [d for d in range(len(src)) if d not in dims]
            # a reduction of an input broadcast along kept dims (a mask's (B, S, 1) summed
            # over S in a group over (B, S, D), or index_copy's (L, n, 1) matches reduced
            # over n in a group over (B, H, L, n, D)) is the same fold in every row it
            # broadcasts to
            same = src == g.elem_shape or node.op.name in REDUCTIONS and len(src) == len(g.elem_shape) and all(
                a == b or a == 1 and d not in dims for d, (a, b) in enumerate(zip(src, g.elem_shape)))
            if not same or tuple(kept) + tuple(dims) != tuple(
                    sorted(range(len(src)), key=lambda d: g.elem_map[d])) and not g.reorderable():
                return None  # (an element-wise group is reordered for it: ``add``)
            if len(kept) != len(g.outer) and (g.stages or g.row_shapes):
                return None  # rows are fixed once the group has reduced something
            if lead and prod(g.elem_shape) >= recompute.COSTLY_READS and prod(g.elem_shape) > FOLD_REPEAT * prod(src):
                return None  # folded again in every row it broadcasts to: a kernel of its own costs less
            return "reduce" if node.op.name in REDUCTIONS else "scan", g.elem_map[lead:]
        shape = node.outputs[0].layout.shape
        if shape == g.elem_shape:
            return "elem", g.elem_map
        if shape in g.row_shapes:
            return "row", g.row_shapes[shape]
        return None

    @staticmethod
    def view(node: Any, j: int, dim_map: Sequence[int | None]) -> tuple[Layout, Sequence[int | None]]:
        """How input ``j`` of a node is read in the group: its layout and the group
        coordinate of each of its dims. A gather's source is read as at the output's
        coordinates (the lowering moves the gathered coordinate's term to the index's),
        but where ``index_select``'s index is not 1-d: then without its gathered dim
        (the lowering adds the term); that index runs along the output's dims from ``dim``."""
        o = node.inputs[j]
        if node.op.name not in GATHERS or not node.inputs[0].layout.shape:
            return o.layout, dim_map
        d = node.attrs["dim"]
        m = node.inputs[1].layout.ndim if node.op.name == "index_select" else 1  # the output dims of the index
        if j == 0 and m != 1:
            shape = o.layout.shape[:d] + (1,) + o.layout.shape[d + 1:]
            return Layout(shape, o.layout.strides, o.layout.offset), tuple(dim_map[:d]) + (None,) + tuple(dim_map[d + m:])
        return (o.layout, tuple(dim_map[d:d + m])) if node.op.name == "index_select" and j else (o.layout, dim_map)

    @staticmethod
    def gathered_coord(node: Any, dim_map: Sequence[int | None]) -> int | None:
        """The group coordinate along which a gather's source is read at its index
        (None where the source's load leaves that dim out: see ``view``)."""
        d = node.attrs["dim"]
        m = node.inputs[1].layout.ndim if node.op.name == "index_select" else 1
        return dim_map[d] if m == 1 and node.inputs[0].layout.shape else None

    def can_fuse(self, g: Group, node: Any) -> str:
        if self.space(g, node) is None and (seen := reshape.reshaped(g, node)) is not None:
            g, node = seen  # a reshaped view of the group's values: checked at their common cut
        sp = self.space(g, node)
        if sp is None:
            return f"iteration space {node.outputs[0].layout.shape} does not match the group's {g.elem_shape}"
        kind, dim_map = sp
        for j, o in enumerate(node.inputs):
            k = self.key(o.storage)
            v = g.values.get(k)
            if v is None:
                continue
            layout, in_map = self.view(node, j, dim_map)
            want = affine(layout, in_map, g.ndim)
            if node.op.name in GATHERS and j == 0:
                why = self.inlined_source(g, v, self.gathered_coord(node, dim_map)) if want == v.index else \
                    "not element-aligned"
                if why:
                    return f"{node.op.name} picks from #{o.storage.id} at data-dependent indices: {why}"
            if want != v.index:
                return f"reads #{o.storage.id} through a view that is not element-aligned ({o.layout})"
            if kind == "row" and not v.row:
                return "a row-level node cannot read an element-level value"
            if kind in ("reduce", "scan") and v.row:
                return f"a {kind} over a row value"
            if node.op.name in ("cat", "pad"):
                return f"{node.op.name} reads #{o.storage.id} at shifted coordinates, not where the group computes it"
        if kind == "reduce" and any(isinstance(s, ir.Store) for s in g.stages):
            return "the group already stores element values before this reduction"
        if kind == "reduce" and node.op.name in ARG_REDUCTIONS and any(isinstance(s, ir.Scan) for s in g.stages):
            return f"{node.op.name} of scanned values (an arg fold walks its row in lanes, a scan in order)"
        return ""

    @staticmethod
    def inlined_source(g: Group, v: Value, c: int | None) -> str:
        """Why a gather cannot compute its source's value (``v``, in its group) at the
        gathered places itself ("" when it can): only element-wise work over loads, in a
        group that has not reduced (a row's accumulator is its own row's)."""
        if c is None or g.stages or g.slices or g.contract is not None:
            return "its group reduces or writes slices: the source must be in memory"
        if g.writes:  # other elements of what it writes in place: they may be written already
            return "its group writes in place: the source must be in memory"
        nodes = list(ir.walk(v.expr))
        if not any(isinstance(n, ir.Load) for n in nodes):
            return "the source loads nothing"
        if any(isinstance(n, (ir.Acc, ir.Var, ir.Dot)) or isinstance(n, ir.Load) and (n.when or n.at) for n in nodes):
            return "the source reads guarded, gathered or row values"
        return ""

    def score(self, g: Group, node: Any) -> int:
        """Bytes of memory traffic the fusion saves: each input the group computes is
        neither written by its producer (unless needed elsewhere) nor read back (2x its
        size); each input the group already loads is read once instead of twice (1x)."""
        saved = 0
        for o in node.inputs:
            k = self.key(o.storage)
            nbytes = o.layout.numel * o.storage.dtype.itemsize
            saved += 2 * nbytes if k in g.values else nbytes if k in g.loaded else 0
        return saved

    def new_group(self, node: Any, reduce: bool) -> Group | None:
        gid = len(self.groups)
        if reduce:
            src = node.inputs[0].layout.shape
            dims = self.folded(node)
            kept = [d for d in range(len(src)) if d not in dims]
            order = kept + list(dims)
            coord = {d: c for c, d in enumerate(order)}
            g = Group(gid, tuple(src[d] for d in kept), tuple(src[d] for d in dims), tuple(src),
                      tuple(coord[d] for d in range(len(src))))
        else:
            shape = node.outputs[0].layout.shape
            # A row is the trailing dims holding at least ROW_MIN elements: short rows
            # would pay the per-row index arithmetic for a handful of elements.
            split = len(shape) - 1 if shape else 0
            while split > 0 and prod(shape[split:]) < ROW_MIN:
                split -= 1
            if node.op.name == "index_select" and shape:
                # rows at one index each: checked once per row (an embedding's)
                split = node.attrs["dim"] + node.inputs[1].layout.ndim
            g = Group(gid, shape[:split], shape[split:], shape, tuple(range(len(shape))))
        self.groups.append(g)
        self.open.append(g)
        return g

    def operand(self, g: Group, o: Any, dim_map: Sequence[int | None], ref: tuple[int, int]) -> ir.Expr:
        """Input ``ref`` = (node, input) of a node placed in ``g``, as an expression."""
        k = self.key(o.storage)
        v = g.values.get(k)
        if v is not None:
            return v.expr
        node = self.nodes[ref[0]]
        layout, dim_map = self.view(node, ref[1], dim_map)
        made = self.created.get(k)
        if made is None or node.op.name in GATHERS and ref[1] == 0:
            # a gather adds its index to its source's (cat and pad shift and guard what they read)
            return self.load_at(g, o.storage, affine(layout, dim_map, g.ndim), ref)
        # A value of the index alone (a causal mask from two aranges), or a copy of a
        # view: recomputed (read through) where it is read, so it never needs a buffer
        # or a kernel of its own.
        extents = list(g.outer + g.inner)
        if node.op.name in ("cat", "pad"):
            # computed over the input's own range of each coordinate (rotate_half's -x2):
            # the lowering shifts it to where it lies in the output, under its guard
            for n, c in zip(layout.shape, dim_map):
                if c is not None and n != 1:
                    extents[c] = n
        expr = made(affine(layout, dim_map, g.ndim), extents, self.loader(g))
        if expr is None:
            return self.load_at(g, o.storage, affine(layout, dim_map, g.ndim), ref)
        self.readers[k].discard(ref[0])
        g.recomputed.add(k)
        return expr

    def loader(self, g: Group) -> recompute.LoadAt:
        """Loads for a recomputed value read in ``g``: not of what ``g`` computes itself
        (it would read memory the same kernel has yet to write)."""
        def load_at(storage: Any, index: ir.Affine, ref: tuple[int, int]) -> ir.Load | None:
            if self.producer.get(self.key(storage)) is g:
                return None
            return self.load_at(g, storage, index, ref)
        return load_at

    def load_through(self, g: Group, o: Any, dim_map: Sequence[int | None], extents: Sequence[int],
                     ref: tuple[int, int]) -> ir.Load:
        """``load`` for a chain's matmul operand: a copy of a view (``repeat_kv``'s
        keys and values) is read where its input lies, through the index; rows
        gathered from a tensor that exists before the flush (keys through a block
        table) where they lie, at the index's values (``recompute.gathers``)."""
        k = self.key(o.storage)
        made = self.created.get(k) or self.gathers.get(k)
        if made is not None:
            e = made(affine(o.layout, dim_map, len(extents)), extents, self.loader(g))
            if isinstance(e, ir.Load):
                self.readers[k].discard(ref[0])
                return e
        return self.load(g, o, dim_map, len(extents), ref)

    def load(self, g: Group, o: Any, dim_map: Sequence[int | None], ndim: int, ref: tuple[int, int]) -> ir.Load:
        """Read operand ``ref`` (node, input) from memory in group ``g``."""
        return self.load_at(g, o.storage, affine(o.layout, dim_map, ndim), ref)

    def load_at(self, g: Group, storage: Any, index: ir.Affine, ref: tuple[int, int]) -> ir.Load:
        """A load of ``storage`` at ``index``, read through operand ``ref``. A producer
        in another group runs first. A tensor that exists before the flush is read
        through an argument of its own whose pointer carries the operand's offset, so the
        kernel (and the plan's key) do not depend on slice bounds: ``x[i]`` for each i
        replays one plan."""
        k = self.key(storage)
        src = self.producer.get(k)
        if src is not None and src is not g:
            if src in self.open:
                self.close(src)
            g.deps.add(src.gid)
        self.materialized.add(k)
        g.loaded.add(k)
        if storage.array is None:
            arg = g.loads.setdefault(k, len(g.loads))
        else:
            # one argument per (storage, offset): the plan's key says which operands share
            # an offset, so operands that do now will on every replay
            offset = self.nodes[ref[0]].inputs[ref[1]].layout.offset
            arg = g.loads.setdefault((k, offset), len(g.loads))
            g.refs.setdefault(arg, ref)
            index = replace(index, offset=index.offset - offset)
        return ir.Load(arg, index, storage.dtype)

    def add(self, g: Group, i: int, node: Any) -> bool:
        if self.space(g, node) is None and (seen := reshape.reshaped(g, node)) is not None:
            reshape.refine(g, seen[0].elem_shape)
            node = self.nodes[i] = seen[1]
        lead = self.lead(g, node)
        if node.op.name in REDUCTIONS or node.op.name in SCANS:
            dims = self.folded(node, lead)
            order = [g.elem_map[d] for d in range(len(g.elem_shape)) if d not in dims] + \
                [g.elem_map[d] for d in dims]
            if order != sorted(order):  # a reduction over a middle dim of element-wise work
                g.reorder(order)
        sp = self.space(g, node)
        assert sp is not None
        kind, dim_map = sp
        args = [self.operand(g, o, dim_map, (i, j)) for j, o in enumerate(node.inputs)]
        out = node.outputs[0]
        ctx = {**node.attrs, "coords": dim_map, "in_shapes": [o.layout.shape for o in node.inputs],
               "in_strides": [o.layout.strides for o in node.inputs], "node": i, "op": node.op.name}
        if node.op.name in GATHERS:
            ctx["gathered"] = self.gathered_coord(node, dim_map)
        result = node.op.lower(args, ctx, out.storage.dtype)
        if result is None:
            refuse(node, f"no lowering for dtype {out.storage.dtype.name} with {node.attrs}: runs as an extern step")
            # An operand recomputed above dropped this node from its readers: as an extern
            # step it reads them all from memory (x.abs() // y.exp() of given x, y).
            for o in node.inputs:
                self.readers[self.key(o.storage)].add(i)
            if not g.members and not g.values:
                self.open.remove(g)
                self.groups.remove(g)
            return False
        if isinstance(result, ReduceSpec) and result.post == "scan":
            value = Value(self.reduce(g, node, result, args[0]), affine(out.layout, dim_map, g.ndim), False,
                          out.layout.shape, dim_map)
        elif isinstance(result, ReduceSpec):
            expr = self.reduce(g, node, result, args[0])
            keep = node.attrs["keepdim"]
            src = node.inputs[0].layout.shape
            n_outer = len(g.outer)
            row_map = tuple(g.elem_map[d + lead] if d not in node.attrs["dims"] else None for d in range(len(src))) \
                if keep else tuple(c for c in range(lead, n_outer))  # (the kept dims are the outer coordinates)
            g.row_shapes.setdefault(out.layout.shape, row_map)
            value = Value(expr, affine(out.layout, row_map, g.ndim), True, out.layout.shape, row_map)
        else:
            value = Value(result, affine(out.layout, dim_map, g.ndim), kind == "row", out.layout.shape, dim_map)
        k = self.key(out.storage)
        g.values[k] = value
        g.members.append(i)
        self.producer[k] = g
        return True

    def reduce(self, g: Group, node: Any, spec: ReduceSpec, arg: ir.Expr) -> ir.Expr:
        if not g.stages:
            # The first reduction decides what a row is. Coordinates are numbered outer
            # then inner in one sequence, so moving the split renumbers nothing.
            n_kept = len(g.elem_shape) - len(self.folded(node))
            coords = g.outer + g.inner
            g.outer, g.inner = coords[:n_kept], coords[n_kept:]
        n = prod(g.inner)
        if spec.post == "var":
            # Two passes, as the reference computes it (no single-pass sum of squares, which
            # cancels): the row's mean, then the sum of squared deviations from it.
            g.stages.append(ir.Reduce("sum", arg, spec.acc))
            mean = ir.Op("div", (ir.Acc(len(g.stages) - 1, spec.acc), ir.Const(n, spec.acc)), spec.acc)
            x = arg if arg.dtype is spec.acc else ir.Op("cast", (arg,), spec.acc)
            dev = ir.Op("sub", (x, mean), spec.acc)
            arg = ir.Op("mul", (dev, dev), spec.acc)
        if spec.post == "scan":
            g.stages.append(ir.Scan(spec.op, arg, spec.acc))
        elif spec.op in ARG_REDUCTIONS:  # the fold keeps the position along the folded dim beside the value
            g.stages.append(ir.Reduce(spec.op, arg, spec.acc, index=ir.Coord(g.elem_map[self.folded(node)[0]], dt.int64)))
        else:
            g.stages.append(ir.Reduce(spec.op, arg, spec.acc))
        acc: ir.Expr = ir.Acc(len(g.stages) - 1, spec.acc)
        out = node.outputs[0].storage.dtype
        if spec.post in ("mean", "var"):
            # var divides by max(n - correction, 0): 0 gives inf or nan, as in the reference
            d = n if spec.post == "mean" else max(n - spec.correction, 0)
            d = int(d) if float(d).is_integer() else d  # an int count can be a generic size
            acc = ir.Op("div", (acc, ir.Const(d, spec.acc)), spec.acc)
        if acc.dtype is not out:
            acc = ir.Op("cast", (acc,), out)
        return acc

    # -- closing a group: decide what to store, emit the kernel --------------------------
    def close(self, g: Group) -> None:
        self.open.remove(g)
        if not g.members:
            return
        members = set(g.members)
        args = dict(g.loads)
        outputs = []
        stages = list(g.stages)
        for k, v in g.values.items():
            if k in g.writes:
                continue  # stored in place, below
            outside = any(r not in members for r in self.readers.get(k, ()))
            if k not in self.live and not outside:
                continue
            arg = args.setdefault(k, len(args))
            outputs.append(k)
            self.materialized.add(k)
            if v.row and g.inner:
                stages.append(ir.StoreRow(arg, v.index, v.expr))
            else:
                stages.append(ir.Store(arg, v.index, v.expr))
        written = inplace.stores(self, g, args, stages)
        for k, index, expr in g.slices:
            arg = args.setdefault(k, len(args))
            if k not in outputs:
                outputs.append(k)
            stages.append(ir.Store(arg, index, expr))
        if g.contract is not None:
            k, st = g.contract
            arg = args.setdefault(k, len(args))
            outputs.append(k)
            stages.append(replace(st, arg=arg))
        if not outputs and not written:
            return
        order = sorted(args, key=lambda a: args[a])
        keys = [a if isinstance(a, int) else a[0] for a in order]
        if g.contract is None:
            stages = chain.rolling(stages, len(g.outer), g.inner)
        stages, checks = ir.numbered_checks(stages)
        flags = [(self.dtypes[k], k in outputs or k in written) for k in keys]
        kernel = split.split_divisions(ir.Kernel(g.outer, g.inner, stages, flags, checks))
        step = KernelStep(kernel, keys, outputs, sorted(members), [g.refs.get(args[a]) for a in order])
        # (an epilogue runs at its matmul's place, before steps that may read what g writes in place)
        folded = epilogue.fold(self, step) if not g.writes else ""
        if isinstance(folded, str):
            if folded:
                refuse(self.nodes[step.nodes[0]], f"not a quantized matmul's epilogue: {folded}")
            folded = step
        self.steps.append(folded)


def schedule(nodes: Sequence[Any], key_of: dict[int, Key], live: set[Key], library: bool = True,
             chains: bool | None = None) -> Schedule:
    """``library``: whether the target renders braze's library kernels (``Scheduler.library``);
    ``chains``: whether it renders chain kernels (``Scheduler.chains``, by default as ``library``)."""
    return Scheduler(nodes, key_of, live, library, chains).run()
