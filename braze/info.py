"""What a model file is, and whether braze runs it: the summary ``braze info`` prints first.

For a GGUF file of any architecture and for an embedder directory (config.json,
model.safetensors, the sentence-transformers files): the architecture, the parameter
count, the quantization mix (tensors and bytes per tensor type), the context length,
the chat template (present or not, its first line), and a verdict: which braze command
runs it, or why braze cannot. Only headers and metadata are read, never tensor data.

The verdict asks the same config readers that loading does (``LlamaConfig.from_gguf``,
``BertConfig.from_gguf``/``from_dir``, the tokenizer's model), so ``info`` and ``generate``
or ``embed`` cannot disagree on what is supported.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from .errors import BrazeError

LLM_TOKENIZERS = ("gpt2", "llama")


@dataclass
class ModelInfo:
    path: Path
    format: str
    architecture: str
    parameters: int
    quant_mix: dict[str, tuple[int, int]]  # tensor type -> (tensors, bytes), largest first
    context_length: int | None
    chat_template: str | None  # the whole template, None when the model has none
    runnable: bool
    verdict: str  # the braze command that runs it, or why none does


def describe(path: str | Path) -> ModelInfo:
    """A summary of a GGUF file, an embedder directory or a safetensors file."""
    from .models import ModelNotFound
    p = Path(path)
    if not p.exists():
        raise ModelNotFound(f"no such model file or directory: {p}")
    if p.is_file() and p.suffix != ".safetensors":
        return _describe_gguf(p)
    return _describe_dir(p.parent if p.is_file() else p)


def _mix(items: list[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for kind, nbytes in items:
        count[kind] += 1
        size[kind] += nbytes
    return {k: (count[k], size[k]) for k, _ in size.most_common()}


def _describe_gguf(path: Path) -> ModelInfo:
    from .io.gguf import GGUFFile
    with GGUFFile(path) as f:
        meta = f.metadata
        arch = meta.get("general.architecture")
        arch_name = arch if isinstance(arch, str) else "unknown (no general.architecture)"
        context = meta.get(f"{arch_name}.context_length")
        template = meta.get("tokenizer.chat_template")
        runnable, verdict = _gguf_verdict(str(path), meta, f.tensors)
        return ModelInfo(
            path=path, format=f"GGUF v{f.version}", architecture=arch_name,
            parameters=sum(prod(t.shape) for t in f.tensors.values()),
            quant_mix=_mix([(t.qtype.name, t.nbytes) for t in f.tensors.values()]),
            context_length=context if isinstance(context, int) and not isinstance(context, bool) else None,
            chat_template=template if isinstance(template, str) else None,
            runnable=runnable, verdict=verdict)


def _gguf_verdict(path: str, meta: Any, tensors: Any) -> tuple[bool, str]:
    """Whether a braze command runs this file, from its metadata and tensor shapes."""
    arch = meta.get("general.architecture")
    tokenizer = meta.get("tokenizer.ggml.model")
    try:
        if arch == "bert":
            from .models.bert_config import BertConfig
            embd = tensors.get("token_embd.weight")
            c = BertConfig.from_gguf(path, meta, embd.shape[0] if embd is not None else None)
            if tokenizer != "bert":
                return False, f"no: a BERT model needs a WordPiece tokenizer ('bert'), this file has {tokenizer!r}"
            return True, (f"yes, with braze embed ({'+'.join(c.pooling)} pooling, normalized, "
                          f"{c.output_dim}-d vectors, up to {c.max_length} tokens)")
        from .models import llm_class
        embd = tensors.get("token_embd.weight")
        c2 = llm_class(arch, path).Config.from_gguf(path, meta, embd.shape[0] if embd is not None else 0)
        if tokenizer not in LLM_TOKENIZERS:
            return False, (f"no: tokenizer model {tokenizer!r} (braze reads {', '.join(LLM_TOKENIZERS)})"
                           if tokenizer is not None else "no: the file has no tokenizer (tokenizer.ggml.model)")
        return True, (f"yes, with braze generate and braze chat ({c2.arch}: {c2.n_layers} layers, {c2.n_heads} heads, "
                      f"{c2.n_kv_heads} KV heads)")
    except BrazeError as e:
        return False, f"no: {e}"


def _describe_dir(root: Path) -> ModelInfo:
    from .io.safetensors import SafetensorsFile
    weights = root / "model.safetensors"
    try:
        cfg = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    arch = str(cfg.get("model_type") or ",".join(cfg.get("architectures", [])) or "unknown (no config.json)")
    params, mix = 0, {}
    if weights.exists():
        with SafetensorsFile(weights) as st:
            params = sum(prod(t.shape) for t in st.tensors.values())
            mix = _mix([(str(t.dtype).upper(), t.end - t.start) for t in st.tensors.values()])
    template: Any = None
    try:
        template = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        pass
    runnable, verdict, context = _dir_verdict(root, weights)
    return ModelInfo(path=root, format="safetensors directory", architecture=arch, parameters=params, quant_mix=mix,
                     context_length=context, chat_template=template if isinstance(template, str) else None,
                     runnable=runnable, verdict=verdict)


def _dir_verdict(root: Path, weights: Path) -> tuple[bool, str, int | None]:
    from .models.bert_config import BertConfig
    try:
        c = BertConfig.from_dir(root)
    except BrazeError as e:
        return False, f"no: {e} (braze runs BERT-family embedders from directories, language models from GGUF)", None
    for need in (weights, root / "tokenizer.json"):
        if not need.exists():
            return False, f"no: {need.name} is missing from {root}", c.max_length
    return True, (f"yes, with braze embed ({'+'.join(c.pooling)} pooling, "
                  f"{'normalized' if c.normalize else 'not normalized'}, {c.output_dim}-d vectors, "
                  f"up to {c.max_length} tokens)"), c.max_length


def _count(n: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit} ({n:,})"
    return str(n)


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def summary_lines(info: ModelInfo) -> list[str]:
    """The summary as ``braze info`` prints it."""
    if info.chat_template is None:
        template = "none"
    else:
        first = info.chat_template.strip().splitlines()[0] if info.chat_template.strip() else ""
        template = f"present, first line: {first[:100]!r}" + (" ..." if len(first) > 100 else "")
    mix = "; ".join(f"{k}: {n} tensor{'s' if n != 1 else ''}, {_bytes(b)}" for k, (n, b) in info.quant_mix.items())
    return [
        f"{info.path}: {info.format}",
        f"  architecture:   {info.architecture}",
        f"  parameters:     {_count(info.parameters)}",
        f"  tensor types:   {mix or 'none'}",
        f"  context length: {info.context_length if info.context_length is not None else 'unknown'}",
        f"  chat template:  {template}",
        f"  runs in braze:  {info.verdict}",
    ]
