"""Tiny BERT embedders for the tests: random weights written as a sentence-transformers
directory (safetensors, configs, a WordPiece tokenizer.json) or as a GGUF ``bert`` file
(with the ``gguf`` package, as llama.cpp's converter lays it out), and a float64 numpy
BERT written from the paper's equations, independently of braze.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "house", "big", "small", "is", "and", ".", ",", "!",
         "##s", "##ed", "##ing", "un", "##happy", "hello", "world"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
TEXTS = ["The cat sat on the mat.", "A big dog ran!", "unhappy cats and dogs", "Hello, world. Zebra?"]

DIM, LAYERS, HEADS, HIDDEN, POSITIONS, TYPES = 16, 2, 4, 32, 40, 2


def weights(seed: int = 0, positions: int = POSITIONS, types: int = TYPES) -> dict[str, np.ndarray]:
    """Hugging Face names, float32."""
    rng = np.random.default_rng(seed)

    def r(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {"embeddings.word_embeddings.weight": r(len(VOCAB), DIM), "embeddings.position_embeddings.weight": r(positions, DIM),
         "embeddings.token_type_embeddings.weight": r(types, DIM),
         "embeddings.LayerNorm.weight": 1 + r(DIM, scale=0.1), "embeddings.LayerNorm.bias": r(DIM, scale=0.1)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for name, (n_out, n_in) in {"attention.self.query": (DIM, DIM), "attention.self.key": (DIM, DIM),
                                    "attention.self.value": (DIM, DIM), "attention.output.dense": (DIM, DIM),
                                    "intermediate.dense": (HIDDEN, DIM), "output.dense": (DIM, HIDDEN)}.items():
            w[p + name + ".weight"] = r(n_out, n_in, scale=1 / math.sqrt(n_in))
            w[p + name + ".bias"] = r(n_out, scale=0.1)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + name + ".weight"] = 1 + r(DIM, scale=0.1)
            w[p + name + ".bias"] = r(DIM, scale=0.1)
    return w


def hf_tokenizer(max_length: int = 512) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.enable_truncation(max_length)
    return tok


def write_dir(root: Path, w: dict[str, np.ndarray], *, pooling: tuple[str, ...] = ("mean",), normalize: bool = True,
              act: str = "gelu", model_type: str = "bert", max_seq_length: int | None = None,
              prefix: str = "", modules: list[dict[str, Any]] | None = None) -> Path:
    """A sentence-transformers directory for ``w``."""
    from safetensors.numpy import save_file
    root.mkdir(parents=True, exist_ok=True)
    positions = w["embeddings.position_embeddings.weight"].shape[0]
    config = {"architectures": ["BertModel"], "model_type": model_type, "hidden_size": DIM, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "intermediate_size": HIDDEN, "max_position_embeddings": positions,
              "type_vocab_size": w["embeddings.token_type_embeddings.weight"].shape[0], "vocab_size": len(VOCAB),
              "layer_norm_eps": 1e-12, "hidden_act": act, "pad_token_id": 0}
    (root / "config.json").write_text(json.dumps(config))
    save_file({prefix + k: v for k, v in w.items()}, str(root / "model.safetensors"))
    hf_tokenizer().save(str(root / "tokenizer.json"))
    keys = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
            "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens", "weightedmean": "pooling_mode_weightedmean_tokens",
            "lasttoken": "pooling_mode_lasttoken"}
    (root / "1_Pooling").mkdir(exist_ok=True)
    (root / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": DIM, **{v: k in pooling for k, v in keys.items()}}))
    st = "sentence_transformers.models."
    if modules is None:
        modules = [{"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": st + "Normalize"})
    (root / "modules.json").write_text(json.dumps(modules))
    if max_seq_length is not None:
        (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return root


_GGUF_NAMES = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
               "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
               "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}


def gguf_name(hf: str) -> str:
    """llama.cpp's name for a Hugging Face BERT tensor name."""
    fixed = {"embeddings.word_embeddings": "token_embd", "embeddings.position_embeddings": "position_embd",
             "embeddings.token_type_embeddings": "token_types", "embeddings.LayerNorm": "token_embd_norm"}
    stem, kind = hf.rsplit(".", 1)
    if stem in fixed:
        return f"{fixed[stem]}.{kind}"
    _, _, i, rest = stem.split(".", 3)
    return f"blk.{i}.{_GGUF_NAMES[rest]}.{kind}"


def phantom(token: str) -> str:
    """llama.cpp's converter's spelling of a WordPiece token (control tokens kept)."""
    if token.startswith("[") and token.endswith("]"):
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def write_gguf(path: Path, w: dict[str, np.ndarray], vocab: list[str], *, dims: tuple[int, int, int, int],
               pooling_type: int | None = 1, eps: float = 1e-12, quant: Any = None,
               extra: dict[str, Any] | None = None) -> Path:
    """A GGUF ``bert`` file as llama.cpp's converter writes one; ``dims`` = (width,
    layers, heads, ffn width); with ``quant`` (a GGMLQuantizationType) the 2-d matrices
    whose rows hold whole blocks, but the position and type tables, are stored quantized."""
    import gguf
    dim, layers, heads, hidden = dims
    wr = gguf.GGUFWriter(str(path), "bert")
    wr.add_context_length(w["embeddings.position_embeddings.weight"].shape[0])
    wr.add_embedding_length(dim)
    wr.add_feed_forward_length(hidden)
    wr.add_block_count(layers)
    wr.add_head_count(heads)
    wr.add_layer_norm_eps(eps)
    wr.add_causal_attention(False)
    if pooling_type is not None:
        wr.add_pooling_type(gguf.PoolingType(pooling_type))
    wr.add_token_type_count(w["embeddings.token_type_embeddings.weight"].shape[0])
    wr.add_tokenizer_model("bert")
    control = [t.startswith("[") and t.endswith("]") for t in vocab]
    wr.add_token_list([phantom(t) for t in vocab])
    wr.add_token_types([3 if c else 1 for c in control])
    ids = {t: i for i, t in enumerate(vocab)}
    wr.add_bos_token_id(ids["[CLS]"])
    wr.add_eos_token_id(ids["[SEP]"])
    wr.add_sep_token_id(ids["[SEP]"])
    wr.add_unk_token_id(ids["[UNK]"])
    wr.add_pad_token_id(ids["[PAD]"])
    for k, v in (extra or {}).items():
        wr.add_key_value(k, v[0], v[1])
    for name, value in w.items():
        g = gguf_name(name)
        if (quant is not None and value.ndim == 2 and value.shape[1] % gguf.GGML_QUANT_SIZES[quant][0] == 0
                and not g.startswith(("position_embd", "token_types"))):
            wr.add_tensor(g, gguf.quants.quantize(value, quant), raw_dtype=quant)
        else:
            wr.add_tensor(g, value)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


# ------------------------------------------------------------ the numpy reference

def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x)


ACTS = {
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "gelu_new": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: np.maximum(x, 0),
}


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def reference(w: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray | None = None, *,
              pooling: tuple[str, ...] = ("mean",), normalize: bool = True, act: str = "gelu",
              offset: int = 0, heads: int = HEADS) -> np.ndarray:
    """Sentence embeddings (B, D * len(pooling)) in float64, sentence by sentence (no padding)."""
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    n_layers = len({k.split(".")[2] for k in w if k.startswith("encoder.layer.")})
    out = []
    for b in range(ids.shape[0]):
        n = int(mask[b].sum())
        tok = ids[b, :n]
        ty = type_ids[b, :n] if type_ids is not None else np.zeros(n, np.int64)
        x = (w64["embeddings.word_embeddings.weight"][tok] + w64["embeddings.position_embeddings.weight"][offset:offset + n]
             + w64["embeddings.token_type_embeddings.weight"][ty])
        x = _layer_norm(x, w64["embeddings.LayerNorm.weight"], w64["embeddings.LayerNorm.bias"])
        for i in range(n_layers):
            def lin(name: str, v: np.ndarray) -> np.ndarray:
                p = f"encoder.layer.{i}.{name}"
                return v @ w64[p + ".weight"].T + w64[p + ".bias"]

            d = x.shape[1]
            hd = d // heads
            q, k, v = (lin(f"attention.self.{m}", x).reshape(n, heads, hd).transpose(1, 0, 2)
                       for m in ("query", "key", "value"))
            s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
            p_ = np.exp(s - s.max(-1, keepdims=True))
            p_ /= p_.sum(-1, keepdims=True)
            att = (p_ @ v).transpose(1, 0, 2).reshape(n, d)
            p = f"encoder.layer.{i}."
            x = _layer_norm(x + lin("attention.output.dense", att), w64[p + "attention.output.LayerNorm.weight"],
                            w64[p + "attention.output.LayerNorm.bias"])
            x = _layer_norm(x + lin("output.dense", ACTS[act](lin("intermediate.dense", x))),
                            w64[p + "output.LayerNorm.weight"], w64[p + "output.LayerNorm.bias"])
        weights_ = np.arange(1, n + 1, dtype=np.float64)[:, None]
        modes = {"cls": x[0], "max": x.max(0), "mean": x.mean(0), "mean_sqrt_len": x.sum(0) / math.sqrt(n),
                 "weightedmean": (x * weights_).sum(0) / weights_.sum(), "lasttoken": x[n - 1]}
        e = np.concatenate([modes[m] for m in pooling])
        out.append(e / np.linalg.norm(e) if normalize else e)
    return np.stack(out)
