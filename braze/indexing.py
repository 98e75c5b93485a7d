"""Indexing: ``x[...]`` and ``x[...] = v``.

Basic indices (ints, slices, None, Ellipsis) are views: a new Layout, nothing recorded.
Advanced indices (int tensors, boolean masks) become gathers and scatters."""

from __future__ import annotations

import builtins as _b
from typing import Any

import numpy as np

from . import dtypes as dt
from .composites import index_copy_rows
from .creation import tensor
from .errors import DimOutOfRange, DtypeMismatch, IndexOutOfRange, ShapeMismatch, Unsupported
from .functions import index_select, where
from .promotion import check_cast
from .stream import stream_of
from .tensor import Tensor, _broadcast_to, _check_writable, _scalar_to

# -- indexing ----------------------------------------------------------------------------------

_BASIC = (slice, int, type(None), type(Ellipsis))


def _expand_index(x: Tensor, index: Any) -> tuple[Any, ...]:
    if not isinstance(index, tuple):
        index = (index,)
    if _b.all(type(i) in _BASIC for i in index):  # the common case, counted in one pass
        n_real = _b.sum(1 for i in index if i is not None and i is not Ellipsis)
        n_ell = index.count(Ellipsis)
        if n_ell == 0 and n_real <= x.ndim:
            return index
        if n_ell == 1 and n_real <= x.ndim:
            pos = index.index(Ellipsis)
            return index[:pos] + (slice(None),) * (x.ndim - n_real) + index[pos + 1:]
    n_real = _b.sum(1 for i in index if i is not None and i is not Ellipsis and not (
        isinstance(i, Tensor) and i.dtype is dt.bool_) and not isinstance(i, bool))
    n_real += _b.sum(i.ndim for i in index if isinstance(i, Tensor) and i.dtype is dt.bool_)
    if _b.sum(1 for i in index if i is Ellipsis) > 1:
        raise Unsupported("__getitem__", "only one ellipsis is allowed")
    if n_real > x.ndim:
        raise DimOutOfRange("__getitem__", n_real - 1, x.ndim, f"too many indices ({n_real}) for a tensor of rank {x.ndim}")
    if Ellipsis in [i for i in index if not isinstance(i, Tensor)]:
        pos = [k for k, i in enumerate(index) if i is Ellipsis and not isinstance(i, Tensor)][0]
        index = index[:pos] + (slice(None),) * (x.ndim - n_real) + index[pos + 1:]
    return index


def _getitem(x: Tensor, index: Any) -> Tensor:
    """Basic indexing is a view; one integer-tensor (or list) index becomes
    ``index_select``; a bool mask needs its data, so it is a sync point."""
    index = _expand_index(x, index)
    lay = x._layout
    # The storage ``lay`` indexes: x's, until a mask's flatten has to copy (an expanded
    # or transposed view cannot always be flattened in place).
    storage = x._storage
    dim = 0
    advanced: list[tuple[int, Tensor]] = []
    for item in index:
        if item is None:
            lay = lay.unsqueeze(dim)
            dim += 1
        elif isinstance(item, (bool, np.bool_)):
            raise Unsupported("__getitem__", "indexing with a Python bool is not supported")
        elif isinstance(item, (int, np.integer)):
            n = lay.shape[dim]
            if not -n <= item < n:
                raise IndexOutOfRange("__getitem__", int(item), n, dim)
            lay = lay.select(dim, int(item) % n)
        elif isinstance(item, slice):
            if item.start is None and item.stop is None and item.step is None:
                dim += 1  # a full slice (``...`` expands to them): the same layout
                continue
            n = lay.shape[dim]
            step = 1 if item.step is None else int(item.step)
            if step <= 0:
                raise Unsupported("__getitem__", f"slice step must be positive, got {step}")
            start, stop, _ = slice(item.start, item.stop, 1).indices(n)
            lay = lay.slice(dim, start, _b.max(start, stop), step)
            dim += 1
        elif isinstance(item, (Tensor, list, np.ndarray)):
            # An empty list is an empty index, not an empty float tensor (as PyTorch).
            t = item if isinstance(item, Tensor) else tensor(item, dtype=dt.int64 if isinstance(item, list) and
                                                             not item else None)
            if t.dtype is dt.bool_:
                if t.shape != lay.shape[dim:dim + t.ndim]:
                    raise ShapeMismatch("__getitem__", [lay.shape, t.shape], "bool mask shape must match the indexed dims")
                nz = np.flatnonzero(t.numpy().reshape(-1))
                merged = Tensor(storage, lay).flatten(dim, dim + t.ndim - 1) if t.ndim else Tensor(storage, lay).unsqueeze(dim)
                storage, lay = merged._storage, merged._layout
                advanced.append((dim, tensor(nz.astype(np.int64))))
            else:
                if not t.dtype.is_integer:
                    raise DtypeMismatch("__getitem__", [t.dtype], "index tensors must be integer or bool")
                advanced.append((dim, t))
            dim += 1
        else:
            raise Unsupported("__getitem__", f"cannot index with {type(item).__name__}")
    out = Tensor(storage, lay)
    if not advanced:
        return out
    if len(advanced) > 1:
        raise Unsupported("__getitem__", "more than one tensor index (advanced indexing) is not supported yet")
    d, idx = advanced[0]
    if idx.dtype is not dt.int64:
        idx = idx.to(dt.int64)
    n = out.shape[d]
    if idx._storage.realized and idx.numel():
        vals = idx.numpy()
        if vals.min() < -n or vals.max() >= n:
            bad = int(vals.min()) if vals.min() < -n else int(vals.max())
            raise IndexOutOfRange("__getitem__", bad, n, d)
        if vals.min() < 0:
            idx = tensor(np.where(vals < 0, vals + n, vals))
    elif idx.numel():
        # Indices not computed yet: PyTorch accepts negative ones in ``x[idx]``, so wrap
        # them on the stream too; values out of range are found when the stream runs.
        idx = where(idx < 0, idx + n, idx)
    flat = idx.reshape(-1)
    sel = index_select(out, d, flat)
    return sel.reshape(out.shape[:d] + idx.shape + out.shape[d + 1:])


def _setitem(x: Tensor, index: Any, value: Any) -> None:
    """``x[idx] = value``: a basic index writes through a view; a bool mask with a
    scalar writes the whole tensor through ``where``; a bool mask with a tensor of
    values, or an integer-tensor index, writes the selected rows one by one (both read
    the index data, so they are sync points). As in PyTorch, ``value`` broadcasts to
    the shape ``x[idx]`` has, and is cast to x's dtype where PyTorch's ``can_cast``
    allows (a float into an int tensor is refused). The call is atomic: an error records nothing."""
    _check_writable("__setitem__", x)
    if isinstance(value, Tensor):
        check_cast("__setitem__", value.dtype, x.dtype)
    items = index if isinstance(index, tuple) else (index,)
    if not _b.any(isinstance(i, (Tensor, list, np.ndarray)) for i in items):
        x[index].copy_(value)
        return
    with stream_of(x.device).atomic():
        _setitem_advanced(x, items, value)


def _setitem_advanced(x: Tensor, items: tuple[Any, ...], value: Any) -> None:
    if len(items) == 1 and isinstance(items[0], Tensor) and items[0].dtype is dt.bool_:
        mask = items[0]
        if mask.ndim > x.ndim or mask.shape != x.shape[:mask.ndim]:
            raise ShapeMismatch("__setitem__", [x.shape, mask.shape], "a bool mask must match the leading dims it indexes")
        if not isinstance(value, Tensor) or value.ndim == 0:
            v = value if isinstance(value, Tensor) else _scalar_to("__setitem__", value, x.dtype)
            if v.dtype is not x.dtype:
                v = v.to(x.dtype)
            # The mask covers x's leading dims (PyTorch), so it broadcasts over the rest.
            m = mask._view(mask._layout.view(mask.shape + (1,) * (x.ndim - mask.ndim)) or mask._layout)
            x.copy_(where(_broadcast_to("__setitem__", m, x.shape), v, x))
            return
        # Values fill the selected positions in order: that needs the mask's data.
        flat = np.flatnonzero(mask.numpy().reshape(-1))
        rows = [tuple(int(i) for i in np.unravel_index(f, mask.shape)) for f in flat]
        depth = mask.ndim
    else:
        idx = items[0] if isinstance(items[0], Tensor) else tensor(items[0])
        if len(items) != 1 or not idx.dtype.is_integer or idx.ndim != 1:
            raise Unsupported("__setitem__", "only x[bool_mask] = v, x[int_index_1d] = v and basic indexing are supported")
        if x.ndim == 0:
            raise DimOutOfRange("__setitem__", 0, 0, "a 0-d tensor cannot be indexed by a tensor")
        _setitem_rows(x, idx, value)
        return
    if isinstance(value, Tensor):
        value = _broadcast_to("__setitem__", value, (len(rows),) + x.shape[depth:])
    for k, row in enumerate(rows):
        x[row].copy_(value[k] if isinstance(value, Tensor) else value)


def _setitem_rows(x: Tensor, idx: Tensor, value: Any) -> None:
    """``x[idx] = value`` for a 1-d integer ``idx``: a scatter (``index_copy_``), which
    reads the index when it runs, so new values written into ``idx`` replay one plan.
    Negative indices count from the end, as in PyTorch: known ones are wrapped now,
    pending ones on the stream."""
    n = x.shape[0]
    if idx._storage.realized and not idx._storage.producer and idx.numel():
        vals = idx.numpy()
        if vals.min() < -n or vals.max() >= n:
            raise IndexOutOfRange("__setitem__", int(vals.min() if vals.min() < -n else vals.max()), n, 0)
        if vals.min() < 0:
            idx = tensor((vals % n).astype(np.int64))
    elif idx.numel():
        idx = where(idx < 0, idx + n, idx)
    if not isinstance(value, Tensor):
        value = _scalar_to("__setitem__", value, x.dtype)
    value = _broadcast_to("__setitem__", value, idx.shape + x.shape[1:])
    index_copy_rows(x, 0, idx, value)


setattr(Tensor, "__getitem__", _getitem)
setattr(Tensor, "__setitem__", _setitem)
