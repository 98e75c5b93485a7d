"""Streaming (non-temporal) stores: whether a kernel's operands fill the last-level
cache, so its element stores should go around it, and the element loops that then
compute each block into a stack buffer and stream it out (``c.py`` chooses).
"""

from __future__ import annotations

from math import prod
from pathlib import Path

from .. import ir
from .c_expr import CTYPE, Renderer


STREAM_BLOCK = 256  # elements of the innermost loop computed into a stack buffer, then streamed out


def llc_bytes() -> int:
    """The size of the largest cache Linux lists for cpu0 (the last level), else 32 MiB."""
    global _LLC
    if _LLC is None:
        sizes = []
        for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
            try:
                text = f.read_text().strip().upper()
                sizes.append(int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1))
            except (OSError, ValueError):
                pass
        _LLC = max(sizes, default=32 << 20)
    return _LLC


_LLC: int | None = None


def footprint(k: ir.Kernel) -> int:
    """Bytes of memory the kernel reads and writes: per distinct load or store, the
    elements its index reaches (the extents of the coords it depends on)."""
    extents = k.outer + k.inner
    seen: set[tuple[int, ir.Affine]] = set()
    total = 0

    def add(arg: int, index: ir.Affine) -> None:
        nonlocal total
        if (arg, index) not in seen:
            seen.add((arg, index))
            total += prod(n for n, c in zip(extents, index.coeffs) if c) * k.args[arg][0].itemsize
    for st in k.stages:
        for e in ir.stage_exprs(st):
            for node in ir.walk(e):
                if isinstance(node, ir.Load):
                    add(node.arg, node.index)
        if isinstance(st, (ir.Store, ir.StoreRow)):
            add(st.arg, st.index)
    return total


def streams(k: ir.Kernel) -> bool:
    """Write this kernel's element stores around the cache (non-temporal stores)?

    When a kernel's operands together fill the last-level cache, its results are
    evicted before a later kernel could read them from there, and a normal store's read
    of each line it is about to overwrite is wasted bandwidth. Measured on the 2-core
    EPYC (32 MiB L3): an element-wise kernel writing 16 MiB from a 16 MiB input takes
    0.83x the time with streaming stores (0.87-0.92x counting a consumer reading the
    result back), while writing 8 MiB it takes 1.0-1.2x (1.25-1.45x with the consumer).
    Only where every store is contiguous along the innermost loop, and no written
    argument is read: writes are deferred to the end of each block, which must not
    change what a later element of the block reads (an in-place op).
    """
    return may_stream(k) and footprint(k) >= llc_bytes()


def may_stream(k: ir.Kernel) -> bool:
    """Could this kernel's stores stream (every store contiguous along the innermost
    loop, no written argument read)? Whether they should is a matter of size."""
    stores = [s for s in k.stages if isinstance(s, ir.Store)]
    if not stores or not k.inner or any(s.index.coeffs[-1] != 1 or s.at for s in stores) \
            or any(isinstance(s, ir.Scan) for s in k.stages):
        return False
    for st in k.stages:
        for e in ir.stage_exprs(st):
            if any(isinstance(n, ir.Load) and k.args[n.arg][1] for n in ir.walk(e)):
                return False
    return True


def streamed_loop(k: ir.Kernel, coords: list[str], elem: Renderer, ind: str) -> list[str]:
    """The element loops of a kernel whose stores stream (``streams``): the innermost
    loop runs in blocks of ``STREAM_BLOCK``, each computing its values into a stack
    buffer per store (a vectorised loop, as ever), which ``braze_stream`` then copies
    out with non-temporal stores."""
    n_out, n_in = len(k.outer), len(k.inner)
    stores = [s for s in k.stages if isinstance(s, ir.Store)]
    values = [elem.stored(s.expr, k.args[s.arg][0]) for s in stores]
    temps = elem.take()
    out = []
    for j, size in enumerate(k.inner[:-1]):
        out.append(f"{ind}for (int64_t i{j} = 0; i{j} < {size}; i{j}++) {{")
        ind += "    "
    last, size = f"i{n_in - 1}", k.inner[-1]
    # a generic kernel's row may be any length: its blocks are always full-sized buffers
    block = STREAM_BLOCK if isinstance(size, ir.Size) else min(STREAM_BLOCK, size)
    at = Renderer(coords[:-1] + [f"b{n_in - 1}"], n_outer=n_out)  # a store's index at the block's start
    out.append(f"{ind}for (int64_t b{n_in - 1} = 0; b{n_in - 1} < {size}; b{n_in - 1} += {block}) {{")
    ind += "    "
    out.append(f"{ind}const int64_t e{n_in - 1} = b{n_in - 1} + {block} < {size} ? b{n_in - 1} + {block} : {size};")
    out += [f"{ind}{CTYPE[k.args[s.arg][0].name]} sb{n}[{block}];" for n, s in enumerate(stores)]
    out.append(f"{ind}#pragma omp simd")
    out.append(f"{ind}for (int64_t {last} = b{n_in - 1}; {last} < e{n_in - 1}; {last}++) {{")
    out += [f"{ind}    {t}" for t in temps]
    out += [f"{ind}    sb{n}[{last} - b{n_in - 1}] = {v};" for n, v in enumerate(values)]
    out.append(f"{ind}}}")
    out += [f"{ind}braze_stream(&a{s.arg}[{at.index(s.index)}], sb{n}, (e{n_in - 1} - b{n_in - 1}) * "
            f"(int64_t)sizeof(sb{n}[0]));" for n, s in enumerate(stores)]
    for _ in range(n_in):
        ind = ind[:-4]
        out.append(f"{ind}}}")
    return out
