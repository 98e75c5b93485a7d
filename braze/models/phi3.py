"""Phi-3 (Abdin et al., 2024): Llama with fused projections and LongRoPE.

    q, k, v = split(x @ W_qkv)           # one matrix in the file (attn_qkv)
    gate, up = split(x @ W_gate_up)      # one matrix in the file (ffn_up), gate first

The fused matrices are split into row views at load (no copy; block rows stay whole),
so the layers are Llama's: the quantized matmul kernel takes the three (and the two)
weights over one x in one kernel anyway. LongRoPE (the 128k models): each frequency
is divided by a short factor up to the original context (``rope_factors_short``), by
a long factor past it (``rope_factors_long``), and cos and sin are scaled by
``sqrt(1 + ln(context / original) / ln(original))`` (``rope.scaling.attn_factor``
when the file has it). Positions past the original context use the long factors for
their own rotation; keys already cached keep theirs (Hugging Face recomputes the
whole prompt with the long factors once a sequence outgrows the original context).
The 4k models attend through a sliding window of 2047 positions (llama.cpp's default
for files without ``phi3.attention.sliding_window``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from ..io.weights import WeightBuilder
from ..nn import Attention, Linear, Module, RotaryEmbedding, SwiGLU
from .llama import Llama, LlamaConfig, linear
from .meta import ArchMeta


@dataclass(frozen=True)
class Phi3Config(LlamaConfig):
    original_context_length: int = 0
    rope_attn_factor: float | None = None

    @classmethod
    def from_gguf(cls, path: str, meta: Mapping[str, Any], vocab_size: int) -> "Phi3Config":
        m = ArchMeta(path, meta, "phi3")
        kw = cls.read(m, vocab_size)
        c = cls(**kw, original_context_length=m.int("rope.scaling.original_context_length", kw["context_length"]),
                rope_attn_factor=m.float("rope.scaling.attn_factor", None))
        if not m.has("attention.sliding_window") and c.n_layers in (32, 40) and c.context_length == 4096:
            c = replace(c, sliding_window=2047)  # Phi-3-mini/medium-4k, as llama.cpp reads older files
        return c


def _rows(w: Any, sizes: list[int]) -> list[Any]:
    out, start = [], 0
    for n in sizes:
        out.append(w[start:start + n])
        start += n
    return out


class Phi3(Llama):
    ARCHS = ("phi3",)
    Config = Phi3Config

    @classmethod
    def rotary(cls, c: LlamaConfig, vb: WeightBuilder) -> Any:
        assert isinstance(c, Phi3Config)
        half = (c.head_dim // 2,)
        short = vb.get("rope_factors_short.weight", half).numpy() if vb.contains("rope_factors_short.weight") else None
        long = vb.get("rope_factors_long.weight", half).numpy() if vb.contains("rope_factors_long.weight") else None
        orig = c.original_context_length
        mscale = c.rope_attn_factor
        if mscale is None:
            ratio = c.context_length / orig
            mscale = math.sqrt(1 + math.log(ratio) / math.log(orig)) if long is not None and ratio > 1 else 1.0
        return RotaryEmbedding(c.head_dim, c.context_length, c.rope_base, c.rope_interleaved, c.rope_linear_scale,
                               None if short is None else np.asarray(short), mscale,
                               None if long is None else np.asarray(long), orig)

    @classmethod
    def attention(cls, c: LlamaConfig, b: WeightBuilder, layer: int, rotary: Any) -> Attention:
        hd, q_rows, kv_rows = c.head_dim, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        qkv = b.get("attn_qkv.weight", (q_rows + 2 * kv_rows, c.dim))
        q, k, v = (Linear.from_weights(w) for w in _rows(qkv, [q_rows, kv_rows, kv_rows]))
        return Attention.from_layers(q, k, v, linear(b, "attn_output", (c.dim, c.n_heads * hd)),
                                     c.n_heads, c.n_kv_heads, rotary, window=c.sliding_window)

    @classmethod
    def mlp(cls, c: LlamaConfig, b: WeightBuilder) -> Module:
        gate, up = _rows(b.get("ffn_up.weight", (2 * c.hidden_dim, c.dim)), [c.hidden_dim, c.hidden_dim])
        return SwiGLU.from_layers(Linear.from_weights(gate), Linear.from_weights(up),
                                  linear(b, "ffn_down", (c.dim, c.hidden_dim)))
