"""BERT encoders (Devlin et al., 2019) for sentence embeddings: MiniLM, BGE.

    x = LayerNorm(word_emb[ids] + pos_emb[0..T) + type_emb[type_ids])
    repeat n_layers:
        x = LayerNorm(x + Dense(SelfAttention(x, padding mask)))     # post-norm
        x = LayerNorm(x + Dense(GELU(Dense(x))))
    embedding = Pool(x over unpadded tokens), then L2-normalised if the model says so

The shape comes from Hugging Face's ``config.json``; pooling and normalisation from
the sentence-transformers files beside it (``1_Pooling/config.json``, ``modules.json``),
as sentence-transformers itself reads them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, Unsupported
from ..io.weights import SafetensorsWeights, WeightBuilder
from ..nn import Embedding, LayerNorm, Linear, Module, ModuleList
from ..nn import functional as F
from ..creation import arange, from_numpy
from ..tensor import Tensor


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    hidden_dim: int
    max_positions: int
    type_vocab_size: int
    norm_eps: float
    act: str
    pooling: str  # "mean", "cls" or "max"
    normalize: bool
    max_length: int

    @classmethod
    def from_dir(cls, root: Path) -> "BertConfig":
        path = root / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise FormatError(str(path), "config.json", None, f"cannot read the model config: {e}") from None
        if cfg.get("model_type", "bert") not in ("bert", "xlm-roberta", "roberta") and "BertModel" not in cfg.get("architectures", []):
            raise Unsupported("bert", f"{path}: model_type {cfg.get('model_type')!r} is not a BERT encoder")
        pooling = "mean"
        pool_cfg = root / "1_Pooling" / "config.json"
        if pool_cfg.exists():
            p = json.loads(pool_cfg.read_text())
            pooling = "cls" if p.get("pooling_mode_cls_token") else "max" if p.get("pooling_mode_max_tokens") else "mean"
        modules = root / "modules.json"
        normalize = modules.exists() and any(m.get("type", "").endswith("Normalize") for m in json.loads(modules.read_text()))
        st_cfg = root / "sentence_bert_config.json"
        max_length = json.loads(st_cfg.read_text()).get("max_seq_length", 512) if st_cfg.exists() else 512
        try:
            return cls(
                vocab_size=int(cfg["vocab_size"]), dim=int(cfg["hidden_size"]),
                n_layers=int(cfg["num_hidden_layers"]), n_heads=int(cfg["num_attention_heads"]),
                hidden_dim=int(cfg["intermediate_size"]), max_positions=int(cfg["max_position_embeddings"]),
                type_vocab_size=int(cfg.get("type_vocab_size", 2)), norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
                act=str(cfg.get("hidden_act", "gelu")), pooling=pooling, normalize=normalize,
                max_length=min(int(max_length), int(cfg["max_position_embeddings"])),
            )
        except KeyError as e:
            raise FormatError(str(path), e.args[0], None, "required config key is missing") from None


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
        h = self.up(x)
        h = F.gelu(h, approximate="tanh") if self.act in ("gelu_new", "gelu_pytorch_tanh") else F.gelu(h)
        return self.out_norm(x + self.down(h))


class Bert(Module):
    def __init__(self, config: BertConfig, word: Embedding, pos: Embedding, types: Embedding, emb_norm: LayerNorm,
                 layers: list[Layer]) -> None:
        super().__init__()
        self.config = config
        self.word, self.pos, self.types, self.emb_norm = word, pos, types, emb_norm
        self.layers = ModuleList(layers)

    def forward(self, ids: Tensor, attention_mask: Tensor, type_ids: Tensor | None = None) -> Tensor:
        """Hidden states (B, T, dim) for token ids (B, T) and a 0/1 mask (B, T)."""
        b, t = ids.dims2()
        x = self.word(ids) + self.pos(arange(t).unsqueeze(0))
        x = x + self.types(type_ids if type_ids is not None else ids * 0)
        x = self.emb_norm(x)
        keep = (attention_mask != 0).reshape(b, 1, 1, t)
        for layer in self.layers:
            x = layer(x, keep)
        return x

    def pool(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """Sentence vectors from hidden states, as configured (mean over real tokens by default)."""
        if self.config.pooling == "cls":
            out = hidden[:, 0]
        else:
            m = attention_mask.to(hidden.dtype).unsqueeze(-1)
            if self.config.pooling == "max":
                out = hidden.masked_fill(m == 0, -math.inf).amax(1)
            else:
                out = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(out, dim=-1) if self.config.normalize else out

    def embed(self, ids: np.ndarray, attention_mask: np.ndarray, type_ids: np.ndarray | None = None) -> np.ndarray:
        """Embeddings (B, dim) as numpy, from padded id and mask arrays."""
        ids_t, mask_t = from_numpy(np.ascontiguousarray(ids, np.int64)), from_numpy(np.ascontiguousarray(attention_mask, np.int64))
        types_t = from_numpy(np.ascontiguousarray(type_ids, np.int64)) if type_ids is not None else None
        return self.pool(self(ids_t, mask_t, types_t), mask_t).numpy()

    @classmethod
    def from_dir(cls, root: str | Path, st: Any) -> "Bert":
        """Build from a model directory (config.json beside the weights) and an open
        ``braze.io.SafetensorsFile``. Tensor names may carry a ``bert.`` prefix."""
        root = Path(root)
        c = BertConfig.from_dir(root)
        vb = WeightBuilder(SafetensorsWeights(st))
        if vb.contains("bert.embeddings.word_embeddings.weight"):
            vb = vb.pp("bert")

        def linear(b: WeightBuilder, n_in: int, n_out: int) -> Linear:
            return Linear.from_weights(b.get("weight", (n_out, n_in)), b.get("bias", (n_out,)))

        def norm(b: WeightBuilder) -> LayerNorm:
            return LayerNorm.from_weights(b.get("weight", (c.dim,)), b.get("bias", (c.dim,)), c.norm_eps)

        e = vb.pp("embeddings")
        layers = []
        for i in range(c.n_layers):
            b = vb.pp("encoder").pp("layer").pp(i)
            s = b.pp("attention").pp("self")
            attn = SelfAttention(linear(s.pp("query"), c.dim, c.dim), linear(s.pp("key"), c.dim, c.dim),
                                 linear(s.pp("value"), c.dim, c.dim),
                                 linear(b.pp("attention").pp("output").pp("dense"), c.dim, c.dim), c.n_heads)
            layers.append(Layer(attn, norm(b.pp("attention").pp("output").pp("LayerNorm")),
                                linear(b.pp("intermediate").pp("dense"), c.dim, c.hidden_dim),
                                linear(b.pp("output").pp("dense"), c.hidden_dim, c.dim),
                                norm(b.pp("output").pp("LayerNorm")), c.act))
        return cls(c, Embedding.from_weights(e.get("word_embeddings.weight", (c.vocab_size, c.dim))),
                   Embedding.from_weights(e.get("position_embeddings.weight", (c.max_positions, c.dim))),
                   Embedding.from_weights(e.get("token_type_embeddings.weight", (c.type_vocab_size, c.dim))),
                   norm(e.pp("LayerNorm")), layers)


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarity of row vectors."""
    v = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return v @ v.T

