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

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import FormatError, Unsupported, short_repr
from ..io.validate import Fields, read_json

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
        archs = cfg.get("architectures", [])
        if model_type not in ENCODER_TYPES and not (isinstance(archs, list) and "BertModel" in archs):
            raise Unsupported("bert", f"{path}: model_type {short_repr(model_type)} is not a BERT-family encoder "
                                      f"(known: {', '.join(ENCODER_TYPES)})")
        position_type = cfg.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise Unsupported("bert", f"{path}: position_embedding_type {short_repr(position_type)} is not one braze runs "
                                      "(absolute)")
        pooling, normalize = _modules(root)

        f = Fields(path, cfg)
        positions = f.count("max_position_embeddings")
        # RoBERTa numbers positions from padding_idx + 1 (HF's create_position_ids_from_input_ids)
        offset = f.count("pad_token_id", 1, lo=0) + 1 if model_type in ("roberta", "xlm-roberta") else 0
        max_length = positions - offset
        st_path = root / "sentence_bert_config.json"
        st_cfg = _read_json(st_path, required=False)
        if st_cfg.get("max_seq_length") is not None:
            max_length = min(max_length, Fields(st_path, st_cfg).count("max_seq_length"))
        return _checked(cls(
            vocab_size=f.count("vocab_size"), dim=f.count("hidden_size"), n_layers=f.count("num_hidden_layers", hi=1024),
            n_heads=f.count("num_attention_heads"), hidden_dim=f.count("intermediate_size"),
            max_positions=positions, type_vocab_size=f.count("type_vocab_size", 2),
            norm_eps=f.real("layer_norm_eps", 1e-12, hi=1.0), act=activation(cfg.get("hidden_act", "gelu"), str(path)),
            pooling=pooling, normalize=normalize, max_length=max_length, position_offset=offset,
        ), str(path))

    @classmethod
    def from_gguf(cls, path: str, meta: Mapping[str, Any], vocab_size: int | None = None) -> "BertConfig":
        arch = meta.get("general.architecture")
        if arch != "bert":
            raise Unsupported("bert", f"{path}: architecture {arch!r} is not 'bert'")

        fields = Fields(path, meta)

        def field(key: str, default: Any = None, lo: int = 1) -> int:
            full = key if key.startswith("tokenizer.") else f"bert.{key}"
            if default is None:
                return fields.count(full, lo=lo)
            return fields.count(full, default, lo=lo)

        pooling_type = field("pooling_type", 1, lo=0)
        if pooling_type not in GGUF_POOLING:
            what = {0: "none (one vector per token)", 4: "rank (a reranker's score)"}.get(pooling_type, "unknown")
            raise Unsupported("bert", f"{path}: bert.pooling_type {pooling_type} is {what}; braze embeds "
                                      f"sentences with {', '.join(f'{k} ({v})' for k, v in GGUF_POOLING.items())}")
        if meta.get("bert.attention.causal", False):
            raise Unsupported("bert", f"{path}: bert.attention.causal is true; a BERT encoder attends both ways")
        eps = fields.real("bert.attention.layer_norm_epsilon", 1e-12, hi=1.0)
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
        raise FormatError(path, field, None, f"activation {short_repr(name)} is not one braze runs "
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


def _read_json(path: Path, required: bool, expect: type = dict) -> Any:
    """A JSON file of the directory (``validate.read_json``: bounded, typed errors), or
    ``{}`` for an optional one that is absent."""
    if not path.exists() and not path.is_symlink() and not required:
        return {}
    return read_json(path, expect)


def _positive(value: Any, path: Path, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FormatError(str(path), field, None, f"expected a positive integer, got {value!r}")
    return value


def _modules(root: Path) -> tuple[tuple[str, ...], bool]:
    """Pooling modes and normalisation from ``modules.json`` (sentence-transformers'
    pipeline after the encoder); without one, a bare Hugging Face directory: mean pooling
    from ``1_Pooling/config.json`` when present, no normalisation."""
    path = root / "modules.json"
    if not path.exists():
        pool = root / "1_Pooling" / "config.json"
        return (_pooling(pool) if pool.exists() else ("mean",)), False
    modules = _read_json(path, required=True, expect=list)
    pooling: tuple[str, ...] | None = None
    normalize = False
    for i, m in enumerate(modules):
        kind = m.get("type") if isinstance(m, dict) else None
        if not isinstance(kind, str):
            raise FormatError(str(path), f"[{i}].type", None, "expected a module type", value=m)
        short = kind.removeprefix(_ST)
        if short == "Transformer" and i == 0:
            continue
        if short == "Pooling" and pooling is None and not normalize:
            sub = Fields(path, m, f"[{i}].").text("path", "1_Pooling")
            if not sub or Path(sub).is_absolute() or ".." in Path(sub).parts:
                raise FormatError(str(path), f"[{i}].path", None, "must name a folder inside the model directory",
                                  value=sub)
            pooling = _pooling(root / sub / "config.json")
        elif short == "Normalize" and pooling is not None:
            normalize = True
        else:
            raise Unsupported("bert", f"{path}: module {i} ({short_repr(kind)}) is not one braze runs; it runs "
                                      "Transformer, then Pooling, then Normalize or not")
    return pooling if pooling is not None else ("mean",), normalize


def _pooling(path: Path) -> tuple[str, ...]:
    cfg = _read_json(path, required=True)
    mode = cfg.get("pooling_mode")  # sentence-transformers' constructor argument, in some files
    if isinstance(mode, str):
        name = {"mean_sqrt_len_tokens": "mean_sqrt_len", "weightedmean": "weightedmean"}.get(mode, mode)
        name = name.removesuffix("_tokens").removesuffix("_token")
        if name not in POOLING_MODES:
            raise FormatError(str(path), "pooling_mode", None, f"unknown pooling mode {short_repr(mode)}")
        return (name,)
    keys = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
            "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
            "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}
    flags = Fields(path, cfg)
    modes = tuple(m for m in POOLING_MODES if flags.flag(keys[m], False))
    if not modes:
        raise FormatError(str(path), "pooling_mode_*", None, "no pooling mode is on")
    return modes
