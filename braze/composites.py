"""PyTorch names that are compositions of braze's primitives: ``einsum``, ``outer``,
``baddbmm``, ``flip``, ``roll``, ``repeat_interleave``, ``index_copy``, ``norm``,
``type_as`` and the ``new_*`` constructors, in-place unaries (``rsqrt_``), ``finfo``.

Nothing here records an op of its own (but ``index_copy_``, a scatter): each is the
views, element-wise ops, reductions and matmuls a user would write by hand, so the
fusion compiler sees (and fuses) exactly that. The list at the bottom attaches the method forms to ``Tensor``."""

from __future__ import annotations

import builtins as _b
import math
from typing import Any, Sequence

import numpy as np

from . import dtypes as dt
from .creation import arange, empty, full, tensor, zeros
from .dtypes import DType, as_dtype
from .errors import DtypeMismatch, RankMismatch, ShapeMismatch, Unsupported
from .functions import _check_index_values, abs, amax, amin, cat, index_select, matmul, where
from .layout import normalize_dim, normalize_dims
from .tensor import Tensor, _atomic, _check_tensor

# -- matrix products -------------------------------------------------------------------------


def mm(input: Tensor, mat2: Tensor) -> Tensor:
    if input.ndim != 2 or mat2.ndim != 2:
        raise RankMismatch("mm", 2, input.shape if input.ndim != 2 else mat2.shape)
    return matmul(input, mat2)


def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    if input.ndim != 3 or mat2.ndim != 3:
        raise RankMismatch("bmm", 3, input.shape if input.ndim != 3 else mat2.shape)
    if input.shape[0] != mat2.shape[0]:
        raise ShapeMismatch("bmm", [input.shape, mat2.shape], "batch sizes differ")
    return matmul(input, mat2)


def _scaled_sum(op: str, input: Any, product: Tensor, beta: Any, alpha: Any) -> Tensor:
    """``beta * input + alpha * product``; as in PyTorch, ``beta == 0`` ignores
    ``input`` (nan and inf in it do not propagate)."""
    out = product if alpha == 1 else product * alpha
    if beta == 0:
        return out
    return out + (input if beta == 1 else input * beta)


@_atomic
def baddbmm(input: Any, batch1: Tensor, batch2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _scaled_sum("baddbmm", input, bmm(batch1, batch2), beta, alpha)


@_atomic
def addmm(input: Any, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _scaled_sum("addmm", input, mm(mat1, mat2), beta, alpha)


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    if input.ndim != 1 or vec2.ndim != 1:
        raise RankMismatch("outer", 1, input.shape if input.ndim != 1 else vec2.shape)
    return input.unsqueeze(1) * vec2.unsqueeze(0)


ger = outer


# -- einsum ----------------------------------------------------------------------------------

def _parse_einsum(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ShapeMismatch("einsum", [], f"{equation!r} names {len(terms)} operands, {len(ranks)} given")
    if "." in eq:
        raise Unsupported("einsum", "ellipsis ('...') in the equation is not supported; name every dim")
    for t, r in zip(terms, ranks):
        if not t.isalpha() or len(t) != r:
            raise ShapeMismatch("einsum", [], f"subscripts {t!r} do not name the {r} dims of their operand")
        if len(set(t)) != len(t):
            raise Unsupported("einsum", f"a repeated subscript within one operand ({t!r}: a diagonal) is not supported")
    if not arrow:  # implicit output: the letters used once, in alphabetical order
        letters = "".join(terms)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if not (rhs.isalpha() or rhs == "") or len(set(rhs)) != len(rhs) or _b.any(c not in lhs for c in rhs):
        raise ShapeMismatch("einsum", [], f"output subscripts {rhs!r} must be distinct letters of the inputs")
    return terms, rhs


def _to_order(x: Tensor, sub: str, order: str, sizes: dict[str, int]) -> Tensor:
    """``x`` (dims named by ``sub``) permuted to ``order``'s letters, with dims of size
    1 (broadcast) where ``x`` lacks a letter."""
    x = x.permute(*[sub.index(c) for c in order if c in sub])
    return x.reshape(tuple(sizes[c] if c in sub else 1 for c in order)) if len(sub) != len(order) else x


def _sizes(terms: Sequence[str], operands: Sequence[Tensor]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for t, x in zip(terms, operands):
        for c, n in zip(t, x.shape):
            if sizes.setdefault(c, n) != n:
                raise ShapeMismatch("einsum", [o.shape for o in operands], f"subscript {c!r} has sizes {sizes[c]} and {n}")
    return sizes


def _contract(a: Tensor, sa: str, b: Tensor, sb: str, keep: str, sizes: dict[str, int]) -> tuple[Tensor, str]:
    """Two operands to one whose subscripts are the letters of ``keep`` they have:
    a batched matmul over the letters both have and ``keep`` lacks."""
    summed = "".join(c for c in sa if c in sb and c not in keep)
    if not summed:  # no contraction: a broadcast product
        order = "".join(dict.fromkeys(sa + sb))
        out = _to_order(a, sa, order, sizes) * _to_order(b, sb, order, sizes)
        return out, order
    batch = "".join(c for c in sa if c in sb and c in keep)
    left = "".join(c for c in sa if c not in sb)
    right = "".join(c for c in sb if c not in sa)
    lb = [sizes[c] for c in batch]
    m, k, n = (math.prod(sizes[c] for c in s) for s in (left, summed, right))
    a2 = _to_order(a, sa, batch + left + summed, sizes)
    b2 = _to_order(b, sb, batch + summed + right, sizes)
    out = matmul(a2.reshape(*lb, m, k), b2.reshape(*lb, k, n))
    return out.reshape(*lb, *[sizes[c] for c in left + right]), batch + left + right


@_atomic
def _einsum(equation: str, operands: Sequence[Tensor]) -> Tensor:
    for x in operands:
        _check_tensor("einsum", x)
    terms, rhs = _parse_einsum(equation, [x.ndim for x in operands])
    sizes = _sizes(terms, operands)
    cur, sub = operands[0], terms[0]
    for i in range(1, len(operands)):
        later = "".join(terms[i + 1:]) + rhs
        cur, sub = _contract(cur, sub, operands[i], terms[i], later, sizes)
    drop = [k for k, c in enumerate(sub) if c not in rhs]
    if drop:
        cur = cur.sum(drop)
        sub = "".join(c for c in sub if c in rhs)
    return cur.permute(*[sub.index(c) for c in rhs]) if rhs else cur


def einsum(equation: str, *operands: Any) -> Tensor:
    """``torch.einsum``: the operands as arguments or one list. Pairs that share a
    summed subscript are a batched ``matmul`` (so attention written with einsum is
    a chain kernel); the rest are broadcast products and sums."""
    ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
    if not ops:
        raise ShapeMismatch("einsum", [], "needs at least one operand")
    result: Tensor = _einsum(equation, ops)
    return result


# -- movement built from views and cat ------------------------------------------------------

def flip(input: Tensor, dims: int | Sequence[int]) -> Tensor:
    """Reverse the order along ``dims``: a gather of each dim at ``n-1 .. 0``."""
    out = input
    for d in normalize_dims("flip", dims, input.ndim):
        n = out.shape[d]
        if n > 1:
            out = index_select(out, d, arange(n - 1, -1, -1))
    return out


def roll(input: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
    """``torch.roll``: a cat of the two slices, so a fused consumer reads it as index
    arithmetic. Without ``dims`` the flattened tensor is rolled."""
    if dims is None:
        if not isinstance(shifts, int):
            raise ShapeMismatch("roll", [input.shape], "several shifts need as many dims")
        return roll(input.reshape(-1), shifts, 0).reshape(input.shape)
    sh = [shifts] if isinstance(shifts, int) else list(shifts)
    ds = [dims] if isinstance(dims, int) else list(dims)
    if len(sh) != len(ds):
        raise ShapeMismatch("roll", [input.shape], f"{len(sh)} shifts for {len(ds)} dims")
    out = input
    for s, d in zip(sh, ds):
        d = normalize_dim("roll", d, input.ndim)
        n = out.shape[d]
        s = s % n if n else 0
        if s:
            out = cat([out.narrow(d, n - s, s), out.narrow(d, 0, n - s)], d)
    return out


def repeat_interleave(input: Tensor, repeats: int, dim: int | None = None, *, output_size: int | None = None) -> Tensor:
    """Each element ``repeats`` times in a row along ``dim`` (flattened without it):
    an expanded view, reshaped. Only an int count (a tensor of counts needs its data)."""
    if not isinstance(repeats, int):
        raise Unsupported("repeat_interleave", "repeats must be an int (a tensor of counts is not supported)")
    if repeats < 0:
        raise ShapeMismatch("repeat_interleave", [input.shape], f"repeats must be non-negative, got {repeats}")
    if dim is None:
        return repeat_interleave(input.reshape(-1), repeats, 0)
    d = normalize_dim("repeat_interleave", dim, input.ndim)
    shape = input.shape
    x = input.unsqueeze(d + 1).expand(*shape[:d + 1], repeats, *shape[d + 1:])
    return x.reshape(*shape[:d], shape[d] * repeats, *shape[d + 1:])


def hstack(tensors: Sequence[Tensor]) -> Tensor:
    ts = list(tensors)
    return cat(ts, 0 if ts and ts[0].ndim == 1 else 1)


def vstack(tensors: Sequence[Tensor]) -> Tensor:
    return cat([t.reshape(1, -1) if t.ndim < 2 else t for t in tensors], 0)


# -- writes by index -----------------------------------------------------------------------

def _index_copy_args(input: Tensor, dim: int, index: Tensor, source: Tensor) -> tuple[int, Tensor]:
    """``index_copy``'s checks: its dim, and its index flattened to 1-d."""
    d = normalize_dim("index_copy", dim, input.ndim)
    if index.ndim > 1 or not index.dtype.is_integer:
        raise DtypeMismatch("index_copy", [index.dtype], "index must be a 0-d or 1-d integer tensor")
    idx = index.reshape(-1)
    m = idx.shape[0]
    want = input.shape[:d] + (m,) + input.shape[d + 1:]
    if source.shape != want and not (input.ndim == 0 and source.numel() == m):
        raise ShapeMismatch("index_copy", [input.shape, index.shape, source.shape], f"source must have shape {want}")
    _check_index_values("index_copy", idx, input.shape[d], d)
    return d, idx


@_atomic
def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """``out[..., index[i], ...] = source[..., i, ...]`` along ``dim``, the rest of
    ``input`` kept. Written as a match of each position against the indices (no data
    read, so it fuses and a position that moves replays one plan); as in PyTorch,
    which of several equal indices wins is unspecified (here: their sum). The in-place
    ``index_copy_`` is a scatter instead (``index_copy_rows``)."""
    d, idx = _index_copy_args(input, dim, index, source)
    m, n = idx.shape[0], input.shape[d]
    # hit[p, i]: position p of dim d takes source row i; laid along (.., n, m, ..)
    hit = arange(n, dtype=idx.dtype).unsqueeze(1) == idx.unsqueeze(0)
    hit = hit.reshape((n, m) + (1,) * (input.ndim - d - 1))
    src = source.unsqueeze(d)  # (.., 1, m, ..)
    picked = where(hit, src.to(input.dtype), 0).sum(d + 1)
    return where(hit.any(1), picked, input)


def index_copy_rows(target: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """``target.index_copy_(dim, index, source)``: the ``index_copy`` op, a write into
    ``target``'s storage that the fusion compiler makes a scatter (one kernel over the
    source's elements, each stored at its checked row: O(source), not O(target); a
    paged KV cache's write). Which of equal indices wins is unspecified, as in PyTorch."""
    from .node import Node, Operand
    from .ops.registry import REGISTRY
    from .stream import stream_of
    from .tensor import _check_writable, _same_device
    _check_writable("index_copy_", target)
    _same_device("index_copy_", [target, index, source])
    with stream_of(target.device).atomic():
        d, idx = _index_copy_args(target, dim, index, source)
        if target.ndim == 0:  # one element: nothing to scatter
            return target.copy_(index_copy(target, dim, index, source))
        if idx.dtype not in (dt.int64, dt.int32):
            idx = idx.to(dt.int64)
        if source.dtype is not target.dtype:
            source = source.to(target.dtype)
        node = Node(REGISTRY["index_copy"], tuple(Operand(t._storage, t._layout) for t in (target, idx, source)),
                    (Operand(target._storage, target._layout),), {"dim": d})
        stream_of(target.device).record(node)
    return target


def _index_copy_(self: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    return index_copy_rows(self, dim, index, source)


# -- reductions and clamps -------------------------------------------------------------------

def clamp_min(input: Tensor, min: Any) -> Tensor:
    return input.clamp(min=min)


def clamp_max(input: Tensor, max: Any) -> Tensor:
    return input.clamp(max=max)


@_atomic
def norm(input: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """``torch.norm`` / ``Tensor.norm``: p = 2 (or 'fro'), 1, inf, -inf or another
    positive number, over ``dim`` (all dims by default)."""
    x = input.to(dtype) if dtype is not None else input
    if not x.dtype.is_floating_point:
        raise DtypeMismatch("norm", [x.dtype], "expects a floating dtype")
    if p in ("fro", 2, 2.0):
        return (x * x).sum(dim, keepdim=keepdim).sqrt()
    if p in (1, 1.0):
        return abs(x).sum(dim, keepdim=keepdim)
    if p == math.inf:
        return amax(abs(x), dim, keepdim=keepdim)
    if p == -math.inf:
        return amin(abs(x), dim, keepdim=keepdim)
    if isinstance(p, (int, float)) and p > 0:
        return (abs(x) ** p).sum(dim, keepdim=keepdim) ** (1.0 / p)
    raise Unsupported("norm", f"p={p!r} is not supported (2, 'fro', 1, inf, -inf or a positive number)")


# -- dtypes ----------------------------------------------------------------------------------

class finfo:
    """``torch.finfo(dtype)``: ``min``, ``max``, ``eps``, ``tiny``, ``bits``, ``resolution``."""

    def __init__(self, dtype: Any = None) -> None:
        d = dt.float32 if dtype is None else as_dtype(dtype, "finfo")
        if not d.is_floating_point or d.is_block:
            raise DtypeMismatch("finfo", [d], "expects a floating dtype")
        import ml_dtypes
        info = ml_dtypes.finfo(d.np)
        self.dtype = d
        self.bits = int(info.bits)
        self.min = float(info.min)
        self.max = float(info.max)
        self.eps = float(info.eps)
        self.tiny = self.smallest_normal = float(info.tiny)
        self.resolution = float(info.resolution)


class iinfo:
    """``torch.iinfo(dtype)``: ``min``, ``max``, ``bits``."""

    def __init__(self, dtype: Any) -> None:
        d = as_dtype(dtype, "iinfo")
        if not d.is_integer:
            raise DtypeMismatch("iinfo", [d], "expects an integer dtype")
        info = np.iinfo(d.np)
        self.dtype = d
        self.bits, self.min, self.max = int(info.bits), int(info.min), int(info.max)


# -- methods: casts like another tensor, constructors like this one, in-place unaries --------

def _type_as(self: Tensor, other: Tensor) -> Tensor:
    return self.to(other.dtype)


def _view_as(self: Tensor, other: Tensor) -> Tensor:
    return self.view(other.shape)


def _reshape_as(self: Tensor, other: Tensor) -> Tensor:
    return self.reshape(other.shape)


def _like_dtype(self: Tensor, dtype: Any) -> DType:
    return self.dtype if dtype is None else as_dtype(dtype, "new_*")


def _size_arg(size: tuple[Any, ...]) -> tuple[int, ...]:
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)


def _new_zeros(self: Tensor, *size: Any, dtype: Any = None, device: Any = None) -> Tensor:
    return zeros(_size_arg(size), dtype=_like_dtype(self, dtype))


def _new_ones(self: Tensor, *size: Any, dtype: Any = None, device: Any = None) -> Tensor:
    return full(_size_arg(size), 1, dtype=_like_dtype(self, dtype))


def _new_full(self: Tensor, size: Sequence[int], fill_value: Any, *, dtype: Any = None, device: Any = None) -> Tensor:
    return full(tuple(size), fill_value, dtype=_like_dtype(self, dtype))


def _new_empty(self: Tensor, *size: Any, dtype: Any = None, device: Any = None) -> Tensor:
    return empty(_size_arg(size), dtype=_like_dtype(self, dtype))


def _new_tensor(self: Tensor, data: Any, *, dtype: Any = None, device: Any = None) -> Tensor:
    return tensor(data, dtype=_like_dtype(self, dtype))


def _make_inplace(name: str) -> Any:
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return self._inplace(name + "_", lambda: getattr(self, name)(*args, **kwargs))
    method.__name__ = name + "_"
    method.__doc__ = f"In place: ``x.copy_(x.{name}(...))``."
    return method


_INPLACE = ("rsqrt", "sqrt", "exp", "log", "neg", "abs", "tanh", "sigmoid", "relu", "silu", "reciprocal",
            "pow", "floor", "ceil", "round", "sin", "cos", "clamp_min", "clamp_max", "square", "erf", "sign")

# Function forms of the movement methods (``torch.chunk(x, 2, -1)``).


def narrow(input: Tensor, dim: int, start: int, length: int) -> Tensor:
    return input.narrow(dim, start, length)


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    return input.chunk(chunks, dim)


def split(tensor: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    return tensor.split(split_size_or_sections, dim)


def unbind(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    return input.unbind(dim)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return input.flatten(start_dim, end_dim)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    return input.transpose(dim0, dim1)


def permute(input: Tensor, dims: Sequence[int]) -> Tensor:
    return input.permute(*dims)


def reshape(input: Tensor, shape: Sequence[int]) -> Tensor:
    return input.reshape(*shape)


def squeeze(input: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    return input.squeeze(dim)


def unsqueeze(input: Tensor, dim: int) -> Tensor:
    return input.unsqueeze(dim)


_METHODS = ("mm", "bmm", "baddbmm", "addmm", "outer", "ger", "flip", "roll", "repeat_interleave", "index_copy",
            "clamp_min", "clamp_max", "norm")
_g = globals()
for _n in _METHODS:
    setattr(Tensor, _n, _g[_n])
for _n in _INPLACE:
    setattr(Tensor, _n + "_", _make_inplace(_n))
setattr(Tensor, "index_copy_", _index_copy_)
setattr(Tensor, "type_as", _type_as)
setattr(Tensor, "view_as", _view_as)
setattr(Tensor, "reshape_as", _reshape_as)
setattr(Tensor, "new_zeros", _new_zeros)
setattr(Tensor, "new_ones", _new_ones)
setattr(Tensor, "new_full", _new_full)
setattr(Tensor, "new_empty", _new_empty)
setattr(Tensor, "new_tensor", _new_tensor)

__all__ = ["mm", "bmm", "baddbmm", "addmm", "outer", "ger", "einsum", "flip", "roll", "repeat_interleave", "hstack",
           "vstack", "index_copy", "clamp_min", "clamp_max", "norm", "finfo", "iinfo", "narrow", "chunk", "split",
           "unbind", "flatten", "transpose", "permute", "reshape", "squeeze", "unsqueeze"]
