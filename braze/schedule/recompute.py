"""Values of the index alone, recomputed where they are read instead of stored.

``arange``, ``full``, and element-wise work on them and on tensors that exist before
the flush (``arange(kv)[None, :] <= arange(q)[:, None] + off``: a causal mask; ``slope *
(j - i)``: an ALiBi bias) cost a few integer operations per element to recompute, but a
buffer, a kernel and a read to store. The scheduler asks ``find`` which storages of a
flushed stream are such values; a consumer reading one through any view computes it at
the index it reads instead (``Scheduler.operand``), so a mask over (queries x keys)
never exists in memory.

A value is recomputable when nothing in the flush writes its storage in place, and its
node is ``arange``/``full``, or element-wise with every input recomputable or a storage that exists before the flush and that nothing in the
flush writes (a later write would change what a late recompute reads). Expressions
stay small (``MAX_OPS``): recomputing a long chain at every use would cost more than
the load it saves.
"""

from __future__ import annotations

from math import prod
from typing import Any, Callable, Sequence

from .. import dtypes as dt
from .. import ir
from ..layout import Layout
from ..ops.lowering import GATHERS, REDUCTIONS, SCANS, arange_value, shifted

Key = int
#: (storage, index, (node, input)) -> a load, or None where the reading group computes that storage itself
LoadAt = Callable[[Any, ir.Affine, tuple[int, int]], "ir.Load | None"]
#: (index, the reading group's coordinate extents, load_at) -> the value at that index
Recompute = Callable[[ir.Affine, Sequence[int], LoadAt], "ir.Expr | None"]
MAX_OPS = 24
_NOT_POINTWISE = REDUCTIONS | SCANS | GATHERS | {"cat", "pad"}


def dims_at(shape: Sequence[int], index: ir.Affine, extents: Sequence[int]) -> list[ir.Expr] | None:
    """The coordinates, per dim, of element ``index`` of a contiguous array of ``shape``,
    as int64 expressions of the group's coordinates (whose ranges are ``extents``);
    None when the index is not a view's. Each coefficient is a multiple of one dim's
    stride; a coordinate that runs past its dim's size walks the dims above it too (a
    reshape that merged them: ``(4, 8)`` read as ``(32,)``, ``repeat_kv``'s heads), and
    its coordinate on each of them is a floor division and a remainder."""
    strides = Layout.contiguous(tuple(shape)).strides
    starts, off = [], index.offset
    for n, st in zip(shape, strides):
        q, off = divmod(off, st) if n > 1 else (0, off)
        if q >= max(n, 1):
            return None
        starts.append(q)
    if index.divs:  # (already a merged view's) only a vector's single dim takes it whole
        if sum(n > 1 for n in shape) > 1 or not 0 <= index.offset < max(prod(shape), 1):
            return None
        return [_flat(index) if n > 1 else ir.Const(0, dt.int64) for n in shape]
    terms: list[list[tuple[int, int]]] = [[] for _ in shape]
    spans: list[tuple[int, int]] = []  # (coordinate, lowest dim) of the coordinates that walk several dims
    for c, coeff in enumerate(index.coeffs):
        if not coeff:
            continue
        dims = [d for d, (n, st) in enumerate(zip(shape, strides)) if n > 1 and coeff % st == 0 and coeff < st * n]
        if not dims:
            return None
        d = max(dims, key=lambda d: strides[d])
        m = coeff // strides[d]
        if starts[d] + m * (extents[c] - 1) < shape[d]:
            terms[d].append((c, m))
        elif m == 1:
            spans.append((c, d))
        else:
            return None
    out: list[ir.Expr] = []
    for start, ts in zip(starts, terms):
        e: ir.Expr | None = ir.Const(start, dt.int64) if start or not ts else None
        for c, m in ts:
            x: ir.Expr = ir.Coord(c, dt.int64)
            if m != 1:
                x = ir.Op("mul", (ir.Const(m, dt.int64), x), dt.int64)
            e = x if e is None else ir.Op("add", (e, x), dt.int64)
        assert e is not None
        out.append(e)
    for c, d in spans:
        # the flat position along dims hi..d (in units of dim d's stride), from this
        # coordinate and the dims' starts; no other coordinate may move those dims
        hi, span = d, shape[d]
        flat = starts[d]
        while flat + extents[c] - 1 >= span:
            hi -= 1
            if hi < 0:
                return None
            flat += starts[hi] * span
            span *= shape[hi]
        # other coordinates may move the top dim only (a batch of block tables' rows:
        # block b * nb + j // bs), if the sum stays inside it
        top = terms[hi]
        if any(terms[j] for j in range(hi + 1, d + 1)) or any(o != c and hi <= e <= d for o, e in spans) \
                or top and (flat + extents[c] - 1) // (span // shape[hi]) + sum(m * (extents[o] - 1) for o, m in top) \
                >= shape[hi]:
            return None
        unit = 1
        for j in range(d, hi - 1, -1):
            x = ir.Op("add", (ir.Coord(c, dt.int64), ir.Const(flat, dt.int64)), dt.int64) if flat else ir.Coord(c, dt.int64)
            if unit != 1:
                x = ir.Op("floor_divide", (x, ir.Const(unit, dt.int64)), dt.int64)
            if j != hi:
                x = ir.Op("remainder", (x, ir.Const(shape[j], dt.int64)), dt.int64)
            out[j] = x
            unit *= shape[j]
        for o, m in top:
            y: ir.Expr = ir.Coord(o, dt.int64) if m == 1 else ir.Op("mul", (ir.Const(m, dt.int64), ir.Coord(o, dt.int64)), dt.int64)
            out[hi] = ir.Op("add", (y, out[hi]), dt.int64)
    return out


def _flat(index: ir.Affine) -> ir.Expr:
    """An index as an int64 expression of the coordinates (divisions included)."""
    i64 = dt.int64
    e: ir.Expr = ir.Const(index.offset, i64)
    for c, m in enumerate(index.coeffs):
        if m:
            e = ir.Op("add", (e, ir.Op("mul", (ir.Const(m, i64), ir.Coord(c, i64)), i64)), i64)
    for c, add, d, m in index.divs:
        x: ir.Expr = ir.Op("add", (ir.Coord(c, i64), ir.Const(add, i64)), i64) if add else ir.Coord(c, i64)
        q = ir.Op("floor_divide", (x, ir.Const(d, i64)), i64)
        e = ir.Op("add", (e, ir.Op("mul", (ir.Const(m, i64), q), i64)), i64)
    return e


def _compose(layout: Layout, dims: list[ir.Expr], ndim: int) -> ir.Affine | None:
    """The flat index an operand layout reads at the node-output coordinates ``dims``."""
    offset, coeffs = layout.offset, [0] * ndim
    divs: dict[tuple[int, int, int], int] = {}
    for stride, size, e in zip(layout.strides, layout.shape, dims):
        if size == 1 or stride == 0:
            continue
        lin = _linear(e)
        if lin is None:
            return None
        k0, cs, ds = lin
        offset += stride * k0
        for c, m in cs.items():
            coeffs[c] += stride * m
        for key, m in ds.items():
            divs[key] = divs.get(key, 0) + stride * m
    return ir.Affine(offset, tuple(coeffs), tuple((c, add, d, m) for (c, add, d), m in divs.items() if m))


Linear = tuple[int, dict[int, int], dict[tuple[int, int, int], int]]  # constant, coord -> m, (coord, add, div) -> m


def _linear(e: ir.Expr) -> Linear | None:
    """``e`` (built by ``dims_at``) as constant + sum m * coord + sum m * ((coord + add) // div),
    a remainder spelled as ``x % n = x - n * (x // n)``."""
    if isinstance(e, ir.Const):
        return int(e.value), {}, {}
    if isinstance(e, ir.Coord):
        return 0, {e.dim: 1}, {}
    if isinstance(e, ir.Op) and e.name == "mul" and isinstance(e.args[0], ir.Const):
        x = _linear(e.args[1])
        if x is None:
            return None
        m = int(e.args[0].value)
        return m * x[0], {c: m * v for c, v in x[1].items()}, {k: m * v for k, v in x[2].items()}
    if isinstance(e, ir.Op) and e.name == "add":
        a, b = _linear(e.args[0]), _linear(e.args[1])
        if a is None or b is None:
            return None
        return a[0] + b[0], _sum(a[1], b[1]), _sum(a[2], b[2])
    if isinstance(e, ir.Op) and e.name in ("floor_divide", "remainder") and isinstance(e.args[1], ir.Const):
        sc, n = _shifted_coord(e.args[0]), int(e.args[1].value)
        if sc is None:
            return None
        c, add, div = sc
        if e.name == "floor_divide":
            return 0, {}, {(c, add, div * n): 1}
        # (x // div) % n = x // div - n * (x // (div * n)); x // 1 is x itself
        first: Linear = (add, {c: 1}, {}) if div == 1 else (0, {}, {(c, add, div): 1})
        return first[0], first[1], _sum(first[2], {(c, add, div * n): -n})
    return None


def _shifted_coord(e: ir.Expr) -> tuple[int, int, int] | None:
    """``(coord + add) // div`` as (coord, add, div), for ``e`` a coordinate, shifted, or divided."""
    if isinstance(e, ir.Coord):
        return e.dim, 0, 1
    if isinstance(e, ir.Op) and e.name == "add" and isinstance(e.args[0], ir.Coord) and isinstance(e.args[1], ir.Const):
        return e.args[0].dim, int(e.args[1].value), 1
    if isinstance(e, ir.Op) and e.name == "floor_divide" and isinstance(e.args[1], ir.Const):
        x = _shifted_coord(e.args[0])
        return None if x is None else (x[0], x[1], x[2] * int(e.args[1].value))
    return None


def _sum(a: dict[Any, int], b: dict[Any, int]) -> dict[Any, int]:
    out = dict(a)
    for k, m in b.items():
        out[k] = out.get(k, 0) + m
    return out


#: ops that cost tens of cycles an element (a load costs about one)
COSTLY_OPS = frozenset({"exp", "log", "sin", "cos", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "pow"})
#: in a flush whose largest value has at least this many elements, a costly value of at
#: most half as many (a rotary table's sin over (S, D/2) beside q over (B, H, S, D)) is
#: computed once and stored, not recomputed at every element that reads it broadcast
#: (GPT-J's tables over (1, 32, 2048, 64): 5.5x slower recomputed); in a smaller flush
#: the kernel a stored value needs costs more than recomputing it
COSTLY_READS = 1 << 16


def find(nodes: Sequence[Any], key: Callable[[Any], Key]) -> dict[Key, Recompute]:
    """The recomputable storages of a flushed stream, each with how to recompute it."""
    written = {key(o.storage) for n in nodes if n.op.inplace for o in n.outputs}
    biggest = max((o.layout.numel for n in nodes for o in n.outputs), default=0)
    out: dict[Key, Recompute] = {}
    size: dict[Key, int] = {}
    for n, node in enumerate(nodes):
        if node.op.inplace or len(node.outputs) != 1:
            continue
        o = node.outputs[0]
        k = key(o.storage)
        if k in written:  # recomputed after the write, it would not see the write
            continue
        shape, dtype = o.layout.shape, o.storage.dtype
        if node.op.name == "full":
            out[k], size[k] = _full(node.attrs["value"], dtype), 1
        elif node.op.name == "arange":
            out[k], size[k] = _arange(node.attrs, dtype), 3
        elif node.op.name == "index_select" and node.inputs[0].layout.shape \
                and key(node.inputs[0].storage) not in written and not node.inputs[0].storage.dtype.is_block \
                and (key(node.inputs[1].storage) in out or _unwritten(node.inputs[1], written, key)):
            # rows of a table at ids made in the flush (an arange of positions, zeros of
            # token types) or given: read through where they are read, as a copy is (the
            # table may be made in the flush: ``v[:, [-1]]`` of topk's values)
            ix = key(node.inputs[1].storage)
            out[k], size[k] = _gathered(n, node, shape, out.get(ix)), 2 + size.get(ix, 0)
        elif node.op.name == "cat" and all(key(i.storage) in out or key(i.storage) not in written
                                           and i.storage.array is not None for i in node.inputs):
            ins = [key(i.storage) for i in node.inputs]
            n_ops = 1 + max(size.get(i, 0) for i in ins)  # each element is one piece's
            if n_ops <= MAX_OPS:
                out[k], size[k] = _cat(n, node, shape, [out.get(i) for i in ins]), n_ops
        elif node.op.lower is not None and node.op.name not in _NOT_POINTWISE and node.inputs:
            ins = [key(i.storage) for i in node.inputs]
            # A copy costs one load wherever it is read, so it is read through even when its
            # input is made in the flush (repeat_kv's keys): the view, not a buffer.
            if not all(i in out or (i not in written and (s.storage.array is not None or node.op.name == "copy"))
                       for i, s in zip(ins, node.inputs)):
                continue
            n_ops = 1 + sum(size.get(i, 0) for i in ins)
            if n_ops > MAX_OPS or node.op.name in COSTLY_OPS and biggest >= COSTLY_READS \
                    and 2 * o.layout.numel <= biggest:
                continue
            out[k], size[k] = _pointwise(n, node, shape, dtype, [out.get(i) for i in ins]), n_ops
    return out


def _unwritten(o: Any, written: set[Key], key: Callable[[Any], Key]) -> bool:
    """Does operand ``o`` exist before the flush, and nothing in it write it in place?"""
    return o.storage.array is not None and key(o.storage) not in written and not o.storage.dtype.is_block


def _full(value: Any, dtype: dt.DType) -> Recompute:
    return lambda index, extents, load_at: ir.Const(value, dtype)


def _arange(attrs: dict[str, Any], dtype: dt.DType) -> Recompute:
    def value(index: ir.Affine, extents: Sequence[int], load_at: LoadAt) -> ir.Expr | None:
        dims = dims_at((attrs["shape"][0],), index, extents)
        return None if dims is None else arange_value(attrs, dtype, dims[0])
    return value


def _pointwise(n: int, node: Any, shape: tuple[int, ...], dtype: dt.DType, inputs: list[Recompute | None]) -> Recompute:
    def value(index: ir.Affine, extents: Sequence[int], load_at: LoadAt) -> ir.Expr | None:
        dims = dims_at(shape, index, extents) if prod(shape) else None
        if dims is None:
            return None
        args: list[ir.Expr] = []
        for j, (o, rec) in enumerate(zip(node.inputs, inputs)):
            at = _compose(o.layout, dims, len(index.coeffs))
            if at is None:
                return None
            arg = rec(at, extents, load_at) if rec is not None else load_at(o.storage, at, (n, j))
            if arg is None:
                return None
            args.append(arg)
        res = node.op.lower(args, {**node.attrs, "coords": tuple(range(len(shape))), "at": dims, "in_shapes": []}, dtype)
        return res if isinstance(res, (ir.Load, ir.Const, ir.Coord, ir.Op)) else None
    return value


def _cat(n: int, node: Any, shape: tuple[int, ...], inputs: list[Recompute | None]) -> Recompute:
    """A cat of recomputable values (``cat((freqs, freqs))`` of rotary tables, a mask
    hstacked to zeros): where the reader's coordinate ``c`` is position ``k0 + c`` along
    the cat's dim, input k is computed over its own range of ``c`` and shifted to where
    it lies, each of its loads guarded to that range, and the pieces picked by ``c``."""
    d = node.attrs["dim"]

    def value(index: ir.Affine, extents: Sequence[int], load_at: LoadAt) -> ir.Expr | None:
        dims = dims_at(shape, index, extents) if prod(shape) else None
        lin = None if dims is None else _linear(dims[d])
        if dims is None or lin is None or lin[2] or len(lin[1]) != 1 or 1 not in lin[1].values():
            return None  # (a cat read at a fixed position, or strided along its dim: not this way)
        (c, _), k0 = next(iter(lin[1].items())), lin[0]
        if any(isinstance(x, ir.Coord) and x.dim == c for j, e in enumerate(dims) if j != d for x in ir.walk(e)):
            return None
        pieces: list[tuple[int, ir.Expr]] = []
        start = 0
        for j, (o, rec) in enumerate(zip(node.inputs, inputs)):
            size, shift = o.layout.shape[d], start - k0
            start += size
            if not size or shift >= extents[c] or shift + size <= 0:
                continue  # empty, or outside the range the reader reads
            at = _compose(o.layout, dims[:d] + [ir.Coord(c, dt.int64)] + dims[d + 1:], len(index.coeffs))
            own = [*extents[:c], size, *extents[c + 1:]]
            arg = None if at is None else rec(at, own, load_at) if rec is not None else load_at(o.storage, at, (n, j))
            if arg is None:
                return None
            pieces.append((shift + size, shifted(arg, {c: shift}, ((c, shift, shift + size),))))
        if not pieces:
            return None
        out = pieces[-1][1]
        for hi, e in reversed(pieces[:-1]):
            lt = ir.Op("lt", (ir.Coord(c, dt.int64), ir.Const(hi, dt.int64)), dt.bool_)
            out = ir.Op("where", (lt, e, out), out.dtype)
        return out
    return value


def gathers(nodes: Sequence[Any], key: Callable[[Any], Key]) -> dict[Key, Recompute]:
    """The values of a flushed stream that a chain's matmul can read where they lie
    (``Scheduler.load_through``), though the flush writes what they read (before they
    are read, never between): ``index_select`` rows of a tensor at indices that exist
    before the flush (keys and values through a block table), and a half-type tensor
    (or such rows) cast exactly to float32 (a float16 KV cache, the step's keys just
    written into it). Element-wise consumers fuse a gather by its own lowering
    instead (``ops/lowering.py``)."""
    writes: dict[Key, list[int]] = {}  # storage -> the nodes that write it in place
    last_read: dict[Key, int] = {}
    for n, node in enumerate(nodes):
        for o in node.inputs:
            last_read[key(o.storage)] = n
        if node.op.inplace:
            for o in node.outputs:
                writes.setdefault(key(o.storage), []).append(n)

    def read_in_place(n: int, sources: Sequence[Any], result: Any) -> bool:
        """Do ``sources`` exist before the flush, unwritten from node ``n`` to the last
        reader of ``result`` (which nothing writes)? Then ``result`` may be read late."""
        if any(x.storage.array is None or x.storage.dtype.is_block for x in sources) or key(result) in writes:
            return False
        end = last_read.get(key(result), n)
        return not any(n < w <= end for x in sources for w in writes.get(key(x.storage), ()))

    out: dict[Key, Recompute] = {}
    gathered: dict[Key, int] = {}  # a read-through gather's result -> its node
    for n, node in enumerate(nodes):
        o = node.outputs[0].storage if node.outputs else None
        if node.op.name == "index_select" and node.inputs[0].layout.shape and read_in_place(n, node.inputs, o):
            out[key(o)] = _gathered(n, node, node.outputs[0].layout.shape)
            gathered[key(o)] = n
        elif node.op.name == "cast" and _widens(node):
            # half keys and values cast to float32 for the matmul: read as they lie, every
            # load converting, so a float16 KV cache is read at half the bytes
            x = node.inputs[0]
            g = gathered.get(key(x.storage))
            if g is not None and read_in_place(g, nodes[g].inputs, o):  # (unwritten until the cast's last reader)
                out[key(o)] = _widened(node, out[key(x.storage)])
            elif g is None and read_in_place(n, [x], o):
                out[key(o)] = _widened(node, _loaded(n, x))
    return out


def _loaded(n: int, x: Any) -> Recompute:
    """Operand ``x`` of node ``n``, loaded at the index it is read at."""
    def value(index: ir.Affine, extents: Sequence[int], load_at: LoadAt) -> ir.Expr | None:
        return load_at(x.storage, index, (n, 0))
    return value


def _widens(node: Any) -> bool:
    """Is cast ``node`` exact, float16 or bfloat16 to float32 (so its value is its
    input's, loaded)?"""
    return node.inputs[0].storage.dtype in (dt.float16, dt.bfloat16) and node.outputs[0].storage.dtype is dt.float32


def _widened(node: Any, inner: Recompute) -> Recompute:
    """A widening cast read through: its input (a gather, or a tensor that exists
    before the flush) at the cast's input's view of the reader's coordinates."""
    (x,), shape = node.inputs, node.outputs[0].layout.shape

    def value(index: ir.Affine, extents: Sequence[int], load_at: LoadAt) -> ir.Expr | None:
        dims = dims_at(shape, index, extents) if prod(shape) else None
        at = None if dims is None else _compose(x.layout, dims, len(index.coeffs))
        return None if at is None else inner(at, extents, load_at)
    return value


def _gathered(n: int, node: Any, shape: tuple[int, ...], ids: Recompute | None = None) -> Recompute:
    """An ``index_select`` read through: the source at the reader's coordinates, its
    dim ``d`` at the index's value there (``ir.Load.at``, checked as the gather's own
    lowering checks it). ``kp.view(blocks, bs, h, d)[table].reshape(b, nb * bs, h, d)``
    read at key ``j`` of batch ``b`` is pool block ``table[b, j // bs]``, row ``j % bs``:
    attention through a block table with no gathered copy of the keys. The index is
    loaded, or recomputed (``ids``: position ids from an arange)."""
    (x, ix), d = node.inputs, node.attrs["dim"]
    m = ix.layout.ndim

    def value(index: ir.Affine, extents: Sequence[int], load_at: LoadAt) -> ir.Expr | None:
        dims = dims_at(shape, index, extents) if prod(shape) else None
        if dims is None:
            return None
        ndim = len(index.coeffs)
        at = _compose(ix.layout, dims[d:d + m], ndim)
        xa = _compose(x.layout, dims[:d] + [ir.Const(0, dt.int64)] + dims[d + m:], ndim)
        if at is None or xa is None:
            return None
        i = load_at(ix.storage, at, (n, 1)) if ids is None else ids(at, extents, load_at)
        src = load_at(x.storage, xa, (n, 0))
        if i is None or src is None or src.at or src.when:
            return None
        i64 = i if i.dtype is dt.int64 else ir.Op("cast", (i,), dt.int64)
        sel = ir.checked(i64, x.layout.shape[d], n, "index_select", d)
        return ir.Load(src.arg, src.index, src.dtype, (), ((sel, x.layout.strides[d]),))
    return value
