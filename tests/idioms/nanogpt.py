"""nanoGPT's model and sampling code, piece by piece: qkv split, heads, causal
attention, merge, MLP with GELU, the LayerNorm with optional bias, the last position's
logits, and the top-k filter of its generate loop."""

from __future__ import annotations

import math

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, randint, randn

B, T, C, NH = 2, 8, 32, 4
HD = C // NH


def _heads_np(x):
    return x.reshape(B, T, NH, HD).transpose(0, 2, 1, 3)


def _merge_np(y):
    return y.transpose(0, 2, 1, 3).reshape(B, T, C)


def _attn_np(qkv):
    q, k, v = (_heads_np(t) for t in np.split(qkv, 3, axis=2))
    return _merge_np(R.attention(q, k, v, R.causal(T, T)))


@idiom(randn(B, T, 3 * C), kernels=2, oracle=_attn_np)
def causal_self_attention_flash_path(qkv):  # after c_attn; the merge copy is the second kernel
    q, k, v = qkv.split(C, dim=2)
    k = k.view(B, T, NH, C // NH).transpose(1, 2)
    q = q.view(B, T, NH, C // NH).transpose(1, 2)
    v = v.view(B, T, NH, C // NH).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
    return y.transpose(1, 2).contiguous().view(B, T, C)


@idiom(randn(B, T, 3 * C), kernels=2, oracle=_attn_np)
def causal_self_attention_manual_path(qkv):
    q, k, v = qkv.split(C, dim=2)
    q, k, v = (t.view(B, T, NH, HD).transpose(1, 2) for t in (q, k, v))
    bias = braze.tril(braze.ones(T, T)).view(1, 1, T, T)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = att @ v
    return y.transpose(1, 2).contiguous().view(B, T, C)


@idiom(randn(B, T, C), randn(4 * C, C), randn(4 * C), randn(C, 4 * C), randn(C), kernels=4,
       oracle=lambda x, w1, b1, w2, b2: R.gelu(R.f64(x) @ w1.T + b1) @ w2.T + b2, rtol=1e-4, atol=1e-4)
def mlp(x, w_fc, b_fc, w_proj, b_proj):
    x = F.linear(x, w_fc, b_fc)
    x = F.gelu(x)
    return F.linear(x, w_proj, b_proj)


@idiom(randn(B, T, C), randn(C), kernels=1, oracle=lambda x, w: R.layer_norm(x, w))
def layer_norm_with_optional_bias(x, weight):
    bias = None
    return F.layer_norm(x, weight.shape, weight, bias, 1e-5)


@idiom(randn(B, T, C), randn(B, T, C), randn(C), randn(C), kernels=1,
       oracle=lambda x, a, w, b: (R.f64(x) + a, R.layer_norm(R.f64(x) + a, w, b)))
def residual_then_next_layer_norm(x, attn_out, w, b):
    x = x + attn_out
    return x, F.layer_norm(x, (C,), w, b, 1e-5)


@idiom(randint(0, 50, B, T), randn(50, C), randn(T, C), kernels=1,
       oracle=lambda idx, wte, wpe: wte[idx] + wpe[np.arange(T)])
def token_plus_position_embeddings(idx, wte, wpe):
    pos = braze.arange(0, T, dtype=braze.long)
    tok_emb = F.embedding(idx, wte)
    pos_emb = F.embedding(pos, wpe)
    return tok_emb + pos_emb


@idiom(randn(B, T, C), randn(50, C), kernels=2, oracle=lambda x, w: x[:, [-1], :] @ w.T)
def lm_head_on_last_position(x, wte):  # inference-time mini-optimization: x[:, [-1], :]
    return F.linear(x[:, [-1], :], wte)


@idiom(randn(B, 50, scale=2.0), kernels=3,
       oracle=lambda x: R.softmax(np.where(x / 0.8 < np.sort(x / 0.8, -1)[:, -5:-4], -np.inf, x / 0.8)))
def generate_top_k_then_softmax(logits):
    logits = logits / 0.8
    v, _ = braze.topk(logits, min(5, logits.size(-1)))
    logits[logits < v[:, [-1]]] = -float("Inf")
    return F.softmax(logits, dim=-1)


@idiom(randn(B, T, 50), kernels=1, oracle=lambda x: R.softmax(R.f64(x[:, -1, :]) / 1.0))
def generate_temperature_one(logits):
    return F.softmax(logits[:, -1, :] / 1.0, dim=-1)


@idiom(randn(B, T, C), kernels=1, oracle=lambda x: R.gelu_tanh(x))
def new_gelu_class(x):
    return 0.5 * x * (1.0 + braze.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * braze.pow(x, 3.0))))
