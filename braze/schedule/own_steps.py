"""Nodes that become kernel steps of their own rather than members of a fused group.

Braze's library kernels (a quantized matmul, embedding rows in a file's type, top-k of
a small k) and in-place writes that no group stores (a copy kernel, a scatter at
checked rows): each settles first (``Scheduler.settle``: the groups whose results it
reads close; every open group for a write) and appends one ``KernelStep``. Each
returns False where its kernel cannot take the node, which then runs as an extern
step. Called by ``fuse.Scheduler.run``.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import Any

from .. import dtypes as dt
from .. import ir
from ..codegen import quant as quant_kernels
from ..codegen import topk as topk_kernels
from . import epilogue
from .debug import refuse
from .group import KernelStep, affine

Scheduler = Any  # fuse.Scheduler, which calls this module (it imports it)


def qlinear(s: Scheduler, i: int, node: Any) -> bool:
    """A quantized matmul: a kernel step (``ir.QLinear``) after the groups that
    produce its inputs, pending until a group that reads its result closes and may
    take it as its epilogue (``epilogue.py``); False (an extern step) where the
    kernel cannot read the operands in place."""
    (x, w), y = node.inputs, node.outputs[0]
    qtype = node.attrs["qtype"]
    xl, wl = x.layout, w.layout
    m, k = xl.shape
    n = wl.shape[0]
    why = ""
    if not quant_kernels.supported(qtype):
        why = f"no quantized matmul kernel for {qtype}"
    elif k > 1 and xl.strides[1] != 1 or k > 1 and wl.strides[1] != 1:
        why = "x and w need contiguous rows"
    elif m * n == 0 or k == 0:
        why = "an empty product"
    if why:
        refuse(node, why + ": runs as an extern step")  # plan.py says so on stderr, once
        return False
    s.settle(node)
    wd = w.storage.dtype
    ref = [None if o.storage.array is None else (i, j) for j, o in enumerate(node.inputs)]
    kernel = epilogue.plain(qtype, m, n, k, lda=xl.strides[0] if m > 1 else k, ldw=wd.nbytes(wl.strides[0]),
                            xoff=0 if ref[0] else xl.offset, woff=0 if ref[1] else wd.nbytes(wl.offset))
    ky = s.key(y.storage)
    s.materialized.add(ky)
    step = KernelStep(kernel, [s.key(x.storage), s.key(w.storage), ky], [ky], [i], ref + [None])
    s.steps.append(step)
    s.pending[ky] = epilogue.Pending(step, kernel, (s.key(x.storage), xl.offset,
                                                    replace(kernel, epilogue=(), args=(), woff=())))
    return True


def qrows(s: Scheduler, i: int, node: Any) -> bool:
    """Embedding rows of a table in its file's type: a kernel step, when the ids
    exist before the flush (so the recording has checked them)."""
    (w, ids), out = node.inputs, node.outputs[0]
    if ids.storage.array is None or not quant_kernels.supported(node.attrs["qtype"]) \
            or ids.layout.shape[0] > 1 and ids.layout.strides[0] != 1 \
            or w.layout.shape[1] > 1 and w.layout.strides[1] != 1:
        return False  # the kernel reads ids and each table row contiguously
    s.settle(node)
    wd = w.storage.dtype
    kernel = ir.QRows(node.attrs["qtype"], ids.layout.shape[0], w.layout.shape[1], wd.nbytes(w.layout.strides[0]),
                      w.layout.shape[0], ids.storage.dtype.itemsize == 8)
    ko = s.key(out.storage)
    s.materialized.add(ko)
    s.steps.append(KernelStep(kernel, [s.key(w.storage), s.key(ids.storage), ko], [ko], [i],
                              [(i, 0), (i, 1), None]))
    return True


def topk(s: Scheduler, i: int, node: Any) -> bool:
    """``topk`` of small k: a kernel step of its own (``ir.TopK``) after the group
    that computes x; False (an extern step, numpy's sort) for a large k."""
    (x,), (vals, idx) = node.inputs, node.outputs
    k, d = node.attrs["k"], node.attrs["dim"]
    shape = x.layout.shape
    if not shape or not 0 < k <= topk_kernels.MAX_K or vals.layout.strides != idx.layout.strides:
        refuse(node, f"top-{k}: runs as an extern step (kernels take 1 <= k <= {topk_kernels.MAX_K})")
        return False
    s.settle(node)
    rest = [a for a in range(len(shape)) if a != d]
    kernel = ir.TopK(k, node.attrs["largest"], x.storage.dtype, tuple(shape[a] for a in rest),
                     tuple(x.layout.strides[a] for a in rest), shape[d], x.layout.strides[d],
                     tuple(vals.layout.strides[a] for a in rest), vals.layout.strides[d])
    kv, ki = s.key(vals.storage), s.key(idx.storage)
    s.materialized.update((kv, ki))
    s.steps.append(KernelStep(kernel, [s.key(x.storage), kv, ki], [kv, ki], [i], [(i, 0), None, None]))
    return True


def assign(s: Scheduler, i: int, node: Any) -> bool:
    """An in-place copy (``x[i] = v``, a KV cache write) into another storage of
    the same dtype: a copy kernel of its own, after every open group closes (as an
    extern write does). The target's offset is given at run time (``refs`` names
    the output operand as -1), so a write at a moving position replays one plan."""
    (src,), (dst,) = node.inputs, node.outputs
    shape = dst.layout.shape
    if (src.storage is dst.storage or src.layout.shape != shape or not shape or prod(shape) == 0
            or src.storage.dtype is not dst.storage.dtype or (dst.storage.array is None and s.library)
            or dst.storage.dtype.is_block):
        # A block tensor's bytes are copied by the reference (numpy). A target made in
        # this flush is too on the CPU; the Triton target has no reference to fall back
        # on, and writes it as any other (its producer stores it: the write reads it).
        return False
    s.settle(node)  # a write: closes every open group first
    nd = len(shape)
    dims = tuple(range(nd))
    si = affine(src.layout, dims, nd)
    di = affine(dst.layout, dims, nd)
    src_ref = None if src.storage.array is None else (i, 0)
    if src_ref is not None:
        si = ir.Affine(0, si.coeffs)
    di = ir.Affine(0, di.coeffs)
    d = dst.storage.dtype
    kernel = ir.Kernel(shape[:-1], shape[-1:], [ir.Store(1, di, ir.Load(0, si, d))], [(d, False), (d, True)])
    s.steps.append(KernelStep(kernel, [s.key(src.storage), s.key(dst.storage)], [], [i],
                              [src_ref, (i, -1)]))
    return True


def scatter(s: Scheduler, i: int, node: Any) -> bool:
    """``x.index_copy_(dim, index, source)`` (``x[index] = v``): a kernel over the
    source's elements, each stored at its row ``index[r]`` of x along ``dim``
    (``ir.Store.at``, the index checked: ``codegen/scatter.py``), after every open
    group closes (a write). O(source), where the reference rewrites x whole. x's
    offset, the index's and (when it exists before the flush) the source's are given
    at run time, so new slots and a moving target replay one plan."""
    (dst, idx, src), d = node.inputs, node.attrs["dim"]
    shape = src.layout.shape
    if (dst.storage.array is None or dst.storage.dtype.is_block or not shape or prod(shape) == 0
            or dst.layout.shape[d] == 0 or src.storage is dst.storage or idx.storage is dst.storage):
        return False  # a pending or block target, nothing to store, or an aliased source: the reference
    s.settle(node)
    # the row's dims (after d), merged where both source and target walk them as one
    inner: list[tuple[int, int, int]] = []  # (extent, source stride, target stride)
    for n, ss, ds in zip(shape[d + 1:], src.layout.strides[d + 1:], dst.layout.strides[d + 1:]):
        if inner and inner[-1][1] == ss * n and inner[-1][2] == ds * n:
            inner[-1] = (inner[-1][0] * n, ss, ds)
        elif n != 1:
            inner.append((n, ss, ds))
    outer = shape[:d + 1]
    nd = d + 1 + len(inner)
    refs = [None if o.storage.array is None else (i, j) for j, o in ((1, idx), (2, src))]
    ii = affine(idx.layout, (d,), nd)
    si = ir.Affine(src.layout.offset, affine(src.layout, range(d + 1), nd).coeffs[:d + 1] + tuple(t[1] for t in inner))
    ii, si = (ir.Affine(0, a.coeffs) if r else a for a, r in zip((ii, si), refs))
    coeffs = list(affine(dst.layout, range(d + 1), nd).coeffs[:d + 1]) + [t[2] for t in inner]
    coeffs[d] = 0
    row = ir.Load(1, ii, idx.storage.dtype)
    row64 = row if row.dtype is dt.int64 else ir.Op("cast", (row,), dt.int64)
    at = ((ir.checked(row64, dst.layout.shape[d], i, "index_copy", d), dst.layout.strides[d]),)
    dt_ = dst.storage.dtype
    store = ir.Store(2, ir.Affine(0, tuple(coeffs)), ir.Load(0, si, dt_), at)
    stages, checks = ir.numbered_checks([store])
    kernel = ir.Kernel(outer, tuple(t[0] for t in inner), stages,
                       [(dt_, False), (idx.storage.dtype, False), (dt_, True)], checks)
    s.steps.append(KernelStep(kernel, [s.key(o.storage) for o in (src, idx, dst)], [], [i],
                              [refs[1], refs[0], (i, -1)]))
    return True
