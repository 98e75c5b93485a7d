"""What a BERT-family embedder is, read from its files before any weight is.

Two sources give the same ``BertConfig``:

* a sentence-transformers directory: the shape from Hugging Face's ``config.json``; the
  modules after the encoder from ``modules.json`` (a ``Pooling`` module's
  ``config.json``, a ``Normalize`` module or not); the longest input from
  ``sentence_bert_config.json`` (``max_seq_length``), else the position table;
* a GGUF ``bert`` file, as llama.cpp's converter writes it: ``bert.*`` keys
  (``bert.pooling_type``: 1 mean, 2 CLS, 3 last token) and the token-type count
  in ``tokenizer.ggml.token_type_count``. GGUF records no normalisation; braze
  normalises as ``llama-embedding`` does by default.

Everything braze cannot run (an activation, a pooling mode, a module after the pooling)
is refused here, naming the file and the field, so a model fails at once and not half
way through loading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import FormatError, Unsupported

ACTIVATIONS = {
    "gelu": "gelu", "gelu_python": "gelu",  # erf
    "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_tanh": "gelu_tanh",
    "relu": "relu", "silu": "silu", "swish": "silu",
}
"""``hidden_act`` values -> the function braze applies (tanh GELU in all its spellings)."""

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len", "weightedmean", "lasttoken")
"""sentence-transformers' pooling modes, in the order it concatenates them when several
are on."""

GGUF_POOLING = {1: "mean", 2: "cls", 3: "lasttoken"}
"""``bert.pooling_type`` (llama.cpp's enum) -> the pooling mode; 0 (none) and 4 (rank)
give no sentence vector."""

ENCODER_TYPES = ("bert", "roberta", "xlm-roberta")
_ST = "sentence_transformers.models."


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
    act: str  # a value of ACTIVATIONS
    pooling: tuple[str, ...]  # modes of POOLING_MODES, concatenated in this order
    normalize: bool
    max_length: int  # longest input in tokens, [CLS] and [SEP] included
    position_offset: int = 0  # RoBERTa's positions start past its padding index

    @property
    def output_dim(self) -> int:
        return self.dim * len(self.pooling)

    @classmethod
    def from_dir(cls, root: Path) -> "BertConfig":
        path = root / "config.json"
        cfg = _read_json(path, required=True)
        model_type = cfg.get("model_type", "bert")
        if model_type not in ENCODER_TYPES and "BertModel" not in cfg.get("architectures", []):
            raise Unsupported("bert", f"{path}: model_type {model_type!r} is not a BERT-family encoder "
                                      f"(known: {', '.join(ENCODER_TYPES)})")
        position_type = cfg.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise Unsupported("bert", f"{path}: position_embedding_type {position_type!r} is not one braze runs "
                                      "(absolute)")
        pooling, normalize = _modules(root)

        def num(key: str, kind: type, default: Any = None) -> Any:
            value = cfg.get(key, default)
            if value is None:
                raise FormatError(str(path), key, None, "required config key is missing")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
                raise FormatError(str(path), key, None, f"expected a number, got {value!r}")
            return kind(value)

        positions = num("max_position_embeddings", int)
        # RoBERTa numbers positions from padding_idx + 1 (HF's create_position_ids_from_input_ids)
        offset = num("pad_token_id", int, 1) + 1 if model_type in ("roberta", "xlm-roberta") else 0
        max_length = positions - offset
        st_cfg = _read_json(root / "sentence_bert_config.json", required=False)
        if st_cfg.get("max_seq_length") is not None:
            max_length = min(max_length, _positive(st_cfg["max_seq_length"], root / "sentence_bert_config.json",
                                                   "max_seq_length"))
        return _checked(cls(
            vocab_size=num("vocab_size", int), dim=num("hidden_size", int), n_layers=num("num_hidden_layers", int),
            n_heads=num("num_attention_heads", int), hidden_dim=num("intermediate_size", int),
            max_positions=positions, type_vocab_size=num("type_vocab_size", int, 2),
            norm_eps=num("layer_norm_eps", float, 1e-12), act=activation(cfg.get("hidden_act", "gelu"), str(path)),
            pooling=pooling, normalize=normalize, max_length=max_length, position_offset=offset,
        ), str(path))

    @classmethod
    def from_gguf(cls, path: str, meta: Mapping[str, Any], vocab_size: int | None = None) -> "BertConfig":
        arch = meta.get("general.architecture")
        if arch != "bert":
            raise Unsupported("bert", f"{path}: architecture {arch!r} is not 'bert'")

        def field(key: str, default: Any = None) -> int:
            full = key if key.startswith("tokenizer.") else f"bert.{key}"
            value = meta.get(full, default)
            if value is None:
                raise FormatError(path, full, None, "required metadata key is missing")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FormatError(path, full, None, f"expected a non-negative integer, got {value!r}")
            return value

        pooling_type = field("pooling_type", 1)
        if pooling_type not in GGUF_POOLING:
            what = {0: "none (one vector per token)", 4: "rank (a reranker's score)"}.get(pooling_type, "unknown")
            raise Unsupported("bert", f"{path}: bert.pooling_type {pooling_type} is {what}; braze embeds "
                                      f"sentences with {', '.join(f'{k} ({v})' for k, v in GGUF_POOLING.items())}")
        if meta.get("bert.attention.causal", False):
            raise Unsupported("bert", f"{path}: bert.attention.causal is true; a BERT encoder attends both ways")
        eps = meta.get("bert.attention.layer_norm_epsilon", 1e-12)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise FormatError(path, "bert.attention.layer_norm_epsilon", None, f"expected a number, got {eps!r}")
        context = field("context_length")
        tokens = meta.get("tokenizer.ggml.tokens")
        n_vocab = vocab_size if vocab_size is not None else len(tokens) if isinstance(tokens, list) else 0
        return _checked(cls(
            vocab_size=n_vocab, dim=field("embedding_length"), n_layers=field("block_count"),
            n_heads=field("attention.head_count"), hidden_dim=field("feed_forward_length"),
            max_positions=context, type_vocab_size=field("tokenizer.ggml.token_type_count", 2),
            norm_eps=float(eps), act="gelu", pooling=(GGUF_POOLING[pooling_type],), normalize=True,
            max_length=context,
        ), path)


def activation(name: Any, path: str, field: str = "hidden_act") -> str:
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise FormatError(path, field, None, f"activation {name!r} is not one braze runs "
                                             f"(known: {', '.join(sorted(ACTIVATIONS))})")
    return ACTIVATIONS[name]


def _checked(c: BertConfig, path: str) -> BertConfig:
    for name in ("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_positions", "type_vocab_size"):
        if getattr(c, name) <= 0:
            raise FormatError(path, name, None, f"must be positive, got {getattr(c, name)}")
    if c.dim % c.n_heads:
        raise FormatError(path, "num_attention_heads", None, f"{c.n_heads} heads do not divide width {c.dim}")
    if c.max_length <= 0:
        raise FormatError(path, "max_position_embeddings", None,
                          f"{c.max_positions} positions leave no room past the offset {c.position_offset}")
    return c


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.exists() and not required:
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FormatError(str(path), path.name, None, f"cannot read it: {e}") from None
    if not isinstance(value, (dict, list)):
        raise FormatError(str(path), path.name, None, "expected a JSON object")
    return value  # type: ignore[return-value]  # modules.json is a list


def _positive(value: Any, path: Path, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FormatError(str(path), field, None, f"expected a positive integer, got {value!r}")
    return value


def _modules(root: Path) -> tuple[tuple[str, ...], bool]:
    """Pooling modes and normalisation from ``modules.json`` (sentence-transformers'
    pipeline after the encoder); without one, a bare Hugging Face directory: mean pooling
    from ``1_Pooling/config.json`` when present, no normalisation."""
    path = root / "modules.json"
    modules: Any = _read_json(path, required=False)
    if not path.exists():
        pool = root / "1_Pooling" / "config.json"
        return (_pooling(pool) if pool.exists() else ("mean",)), False
    if not isinstance(modules, list):
        raise FormatError(str(path), "modules.json", None, "expected a list of modules")
    pooling: tuple[str, ...] | None = None
    normalize = False
    for i, m in enumerate(modules):
        kind = m.get("type") if isinstance(m, dict) else None
        if not isinstance(kind, str):
            raise FormatError(str(path), f"[{i}].type", None, f"expected a module type, got {m!r}")
        short = kind.removeprefix(_ST)
        if short == "Transformer" and i == 0:
            continue
        if short == "Pooling" and pooling is None and not normalize:
            pooling = _pooling(root / str(m.get("path", "1_Pooling")) / "config.json")
        elif short == "Normalize" and pooling is not None:
            normalize = True
        else:
            raise Unsupported("bert", f"{path}: module {i} ({kind}) is not one braze runs; it runs "
                                      "Transformer, then Pooling, then Normalize or not")
    return pooling if pooling is not None else ("mean",), normalize


def _pooling(path: Path) -> tuple[str, ...]:
    cfg = _read_json(path, required=True)
    mode = cfg.get("pooling_mode")  # sentence-transformers' constructor argument, in some files
    if isinstance(mode, str):
        name = {"mean_sqrt_len_tokens": "mean_sqrt_len", "weightedmean": "weightedmean"}.get(mode, mode)
        name = name.removesuffix("_tokens").removesuffix("_token")
        if name not in POOLING_MODES:
            raise FormatError(str(path), "pooling_mode", None, f"unknown pooling mode {mode!r}")
        return (name,)
    keys = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
            "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
            "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}
    modes = tuple(m for m in POOLING_MODES if cfg.get(keys[m]))
    if not modes:
        raise FormatError(str(path), "pooling_mode_*", None, "no pooling mode is on")
    return modes
