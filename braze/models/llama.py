"""Llama (Touvron et al., 2023) and its family: Mistral, Qwen2, SmolLM.

A decoder-only transformer: token embeddings, then ``n_layers`` blocks of

    h = x + Attention(RMSNorm(x))        # grouped-query attention, rotary positions
    x = h + SwiGLU(RMSNorm(h))

then a final RMSNorm and a projection to the vocabulary (tied to the embeddings when
the file has no separate output matrix). Everything about the shape comes from the
GGUF file's metadata (``{arch}.block_count``, heads, rope base ...); nothing is
hard-coded per model.

Rotary layout: llama.cpp stores Llama and Mistral Q/K weights permuted for the
*interleaved* rotary layout, and the others' (Qwen, Phi-3, Gemma) for the
*half-split* one, so the layout is chosen by architecture, as llama.cpp does.
Llama 3's long-context rope scaling is the ``rope_freqs`` tensor (a divisor per
frequency); Mistral's sliding window is ``{arch}.attention.sliding_window``.

The other decoders (``qwen3.py``, ``phi3.py``, ``gemma3.py``) are this model with its
parts swapped: each overrides the class methods that build a part from the file.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

import numpy as np

from ..device import Device
from ..dtypes import DType, float32
from ..errors import FormatError, MissingWeight, Unsupported
from ..io.weights import GGUFWeights, WeightBuilder
from ..nn import Attention, Embedding, KVCache, Linear, Module, ModuleList, RMSNorm, RotaryEmbedding, SwiGLU
from ..tensor import Tensor
from .meta import ArchMeta

INTERLEAVED_ROPE = {"llama": True, "mistral": True, "qwen2": False, "qwen3": False, "phi3": False, "gemma3": False}


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
    sliding_window: int | None = None  # every layer's, where the architecture has one window for all

    @classmethod
    def read(cls, m: ArchMeta, vocab_size: int) -> dict[str, Any]:
        """The fields every decoder reads the same way, as keyword arguments."""
        dim = m.int("embedding_length")
        heads = m.int("attention.head_count", hi=dim)
        kv = m.int("attention.head_count_kv", heads, hi=heads)
        if heads % kv:
            raise m.error("attention.head_count_kv", kv, f"must divide attention.head_count ({heads})")
        if not m.has("attention.key_length") and not m.has("rope.dimension_count") and dim % heads:
            raise m.error("attention.head_count", heads, f"must divide embedding_length ({dim})")
        head_dim = m.int("attention.key_length", None) or m.int("rope.dimension_count", None) or dim // heads
        if head_dim % 2:
            raise m.error("rope.dimension_count", head_dim, "rotary pairs need an even head size")
        rope_dim = m.int("rope.dimension_count", head_dim)
        if rope_dim != head_dim:
            raise Unsupported("llama", f"{m.path}: partial rotary embeddings ({m.key('rope.dimension_count')} = "
                                       f"{rope_dim} of a head of {head_dim}) are not supported")
        if m.int("attention.value_length", head_dim) != head_dim:
            raise Unsupported("llama", f"{m.path}: value heads of another size than key heads are not supported")
        scaling = m.str("rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise Unsupported("llama", f"{m.path}: rope scaling {scaling!r} is not supported (none, linear)")
        ctx = m.int("context_length", 2048)
        has_window = m.arch in ("llama", "mistral", "phi3") and m.get("attention.sliding_window", 0) != 0  # 0: none
        window = m.int("attention.sliding_window") if has_window else None
        return dict(
            arch=m.arch,
            vocab_size=vocab_size,
            dim=dim,
            n_layers=m.int("block_count"),
            n_heads=heads,
            n_kv_heads=kv,
            head_dim=head_dim,
            hidden_dim=m.int("feed_forward_length"),
            norm_eps=m.float("attention.layer_norm_rms_epsilon", 1e-5, lo=0.0, hi=1.0),
            rope_base=m.float("rope.freq_base", 10000.0, lo=0.0),
            rope_interleaved=INTERLEAVED_ROPE[m.arch],
            rope_linear_scale=m.float("rope.scaling.factor", 1.0, lo=0.0) if scaling == "linear" else 1.0,
            # generation sizes the KV cache and the rotary table by what it uses, so a
            # large context costs nothing until a sequence is that long
            context_length=ctx,
            sliding_window=window if window is not None and window < ctx else None,
        )

    @classmethod
    def from_gguf(cls, path: str, meta: Mapping[str, Any], vocab_size: int) -> "LlamaConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in cls.read(ArchMeta(path, meta, str(meta["general.architecture"])),
                                                  vocab_size).items() if k in names})


def _check_shapes(path: str, c: LlamaConfig, embd: tuple[int, ...], tensors: Mapping[str, Any]) -> None:
    """The metadata against the tensors the header lists, before any is read."""
    def bad(field: str, value: Any, why: str) -> FormatError:
        return FormatError(path, f"{c.arch}.{field}", None, why, value=value)
    if len(embd) != 2 or embd[1] != c.dim:
        raise bad("embedding_length", c.dim, f"token_embd.weight has shape {embd}: its rows must be that wide")
    blocks = {int(k.split(".")[1]) for k in tensors if k.startswith("blk.") and k.split(".")[1].isdigit()}
    if any(i not in blocks for i in range(c.n_layers)):
        raise bad("block_count", c.n_layers, f"the file has tensors for {len(blocks)} blocks")


class Block(Module):
    def __init__(self, attn_norm: RMSNorm, attn: Attention, mlp_norm: RMSNorm, mlp: Module) -> None:
        super().__init__()
        self.attn_norm, self.attn, self.mlp_norm, self.mlp = attn_norm, attn, mlp_norm, mlp

    def forward(self, x: Tensor, cache: KVCache | None) -> Tensor:
        h = x + self.attn(self.attn_norm(x), cache)
        return h + self.mlp(self.mlp_norm(h))


def linear(b: WeightBuilder, name: str, shape: tuple[int, int]) -> Linear:
    return Linear.from_weights(b.get(f"{name}.weight", shape), b.get_opt(f"{name}.bias", (shape[0],)))


def projections(c: LlamaConfig, b: WeightBuilder) -> tuple[Linear, Linear, Linear, Linear]:
    """The attention's q, k, v and output projections (``attn_q`` ... ``attn_output``)."""
    q_rows, kv_rows = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    return (linear(b, "attn_q", (q_rows, c.dim)), linear(b, "attn_k", (kv_rows, c.dim)),
            linear(b, "attn_v", (kv_rows, c.dim)), linear(b, "attn_output", (c.dim, q_rows)))


class Llama(Module):
    ARCHS: tuple[str, ...] = ("llama", "mistral", "qwen2")
    Config: type[LlamaConfig] = LlamaConfig
    MLP: type[SwiGLU] = SwiGLU  # the gated MLP: silu, or Gemma's gelu
    CHAT_TEMPLATE: str | None = None  # the family's turn format, for files without tokenizer.chat_template

    def __init__(self, config: LlamaConfig, embed: Embedding, blocks: list[Module], norm: RMSNorm,
                 output: Linear) -> None:
        super().__init__()
        self.config = config
        self.embed, self.blocks, self.norm, self.output = embed, ModuleList(blocks), norm, output

    def new_cache(self, max_len: int | None = None, batch: int = 1, dtype: DType = float32) -> list[KVCache]:
        """One preallocated KV cache per block, for ``max_len`` positions (default: the
        model's context length), its keys and values stored as ``dtype``."""
        c = self.config
        n = min(max_len or c.context_length, c.context_length)
        self.reserve_positions(n)
        return [KVCache(batch, c.n_kv_heads, n, c.head_dim, dtype, device=self.device) for _ in range(c.n_layers)]

    @property
    def device(self) -> Device:
        """Where the model's weights are (``.to("cuda")`` moves them): its caches are made there."""
        return self.norm.weight.device

    def _rotaries(self) -> list[Any]:
        """The rotary tables, shared by the blocks (not submodules), each once."""
        return list({id(b.attn.rotary): b.attn.rotary for b in self.blocks if b.attn.rotary is not None}.values())

    def _moved(self, dev: Device) -> "Llama":
        super()._moved(dev)
        for rotary in self._rotaries():
            rotary._moved(dev)
        return self

    def reserve_positions(self, n: int) -> None:
        """Make the rotary tables cover positions 0..n-1: the positions a captured step
        will replay must be in the tables it captures."""
        for rotary in self._rotaries():
            rotary.reserve(n)

    def forward(self, ids: Tensor, caches: list[KVCache] | None = None, last_only: bool = False,
                at: Tensor | None = None) -> Tensor:
        """Logits (B, T, vocab) for token ids (B, T); with ``last_only`` just the last
        position's, which is all that generation needs from a prompt; with ``at`` (1-d
        int64, indices into the B*T positions) those positions' logits, (1, len(at),
        vocab): a padded prompt's last real token (``generate.PrefillStep``)."""
        x = self.embed_tokens(ids)
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if caches is not None else None)
        if at is not None:
            x = x.reshape(-1, x.shape[-1]).index_select(0, at).unsqueeze(0)
        elif last_only:
            x = x[:, -1:]
        return self.logits(x)

    def embed_tokens(self, ids: Tensor) -> Tensor:
        return self.embed(ids, dtype=float32)  # the residual stream is float32, whatever the table's type

    def logits(self, x: Tensor) -> Tensor:
        return self.output(self.norm(x))

    # -- building from a GGUF file: each part a class method a relative overrides -----------
    @classmethod
    def from_gguf(cls, gguf: Any, progress: Callable[[str], None] | None = None, dequantize: bool = False) -> "Llama":
        """Build from an open ``braze.io.GGUFFile``; quantized tensors stay in their blocks
        (block dtypes, memory-mapped), which ``nn.Linear`` hands to the quantized matmul;
        with ``dequantize`` every weight is float32 (the baseline for fidelity checks)."""
        path, arch = str(gguf.path), gguf.metadata.get("general.architecture")
        if arch not in cls.ARCHS:
            raise Unsupported(cls.__name__, f"{path}: architecture {arch!r} is not a {cls.__name__} model "
                                            f"(known: {', '.join(cls.ARCHS)})")
        if "token_embd.weight" not in gguf.tensors:
            raise MissingWeight(path, "token_embd.weight", [])
        embd = gguf.tensors["token_embd.weight"].shape
        c = cls.Config.from_gguf(path, gguf.metadata, embd[0] if len(embd) == 2 else 0)
        _check_shapes(path, c, embd, gguf.tensors)
        vb = WeightBuilder(GGUFWeights(gguf, dequantize), on_load=progress)
        embed = Embedding.from_weights(vb.get("token_embd.weight", (c.vocab_size, c.dim)))
        rotary = cls.rotary(c, vb)
        blocks = [cls.block(c, vb.pp("blk").pp(i), i, rotary) for i in range(c.n_layers)]
        norm = RMSNorm.from_weights(vb.get("output_norm.weight", (c.dim,)), c.norm_eps)
        tied = not vb.contains("output.weight")
        output = Linear.from_weights(embed.weight if tied else vb.get("output.weight", (c.vocab_size, c.dim)))
        return cls(c, embed, blocks, norm, output)

    @classmethod
    def rotary(cls, c: LlamaConfig, vb: WeightBuilder) -> Any:
        """The rotary tables the blocks share (Llama 3: divided by ``rope_freqs``)."""
        factors = vb.get("rope_freqs.weight", (c.head_dim // 2,)).to(float32).numpy() \
            if vb.contains("rope_freqs.weight") else None
        if factors is not None and not (np.isfinite(factors).all() and (factors > 0).all()):
            raise FormatError(vb.source.path, "rope_freqs.weight", None,
                              "rotary frequency factors must be finite and positive")
        return RotaryEmbedding(c.head_dim, c.context_length, c.rope_base, c.rope_interleaved, c.rope_linear_scale,
                               None if factors is None else np.asarray(factors))

    @classmethod
    def attention(cls, c: LlamaConfig, b: WeightBuilder, layer: int, rotary: Any) -> Attention:
        return Attention.from_layers(*projections(c, b), c.n_heads, c.n_kv_heads, rotary, window=c.sliding_window)

    @classmethod
    def mlp(cls, c: LlamaConfig, b: WeightBuilder) -> Module:
        return cls.MLP.from_layers(linear(b, "ffn_gate", (c.hidden_dim, c.dim)),
                                   linear(b, "ffn_up", (c.hidden_dim, c.dim)),
                                   linear(b, "ffn_down", (c.dim, c.hidden_dim)))

    @classmethod
    def block(cls, c: LlamaConfig, b: WeightBuilder, layer: int, rotary: Any) -> Module:
        return Block(RMSNorm.from_weights(b.get("attn_norm.weight", (c.dim,)), c.norm_eps),
                     cls.attention(c, b, layer, rotary),
                     RMSNorm.from_weights(b.get("ffn_norm.weight", (c.dim,)), c.norm_eps),
                     cls.mlp(c, b))
