"""The element loops of a row that scans (``ir.Scan``: ``cumsum``), in blocks of
``BLOCK`` elements: per scan, in stage order, a vectorised loop computes its input into
a stack buffer (a scan may read an earlier one's values), then a short sequential loop
turns the buffer into the running fold; a last vectorised loop does the stores, each
scan's value read from its buffer. Only the prefix itself runs in order: with the
whole loop in order, the element work (softmax's exp before top-p's cumsum) did not
vectorise and the kernel was slower than the softmax kernel plus numpy's cumsum.
"""

from __future__ import annotations

from .. import ir
from . import c as _c

BLOCK = 256


def loops(k: ir.Kernel, coords: list[str], n_out: int, hoisted: dict[ir.Expr, str]) -> list[str]:
    i, n = coords[-1], k.inner[-1]  # a scan's row is its one inner loop
    out = []
    scans = [(j, s) for j, s in enumerate(k.stages) if isinstance(s, ir.Scan)]
    for j, s in scans:
        out.append(f"{_c.vtype(s.dtype)} acc{j} = {_c._reduce_init(s.op, s.dtype)};")
    out.append(f"for (int64_t b = 0; b < {n}; b += {BLOCK}) {{")
    out.append(f"    const int64_t e = b + {BLOCK} < {n} ? b + {BLOCK} : {n};")
    done: dict[ir.Expr, str] = {}
    for j, s in scans:
        v = _c.vtype(s.dtype)
        r = _c.Renderer(coords, n_outer=n_out, hoisted=hoisted)
        r.memo.update(done)
        x = r.expr(s.expr)
        out += [f"    {v} sb{j}[{BLOCK}];", "    #pragma omp simd", f"    for (int64_t {i} = b; {i} < e; {i}++) {{"]
        out += ["        " + t for t in r.take()] + [f"        sb{j}[{i} - b] = (({v}){x});", "    }"]
        out += [f"    for (int64_t {i} = b; {i} < e; {i}++) {{ "
                + _c._reduce_update(s.op, f"acc{j}", f"sb{j}[{i} - b]", s.dtype) + f" sb{j}[{i} - b] = acc{j}; }}"]
        done[ir.Acc(j, s.dtype)] = f"sb{j}[{i} - b]"
    r = _c.Renderer(coords, n_outer=n_out, hoisted=hoisted)
    r.memo.update(done)
    stores = [r.store(s.arg, s.index, s.expr, k.args[s.arg][0]) for s in k.stages if isinstance(s, ir.Store)]
    out += ["    #pragma omp simd", f"    for (int64_t {i} = b; {i} < e; {i}++) {{"]
    out += ["        " + t for t in r.take() + stores] + ["    }", "}"]
    return out


_c.SCAN_RENDERER = loops  # codegen/c.py renders a scanning row's loops through this module
