"""C for chain kernels (``schedule/chain.py``): matmul, row work, matmul in one kernel.

The kernel runs over tasks = (batch coordinates) x (blocks of ``BQ`` rows), in parallel.
A task keeps, per row, the running value of every reduction and a vector accumulator
for the contraction, and walks the row axis in tiles of ``BK``:

1. pack the tile of ``B`` (the first matmul's right operand) and of ``V`` into
   contiguous scratch, and compute the scores tile ``S = A_rows @ B_tile`` with
   ``braze_mm`` (``tile.h``). Where the first level of reductions is only running
   maxima of the scores and the scores are the Dot times a row constant (``fused_max``),
   a tile with no mask fill (every tile when there is no mask) is computed by
   ``braze_mm_scaled_max`` instead: scaled (plus an additive mask read from memory) and
   max-folded per row while each GEMM block is in registers, so that level needs no
   loop over the tile; a tile whose scores are all a mask's fill is skipped
   (``skip_rule``);
2. for each row, fold each reduction over the tile, evaluated with the *new* values of
   the reductions before it, and combine it with the repaired old partial
   (``Reduce.repair``: ``h(t, old, new)``); then the contraction's weights, and the
   contraction accumulator row repaired the same way (``Contract.repair``);
3. accumulate ``weights @ V_tile`` into the contraction rows.

The loops of step 2 compute ``exp`` on a fast path that is exact where its result is a
normal float and redo a tile row with the full ``braze_expf`` when any argument was
outside that range (``Renderer.fast``); a repair is skipped when its producers did not
move in the tile.

A running max/min is replaced by 0 in the repair terms and element values while it is
still infinite (a masked prefix: ``exp(-inf - -inf)`` would be nan); ``h`` is an
identity for any value used consistently, so this changes nothing once it is finite.
A row whose producer reductions end non-finite (every score masked, an inf or a nan
score) is recomputed without repairs, one pass per level of reductions, so its result
is the reference's bit for bit in meaning (nan where the reference has nan).

The epilogue writes ``post(sum)`` for each row (softmax's division by the sum).
"""

from __future__ import annotations

from math import prod

from .. import dtypes as dt
from .. import ir
from . import c as _c
from .chain_rules import (HALF_MM, HALF_ROWS, batch_free, fused_max, paged_rows, row_stride, rows_in_place, score_node,
                          skip_rule, the_dot)
from .loops import passes
from .c_expr import Renderer, converted
from .c_reduce import OMP_REDUCTION, moved, reduce_init, reduce_update, repaired, repaired_when_moved, safe

BQ = 48  # rows per task (a multiple of the GEMM tile's 6): each packed B and V tile serves them all
BK = 96  # row-axis tile: scores, weights and packed tiles are BQ x BK / BK x D / BK x E
NARROW = 8  # at most this many rows per task: keys are read in place (``braze_mm_nt``)
#: Below this many FLOPs (the two matmuls) a chain kernel runs on one thread: a parallel
#: region costs ~20-25 us under braze's passive OpenMP wait policy (its workers sleep;
#: ``runtime/cpu.py``). Decoding, 4 rows per KV head, 2 KV heads, d = 64, C harness,
#: 1 -> 2 threads: N_kv = 1024 (2.1 MFLOP) 21.7 -> 29.6 us, 4096 (8.4 MFLOP) 85 -> 69 us,
#: 16384 426 -> 230 us; break-even near 2048 keys (4.2 MFLOP).
PARALLEL_FLOPS = 6_000_000
#: The same for a narrow (decoding) kernel, counted over the keys it attends (``live``,
#: below): it runs inside a step whose neighbours (the quantized matmuls) are parallel
#: regions, so the team is awake (spinning, ``runtime/cpu.py``) and a region costs a few
#: us. C harness, SmolLM2's shape (3 KV heads x 3 rows, d = 64), 2 threads, back to back:
#: 8 live keys 16 -> 13 us, 872 keys 53 -> 37 us against one thread.
PARALLEL_FLOPS_NARROW = 150_000


def tile_bytes(d: int, e: int) -> int:
    """Stack bytes of one task's tiles for head dims ``d`` (scores) and ``e`` (values)."""
    return 4 * (BQ * d + d * BK + 2 * BQ * BK + BK * e + BQ * e)


def _row_parts(r: Renderer, e: ir.Expr, t: ir.Var) -> list[str]:
    """Render the largest parts of ``e`` that do not read ``t`` into ``r``'s memo and
    return their statements, to emit outside the loop over ``t``'s elements."""
    def visit(x: ir.Expr) -> None:
        if t not in set(ir.walk(x)):
            if isinstance(x, ir.Op):
                r.expr(x)
        elif isinstance(x, ir.Op):
            for a in x.args:
                visit(a)
    visit(e)
    return r.take()


def chain_source(k: ir.Kernel, lines: list[str], hoisted: dict[ir.Expr, str]) -> str:
    n_outer = len(k.outer)
    n = k.inner[0]
    dot = the_dot(k)
    d = dot.length
    contract = next(s for s in k.stages if isinstance(s, ir.Contract))
    e = contract.size
    # Rows of one task: the last outer dim, and the dims before it that the key and
    # value tiles do not depend on (query heads sharing a KV head), so each packed tile
    # serves all of them.
    nr = 1
    while nr < n_outer and not ir.load_uses(dot.b, n_outer - 1 - nr) and not ir.load_uses(contract.v, n_outer - 1 - nr):
        nr += 1
    row_dims = list(range(n_outer - nr, n_outer))
    rows_per_batch = prod(k.outer[n_outer - nr:])
    n_batch = prod(k.outer[:n_outer - nr])
    reduces = [i for i, s in enumerate(k.stages) if isinstance(s, ir.Reduce)]
    producers = sorted({a.stage for s in k.stages for x in ir.stage_exprs(s) for a in ir.walk(x)
                        if isinstance(a, ir.Acc)})
    coords = [f"o{i}" for i in range(n_outer)] + ["i0"]
    dcoords = coords + ["dd"]
    blocks = -(-rows_per_batch // BQ)
    tasks = n_batch * blocks
    ntiles = -(-n // BK)
    skip = skip_rule(k, dot, n_outer)
    score = score_node(k, dot)
    fused = fused_max(k, dot, n_outer)
    n_part = BQ * (2 * len(reduces) + e)  # a split's partial results for one block
    ldv = rows_in_place(contract.v, n_outer)
    ldk = rows_in_place(dot.b, n_outer) if d % 8 == 0 else None
    k_at = f"a{dot.b.arg} + " + Renderer([f"o{i}" for i in range(n_outer)] + ["j0", "0"]).index(dot.b.index)
    # A task of few rows (decoding) takes its scores by dot products along the key rows
    # (braze_mm_nt): transposing a tile would cost as much as the GEMM it feeds. float32
    # rows contiguous along the head dim are read in place, half-type ones too (a few
    # rows at a time converted into L1: c_expr's braze_mm_nt_h / braze_mm_h, ``hk``,
    # ``hv``); keys strided along the head dim are converted tile by tile into
    # contiguous rows (``kt``) first.
    narrow = rows_per_batch <= NARROW and d % 8 == 0
    k_rows, k_ld = (k_at, ldk) if ldk is not None else ("kt", d)
    v_at = f"a{contract.v.arg} + " + Renderer([f"o{i}" for i in range(n_outer)] + ["j0", "0"]).index(contract.v.index)
    # keys and values through a block table, read in place block by block (narrow tasks)
    paged_b = paged_rows(dot.b, n_outer)
    paged_k = paged_b if narrow else None
    paged_v = paged_rows(contract.v, n_outer) if narrow else None
    # the suffix of the C that multiplies by half-type rows where they lie, for a narrow
    # task's keys and values that are such rows (contiguous, or a block's): 16 rows at a
    # time converted into L1. Converting the whole 96-row tiles first (48 KiB at d = 64),
    # or 96-row chunks, made a decoding step after 1024 positions 10-16% slower.
    hk = HALF_MM.get(dot.b.dtype) if narrow and (paged_k is not None or row_stride(dot.b, n_outer) is not None) else None
    hv = HALF_MM.get(contract.v.dtype) if narrow and (paged_v is not None or row_stride(contract.v, n_outer) is not None) else None
    if dot.b.dtype is not dt.float32:
        paged_b = None  # (pack_k's transposes read float32 rows)

    def half_ld(x: ir.Load) -> int | None:
        """The row stride of half-type rows contiguous along the head dim (converted a
        tile at a time, not element by element)."""
        return row_stride(x, n_outer) if x.dtype in HALF_ROWS else None

    names = iter(range(1 << 30))

    def R(acc: str = "acc{}[ii]") -> Renderer:
        """A renderer whose temporaries do not clash with any other's in the kernel."""
        return Renderer(coords, prefix=f"t{next(names)}_", acc=acc, n_outer=n_outer, hoisted=hoisted)

    def load(x: ir.Load) -> str:
        """An element of a key or value tile, ``i0`` and ``dd`` in scope (and the row's
        block offset, ``row_at``, for keys and values read through a block table)."""
        at = tuple((ir.Var(f"at{x.arg}_{j}", dt.int64), s) for j, (_, s) in enumerate(x.at))
        return Renderer(dcoords, hoisted=hoisted).load(ir.Load(x.arg, x.index, x.dtype, (), at))

    def row_at(x: ir.Load, ind: str = "    ") -> list[str]:
        """The data-dependent offsets of key or value row ``i0`` read through a block
        table (``Load.at``: the table entry, checked), once per row of the tile."""
        if not x.at:
            return []
        r = R()
        names = [r.expr(i) for i, _ in x.at]
        return [ind + t for t in r.take()] + [f"{ind}const int64_t at{x.arg}_{j} = {v};" for j, v in enumerate(names)]

    def row_coords(ind: str) -> list[str]:
        """The row coordinates of row ``ii`` of the block."""
        res = [f"{ind}const int64_t r_ = q0 + ii; (void)r_;"]
        rest = "r_"
        for i in reversed(row_dims):
            res.append(f"{ind}const int64_t o{i} = {rest} % {k.outer[i]};")
            rest = f"({rest} / {k.outer[i]})"
        return res

    def task_coords(ind: str, task: str) -> list[str]:
        """A task's first row, its number of rows and its batch coordinates."""
        res = [f"{ind}const int64_t q0 = ({task} % {blocks}) * {BQ};",
               f"{ind}const int64_t nq = {rows_per_batch} - q0 < {BQ} ? {rows_per_batch} - q0 : {BQ};"]
        rest = f"({task} / {blocks})"
        for i in range(n_outer - nr - 1, -1, -1):
            res.append(f"{ind}const int64_t o{i} = {rest} % {k.outer[i]};")
            rest = f"({rest} / {k.outer[i]})"
        return res

    def task_setup(ind: str, task: str) -> list[str]:
        res = task_coords(ind, task)
        res.append(f"{ind}float qt[{BQ} * {d}], st[{BQ} * {BK}], wt[{BQ} * {BK}], ot[{BQ} * {e}];")
        if not narrow or ldk is None and not hk:  # the key tile, packed here when no pre-pass packed them all
            res.append(f"{ind}float kt[{d} * {BK}];")
        if ldv is None and not hv:  # the value tile, unless values are read in place
            res.append(f"{ind}float vt[{BK} * {e}];")
        for i in reduces:
            res.append(f"{ind}float acc{i}[{BQ}]; int nan{i}[{BQ}];")
        res.append(f"{ind}for (int64_t ii = 0; ii < nq; ii++) {{")  # the rows of A, once per task
        res += row_coords(ind + "    ")
        res.append(f"{ind}    const int64_t i0 = 0; (void)i0;")
        res.append(f"{ind}    for (int64_t dd = 0; dd < {d}; dd++) qt[ii * {d} + dd] = {load(dot.a)};")
        res.append(f"{ind}}}")
        if skip is not None and skip.bias is not None:
            # the largest |a| for the additive mask's bound, as bits: nan is above inf,
            # and an integer max vectorises
            res.append(f"{ind}uint32_t abits = 0;")
            res.append(f"{ind}#pragma omp simd reduction(max:abits)")
            res.append(f"{ind}for (int64_t x = 0; x < nq * {d}; x++) {{ const uint32_t u = braze__f2u(qt[x]) & 0x7fffffffu; "
                       "abits = u > abits ? u : abits; }")
            res.append(f"{ind}const float amax = braze__u2f(abits); (void)amax;")
        return res

    def skip_check() -> list[str]:
        """``continue`` past a tile whose every score is the fill, if the fill adds
        nothing to any reduction (identity) or to the weights (0) for every row. With a
        fused max, ``fast`` says the tile has no fill at all (its scores are the kept
        branch): that needs every element, not just the first that is kept."""
        if skip is None:
            return [f"    const int fast = {int(fused is not None)};"]
        r = R()
        fill_when = r.expr(skip.filled)
        early = fused is None or skip.bias is not None  # only "every score is the fill" matters
        res = ["    int skip, fast;",
               f"    const int64_t mi = (task % {blocks}) * {ntiles} + j0 / {BK};",
               "    const int seen = tilememo ? __atomic_load_n(tilememo + mi, __ATOMIC_RELAXED) : 0;",
               f"    if (seen) {{ skip = seen == 1; fast = {int(fused is not None) if early else 'seen == 2'}; }}",
               "    else {"]
        if early:  # (an additive mask: every tile is fast)
            res += [f"    fast = {int(fused is not None)};",
                    "    skip = 1;",
                    "    for (int64_t ii = 0; ii < nq && skip; ii++) {"]
            res += row_coords("        ")
            res += ["        int filled = 0;",
                    "        #pragma omp simd reduction(+:filled)",
                    "        for (int64_t jj = 0; jj < nk; jj++) {",
                    "            const int64_t i0 = j0 + jj;"]
            res += ["            " + t for t in r.take()]
            res += [f"            filled += {fill_when};", "        }", "        skip = filled == nk;", "    }"]
        else:
            res += count_filled("    ")
            res += ["    fast = filled == 0;",
                    "    skip = filled == nq * nk;"]
        res += ["    if (tilememo) __atomic_store_n(tilememo + mi, skip ? 1 : fast ? 2 : 3, __ATOMIC_RELAXED);",
                "    }"]
        if skip.bias is not None:
            # -inf + dot * f is -inf only for a finite dot * f: |dot| <= d max|a| max|b|
            # bounds it (Dot's rows in qt; a nan anywhere keeps the bound from holding).
            res += ["    if (skip) {",
                    "        uint32_t bbits = 0;",
                    "        for (int64_t jj = 0; jj < nk; jj++) {",
                    "            const int64_t i0 = j0 + jj;", *row_at(dot.b, "            "),
                    "            #pragma omp simd reduction(max:bbits)",
                    f"            for (int64_t dd = 0; dd < {d}; dd++) {{",
                    f"                const uint32_t u = braze__f2u({load(dot.b)}) & 0x7fffffffu;",
                    "                bbits = u > bbits ? u : bbits;",
                    "            }",
                    "        }",
                    "        const float bmax = braze__u2f(bbits);",
                    "        for (int64_t ii = 0; ii < nq && skip; ii++) {"]
            f = "1.0f"
            rf = R()
            if skip.factor is not None:
                res += row_coords("            ")
                res.append("            const int64_t i0 = j0; (void)i0;")
                f = rf.expr(skip.factor)
                res += ["            " + t for t in rf.take()]
            res += [f"            if (!((double){d} * amax * bmax * fabs((double){f}) < 1e38)) skip = 0;",
                    "        }",
                    "    }"]
        res += ["    for (int64_t ii = 0; ii < nq && skip; ii++) {"]
        res += row_coords("        ")
        res.append("        const int64_t i0 = j0; (void)i0;")
        for p in producers:
            res.append(f"        const float os{p} = {safe(k.stages[p].op, f'acc{p}[ii]')};")  # type: ignore[union-attr]
        rr = R("os{}")
        rr.memo[skip.score] = rr.expr(skip.fill)
        checks = []
        for i in reduces:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            v = rr.expr(s.expr)
            checks.append(f"{v} != {reduce_init(s.op, s.dtype)}")
        checks.append(f"{rr.expr(contract.weight)} != 0.0f")
        res += ["        " + t for t in rr.take()]
        res.append(f"        if ({' || '.join(checks)}) skip = 0;")
        res += ["    }"]
        if dot.b.at or contract.v.at:
            # a skipped tile's rows through a block table are still checked (as the
            # reference checks every entry), their keys and values not read
            res += ["    if (skip) for (int64_t jj = 0; jj < nk; jj++) {", "        const int64_t i0 = j0 + jj;",
                    *row_at(dot.b, "        "), *row_at(contract.v, "        "),
                    *(f"        (void)at{x.arg}_{j};" for x in (dot.b, contract.v) for j in range(len(x.at))), "    }"]
        res += ["    if (skip) continue;"]
        return res

    def live_keys() -> list[str]:
        """``live``: the end of the last key tile that is not all a mask's fill (a
        decoding step against a preallocated cache: its position, rounded up to a
        tile), over the tasks (the first alone when the mask reads no batch
        coordinate); the keys' length without a mask. The thread count and the splits
        are chosen by it; every tile is still walked (and skipped) as before."""
        if skip is None:
            return [f"    const int64_t live = {n};"]
        scan = 1 if batch_free(skip.filled, n_outer - nr) else tasks
        res = ["    int64_t live = 0;", f"    for (int64_t task = 0; task < {scan}; task++) {{"]
        res += task_coords("        ", "task")
        res += [f"        for (int64_t j0 = {(ntiles - 1) * BK}; j0 >= live; j0 -= {BK}) {{",
                f"            const int64_t nk = {n} - j0 < {BK} ? {n} - j0 : {BK};"]
        res += count_filled("            ")
        res += ["            if (filled != nq * nk) { live = j0 + nk; break; }", "        }", "    }"]
        return res

    def count_filled(ind: str) -> list[str]:
        """``filled``: how many scores of tile ``j0`` (``nk`` keys, ``nq`` rows) are the
        mask's fill."""
        assert skip is not None
        r = R()
        fill_when = r.expr(skip.filled)
        res = [f"{ind}int filled = 0;", f"{ind}for (int64_t ii = 0; ii < nq; ii++) {{"]
        res += row_coords(ind + "    ")
        res += [f"{ind}    #pragma omp simd reduction(+:filled)", f"{ind}    for (int64_t jj = 0; jj < nk; jj++) {{",
                f"{ind}        const int64_t i0 = j0 + jj;"]
        res += [f"{ind}        " + t for t in r.take()]
        return res + [f"{ind}        filled += {fill_when};", f"{ind}    }}", f"{ind}}}"]

    def scale_rows(ind: str) -> list[str]:
        """``sc[ii]``: the factor ``braze_mm_scaled_max`` multiplies row ``ii`` by."""
        f, divides, _ = fused if fused is not None else (None, False, None)
        if f is None:
            return []
        r = R()
        v = r.expr(f)
        res = [f"{ind}float sc[{BQ}];", f"{ind}for (int64_t ii = 0; ii < nq; ii++) {{"]
        res += row_coords(ind + "    ")
        res.append(f"{ind}    const int64_t i0 = 0; (void)i0;")
        res += [ind + "    " + t for t in r.take()]
        res.append(f"{ind}    sc[ii] = {f'1.0f / {v}' if divides else v};")
        res.append(f"{ind}}}")
        return res


    def blockwise(x: ir.Load, rows: tuple[int, int], width: int, call: str) -> list[str]:
        """``call`` (its rows at ``xp``, ``len`` of them from tile row ``jb``) for each
        run of the tile's rows within one block of a block table. Each run's place is
        looked up (and checked) one run early, and its rows (``width`` elements each)
        prefetched while the run before is read: a block's rows, a fraction of each of
        its lines' worth, came from DRAM one miss after another (1.6x slower over a
        cache of 47 MB, bench/RESULTS.md, twenty-first session)."""
        ld, bs = rows
        at = Renderer([f"o{i}" for i in range(n_outer)] + ["i0", "0"]).index(x.index)
        ctype = "uint16_t" if x.dtype in HALF_ROWS else "float"
        size = 2 if x.dtype in HALF_ROWS else 4
        where = f"a{x.arg} + {at} + at{x.arg}_0 * {x.at[0][1]}"
        return ["    {", "    const " + ctype + " *xp;", "    { const int64_t i0 = j0;", *row_at(x, "      "),
                f"      xp = {where}; }}", "    for (int64_t jb = 0; jb < nk;) {",
                f"        const int64_t len = {bs} - (j0 + jb) % {bs} < nk - jb ? {bs} - (j0 + jb) % {bs} : nk - jb;",
                f"        const {ctype} *xn = xp;",
                "        if (jb + len < nk) {", "            const int64_t i0 = j0 + jb + len;", *row_at(x, "            "),
                f"            xn = {where};",
                f"            braze_pf_rows(xn, {ld * size}, nk - jb - len < {bs} ? nk - jb - len : {bs}, {width * size});",
                "        }",
                f"        {call}", "        xp = xn; jb += len;", "    }", "    }"]

    def scores(fused_args: str | None = None) -> list[str]:
        """The scores tile ``st`` of tile ``j0``; with ``fused_args`` (the row scales,
        the additive mask's rows, the row max and nan flag) by ``braze_mm_scaled_max``
        where the tile is ``fast``."""
        res = []
        mm_nt = f"braze_mm_nt_{hk}" if hk else "braze_mm_nt"
        if paged_k is not None:
            res = blockwise(dot.b, paged_k, d, f"{mm_nt}(nq, len, {d}, qt, {d}, xp, {paged_k[0]}, st + jb, {BK});")
        elif hk:
            res = [f"    {mm_nt}(nq, nk, {d}, qt, {d}, {k_at}, {half_ld(dot.b)}, st, {BK});"]
        if res:
            if fused_args is None:
                return res
            return res + [f"    if (fast) braze_scaled_max_rest(nq, nk, st, {BK}, {fused_args}, 0, 0, 0);"]
        if narrow:
            mm = f"braze_mm_nt(nq, nk, {d}, qt, {d}, {k_rows}, {k_ld}, st, {BK}"
            fused_mm = f"braze_mm_nt_scaled_max(nq, nk, {d}, qt, {d}, {k_rows}, {k_ld}, st, {BK}"
        else:
            mm = f"braze_mm(nq, {BK}, {d}, qt, {d}, ktp, {BK}, st, {BK}, 0"
            fused_mm = f"braze_mm_scaled_max(nq, {BK}, {d}, qt, {d}, ktp, {BK}, st, {BK}"
        if fused_args is None:
            return res + [f"    {mm});"]
        return res + [f"    if (fast) {fused_mm}, {fused_args});", f"    else {mm});"]

    def pack_k(dst: str) -> list[str]:
        """The key tile at ``j0``, transposed to ``[d][j]`` (zero past the row's end):
        by 8 x 8 blocks (``braze_transpose8``) where float32 key rows are contiguous."""
        res = []
        first = "0"
        if ldk is not None:
            res += ["int64_t jb = 0;",
                    f"for (; jb + 8 <= nk; jb += 8) for (int64_t dd = 0; dd < {d}; dd += 8) "
                    f"braze_transpose8({k_at} + jb * {ldk} + dd, {ldk}, {dst} + dd * {BK} + jb, {BK});"]
            first = "jb"
        elif paged_b is not None and paged_b[1] % 8 == 0 and d % 8 == 0:
            # rows through a block table: each 8 rows lie in one block, a stride apart
            at = Renderer([f"o{i}" for i in range(n_outer)] + ["i0", "0"]).index(dot.b.index)
            res += ["int64_t jb = 0;", "for (; jb + 8 <= nk; jb += 8) {", "    const int64_t i0 = j0 + jb;",
                    *row_at(dot.b), f"    const float *xp = a{dot.b.arg} + {at} + at{dot.b.arg}_0 * {dot.b.at[0][1]};",
                    f"    for (int64_t dd = 0; dd < {d}; dd += 8) "
                    f"braze_transpose8(xp + dd, {paged_b[0]}, {dst} + dd * {BK} + jb, {BK});", "}"]
            first = "jb"
        return res + [f"for (int64_t jj = {first}; jj < {BK}; jj++) {{",  # rows of B^T are contiguous: read along them
                # (a row past the end through a block table would read past the table's row)
                f"    const int64_t i0 = {'jj < nk ? j0 + jj : j0' if dot.b.at else 'j0 + jj'};", *row_at(dot.b),
                f"    if (jj < nk) for (int64_t dd = 0; dd < {d}; dd++) {dst}[dd * {BK} + jj] = {load(dot.b)};",
                f"    else for (int64_t dd = 0; dd < {d}; dd++) {dst}[dd * {BK} + jj] = 0.0f;",
                "}"]

    def pack_k_rows(dst: str) -> list[str]:
        """The key tile at ``j0`` as float rows ``[j][d]`` (a narrow task's keys that
        cannot be read in place: strided along the head dim)."""
        return ["for (int64_t jj = 0; jj < nk; jj++) {",
                "    const int64_t i0 = j0 + jj;", *row_at(dot.b),
                f"    for (int64_t dd = 0; dd < {d}; dd++) {dst}[jj * {d} + dd] = {load(dot.b)};",
                "}"]

    def pack_v(dst: str) -> list[str]:
        if half_ld(contract.v) is not None:
            return [f"{HALF_ROWS[contract.v.dtype]}({v_at}, {half_ld(contract.v)}, nk, {e}, {dst});"]
        return ["for (int64_t jj = 0; jj < nk; jj++) {",
                "    const int64_t i0 = j0 + jj;", *row_at(contract.v),
                f"    for (int64_t dd = 0; dd < {e}; dd++) {dst}[jj * {e} + dd] = {load(contract.v)};",
                "}"]

    def values_tile() -> list[str]:
        """The value tile ``vt`` of tile ``j0``, where the contraction does not read the
        values in place (contiguous rows, or blocks through a table)."""
        if ldv is not None or paged_v is not None or hv:
            return []
        return pack_v("vt")

    def sweep(stage_ids: list[int], rolling: bool, with_contract: bool, ind: str,
              lo: str = "0", hi: str = str(n)) -> list[str]:
        """One walk over the row axis folding ``stage_ids`` (and the contraction)."""
        body = scale_rows("") if rolling and with_contract else []
        body += [f"for (int64_t j0 = {lo}; j0 < {hi}; j0 += {BK}) {{",
                f"    const int64_t nk = {hi} - j0 < {BK} ? {hi} - j0 : {BK};"]
        if rolling and with_contract:
            body += skip_check()
        body.append(f"    const int64_t tile = (task / {blocks}) * {ntiles} + j0 / {BK};")
        if not narrow:
            body.append(f"    const float *ktp = kpack ? kpack + tile * {d * BK} : kt;")
        if not hv:
            body.append(f"    const float *vtp = {v_at if ldv is not None else f'kpack ? vpack + tile * {BK * e} : vt'};")
        keys = pack_k("kt") if not narrow else pack_k_rows("kt") if ldk is None and paged_k is None and not hk else []
        pack = keys + (values_tile() if with_contract else [])
        if pack:
            body += ["    if (!kpack) {"] + ["        " + t for t in pack] + ["    }"]
        fast = rolling and with_contract and fused is not None
        if fast:
            assert fused is not None
            sc = "0" if fused[0] is None else "sc"
            body += [f"    float mx[{BQ}]; int mxnan[{BQ}];"]
            bias = fused[2]
            if bias is not None:  # the additive mask's row of this tile, for each row
                body += [f"    const float *brow[{BQ}];", "    for (int64_t ii = 0; ii < nq; ii++) {"]
                body += row_coords("        ")
                body.append(f"        brow[ii] = a{bias.arg} + "
                            + Renderer([f"o{i}" for i in range(n_outer)] + ["j0"]).index(bias.index) + ";")
                body.append("    }")
            body += scores(f"{sc}, {'brow' if bias is not None else '0'}, nk, mx, mxnan")
        else:
            body += scores()
        # (not when keys are read in place by few rows: the hardware's stream
        # prefetch keeps up there, and the prefetches only queue behind it)
        prefetch = rolling and with_contract and not narrow
        if prefetch:
            # The next tile's packed keys and its values (when contiguous) are fetched
            # into cache a slice per row while this tile's rows are worked on: a head's
            # keys and values together outgrow L2 from N = 1024 (d = 64), so each row
            # block would otherwise wait on L3 for every tile (4% of the plain kernel).
            k_next = (f"(const char *)(ktp + {d * BK})" if ldk != d
                      else f"(const char *)(kpack ? ktp + {d * BK} : {k_at} + {BK * d})")
            v_next = (f"kpack ? (const char *)(vtp + {BK * e}) : 0" if ldv is None
                      else f"(const char *)(vtp + {BK * ldv})" if ldv == e else "0")
            body += [f"    const char *pk = j0 + {BK} < {hi} && {'kpack' if ldk != d else '1'} ? {k_next} : 0;",
                     f"    const char *pv = j0 + {BK} < {hi} ? {v_next} : 0;"]
        body += ["    for (int64_t ii = 0; ii < nq; ii++) {"]
        if prefetch:  # lines [ii, ii + 1) * lines / nq of each
            for name, lines in (("pk", d * BK * 4 // 64), ("pv", BK * e * 4 // 64)):
                body.append(f"        if ({name}) for (int64_t l = ii * {lines} / nq; l < (ii + 1) * {lines} / nq; l++) "
                            f"__builtin_prefetch({name} + l * 64, 0, 2);")
        body += row_coords("        ")
        acc = "ns{}" if rolling else "acc{}[ii]"
        if rolling:
            for p in producers:
                body.append(f"        const float os{p} = {safe(k.stages[p].op, f'acc{p}[ii]')};")  # type: ignore[union-attr]
        # One loop over the tile per level of reductions (those of a level do not read
        # each other); the contraction's weights join the loop of the level after their
        # producers, so a value both need (softmax's exp) is computed once per element.
        level_of = {i: lv for lv, ids in enumerate(passes(k)) for i in ids}
        w_level = 1 + max((level_of[a.stage] for a in ir.walk(contract.weight) if isinstance(a, ir.Acc)), default=-1)
        loops = [[i for i in stage_ids if level_of[i] == lv] for lv in sorted({level_of[i] for i in stage_ids})]
        weight_in = next((n for n, ids in enumerate(loops) if level_of[ids[0]] == w_level), None) \
            if with_contract else None
        if with_contract and weight_in is None:
            loops.append([])
            weight_in = len(loops) - 1
        # The first loop leaves each score's value (mask and scale applied: the one
        # score node every fold reads) in the scores tile, so later loops read it back
        # instead of recomputing it.
        stashed = False
        for n_loop, ids in enumerate(loops):
            def render(fast_exp: bool) -> tuple[list[str], dict[int, str], str | None, list[str], bool]:
                """The loop body's statements, each reduction's value, the weight, the
                arguments of its fast-path exps and whether it stashes the scores."""
                r = R(acc)
                r.fast = [] if fast_exp else None
                if stashed and score is not None:
                    r.memo[score] = "sv"
                else:
                    r.memo[dot] = "sv"
                xs = {i: r.expr(k.stages[i].expr) for i in ids}  # type: ignore[union-attr]
                w = r.expr(contract.weight) if n_loop == weight_in else None
                fold = r.take()
                stash = score is not None and not stashed and score in r.memo and n_loop < len(loops) - 1
                if stash:
                    assert score is not None
                    fold.append(f"st[ii * {BK} + jj] = {r.memo[score]};")
                return fold, xs, w, r.fast or [], stash

            def loop(fold: list[str], xs: dict[int, str], w: str | None, checks: list[str], ind: str) -> list[str]:
                # A sum of the weights themselves (softmax's denominator) is summed from
                # the tile row they were stored in (braze_row_sum: vector partial sums and
                # a tree), not by the omp simd reduction, whose lanes gcc adds one by
                # one: 16 dependent adds per row and tile.
                from_wt = {i for i in ids if w is not None and xs[i] == w and k.stages[i].op == "sum"}  # type: ignore[union-attr]
                clauses = "".join(
                    (f" reduction({OMP_REDUCTION[k.stages[i].op]}:red{i})"  # type: ignore[union-attr]
                     if k.stages[i].op in OMP_REDUCTION and i not in from_wt else "")  # type: ignore[union-attr]
                    + f" reduction(|:rnan{i})" for i in ids)
                if checks:
                    clauses += f" reduction(min:kmin{n_loop}) reduction(max:kmax{n_loop})"
                res = [f"{ind}#pragma omp simd{clauses}",
                       f"{ind}for (int64_t jj = 0; jj < nk; jj++) {{",
                       f"{ind}    const int64_t i0 = j0 + jj; const float sv = st[ii * {BK} + jj]; (void)i0; (void)sv;"]
                res += [f"{ind}    " + t for t in fold]
                for x in checks:
                    res.append(f"{ind}    {{ const int32_t k = braze__exp_k({x}); kmin{n_loop} = k < kmin{n_loop} ? k : kmin{n_loop}; "
                               f"kmax{n_loop} = k > kmax{n_loop} ? k : kmax{n_loop}; }}")
                for i in ids:
                    s = k.stages[i]
                    assert isinstance(s, ir.Reduce)
                    if s.op in ("amax", "amin"):
                        res.append(f"{ind}    rnan{i} |= ({xs[i]} != {xs[i]});")
                    if i not in from_wt:
                        res.append(f"{ind}    " + reduce_update(s.op, f"red{i}", xs[i], s.dtype))
                if w is not None:
                    res.append(f"{ind}    wt[ii * {BK} + jj] = {w};")
                res.append(f"{ind}}}")
                res += [f"{ind}red{i} = braze_row_sum(wt + ii * {BK}, nk);" for i in sorted(from_wt)]
                return res

            def init_red(ind: str) -> list[str]:
                return [f"{ind}red{i} = {reduce_init(k.stages[i].op, k.stages[i].dtype)}; rnan{i} = 0;"  # type: ignore[union-attr]
                        for i in ids]
            # The exps run on the fast path (braze__exp_normal) and the loop is redone
            # with braze_expf in the rare tile row where an argument's k left [-126, 127]
            # (a masked score, a subnormal or overflowing result, a nan); not a
            # loop that overwrites the scores it reads (the stash).
            fold, xs, w, checks, stash = render(True)
            if stash:
                fold, xs, w, checks, stash = render(False)
            body += [f"        float red{i}; int rnan{i};" for i in ids] + init_red("        ")
            if checks:
                body.append(f"        int32_t kmin{n_loop} = 0, kmax{n_loop} = 0;")
            if fast and n_loop == 0:  # braze_mm_scaled_max folded this level with the scores
                body.append("        if (fast) {")
                body += [f"            red{i} = mx[ii]; rnan{i} = mxnan[ii];" for i in ids]
                body.append("        } else {")
                body += loop(fold, xs, w, checks, "        ")
                body.append("        }")
            else:
                body += loop(fold, xs, w, checks, "        ")
            if checks:
                body.append(f"        if (kmin{n_loop} < -126 || kmax{n_loop} > 127) {{")
                body += init_red("            ")
                exact, xs_exact, w_exact, _, _ = render(False)
                body += loop(exact, xs_exact, w_exact, [], "            ")
                body.append("        }")
            stashed = stashed or stash
            for i in ids:
                s = k.stages[i]
                assert isinstance(s, ir.Reduce)
                body.append(f"        nan{i}[ii] |= rnan{i};")
                rep = s.repair if rolling else None
                body += ["        " + x for x in repaired_when_moved(R(acc), rep, f"acc{i}[ii]", s.dtype, f"old{i}")]
                body.append(f"        {{ const float t = old{i}; float u = t; "
                            + reduce_update(s.op, "u", f"red{i}", s.dtype) + f" acc{i}[ii] = u; }}")
                if rolling:
                    body.append(f"        const float ns{i} = {safe(s.op, f'acc{i}[ii]')};")
        if with_contract:
            if rolling and contract.repair is not None:
                t = ir.Var("t", contract.repair.dtype)
                r = R(acc)
                body.append(f"        if ({moved(contract.repair)}) {{")
                # the parts of h that do not read t (exp(m - m')) once per row, not per element
                body += ["            " + x for x in _row_parts(r, contract.repair, t)]
                pre, h = repaired(r, contract.repair, "tv", t.dtype)
                body.append("            #pragma omp simd")
                body.append(f"            for (int64_t dd = 0; dd < {e}; dd++) {{")
                body.append(f"                const float tv = ot[ii * {e} + dd];")
                body += ["                " + t for t in pre]
                body.append(f"                ot[ii * {e} + dd] = {h};")
                body.append("            }")
                body.append("        }")
        body.append("    }")
        if with_contract and paged_v is not None:
            mm = f"braze_mm_{hv}(nq, {e}, len, wt + jb, {BK}, xp, {paged_v[0]}, ot, {e});" if hv else \
                f"braze_mm(nq, {e}, len, wt + jb, {BK}, xp, {paged_v[0]}, ot, {e}, 1);"
            body += blockwise(contract.v, paged_v, e, mm)
        elif with_contract and hv:
            body.append(f"    braze_mm_{hv}(nq, {e}, nk, wt, {BK}, {v_at}, {half_ld(contract.v)}, ot, {e});")
        elif with_contract:
            body.append(f"    braze_mm(nq, {e}, nk, wt, {BK}, vtp, {e if ldv is None else ldv}, ot, {e}, 1);")
        body.append("}")
        return [ind + t for t in body]

    def init(ind: str) -> list[str]:
        res = [f"{ind}for (int64_t ii = 0; ii < nq; ii++) {{"]
        for i in reduces:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            res.append(f"{ind}    acc{i}[ii] = {reduce_init(s.op, s.dtype)}; nan{i}[ii] = 0;")
        res.append(f"{ind}}}")
        res.append(f"{ind}for (int64_t x = 0; x < nq * {e}; x++) ot[x] = 0.0f;")
        return res

    def finish(ind: str) -> list[str]:
        """Rows whose producers ended non-finite are redone without repairs (one pass
        per level of reductions); then the epilogue writes post(sum) per row."""
        res = []
        checks = " || ".join(f"nan{p}[ii] || !isfinite(acc{p}[ii])" for p in producers) or "0"
        res.append(f"{ind}int redo = 0;")
        res.append(f"{ind}for (int64_t ii = 0; ii < nq; ii++) redo |= {checks};")
        res.append(f"{ind}if (redo) {{")
        res += init(ind + "    ")
        for stage_ids in passes(k):
            res += sweep(stage_ids, False, False, ind + "    ")
            for i in stage_ids:
                res.append(f"{ind}    for (int64_t ii = 0; ii < nq; ii++) if (nan{i}[ii]) acc{i}[ii] = NAN;")
        res += sweep([], False, True, ind + "    ")
        res.append(f"{ind}}} else {{")
        for i in reduces:
            if k.stages[i].op in ("amax", "amin"):  # type: ignore[union-attr]
                res.append(f"{ind}    for (int64_t ii = 0; ii < nq; ii++) if (nan{i}[ii]) acc{i}[ii] = NAN;")
        res.append(f"{ind}}}")
        res.append(f"{ind}for (int64_t ii = 0; ii < nq; ii++) {{")
        res += row_coords(ind + "    ")
        res.append(f"{ind}    #pragma omp simd")
        res.append(f"{ind}    for (int64_t dd = 0; dd < {e}; dd++) {{")
        res.append(f"{ind}        const int64_t i0 = 0; (void)i0; const float cv = ot[ii * {e} + dd];")
        r = Renderer(dcoords, prefix=f"p{next(names)}_", acc="acc{}[ii]", n_outer=n_outer, hoisted=hoisted)
        r.memo[ir.Var("c", contract.post.dtype)] = "cv"
        value = r.expr(contract.post)
        res += [f"{ind}        " + t for t in r.take()]
        res.append(f"{ind}        a{contract.arg}[{r.index(contract.index)}] = "
                   f"{converted(value, contract.post.dtype, k.args[contract.arg][0])};")
        res.append(f"{ind}    }}")
        res.append(f"{ind}}}")
        return res

    def save_part(ind: str) -> list[str]:
        res = [f"{ind}float *part = parts + (int64_t)t * {n_part};"]
        for n_i, i in enumerate(reduces):
            res.append(f"{ind}for (int64_t ii = 0; ii < nq; ii++) {{ part[{2 * n_i * BQ} + ii] = acc{i}[ii]; "
                       f"part[{(2 * n_i + 1) * BQ} + ii] = (float)nan{i}[ii]; }}")
        res.append(f"{ind}for (int64_t x = 0; x < nq * {e}; x++) part[{2 * len(reduces) * BQ} + x] = ot[x];")
        return res

    def combine(ind: str) -> list[str]:
        """Split-K's combine: fold the splits' partials in order, each repaired from its
        own running values to the final ones (Neptune 4.3)."""
        res = init(ind)
        res.append(f"{ind}for (int64_t ii = 0; ii < nq; ii++) {{")
        for n_i, i in enumerate(reduces):
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            res.append(f"{ind}    for (int64_t sp = 0; sp < splits; sp++) {{")
            res.append(f"{ind}        const float *part = parts + (task * splits + sp) * {n_part};")
            for p in producers:
                m = reduces.index(p)
                res.append(f"{ind}        const float os{p} = {safe(k.stages[p].op, f'part[{2 * m * BQ} + ii]')};")  # type: ignore[union-attr]
            stmts, t = repaired(R("ns{}"), s.repair, f"part[{2 * n_i * BQ} + ii]", s.dtype)
            res += [f"{ind}        " + x for x in stmts]
            res.append(f"{ind}        {{ float u = acc{i}[ii]; " + reduce_update(s.op, "u", t, s.dtype)
                       + f" acc{i}[ii] = u; nan{i}[ii] |= part[{(2 * n_i + 1) * BQ} + ii] != 0.0f; }}")
            res.append(f"{ind}    }}")
            res.append(f"{ind}    const float ns{i} = {safe(s.op, f'acc{i}[ii]')}; (void)ns{i};")
        res.append(f"{ind}    for (int64_t sp = 0; sp < splits; sp++) {{")
        res.append(f"{ind}        const float *part = parts + (task * splits + sp) * {n_part};")
        for p in producers:
            m = reduces.index(p)
            res.append(f"{ind}        const float os{p} = {safe(k.stages[p].op, f'part[{2 * m * BQ} + ii]')};")  # type: ignore[union-attr]
        pre, h = repaired(R("ns{}"), contract.repair, "tv", dt.float32)
        res.append(f"{ind}        for (int64_t dd = 0; dd < {e}; dd++) {{")
        res.append(f"{ind}            const float tv = part[{2 * len(reduces) * BQ} + ii * {e} + dd];")
        res += [f"{ind}            " + x for x in pre]
        res.append(f"{ind}            ot[ii * {e} + dd] += {h};")
        res.append(f"{ind}        }}")
        res.append(f"{ind}    }}")
        res.append(f"{ind}}}")
        return res

    out = lines
    # Choices by size are made by the C at run time, so a kernel generic in its sizes
    # (``codegen/generic.py``) has one text for every prompt length; with literal sizes
    # the compiler folds them.
    if narrow:
        out += live_keys()
        out.append(f"    if ({2 * n_batch * rows_per_batch} * live * {d + e} < {PARALLEL_FLOPS_NARROW}) nthreads = 1;"
                   "  /* too little work even for an awake team */")
    else:
        out.append(f"    if ({2 * n_batch * rows_per_batch * n * (d + e)} < {PARALLEL_FLOPS}) nthreads = 1;"
                   "  /* too little work to pay for waking the team */")
    # Every block of rows of a batch reads the same key and value tiles: with several
    # blocks, pack them all once (transposed keys; values unless read in place), in
    # parallel, before the main loop.
    kn, vn = n_batch * ntiles * d * BK, 0 if ldv is not None else n_batch * ntiles * BK * e
    out.append(f"    float *kpack = {blocks} < 4 ? 0 : (float *)malloc(sizeof(float) * {kn + vn});")
    # Which tiles are all fill, none or mixed, per (row block, key tile), when the mask
    # is the same for every batch (heads: an (N, N) mask or the causal one): found once,
    # not once per head (0: not yet; several tasks may find it, and they agree).
    shared = skip is not None and n_batch > 1 and batch_free(skip.filled, n_outer - nr)
    out.append(f"    unsigned char *tilememo = {f'(unsigned char *)calloc({blocks * ntiles}, 1)' if shared else '0'};")
    out.append(f"    float *vpack = kpack ? kpack + {kn} : 0;")
    out.append("    if (kpack) {")
    out.append(f"        #pragma omp parallel for num_threads(nthreads) schedule(static) if(nthreads > 1)")
    out.append(f"        for (int64_t tile = 0; tile < {n_batch * ntiles}; tile++) {{")
    out.append(f"            const int64_t j0 = (tile % {ntiles}) * {BK};")
    out.append(f"            const int64_t nk = {n} - j0 < {BK} ? {n} - j0 : {BK};")
    rest = f"(tile / {ntiles})"
    for i in range(n_outer - nr - 1, -1, -1):
        out.append(f"            const int64_t o{i} = {rest} % {k.outer[i]};")
        rest = f"({rest} / {k.outer[i]})"
    out.append(f"            float *kt = kpack + tile * {d * BK};")
    if ldv is None:
        out.append(f"            float *vt = vpack + tile * {BK * e};")
    out += ["            " + t for t in pack_k("kt") + (pack_v("vt") if ldv is None else [])]
    out.append("        }")
    out.append("    }")
    # Split-K (decoding: few rows, long rows): when there are fewer tasks than threads,
    # each task's row axis is cut into chunks done in parallel, then combined. A narrow
    # kernel splits whenever the threads would not share its tasks evenly (3 KV heads
    # on 2 threads: 2 splits each, 6 chunks), in chunks of its live keys, the last
    # chunk running to the end (the masked tiles past the position, skipped).
    if narrow:
        out.append("    int64_t splits = 1;")
        out.append(f"    if (nthreads > 1 && live >= {2 * BK}) {{")
        out.append(f"        int64_t g = {tasks}, h = nthreads;")
        out.append("        while (h) { const int64_t r = g % h; g = h; h = r; }")
        out.append("        splits = nthreads / g;")
        out.append(f"        if (splits > (live + {BK - 1}) / {BK}) splits = (live + {BK - 1}) / {BK};")
        out.append("    }")
        ext = "live"
    else:
        out.append(f"    int64_t splits = {tasks} < nthreads && {n} >= {4 * BK} ? nthreads : 1;")
        most = f"({n} / {2 * BK} > 1 ? {n} / {2 * BK} : 1)"
        out.append(f"    if (splits > {most}) splits = {most};")
        ext = str(n)
    out.append(f"    const int64_t chunk = (({ext} + splits - 1) / splits + {BK - 1}) / {BK} * {BK};")
    out.append(f"    float *parts = splits > 1 ? (float *)malloc(sizeof(float) * {tasks} * splits * {n_part}) : 0;")
    out.append("    if (splits > 1 && !parts) splits = 1;")
    out.append(f"    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if(nthreads > 1 && {tasks} * splits > 1)")
    out.append(f"    for (int64_t t = 0; t < {tasks} * splits; t++) {{")
    ind = "        "
    out.append(f"{ind}const int64_t task = t / splits, sp = t % splits;")
    out += task_setup(ind, "task")
    out += init(ind)
    out.append(f"{ind}const int64_t jlo = sp * chunk < {n} ? sp * chunk : {n};")
    out.append(f"{ind}const int64_t jhi = sp == splits - 1 || jlo + chunk > {n} ? {n} : jlo + chunk;")
    out += sweep(reduces, True, True, ind, "jlo", "jhi")
    out.append(f"{ind}if (splits == 1) {{")
    out += finish(ind + "    ")
    out.append(f"{ind}}} else {{")
    out += save_part(ind + "    ")
    out.append(f"{ind}}}")
    out.append("    }")
    out.append("    if (splits > 1) {")
    # (a narrow kernel's combine is a few rows: less work than a parallel region)
    out.append(f"        #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) "
               f"if(nthreads > 1 && {tasks} > 1 && {int(not narrow)})")
    out.append(f"        for (int64_t task = 0; task < {tasks}; task++) {{")
    ind = "            "
    out += task_setup(ind, "task")
    out += combine(ind)
    out += finish(ind)
    out.append("        }")
    out.append("        free(parts);")
    out.append("    }")
    out.append("    free(kpack);")
    out.append("    free(tilememo);")
    out.append("}")
    return "\n".join(out)


_c.CHAIN_RENDERER = chain_source  # codegen/c.py renders chain kernels through this module
