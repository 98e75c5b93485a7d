"""Triton for chain kernels (``schedule/chain.py``): attention written as user code, as
one FlashAttention-style kernel.

The same chain IR the C renderer reads (``codegen/chain.py``): rows ``outer`` (the
batch coordinates, then the query rows), the key axis ``j``, Reduce stages with their
repair terms, and a Contract (``sum_j weight_j * v[j, :]``). Here:

- one program per (block of ``BM`` query rows, batch element). The rows of a block are
  the last outer dim and the dims before it that the keys and values do not read
  (query heads sharing a KV head, GQA's ``repeat_kv`` after ``schedule/split.py``), so
  a decoding step's few rows of several heads fill one ``tl.dot``;
- the queries' tile is loaded once; keys and values are walked in tiles of ``BN``:
  the scores tile is ``tl.dot(q, k)`` (float32 accumulation; half inputs straight into
  the dot, float32 ones at IEEE precision: no silent TF32), each level of reductions is
  folded over the tile (``tl.max``/``tl.sum`` along the keys) and combined with its
  running value repaired by the chain's repair term (the online softmax's
  ``l * exp(m - m')``, derived, not written in), and the contraction's accumulator is
  repaired the same way before ``tl.dot(weights, v)`` is added to it. A running max is
  read as 0 while it is -inf (``c_reduce.safe``), as the C does;
- a score mask that is a band in the key coordinate (``triton_band.py``: causal, a
  sliding window, ``j < length``) gives the key loop's bounds per block of rows (tiles
  wholly masked are not visited when the fill is -inf and changes no fold) and the run
  of tiles computed without evaluating the mask; other masks are evaluated per tile;
- rows whose producers end non-finite (every key masked, an inf or nan score) are
  redone without repairs, one walk per level of reductions, so they give the
  reference's values (nan where it has nan), as the C does;
- split-K for decoding (one block of rows per batch element and too few programs to
  fill the GPU): the keys are cut into ``splits`` chunks done by separate programs,
  each storing its running values and accumulator into a scratch buffer; a second
  kernel (``combine``) folds the chunks in order, each repaired from its own running
  values to the final ones (as the C's split-K combine), then finishes as above.

What it does not render raises ``NotRendered`` (keys or values through a block table,
bounds checks, a reduction other than sum/max/min): the runtime then schedules that
flush without chain kernels (``runtime/cuda.py``), every step counted as usual.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from math import prod

from .. import dtypes as dt
from .. import ir
from .chain_rules import skip_rule, the_dot
from .loops import passes
from .triton import PRELUDE, TL, NotRendered, Renderer, Rendered, literal, stored, vtype
from .triton_band import FDIV, atoms, band_lines, fill_is_identity

#: query rows x keys per tile, warps and pipeline stages on a GPU, by head dim: the best of
#: ``bench/gpu_chain_tiles.py``'s candidates on an H100 (bench/RESULTS.md, fourteenth session;
#: ``BRAZE_TRITON_CHAIN="bm,bn,warps,stages"`` overrides them, to tune on a GPU)
GPU_TILE = {64: (128, 64, 4, 3), 128: (128, 128, 8, 3), 256: (64, 32, 8, 2)}
#: shared memory a program's tiles may take: what an H100 gives a block (227 KiB; Triton's
#: count for the 128 x 128 x 3-stage tiles of D = 128 is 224 KiB)
SHARED_BYTES = 227 * 1024
#: float32 inputs (IEEE dots, emulated: 128 x 128 tiles take minutes to compile and all
#: of an H100's shared memory)
FLOAT32_TILE = (64, 32, 4, 2)
#: under Triton's interpreter: small tiles, so that small tests cross tile and block edges
INTERPRET_TILE = (32, 32, 4, 1)
#: render for Triton's interpreter (tiles, bfloat16 dots)? None: as ``cuda_probe`` says the
#: cuda device runs (the GPU tests set False to compile what a GPU would run)
INTERPRETER: bool | None = None
#: split the keys when fewer programs than this would run (about two per SM of an H100)...
SPLIT_PROGRAMS = 264
#: ...giving each split at least this many key tiles
SPLIT_MIN_TILES = 2

CHAIN_PRELUDE = PRELUDE + FDIV + '''

@triton.jit
def _braze_maxnan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _braze_minnan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
'''

_FOLD = {"sum": "tl.sum({x}, axis=1)", "amax": "tl.reduce({x}, 1, _braze_maxnan)",
         "amin": "tl.reduce({x}, 1, _braze_minnan)"}
_COMBINE = {"sum": "{t} + {r}", "amax": "tl.where({r} > {t}, {r}, {t})", "amin": "tl.where({r} < {t}, {r}, {t})"}


@dataclass(frozen=True)
class ChainKernels:
    """A chain's kernels: ``main``, and with split keys ``combine`` (launched after it);
    ``scratch``: float32 elements of the buffer both take as their last argument (0:
    none, no combine)."""

    main: Rendered
    combine: Rendered | None
    scratch: int


def _interpreting() -> bool:
    from ..runtime.cuda_probe import interpreting
    return interpreting() if INTERPRETER is None else INTERPRETER


def _dot_native(d: dt.DType) -> bool:
    """Does ``d`` go into ``tl.dot`` as it is? Half types do, except bfloat16 under
    Triton's interpreter, whose dot multiplies a bfloat16 tile's uint16 bits as numbers
    (``create_dot``, Triton 3.9): there it is converted to float32 first (the GPU's
    numerics, weights rounded to bfloat16 included, are kept)."""
    return d.is_half and not (d is dt.bfloat16 and _interpreting())


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))


def _asked_tile() -> tuple[int, ...]:
    """The tile ``BRAZE_TRITON_CHAIN`` asks for (rows, keys, warps, stages), or ()."""
    env = os.environ.get("BRAZE_TRITON_CHAIN", "").strip()
    return tuple(int(x) for x in env.split(",")) if env else ()


def _tile(rows: int, d: int, native: bool) -> tuple[int, int, int, int]:
    """(rows, keys, warps, stages) of a program's tiles; ``native``: half inputs go
    straight into the dots (float32 ones at IEEE precision are many FMAs: small tiles)."""
    asked = _asked_tile()
    if asked:
        bm, bn, warps, stages = asked
    elif _interpreting():
        bm, bn, warps, stages = INTERPRET_TILE
    elif not native:
        bm, bn, warps, stages = FLOAT32_TILE
    else:
        bm, bn, warps, stages = GPU_TILE[min((h for h in GPU_TILE if h >= d), default=256)]
    if rows < bm:  # decoding: a block as small as the dot allows
        bm = _pow2(rows)
        warps = 4 if bm <= 64 else warps
    return bm, bn, warps, stages


def _fit(bn: int, stages: int, fixed: int, per_key: int) -> tuple[int, int]:
    """(keys, stages) of a tile whose shared memory fits ``SHARED_BYTES``: ``fixed``
    bytes held once (the queries), ``per_key`` bytes per key of each pipelined stage
    (a key's row, a value's row, the row-by-key tiles of masks); fewer keys first, down
    to 32, then fewer stages. A tile that does not fit fails at launch on a GPU
    (Triton's OutOfResources), so the estimate errs high: Triton buffers some loads
    in fewer stages than ``stages``."""
    while fixed + stages * bn * per_key > SHARED_BYTES:
        if bn > 32:
            bn //= 2
        elif stages > 1:
            stages -= 1
        else:  # left to Triton: the estimate errs high (a float32 D = 400 tile's 256 KiB are 192)
            break
    return bn, stages


def _safe(op: str, name: str) -> str:
    """A running max/min as repair terms and element values read it: 0 while infinite."""
    if op in ("amax", "amin"):
        return f"tl.where({name} == {'-' if op == 'amax' else ''}float('inf'), 0.0, {name})"
    return name


class _Tile(Renderer):
    """Expressions over a tile (rows x keys) or a block's rows; loads read whole tiles,
    masked where they read keys past the row's end (``key_mask``)."""

    def __init__(self, coords: list[str], n_outer: int, prefix: str, acc: str, key_mask: str | None = None) -> None:
        super().__init__(coords, n_outer, None, prefix, acc)
        self.key_mask = key_mask

    def load(self, e: ir.Load) -> str:
        return f"{load(e, self.coords, self.n_outer, self.key_mask)}.to({vtype(e.dtype)})"

    def checked(self, e: ir.Op, args: list[str]) -> str:
        raise NotRendered("a bounds-checked gather inside a chain kernel")


def pointer(e: ir.Load, names: list[str], shape: str = "") -> str:
    """The pointers of load ``e`` with coordinate ``c`` spelled ``names[c]``; a whole
    tile of ``shape`` (a dim of size 1 may have no stride: the pointer is widened)."""
    if e.at:
        raise NotRendered("keys or values read through a block table (a gather inside a chain kernel)")
    ptr = f"a{e.arg} + " + Renderer(names, 0, None).index(e.index)
    return ptr + (f" + tl.zeros([{shape}], tl.int64)" if shape else "")


def load(e: ir.Load, names: list[str], j: int, key_mask: str | None, extra: tuple[str, ...] = (),
         shape: str = "", ptr: str = "") -> str:
    """``tl.load`` of ``e`` (at ``pointer(e, names, shape)`` unless ``ptr`` is given):
    masked where it reads coordinate ``j`` and ``key_mask`` is given, by its ``when``
    ranges, and by ``extra``."""
    ptr = ptr or pointer(e, names, shape)
    conds = list(extra)
    if key_mask is not None and (e.index.uses(j) or any(c == j for c, _, _ in e.when)):
        conds.append(key_mask)
    conds += [f"({names[c]} >= {lo}) & ({names[c]} < {hi})" for c, lo, hi in e.when]
    return f"tl.load({ptr}, mask={' & '.join(conds)}, other=0)" if conds else f"tl.load({ptr})"


class _Chain:
    """The analysis of one chain kernel and the Triton text of its kernels."""

    def __init__(self, k: ir.Kernel, name: str) -> None:
        if k.checks:
            raise NotRendered("a bounds-checked gather inside a chain kernel")
        if len(k.inner) != 1:
            raise NotRendered("a chain over more than one key dim")
        self.k, self.name = k, name
        self.no = no = len(k.outer)
        self.n = n = k.inner[0]
        self.dot = dot = the_dot(k)
        self.contract = c = next(s for s in k.stages if isinstance(s, ir.Contract))
        self.reduces = [i for i, s in enumerate(k.stages) if isinstance(s, ir.Reduce)]
        for i in self.reduces:
            st = k.stages[i]
            assert isinstance(st, ir.Reduce)
            if st.op not in _FOLD or st.dtype is not dt.float32:
                raise NotRendered(f"a {st.dtype.name} {st.op} inside a chain kernel")
        self.producers = sorted({a.stage for s in k.stages for x in ir.stage_exprs(s) for a in ir.walk(x)
                                 if isinstance(a, ir.Acc)})
        if dot.a.index.uses(no) or ir.uses_inner(c.post, no):
            raise NotRendered("a chain whose queries or epilogue move along the keys")
        nr = 1  # rows of a block: the last outer dim and the dims before it keys and values do not read
        while nr < no and not ir.load_uses(dot.b, no - 1 - nr) and not ir.load_uses(c.v, no - 1 - nr):
            nr += 1
        self.row_dims = list(range(no - nr, no))
        self.batch_dims = list(range(no - nr))
        if any(ir.load_uses(x, r) for x in (dot.b, c.v) for r in self.row_dims):
            raise NotRendered("keys or values that move with the query row")
        self.rows = prod(k.outer[no - nr:])
        self.n_batch = prod(k.outer[:no - nr])
        if self.n_batch > 65535:
            raise NotRendered(f"{self.n_batch} batch elements (a grid dim holds 65535)")
        self.d, self.e = dot.length, c.size
        self.bd, self.be = _pow2(self.d), _pow2(self.e)
        half_qk = dot.a.dtype is dot.b.dtype and _dot_native(dot.a.dtype)
        self.qk_precision = "" if half_qk else ', input_precision="ieee"'
        self.qk_cast = "" if half_qk else ".to(tl.float32)"
        # a half second matmul (not half values read through a cast to float32: c.dtype)
        self.v_half = c.dtype.is_half and _dot_native(c.v.dtype)
        #: weights rounded to the values' half type as they would be going into the dot
        self.w_round = f".to({TL[c.v.dtype.name]}).to(tl.float32)" if c.dtype.is_half and not self.v_half else ""
        self.bm, self.bn, self.warps, self.stages = _tile(self.rows, self.bd, half_qk and self.v_half)
        if not _interpreting() and not _asked_tile():  # (a tile asked for: as asked)
            self.bn, self.stages = _fit(self.bn, self.stages, self.bm * self.bd * dot.a.dtype.itemsize,
                                        self._bytes_per_key(k))
        self.blocks = -(-self.rows // self.bm)
        self.ntiles = -(-n // self.bn)
        self.tail = n % self.bn != 0
        # the mask as a band of keys: skipped tiles, and tiles computed without it
        self.skip = skip_rule(k, dot, no)
        self.guards: list[ir.Expr] = []  # what the band needs of the mask's values, checked when it runs
        self.atoms = atoms(self.skip.filled, no, self.guards) if self.skip is not None and self.skip.bias is None \
            else None
        self.skippable = self.atoms is not None and self.skip is not None and fill_is_identity(k, self.skip.score)
        programs = self.blocks * self.n_batch
        self.splits = 1
        if self.blocks == 1 and programs < SPLIT_PROGRAMS:
            self.splits = max(1, min(-(-SPLIT_PROGRAMS // programs), self.ntiles // SPLIT_MIN_TILES))
        self.chunk = -(-self.ntiles // self.splits)
        self.splits = -(-self.ntiles // self.chunk)
        self.part = self.bm * (2 * len(self.reduces) + self.be)  # one split's partial results
        self.names = iter(range(1 << 30))

    def _bytes_per_key(self, k: ir.Kernel) -> int:
        """Shared memory a stage takes per key: the key's and the value's rows, and per
        other load that moves along the keys, its elements of a block's rows (a mask of
        rows x keys) or one (a mask of keys)."""
        dot, c, no = self.dot, self.contract, self.no
        total = self.bd * dot.b.dtype.itemsize + self.be * c.v.dtype.itemsize
        seen = {dot.b, c.v}
        for x in (x for s in k.stages for e in ir.stage_exprs(s) for x in ir.walk(e)):
            # (coordinate no: the key; a load valid over a range of keys is masked per key too)
            if isinstance(x, ir.Load) and x not in seen and (ir.load_uses(x, no) or any(d == no for d, _, _ in x.when)):
                seen.add(x)
                by_row = any(ir.load_uses(x, r) for r in self.row_dims)
                total += (self.bm if by_row else 1) * x.dtype.itemsize
        return total

    # -- coordinates ----------------------------------------------------------------
    def coords(self, rows: str, j: str, last: str | None = None) -> list[str]:
        """Spellings of the coordinates: batch ones as scalars, row ones as ``rows``
        formats them (``o{}c``: ``[BM, 1]``), the key ``j``, and ``last`` (a Dot's head dim,
        a contraction's value dim)."""
        out = [f"o{c}" if c in self.batch_dims else rows.format(c) for c in range(self.no)] + [j]
        return out + ([last] if last is not None else [])

    def renderer(self, acc: str, rows: str = "o{}c", j: str = "jr", key_mask: str | None = None) -> _Tile:
        r = _Tile(self.coords(rows, j), self.no, f"t{next(self.names)}_", acc, key_mask)
        if rows == "o{}c":
            r.memo.update(self.hoisted)
        return r

    def repaired(self, h: ir.Expr | None, t: str, old: str, new: str) -> tuple[list[str], str]:
        """A partial fold ``t`` after its repair term ``h`` (its statements, its value),
        the producers' old and new running values spelled as ``old``/``new`` format them."""
        if h is None:
            return [], t
        r = self.renderer("")
        _bind(r, h, old, new, t)
        value = r.expr(h)
        return r.take(), value

    def header(self, with_part: bool, split_axis: bool) -> list[str]:
        k = self.k
        args = ", ".join([f"a{i}" for i in range(len(k.args))] + (["part"] if with_part else []))
        lines = ["", "", "@triton.jit",
                 f"def {{name}}({args}, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BE: tl.constexpr):",
                 "    pm = tl.program_id(0).to(tl.int64)", "    pb = tl.program_id(1).to(tl.int64)"]
        if split_axis:
            lines.append("    ps = tl.program_id(2).to(tl.int64)")
        rest = "pb"
        for c in reversed(self.batch_dims):
            lines.append(f"    o{c} = {rest} % {k.outer[c]}")
            lines.append(f"    q{c} = {rest} // {k.outer[c]}")
            rest = f"q{c}"
        lines += ["    r = pm * BM + tl.arange(0, BM).to(tl.int64)",
                  f"    rv = r < {self.rows}",
                  f"    rc = tl.minimum(r, {self.rows - 1})  # rows past the last compute the last's values, never stored"]
        rest = "rc"
        for c in reversed(self.row_dims):
            lines += [f"    o{c} = {rest} % {k.outer[c]}", f"    o{c}c = o{c}[:, None]", f"    p{c} = {rest} // {k.outer[c]}"]
            rest = f"p{c}"
        lines += ["    zero = tl.zeros([], tl.int64)", "    dq = tl.arange(0, BD).to(tl.int64)", "    de = tl.arange(0, BE).to(tl.int64)",
                  "    jb = tl.arange(0, BN).to(tl.int64)"]
        return lines

    def hoist(self) -> list[str]:
        """Values constant along the keys (a scale, a mask's fill, a per-row offset) once
        per program, before the key loop: the tile renderers start from them."""
        r = _Tile(self.coords("o{}c", "None"), self.no, "h_", "")

        def visit(e: ir.Expr) -> None:
            if isinstance(e, (ir.Op, ir.Load)) and not ir.uses_inner(e, self.no) \
                    and not any(isinstance(n, (ir.Dot, ir.Acc, ir.Var)) for n in ir.walk(e)):
                r.expr(e)
            elif isinstance(e, ir.Op):
                for a in e.args:
                    visit(a)
        for st in self.k.stages:
            if isinstance(st, ir.Reduce):
                visit(st.expr)
            elif isinstance(st, ir.Contract):
                visit(st.weight)
        self.hoisted = dict(r.memo)
        return ["    " + x for x in r.take()]

    def bases(self) -> list[str]:
        """The key and value tiles' pointers at the first tile, when their index is
        linear in the key: each tile's are these plus a scalar (``walked_ptr``), the
        addressing FlashAttention's loops advance."""
        out = []
        for x, name, names, shape in ((self.dot.b, "kbase", self.coords("0", "jb[None, :]", "dq[:, None]"), "BD, BN"),
                                      (self.contract.v, "vbase", self.coords("0", "jb[:, None]", "de[None, :]"), "BN, BE")):
            if self.walked_ptr(x, name):
                out.append(f"    {name} = {pointer(x, names, shape)}")
        return out

    def walked_ptr(self, x: ir.Load, base: str) -> str:
        """``base`` moved to tile ``j0``, or '' when ``x``'s index is not linear in the key."""
        if x.at or any(c == self.no for c, _, _, _ in x.index.divs):
            return ""
        return f"{base} + j0 * {x.index.coeffs[self.no]}"

    def load_q(self, ind: str) -> list[str]:
        names = self.coords("o{}c", "0", "dq[None, :]")
        extra = () if self.bd == self.d else (f"(dq[None, :] < {self.d})",)
        return [f"{ind}q = {load(self.dot.a, names, self.no, None, extra, 'BM, BD')}{self.qk_cast}"]

    def init(self, ind: str, only: list[int] | None = None, contract: bool = True) -> list[str]:
        out = []
        for i in self.reduces if only is None else only:
            st = self.k.stages[i]
            assert isinstance(st, ir.Reduce)
            out.append(f"{ind}acc{i} = tl.full([BM], {_init(st.op)}, tl.float32)")
            out.append(f"{ind}nan{i} = tl.zeros([BM], tl.int32)")
        if contract:
            out.append(f"{ind}o = tl.zeros([BM, BE], tl.float32)")
        return out

    # -- one walk over key tiles -------------------------------------------------------
    def walk(self, lo: str, hi: str, ind: str, rolling: bool, fast: bool, stage_ids: list[int],
             with_contract: bool) -> list[str]:
        """A loop over key tiles ``[lo, hi)`` folding ``stage_ids`` and the contraction:
        ``rolling``, each fold combined with its repaired running value (the main pass);
        otherwise (a redo) evaluated with the final values of earlier levels. ``fast``:
        the tiles have no masked element, so the score is its kept branch."""
        k, dot, c = self.k, self.dot, self.contract
        km = "km" if self.tail else None
        body = ["j0 = t * BN", "jj = j0 + jb", "jr = jj[None, :]"]
        if self.tail:
            body += [f"km = jr < {self.n}"]
        kn = self.coords("0", "jr", "dq[:, None]")
        kx = load(dot.b, kn, self.no, km, () if self.bd == self.d else (f"(dq[:, None] < {self.d})",), "BD, BN",
                  self.walked_ptr(dot.b, "kbase"))
        body += [f"kt = {kx}{self.qk_cast}", f"s = tl.dot(q, kt{self.qk_precision})"]
        r = self.renderer("nsc{}" if rolling else "fc{}", key_mask=km)
        r.memo[dot] = "s"
        if fast:
            assert self.skip is not None
            r.memo[self.skip.score] = r.expr(self.skip.kept)
        if rolling:
            body += [f"os{p} = {_safe(k.stages[p].op, f'acc{p}')}" for p in self.producers]  # type: ignore[union-attr]
        level_of = {i: lv for lv, ids in enumerate(passes(k)) for i in ids}
        for lv in sorted({level_of[i] for i in stage_ids}):
            for i in [i for i in stage_ids if level_of[i] == lv]:
                st = k.stages[i]
                assert isinstance(st, ir.Reduce)
                x = r.expr(st.expr)
                body += r.take()
                if not any(isinstance(n, ir.Dot) for n in ir.walk(st.expr)):
                    x = f"({x} + tl.zeros([BM, BN], tl.float32))"
                if self.tail:
                    x = f"tl.where(km, {x}, {literal(_IDENT[st.op], dt.float32)})"
                body.append(f"red{i} = " + _FOLD[st.op].format(x=x))
                if st.op != "sum":
                    body.append(f"nan{i} = nan{i} | (red{i} != red{i}).to(tl.int32)")
                stmts, t = self.repaired(st.repair if rolling else None, f"acc{i}", "os{}", "ns{}")
                body += stmts
                body.append(f"acc{i} = " + _COMBINE[st.op].format(t=t, r=f"red{i}"))
                if rolling and i in self.producers:
                    body += [f"ns{i} = {_safe(st.op, f'acc{i}')}", f"nsc{i} = ns{i}[:, None]"]
        if with_contract:
            w = r.expr(c.weight)
            body += r.take()
            if self.tail:
                w = f"tl.where(km, {w}, 0.0)"
            vn = self.coords("0", "jj[:, None]", "de[None, :]")
            vmask = () if self.be == self.e else (f"(de[None, :] < {self.e})",)
            vx = load(c.v, vn, self.no, "(jj[:, None] < %d)" % self.n if self.tail else None, vmask, "BN, BE",
                      self.walked_ptr(c.v, "vbase"))
            body.append(f"vt = {vx}")
            stmts, oc = self.repaired(c.repair if rolling else None, "o", "os{}[:, None]", "ns{}[:, None]")
            body += stmts
            if self.v_half:
                body.append(f"o = tl.dot(({w}).to(vt.dtype), vt, acc={oc})")
            else:
                body.append(f"o = tl.dot(({w}){self.w_round}, vt.to(tl.float32), acc={oc}, input_precision=\"ieee\")")
        # (int64 bounds for every walk: a loop's variables keep one type across the kernel)
        return [f"{ind}for t in range(({lo}) + zero, ({hi}) + zero):"] + [f"{ind}    {b}" for b in body]

    def main_loops(self, ind: str, split: bool) -> list[str]:
        """The rolling pass over this program's key tiles (its split's, with ``split``)."""
        out: list[str] = []
        nt = self.ntiles
        s0, s1 = ("0", str(nt)) if not split else ("s0", "s1")
        if split:
            out += [f"{ind}s0 = ps * {self.chunk}", f"{ind}s1 = tl.minimum(s0 + {self.chunk}, {nt})"]
        args = (ind, True)
        ids = self.reduces
        if self.atoms is None:
            return out + self.walk(s0, s1, *args, False, ids, True)
        r = self.renderer("", rows="o{}", j="None")

        lines = band_lines(self.atoms, r.expr, self.n, ind)
        out += [ind + x for x in r.take()] + lines

        def every_row(conds: list[str]) -> str:
            both = " & ".join(f"(({x}) != 0)" for x in conds)
            return f"tl.min(({both}).to(tl.int32) + tl.zeros([BM], tl.int32), axis=0) != 0"
        guards = [r.expr(g) for g in self.guards]
        out += [ind + x for x in r.take()]
        out.append(f"{ind}band_ok = {every_row(guards) if guards else 'tl.full([], 1, tl.int1)'}")
        bn = self.bn
        if self.skippable:
            assert self.skip is not None
            f = r.expr(self.skip.fill)
            out += [ind + x for x in r.take()]
            fill_inf = every_row([f"{f} == -float('inf')"])
            out += [f"{ind}fill_ok = band_ok & ({fill_inf})",
                    f"{ind}lo = tl.where(fill_ok, band_jl // {bn}, 0)",
                    f"{ind}hi = tl.maximum(tl.where(fill_ok, (band_jh + {bn - 1}) // {bn}, {nt}), lo)"]
        else:
            out += [f"{ind}lo = tl.zeros([], tl.int64)", f"{ind}hi = tl.full([], {nt}, tl.int64)"]
        # (no tile is known unmasked when the guards fail: every one is masked)
        out += [f"{ind}a = tl.where(band_ok, tl.minimum(tl.maximum((band_nl + {bn - 1}) // {bn}, lo), hi), lo)",
                f"{ind}b = tl.minimum(tl.maximum(tl.where(band_nh >= {self.n}, {nt}, band_nh // {bn}), a), hi)",
                f"{ind}b = tl.where(band_ok, b, lo)"]

        def clip(x: str, y: str) -> tuple[str, str]:
            return (f"tl.maximum({x}, {s0})", f"tl.minimum({y}, {s1})") if split else (x, y)
        out += self.walk(*clip("lo", "a"), *args, False, ids, True)
        out += self.walk(*clip("a", "b"), *args, True, ids, True)
        out += self.walk(*clip("b", "hi"), *args, False, ids, True)
        return out

    def finish(self, ind: str, have_q: bool) -> list[str]:
        """Redo the block's rows without repairs if a producer ended non-finite in any of
        them; then the epilogue: ``post(sum)`` per row, stored."""
        k, c = self.k, self.contract
        out = [f"{ind}bad = tl.zeros([BM], tl.int32)"]
        for p in self.producers:
            out.append(f"{ind}bad = bad | nan{p} | ((acc{p} - acc{p}) != 0).to(tl.int32)")  # nan or inf
        out.append(f"{ind}if tl.max(bad, axis=0) != 0:")
        inner = ind + "    "
        if not have_q:
            out += self.load_q(inner)
        out += self.init(inner)
        for level in passes(k):
            out += self.walk("0", str(self.ntiles), inner, False, False, level, False)
            for i in level:
                if k.stages[i].op != "sum":  # type: ignore[union-attr]
                    out.append(f"{inner}acc{i} = tl.where(nan{i} != 0, float('nan'), acc{i})")
                out.append(f"{inner}fc{i} = acc{i}[:, None]")
        out += self.walk("0", str(self.ntiles), inner, False, False, [], True)
        for i in self.reduces:
            if k.stages[i].op != "sum":  # type: ignore[union-attr]
                out.append(f"{ind}acc{i} = tl.where(nan{i} != 0, float('nan'), acc{i})")
        r = _Tile(self.coords("o{}c", "0"), self.no, "e_", "acc{}[:, None]")
        r.memo.update(self.hoisted)
        r.memo[ir.Var("c", c.post.dtype)] = "o"
        value = r.expr(c.post)
        out += [ind + x for x in r.take()]
        ptr = f"a{c.arg} + " + Renderer(self.coords("o{}c", "0", "de[None, :]"), 0, None).index(c.index) \
            + " + tl.zeros([BM, BE], tl.int64)"
        out.append(f"{ind}tl.store({ptr}, {stored(value, k.args[c.arg][0])}, "
                   f"mask=rv[:, None] & (de[None, :] < {self.e}))")
        return out

    # -- split keys: partial results and their combination -----------------------------
    def offsets(self) -> tuple[dict[int, int], dict[int, int], int]:
        """Within a split's partial results: each reduction's running values, its nan
        flags, and the contraction's accumulator rows."""
        bm = self.bm
        acc = {i: 2 * n * bm for n, i in enumerate(self.reduces)}
        nan = {i: (2 * n + 1) * bm for n, i in enumerate(self.reduces)}
        return acc, nan, 2 * len(self.reduces) * bm

    def save_part(self, ind: str) -> list[str]:
        acc, nan, oo = self.offsets()
        out = [f"{ind}pp = part + ((pb * {self.blocks} + pm) * {self.splits} + ps) * {self.part}",
               f"{ind}ri = tl.arange(0, BM)"]
        for i in self.reduces:
            out.append(f"{ind}tl.store(pp + {acc[i]} + ri, acc{i})")
            out.append(f"{ind}tl.store(pp + {nan[i]} + ri, nan{i}.to(tl.float32))")
        out.append(f"{ind}tl.store(pp + {oo} + ri[:, None] * BE + de[None, :], o)")
        return out

    def combine(self, ind: str) -> list[str]:
        """Fold the splits' partials in order, each repaired from its own running values
        to the final ones."""
        k, c = self.k, self.contract
        acc, nan, oo = self.offsets()
        out = self.init(ind)
        out += [f"{ind}pq = part + (pb * {self.blocks} + pm) * {self.splits * self.part}", f"{ind}ri = tl.arange(0, BM)"]

        def split_loop(body: list[str], h: ir.Expr | None, t: str, old: str, new: str) -> list[str]:
            """A loop over the splits: ``body`` reads one's partial ``t``, which is
            repaired by ``h`` from the split's own running values to the final ones."""
            names = sorted({v.name[2:] for v in ir.walk(h) if isinstance(v, ir.Var) and v.name[:2] == "os"}) \
                if h is not None else []
            head = [f"pp = pq + sp * {self.part}"]
            head += [f"os{p} = {_safe(k.stages[int(p)].op, f'tl.load(pp + {acc[int(p)]} + ri)')}"  # type: ignore[union-attr]
                     for p in names]
            stmts, value = self.repaired(h, t, old, new)
            lines = head + body[:-1] + stmts + [body[-1].format(t=value)]
            return [f"{ind}for sp in range({self.splits}):"] + [f"{ind}    {b}" for b in lines]
        for i in self.reduces:
            st = k.stages[i]
            assert isinstance(st, ir.Reduce)
            out += split_loop([f"pt = tl.load(pp + {acc[i]} + ri)",
                               f"nan{i} = nan{i} | (tl.load(pp + {nan[i]} + ri) != 0).to(tl.int32)",
                               f"acc{i} = " + _COMBINE[st.op].format(t="{t}", r=f"acc{i}")],
                              st.repair, "pt", "os{}", "ns{}")
            if i in self.producers:
                out.append(f"{ind}ns{i} = {_safe(st.op, f'acc{i}')}")
        return out + split_loop([f"po = tl.load(pp + {oo} + ri[:, None] * BE + de[None, :])", "o = o + {t}"],
                                c.repair, "po", "os{}[:, None]", "ns{}[:, None]")

    # -- the kernels ---------------------------------------------------------------------
    def meta(self) -> dict[str, int]:
        return {"BM": self.bm, "BN": self.bn, "BD": self.bd, "BE": self.be,
                "num_warps": self.warps, "num_stages": self.stages}

    def kernels(self) -> ChainKernels:
        split = self.splits > 1
        pre = self.hoist() + self.bases()
        main = self.header(split, split) + pre + self.load_q("    ") + self.init("    ") + self.main_loops("    ", split)
        main += self.save_part("    ") if split else self.finish("    ", True)
        grid = (self.blocks, self.n_batch) + ((self.splits,) if split else ())
        first = Rendered(_source(main, self.name), self.name, grid, self.meta())
        if not split:
            return ChainKernels(first, None, 0)
        name = f"{self.name}_combine"
        comb = self.header(True, False) + pre + self.combine("    ") + self.finish("    ", False)
        second = Rendered(_source(comb, name), name, (self.blocks, self.n_batch), self.meta())
        return ChainKernels(first, second, self.n_batch * self.blocks * self.splits * self.part)


_IDENT = {"sum": 0.0, "amax": float("-inf"), "amin": float("inf")}


def _init(op: str) -> str:
    return literal(_IDENT[op], dt.float32)


def _bind(r: Renderer, h: ir.Expr, old: str, new: str, t: str) -> None:
    """Spell a repair term's variables in ``r``: ``t``, and each producer's old and new
    running values as ``old``/``new`` format them."""
    for v in ir.walk(h):
        if isinstance(v, ir.Var):
            if v.name == "t":
                r.memo[v] = t
            elif v.name[:2] in ("os", "ns"):
                r.memo[v] = (old if v.name[:2] == "os" else new).format(v.name[2:])


def _source(lines: list[str], name: str) -> str:
    lines = [x.replace("{name}", name) if x.startswith("def ") else x for x in lines]
    return CHAIN_PRELUDE + "\n".join(lines) + "\n"


def chain_kernels(k: object, name: str) -> ChainKernels:
    """The Triton kernels of chain kernel ``k`` (``NotRendered`` naming what they lack)."""
    assert isinstance(k, ir.Kernel)
    return _Chain(k, name).kernels()


def is_chain(k: object) -> bool:
    return isinstance(k, ir.Kernel) and any(isinstance(s, ir.Contract) for s in k.stages)
