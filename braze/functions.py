"""The API as functions, and the methods that are those functions with the tensor first.

Each function checks its operands and records through ``tensor._record``; the list at
the bottom attaches the method forms to ``Tensor`` (``x.sum()`` is ``braze.sum(x)``)."""

from __future__ import annotations

import builtins as _b
from math import prod
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from . import dtypes as dt
from .creation import zeros
from .device import CPU
from .dtypes import DType
from .errors import DtypeMismatch, RankMismatch, ShapeMismatch, Unsupported
from .layout import Layout, broadcast_shapes, normalize_dim, normalize_dims
from .ops.elementwise import check_condition
from .promotion import DIM, check_cast, result_type
from .storage import Storage
from .tensor import (
    Scalar,
    Tensor,
    ValuesIndices,
    _atomic,
    _binary,
    _block_attrs,
    _bool,
    _broadcast_to,
    _check_tensor,
    _float,
    _int,
    _operands,
    _record,
    _scalar_to,
    _scalar_value,
    _unary,
)

if TYPE_CHECKING:  # the generated function forms, for type checkers
    def neg(input: Tensor) -> Tensor: ...
    def abs(input: Tensor) -> Tensor: ...
    def exp(input: Tensor) -> Tensor: ...
    def log(input: Tensor) -> Tensor: ...
    def sqrt(input: Tensor) -> Tensor: ...
    def rsqrt(input: Tensor) -> Tensor: ...
    def reciprocal(input: Tensor) -> Tensor: ...
    def sin(input: Tensor) -> Tensor: ...
    def cos(input: Tensor) -> Tensor: ...
    def tanh(input: Tensor) -> Tensor: ...
    def sigmoid(input: Tensor) -> Tensor: ...
    def erf(input: Tensor) -> Tensor: ...
    def relu(input: Tensor) -> Tensor: ...
    def silu(input: Tensor) -> Tensor: ...
    def floor(input: Tensor) -> Tensor: ...
    def ceil(input: Tensor) -> Tensor: ...
    def round(input: Tensor) -> Tensor: ...
    def sign(input: Tensor) -> Tensor: ...
    def logical_not(input: Tensor) -> Tensor: ...
    def isnan(input: Tensor) -> Tensor: ...
    def isinf(input: Tensor) -> Tensor: ...
    def isfinite(input: Tensor) -> Tensor: ...
    def add(input: Any, other: Any) -> Tensor: ...
    def sub(input: Any, other: Any) -> Tensor: ...
    def subtract(input: Any, other: Any) -> Tensor: ...
    def mul(input: Any, other: Any) -> Tensor: ...
    def multiply(input: Any, other: Any) -> Tensor: ...
    def div(input: Any, other: Any) -> Tensor: ...
    def divide(input: Any, other: Any) -> Tensor: ...
    def true_divide(input: Any, other: Any) -> Tensor: ...
    def floor_divide(input: Any, other: Any) -> Tensor: ...
    def remainder(input: Any, other: Any) -> Tensor: ...
    def eq(input: Any, other: Any) -> Tensor: ...
    def ne(input: Any, other: Any) -> Tensor: ...
    def lt(input: Any, other: Any) -> Tensor: ...
    def le(input: Any, other: Any) -> Tensor: ...
    def gt(input: Any, other: Any) -> Tensor: ...
    def ge(input: Any, other: Any) -> Tensor: ...
    def logical_and(input: Any, other: Any) -> Tensor: ...
    def logical_or(input: Any, other: Any) -> Tensor: ...
    def logical_xor(input: Any, other: Any) -> Tensor: ...
    negative = neg


# -- the rest of the API as functions (and methods, attached below) ---------------------------

def where(condition: Tensor, input: Any, other: Any) -> Tensor:
    """``input`` where ``condition``, else ``other``: the two promoted to their result
    type (two scalars give PyTorch's default dtype for their kind)."""
    if not isinstance(condition, Tensor):
        raise Unsupported("where", "condition must be a bool tensor")
    check_condition("where", condition.dtype)  # before a promoting cast is recorded
    return _record("where", _operands("where", condition, input, other, keep=1))


def pow(input: Any, exponent: Any) -> Tensor:
    if isinstance(input, Tensor) and input.dtype.is_integer and not isinstance(exponent, Tensor) \
            and isinstance(exponent, (int, np.integer)) and exponent < 0:
        # A float exponent promotes to float (int ** -1.0 is float32), as in PyTorch.
        raise Unsupported("pow", "integers to negative integer powers are not allowed")
    return _binary("pow", input, exponent)


@_atomic
def clamp(input: Tensor, min: Any = None, max: Any = None) -> Tensor:
    if min is None and max is None:
        raise Unsupported("clamp", "at least one of min and max must be given")
    out = input
    if min is not None:
        out = maximum(out, min)
    if max is not None:
        out = minimum(out, max)
    return out


def maximum(input: Any, other: Any) -> Tensor:
    return _binary("maximum", input, other)


def minimum(input: Any, other: Any) -> Tensor:
    return _binary("minimum", input, other)


def masked_fill(input: Tensor, mask: Tensor, value: Any) -> Tensor:
    if not isinstance(mask, Tensor) or mask.dtype is not dt.bool_:
        raise DtypeMismatch("masked_fill", [getattr(mask, "dtype", type(mask).__name__)], "mask must be a bool tensor")
    shape = broadcast_shapes("masked_fill", input.shape, mask.shape)
    if shape != input.shape:
        raise ShapeMismatch("masked_fill", [input.shape, mask.shape], "mask must broadcast to the input's shape")
    # The result keeps the input's dtype (PyTorch's masked_fill is an in-place fill of a
    # copy): a tensor value is cast to it where can_cast allows, a scalar if it fits.
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ShapeMismatch("masked_fill", [value.shape], "value must be a scalar or a one-element tensor")
        check_cast("masked_fill", value.dtype, input.dtype)
        value = value.reshape(()).to(input.dtype)
    else:
        value = _scalar_to("masked_fill", value, input.dtype)
    return where(mask, value, input)


# -- reductions ------------------------------------------------------------------------------

def _reduce(op: str, x: Tensor, dim: Any, keepdim: bool, **extra: Any) -> Tensor:
    _check_tensor(op, x)
    dims = normalize_dims(op, dim, x.ndim)
    return _record(op, [x], dims=dims, keepdim=bool(keepdim), **extra)


@_atomic
def sum(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    x = input.to(dtype) if dtype is not None else input
    return _reduce("sum", x, dim, keepdim)


@_atomic
def mean(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    x = input.to(dtype) if dtype is not None else input
    return _reduce("mean", x, dim, keepdim)


def prod_(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _reduce("prod", input, dim, keepdim)


def amax(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _reduce("amax", input, dim, keepdim)


def amin(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _reduce("amin", input, dim, keepdim)


def _max_min(op: str, input: Tensor, dim: Any, keepdim: bool) -> Any:
    if isinstance(dim, Tensor):  # torch.max(a, b)
        return _binary("maximum" if op == "max" else "minimum", input, dim)
    if dim is None:
        return _reduce("amax" if op == "max" else "amin", input, None, False)
    if not isinstance(dim, int):
        raise Unsupported(op, "dim must be an int (use amax/amin for several dims)")
    values = _reduce("amax" if op == "max" else "amin", input, dim, keepdim)
    indices = _reduce("argmax" if op == "max" else "argmin", input, dim, keepdim)
    return ValuesIndices(values, indices)


def max(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    return _max_min("max", input, dim, keepdim)


def min(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    return _max_min("min", input, dim, keepdim)


def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return _arg("argmax", input, dim, keepdim)


def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return _arg("argmin", input, dim, keepdim)


def _arg(op: str, input: Tensor, dim: int | None, keepdim: bool) -> Tensor:
    if dim is None:
        flat = input.reshape(-1)
        out = _reduce(op, flat, 0, False)
        return out.reshape((1,) * input.ndim) if keepdim else out
    return _reduce(op, input, dim, keepdim)


def any(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _reduce("any", input, dim, keepdim)


def all(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _reduce("all", input, dim, keepdim)


def var(input: Tensor, dim: Any = None, keepdim: bool = False, *, correction: float = 1,
        unbiased: bool | None = None) -> Tensor:
    if unbiased is not None:
        correction = 1 if unbiased else 0
    return _reduce("var", input, dim, keepdim, correction=correction)


def std(input: Tensor, dim: Any = None, keepdim: bool = False, *, correction: float = 1,
        unbiased: bool | None = None) -> Tensor:
    return var(input, dim, keepdim, correction=correction, unbiased=unbiased).sqrt()


@_atomic
def logsumexp(input: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
    """``m + log(sum(exp(x - m)))`` with ``m`` the max, replaced by 0 where it is
    infinite so that all -inf rows give -inf (not nan), as PyTorch does; integers and
    bools are taken in the default float dtype (float32), as PyTorch's are."""
    if not input.dtype.is_floating_point:
        input = input.to(dt.float32)
    m = _shift_max(input, dim)
    m = where(isfinite(m), m, 0.0)
    out = (input - m).exp().sum(dim, keepdim=True).log() + m
    return out if keepdim else out.squeeze(normalize_dims("logsumexp", dim, input.ndim))


def _shift_max(x: Tensor, dim: Any) -> Tensor:
    """``amax(x, dim, keepdim=True)``, the shift that keeps ``exp`` finite; 0 when a
    reduced dim is empty, where amax has no value but PyTorch's softmax (an empty
    result) and logsumexp (-inf, the log of an empty sum) are still defined."""
    dims = normalize_dims("softmax", dim, x.ndim)
    if _b.any(x.shape[d] == 0 for d in dims):
        return zeros(tuple(1 if i in dims else n for i, n in enumerate(x.shape)), dtype=x.dtype)
    return amax(x, dim, keepdim=True)


@_atomic
def softmax(input: Tensor, dim: int, dtype: Any = None) -> Tensor:
    """``exp(x - max) / sum``, written from primitive ops so that the fusion compiler
    sees (and fuses) exactly what a user would write."""
    x = input.to(dtype) if dtype is not None else input
    _check_float("softmax", x)
    e = (x - _shift_max(x, dim)).exp()
    return e / e.sum(dim, keepdim=True)


@_atomic
def log_softmax(input: Tensor, dim: int, dtype: Any = None) -> Tensor:
    x = input.to(dtype) if dtype is not None else input
    _check_float("log_softmax", x)
    # PyTorch's formula, ``(x - max) - log(sum(exp(x - max)))``: subtracting the max
    # first avoids the cancellation of ``x - logsumexp(x)`` (a few ulp of |x| in half
    # types), and a row with +inf gives nan as softmax does.
    shifted = x - _shift_max(x, dim)
    return shifted - shifted.exp().sum(dim, keepdim=True).log()


def _check_float(op: str, x: Tensor) -> None:
    if not x.dtype.is_floating_point:
        raise DtypeMismatch(op, [x.dtype], "expects a floating dtype; cast with .to(dtype)")


@_atomic
def cumsum(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    x = input.to(dtype) if dtype is not None else input
    d = normalize_dim("cumsum", dim, x.ndim)
    return _record("cumsum", [x], dim=d)


def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = True) -> ValuesIndices:
    d = normalize_dim("sort", dim, input.ndim)
    return ValuesIndices(*_record("sort", [input], dim=d, descending=bool(descending)))


def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
    return sort(input, dim, descending).indices


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
    d = normalize_dim("topk", dim, input.ndim)
    return ValuesIndices(*_record("topk", [input], k=int(k), dim=d, largest=bool(largest), sorted=bool(sorted)))


# -- shape-building ops ---------------------------------------------------------------------

def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    ts = list(tensors)
    if not ts:
        raise ShapeMismatch("cat", [], "needs at least one tensor")
    for t in ts:
        _check_tensor("cat", t)
    ref = ts[0]
    d = normalize_dim("cat", dim, ref.ndim)
    for t in ts[1:]:
        if t.ndim != ref.ndim or t.shape[:d] + t.shape[d + 1:] != ref.shape[:d] + ref.shape[d + 1:]:
            raise ShapeMismatch("cat", [x.shape for x in ts], f"sizes must match except in dim {d}")
    if len(ts) == 1:
        return ts[0].clone()
    common = result_type("cat", [(t.dtype, DIM) for t in ts])  # PyTorch's cat promotes too
    return _record("cat", [t if t.dtype is common else t.to(common) for t in ts], dim=d)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    ts = list(tensors)
    if not ts:
        raise ShapeMismatch("stack", [], "needs at least one tensor")
    for t in ts[1:]:
        if t.shape != ts[0].shape:
            raise ShapeMismatch("stack", [x.shape for x in ts], "all tensors must have the same shape")
    d = normalize_dim("stack", dim, ts[0].ndim, extra=1)
    return cat([t.unsqueeze(d) for t in ts], d)


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: Scalar = 0) -> Tensor:
    """PyTorch's ``F.pad``: ``pad`` lists (left, right) pairs from the last dim
    backwards; negative amounts crop (a view)."""
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ShapeMismatch("pad", [input.shape], f"pad {tuple(pad)} must have an even length of at most 2*{input.ndim}")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise Unsupported("pad", f"unknown mode {mode!r}")
    pairs = [(0, 0)] * input.ndim
    for i in range(len(pad) // 2):
        pairs[input.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    x = input
    for d, (lo, hi) in enumerate(pairs):
        if lo < 0 or hi < 0:
            n = x.shape[d]
            start, stop = -_b.min(lo, 0), n + _b.min(hi, 0)
            if stop < start:
                raise ShapeMismatch("pad", [input.shape], f"cropping {lo, hi} exceeds dim {d} of size {n}")
            x = x.narrow(d, start, stop - start)
    pos = tuple((_b.max(lo, 0), _b.max(hi, 0)) for lo, hi in pairs)
    if mode == "constant":
        fill = _scalar_value("pad", value, x.dtype)
    else:
        fill = 0
        for d, (lo, hi) in enumerate(pos):
            # reflect mirrors without the edge, circular wraps once; replicate repeats the
            # edge any number of times (as PyTorch), so it only needs a non-empty dim.
            limit = {"reflect": x.shape[d] - 1, "circular": x.shape[d]}.get(mode, x.shape[d] + _b.max(lo, hi))
            if (lo or hi) and (_b.max(lo, hi) > limit or x.shape[d] == 0):
                raise ShapeMismatch("pad", [input.shape], f"{mode} padding {lo, hi} is too large for dim {d}")
    if not _b.any(lo or hi for lo, hi in pos):
        return x
    return _record("pad", [x], pads=pos, mode=mode, value=fill)


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    if input.ndim < 2:
        raise RankMismatch("tril", ">= 2", input.shape)
    return _record("tril", [input], diagonal=int(diagonal))


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    if input.ndim < 2:
        raise RankMismatch("triu", ">= 2", input.shape)
    return _record("triu", [input], diagonal=int(diagonal))


def _check_index_values(op: str, index: Tensor, size: int, dim: int) -> None:
    """Indices already known (realised) are checked now, at the user's line."""
    if index._storage.realized and not index._storage.producer and index.numel():
        from .ops.shape import check_indices
        check_indices(op, index.numpy(), size, dim)


def gather(input: Tensor, dim: int, index: Tensor) -> Tensor:
    d = normalize_dim("gather", dim, input.ndim)
    if index.ndim != input.ndim:
        raise RankMismatch("gather", input.ndim, index.shape)
    for i, (n, m) in enumerate(zip(input.shape, index.shape)):
        if i != d and m > n:
            raise ShapeMismatch("gather", [input.shape, index.shape], f"index size {m} exceeds input size {n} in dim {i}")
    _check_index_values("gather", index, input.shape[d] if input.ndim else 1, d)
    return _record("gather", [input, index], dim=d)


def take_along_dim(input: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """PyTorch's ``take_along_dim``: ``input`` and ``indices`` broadcast against each other
    in every dim but ``dim`` (zero-copy expands), then ``gather``; with no ``dim``, both
    are flattened."""
    if dim is None:
        return gather(input.reshape(-1), 0, indices.reshape(-1))
    if input.ndim != indices.ndim:
        raise RankMismatch("take_along_dim", input.ndim, indices.shape)
    d = normalize_dim("take_along_dim", dim, input.ndim)
    rest = broadcast_shapes("take_along_dim", input.shape[:d] + (1,) + input.shape[d + 1:],
                            indices.shape[:d] + (1,) + indices.shape[d + 1:])
    x = input.expand(*rest[:d], input.shape[d], *rest[d + 1:])
    return gather(x, d, indices.expand(*rest[:d], indices.shape[d], *rest[d + 1:]))


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    d = normalize_dim("index_select", dim, input.ndim)
    if index.ndim > 1:
        raise RankMismatch("index_select", 1, index.shape)
    return index_take(input, d, index.reshape(-1))


def index_take(input: Tensor, dim: int, index: Tensor) -> Tensor:
    """``index_select`` with an index of any rank, which takes ``dim``'s place in the
    result (numpy's ``take``; ``F.embedding`` with ids of any shape): a gather load in its
    consumer's kernel (``ops/lowering.py``), the indices checked there."""
    d = normalize_dim("index_select", dim, input.ndim)
    _check_index_values("index_select", index, input.shape[d] if input.ndim else 1, d)
    return _record("index_select", [input, index], dim=d)



def qlinear(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight.T`` for x (M, K) float32 and a weight (N, K) kept in its file's type:
    a block-quantized dtype (q4_0 ... q6_k), float16 or bfloat16. Compiled as a
    quantized matmul kernel; the reference dequantizes the weight."""
    return _record("qlinear", [x, weight], **_block_attrs("qlinear", weight))


def qembedding(weight: Tensor, ids: Tensor) -> Tensor:
    """Rows of a block-quantized (or float16/bfloat16/float32) table at 1-d ``ids``, as float32."""
    if ids.ndim != 1:
        raise RankMismatch("embedding", 1, ids.shape)
    _check_index_values("embedding", ids, weight.shape[0] if weight.ndim else 1, 0)
    return _record("qembedding", [weight, ids], k=weight.shape[-1] if weight.ndim else 0,
                   **_block_attrs("embedding", weight))




def one_hot(input: Tensor, num_classes: int = -1) -> Tensor:
    if num_classes == -1:
        num_classes = int(input.max().item()) + 1 if input.numel() else 0
    _check_index_values("one_hot", input, num_classes, -1)
    return _record("one_hot", [input], num_classes=int(num_classes))


def matmul(input: Any, other: Any) -> Tensor:
    """PyTorch's matmul: 1-D operands are promoted and the added dim removed; batch
    dims broadcast (zero-copy expands); the extern kernel sees ``(..., m, k) @ (..., k, n)``."""
    a, b = _check_tensor("matmul", input), _check_tensor("matmul", other)
    if a.ndim == 0 or b.ndim == 0:
        raise RankMismatch("matmul", ">= 1", a.shape if a.ndim == 0 else b.shape)
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    b2 = b.unsqueeze(-1) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ShapeMismatch("matmul", [a.shape, b.shape], f"inner dims differ ({a2.shape[-1]} vs {b2.shape[-2]})")
    batch = broadcast_shapes("matmul", a2.shape[:-2], b2.shape[:-2])
    a3 = _broadcast_to("matmul", a2, batch + a2.shape[-2:])
    b3 = _broadcast_to("matmul", b2, batch + b2.shape[-2:])
    out: Tensor = _record("matmul", [a3, b3])
    if a.ndim == 1:
        out = out.squeeze(-2)
    if b.ndim == 1:
        out = out.squeeze(-1)
    return out




# -- function forms shared with methods ------------------------------------------------------

def _make_unary(name: str) -> Any:
    def fn(input: Tensor) -> Tensor:
        return _unary(name, input)
    fn.__name__ = name
    fn.__doc__ = f"Element-wise {name}."
    return fn


_UNARY_NAMES = ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid",
                "erf", "relu", "silu", "floor", "ceil", "round", "sign", "logical_not", "isnan", "isinf",
                "isfinite")
_g = globals()
for _n in _UNARY_NAMES:
    _g[_n] = _make_unary(_n)
negative = _g["neg"]


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise Unsupported("gelu", f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu" if approximate == "none" else "gelu_tanh", input)


def square(input: Tensor) -> Tensor:
    return input * input


def _make_binary(name: str, op: str) -> Any:
    def fn(input: Any, other: Any) -> Tensor:
        return _binary(op, input, other)
    fn.__name__ = name
    fn.__doc__ = f"Element-wise {name} with broadcasting."
    return fn


_BINARY_NAMES = dict(add="add", sub="sub", subtract="sub", mul="mul", multiply="mul", div="div",
                     divide="div", true_divide="div", floor_divide="floor_divide", remainder="remainder",
                     eq="eq", ne="ne", lt="lt", le="le", gt="gt", ge="ge", logical_and="logical_and",
                     logical_or="logical_or", logical_xor="logical_xor")
for _n, _op in _BINARY_NAMES.items():
    _g[_n] = _make_binary(_n, _op)

# Methods that are the function forms with the tensor first.
_METHODS = _UNARY_NAMES + tuple(_BINARY_NAMES) + (
    "gelu", "square", "pow", "clamp", "maximum", "minimum", "masked_fill", "sum", "mean", "amax", "amin",
    "max", "min", "argmax", "argmin", "any", "all", "var", "std", "logsumexp", "softmax", "log_softmax",
    "cumsum", "sort", "argsort", "topk", "tril", "triu", "gather", "index_select", "matmul")
for _n in _METHODS:
    setattr(Tensor, _n, _g[_n])
setattr(Tensor, "prod", prod_)
setattr(Tensor, "take_along_dim", take_along_dim)
setattr(Tensor, "clip", clamp)
setattr(Tensor, "where", lambda self, condition, other: where(condition, self, other))


setattr(Tensor, "__pow__", lambda self, o: pow(self, o))
setattr(Tensor, "__matmul__", lambda self, o: matmul(self, o))
setattr(Tensor, "__rmatmul__", lambda self, o: matmul(o, self))


__all__ = [
    "where", "pow", "clamp", "maximum", "minimum", "masked_fill", "sum", "mean",
    "amax", "amin", "max", "min", "argmax", "argmin", "any", "all", "var", "std", "logsumexp", "softmax",
    "log_softmax", "cumsum", "sort", "argsort", "topk", "cat", "stack", "pad", "tril", "triu", "gather",
    "index_select", "one_hot", "matmul", "gelu", "square", "negative", *_UNARY_NAMES, *_BINARY_NAMES,
]
__all__ += ["take_along_dim"]
