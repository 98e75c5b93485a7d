"""Tiny decoders of each architecture braze runs, for tests/test_zoo.py.

Each ``Spec`` is written as a GGUF file with random weights (the ``gguf`` package's
writer; a byte-level tokenizer and a chat template included, so the file runs through
``braze generate`` as a downloaded one would), and ``reference_logits`` is the same
architecture written again here in numpy float64, from the papers' equations and
llama.cpp's conventions, sharing no code with braze: one loop per head, masks as
boolean matrices, rotary angles computed per position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, quants

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass
class Spec:
    name: str
    arch: str
    layers: int = 3
    dim: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    hidden: int = 96
    ctx: int = 128
    rope_base: float = 10000.0
    interleaved: bool = False
    window: int | None = None  # every layer's (Mistral, Phi-3)
    qk_norm: bool = False
    rope_freqs: bool = False  # Llama 3: a divisor per frequency (rope_freqs.weight)
    longrope: int | None = None  # Phi-3: the original context; short factors before it, long after
    gemma: bool = False
    attn_softcap: float | None = None
    final_softcap: float | None = None
    q8: tuple[str, ...] = ()  # tensor name suffixes written quantized, as ``qtype``
    qtype: str = "Q8_0"
    meta: dict[str, Any] = field(default_factory=dict)
    atol: float = 1e-4
    seed: int = 0  # chosen so that no greedy step of the reference is a near tie

    def local(self, layer: int) -> bool:
        """Gemma 3: five sliding-window layers, then a global one."""
        return self.gemma and (layer + 1) % 6 != 0

    def layer_window(self, layer: int) -> int | None:
        return self.window if (not self.gemma or self.local(layer)) else None


SPECS = [
    Spec("llama3_rope_scaling", "llama", interleaved=True, rope_freqs=True, rope_base=500000.0),
    Spec("mistral_sliding_window", "llama", interleaved=True, window=5, q8=("ffn_down.weight",), atol=2e-3,
         seed=1),
    Spec("qwen3", "qwen3", head_dim=24, qk_norm=True, rope_base=1e6),
    Spec("phi3", "phi3", heads=4, kv_heads=4, window=7, longrope=16, q8=("attn_qkv.weight", "ffn_up.weight"),
         atol=2e-3, seed=1),
    Spec("gemma3", "gemma3", layers=7, kv_heads=1, head_dim=32, gemma=True, window=5, rope_base=1e6, qk_norm=True,
         attn_softcap=2.0, final_softcap=3.0, seed=3),
]


# -- the file --------------------------------------------------------------------------------

def _byte_tokens() -> list[str]:
    """GPT-2's printable alphabet for the 256 bytes, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def weights(spec: Spec, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights by GGUF tensor name (rows x columns as braze reads them)."""
    rng = np.random.default_rng(seed)
    vocab = 256 + len(SPECIALS)
    d, hd, ff = spec.dim, spec.head_dim, spec.hidden
    q, kv = spec.heads * hd, spec.kv_heads * hd

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": (rng.standard_normal((vocab, d)) * (0.05 if spec.gemma else 1)).astype(np.float32),
         "output_norm.weight": norm(d)}
    if not spec.gemma:
        w["output.weight"] = mat(vocab, d)
    if spec.rope_freqs:
        w["rope_freqs.weight"] = np.linspace(1, 8, hd // 2).astype(np.float32)
    if spec.longrope:
        w["rope_factors_short.weight"] = np.linspace(1, 1.5, hd // 2).astype(np.float32)
        w["rope_factors_long.weight"] = np.linspace(1, 6, hd // 2).astype(np.float32)
    for i in range(spec.layers):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"], w[b + "ffn_norm.weight"] = norm(d), norm(d)
        if spec.arch == "phi3":
            w[b + "attn_qkv.weight"] = mat(q + 2 * kv, d)
            w[b + "ffn_up.weight"] = mat(2 * ff, d)
        else:
            w[b + "attn_q.weight"], w[b + "attn_k.weight"], w[b + "attn_v.weight"] = mat(q, d), mat(kv, d), mat(kv, d)
            w[b + "ffn_gate.weight"], w[b + "ffn_up.weight"] = mat(ff, d), mat(ff, d)
        w[b + "attn_output.weight"], w[b + "ffn_down.weight"] = mat(d, q), mat(d, ff)
        if spec.qk_norm:
            w[b + "attn_q_norm.weight"], w[b + "attn_k_norm.weight"] = norm(hd), norm(hd)
        if spec.gemma:
            w[b + "post_attention_norm.weight"], w[b + "post_ffw_norm.weight"] = norm(d), norm(d)
    return w


def write(spec: Spec, path: Path) -> dict[str, np.ndarray]:
    """Write the model; returns its weights as the file holds them (quantized ones dequantized), float64."""
    w = weights(spec, spec.seed)
    a = spec.arch
    out = GGUFWriter(str(path), arch=a)
    u32 = {"context_length": spec.ctx, "embedding_length": spec.dim, "block_count": spec.layers,
           "feed_forward_length": spec.hidden, "attention.head_count": spec.heads,
           "attention.head_count_kv": spec.kv_heads, "attention.key_length": spec.head_dim,
           "attention.value_length": spec.head_dim}
    if spec.window:
        u32["attention.sliding_window"] = spec.window
    if spec.longrope:
        u32["rope.scaling.original_context_length"] = spec.longrope
    for k, v in u32.items():
        out.add_uint32(f"{a}.{k}", v)
    out.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    out.add_float32(f"{a}.rope.freq_base", spec.rope_base)
    if spec.attn_softcap:
        out.add_float32(f"{a}.attn_logit_softcapping", spec.attn_softcap)
    if spec.final_softcap:
        out.add_float32(f"{a}.final_logit_softcapping", spec.final_softcap)
    for k, v in spec.meta.items():
        out.add_key_value(f"{a}.{k}", v, GGUFValueType.get_type(v))
    tokens = _byte_tokens() + SPECIALS
    out.add_string("tokenizer.ggml.model", "gpt2")
    out.add_string("tokenizer.ggml.pre", "default")
    out.add_array("tokenizer.ggml.tokens", tokens)
    out.add_array("tokenizer.ggml.token_type", [1] * 256 + [3] * len(SPECIALS))
    out.add_uint32("tokenizer.ggml.bos_token_id", 256)
    out.add_uint32("tokenizer.ggml.eos_token_id", 258)
    out.add_string("tokenizer.chat_template", CHAT_TEMPLATE)
    held = {}
    for name, t in w.items():
        if name.endswith(spec.q8):
            qt = GGMLQuantizationType[spec.qtype]
            raw = quants.quantize(t, qt)
            out.add_tensor(name, raw, raw_dtype=qt)
            held[name] = quants.dequantize(raw, qt).reshape(t.shape).astype(np.float64)
        else:
            out.add_tensor(name, t)
            held[name] = t.astype(np.float64)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return held


# -- the reference ---------------------------------------------------------------------------

def _rms(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _angles(spec: Spec, w: dict[str, np.ndarray], layer: int, positions: np.ndarray) -> tuple[np.ndarray, float]:
    """(T, head_dim / 2) rotation angles and the factor on cos and sin."""
    hd = spec.head_dim
    base = 10000.0 if spec.local(layer) else spec.rope_base
    theta = base ** (-np.arange(0, hd, 2) / hd)
    if spec.rope_freqs:
        theta = theta / w["rope_freqs.weight"]
    if not spec.longrope:
        return np.outer(positions, theta), 1.0
    rows = [theta / w["rope_factors_long.weight" if p >= spec.longrope else "rope_factors_short.weight"]
            for p in positions]
    mscale = math.sqrt(1 + math.log(spec.ctx / spec.longrope) / math.log(spec.longrope))
    return positions[:, None] * np.array(rows), mscale


def _rotate(spec: Spec, x: np.ndarray, angles: np.ndarray, mscale: float) -> np.ndarray:
    """x: (T, heads, head_dim). Interleaved pairs (2i, 2i+1) or half-split pairs (i, i + d/2)."""
    cos, sin = np.cos(angles)[:, None, :] * mscale, np.sin(angles)[:, None, :] * mscale
    out = np.empty_like(x)
    if spec.interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    else:
        h = spec.head_dim // 2
        a, b = x[..., :h], x[..., h:]
        out[..., :h], out[..., h:] = a * cos - b * sin, b * cos + a * sin
    return out


def reference_logits(spec: Spec, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """(T, vocab) float64 logits of the whole sequence, causal."""
    t, hd, H, KV = len(ids), spec.head_dim, spec.heads, spec.kv_heads
    x = w["token_embd.weight"][ids] * (math.sqrt(spec.dim) if spec.gemma else 1.0)
    pos = np.arange(t)
    i, j = pos[:, None], pos[None, :]
    scale = 1 / math.sqrt(hd)
    for layer in range(spec.layers):
        p = lambda n: w[f"blk.{layer}.{n}.weight"]  # noqa: E731
        h = _rms(x, p("attn_norm"))
        if spec.arch == "phi3":
            q, k, v = np.split(h @ p("attn_qkv").T, [H * hd, (H + KV) * hd], axis=-1)
        else:
            q, k, v = h @ p("attn_q").T, h @ p("attn_k").T, h @ p("attn_v").T
        q, k, v = q.reshape(t, H, hd), k.reshape(t, KV, hd), v.reshape(t, KV, hd)
        if spec.qk_norm:
            q, k = _rms(q, p("attn_q_norm")), _rms(k, p("attn_k_norm"))
        ang, mscale = _angles(spec, w, layer, pos)
        q, k = _rotate(spec, q, ang, mscale), _rotate(spec, k, ang, mscale)
        visible = j <= i
        window = spec.layer_window(layer)
        if window is not None:
            visible &= (i - j) < window
        heads = []
        for head in range(H):
            kv = head // (H // KV)
            s = q[:, head] @ k[:, kv].T * scale
            if spec.attn_softcap:
                s = spec.attn_softcap * np.tanh(s / spec.attn_softcap)
            s = np.where(visible, s, -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            heads.append((e / e.sum(-1, keepdims=True)) @ v[:, kv])
        a = np.concatenate(heads, -1) @ p("attn_output").T
        x = x + (_rms(a, p("post_attention_norm")) if spec.gemma else a)
        h = _rms(x, p("ffn_norm"))
        if spec.arch == "phi3":
            gate, up = np.split(h @ p("ffn_up").T, 2, axis=-1)
        else:
            gate, up = h @ p("ffn_gate").T, h @ p("ffn_up").T
        act = _gelu_tanh(gate) if spec.gemma else gate / (1 + np.exp(-gate))
        m = (act * up) @ p("ffn_down").T
        x = x + (_rms(m, p("post_ffw_norm")) if spec.gemma else m)
    logits = _rms(x, w["output_norm.weight"]) @ w.get("output.weight", w["token_embd.weight"]).T
    if spec.final_softcap:
        logits = spec.final_softcap * np.tanh(logits / spec.final_softcap)
    return logits


def reference_greedy(spec: Spec, w: dict[str, np.ndarray], prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """n greedy ids (each from the whole sequence recomputed) and each step's top-2 margin."""
    ids, margins = list(prompt), []
    for _ in range(n):
        row = reference_logits(spec, w, ids)[-1]
        top = np.sort(row)[-2:]
        margins.append(float(top[1] - top[0]))
        ids.append(int(np.argmax(row)))
    return ids[len(prompt):], margins
