"""Gemma 3 (Gemma Team, 2025): local sliding-window layers interleaved with global ones.

    x = embed(ids) * sqrt(dim)
    for each layer (five local, then one global, ...):
        h = x + PostNorm(Attention(Norm(x)))   # QK norm; local: a window, rope base 10k
        x = h + PostNorm(GeGLU(Norm(h)))       # gelu_tanh(gate) * up
    logits = Norm(x) @ embed.T                 # tied; soft-capped where the file says so

Gemma's RMSNorm multiplies by ``(1 + w)``; llama.cpp's converter stores ``1 + w`` in
the file (every ``*norm.weight``), so the norms here are plain RMSNorms of the file's
weights. Global layers use ``gemma3.rope.freq_base`` (1e6) and the file's rope
scaling; local ones base 10000, unscaled. Which layers are global:
``gemma3.attention.sliding_window_pattern`` where the file has it (a period, or one
bool per layer), else every sixth, as llama.cpp assumes. The attention scale is
``query_pre_attn_scalar ** -0.5``: the head size, but ``dim / heads`` for the 27B (as
llama.cpp). Soft-capping of attention logits and final logits
(``gemma3.attn_logit_softcapping``, ``gemma3.final_logit_softcapping``) is Gemma 2's;
Gemma 3 files do not set it, and it is applied where one does.

Local layers keep a full-length KV cache; their window is a mask of index arithmetic,
so each is one attention kernel that skips the key tiles outside the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import FormatError
from ..io.weights import WeightBuilder
from ..nn import Attention, GeGLU, KVCache, Module, RMSNorm, RotaryEmbedding
from ..tensor import Tensor
from .llama import Llama, LlamaConfig, projections
from .meta import ArchMeta
from .qwen3 import head_norms

LOCAL_ROPE_BASE = 10000.0
GLOBAL_EVERY = 6

# Gemma's turns, for files that carry no template (the 270M Q4_K_M on PyPI has none):
# a system message joins the first user turn; the assistant is "model". No BOS here:
# encoding the prompt adds it.
CHAT_TEMPLATE = (
    "{% set ns = namespace(system='') %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = m['content'] + '\n\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{% if m['role'] == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@dataclass(frozen=True)
class Gemma3Config(LlamaConfig):
    local_layers: tuple[bool, ...] = ()
    attn_scale: float = 1.0
    attn_softcap: float | None = None
    final_softcap: float | None = None

    @classmethod
    def from_gguf(cls, path: str, meta: Mapping[str, Any], vocab_size: int) -> "Gemma3Config":
        m = ArchMeta(path, meta, "gemma3")
        kw = cls.read(m, vocab_size)
        kw["norm_eps"] = m.float("attention.layer_norm_rms_epsilon", 1e-6)
        kw["sliding_window"] = m.int("attention.sliding_window")
        n = kw["n_layers"]
        pattern = m.get("attention.sliding_window_pattern", GLOBAL_EVERY)
        if isinstance(pattern, list):
            if len(pattern) != n or not all(isinstance(p, bool) for p in pattern):
                raise FormatError(path, m.key("attention.sliding_window_pattern"), None,
                                  f"expected {n} booleans (one per layer), got {pattern!r}")
            local = tuple(pattern)
        else:
            every = m.int("attention.sliding_window_pattern", GLOBAL_EVERY)
            local = tuple((i + 1) % every != 0 for i in range(n))
        scalar = kw["dim"] // kw["n_heads"] if n == 62 else kw["head_dim"]  # 27B: query_pre_attn_scalar = dim / heads
        return cls(**kw, local_layers=local, attn_scale=m.float("attention.scale", 1 / math.sqrt(scalar)),
                   attn_softcap=m.float("attn_logit_softcapping", None),
                   final_softcap=m.float("final_logit_softcapping", None))


class Gemma3Block(Module):
    def __init__(self, attn_norm: RMSNorm, attn: Attention, post_attn_norm: RMSNorm, mlp_norm: RMSNorm,
                 mlp: Module, post_mlp_norm: RMSNorm) -> None:
        super().__init__()
        self.attn_norm, self.attn, self.post_attn_norm = attn_norm, attn, post_attn_norm
        self.mlp_norm, self.mlp, self.post_mlp_norm = mlp_norm, mlp, post_mlp_norm

    def forward(self, x: Tensor, cache: KVCache | None) -> Tensor:
        h = x + self.post_attn_norm(self.attn(self.attn_norm(x), cache))
        return h + self.post_mlp_norm(self.mlp(self.mlp_norm(h)))


class Gemma3(Llama):
    ARCHS = ("gemma3",)
    Config = Gemma3Config
    MLP = GeGLU
    CHAT_TEMPLATE = CHAT_TEMPLATE

    def embed_tokens(self, ids: Tensor) -> Tensor:
        return super().embed_tokens(ids) * math.sqrt(self.config.dim)

    def logits(self, x: Tensor) -> Tensor:
        logits = super().logits(x)
        cap = getattr(self.config, "final_softcap", None)
        return logits if cap is None else (logits / cap).tanh() * cap

    @classmethod
    def rotary(cls, c: LlamaConfig, vb: WeightBuilder) -> Any:
        """(local, global) tables: base 10000 for the sliding-window layers, the file's
        base and scaling for the global ones."""
        return (RotaryEmbedding(c.head_dim, c.context_length, LOCAL_ROPE_BASE, c.rope_interleaved),
                RotaryEmbedding(c.head_dim, c.context_length, c.rope_base, c.rope_interleaved, c.rope_linear_scale))

    @classmethod
    def attention(cls, c: LlamaConfig, b: WeightBuilder, layer: int, rotary: Any) -> Attention:
        assert isinstance(c, Gemma3Config)
        local = c.local_layers[layer]
        return Attention.from_layers(*projections(c, b), c.n_heads, c.n_kv_heads, rotary[0] if local else rotary[1],
                                     *head_norms(c, b), window=c.sliding_window if local else None,
                                     softcap=c.attn_softcap, scale=c.attn_scale)

    @classmethod
    def block(cls, c: LlamaConfig, b: WeightBuilder, layer: int, rotary: Any) -> Module:
        def norm(name: str) -> RMSNorm:
            return RMSNorm.from_weights(b.get(f"{name}.weight", (c.dim,)), c.norm_eps)
        return Gemma3Block(norm("attn_norm"), cls.attention(c, b, layer, rotary), norm("post_attention_norm"),
                           norm("ffn_norm"), cls.mlp(c, b), norm("post_ffw_norm"))
