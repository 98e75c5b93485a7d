"""numpy oracles shared by the corpus modules, written independently of braze (float64
inside, then the dtype the snippet's result should have)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

F32 = np.float32
_erf = np.vectorize(math.erf, otypes=[np.float64])


def f64(x: Any) -> np.ndarray:
    return np.asarray(x, np.float64)


def softmax(x: Any, axis: int = -1) -> np.ndarray:
    x = f64(x)
    m = x.max(axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    return e / e.sum(axis, keepdims=True)


def log_softmax(x: Any, axis: int = -1) -> np.ndarray:
    x = f64(x)
    s = x - x.max(axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis, keepdims=True))


def sigmoid(x: Any) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-f64(x)))


def silu(x: Any) -> np.ndarray:
    return f64(x) * sigmoid(x)


def gelu(x: Any) -> np.ndarray:
    x = f64(x)
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Any) -> np.ndarray:
    x = f64(x)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def softplus(x: Any) -> np.ndarray:
    return np.logaddexp(0.0, f64(x))


def layer_norm(x: Any, w: Any = None, b: Any = None, eps: float = 1e-5) -> np.ndarray:
    x = f64(x)
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps)
    if w is not None:
        y = y * f64(w)
    if b is not None:
        y = y + f64(b)
    return y


def rms_norm(x: Any, w: Any = None, eps: float = 1e-6) -> np.ndarray:
    x = f64(x)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * f64(w) if w is not None else y


def l2_normalize(x: Any, axis: int = -1, eps: float = 1e-12) -> np.ndarray:
    x = f64(x)
    return x / np.maximum(np.sqrt((x * x).sum(axis, keepdims=True)), eps)


def rotate_half(x: Any) -> np.ndarray:
    x = f64(x)
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def rope_tables(seq: int, dim: int, base: float = 10000.0, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(seq, dim) cos and sin, half-split layout (the frequencies repeated twice)."""
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    ang = np.outer(np.arange(start, start + seq, dtype=np.float64), inv)
    ang = np.concatenate([ang, ang], -1)
    return np.cos(ang), np.sin(ang)


def rope_interleaved(x: Any, seq_axis: int, base: float = 10000.0) -> np.ndarray:
    """Rotate pairs (x[2i], x[2i+1]) by position * base^(-2i/d), positions along ``seq_axis``."""
    x = f64(x)
    d = x.shape[-1]
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(np.arange(x.shape[seq_axis], dtype=np.float64), inv)  # (S, d/2)
    shape = [1] * (x.ndim - 1) + [d // 2]
    shape[seq_axis] = x.shape[seq_axis]
    c, s = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def causal(q: int, k: int, offset: int | None = None) -> np.ndarray:
    """True where query i may see key j (queries are the last positions by default)."""
    off = k - q if offset is None else offset
    return np.arange(k)[None, :] <= np.arange(q)[:, None] + off


def attention(q: Any, k: Any, v: Any, mask: Any = None, scale: float | None = None, bias: Any = None) -> np.ndarray:
    q, k, v = f64(q), f64(k), f64(v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        s = s + f64(bias)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return softmax(s) @ v


def repeat_kv(x: Any, n: int, axis: int = 1) -> np.ndarray:
    return np.repeat(np.asarray(x), n, axis=axis)


def alibi_slopes(heads: int) -> np.ndarray:
    """The ALiBi paper's slopes for a power-of-two head count: 2^(-8 i / n)."""
    return 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)
