"""Attention masks as model code builds them: triu/tril, arange comparisons, padding
masks broadcast to (B, 1, Q, K), additive masks with finfo.min, sliding windows, ALiBi."""

from __future__ import annotations

import math

import numpy as np

import braze

from . import npref as R
from .corpus import bools, idiom, padding_mask, randn

S = 12
MIN = float(np.finfo(np.float32).min)


@idiom(S, kernels=1, oracle=lambda n: np.triu(np.full((n, n), -np.inf, np.float32), 1))
def causal_additive_triu_of_full(n):  # llama reference
    return braze.triu(braze.full((n, n), float("-inf")), diagonal=1)


@idiom(S, kernels=1, oracle=lambda n: np.tril(np.ones((n, n), np.float32)))
def tril_of_ones_buffer(n):  # nanoGPT's registered "bias"
    return braze.tril(braze.ones(n, n))


@idiom(S, kernels=1, oracle=lambda n: np.tril(np.ones((n, n), bool)))
def bool_tril_of_ones(n):
    return braze.ones(n, n, dtype=braze.bool).tril()


@idiom(S, kernels=1, oracle=lambda n: ~np.triu(np.ones((n, n), bool), 1))
def not_of_bool_triu(n):
    return ~braze.ones(n, n, dtype=braze.bool).triu(diagonal=1)


@idiom(S, kernels=1, oracle=lambda n: R.causal(n, n))
def causal_from_arange_compare(n):
    i = braze.arange(n)
    return i[None, :] <= i[:, None]


@idiom(4, S, kernels=1, oracle=lambda q, k: R.causal(q, k))
def causal_with_cache_offset(q_len, kv_len):  # queries are the last positions
    return braze.arange(kv_len)[None, :] <= braze.arange(kv_len - q_len, kv_len)[:, None]


@idiom(randn(2, 3, S, S), kernels=1, oracle=lambda s: np.where(R.causal(S, S), s, -np.inf).astype(np.float32))
def masked_fill_with_tril_eq_zero(scores):  # nanoGPT: att.masked_fill(bias == 0, -inf)
    n = scores.shape[-1]
    bias = braze.tril(braze.ones(n, n)).view(1, 1, n, n)
    return scores.masked_fill(bias[:, :, :n, :n] == 0, float("-inf"))


@idiom(randn(2, 3, S, S), kernels=1, oracle=lambda s: np.where(R.causal(S, S), s, MIN).astype(np.float32))
def masked_fill_with_finfo_min(scores):
    n = scores.shape[-1]
    mask = braze.ones(n, n, dtype=braze.bool).triu(1)
    return scores.masked_fill(mask, braze.finfo(scores.dtype).min)


@idiom(padding_mask(3, S), kernels=1,
       oracle=lambda m: ((1.0 - m[:, None, None, :].astype(np.float32)) * MIN).astype(np.float32))
def bert_extended_attention_mask(attention_mask):
    ext = attention_mask[:, None, None, :].to(braze.float32)
    return (1.0 - ext) * braze.finfo(braze.float32).min


@idiom(padding_mask(3, S), kernels=1,
       oracle=lambda m: np.broadcast_to(m[:, None, None, :].astype(bool), (3, 1, S, S)))
def padding_mask_expanded_to_4d(attention_mask):
    b, k = attention_mask.shape
    return attention_mask[:, None, None, :].expand(b, 1, S, k).to(braze.bool)


@idiom(padding_mask(3, S), kernels=1,
       oracle=lambda m: np.where(R.causal(S, S)[None, None] & (m[:, None, None, :] == 1), 0.0, MIN).astype(np.float32))
def causal_and_padding_additive(attention_mask):
    n = attention_mask.shape[-1]
    causal = braze.tril(braze.ones(n, n, dtype=braze.bool))
    allowed = causal[None, None] & (attention_mask[:, None, None, :] == 1)
    return braze.where(allowed, 0.0, braze.finfo(braze.float32).min)


@idiom(S, 4, kernels=1, oracle=lambda n, w: R.causal(n, n) & (np.arange(n)[None, :] > np.arange(n)[:, None] - w))
def sliding_window_mask(n, window):  # Mistral
    i = braze.arange(n)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)


@idiom(S, 4, kernels=1,
       oracle=lambda n, w: np.where(np.tril(np.triu(np.ones((n, n)), -w + 1)) > 0, 0.0, -np.inf).astype(np.float32))
def sliding_window_from_tril_and_triu(n, window):
    full = braze.full((n, n), float("-inf"))
    band = braze.tril(braze.ones(n, n)).triu(-window + 1)
    return full.masked_fill(band > 0, 0.0)


@idiom(4, S, kernels=1, oracle=lambda h, n: (R.alibi_slopes(h)[:, None, None] * -np.abs(np.arange(n)[None, :] - np.arange(n)[:, None])).astype(np.float32))
def alibi_bias_from_distance(heads, n):
    slopes = braze.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)])
    pos = braze.arange(n)
    dist = (pos[None, :] - pos[:, None]).abs().float()
    return slopes[:, None, None] * -dist


@idiom(randn(3, S), kernels=1, oracle=lambda s: np.where(np.arange(S)[None, :] < np.array([[S], [5], [1]]), s, -np.inf).astype(np.float32))
def mask_from_lengths(scores):
    lengths = braze.tensor([[S], [5], [1]])
    return scores.masked_fill(braze.arange(S)[None, :] >= lengths, -math.inf)


@idiom(S, 5, kernels=1, oracle=lambda n, p: R.causal(n, n) | (np.arange(n)[None, :] < p))
def prefix_lm_mask(n, prefix):  # bidirectional over the prompt, causal after it
    i = braze.arange(n)
    return (i[None, :] <= i[:, None]) | (i[None, :] < prefix)


@idiom(S, 4, kernels=1, oracle=lambda n, c: (np.arange(n)[:, None] // c == np.arange(n)[None, :] // c) & R.causal(n, n))
def chunked_attention_mask(n, chunk):  # Llama 4's local attention
    i = braze.arange(n)
    return (i[:, None] // chunk == i[None, :] // chunk) & (i[None, :] <= i[:, None])


@idiom(padding_mask(3, S, left=True), kernels=1,
       oracle=lambda m: np.maximum(np.cumsum(m, -1) - 1, 0) * m + (1 - m))
def position_ids_from_left_padded_mask(attention_mask):  # HF generate
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 1).clamp(min=0)


@idiom(padding_mask(3, S), kernels=1, oracle=lambda m: (m[:, None, :] * m[:, :, None]).astype(bool))
def pairwise_padding_mask(attention_mask):  # encoder self-attention, both sides padded
    m = attention_mask.bool()
    return m[:, None, :] & m[:, :, None]


@idiom(randn(2, 3, S, S), kernels=1, oracle=lambda s: np.where(R.causal(S, S), s, MIN).astype(np.float32))
def masked_fill_in_place_on_scores(scores):
    scores.masked_fill_(~braze.ones(S, S, dtype=braze.bool).tril(), braze.finfo(scores.dtype).min)
    return scores


@idiom(bools(3, S), kernels=1, oracle=lambda m: np.where(m, 1.0, 0.0).astype(np.float32))
def where_with_two_scalars(mask):
    return braze.where(mask, 1.0, 0.0)


@idiom(bools(3, S), randn(3, S), kernels=1, oracle=lambda m, x: (R.f64(x) * m).astype(np.float32))
def bool_mask_cast_to_the_values_dtype(mask, x):
    return x * mask.to(x.dtype)


@idiom(randn(3, S), kernels=1, oracle=lambda x: x.astype(np.float16).astype(np.float32))
def round_trip_through_half(x):
    return x.half().float()


@idiom(randn(3, S, scale=10.0), kernels=1, oracle=lambda x: np.trunc(R.f64(x) * 4).astype(np.int64))
def float_to_long_cast(x):
    return (x * 4).long()


@idiom(randn(3, S), kernels=1, oracle=lambda x: np.flip(R.f64(x), -1) * 2)
def flip_last_dim_then_scale(x):
    return x.flip(-1) * 2
