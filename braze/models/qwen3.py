"""Qwen3 (Qwen team, 2025): Llama with QK norm.

    q, k = RMSNorm_q(q), RMSNorm_k(k)    # per head, over head_dim, before the rotation

No biases on q, k, v (Qwen2 had them); the head size is its own metadata key
(``qwen3.attention.key_length``: 128 for 0.6B, whose 1024 / 16 heads would be 64).
Everything else is ``llama.py``'s.
"""

from __future__ import annotations

from typing import Any

from ..io.weights import WeightBuilder
from ..nn import Attention, RMSNorm
from .llama import Llama, LlamaConfig


def head_norms(c: LlamaConfig, b: WeightBuilder) -> tuple[RMSNorm, RMSNorm]:
    """The per-head query and key norms (``attn_q_norm``, ``attn_k_norm``, one weight of
    head_dim each, shared by the heads)."""
    return (RMSNorm.from_weights(b.get("attn_q_norm.weight", (c.head_dim,)), c.norm_eps),
            RMSNorm.from_weights(b.get("attn_k_norm.weight", (c.head_dim,)), c.norm_eps))


class Qwen3(Llama):
    ARCHS = ("qwen3",)

    @classmethod
    def attention(cls, c: LlamaConfig, b: WeightBuilder, layer: int, rotary: Any) -> Attention:
        attn = super().attention(c, b, layer, rotary)
        attn.q_norm, attn.k_norm = head_norms(c, b)
        return attn
