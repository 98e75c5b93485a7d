"""Functional forms of the layers, written from braze's primitive ops.

Nothing here is a kernel: attention, norms and activations are ordinary tensor code,
so the fusion compiler sees exactly what a user would write and fuses it the same way.
"""

from __future__ import annotations

import math
from typing import Any

from .. import dtypes as dt
from ..errors import RankMismatch, ShapeMismatch, Unsupported
from ..jit import jit
from ..layout import broadcast_shapes
from ..creation import arange
from ..functions import (
    gelu,
    index_take,
    pad,
    qembedding,
    qlinear,
    relu,
    silu,
    softmax,
    log_softmax,
    sigmoid,
    tanh,
    where,
)
from ..composites import finfo, norm
from ..tensor import Tensor

__all__ = ["linear", "embedding", "rms_norm", "layer_norm", "scaled_dot_product_attention", "causal_mask",
           "relu", "gelu", "silu", "softmax", "log_softmax", "pad", "normalize", "repeat_kv", "sigmoid", "tanh",
           "softplus", "leaky_relu", "elu", "mish", "glu", "logsigmoid", "hardtanh", "relu6", "dropout",
           "cosine_similarity"]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with leading dims flattened, so the product is one 2-D
    matmul over the transposed weight view (no copy of the weight). A weight kept in
    its file's type (block-quantized, or half beside float32 activations) goes to the
    quantized matmul kernel, which reads it where it is."""
    lead = x.shape[:-1]
    if weight.dtype.is_block or (weight.dtype.is_half and x.dtype is dt.float32):
        out = qlinear(x.reshape(-1, x.shape[-1]), weight)
    else:
        out = x.reshape(-1, x.shape[-1]) @ weight.T
    if bias is not None:
        out = out + bias
    return out.reshape(lead + (weight.shape[0],))


def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    if weight.dtype.is_block:
        return qembedding(weight, ids.reshape(-1)).reshape(ids.shape + (weight.shape[1],))
    return index_take(weight, 0, ids)


def _norm_args(op: str, x: Tensor, args: tuple[Any, ...], kwargs: dict[str, Any],
               names: tuple[str, ...]) -> tuple[tuple[int, ...], dict[str, Any]]:
    """The dims to normalise over and the named arguments, from PyTorch's signature
    ``(input, normalized_shape, *names)`` or braze's ``(x, *names)`` over the last dim: a
    second argument that is a Tensor or None is the weight, not a shape."""
    torch_form = (args and not (args[0] is None or isinstance(args[0], Tensor))) or "normalized_shape" in kwargs
    params = dict(zip(("normalized_shape", *names) if torch_form else names, args))
    for k, v in kwargs.items():
        if k in params or k not in ("normalized_shape", *names):
            raise Unsupported(op, f"unexpected or repeated argument {k!r}")
        params[k] = v
    if not torch_form:
        return (-1,), params
    ns = params.pop("normalized_shape")
    shape = (ns,) if isinstance(ns, int) else tuple(ns)
    if not shape or x.shape[x.ndim - len(shape):] != shape:
        raise ShapeMismatch(op, [x.shape], f"normalized_shape {shape} must be the input's trailing dims")
    return tuple(range(x.ndim - len(shape), x.ndim)), params


def rms_norm(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the trailing dims: PyTorch's
    ``rms_norm(input, normalized_shape, weight=None, eps=None)`` (eps None: the dtype's
    machine epsilon) or braze's ``rms_norm(x, weight, eps)`` over the last dim."""
    dims, p = _norm_args("rms_norm", x, args, kwargs, ("weight", "eps"))
    weight, eps = p.get("weight"), p.get("eps")
    if eps is None:
        eps = finfo(x.dtype).eps
    y = x * ((x * x).mean(dims, keepdim=True) + eps).rsqrt()
    return y * weight if weight is not None else y


def layer_norm(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over the trailing dims: PyTorch's
    ``layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5)`` or braze's
    ``layer_norm(x, weight, bias, eps)`` over the last dim."""
    dims, p = _norm_args("layer_norm", x, args, kwargs, ("weight", "bias", "eps"))
    weight, bias, eps = p.get("weight"), p.get("bias"), p.get("eps", 1e-5)
    centred = x - x.mean(dims, keepdim=True)
    y = centred * ((centred * centred).mean(dims, keepdim=True) + eps).rsqrt()
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """``x / max(norm_p(x, dim), eps)``, PyTorch's signature and defaults (``dim=1``)."""
    return input / norm(input, p, dim, keepdim=True).clamp(min=eps)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """Share each of KV heads with ``groups`` query heads: (B, KV, S, D) -> (B, KV*groups, S, D).

    An expand (a stride-0 view) then a reshape, which copies only because the heads
    must become one dim; a fused attention kernel reads the view directly."""
    if groups == 1:
        return x
    *lead, kv, s, d = x.shape  # any rank >= 3: (KV, S, D) works as well as (B, KV, S, D)
    return x.unsqueeze(-3).expand(*lead, kv, groups, s, d).reshape(*lead, kv * groups, s, d)


def causal_mask(q_len: int, kv_len: int, offset: int | None = None, window: int | None = None,
                device: Any = None) -> Tensor:
    """Bool (q_len, kv_len) mask, True where query i may see key j: ``j <= i + offset``,
    and with a sliding ``window`` (Mistral, Gemma 3's local layers) only the last
    ``window`` keys up to it: ``i + offset - j < window``.

    ``offset`` defaults to ``kv_len - q_len`` (queries are the last positions), which is
    what decoding with a KV cache needs. The mask is index arithmetic only, so a fused
    attention kernel recomputes it where it reads it: it never exists in memory."""
    off = kv_len - q_len if offset is None else offset
    j, i = arange(kv_len, device=device).unsqueeze(0), (arange(q_len, device=device) + off).unsqueeze(1)
    seen = j <= i
    return seen if window is None else seen & (j > i - window)


@jit
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False, softcap: float | None = None) -> Tensor:
    """``softmax(q @ k^T * scale + mask) @ v``, as ``torch.nn.functional.scaled_dot_product_attention``.

    ``attn_mask`` is bool (True = attend) or additive float; ``is_causal`` masks with
    the top-left aligned lower triangle, as PyTorch does; ``enable_gqa`` shares KV heads
    among query heads. ``softcap`` caps the scores smoothly at +-softcap before the
    mask, ``tanh(s / softcap) * softcap`` (Gemma 2's attention logit soft-capping).
    Dropout is a training feature and must be 0.
    """
    if dropout_p:
        raise ShapeMismatch("scaled_dot_product_attention", [query.shape], "dropout is not supported in inference")
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise RankMismatch("scaled_dot_product_attention", ">= 2", min((query.shape, key.shape, value.shape), key=len))
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ShapeMismatch("scaled_dot_product_attention", [query.shape, key.shape, value.shape],
                            "q and k need the same head dim, k and v the same length")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    q_len = query.shape[-2]
    out_shape = None
    if enable_gqa and query.ndim >= 3 and key.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        hq, hk = query.shape[-3], key.shape[-3]
        if hq % hk:
            raise ShapeMismatch("scaled_dot_product_attention", [query.shape, key.shape],
                                f"{hq} query heads are not a multiple of {hk} kv heads")
        # Each KV head serves a group of query heads: split the query heads into
        # (kv heads, group). Views only, so a fused kernel reads each KV head where it
        # is (no repeat_kv copy). Decoding (one query) makes the group the query rows,
        # (hk, groups, D) against k and v as they are; longer queries let matmul
        # broadcast k and v over the group. Both are one kernel; the first records a
        # third faster (no 5-d broadcasts), which is what a decoding step pays for.
        groups = hq // hk
        lead = query.shape[:-3]
        out_shape = query.shape
        rows = (groups,) if q_len == 1 else (groups, q_len)
        query = query.reshape(*lead, hk, *rows, query.shape[-1])
        if q_len != 1:
            key, value = key.unsqueeze(-3), value.unsqueeze(-3)
        if attn_mask is not None:
            full = broadcast_shapes("scaled_dot_product_attention", attn_mask.shape, (*lead, hq, q_len, key.shape[-2]))
            attn_mask = attn_mask.expand(*full).reshape(*full[:-3], hk, *rows, full[-1])
    scores = (query @ key.mT) * scale
    if softcap is not None:
        scores = (scores / softcap).tanh() * softcap
    if is_causal:
        scores = scores.masked_fill(causal_mask(q_len, key.shape[-2], 0, device=query.device).logical_not(), -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype is dt.bool_:
            scores = where(attn_mask, scores, -math.inf)
        else:
            scores = scores + attn_mask
    out = softmax(scores, -1) @ value
    if out_shape is not None:
        out = out.reshape(*out_shape[:-1], out.shape[-1])
    return out




# -- more activations, as PyTorch's ``torch.nn.functional`` spells them ------------------------

def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta x)) / beta``, and ``x`` itself where ``beta x > threshold``."""
    bx = input * beta if beta != 1 else input
    soft = (bx.exp() + 1.0).log()
    return where(bx > threshold, input, soft / beta if beta != 1 else soft)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return where(input >= 0, input, input * negative_slope)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    return where(input > 0, input, (input.exp() - 1.0) * alpha)


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    return input * softplus(input).tanh()


def logsigmoid(input: Tensor) -> Tensor:
    """``min(x, 0) - log(1 + exp(-|x|))``: finite for every finite x."""
    return input.clamp(max=0.0) - ((-input.abs()).exp() + 1.0).log()


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    return input.clamp(min_val, max_val)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    return input.clamp(0.0, 6.0)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """First half times the sigmoid of the second half along ``dim``."""
    if input.shape[dim] % 2:
        raise ShapeMismatch("glu", [input.shape], f"dim {dim} must have an even size")
    a, b = input.chunk(2, dim)
    return a * sigmoid(b)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Identity in inference (``training=False`` or ``p == 0``); braze does not train."""
    if training and p:
        raise Unsupported("dropout", "dropout in training mode is not supported; pass training=False")
    return input


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """``sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps))`` along ``dim``, as PyTorch
    computes it (each norm clamped on its own)."""
    n1 = norm(x1, 2, dim, keepdim=False).clamp(min=eps)
    n2 = norm(x2, 2, dim, keepdim=False).clamp(min=eps)
    return (x1 * x2).sum(dim) / (n1 * n2)
