"""C renderer: a kernel's loops, with OpenMP.

``kernel_source`` lays out the loops: an OpenMP parallel loop over rows, and inside a
row one loop per pass (the reductions of a pass share it; stores follow the last pass),
innermost loops marked ``omp simd`` so gcc vectorises them; a reduction over an outer
dim runs with its loops swapped (``_column_source``). The expressions inside are
``c_expr.py``'s, the folds ``c_reduce.py``'s, streamed stores ``c_stream.py``'s; chain,
scan, scatter and top-k kernels come from the modules that register themselves here.
"""

from __future__ import annotations

from math import prod
from typing import Callable

from .. import dtypes as dt
from .. import ir
from ..dtypes import DType
from . import argfold, c_stream, checks, qlib, quant
from .c_expr import CTYPE, PRELUDE, Renderer, literal, vtype
from .c_reduce import OMP_REDUCTION, fold_body, reduce_init, reduce_update, rolling
from .headers import header
from .loops import is_float_minmax, passes, scans

COLUMN_BLOCK = 256
PARTS_ROWS = 16  # an element-wise kernel of fewer rows a thread (or a generic one) may cut them into parts

# A team's fork and join cost ~1 us here (bench/RESULTS.md, fifteenth session): a loop
# goes parallel once its work is worth several of them. The work of an element is its
# loads, stores and ops, a transcendental or a division counted as several (an expf is
# ~8 adds' time). An add's 4 units reach the bar at 32768 elements, as before; the
# custom-erf GELU's ~50 at ~2600, and 4096 is the floor (16 KiB of floats).
_PARALLEL_WORK = 131072
_PARALLEL_FLOOR = 4096
_OP_WORK = {**dict.fromkeys(("exp", "log", "sin", "cos", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "pow"), 8),
            **dict.fromkeys(("div", "sqrt", "rsqrt", "reciprocal"), 4)}


def parallel_min(k: ir.Kernel) -> int:
    """How many elements a kernel's parallel loop needs before it forks a team."""
    work = 0
    for s in k.stages:
        work += isinstance(s, (ir.Store, ir.StoreRow))
        for e in ir.stage_exprs(s):
            for n in ir.walk(e):
                work += _OP_WORK.get(n.name, 1) if isinstance(n, ir.Op) else isinstance(n, ir.Load)
    return max(_PARALLEL_FLOOR, _PARALLEL_WORK // max(work, 1))


def _column_reduction(k: ir.Kernel) -> bool:
    """A reduction over an outer (strided) dim, e.g. ``x.sum(0)`` of a row-major
    matrix: one row is one column of memory, so walking a row strides through memory.
    Such a kernel is better run with the loops swapped: for a block of rows, walk the
    reduced dim outside and the rows inside, where the loads are contiguous."""
    if len(k.outer) != 1 or not k.inner or any(isinstance(s, (ir.Store, ir.Scan)) or argfold.is_arg(s) for s in k.stages):
        return False  # (an arg fold walks its row in lanes: codegen/argfold.py)
    reduces = [s for s in k.stages if isinstance(s, ir.Reduce)]
    if not reduces or len(passes(k)) != 1:
        return False
    loads = [n for s in reduces for n in ir.walk(s.expr) if isinstance(n, ir.Load)]
    return bool(loads) and all(n.index.coeffs[0] == 1 and n.index.coeffs[-1] != 1 and not n.index.divs for n in loads)


def _column_source(k: ir.Kernel, lines: list[str], hoisted: dict[ir.Expr, str]) -> str:
    n_in = len(k.inner)
    coords = ["o0"] + [f"i{i}" for i in range(n_in)]
    rows = k.outer[0]
    reduces = [i for i, s in enumerate(k.stages) if isinstance(s, ir.Reduce)]
    lines.append(f"    #pragma omp parallel for num_threads(nthreads) schedule(static) if(nthreads > 1 && {rows * prod(k.inner)} > 32768)")
    lines.append(f"    for (int64_t rb = 0; rb < {rows}; rb += {COLUMN_BLOCK}) {{")
    lines.append(f"        const int64_t nb = {rows} - rb < {COLUMN_BLOCK} ? {rows} - rb : {COLUMN_BLOCK};")
    for i in reduces:
        s = k.stages[i]
        assert isinstance(s, ir.Reduce)
        lines.append(f"        {vtype(s.dtype)} acc{i}[{COLUMN_BLOCK}];")
        lines.append(f"        for (int64_t r = 0; r < nb; r++) acc{i}[r] = {reduce_init(s.op, s.dtype)};")
        if is_float_minmax(s):
            lines.append(f"        int nan{i}[{COLUMN_BLOCK}] = {{0}};")
    ind = "        "
    for j, size in enumerate(k.inner):
        lines.append(f"{ind}for (int64_t i{j} = 0; i{j} < {size}; i{j}++) {{")
        ind += "    "
    lines.append(f"{ind}#pragma omp simd")
    lines.append(f"{ind}for (int64_t r = 0; r < nb; r++) {{")
    lines.append(f"{ind}    const int64_t o0 = rb + r;")
    body = fold_body(k, reduces, Renderer(coords, acc="acc{}[r]", hoisted=hoisted), "acc{}[r]", "nan{}[r]")
    lines += [f"{ind}    {b}" for b in body]
    lines.append(f"{ind}}}")
    for _ in range(n_in):
        ind = ind[:-4]
        lines.append(f"{ind}}}")
    lines.append("        for (int64_t r = 0; r < nb; r++) {")
    lines.append("            const int64_t o0 = rb + r;")
    for i in reduces:
        if is_float_minmax(k.stages[i]):  # type: ignore[arg-type]
            lines.append(f"            if (nan{i}[r]) acc{i}[r] = NAN;")
    row = Renderer(coords, acc="acc{}[r]", hoisted=hoisted)
    stores = [row.store(s.arg, s.index, s.expr, k.args[s.arg][0]) for s in k.stages if isinstance(s, ir.StoreRow)]
    lines += [f"            {t}" for t in row.take() + stores]
    lines += ["        }", "    }", "}"]
    return "\n".join(lines)


def _stashes(k: ir.Kernel, passes: list[list[int]]) -> dict[ir.Expr, ir.Store]:
    """Values the last reduction pass computes that the stores need again (softmax's
    ``exp(x - max)``, summed, then divided). The last pass writes each into the output
    it will end up in, and the store pass reads it back instead of recomputing it: the
    row is still in cache, and a load is cheaper than an exp. Only when the output has
    the value's own type, so nothing is rounded on the way, and is not also read (an
    in-place write: the store pass may still need the old values the stash overwrote)."""
    if not passes or any(isinstance(s, ir.Scan) for s in k.stages):
        return {}  # (a walk that scans keeps its values in its block buffers)
    out: dict[ir.Expr, ir.Store] = {}
    read = {n.arg for st in k.stages for e in ir.stage_exprs(st) for n in ir.walk(e) if isinstance(n, ir.Load)}
    stores = [s for s in k.stages if isinstance(s, ir.Store) and s.arg not in read]
    for i in passes[-1]:
        red = k.stages[i]
        assert isinstance(red, ir.Reduce)
        e = red.expr
        if not isinstance(e, ir.Op) or e.dtype.is_half or e.dtype is dt.bool_:
            continue
        for st in stores:
            if st not in out.values() and k.args[st.arg][0] is e.dtype and \
                    any(n == e for n in ir.walk(st.expr)):
                out[e] = st
                break
    return out


def _hoist(k: ir.Kernel, lines: list[str]) -> dict[ir.Expr, str]:
    """Loads at a constant index (a scalar: ``x / 2`` reads a 0-d constant) are read once,
    into locals, before the parallel loop. Inside OpenMP's outlined loop body gcc no
    longer knows the argument pointers are ``restrict``, so it would reload each scalar
    and redo every division by it per element (custom-erf GELU: 63 -> 50 ms)."""
    out: dict[ir.Expr, str] = {}
    r = Renderer([])
    for n in (n for s in k.stages for e in ir.stage_exprs(s) for n in ir.walk(e)):
        if isinstance(n, ir.Load) and not any(n.index.coeffs) and not n.index.divs and not n.when and not n.at \
                and n not in out:
            out[n] = f"s{len(out)}"
            lines.append(f"    const {vtype(n.dtype)} {out[n]} = {r.load(n)};")
    return out


#: The renderer of chain kernels (``codegen/chain.py``, which builds on this module and
#: registers itself here when imported: the package imports it, so it always is).
CHAIN_RENDERER: Callable[[ir.Kernel, list[str], dict[ir.Expr, str]], str] | None = None
#: The renderers of top-k kernels (``codegen/topk.py``) and of a row's element loops
#: when it scans (``codegen/scan.py``), registered as chain.py's is.
TOPK_RENDERER: Callable[[ir.TopK, str, int], str] | None = None
SCAN_RENDERER: Callable[[ir.Kernel, list[str], int, dict[ir.Expr, str], list[int],
                          Callable[[Renderer], tuple[list[str], str]]], list[str]] | None = None
#: A scattering kernel's check of every row's index before it stores (``codegen/scatter.py``).
SCATTER_PREPASS: Callable[[ir.Kernel, dict[ir.Expr, str]], list[str]] | None = None


def kernel_source(k: ir.Kernel | ir.QLinear | ir.QRows | ir.TopK, name: str, sizes: int = 0,
                  stream: bool | None = None) -> str:
    """The C source of one kernel: ``void name(void **args, int64_t nthreads)``. A
    generic kernel (``codegen/generic.py``) reads its ``sizes`` named sizes from the
    argument after its buffers, and decides when it runs whether its stores stream
    (``c_stream.streams``: two bodies, chosen by its footprint). ``stream`` forces the choice."""
    if isinstance(k, ir.QLinear):
        return (_prologue_source(k, name) if k.prologue else "") + _epilogue_source(k, name) \
            + quant.kernel_source(k, name, sizes)
    if isinstance(k, ir.QRows):
        return quant.kernel_source(k, name, sizes)
    if isinstance(k, ir.TopK):
        assert TOPK_RENDERER is not None, "braze.codegen.topk registers the top-k renderer when imported"
        return TOPK_RENDERER(k, name, sizes)
    sized = quant.bind_sizes(len(k.args), sizes)
    if sizes and stream is None and c_stream.may_stream(k) and prod(k.outer) and any(isinstance(s, ir.Store) for s in k.stages):
        bodies = [kernel_source(k, f"{name}_{w}", sizes, w == "s").replace("void ", "static void ", 1) for w in "sp"]
        return "\n".join(bodies + [f"void {name}(void **args, int64_t nthreads) {{", *sized,
                                    f"    if ({c_stream.footprint(k)} >= {c_stream.llc_bytes()}) {name}_s(args, nthreads);",
                                    f"    else {name}_p(args, nthreads);", "}"])
    lines = [f"void {name}(void **args, int64_t nthreads) {{", *_pointers(k.args)]
    lines += sized + checks.err_pointer(k, sizes)
    rows = prod(k.outer)
    row_len = prod(k.inner)
    if rows == 0:  # no row to compute (and a size-0 dim must not reach a % 0)
        return "\n".join(lines + ["    (void)nthreads;", "}"])
    hoisted = _hoist(k, lines) if row_len else {}
    if any(isinstance(s, ir.Contract) for s in k.stages):  # a chain kernel: chain.py's renderer
        assert CHAIN_RENDERER is not None, "braze.codegen.chain registers the chain renderer when imported"
        return CHAIN_RENDERER(k, lines, hoisted)
    if _column_reduction(k):
        return _column_source(k, lines, hoisted)
    assert SCATTER_PREPASS is not None, "braze.codegen.scatter registers its renderer when imported"
    lines += SCATTER_PREPASS(k, hoisted)
    total = rows * max(row_len, 1)
    bar = parallel_min(k)
    parallel = f"num_threads(nthreads) if(nthreads > 1 && {total} > {bar})"
    # Not when the last pass stashes values in the output: that wrote its lines into
    # the cache already, and streaming over them gains nothing (softmax: 1.40x slower).
    streamed = (c_stream.streams(k) if stream is None else stream and c_stream.may_stream(k)) and not _stashes(k, passes(k))
    # Element stores alone over a few rows, fewer than a team can share evenly (a 1-d
    # tensor, (64, 256) whose rows are shorter than fuse.ROW_MIN, (3, 4096)): rows cut
    # into parts when it runs, each a slice of the first inner loop, in a loop nest of
    # its own beside the whole rows' (a generic kernel holds both: its text must not
    # depend on its rows). One nest for both would cost short rows (16 * 16 * 64 of 64)
    # 17% at 1 thread: gcc spills the loop's constants once its bounds are a slice's.
    cut = not streamed and bool(k.inner) and (type(rows) is not int or rows < PARTS_ROWS) \
        and not (type(total) is int and total <= bar) \
        and all(type(s) is ir.Store and not s.at for s in k.stages)  # (a decoding step's never forks: no nest)
    if cut:
        n = k.inner[0]
        lines += ["    int64_t parts = 1;  /* rows * parts a multiple of the team */",
                  f"    if (nthreads > 1 && {total} > {bar} && {rows} < {PARTS_ROWS} * nthreads) {{",
                  f"        int64_t a = {rows}, b = nthreads;",
                  "        while (b) { const int64_t t = a % b; a = b; b = t; }",
                  "        parts = nthreads / a;",
                  "    }",
                  "    if (parts > 1) {",
                  "    #pragma omp parallel for num_threads(nthreads) schedule(static)",
                  f"    for (int64_t chunk = 0; chunk < {rows} * parts; chunk++) {{",
                  "        const int64_t row = chunk / parts, part = chunk % parts;",
                  f"        const int64_t lo = {n} * part / parts, hi = {n} * (part + 1) / parts;"]
        lines += _row_source(k, hoisted, "        ", False, True)
        lines += ["    }", "    } else {"]
    if streamed:  # each thread fences its streamed stores before the region's barrier
        lines += [f"    #pragma omp parallel {parallel}", "    {", "    #pragma omp for schedule(static) nowait"]
    else:
        lines.append(f"    #pragma omp parallel for {parallel} schedule(static)")
    lines.append(f"    for (int64_t row = 0; row < {rows}; row++) {{")
    lines += _row_source(k, hoisted, "        ", streamed)
    lines.append("    }")
    if streamed:
        lines += ["    braze_sfence();", "    }"]
    if cut:
        lines.append("    }")
    lines.append("}")
    return "\n".join(lines)


def _row_source(k: ir.Kernel, hoisted: dict[ir.Expr, str], body_indent: str, streamed: bool,
                parts: bool = False) -> list[str]:
    """The body of one row of a kernel (``row`` in scope): its outer coordinates, the
    passes of its reductions, its row and element stores. Shared by the kernel's
    parallel loop and a quantized matmul's prologue (one row of x at a time). ``parts``:
    the row is cut into ``parts`` (``part`` in scope), a slice of the first inner loop each."""
    n_out, n_in = len(k.outer), len(k.inner)
    coords = [f"o{i}" for i in range(n_out)] + [f"i{i}" for i in range(n_in)]
    levels = passes(k)
    stash = _stashes(k, levels)
    lines = row_coords(k.outer, body_indent)

    def inner_loop(body: list[str], reduction: str = "") -> list[str]:
        if not k.inner:
            return [body_indent + "{"] + [body_indent + "    " + b for b in body] + [body_indent + "}"]
        out = []
        ind = body_indent
        for j, size in enumerate(k.inner):
            if j == n_in - 1:
                out.append(f"{ind}#pragma omp simd{reduction}")
            if j == 0 and parts:  # this row's part of it
                out.append(f"{ind}for (int64_t i0 = lo; i0 < hi; i0++) {{")
            else:
                out.append(f"{ind}for (int64_t i{j} = 0; i{j} < {size}; i{j}++) {{")
            ind += "    "
        out += [ind + b for b in body]
        for j in range(n_in):
            ind = ind[:-4]
            out.append(f"{ind}}}")
        return out

    # gathers' row-constant index checks, once per row (their loops then vectorise)
    row_checked, hoisted = checks.hoisted_rows(k, Renderer(coords, prefix="g", n_outer=n_out, hoisted=hoisted), hoisted)
    lines += [body_indent + t for t in row_checked]
    rolled = rolling(k, levels, coords, n_out, hoisted)
    if rolled:
        lines += [body_indent + t for t in rolled]
        lines.append(f"{body_indent}if (redo) {{")
    for p in levels:
        clauses = []
        args = [i for i in p if argfold.is_arg(k.stages[i])]
        for i in p:
            s = k.stages[i]
            assert isinstance(s, ir.Reduce)
            if i in args:  # lanes of (value, index), combined after the loop
                d = s.expr.dtype
                lines += [body_indent + t for t in argfold.c_declare(i, vtype(d), literal(argfold.identity(s.op, d), d))]
                continue
            decl = "" if rolled else f"{vtype(s.dtype)} "
            lines.append(f"{body_indent}{decl}acc{i} = {reduce_init(s.op, s.dtype)};")
            if is_float_minmax(s):
                lines.append(f"{body_indent}{'' if rolled else 'int '}nan{i} = 0;")
                clauses.append(f" reduction(|:nan{i})")
            clauses.append(f" reduction({OMP_REDUCTION[s.op]}:acc{i})")
        scanned = scans(k, p)
        if scanned:  # a fold of scanned values: in a walk that scans (codegen/scan.py)
            assert SCAN_RENDERER is not None and not args
            lines += [body_indent + t for t in SCAN_RENDERER(
                k, coords, n_out, hoisted, scanned, lambda r: (fold_body(k, p, r, "acc{}", "nan{}"), "".join(clauses)))]
            lines += [f"{body_indent}if (nan{i}) acc{i} = NAN;" for i in p if is_float_minmax(k.stages[i])]  # type: ignore[arg-type]
            continue
        fold = Renderer(coords, n_outer=n_out, hoisted=hoisted)
        body = fold_body(k, p, fold, "acc{}", "nan{}")
        if p is levels[-1]:
            body += [f"a{st.arg}[{fold.index(st.index)}] = {fold.memo[e]};" for e, st in stash.items()]
        if args:
            assert len(k.inner) == 1  # (an arg fold folds one dim)
            lines += argfold.c_loop(k.inner[0], coords[-1], "".join(clauses), body, body_indent)
            for i in args:
                a = k.stages[i]
                assert isinstance(a, ir.Reduce)
                lines += [body_indent + t for t in argfold.c_finish(a, i, vtype(a.expr.dtype))]
        else:
            lines += inner_loop(body, "".join(clauses))
        for i in p:
            if is_float_minmax(k.stages[i]):  # type: ignore[arg-type]
                lines.append(f"{body_indent}if (nan{i}) acc{i} = NAN;")
    if rolled:
        lines.append(f"{body_indent}}}")
    row = Renderer(coords, prefix="r", n_outer=n_out, hoisted=hoisted)
    row_stores = [row.store(s.arg, s.index, s.expr, k.args[s.arg][0]) for s in k.stages if isinstance(s, ir.StoreRow)]
    lines += [body_indent + t for t in row.take() + row_stores]
    elem = Renderer(coords, n_outer=n_out, hoisted=hoisted)
    for e, st in stash.items():  # read back what the last pass left in the output
        elem.expr(ir.Load(st.arg, st.index, k.args[st.arg][0]))
        elem.memo[e] = elem.memo.pop(ir.Load(st.arg, st.index, k.args[st.arg][0]))
    if streamed:
        return lines + c_stream.streamed_loop(k, coords, elem, body_indent)
    if any(isinstance(s, ir.Scan) for s in k.stages):  # a prefix fold: codegen/scan.py
        assert SCAN_RENDERER is not None, "braze.codegen.scan registers the scan renderer when imported"

        def stored(r: Renderer) -> tuple[list[str], str]:
            st = [r.store(s.arg, s.index, s.expr, k.args[s.arg][0]) for s in k.stages if isinstance(s, ir.Store)]
            return r.take() + st, ""
        every = [j for j, s in enumerate(k.stages) if isinstance(s, ir.Scan)]
        return lines + [body_indent + t for t in SCAN_RENDERER(k, coords, n_out, elem.hoisted, every, stored)]
    stores = [elem.store(s.arg, s.index, s.expr, k.args[s.arg][0], s.at) for s in k.stages if isinstance(s, ir.Store)]
    if stores:
        lines += inner_loop(elem.take() + stores)
    return lines


def row_coords(outer: tuple[int, ...], indent: str) -> list[str]:
    """The outer coordinates ``o{i}`` of row ``row``."""
    lines = []
    rest = "row"
    for i in range(len(outer) - 1, -1, -1):
        lines.append(f"{indent}const int64_t o{i} = {rest} % {outer[i]};")
        if i:
            lines.append(f"{indent}const int64_t q{i} = {rest} / {outer[i]};")
            rest = f"q{i}"
    return lines


def _pointers(args: list[tuple[DType, bool]] | tuple[tuple[DType, bool], ...], first: int = 0,
              at: int | None = None) -> list[str]:
    """The typed pointer of each argument, named from ``a{first}``, read from
    ``args[at]`` on (``at`` defaults to ``first``)."""
    lines = []
    for i, (d, written) in enumerate(args):
        const = "" if written else "const "
        lines.append(f"    {const}{CTYPE[d.name]} *restrict a{first + i} = "
                     f"({const}{CTYPE[d.name]} *)args[{(first if at is None else at) + i}];")
    return lines


def _prologue_source(k: ir.QLinear, name: str) -> str:
    """``{name}_pro``, the group computing x (``quant.h``'s ``braze_qpro_fn``): its
    kernel body for row ``row`` alone, argument 0 being the row of x it fills."""
    p = k.prologue
    assert p is not None
    first = 1 + k.weights + _epilogue_args(k)  # its argument 1 in the matmul's list
    lines = [f"static void {name}_pro(void **args, int64_t row, float *restrict xr) {{",
             "    float *restrict a0 = xr;", *_pointers(p.args[1:], 1, first)]
    hoisted = _hoist(p, lines)
    return "\n".join(lines + _row_source(p, hoisted, "    ", False) + ["}"]) + "\n"


def _epilogue_args(k: ir.QLinear) -> int:
    """How many of a quantized matmul's ``args`` are its epilogue's (its prologue's follow)."""
    return len(k.args) - (len(k.prologue.args) - 1 if k.prologue else 0)


def _epilogue_source(k: ir.QLinear, name: str) -> str:
    """``{name}_ep``, what a quantized matmul stores (``quant.h``'s ``braze_qep_fn``):
    the epilogue's stores for every (r, j) of the block it is given, weight i's sum
    read from ``acc[i]`` as ``c{i}``."""
    first = 1 + k.weights
    lines = [f"static void {name}_ep(void **args, int64_t r0, int64_t nr, int64_t j0, int64_t nj, "
             "float *const *acc, int64_t ldc) {", *_pointers(k.args[:_epilogue_args(k)], first)]
    r = Renderer(["r", "j"], acc="c{}", n_outer=1)
    stores = [r.store(s.arg, s.index, s.expr, k.args[s.arg - first][0]) for s in k.epilogue]
    sums = [f"const float c{i} = acc[{i}][(r - r0) * ldc + (j - j0)];" for i in range(k.weights)]
    lines += ["    for (int64_t r = r0; r < r0 + nr; r++) {", "        #pragma omp simd",
              "        for (int64_t j = j0; j < j0 + nj; j++) {", *("            " + t for t in sums + r.take() + stores),
              "        }", "    }", "}"]
    return "\n".join(lines) + "\n"


def module_source(kernel_sources: list[str]) -> str:
    """One C translation unit holding the given kernels' sources."""
    return "\n".join([header("cmath.h"), header("tile.h"), PRELUDE, checks.PRELUDE, qlib.declarations(kernel_sources)]
                     + kernel_sources) + "\n"

