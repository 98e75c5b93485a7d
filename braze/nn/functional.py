"""Functional forms of the layers, written from braze's primitive ops.

Nothing here is a kernel: attention, norms and activations are ordinary tensor code,
so the fusion compiler sees exactly what a user would write and fuses it the same way.
"""

from __future__ import annotations

import math
from typing import Any

from .. import dtypes as dt
from ..errors import RankMismatch, ShapeMismatch
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
    where,
)
from ..tensor import Tensor

__all__ = ["linear", "embedding", "rms_norm", "layer_norm", "scaled_dot_product_attention", "causal_mask",
           "relu", "gelu", "silu", "softmax", "log_softmax", "pad", "normalize", "repeat_kv"]


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


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    y = x * ((x * x).mean(-1, keepdim=True) + eps).rsqrt()
    return y * weight if weight is not None else y


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    centred = x - x.mean(-1, keepdim=True)
    y = centred * ((centred * centred).mean(-1, keepdim=True) + eps).rsqrt()
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def normalize(x: Tensor, dim: int = -1, eps: float = 1e-12) -> Tensor:
    """L2-normalise along ``dim`` (``torch.nn.functional.normalize``)."""
    norm = (x * x).sum(dim, keepdim=True).sqrt()
    return x / norm.clamp(min=eps)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """Share each of KV heads with ``groups`` query heads: (B, KV, S, D) -> (B, KV*groups, S, D).

    An expand (a stride-0 view) then a reshape, which copies only because the heads
    must become one dim; a fused attention kernel reads the view directly."""
    if groups == 1:
        return x
    *lead, kv, s, d = x.shape  # any rank >= 3: (KV, S, D) works as well as (B, KV, S, D)
    return x.unsqueeze(-3).expand(*lead, kv, groups, s, d).reshape(*lead, kv * groups, s, d)


def causal_mask(q_len: int, kv_len: int, offset: int | None = None, window: int | None = None) -> Tensor:
    """Bool (q_len, kv_len) mask, True where query i may see key j: ``j <= i + offset``,
    and with a sliding ``window`` (Mistral, Gemma 3's local layers) only the last
    ``window`` keys up to it: ``i + offset - j < window``.

    ``offset`` defaults to ``kv_len - q_len`` (queries are the last positions), which is
    what decoding with a KV cache needs. The mask is index arithmetic only, so a fused
    attention kernel recomputes it where it reads it: it never exists in memory."""
    off = kv_len - q_len if offset is None else offset
    j, i = arange(kv_len).unsqueeze(0), (arange(q_len) + off).unsqueeze(1)
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
        scores = scores.masked_fill(causal_mask(q_len, key.shape[-2], 0).logical_not(), -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype is dt.bool_:
            scores = where(attn_mask, scores, -math.inf)
        else:
            scores = scores + attn_mask
    out = softmax(scores, -1) @ value
    if out_shape is not None:
        out = out.reshape(*out_shape[:-1], out.shape[-1])
    return out


