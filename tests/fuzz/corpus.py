"""The bases every mutation starts from: a tiny Llama GGUF file carrying SmolLM2's real
metadata (its tokenizer cut to its first tokens, its sizes shrunk to match tiny
tensors), and a tiny BERT directory with all-MiniLM-L6-v2's real JSON files and
tokenizer. Small, so that thousands of mutated copies load in seconds."""

from __future__ import annotations

import functools
import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from braze.io import GGUFFile
from braze.models import default_embedder_path, default_llm_path

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
         I64: "<q", F64: "<d"}

N_TOKENS = 512
DIM, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 4, 2, 64

#: a metadata entry: (key, GGUF value type, value); an array's value is (item type, items)
Entry = tuple[str, int, Any]


def encode_value(vtype: int, value: Any) -> bytes:
    """One GGUF value; out-of-range numbers wrap or saturate as struct allows (a
    hostile value need not be representable: it is made so)."""
    if vtype == STR:
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
        return struct.pack("<Q", len(raw)) + raw
    if vtype == ARR:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(encode_value(etype, v) for v in items)
    fmt = _PACK[vtype]
    if fmt[-1] in "fd":
        return struct.pack(fmt, float(value))
    bits = struct.calcsize(fmt) * 8
    n = int(value)
    return struct.pack(fmt.upper(), n % (1 << bits))  # the unsigned code of the same size


def write_gguf(entries: list[Entry], tensors: list[tuple[str, np.ndarray]], alignment: int = 32) -> bytes:
    """A GGUF v3 file: ``entries`` as metadata, float32 ``tensors``."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(entries))]
    for key, vtype, value in entries:
        out.append(encode_value(STR, key) + struct.pack("<I", vtype) + encode_value(vtype, value))
    offset = 0
    for name, arr in tensors:
        ne = list(reversed(arr.shape))
        out.append(encode_value(STR, name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
                   + struct.pack("<IQ", 0, offset))
        offset += -(-arr.nbytes // alignment) * alignment
    head = b"".join(out)
    data = b"".join(arr.astype("<f4").tobytes() + bytes(-arr.nbytes % alignment) for _, arr in tensors)
    return head + bytes(-len(head) % alignment) + data


def _gguf_type(value: Any, original: int) -> int:
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, str):
        return STR
    if isinstance(value, float):
        return original if original in (F32, F64) else F32
    return original if original not in (STR, BOOL, F32, F64, ARR) else U32


@functools.lru_cache(maxsize=1)
def llama_entries() -> tuple[Entry, ...]:
    """SmolLM2's metadata with its sizes shrunk to the tiny tensors and its vocabulary
    cut to ``N_TOKENS`` (the merges to those whose parts are kept)."""
    f = GGUFFile(default_llm_path())
    meta = {k: f.metadata.peek(k) for k in f.metadata}
    f.close()
    tokens = meta["tokenizer.ggml.tokens"][:N_TOKENS]
    keep = set(tokens)
    meta["tokenizer.ggml.tokens"] = tokens
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"][:N_TOKENS]
    meta["tokenizer.ggml.merges"] = [m for m in meta["tokenizer.ggml.merges"][:4000]
                                     if all(p in keep for p in m.split(" ")) and m.replace(" ", "") in keep]
    meta.update({"llama.block_count": LAYERS, "llama.embedding_length": DIM, "llama.feed_forward_length": FFN,
                 "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS,
                 "llama.vocab_size": N_TOKENS, "llama.rope.dimension_count": DIM // HEADS})
    entries: list[Entry] = []
    for key, value in meta.items():
        if isinstance(value, list):
            etype = STR if value and isinstance(value[0], str) else I32
            entries.append((key, ARR, (etype, value)))
        elif isinstance(value, float):
            entries.append((key, F32, value))
        else:
            entries.append((key, _gguf_type(value, U32), value))
    return tuple(entries)


@functools.lru_cache(maxsize=1)
def llama_tensors() -> tuple[tuple[str, np.ndarray], ...]:
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    hd = DIM // HEADS
    out = [("token_embd.weight", w(N_TOKENS, DIM)), ("output_norm.weight", np.ones(DIM, np.float32))]
    for i in range(LAYERS):
        out += [(f"blk.{i}.attn_norm.weight", np.ones(DIM, np.float32)), (f"blk.{i}.attn_q.weight", w(DIM, DIM)),
                (f"blk.{i}.attn_k.weight", w(KV_HEADS * hd, DIM)), (f"blk.{i}.attn_v.weight", w(KV_HEADS * hd, DIM)),
                (f"blk.{i}.attn_output.weight", w(DIM, DIM)), (f"blk.{i}.ffn_norm.weight", np.ones(DIM, np.float32)),
                (f"blk.{i}.ffn_gate.weight", w(FFN, DIM)), (f"blk.{i}.ffn_up.weight", w(FFN, DIM)),
                (f"blk.{i}.ffn_down.weight", w(DIM, FFN))]
    return tuple(out)


@functools.lru_cache(maxsize=1)
def llama_bytes() -> bytes:
    return write_gguf(list(llama_entries()), list(llama_tensors()))


EMBEDDER_JSON = ("config.json", "1_Pooling/config.json", "modules.json", "sentence_bert_config.json",
                 "tokenizer_config.json", "tokenizer.json")


@functools.lru_cache(maxsize=1)
def embedder_base() -> Path:
    """A tiny BERT directory: MiniLM's JSON files and tokenizer, its sizes shrunk
    (hidden 32, 2 layers, 4 heads) to random weights of those shapes."""
    src = default_embedder_path()
    root = Path(tempfile.mkdtemp(prefix="braze-fuzz-embedder-"))
    for name in EMBEDDER_JSON:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / name, root / name)
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(hidden_size=DIM, num_hidden_layers=2, num_attention_heads=4, intermediate_size=FFN)
    (root / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(1)
    v, p, t = cfg["vocab_size"], cfg["max_position_embeddings"], cfg.get("type_vocab_size", 2)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    ts = {"embeddings.word_embeddings.weight": w(v, DIM), "embeddings.position_embeddings.weight": w(p, DIM),
          "embeddings.token_type_embeddings.weight": w(t, DIM), "embeddings.LayerNorm.weight": np.ones(DIM, np.float32),
          "embeddings.LayerNorm.bias": np.zeros(DIM, np.float32)}
    for i in range(2):
        b = f"encoder.layer.{i}."
        for name, shape in (("attention.self.query", (DIM, DIM)), ("attention.self.key", (DIM, DIM)),
                            ("attention.self.value", (DIM, DIM)), ("attention.output.dense", (DIM, DIM)),
                            ("intermediate.dense", (FFN, DIM)), ("output.dense", (DIM, FFN))):
            ts[b + name + ".weight"], ts[b + name + ".bias"] = w(*shape), w(shape[0])
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            ts[b + norm + ".weight"], ts[b + norm + ".bias"] = np.ones(DIM, np.float32), np.zeros(DIM, np.float32)
    save_file(ts, str(root / "model.safetensors"))
    return root
