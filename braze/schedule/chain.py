"""Chains: a matmul, element-wise work and row reductions on its result, and a second
matmul, fused into one kernel that never materialises the first product.

This is how attention written as ordinary code, ``softmax(q @ k.mT * scale + mask) @ v``,
becomes one kernel. Nothing here knows about attention: a chain is any stream where

1. ``S = A @ B`` (the *scores*, shape ``(..., L, N)``; float32, or half inputs
   computed in float32: ``CHAIN_DTYPES``);
2. every later node that reads ``S`` or a value derived from it is element-wise on
   ``(..., L, N)`` or on rows ``(..., L, 1)``, or a reduction over the last dim, and the
   derived values are read by nothing else and reachable by no Python object;
3. a final ``P @ V`` reads a full-size derived value ``P``.

Such a stream is a row kernel (rows ``(..., L)``, the row axis ``j < N``) whose element
values start from an ``ir.Dot`` (one element of ``A @ B``) instead of a load, whose
reductions are the ordinary ``ir.Reduce`` stages, and whose last stage is an
``ir.Contract``: ``out[.., e] = sum_j P[.., j] * V[.., j, e]``. Factors of ``P``
constant along the row (softmax's ``1 / sum``) are taken out of the sum and applied
once per row (``Contract.post``), because ``sum_j (p_j / l) v_j = (sum_j p_j v_j) / l``.

The C renderer runs it in tiles of keys, one pass, keeping the running values of the
reductions: each reduction and the contraction that depends on an earlier reduction
carries the repair term ``schedule/repair.py`` derives and proves for it. When a repair
cannot be derived the chain is not formed (``BRAZE_DEBUG=1`` says why) and the nodes
are scheduled as usual (matmuls as extern steps).

The scheduler finds a chain when it reaches the first matmul (``find``), claims its
nodes, and builds the kernel when it reaches the last one (``build``), when every
value the chain reads from outside has been produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .. import dtypes as dt
from .. import ir
from ..layout import Layout
from ..ops.lowering import ARG_REDUCTIONS, GATHERS, REDUCTIONS, SCANS
from . import repair

from .group import Group, Value, affine

Scheduler = Any  # fuse.Scheduler, which builds chains through this module (it imports it)

#: A chain kernel keeps its tiles on each thread's stack: head dims whose tiles would
#: need more than this are not fused.
TILE_BYTES = 512 * 1024

CHAIN_DTYPES = ir.CHAIN_DTYPES  # the matmuls a chain starts and ends at (see ir.py)


def in_float32(e: ir.Expr) -> ir.Expr:
    """``e`` computed in float32 where it reads the scores (the Dot) or a running value:
    there half-typed results are not rounded back to their type, and a cast to a half
    type of a float32 value is dropped. What reads neither (a mask, a bias, a fill: the
    chain's inputs) is left as it is, computed and rounded as the reference computes it
    (a float32 mask of -1e9 cast to float16 is -inf there too). Loads keep their dtype
    (the renderer converts a half load to float). Rounding the values between the
    matmuls as the reference does would make the repair terms underivable (rounding does
    not distribute over a sum), and would lose what float32 accumulation is for; so
    scores beyond the half range stay finite here, where the reference's overflow."""
    if not isinstance(e, ir.Op) or not any(isinstance(n, (ir.Dot, ir.Acc)) for n in ir.walk(e)):
        return e
    args = tuple(in_float32(a) for a in e.args)
    if e.name == "cast" and e.dtype.is_half and args[0].dtype is dt.float32:
        return args[0]
    return ir.Op(e.name, args, dt.float32 if e.dtype.is_half else e.dtype, e.attrs)


@dataclass
class Chain:
    first: int  # the node of S = A @ B
    last: int  # the node of P @ V
    members: list[int] = field(default_factory=list)  # the nodes in between that it absorbs


def find(s: "Scheduler", i: int) -> Chain | str:
    """A chain starting at matmul node ``i``, or why there is none."""
    nodes = s.nodes
    node = nodes[i]
    a, b = node.inputs
    out = node.outputs[0]
    if out.storage.dtype not in CHAIN_DTYPES or a.storage.dtype is not out.storage.dtype:
        return f"a {out.storage.dtype.name} matmul (chains start at float32, float16 or bfloat16 ones)"
    if len(a.layout.shape) < 2 or len(b.layout.shape) < 2:
        return "a matrix-vector product"
    shape = out.layout.shape
    if not shape[-1]:  # no keys: the row's sum is empty, and only the reference gives 0 for its weights' product
        return "no keys (the row axis is empty)"
    row_shape = shape[:-1] + (1,)
    region = {s.key(out.storage)}
    chain = Chain(i, -1)
    for n in range(i + 1, len(nodes)):
        if n in s.dead:
            continue
        nd = nodes[n]
        keys = [s.key(o.storage) for o in nd.inputs]
        if nd.op.inplace:
            return f"an in-place {nd.op.name} between the matmuls"
        if not any(k in region for k in keys):
            continue
        if nd.op.name == "matmul":
            if keys[0] in region and keys[1] not in region and nd.inputs[0].layout.shape == shape \
                    and nd.outputs[0].storage.dtype in CHAIN_DTYPES:
                chain.last = n
                break
            return "the second matmul does not read the scores' row as its left operand"
        if nd.op.lower is None or nd.op.name in GATHERS or nd.op.name in SCANS or nd.op.name in ARG_REDUCTIONS:
            return f"{nd.op.name} reads the scores and has no lowering in a chain"
        oshape = nd.outputs[0].layout.shape
        if nd.op.name in REDUCTIONS:
            if tuple(nd.attrs["dims"]) != (len(shape) - 1,) or not nd.attrs["keepdim"] \
                    or nd.inputs[0].layout.shape != shape:
                return f"{nd.op.name} over other dims than the row"
        elif oshape not in (shape, row_shape):
            return f"{nd.op.name} of shape {oshape} inside the chain"
        region.add(s.key(nd.outputs[0].storage))
        chain.members.append(n)
    if chain.last < 0:
        return "no second matmul reads the scores"
    inside = set(chain.members) | {i, chain.last}
    for k in region:
        if k in s.live:
            return "a value between the matmuls is reachable from Python (it would be stored)"
        if any(r not in inside for r in s.readers.get(k, ())):
            return "a value between the matmuls is read after the chain"
    return chain


def _batch_map(rank: int, batch: int) -> list[int | None]:
    """Right-aligned batch dims of an operand with ``rank - 2`` batch dims, onto the
    ``batch`` leading coordinates of the kernel (matmul broadcasts them)."""
    nb = rank - 2
    return [batch - nb + d for d in range(nb)]


def build(s: "Scheduler", chain: Chain) -> str:
    """Build the chain's kernel; '' on success, or why not (then nothing is changed
    that the usual scheduling cannot continue from)."""
    nodes = s.nodes
    first, last = nodes[chain.first], nodes[chain.last]
    out = first.outputs[0]
    shape = out.layout.shape
    batch = len(shape) - 2
    d_len = first.inputs[0].layout.shape[-1]
    ndim = len(shape)
    v_in = last.inputs[1]
    e_len = v_in.layout.shape[-1]
    from ..codegen.chain import tile_bytes
    tile = tile_bytes(d_len, e_len)
    if tile > TILE_BYTES:
        return f"tiles of {tile} bytes for head dims {d_len}, {e_len}"
    g = Group(len(s.groups), shape[:-1], shape[-1:], shape, tuple(range(ndim)))
    # Claim the loads first: a failed build must leave no half-made group behind.
    a, b = first.inputs
    amap = _batch_map(len(a.layout.shape), batch) + [batch, ndim]  # (.., i, d)
    bmap = _batch_map(len(b.layout.shape), batch) + [ndim, ndim - 1]  # (.., d, j)
    vmap = _batch_map(len(v_in.layout.shape), batch) + [ndim - 1, ndim]  # (.., j, e)
    s.groups.append(g)
    s.open.append(g)
    ext_d = shape + (d_len,)  # the coordinates of a Dot: (.., i, j, dd)
    dot = ir.Dot(s.load_through(g, a, amap, ext_d, (chain.first, 0)), s.load_through(g, b, bmap, ext_d, (chain.first, 1)),
                 d_len, dt.float32)
    k_s = s.key(out.storage)
    g.values[k_s] = Value(dot, affine(Layout.contiguous(shape), range(ndim), ndim), False, shape,
                          tuple(range(ndim)))
    g.members.append(chain.first)
    s.producer[k_s] = g
    for n in chain.members:
        reason = s.can_fuse(g, nodes[n])
        if reason or not s.add(g, n, nodes[n]):
            return _abandon(s, g, f"{nodes[n].op.name}: {reason or 'no lowering'}")
    p = last.inputs[0]
    pv = g.values.get(s.key(p.storage))
    if pv is None or pv.row or affine(p.layout, range(ndim), ndim) != pv.index:
        return _abandon(s, g, "the second matmul reads the scores' row through a view")
    g.stages[:] = [replace(st, expr=in_float32(st.expr)) if isinstance(st, ir.Reduce) else st for st in g.stages]
    weight, post = _row_factors(in_float32(pv.expr), len(g.outer))
    repairs = _repairs(g.stages, weight, len(g.outer))
    if isinstance(repairs, str):
        return _abandon(s, g, repairs)
    stages, w_repair = repairs
    o = last.outputs[0]
    omap = list(range(batch + 1)) + [ndim]  # (.., i, e)
    v_load = s.load_through(g, v_in, vmap, shape + (e_len,), (chain.last, 1))  # (.., i, j, e)
    contract = ir.Contract(-1, affine(o.layout, omap, ndim + 1), weight, v_load, e_len, post, w_repair,
                           last.outputs[0].storage.dtype)
    g.stages[:] = stages
    g.contract = (s.key(o.storage), contract)
    g.members.append(chain.last)
    s.producer[s.key(o.storage)] = g
    s.materialized.add(s.key(o.storage))
    s.close(g)
    return ""


def _abandon(s: "Scheduler", g: "Group", reason: str) -> str:
    """Drop a half-built chain group (its loads were only reads; nothing was stored). The
    values it read through are read by its nodes again, which are now scheduled as usual."""
    for k, n in g.read_through:
        s.readers.setdefault(k, set()).add(n)
    if g in s.open:
        s.open.remove(g)
    for k, v in list(s.producer.items()):
        if v is g:
            del s.producer[k]
    g.members.clear()
    g.values.clear()
    return reason


def _row_factors(e: ir.Expr, n_outer: int) -> tuple[ir.Expr, ir.Expr]:
    """Split ``e`` into (element part, what to do to the row's sum): a division by, or a
    product with, a value constant along the row moves out of the sum."""
    c: ir.Expr = ir.Var("c", dt.float32)
    while isinstance(e, ir.Op) and e.name in ("div", "mul") and e.dtype is dt.float32:
        x, y = e.args
        if not ir.uses_inner(y, n_outer):
            c = ir.Op(e.name, (c, y), dt.float32)
            e = x
        elif e.name == "mul" and not ir.uses_inner(x, n_outer):
            c = ir.Op("mul", (c, x), dt.float32)
            e = y
        else:
            break
    return e, c


def _producers(e: ir.Expr) -> list[int]:
    return sorted({n.stage for n in ir.walk(e) if isinstance(n, ir.Acc)})


def _repairs(stages: list[ir.Stage], weight: ir.Expr, n_outer: int) -> tuple[list[ir.Stage], ir.Expr | None] | str:
    """Each reduction's (and the contraction's) repair term, as IR over ``Var``s."""
    out: list[ir.Stage] = []
    for st in stages:
        if not isinstance(st, ir.Reduce):
            return "the chain stores element values"
        if st.dtype is not dt.float32:
            return f"a {st.dtype.name} {st.op} inside the chain"
        h = _repair_term(st.expr, st.op, n_outer)
        if isinstance(h, str):
            return h
        out.append(replace(st, repair=h))
    h = _repair_term(weight, "sum", n_outer)
    if isinstance(h, str):
        return h
    return out, h


def _repair_term(e: ir.Expr, op: str, n_outer: int) -> ir.Expr | None | str:
    """``h(t, old, new)`` for a fold of ``e`` as IR over ``Var``s: ``t``, and ``os{p}`` /
    ``ns{p}`` for the old and new (running) values of each earlier reduction p. A part
    of ``e`` that is a function of the running values alone (logsumexp's
    ``where(isfinite(m), m, 0)``) is one producer for the derivation, evaluated at the
    old and at the new values."""
    if not _producers(e):
        return None
    phis: list[ir.Expr] = []

    def lift(x: ir.Expr) -> ir.Expr:
        if not any(isinstance(n, ir.Acc) for n in ir.walk(x)):
            return x
        if not ir.uses_inner(x, n_outer) and not any(isinstance(n, ir.Dot) for n in ir.walk(x)):
            if x not in phis:
                phis.append(x)
            return ir.Acc(-1 - phis.index(x), x.dtype)
        assert isinstance(x, ir.Op)
        return ir.Op(x.name, tuple(lift(a) for a in x.args), x.dtype, x.attrs)

    lifted = lift(e)
    r = repair.derive_ir(lifted, [-1 - i for i in range(len(phis))], op)
    if isinstance(r, str):
        return f"no repair term for {op}: {r}"
    f32 = dt.float32
    return r.apply(ir.Var("t", f32), [_at(phi, "os") for phi in phis], [_at(phi, "ns") for phi in phis])


def _at(e: ir.Expr, which: str) -> ir.Expr:
    """``e`` with every running value ``Acc(p)`` read as the variable ``{which}{p}``."""
    return ir.mapped(e, lambda n: ir.Var(f"{which}{n.stage}", n.dtype) if isinstance(n, ir.Acc) else n)



#: Rows at least this long fold dependent reductions in one rolling pass (below, the
#: row is in L1 and a second pass over it costs less than deriving the repair terms).
ROLL_MIN = 8192


def rolling(stages: list[ir.Stage], n_outer: int, inner: tuple[int, ...]) -> list[ir.Stage]:
    """Neptune's rolling update for an ordinary row kernel whose results are per row
    (logsumexp, cross-entropy's normaliser): reductions that read earlier ones get
    their repair terms, so the C renderer folds all of them in one pass over the row
    instead of one pass per level. Kernels that store element values (softmax) keep
    their passes: the store needs the final values anyway, and the last pass stashes
    what it computed for it. Unchanged when any repair cannot be derived."""
    reduces = [st for st in stages if isinstance(st, ir.Reduce)]
    dependent = [st for st in reduces if _producers(st.expr)]
    if not dependent or len(inner) != 1 or inner[0] < ROLL_MIN \
            or any(isinstance(st, (ir.Store, ir.Contract, ir.Scan)) for st in stages) \
            or any(st.dtype is not dt.float32 for st in reduces):
        return stages
    out: list[ir.Stage] = []
    for st in stages:
        if isinstance(st, ir.Reduce) and _producers(st.expr):
            h = _repair_term(st.expr, st.op, n_outer)
            if h is None or isinstance(h, str):
                return stages
            st = replace(st, repair=h)
        out.append(st)
    return out
