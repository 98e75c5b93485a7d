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
from . import own_steps
from .debug import refuse
from .group import ExternStep, Group, Key, KernelStep, Value, affine, onto as _onto

ROW_MIN = 1024
#: a reduction of an input of fewer dims than a large group's joins it only if the group
#: repeats its fold at most this many times over (index_copy's matches over (L, n) in a
#: group over (B, H, L, n, D) at B * H * D = 1024 repeats: 1.5x slower than its own kernel)
FOLD_REPEAT = 8


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
            if node.op.name == "qlinear" and self.library and own_steps.qlinear(self, i, node):
                continue
            if node.op.name == "assign" and self.write(i, node):
                continue
            if node.op.name == "index_copy" and own_steps.scatter(self, i, node):
                continue
            if node.op.name == "qembedding" and self.library and own_steps.qrows(self, i, node):
                continue
            if node.op.name == "topk" and self.library and own_steps.topk(self, i, node):
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

    def write(self, i: int, node: Any) -> bool:
        """An in-place write: a store of the open group computing its source where it
        can be (``inplace.py``), else a copy kernel (``assign``) or an extern step."""
        why = inplace.fuse(self, i, node)
        if why is None:
            return True
        if why:
            refuse(node, f"an in-place write not stored by its source's group: {why}")
        return own_steps.assign(self, i, node)

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
        made = self.recomputable(g, k)
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

    def recomputable(self, g: Group, k: Key) -> recompute.Recompute | None:
        """How to recompute ``k`` where ``g`` reads it, or None to load it. A value a group
        computed and that group has closed is loaded: that group stored it (this read
        counted as one from outside), and what a recompute reads (a copy's input) it may
        not have stored."""
        src = self.producer.get(k)
        if src is not None and src is not g and src not in self.open:
            return None
        return self.created.get(k)

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
        for made in (self.recomputable(g, k), self.gathers.get(k)):  # (a recomputed cast is an Op, not a load)
            e = None if made is None else made(affine(o.layout, dim_map, len(extents)), extents, self.loader(g))
            if isinstance(e, ir.Load):
                self.readers[k].discard(ref[0])
                g.read_through.append((k, ref[0]))
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
