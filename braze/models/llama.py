"""Llama (Touvron et al., 2023) and its family: Mistral, Qwen2, SmolLM.

A decoder-only transformer: token embeddings, then ``n_layers`` blocks of

    h = x + Attention(RMSNorm(x))        # grouped-query attention, rotary positions
    x = h + SwiGLU(RMSNorm(h))

then a final RMSNorm and a projection to the vocabulary (tied to the embeddings when
the file has no separate output matrix). Everything about the shape comes from the
GGUF file's metadata (``{arch}.block_count``, heads, rope base ...); nothing is
hard-coded per model.

Rotary layout: llama.cpp stores Llama and Mistral Q/K weights permuted for the
*interleaved* rotary layout, and Qwen2's for the *half-split* one, so the layout is
chosen by architecture, as llama.cpp does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import FormatError, Unsupported, _short
from ..io.validate import MAX_COUNT, Fields
from ..io.weights import GGUFWeights, WeightBuilder
from ..nn import Attention, Embedding, KVCache, Linear, Module, ModuleList, RMSNorm, RotaryEmbedding, SwiGLU
from ..dtypes import float32
from ..tensor import Tensor

INTERLEAVED_ROPE = {"llama": True, "mistral": True, "qwen2": False}


@dataclass(frozen=True)
class LlamaConfig:
    arch: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    norm_eps: float
    rope_base: float
    rope_interleaved: bool
    rope_linear_scale: float
    context_length: int

    @classmethod
    def from_gguf(cls, path: str, meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> "LlamaConfig":
        """The config from a GGUF file's metadata, every field checked against its type,
        a sane range and the tensor shapes in the file's header (``shapes``, name ->
        shape): all before any tensor data is read."""
        arch = meta.get("general.architecture")
        if not isinstance(arch, str) or arch not in INTERLEAVED_ROPE:
            raise Unsupported("llama", f"{path}: architecture {_short(arch)} is not a Llama-family model "
                                       f"(known: {', '.join(INTERLEAVED_ROPE)})")
        f = Fields(path, {k[len(arch) + 1:]: v for k, v in meta.items() if k.startswith(arch + ".")}, arch + ".")
        embd = shapes.get("token_embd.weight")
        if embd is None or len(embd) != 2:
            raise FormatError(path, "token_embd.weight", None, "the token embedding must be a 2-d tensor",
                              value=embd)
        vocab_size, dim = embd
        dim = f.count("embedding_length")
        if embd[1] != dim:
            raise f.error("embedding_length", dim, f"token_embd.weight has shape {embd}: its rows are {embd[1]} wide")
        layers = {int(k.split(".")[1]) for k in shapes if k.startswith("blk.") and k.split(".")[1].isdigit()}
        n_layers = f.count("block_count", hi=max(len(layers), 1))
        if any(i not in layers for i in range(n_layers)):
            raise f.error("block_count", n_layers, f"the file has tensors for blocks {sorted(layers)[:8]}...")
        heads = f.count("attention.head_count", hi=dim)
        kv = f.count("attention.head_count_kv", heads, hi=heads)
        if heads % kv:
            raise f.error("attention.head_count_kv", kv, f"must divide attention.head_count ({heads})")
        if "rope.dimension_count" not in f.meta and dim % heads:
            raise f.error("attention.head_count", heads, f"must divide embedding_length ({dim})")
        head_dim = f.count("rope.dimension_count", dim // heads, lo=2, hi=MAX_COUNT)
        if head_dim % 2:
            raise f.error("rope.dimension_count", head_dim, "rotary pairs need an even head size")
        scaling = f.text("rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise Unsupported("llama", f"{path}: rope scaling {_short(scaling)} is not supported (none, linear)")
        return cls(
            arch=arch,
            vocab_size=vocab_size,
            dim=dim,
            n_layers=n_layers,
            n_heads=heads,
            n_kv_heads=kv,
            head_dim=head_dim,
            hidden_dim=f.count("feed_forward_length"),
            norm_eps=f.real("attention.layer_norm_rms_epsilon", 1e-5, hi=1.0),
            rope_base=f.real("rope.freq_base", 10000.0),
            rope_interleaved=INTERLEAVED_ROPE[arch],
            rope_linear_scale=f.real("rope.scaling.factor", 1.0) if scaling == "linear" else 1.0,
            # generation sizes the KV cache and rotary table by what it uses, so a large
            # context costs nothing until a sequence is that long
            context_length=f.count("context_length", 2048),
        )


class Block(Module):
    def __init__(self, attn_norm: RMSNorm, attn: Attention, mlp_norm: RMSNorm, mlp: SwiGLU) -> None:
        super().__init__()
        self.attn_norm, self.attn, self.mlp_norm, self.mlp = attn_norm, attn, mlp_norm, mlp

    def forward(self, x: Tensor, cache: KVCache | None) -> Tensor:
        h = x + self.attn(self.attn_norm(x), cache)
        return h + self.mlp(self.mlp_norm(h))


class Llama(Module):
    def __init__(self, config: LlamaConfig, embed: Embedding, blocks: list[Block], norm: RMSNorm,
                 output: Linear) -> None:
        super().__init__()
        self.config = config
        self.embed, self.blocks, self.norm, self.output = embed, ModuleList(blocks), norm, output

    def new_cache(self, max_len: int | None = None, batch: int = 1) -> list[KVCache]:
        """One preallocated KV cache per block, for ``max_len`` positions (default: the
        model's context length)."""
        c = self.config
        n = min(max_len or c.context_length, c.context_length)
        if self.blocks and self.blocks[0].attn.rotary is not None:
            # the positions a captured step will replay must be in the table it captures
            self.blocks[0].attn.rotary.reserve(n)
        return [KVCache(batch, c.n_kv_heads, n, c.head_dim) for _ in range(c.n_layers)]

    def forward(self, ids: Tensor, caches: list[KVCache] | None = None, last_only: bool = False,
                at: Tensor | None = None) -> Tensor:
        """Logits (B, T, vocab) for token ids (B, T); with ``last_only`` just the last
        position's, which is all that generation needs from a prompt; with ``at`` (1-d
        int64, indices into the B*T positions) those positions' logits, (1, len(at),
        vocab): a padded prompt's last real token (``generate.PrefillStep``)."""
        x = self.embed(ids, dtype=float32)  # the residual stream is float32, whatever the table's type
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if caches is not None else None)
        if at is not None:
            x = x.reshape(-1, x.shape[-1]).index_select(0, at).unsqueeze(0)
        elif last_only:
            x = x[:, -1:]
        return self.output(self.norm(x))

    @classmethod
    def from_gguf(cls, gguf: Any, progress: Callable[[str], None] | None = None, dequantize: bool = False) -> "Llama":
        """Build from an open ``braze.io.GGUFFile``; quantized tensors stay in their blocks
        (block dtypes, memory-mapped), which ``nn.Linear`` hands to the quantized matmul;
        with ``dequantize`` every weight is float32 (the baseline for fidelity checks)."""
        c = LlamaConfig.from_gguf(str(gguf.path), gguf.metadata, {n: t.shape for n, t in gguf.tensors.items()})
        vb = WeightBuilder(GGUFWeights(gguf, dequantize), on_load=progress)
        embed = Embedding.from_weights(vb.get("token_embd.weight"))
        hd = c.head_dim
        freq_factors = vb.get("rope_freqs.weight", (hd // 2,)).to(float32).numpy() \
            if vb.contains("rope_freqs.weight") else None
        if freq_factors is not None and not (np.isfinite(freq_factors).all() and (freq_factors > 0).all()):
            raise FormatError(str(gguf.path), "rope_freqs.weight", None, "rotary frequency factors must be "
                              "finite and positive")
        rotary = RotaryEmbedding(hd, c.context_length, c.rope_base, c.rope_interleaved, c.rope_linear_scale,
                                 freq_factors if freq_factors is None else np.asarray(freq_factors))

        def linear(b: WeightBuilder, name: str, shape: tuple[int, int]) -> Linear:
            return Linear.from_weights(b.get(f"{name}.weight", shape), b.get_opt(f"{name}.bias", (shape[0],)))

        blocks = []
        for i in range(c.n_layers):
            b = vb.pp("blk").pp(i)
            attn = Attention.from_layers(
                linear(b, "attn_q", (c.n_heads * hd, c.dim)),
                linear(b, "attn_k", (c.n_kv_heads * hd, c.dim)),
                linear(b, "attn_v", (c.n_kv_heads * hd, c.dim)),
                linear(b, "attn_output", (c.dim, c.n_heads * hd)),
                c.n_heads, c.n_kv_heads, rotary)
            mlp = SwiGLU.from_layers(linear(b, "ffn_gate", (c.hidden_dim, c.dim)),
                                     linear(b, "ffn_up", (c.hidden_dim, c.dim)),
                                     linear(b, "ffn_down", (c.dim, c.hidden_dim)))
            blocks.append(Block(RMSNorm.from_weights(b.get("attn_norm.weight", (c.dim,)), c.norm_eps), attn,
                                RMSNorm.from_weights(b.get("ffn_norm.weight", (c.dim,)), c.norm_eps), mlp))
        norm = RMSNorm.from_weights(vb.get("output_norm.weight", (c.dim,)), c.norm_eps)
        tied = not vb.contains("output.weight")
        output = Linear.from_weights(embed.weight if tied else vb.get("output.weight", (c.vocab_size, c.dim)))
        return cls(c, embed, blocks, norm, output)
