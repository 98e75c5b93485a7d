"""The layers real models are built from: Linear, Embedding, norms, rotary, MLP, attention."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from .. import dtypes as dt
from ..dtypes import DType
from ..creation import arange, from_numpy, zeros, zeros_now
from ..functions import cat, qembedding, stack
from ..tensor import Tensor
from . import functional as F
from .module import Module
from .paged import PagedKVCache

M = TypeVar("M", bound=Module)


def _bare(cls: type[M]) -> M:
    """An instance whose tensors the caller sets: loading a model from a file must not
    first build (and then throw away) zero tensors the size of the model."""
    self = cls.__new__(cls)
    Module.__init__(self)
    return self


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: DType = dt.float32) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = zeros(out_features, in_features, dtype=dtype)
        self.bias = zeros(out_features, dtype=dtype) if bias else None

    @classmethod
    def from_weights(cls, weight: Tensor, bias: Tensor | None = None) -> "Linear":
        self = _bare(cls)
        self.out_features, self.in_features = weight.dims2()
        self.weight, self.bias = weight, bias
        return self

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: DType = dt.float32) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = zeros(num_embeddings, embedding_dim, dtype=dtype)

    @classmethod
    def from_weights(cls, weight: Tensor) -> "Embedding":
        self = _bare(cls)
        self.num_embeddings, self.embedding_dim = weight.dims2()
        self.weight = weight
        return self

    def forward(self, ids: Tensor, dtype: DType | None = None) -> Tensor:
        """The rows at ``ids``; with ``dtype=float32`` a half or block table's rows come
        out as float32 from one kernel (a model whose residual stream is float32)."""
        if dtype is dt.float32 and (self.weight.dtype.is_half or self.weight.dtype.is_block):
            return qembedding(self.weight, ids.reshape(-1)).reshape(ids.shape + (self.weight.shape[1],))
        x = F.embedding(ids, self.weight)
        return x if dtype is None else x.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class RMSNorm(Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` (Zhang and Sennrich, 2019)."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype: DType = dt.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = zeros(dim, dtype=dtype) + 1

    @classmethod
    def from_weights(cls, weight: Tensor, eps: float) -> "RMSNorm":
        self = _bare(cls)
        self.eps, self.weight = eps, weight
        return self

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight, self.eps)


class LayerNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, dtype: DType = dt.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = zeros(dim, dtype=dtype) + 1
        self.bias = zeros(dim, dtype=dtype) if bias else None

    @classmethod
    def from_weights(cls, weight: Tensor, bias: Tensor | None, eps: float) -> "LayerNorm":
        self = _bare(cls)
        self.eps, self.weight, self.bias = eps, weight, bias
        return self

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class RotaryEmbedding(Module):
    """Rotary position embedding (Su et al., RoFormer).

    Pairs of channels are rotated by ``pos * theta_i`` with ``theta_i = base^(-2i/d)``.
    Two layouts pair the channels differently: *interleaved* rotates (x0, x1), (x2, x3),
    ... (the original, and llama.cpp's layout for Llama GGUF files); *half-split*
    rotates (x_i, x_{i+d/2}) (GPT-NeoX, Hugging Face Llama, Qwen2). ``freq_factors``
    divide each theta (Llama 3's long-context scaling, stored as ``rope_freqs``; Phi-3's
    LongRoPE short factors); ``linear_scale`` divides positions (linear RoPE scaling).
    LongRoPE (Phi-3) also gives ``long_factors`` for the positions from
    ``original_positions`` on, and ``mscale`` multiplies cos and sin (its attention
    factor, so q and k each carry it).
    """

    def __init__(self, dim: int, max_positions: int, base: float = 10000.0, interleaved: bool = False,
                 linear_scale: float = 1.0, freq_factors: np.ndarray | None = None, mscale: float = 1.0,
                 long_factors: np.ndarray | None = None, original_positions: int | None = None) -> None:
        super().__init__()
        self.dim, self.interleaved, self.max_positions = dim, interleaved, max_positions
        base_freq = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
        inv_freq = base_freq if freq_factors is None else base_freq / np.asarray(freq_factors, dtype=np.float64)
        self.inv_freq, self.linear_scale, self.mscale = inv_freq, linear_scale, mscale
        self.long: tuple[int, np.ndarray] | None = None
        if long_factors is not None and original_positions is not None:
            self.long = (original_positions, base_freq / np.asarray(long_factors, dtype=np.float64))
        self.reserve(min(max_positions, self.MIN_ROWS))

    # The tables grow with the positions asked for (a KV cache reserves its length),
    # doubling, up to max_positions: a model's whole context (8192 for SmolLM2) would be
    # 2 MiB resident for a chat that uses 200. A step recorded or captured over a smaller
    # table keeps it (its storage stays alive with the plan); new recordings read the new one.
    MIN_ROWS = 256

    def reserve(self, positions: int) -> None:
        """Make the tables cover positions 0..``positions``-1 (at most max_positions)."""
        have = self.cos.shape[0] if "cos" in self._buffers else 0
        if positions <= have:
            return
        device = self.cos.device if have else None  # grown where the model was moved
        rows = min(self.max_positions, max(positions, 2 * have, self.MIN_ROWS))
        pos = np.arange(rows, dtype=np.float64) / self.linear_scale
        angles = np.outer(pos, self.inv_freq)
        if self.long is not None:
            start, long_freq = self.long
            angles[start:] = np.outer(pos[start:], long_freq)
        for name, table in (("cos", np.cos(angles)), ("sin", np.sin(angles))):
            t = from_numpy((table * self.mscale).astype(np.float32))
            self.register_buffer(name, t if device is None else t.to(device), persistent=False)

    def forward(self, x: Tensor, offset: "int | Tensor" = 0) -> Tensor:
        """Rotate ``x`` of shape (..., T, dim) for positions offset..offset+T-1, or, with
        ``offset`` an integer tensor (B, T), at each row's own positions (x is (B, H, T,
        dim): a batch of sequences at different lengths; the table rows are gathered,
        bounds-checked, in the rotation's kernel)."""
        if isinstance(offset, Tensor):
            b, t = offset.shape
            idx = offset.reshape(-1)
            cos = self.cos.index_select(0, idx).reshape(b, 1, t, -1)
            sin = self.sin.index_select(0, idx).reshape(b, 1, t, -1)
            return self._rotate(x, cos, sin)
        t = x.shape[-2]
        if offset < 0 or offset + t > self.max_positions:
            # a short table slice would broadcast silently and rotate by wrong angles
            from ..errors import ShapeMismatch
            raise ShapeMismatch("RotaryEmbedding", [x.shape],
                                f"positions {offset}..{offset + t - 1} beyond max_positions {self.max_positions}")
        self.reserve(offset + t)
        return self._rotate(x, self.cos[offset:offset + t], self.sin[offset:offset + t])

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if x.dtype is not cos.dtype:  # the tables are float32; a half model rotates in its own type
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        if self.interleaved:
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)
        half = self.dim // 2
        x0, x1 = x[..., :half], x[..., half:]
        return cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1)


class SwiGLU(Module):
    """The gated MLP of Llama (Shazeer, 2020): ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.gate = Linear(dim, hidden, bias)
        self.up = Linear(dim, hidden, bias)
        self.down = Linear(hidden, dim, bias)

    @classmethod
    def from_layers(cls, gate: Linear, up: Linear, down: Linear) -> "SwiGLU":
        self = _bare(cls)
        self.gate, self.up, self.down = gate, up, down
        return self

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GeGLU(SwiGLU):
    """The gated MLP with GELU (tanh form) for the gate (Shazeer, 2020; Gemma):
    ``down(gelu_tanh(gate(x)) * up(x))``."""

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.gate(x), approximate="tanh") * self.up(x))


class KVCache:
    """Keys and values of past positions, preallocated to the context length and
    written in place (a slice assignment, no reallocation per token). ``dtype`` is what
    they are stored as: float16 halves the memory and the bytes each decoding step
    reads (llama.cpp's default cache type); keys and values are cast to it as they are
    written and back to their own dtype as they are read, a cast the attention kernel
    makes as it loads them (``schedule/recompute.gathers``). Any floating-point keys are
    taken, rounded to the cache's type (a float16 cache holds bfloat16 keys past 65504
    as inf)."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype: DType = dt.float32,
                 device: Any = None) -> None:
        self.k = zeros_now(batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = zeros_now(batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write (B, KV, T, D) at the current position; return views of all positions so
        far, in ``k``'s dtype."""
        self._write(k, v)
        return self.k[:, :, :self.length].to(k.dtype), self.v[:, :, :self.length].to(v.dtype)

    def _write(self, k: Tensor, v: Tensor) -> None:
        t = k.shape[-2]
        if not (k.dtype.is_floating_point and v.dtype is k.dtype):
            from ..errors import DtypeMismatch
            raise DtypeMismatch("KVCache.append", [self.k.dtype, k.dtype, v.dtype],
                                "keys and values must be of one floating-point dtype")
        if self.length + t > self.max_len:
            from ..errors import ShapeMismatch
            raise ShapeMismatch("KVCache.append", [k.shape], f"context full: {self.length} + {t} > {self.max_len} positions")
        self.k[:, :, self.length:self.length + t] = k.to(self.k.dtype)
        self.v[:, :, self.length:self.length + t] = v.to(self.v.dtype)
        self.length += t

    @property
    def positions(self) -> int:
        """The first new token's position (the rotary offset)."""
        return self.length

    def update(self, k: Tensor, v: Tensor, window: int | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """Append and return the keys and values to attend over, with their mask (None:
        causal over the new tokens, which the attention then builds)."""
        if k.shape[-2] > 1:
            return (*self.append(k, v), None)
        self._write(k, v)
        # Decoding: attend over the whole preallocated cache with the positions not
        # written yet masked off. Every step then has the same shapes (the position is a
        # scalar, the write offset a placeholder), so it replays one fused plan; the mask
        # is coordinate arithmetic in the attention kernel, whose tiles past the position
        # are skipped.
        j = arange(self.max_len, device=self.k.device).unsqueeze(0)
        mask = j < self.length
        if window is not None:  # the query is at position length - 1
            mask = mask & (j >= self.length - window)
        return self.k.to(k.dtype), self.v.to(v.dtype), mask


class Attention(Module):
    """Multi-head attention with grouped KV heads (Ainslie et al., GQA) and rotary
    positions, over ``scaled_dot_product_attention``.

    Options of later models, each ordinary tensor code the attention kernel fuses:
    ``q_norm``/``k_norm`` normalise each head's queries and keys before the rotation
    (QK norm: Qwen3, Gemma 3); ``window`` lets a query see only the last ``window``
    positions up to its own (sliding-window attention: Mistral, Gemma 3's local
    layers); ``softcap`` caps the scores with ``tanh`` (Gemma 2); ``scale`` replaces
    ``1 / sqrt(head_dim)``."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int | None = None, bias: bool = False,
                 rotary: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = head_dim or dim // heads
        self.q = Linear(dim, heads * self.head_dim, bias)
        self.k = Linear(dim, kv_heads * self.head_dim, bias)
        self.v = Linear(dim, kv_heads * self.head_dim, bias)
        self.o = Linear(heads * self.head_dim, dim, False)
        object.__setattr__(self, "rotary", rotary)  # shared by all layers: not a submodule
        self.q_norm: Module | None = None
        self.k_norm: Module | None = None
        self.window: int | None = None
        self.softcap: float | None = None
        self.scale: float | None = None

    @classmethod
    def from_layers(cls, q: Linear, k: Linear, v: Linear, o: Linear, heads: int, kv_heads: int,
                    rotary: RotaryEmbedding | None, q_norm: Module | None = None, k_norm: Module | None = None,
                    window: int | None = None, softcap: float | None = None,
                    scale: float | None = None) -> "Attention":
        self = _bare(cls)
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = q.out_features // heads
        self.q, self.k, self.v, self.o = q, k, v, o
        object.__setattr__(self, "rotary", rotary)
        self.q_norm, self.k_norm = q_norm, k_norm
        self.window, self.softcap, self.scale = window, softcap, scale
        return self

    def forward(self, x: Tensor, cache: KVCache | PagedKVCache | None = None, mask: Tensor | None = None) -> Tensor:
        b, t, _ = x.dims3()
        q = self.q(x).reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        offset = cache.positions if cache is not None else 0
        if self.rotary is not None:
            q, k = self.rotary(q, offset), self.rotary(k, offset)
        if cache is not None and mask is None:
            k, v, mask = cache.update(k, v, self.window)
        elif cache is not None:
            k, v = cache.append(k, v)
        if mask is None and (t > 1 or self.window is not None):
            mask = F.causal_mask(t, k.shape[-2], window=self.window, device=k.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, softcap=self.softcap,
                                             scale=self.scale)
        return self.o(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


