"""The walks of a row that scans (``ir.Scan``: ``cumsum``), in blocks of ``BLOCK``
elements: per scan, in stage order, a vectorised loop computes its input into a stack
buffer (a scan may read an earlier one's values), then a short sequential loop turns
the buffer into the running fold; a last vectorised loop does what the walk is for,
each scan's value read from its buffer: the stores, or the folds of a pass of
reductions that read scanned values (top-p's renormalising sum). Each such walk scans
again (in cache: a row is read once from memory while it fits). Only the prefix itself
runs in order: with the whole loop in order, the element work (softmax's exp before
top-p's cumsum) did not vectorise and the kernel was slower than the softmax kernel
plus numpy's cumsum.
"""

from __future__ import annotations

from typing import Callable

from .. import ir
from . import c as _c
from .c_expr import Renderer, vtype
from .c_reduce import reduce_init, reduce_update

BLOCK = 256

#: what a walk does with each block, its scans' values in scope: the loop body and the
#: clauses of its ``omp simd`` (a pass's reductions), given the body's renderer
Last = Callable[[Renderer], tuple[list[str], str]]


def loops(k: ir.Kernel, coords: list[str], n_out: int, hoisted: dict[ir.Expr, str], stages: list[int],
          last: Last) -> list[str]:
    """One walk over the row (in a C block of its own), computing the Scan ``stages``."""
    i, n = coords[-1], k.inner[-1]  # a scan's row is its one inner loop
    out = []
    scans = [(j, s) for j, s in enumerate(k.stages) if j in stages and isinstance(s, ir.Scan)]
    for j, s in scans:
        out.append(f"{vtype(s.dtype)} acc{j} = {reduce_init(s.op, s.dtype)};")
    out.append(f"for (int64_t b = 0; b < {n}; b += {BLOCK}) {{")
    out.append(f"    const int64_t e = b + {BLOCK} < {n} ? b + {BLOCK} : {n};")
    done: dict[ir.Expr, str] = {}
    for j, s in scans:
        v = vtype(s.dtype)
        r = Renderer(coords, n_outer=n_out, hoisted=hoisted)
        r.memo.update(done)
        x = r.expr(s.expr)
        out += [f"    {v} sb{j}[{BLOCK}];", "    #pragma omp simd", f"    for (int64_t {i} = b; {i} < e; {i}++) {{"]
        out += ["        " + t for t in r.take()] + [f"        sb{j}[{i} - b] = (({v}){x});", "    }"]
        out += [f"    for (int64_t {i} = b; {i} < e; {i}++) {{ "
                + reduce_update(s.op, f"acc{j}", f"sb{j}[{i} - b]", s.dtype) + f" sb{j}[{i} - b] = acc{j}; }}"]
        done[ir.Acc(j, s.dtype)] = f"sb{j}[{i} - b]"
    r = Renderer(coords, n_outer=n_out, hoisted=hoisted)
    r.memo.update(done)
    body, clauses = last(r)
    out += [f"    #pragma omp simd{clauses}", f"    for (int64_t {i} = b; {i} < e; {i}++) {{"]
    out += ["        " + t for t in body] + ["    }", "}"]
    return ["{"] + ["    " + t for t in out] + ["}"]


_c.SCAN_RENDERER = loops  # codegen/c.py renders a scanning row's loops through this module
