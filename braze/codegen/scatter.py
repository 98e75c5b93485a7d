"""Scatters: stores at data-dependent rows (``ir.Store.at``; ``index_copy_``,
``x[idx] = v``, a paged KV cache's write).

A scatter's indices are checked as a gather's are (``ir.checked``, ``checks.py``), but
a bad index must store nothing, where a gather's reads at 0: before its rows run in
parallel the kernel walks every row's index once (a serial pass over the rows' checks,
which are constant along each row: a few dozen ids per decoding step) and returns
if any failed, so an out-of-range slot leaves the target as it was and the runtime
raises ``IndexOutOfRange``, as the reference does before it writes. The stores
themselves then go through the same ``braze_checked`` (in range by construction):
never a write outside the target.
"""

from __future__ import annotations

from math import prod

from .. import ir
from . import c as _c
from . import checks
from .c_expr import Renderer


def scatters(k: ir.Kernel) -> bool:
    return any(isinstance(st, ir.Store) and st.at for st in k.stages)


def prepass(k: ir.Kernel, hoisted: dict[ir.Expr, str]) -> list[str]:
    """The serial pass over the rows' index checks of a scattering kernel, and its
    early return (nothing for a kernel that does not scatter)."""
    if not scatters(k):
        return []
    n_out = len(k.outer)
    coords = [f"o{i}" for i in range(n_out)] + [f"i{i}" for i in range(len(k.inner))]
    r = Renderer(coords, prefix="g", n_outer=n_out, hoisted=hoisted)
    names = [r.expr(c) for c in checks.row_checks(k, n_out)]
    # the scheduler reads a scatter's index along an outer coordinate only
    assert all(not ir.uses_inner(i, n_out) for st in k.stages if isinstance(st, ir.Store) for i, _ in st.at)
    body = _c.row_coords(k.outer, "        ") + ["        " + t for t in r.take()]
    body += [f"        (void){n};" for n in names]
    return ([f"    for (int64_t row = 0; row < {prod(k.outer)}; row++) {{"] + body + ["    }"]
            + [f"    if (err[{2 * c}]) return;" for c in range(len(k.checks))])


_c.SCATTER_PREPASS = prepass
