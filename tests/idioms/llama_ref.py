"""The Llama reference implementation (model.py / generation.py), piece by piece:
RMSNorm in float, precompute_freqs_cis and apply_rotary_emb in reals, repeat_kv in its
(B, S, H, D) layout, the causal mask with hstack for the cache, attention, the SwiGLU
feed-forward, the cache write and sample_top_p's nucleus mask."""

from __future__ import annotations

import math

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, randint, randn

B, S, H, KVH, HD = 2, 6, 4, 2, 8
DIM = H * HD


def _rms_np(x, w, eps=1e-5):
    return (R.rms_norm(x.astype(np.float32), None, eps).astype(np.float32).astype(x.dtype) * w).astype(x.dtype)


@idiom(randn(B, S, DIM, dtype=np.float16), randn(DIM, dtype=np.float16), kernels=1, oracle=_rms_np,
       rtol=2e-3, atol=2e-3)
def rms_norm_half_computed_in_float(x, weight):
    def _norm(t):
        return t * braze.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5)
    output = _norm(x.float()).type_as(x)
    return output * weight


def _freqs_np(dim, end, theta=10000.0):
    freqs = 1.0 / theta ** (np.arange(0, dim, 2)[: dim // 2] / dim)
    ang = np.outer(np.arange(end), freqs)
    return np.cos(ang), np.sin(ang)


@idiom(kernels=1, oracle=lambda: _freqs_np(HD, S))
def precompute_freqs_cos_sin(theta=10000.0):
    freqs = 1.0 / (theta ** (braze.arange(0, HD, 2)[: (HD // 2)].float() / HD))
    t = braze.arange(S).float()
    freqs = braze.outer(t, freqs).float()
    return braze.cos(freqs), braze.sin(freqs)


def _rot(x):
    x = x.float().reshape(*x.shape[:-1], -1, 2)
    c, s = _freqs_cs()
    c = c.view(1, S, 1, HD // 2)
    s = s.view(1, S, 1, HD // 2)
    re, im = x[..., 0], x[..., 1]
    return braze.stack([re * c - im * s, re * s + im * c], -1).flatten(3)


def _freqs_cs():
    freqs = 1.0 / (10000.0 ** (braze.arange(0, HD, 2).float() / HD))
    f = braze.outer(braze.arange(S).float(), freqs)
    return f.cos(), f.sin()


@idiom(randn(B, S, H, HD), randn(B, S, KVH, HD), kernels=2,
       oracle=lambda q, k: (R.rope_interleaved(q, 1), R.rope_interleaved(k, 1)))
def apply_rotary_emb_to_q_and_k(xq, xk):  # two shapes (KV heads): two kernels
    return _rot(xq).type_as(xq), _rot(xk).type_as(xk)


@idiom(randn(B, S, KVH, HD), kernels=1, oracle=lambda x: np.repeat(x, 2, axis=2))
def repeat_kv_bshd_returned(x):  # returned, so it is stored: one copy kernel
    bs, slen, n_kv_heads, head_dim = x.shape
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, 2, head_dim).reshape(bs, slen, n_kv_heads * 2, head_dim)


@idiom(randn(B, H, S, HD), randn(B, S, KVH, HD), randn(B, S, KVH, HD), kernels=1,
       oracle=lambda q, k, v: R.attention(q, np.repeat(k, 2, 2).transpose(0, 2, 1, 3), np.repeat(v, 2, 2).transpose(0, 2, 1, 3), R.causal(S, S)))
def attention_with_repeat_kv_and_mask(xq, keys, values):
    def repeat_kv(x, n_rep):
        bs, slen, n_kv_heads, head_dim = x.shape
        return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    keys = repeat_kv(keys, 2).transpose(1, 2)
    values = repeat_kv(values, 2).transpose(1, 2)
    mask = braze.triu(braze.full((S, S), float("-inf")), diagonal=1)
    scores = braze.matmul(xq, keys.transpose(2, 3)) / math.sqrt(HD)
    scores = scores + mask
    scores = F.softmax(scores.float(), dim=-1).type_as(xq)
    return braze.matmul(scores, values)


@idiom(4, kernels=1,
       oracle=lambda p: np.hstack([np.zeros((S, p)), np.triu(np.full((S, S), -np.inf), 1)]).astype(np.float32))
def causal_mask_with_hstack_for_cache(start_pos):
    mask = braze.full((S, S), float("-inf"))
    mask = braze.triu(mask, diagonal=1)
    return braze.hstack([braze.zeros((S, start_pos)), mask])


@idiom(randn(B, H, S, HD), randn(B, H, S, HD), randn(B, H, S, HD), kernels=2,
       oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S)).transpose(0, 2, 1, 3).reshape(B, S, -1))
def attention_output_transposed_back(xq, keys, values):
    mask = braze.triu(braze.full((S, S), float("-inf")), diagonal=1)
    scores = braze.matmul(xq, keys.transpose(2, 3)) / math.sqrt(HD) + mask
    output = braze.matmul(F.softmax(scores.float(), dim=-1).type_as(xq), values)
    return output.transpose(1, 2).contiguous().view(B, S, -1)


@idiom(randn(B, S, DIM), randn(64, DIM), randn(DIM, 64), randn(64, DIM), kernels=4,
       oracle=lambda x, w1, w2, w3: (R.silu(R.f64(x) @ w1.T) * (R.f64(x) @ w3.T)) @ w2.T, rtol=1e-4, atol=1e-4)
def feed_forward_swiglu(x, w1, w2, w3):
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


@idiom(randint(0, 40, B, S), randn(40, DIM), kernels=1, oracle=lambda t, w: w[t])
def token_embeddings(tokens, weight):
    return F.embedding(tokens, weight)


@idiom(randn(B, S, DIM), randn(40, DIM), kernels=1, oracle=lambda h, w: (R.f64(h) @ w.T)[:, -1])
def output_logits_last_position_float(h, weight):
    return F.linear(h[:, -1, :], weight).float()
