"""Top-k kernels (``ir.TopK``): per row, a sorted buffer of the k best (value, index)
pairs, filled while the row is walked once in order. An element enters only when it is
strictly better than the buffer's last, and moves up past strictly worse ones, so
equal elements keep their order in the row (the earlier first) and nan counts as the
largest: the order of the reference's stable sort. Rows run in parallel. For small k
(``MAX_K``) the buffer stays in registers and L1; numpy sorts the whole row instead.
"""

from __future__ import annotations

from .. import dtypes as dt
from .. import ir
from . import c as _c
from .c_expr import CTYPE, vtype
from .quant import bind_sizes

MAX_K = 16


def _better(k: ir.TopK, a: str, b: str) -> str:
    """C for "``a`` comes before ``b``" (strictly)."""
    if not k.dtype.is_floating_point:
        return f"({a} {'>' if k.largest else '<'} {b})"
    if k.largest:
        return f"(({a} > {b}) || ({a} != {a} && {b} == {b}))"
    return f"(({a} < {b}) || ({b} != {b} && {a} == {a}))"


def source(k: ir.TopK, name: str, sizes: int = 0) -> str:
    t, v = CTYPE[k.dtype.name], vtype(k.dtype)
    load = {dt.float16: "braze_h2f", dt.bfloat16: "braze_b2f"}.get(k.dtype, f"({v})")
    store = {dt.float16: "braze_f2h", dt.bfloat16: "braze_f2b"}.get(k.dtype, f"({t})")
    rows = 1
    for n in k.outer:
        rows = rows * n
    enters, moves = _better(k, "e", f"bv[{k.k - 1}]"), _better(k, "e", "bv[p - 1]")
    place = []
    for i in range(len(k.outer) - 1, -1, -1):
        place += [f"        {{ const int64_t o = rest % {k.outer[i]}; rest /= {k.outer[i]}; "
                  f"xo += o * {k.xstrides[i]}; oo += o * {k.ostrides[i]}; }}"]
    lines = [
        f"void {name}(void **args, int64_t nthreads) {{",
        f"    const {t} *restrict x = (const {t} *)args[0];",
        f"    {t} *restrict vo = ({t} *)args[1];",
        "    int64_t *restrict io = (int64_t *)args[2];",
        *bind_sizes(3, sizes),
        f"    #pragma omp parallel for num_threads(nthreads) if(nthreads > 1 && {rows} * {k.n} > 32768) schedule(static)",
        f"    for (int64_t row = 0; row < {rows}; row++) {{",
        "        int64_t rest = row, xo = 0, oo = 0; (void)rest;",
        *place,
        f"        {v} bv[{k.k}]; int64_t bi[{k.k}]; int64_t cnt = 0;",
        f"        for (int64_t j = 0; j < {k.n}; j++) {{",
        f"            const {v} e = {load}(x[xo + j * {k.xstride}]);",
        f"            if (cnt == {k.k} && !{enters}) continue;",
        f"            int64_t p = cnt < {k.k} ? cnt++ : {k.k - 1};",
        f"            while (p > 0 && {moves}) {{ bv[p] = bv[p - 1]; bi[p] = bi[p - 1]; p--; }}",
        "            bv[p] = e; bi[p] = j;",
        "        }",
        f"        for (int64_t q = 0; q < {k.k}; q++) {{",
        f"            vo[oo + q * {k.ostride}] = {store}(bv[q]); io[oo + q * {k.ostride}] = bi[q];",
        "        }",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


_c.TOPK_RENDERER = source  # codegen/c.py renders top-k kernels through this module
