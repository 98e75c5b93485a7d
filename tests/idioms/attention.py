"""Attention as model files write it: SDPA, the eager softmax(q k^T) v with causal,
padding, ALiBi and sliding-window masks, GQA/MQA, einsum and baddbmm forms. With q, k
and v given, each is one chain kernel: scores never exist in memory."""

from __future__ import annotations

import math

import numpy as np

import braze
import braze.nn.functional as F

from . import npref as R
from .corpus import idiom, padding_mask, randn

B, H, S, D = 2, 4, 16, 16
Q = randn(B, H, S, D)
K = randn(B, H, S, D)
V = randn(B, H, S, D)
KV2 = randn(B, 2, S, D)
MIN = float(np.finfo(np.float32).min)


def _gqa(x):
    return R.repeat_kv(x, 2)


@idiom(Q, K, V, kernels=1, oracle=lambda q, k, v: R.attention(q, k, v))
def sdpa_plain(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


@idiom(Q, K, V, kernels=1, oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S, 0)))
def sdpa_is_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@idiom(Q, K, V, kernels=1, oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S)))
def eager_causal_masked_fill_nanogpt(q, k, v):
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    bias = braze.tril(braze.ones(S, S)).view(1, 1, S, S)
    att = att.masked_fill(bias[:, :, :S, :S] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    return att @ v


@idiom(Q, K, V, kernels=1, oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S)))
def eager_causal_triu_additive_llama_reference(q, k, v):
    mask = braze.triu(braze.full((S, S), float("-inf")), diagonal=1)
    scores = braze.matmul(q, k.transpose(2, 3)) / math.sqrt(D)
    scores = scores + mask
    scores = F.softmax(scores.float(), dim=-1).type_as(q)
    return braze.matmul(scores, v)


@idiom(Q, K, V, kernels=1, oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S)))
def eager_softmax_with_max_values(q, k, v):
    s = q @ k.mT / math.sqrt(D)
    s = s.masked_fill(~braze.ones(S, S, dtype=braze.bool).tril(), -math.inf)
    p = (s - s.max(dim=-1, keepdim=True)[0]).exp()
    return (p / p.sum(-1, keepdim=True)) @ v


@idiom(Q, K, V, padding_mask(B, S), kernels=1,
       oracle=lambda q, k, v, m: R.attention(q, k, v, m[:, None, None, :] == 1))
def padding_mask_additive_bert(q, k, v, attention_mask):
    ext = (1.0 - attention_mask[:, None, None, :].float()) * braze.finfo(braze.float32).min
    scores = q @ k.transpose(-1, -2) / math.sqrt(D) + ext
    return scores.softmax(-1) @ v


@idiom(Q, K, V, padding_mask(B, S), kernels=1,
       oracle=lambda q, k, v, m: R.attention(q, k, v, (m[:, None, None, :] == 1) & R.causal(S, S)))
def sdpa_with_bool_padding_and_causal_mask(q, k, v, attention_mask):
    causal = braze.ones(S, S, dtype=braze.bool).tril()
    mask = causal[None, None] & attention_mask[:, None, None, :].bool()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@idiom(Q, K, V, kernels=1,
       oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S), bias=(R.alibi_slopes(H)[:, None, None] * (np.arange(S)[None, :] - np.arange(S)[:, None]))[None]))
def alibi_bias_added_to_scores(q, k, v):
    slopes = braze.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)])
    pos = braze.arange(S)
    bias = slopes[:, None, None] * (pos[None, :] - pos[:, None]).float()
    scores = q @ k.mT / math.sqrt(D) + bias
    scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    return scores.softmax(-1) @ v


@idiom(Q, K, V, kernels=1,
       oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S) & (np.arange(S)[None, :] > np.arange(S)[:, None] - 4)))
def sliding_window_attention(q, k, v):
    i = braze.arange(S)
    d = i[:, None] - i[None, :]
    keep = (d >= 0) & (d < 4)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


@idiom(Q, KV2, KV2, kernels=1, oracle=lambda q, k, v: R.attention(q, _gqa(k), _gqa(v), R.causal(S, S, 0)))
def gqa_enable_gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@idiom(Q, KV2, KV2, kernels=1, oracle=lambda q, k, v: R.attention(q, _gqa(k), _gqa(v), R.causal(S, S)))
def gqa_repeat_kv_hf(q, k, v):
    def repeat_kv(x, n_rep):
        b, kvh, s, d = x.shape
        if n_rep == 1:
            return x
        x = x[:, :, None, :, :].expand(b, kvh, n_rep, s, d)
        return x.reshape(b, kvh * n_rep, s, d)
    k, v = repeat_kv(k, 2), repeat_kv(v, 2)
    scores = q @ k.transpose(2, 3) / math.sqrt(D)
    scores = scores + braze.triu(braze.full((S, S), MIN), 1)
    return scores.softmax(-1, dtype=braze.float32).to(q.dtype) @ v


@idiom(Q, KV2, KV2, kernels=1, oracle=lambda q, k, v: R.attention(q, _gqa(k), _gqa(v)))
def gqa_repeat_interleave(q, k, v):  # k.repeat_interleave(n_rep, dim=1)
    k = k.repeat_interleave(2, dim=1)
    v = braze.repeat_interleave(v, 2, dim=1)
    return F.scaled_dot_product_attention(q, k, v)


@idiom(Q, randn(B, 1, S, D), randn(B, 1, S, D), kernels=1,
       oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S)))
def multi_query_attention_broadcast(q, k, v):  # one KV head broadcast over the query heads
    s = (q @ k.transpose(-1, -2)) * D ** -0.5
    s = s.masked_fill(~F.causal_mask(S, S), float("-inf"))
    return s.softmax(-1) @ v


@idiom(Q, K, V, kernels=1, oracle=lambda q, k, v: R.attention(q, k, v))
def einsum_attention(q, k, v):
    scores = braze.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(D)
    return braze.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)


@idiom(randn(B * H, S, D), randn(B * H, S, D), randn(B * H, S, D), randn(B * H, 1, S), kernels=1,
       oracle=lambda q, k, v, al: R.attention(q, k, v, bias=al))
def baddbmm_with_alibi_bloom(q, k, v, alibi):
    scores = braze.baddbmm(alibi, q, k.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(D))
    probs = F.softmax(scores, dim=-1, dtype=braze.float32)
    return braze.bmm(probs, v)


@idiom(Q, K, V, kernels=1, oracle=lambda q, k, v: R.attention(q, k, v, scale=0.1))
def sdpa_custom_scale(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, scale=0.1)


@idiom(Q, K, V, kernels=1,
       oracle=lambda q, k, v: R.softmax(np.tanh(R.f64(q) @ np.swapaxes(R.f64(k), -1, -2) / 4 / 50) * 50) @ v)
def softcapped_attention_gemma2(q, k, v):
    s = q @ k.transpose(2, 3) * D ** -0.5
    s = braze.tanh(s / 50.0) * 50.0
    return F.softmax(s, dim=-1, dtype=braze.float32).to(q.dtype) @ v


@idiom(randn(B, H, 1, D), K, V, kernels=1, oracle=lambda q, k, v: R.attention(q, k, v))
def decode_one_query_over_cache(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


@idiom(randn(B, S, H * D), randn(B, S, H * D), randn(B, S, H * D), kernels=2,
       oracle=lambda q, k, v: R.attention(*(x.reshape(B, S, H, D).transpose(0, 2, 1, 3) for x in (q, k, v))).transpose(0, 2, 1, 3).reshape(B, S, H * D))
def split_heads_attend_merge_heads(q, k, v):  # view/transpose in, transpose/contiguous/view out
    def heads(x):
        return x.view(B, S, H, D).transpose(1, 2)
    y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
    return y.transpose(1, 2).contiguous().view(B, S, H * D)


@idiom(Q, K, V, kernels=1, oracle=lambda q, k, v: R.attention(q, k, v, R.causal(S, S)))
def attention_scores_in_float32_upcast(q, k, v):  # HF: attn_weights.float().softmax().to(dtype)
    w = braze.matmul(q, k.transpose(2, 3)) * (D ** -0.5)
    w = w + braze.triu(braze.full((S, S), MIN), diagonal=1)[None, None]
    w = w.float().softmax(dim=-1).to(q.dtype)
    return braze.matmul(w, v)
