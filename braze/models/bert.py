"""BERT encoders (Devlin et al., 2019) for sentence embeddings: MiniLM, BGE, RoBERTa, XLM-R.

    x = LayerNorm(word_emb[ids] + pos_emb[offset + 0..T) + type_emb[type_ids])
    repeat n_layers:
        x = LayerNorm(x + Dense(SelfAttention(x, padding mask)))     # post-norm
        x = LayerNorm(x + Dense(act(Dense(x))))
    embedding = Pool(x over unpadded tokens), then L2-normalised if the model says so

What the model is (shape, activation, pooling, normalisation, longest input) comes from
``bert_config.BertConfig``, read from a sentence-transformers directory or a GGUF
``bert`` file; the weights from the same place, under Hugging Face's or llama.cpp's
tensor names (``_HF`` and ``_GGUF`` below).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..creation import arange, from_numpy
from ..dtypes import float32
from ..functions import cat
from ..io.weights import GGUFWeights, SafetensorsWeights, WeightBuilder
from ..nn import Embedding, LayerNorm, Linear, Module, ModuleList
from ..nn import functional as F
from ..tensor import Tensor
from .bert_config import BertConfig

# Tensor names: (embeddings and their norm, per-layer prefix, per-layer tensors).
_HF = {
    "word": "embeddings.word_embeddings", "pos": "embeddings.position_embeddings",
    "types": "embeddings.token_type_embeddings", "emb_norm": "embeddings.LayerNorm", "layer": "encoder.layer.{i}",
    "q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
    "o": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
    "up": "intermediate.dense", "down": "output.dense", "out_norm": "output.LayerNorm",
}
_GGUF = {
    "word": "token_embd", "pos": "position_embd", "types": "token_types", "emb_norm": "token_embd_norm",
    "layer": "blk.{i}", "q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
    "attn_norm": "attn_output_norm", "up": "ffn_up", "down": "ffn_down", "out_norm": "layer_output_norm",
}
_HF_PREFIXES = ("", "bert.", "roberta.", "model.")


def activation(name: str, h: Tensor) -> Tensor:
    """``BertConfig.act`` applied (the names ``bert_config.ACTIVATIONS`` maps to)."""
    if name == "gelu":
        return F.gelu(h)
    if name == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    if name == "relu":
        return h.relu()
    assert name == "silu", name
    return h.silu()


class SelfAttention(Module):
    def __init__(self, q: Linear, k: Linear, v: Linear, out: Linear, heads: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out, self.heads = q, k, v, out, heads

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        b, t, d = x.dims3()
        hd = d // self.heads

        def heads(y: Tensor) -> Tensor:
            return y.reshape(b, t, self.heads, hd).transpose(1, 2)

        att = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), attn_mask=mask)
        return self.out(att.transpose(1, 2).reshape(b, t, d))


class Layer(Module):
    def __init__(self, attn: SelfAttention, attn_norm: LayerNorm, up: Linear, down: Linear, out_norm: LayerNorm,
                 act: str) -> None:
        super().__init__()
        self.attn, self.attn_norm, self.up, self.down, self.out_norm = attn, attn_norm, up, down, out_norm
        self.act = act

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.attn_norm(x + self.attn(x, mask))
        return self.out_norm(x + self.down(activation(self.act, self.up(x))))


def pool(mode: str, hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """One sentence-transformers pooling mode: (B, T, D) hidden states and a 0/1 mask
    (B, T) of right-padded rows -> (B, D)."""
    if mode == "cls":
        return hidden[:, 0]
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    if mode == "max":
        return hidden.masked_fill(m == 0, -math.inf).amax(1)
    count = m.sum(1).clamp(min=1e-9)
    if mode == "mean":
        return (hidden * m).sum(1) / count
    if mode == "mean_sqrt_len":
        return (hidden * m).sum(1) / count.sqrt()
    t = hidden.shape[1]
    if mode == "weightedmean":  # token i weighs i + 1
        w = m * (arange(t, dtype=hidden.dtype) + 1).reshape(1, t, 1)
        return (hidden * w).sum(1) / w.sum(1).clamp(min=1e-9)
    assert mode == "lasttoken", mode
    last = (arange(t, dtype=hidden.dtype).reshape(1, t, 1) == (m.sum(1, keepdim=True) - 1)).to(hidden.dtype)
    return (hidden * last).sum(1)


class Bert(Module):
    def __init__(self, config: BertConfig, word: Embedding, pos: Embedding, types: Embedding, emb_norm: LayerNorm,
                 layers: list[Layer]) -> None:
        super().__init__()
        self.config = config
        self.word, self.pos, self.types, self.emb_norm = word, pos, types, emb_norm
        self.layers = ModuleList(layers)

    def forward(self, ids: Tensor, attention_mask: Tensor, type_ids: Tensor | None = None) -> Tensor:
        """Hidden states (B, T, dim) for token ids (B, T), right-padded, and a 0/1 mask (B, T)."""
        b, t = ids.dims2()
        positions = arange(self.config.position_offset, self.config.position_offset + t).unsqueeze(0)
        x = self.word(ids, dtype=float32) + self.pos(positions, dtype=float32)
        x = x + self.types(type_ids if type_ids is not None else ids * 0, dtype=float32)
        x = self.emb_norm(x)
        keep = (attention_mask != 0).reshape(b, 1, 1, t)
        for layer in self.layers:
            x = layer(x, keep)
        return x

    def pool(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """Sentence vectors from hidden states, as configured: each pooling mode, concatenated."""
        parts = [pool(mode, hidden, attention_mask) for mode in self.config.pooling]
        out = parts[0] if len(parts) == 1 else cat(parts, -1)
        return F.normalize(out, dim=-1) if self.config.normalize else out

    def embed(self, ids: np.ndarray, attention_mask: np.ndarray, type_ids: np.ndarray | None = None) -> np.ndarray:
        """Embeddings (B, output_dim) as numpy, from padded id and mask arrays."""
        ids_t, mask_t = from_numpy(np.ascontiguousarray(ids, np.int64)), from_numpy(np.ascontiguousarray(attention_mask, np.int64))
        types_t = from_numpy(np.ascontiguousarray(type_ids, np.int64)) if type_ids is not None else None
        return self.pool(self(ids_t, mask_t, types_t), mask_t).numpy()

    @classmethod
    def from_dir(cls, root: str | Path, st: Any) -> "Bert":
        """Build from a model directory (config.json and the sentence-transformers files
        beside the weights) and an open ``braze.io.SafetensorsFile``. Tensor names may
        carry a ``bert.``/``roberta.``/``model.`` prefix."""
        c = BertConfig.from_dir(Path(root))
        vb = WeightBuilder(SafetensorsWeights(st))
        prefix = next((p for p in _HF_PREFIXES if vb.contains(f"{p}{_HF['word']}.weight")), "")
        return cls._build(c, vb.pp(prefix.rstrip(".")) if prefix else vb, _HF)

    @classmethod
    def from_gguf(cls, gguf: Any, progress: Callable[[str], None] | None = None) -> "Bert":
        """Build from an open ``braze.io.GGUFFile`` of architecture ``bert`` (llama.cpp's
        names); quantized and half matrices stay in their type, as in ``Llama``."""
        vb = WeightBuilder(GGUFWeights(gguf), on_load=progress)
        word = gguf.tensors.get("token_embd.weight")
        c = BertConfig.from_gguf(str(gguf.path), gguf.metadata, word.shape[0] if word is not None else None)
        return cls._build(c, vb, _GGUF)

    @classmethod
    def _build(cls, c: BertConfig, vb: WeightBuilder, names: dict[str, str]) -> "Bert":
        def linear(b: WeightBuilder, n_in: int, n_out: int) -> Linear:
            return Linear.from_weights(b.get("weight", (n_out, n_in)), b.get("bias", (n_out,)))

        def norm(b: WeightBuilder) -> LayerNorm:
            return LayerNorm.from_weights(b.get("weight", (c.dim,)), b.get("bias", (c.dim,)), c.norm_eps)

        def embedding(name: str, rows: int) -> Embedding:
            return Embedding.from_weights(vb.pp(names[name]).get("weight", (rows, c.dim)))

        layers = []
        for i in range(c.n_layers):
            b = vb.pp(names["layer"].format(i=i))
            attn = SelfAttention(linear(b.pp(names["q"]), c.dim, c.dim), linear(b.pp(names["k"]), c.dim, c.dim),
                                 linear(b.pp(names["v"]), c.dim, c.dim), linear(b.pp(names["o"]), c.dim, c.dim),
                                 c.n_heads)
            layers.append(Layer(attn, norm(b.pp(names["attn_norm"])), linear(b.pp(names["up"]), c.dim, c.hidden_dim),
                                linear(b.pp(names["down"]), c.hidden_dim, c.dim), norm(b.pp(names["out_norm"])), c.act))
        return cls(c, embedding("word", c.vocab_size), embedding("pos", c.max_positions),
                   embedding("types", c.type_vocab_size), norm(vb.pp(names["emb_norm"])), layers)


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarity of row vectors."""
    v = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return v @ v.T
